use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use super::execute::{ResponseBody, read_response};
use crate::body::{BoxError, boxed};

/// One-byte frames, each a slice of a 4 KiB buffer of its own (as a
/// chunked answer's frames are slices of the client's read buffer).
/// When asked for a frame, it records whether the buffers behind the
/// frames it gave before the last two are still held by anyone but
/// itself.
struct Slices {
    parents: Vec<Bytes>,
    next: usize,
    held: Arc<Mutex<VecDeque<usize>>>,
}

impl http_body::Body for Slices {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let n = self.next;
        let this = &mut *self;
        for (i, parent) in this
            .parents
            .iter_mut()
            .enumerate()
            .take(n.saturating_sub(2))
        {
            if !parent.is_unique() {
                this.held.lock().unwrap().push_back(i);
            }
        }
        let Some(parent) = self.parents.get(n) else {
            return Poll::Ready(None);
        };
        let frame = parent.slice(0..1);
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }
}

/// A keyed answer in many tiny frames costs its bytes, not a frame
/// handle and a read buffer each: every frame but the newest is copied
/// and let go while the answer is read. Was BROKEN (found by a review):
/// each frame was kept, with the buffer behind it, until the end.
#[tokio::test]
async fn tiny_frames_do_not_hold_their_buffers() {
    let frames = 200;
    let held = Arc::new(Mutex::new(VecDeque::new()));
    let body = Slices {
        parents: (0..frames)
            .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; 4096]))
            .collect(),
        next: 0,
        held: held.clone(),
    };
    let ResponseBody::Whole(read, _) = read_response(boxed(body), 1 << 20).await else {
        panic!("the answer is under the limit");
    };
    let expected: Vec<u8> = (0..frames).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(&read[..], &expected[..]);
    let held = held.lock().unwrap();
    assert!(
        held.is_empty(),
        "buffers still held: {:?}",
        held.iter().take(5).collect::<Vec<_>>()
    );
}

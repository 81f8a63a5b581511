//! The clocks on a keyed answer's body.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use idem_http::{Body, BoxError};
use tokio::time::{Instant, Sleep};

/// A keyed answer's body under the gateway's clocks. Its first part, the
/// one the layer reads whole (up to the replay limit), must arrive by the
/// request's deadline; after it, and for an answer the layer never stores
/// (one that ends with its connection), the body may take as long as it
/// needs, so long as the upstream is never silent for
/// the idle timeout (counted from when a read finds nothing to take, so a
/// client that reads slowly costs the upstream nothing). No timer exists
/// until a read has to wait.
pub(super) struct Deadline {
    inner: Body,
    /// The whole-answer deadline of the first part.
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Data bytes still to come before the first part is over.
    left_until_past_limit: usize,
    idle: Duration,
    /// Past the first part, and the idle timer runs for the present wait.
    waiting: bool,
}

impl Deadline {
    /// A keyed answer's body: its first `limit` bytes (and one more) by
    /// `deadline`, the rest under the idle timeout.
    pub(super) fn whole_until(
        inner: Body,
        deadline: Instant,
        limit: usize,
        idle: Duration,
    ) -> Deadline {
        Deadline {
            inner,
            deadline,
            sleep: None,
            left_until_past_limit: limit.saturating_add(1),
            idle,
            waiting: false,
        }
    }

    /// A body under the idle timeout alone.
    pub(super) fn idle(inner: Body, idle: Duration) -> Deadline {
        Deadline {
            inner,
            deadline: Instant::now(),
            sleep: None,
            left_until_past_limit: 0,
            idle,
            waiting: false,
        }
    }

    fn streaming(&self) -> bool {
        self.left_until_past_limit == 0
    }

    /// The timer for a read that found nothing: the first part's deadline,
    /// or the idle timeout from the start of this wait.
    fn arm(&mut self) -> Pin<&mut Sleep> {
        let until = if self.streaming() {
            if self.waiting {
                None
            } else {
                self.waiting = true;
                Some(Instant::now() + self.idle)
            }
        } else {
            Some(self.deadline).filter(|_| self.sleep.is_none())
        };
        match (&mut self.sleep, until) {
            (Some(sleep), Some(until)) => sleep.as_mut().reset(until),
            (None, until) => {
                let until = until.unwrap_or(self.deadline);
                self.sleep = Some(Box::pin(tokio::time::sleep_until(until)));
            }
            (Some(_), None) => {}
        }
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut(),
            None => unreachable!("armed just above"),
        }
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let len = frame.data_ref().map_or(0, Bytes::len);
            self.left_until_past_limit = self.left_until_past_limit.saturating_sub(len);
            self.waiting = false;
            return polled;
        }
        if polled.is_pending() && self.arm().poll(cx).is_ready() {
            let why = if self.streaming() {
                "upstream response body was silent for the body timeout"
            } else {
                "upstream response body passed its deadline"
            };
            return Poll::Ready(Some(Err(why.into())));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

//! What an execution is given and gives back: the inner service's call,
//! how a keyed request ended, and the marks an inner service puts on an
//! answer whose outcome or end it cannot vouch for.

use std::time::Duration;

use http::{Request, Response};
use idem_core::{BoxFuture, Fingerprint, Lease};

use crate::body::Body;
use crate::metrics::Outcome;

/// Put in a response's extensions by an inner service that cannot tell
/// whether its effect happened (a gateway whose upstream timed out after
/// the request was sent, say). The layer then neither stores nor releases
/// the record: the claim stays held until its lease ends, so a retry meets
/// 409 instead of running beside the first execution, and recovery decides
/// after the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeUnknown;

/// Put in a response's extensions by an inner service that cannot tell
/// the body's end from a cut (an HTTP/1.1 answer framed by the closing of
/// its connection: a crashed upstream's half answer reads the same). The
/// effect happened, so the layer settles the record as executed, but
/// keeps no body to replay: the client gets the answer as it comes, and a
/// retry gets the `response-not-stored` problem with the same status,
/// as for an answer over the replay limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnverifiedEnd;

/// The inner service's call, boxed.
pub(crate) type Call<E> =
    Box<dyn FnOnce(Request<Body>) -> BoxFuture<'static, Result<Response<Body>, E>> + Send>;

/// How a keyed request ended: the outcome it was counted under in
/// `idem_requests_total`, and its answer.
pub(crate) type Ended<T> = (Outcome, T);

/// What an execution holds: its lease, the request's fingerprint (a held
/// answer is matched against it), the lease's length (what a heartbeat
/// extends it by), and whether its claim must outlive an end without a
/// result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimed {
    pub(crate) lease: Lease,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) lease_length: Duration,
    /// An announced takeover (`Takeover::Announce`): where the claim would
    /// be released (a transient failure, a handler error, the shutdown),
    /// it is kept until its lease ends instead, so that the next attempt
    /// is a takeover again and is announced too. Released, the next claim
    /// would be a fresh one, and the operation would run unannounced
    /// beside an earlier attempt that may have acted.
    pub(crate) keep_claim: bool,
}

impl Claimed {
    /// How an end without a result is counted: `released`, or `held` where
    /// the claim is kept ([`Claimed::keep_claim`]).
    pub(crate) fn released(&self) -> Outcome {
        if self.keep_claim {
            Outcome::Held
        } else {
            Outcome::Released
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fence, Operation, Timestamp};

    /// An announced takeover that ends without a result keeps its claim:
    /// it is counted `held`, not `released`, which would say the key can
    /// run again at once.
    #[test]
    fn a_kept_claim_is_counted_held() {
        let op = Operation::new("POST", "/p");
        let claimed = |keep_claim| Claimed {
            lease: Lease {
                fence: Fence::new(1),
                lease_until: Timestamp::from_millis(0),
                expires_at: Timestamp::from_millis(0),
                takeover: true,
            },
            fingerprint: Fingerprint::compute(&op, None, b"", &Default::default()),
            lease_length: Duration::from_secs(30),
            keep_claim,
        };
        assert_eq!(claimed(true).released(), Outcome::Held);
        assert_eq!(claimed(false).released(), Outcome::Released);
    }
}

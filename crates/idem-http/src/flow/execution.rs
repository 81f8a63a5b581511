//! What an execution is given and gives back: the inner service's call,
//! how a keyed request ended, and the marks an inner service puts on an
//! answer whose outcome or end it cannot vouch for.

use http::{Request, Response};
use idem_core::BoxFuture;

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

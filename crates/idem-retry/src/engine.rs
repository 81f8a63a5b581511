//! The retry loop, for any transport.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Method};
use idem_core::{Key, KeyError};
use tokio::time::Instant;

use crate::classify::{CallKind, Decision, Reason};
use crate::observe::{Observation, ObserveError, ObserveResponse};
use crate::policy::RetryPolicy;

/// Client metric names.
pub mod names {
    /// Every attempt, first ones included.
    pub const ATTEMPTS: &str = "idem_client_attempts_total";
    /// Retries, by `reason`.
    pub const RETRIES: &str = "idem_client_retries_total";
    /// Retries refused because the budget was spent.
    pub const BUDGET_EXHAUSTED: &str = "idem_client_budget_exhausted_total";
    /// Time spent waiting between attempts, in seconds.
    pub const WAIT: &str = "idem_client_wait_seconds";
}

/// Which key a call sends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyMode {
    /// A fresh UUID v4 for this call, sent on every attempt.
    Generate,
    /// This key (the value itself, without quotes), sent on every attempt.
    Given(String),
    /// No key. Then a request that may have been processed is retried only
    /// if its method is idempotent.
    None,
}

/// One logical call's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpec {
    key: KeyMode,
    idempotent_method: bool,
    /// The key header exactly as the caller's request carried it, sent
    /// unchanged (a server that compares bytes sees the caller's key).
    as_sent: Option<HeaderValue>,
}

impl CallSpec {
    /// For a request with `method`: unsafe methods (POST, PATCH, …) get a
    /// generated key; idempotent ones (GET, HEAD, PUT, DELETE, OPTIONS,
    /// TRACE) none.
    pub fn for_method(method: &Method) -> CallSpec {
        let idempotent_method = method.is_idempotent();
        CallSpec {
            key: if idempotent_method {
                KeyMode::None
            } else {
                KeyMode::Generate
            },
            idempotent_method,
            as_sent: None,
        }
    }

    /// An unsafe call with a generated key (the common case: a POST).
    pub fn keyed() -> CallSpec {
        CallSpec {
            key: KeyMode::Generate,
            idempotent_method: false,
            as_sent: None,
        }
    }

    /// Uses `key` instead of generating one (the caller's own intent id).
    ///
    /// Give your own key when the intent outlives this process (a payment
    /// id kept in your database): a retry after a restart must send the
    /// same key. `key` is the value itself, without quotes; it goes on the
    /// wire as an sf-string ([`Attempt::key_header_value`]). A key that is
    /// not printable ASCII, longer than 255 or shorter than the policy's
    /// [`min_key_len`](crate::RetryPolicyBuilder::min_key_len) (16, as the
    /// server's default) fails the call before anything is sent, with
    /// [`RetryError::InvalidKey`]; so does one that starts or ends with a
    /// space (HTTP would strip it, and the server would see another key).
    /// A generated key is in [`CallReport::key`]: keep it to retry after a
    /// restart.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = KeyMode::Given(key.into());
        self.as_sent = None;
        self
    }

    /// Sends no key.
    pub fn without_key(mut self) -> Self {
        self.key = KeyMode::None;
        self.as_sent = None;
        self
    }

    /// For an HTTP request the adapters retry: as [`CallSpec::for_method`],
    /// but an `Idempotency-Key` the request already carries is kept and
    /// sent on every attempt exactly as the caller wrote it (bare or
    /// sf-string: a server that compares the header's bytes sees the
    /// caller's key). It must read as a key the way the server reads it.
    ///
    /// # Errors
    /// The header's value is not a key, or the header is there more than
    /// once ([`KeyError::Repeated`]: which one names the intent?).
    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn for_request(
        method: &Method,
        headers: &http::HeaderMap,
    ) -> Result<CallSpec, KeyError> {
        let spec = CallSpec::for_method(method);
        let mut values = headers
            .get_all(idem_core::header_names::IDEMPOTENCY_KEY)
            .iter();
        let Some(value) = values.next() else {
            return Ok(spec);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        let key = Key::from_header_value(value.as_bytes())?;
        let mut spec = spec.with_key(key.as_str());
        spec.as_sent = Some(value.clone());
        Ok(spec)
    }
}

/// What one attempt should send.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The `Idempotency-Key`, the same on every attempt of the call: the
    /// value itself, without quotes ([`Attempt::key_header_value`] is what
    /// goes on the wire).
    pub key: Option<Arc<str>>,
    /// A refreshed `Authorization` value, after a 401/403 refresh.
    pub authorization: Option<HeaderValue>,
    /// The key header value to send ([`Attempt::key_header_value`]).
    wire: Option<HeaderValue>,
}

impl Attempt {
    /// The `Idempotency-Key` header value to send: the key as an RFC 8941
    /// sf-string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`), the form
    /// draft-ietf-httpapi-idempotency-key-header writes. idem's server
    /// reads the bare form as the same key too.
    ///
    /// A key the caller's request carried (the adapters' case) goes out as
    /// the caller wrote it. `None` without a key; a key that cannot be
    /// sent makes the call unkeyed ([`Retrier::start`]), and
    /// [`Retrier::call`] and the adapters fail such a call before its
    /// first attempt.
    pub fn key_header_value(&self) -> Option<HeaderValue> {
        self.wire.clone()
    }

    /// Sets this attempt's `Idempotency-Key` and refreshed `Authorization`
    /// on an HTTP request's headers (what the adapters send).
    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn set_headers(&self, headers: &mut http::HeaderMap) {
        if let Some(v) = self.key_header_value() {
            headers.insert(idem_core::header_names::IDEMPOTENCY_KEY, v);
        }
        if let Some(auth) = &self.authorization {
            headers.insert(http::header::AUTHORIZATION, auth.clone());
        }
    }
}

/// What the loop sends attempts through.
///
/// [`Retrier::call`] wraps its closure in one. An adapter whose attempts
/// borrow something mutably (the reqwest middleware lends its `Next` and
/// `&mut Extensions` to each attempt) implements it on a struct, since a
/// closure cannot lend what it captures to the future it returns.
pub(crate) trait Transport {
    /// A response.
    type Response: ObserveResponse;
    /// A transport failure.
    type Error: ObserveError;

    /// Makes one attempt with what `attempt` says.
    fn send(
        &mut self,
        attempt: Attempt,
    ) -> impl Future<Output = Result<Self::Response, Self::Error>>;
}

/// A closure as a [`Transport`].
struct SendFn<F>(F);

impl<F, Fut, R, E> Transport for SendFn<F>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<R, E>>,
    R: ObserveResponse,
    E: ObserveError,
{
    type Response = R;
    type Error = E;

    fn send(&mut self, attempt: Attempt) -> impl Future<Output = Result<R, E>> {
        (self.0)(attempt)
    }
}

/// Why a call stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The last attempt's outcome is not retried (success included).
    Done,
    /// All attempts used.
    AttemptsExhausted,
    /// The retry budget was spent.
    BudgetExhausted,
    /// The next attempt would pass the call's deadline.
    Deadline,
    /// The next attempt would come after the key's expiry.
    KeyExpired,
    /// 401/403 and no refresh (or it failed).
    Unauthorized,
    /// The key cannot be sent ([`RetryError::InvalidKey`]); nothing was.
    InvalidKey,
}

/// What a call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReport {
    /// Attempts made.
    pub attempts: u32,
    /// Why it stopped.
    pub stop: Stop,
    /// Total time waited between attempts.
    pub waited: Duration,
    /// The key sent.
    pub key: Option<Arc<str>>,
}

/// A call that ended without a response to return.
///
/// `E` is the transport's error. [`RetryError::Transport`] carries it; the
/// other variants are failures the engine makes itself and carry none, so
/// the reqwest middleware returns them as a `RetryError` with the default
/// `E` ([`Infallible`]): `e.downcast_ref::<RetryError>()` on the
/// `anyhow::Error` of `reqwest_middleware::Error::Middleware(e)` finds
/// them (see the crate docs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError<E = Infallible> {
    /// The last attempt failed in the transport (and was not retried, or
    /// no retry was left: the [`CallReport`] says which). The reqwest
    /// middleware returns this error as it is, not wrapped.
    #[error("request failed: {0}")]
    Transport(E),
    /// The server said the key expires before the next attempt could be
    /// made; retrying after that would execute the request a second time.
    #[error(
        "the Idempotency-Key expires at {} before the next retry; not retrying, since the server would execute the request again",
        httpdate::fmt_http_date(*expires_at)
    )]
    KeyExpired {
        /// The server's `Idempotency-Key-Expires`.
        expires_at: SystemTime,
        /// Attempts made.
        attempts: u32,
    },
    /// The call's key cannot be sent, so nothing was: a key given with
    /// [`CallSpec::with_key`] that is not 1 to 255 printable ASCII
    /// characters, or an `Idempotency-Key` header already on the request
    /// that is not a key (a malformed sf-string, bytes beyond ASCII).
    /// Sending it anyway would send a request the client believes
    /// protected without its key, or one the server refuses.
    #[error("the Idempotency-Key cannot be sent ({0}); nothing was sent")]
    InvalidKey(KeyError),
}

impl<E> RetryError<E> {
    /// The engine's own failure, or the transport's error (`Err`).
    #[cfg(feature = "reqwest")]
    pub(crate) fn engine_made(self) -> Result<RetryError, E> {
        match self {
            RetryError::Transport(e) => Err(e),
            RetryError::KeyExpired {
                expires_at,
                attempts,
            } => Ok(RetryError::KeyExpired {
                expires_at,
                attempts,
            }),
            RetryError::InvalidKey(e) => Ok(RetryError::InvalidKey(e)),
        }
    }
}

/// A client's retry engine: one policy, one budget, any transport.
/// Cheap to clone; clones share the budget.
#[derive(Debug, Clone, Default)]
pub struct Retrier {
    policy: Arc<RetryPolicy>,
}

impl Retrier {
    /// An engine with `policy`.
    pub fn new(policy: RetryPolicy) -> Retrier {
        Retrier {
            policy: Arc::new(policy),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Runs one logical call: `send` makes an attempt with what [`Attempt`]
    /// says (the same key every time), and the engine decides about the
    /// next. Returns the last response, or an error.
    ///
    /// # Errors
    /// [`RetryError::Transport`] with the last transport error,
    /// [`RetryError::KeyExpired`], or [`RetryError::InvalidKey`] (nothing
    /// sent).
    pub async fn call<R, E, F, Fut>(&self, spec: CallSpec, send: F) -> Result<R, RetryError<E>>
    where
        R: ObserveResponse,
        E: ObserveError,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        self.call_with_report(spec, send).await.0
    }

    /// As [`Retrier::call`], with a report of what happened.
    pub async fn call_with_report<R, E, F, Fut>(
        &self,
        spec: CallSpec,
        send: F,
    ) -> (Result<R, RetryError<E>>, CallReport)
    where
        R: ObserveResponse,
        E: ObserveError,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        self.run(spec, &mut SendFn(send)).await
    }

    /// The retry loop: every way of making a call ends here.
    pub(crate) async fn run<T: Transport>(
        &self,
        spec: CallSpec,
        transport: &mut T,
    ) -> (Result<T::Response, RetryError<T::Error>>, CallReport) {
        if let KeyMode::Given(key) = &spec.key
            && let Err(e) = sendable_key(key, self.policy.min_key_len)
        {
            let report = CallReport {
                attempts: 0,
                stop: Stop::InvalidKey,
                waited: Duration::ZERO,
                key: None,
            };
            return (Err(RetryError::InvalidKey(e)), report);
        }
        let mut call = self.start(spec);
        loop {
            let result = transport.send(call.next_attempt()).await;
            let observation = match &result {
                Ok(r) => r.observe(),
                Err(e) => e.observe(),
            };
            match call.after(&observation).await {
                Step::Retry(delay) => {
                    drop(result);
                    tokio::time::sleep(delay).await;
                }
                Step::Stop(stop) => {
                    let report = call.finish(stop);
                    return (result.map_err(RetryError::Transport), report);
                }
                Step::KeyExpired(expires_at) => {
                    let report = call.finish(Stop::KeyExpired);
                    let attempts = report.attempts;
                    return (
                        Err(RetryError::KeyExpired {
                            expires_at,
                            attempts,
                        }),
                        report,
                    );
                }
            }
        }
    }

    /// Starts a call whose attempts the caller sends itself, deciding after
    /// each with [`CallState::after`] (for a transport that can be put
    /// neither in a closure for [`Retrier::call`] nor in this crate's
    /// adapters). Send [`Attempt::key_header_value`]. A given key that
    /// cannot be sent ([`CallSpec::with_key`]) makes the call unkeyed: no
    /// key header, and no retry that only a key would make safe.
    pub fn start(&self, spec: CallSpec) -> CallState {
        let (key, wire): (Option<Arc<str>>, Option<HeaderValue>) = match spec.key {
            KeyMode::Generate => {
                let key = uuid::Uuid::new_v4().to_string();
                let wire = HeaderValue::from_str(&format!("\"{key}\"")).ok();
                (Some(key.into()), wire)
            }
            KeyMode::Given(k) => match sendable_key(&k, self.policy.min_key_len) {
                Ok(valid) => {
                    let wire = spec
                        .as_sent
                        .or_else(|| HeaderValue::from_str(&valid.to_sf_string()).ok());
                    (Some(k.into()), wire)
                }
                Err(_) => (None, None),
            },
            KeyMode::None => (None, None),
        };
        let key = if wire.is_some() { key } else { None };
        CallState {
            policy: self.policy.clone(),
            kind: CallKind {
                keyed: key.is_some(),
                idempotent_method: spec.idempotent_method,
            },
            started: Instant::now(),
            attempt: Attempt {
                number: 0,
                key,
                authorization: None,
                wire,
            },
            refreshed: false,
            previous_delay: self.policy.backoff.base(),
            key_expires: None,
            retries: 0,
            waited: Duration::ZERO,
        }
    }
}

/// A key the caller gave, as it can be sent: 1 to 255 printable ASCII
/// characters, not starting or ending with a space (HTTP strips those, so
/// the server would see another key).
fn sendable_key(key: &str, min_len: usize) -> Result<Key, KeyError> {
    let valid = Key::new(key)?;
    if key.len() < min_len {
        return Err(KeyError::TooShort {
            len: key.len(),
            min: min_len,
        });
    }
    if let Some(at) = [0, key.len().saturating_sub(1)]
        .into_iter()
        .find(|&i| key.as_bytes().get(i) == Some(&b' '))
    {
        return Err(KeyError::InvalidCharacter { byte: b' ', at });
    }
    Ok(valid)
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Wait this long, then send the next attempt.
    Retry(Duration),
    /// Return the last attempt's result.
    Stop(Stop),
    /// Fail the call: the key expires before the next attempt.
    KeyExpired(SystemTime),
}

/// One call in progress: which attempt is next and what was seen so far.
#[derive(Debug)]
pub struct CallState {
    policy: Arc<RetryPolicy>,
    kind: CallKind,
    started: Instant,
    attempt: Attempt,
    refreshed: bool,
    previous_delay: Duration,
    key_expires: Option<SystemTime>,
    retries: u32,
    waited: Duration,
}

impl CallState {
    /// The next attempt to send (counts it, and deposits the first one in
    /// the budget).
    pub fn next_attempt(&mut self) -> Attempt {
        self.attempt.number += 1;
        metrics::counter!(names::ATTEMPTS).increment(1);
        if self.attempt.number == 1
            && let Some(b) = &self.policy.budget
        {
            b.deposit();
        }
        self.attempt.clone()
    }

    /// Decides after an attempt: retry after a delay, or stop.
    pub async fn after(&mut self, observation: &Observation) -> Step {
        let p = &*self.policy;
        self.key_expires = observation.key_expires.or(self.key_expires);
        let reason = match p.classifier.classify(observation, self.kind) {
            Decision::Stop => return Step::Stop(Stop::Done),
            Decision::RefreshCredential => {
                let Some(hook) = p.refresh.as_ref().filter(|_| !self.refreshed) else {
                    return Step::Stop(Stop::Unauthorized);
                };
                self.refreshed = true;
                return match hook().await {
                    Some(credential) => {
                        self.attempt.authorization = Some(credential);
                        metrics::counter!(names::RETRIES, "reason" => Reason::Credential.as_str())
                            .increment(1);
                        // At once, with the same key; not a failure retry, so
                        // it spends no budget.
                        Step::Retry(Duration::ZERO)
                    }
                    None => Step::Stop(Stop::Unauthorized),
                };
            }
            Decision::Retry(reason) => reason,
        };
        if self.attempt.number >= p.max_attempts {
            return Step::Stop(Stop::AttemptsExhausted);
        }
        self.retries += 1;
        let delay = match observation.retry_after {
            Some(server) => server.min(p.max_retry_after),
            None => p.backoff.delay(self.retries, self.previous_delay),
        };
        self.previous_delay = delay.max(p.backoff.base());
        if p.deadline
            .is_some_and(|d| self.started.elapsed() + delay > d)
        {
            return Step::Stop(Stop::Deadline);
        }
        if let Some(expires_at) = self.key_expires
            && SystemTime::now() + delay >= expires_at
        {
            return Step::KeyExpired(expires_at);
        }
        if let Some(b) = &p.budget
            && !b.withdraw()
        {
            metrics::counter!(names::BUDGET_EXHAUSTED).increment(1);
            return Step::Stop(Stop::BudgetExhausted);
        }
        metrics::counter!(names::RETRIES, "reason" => reason.as_str()).increment(1);
        metrics::histogram!(names::WAIT).record(delay.as_secs_f64());
        tracing::debug!(
            attempt = self.attempt.number,
            reason = reason.as_str(),
            ?delay,
            "retrying"
        );
        self.waited += delay;
        Step::Retry(delay)
    }

    /// The key this call sends.
    pub fn key(&self) -> Option<&Arc<str>> {
        self.attempt.key.as_ref()
    }

    /// Ends the call.
    pub fn finish(self, stop: Stop) -> CallReport {
        CallReport {
            attempts: self.attempt.number,
            stop,
            waited: self.waited,
            key: self.attempt.key,
        }
    }
}

//! Which failures are retried (docs/contract.md, *Retries*).

use crate::observe::{Observation, Observed};

/// Why a retry happens; the label of `idem_client_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The request was never sent.
    NotSent,
    /// No answer came; the result is unknown.
    Unknown,
    /// 409: the first attempt is still in progress.
    InFlight,
    /// 429.
    Throttled,
    /// 502, 503, 504.
    Unavailable,
    /// 408.
    RequestTimeout,
    /// 425.
    TooEarly,
    /// Another 5xx, retried only with a key (or an idempotent method).
    ServerError,
    /// 401/403 after a successful credential refresh.
    Credential,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotSent => "not_sent",
            Reason::Unknown => "unknown_result",
            Reason::InFlight => "in_flight",
            Reason::Throttled => "throttled",
            Reason::Unavailable => "unavailable",
            Reason::RequestTimeout => "request_timeout",
            Reason::TooEarly => "too_early",
            Reason::ServerError => "server_error",
            Reason::Credential => "credential",
        }
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Done: success, or a failure retrying cannot fix.
    Stop,
    /// Retry after a backoff, if budget, attempts and deadline allow.
    Retry(Reason),
    /// 401/403: refresh the credential once, then retry with the same key.
    RefreshCredential,
}

/// What the classifier knows about the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallKind {
    /// The call carries an `Idempotency-Key`.
    pub keyed: bool,
    /// The method is idempotent by definition (GET, HEAD, PUT, DELETE,
    /// OPTIONS).
    pub idempotent_method: bool,
}

impl CallKind {
    /// Whether repeating a request that may have been processed is safe.
    pub fn repeatable(self) -> bool {
        self.keyed || self.idempotent_method
    }
}

/// Decides whether an attempt's outcome is retried. Override it per client
/// with [`RetryPolicyBuilder::classifier`](crate::RetryPolicyBuilder::classifier).
///
/// # Example
///
/// ```
/// use idem_retry::{CallKind, Classify, Decision, DefaultClassifier, Observation, Observed};
///
/// /// Also retries 500 without a key: the service behind is known to be read-only.
/// #[derive(Debug)]
/// struct Lenient;
/// impl Classify for Lenient {
///     fn classify(&self, o: &Observation, call: CallKind) -> Decision {
///         match o.observed {
///             Observed::Status(500) => Decision::Retry(idem_retry::Reason::ServerError),
///             _ => DefaultClassifier.classify(o, call),
///         }
///     }
/// }
/// let o = Observation::of(Observed::Status(500));
/// let call = CallKind { keyed: false, idempotent_method: false };
/// assert_eq!(DefaultClassifier.classify(&o, call), Decision::Stop);
/// assert!(matches!(Lenient.classify(&o, call), Decision::Retry(_)));
/// ```
pub trait Classify: Send + Sync + std::fmt::Debug {
    /// The decision for one attempt.
    fn classify(&self, observation: &Observation, call: CallKind) -> Decision;
}

/// The table of docs/contract.md, *Retries*.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, o: &Observation, call: CallKind) -> Decision {
        let repeatable = call.repeatable();
        match o.observed {
            Observed::NotSent => Decision::Retry(Reason::NotSent),
            // A request without a key that may have been processed is never
            // sent again: that is how duplicates are born.
            _ if !repeatable => Decision::Stop,
            Observed::Unknown => Decision::Retry(Reason::Unknown),
            Observed::Fatal => Decision::Stop,
            Observed::Status(s) => match s {
                401 | 403 => Decision::RefreshCredential,
                409 => Decision::Retry(Reason::InFlight),
                429 => Decision::Retry(Reason::Throttled),
                502..=504 => Decision::Retry(Reason::Unavailable),
                408 => Decision::Retry(Reason::RequestTimeout),
                425 => Decision::Retry(Reason::TooEarly),
                500..=599 => Decision::Retry(Reason::ServerError),
                _ => Decision::Stop,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYED: CallKind = CallKind {
        keyed: true,
        idempotent_method: false,
    };
    const BARE_POST: CallKind = CallKind {
        keyed: false,
        idempotent_method: false,
    };
    const GET: CallKind = CallKind {
        keyed: false,
        idempotent_method: true,
    };

    fn c(observed: Observed, call: CallKind) -> Decision {
        DefaultClassifier.classify(&Observation::of(observed), call)
    }

    #[test]
    fn the_design_table() {
        use Observed::*;
        assert_eq!(c(NotSent, BARE_POST), Decision::Retry(Reason::NotSent));
        assert_eq!(c(Unknown, KEYED), Decision::Retry(Reason::Unknown));
        assert_eq!(c(Unknown, GET), Decision::Retry(Reason::Unknown));
        assert_eq!(c(Unknown, BARE_POST), Decision::Stop);
        for s in [200, 201, 204, 301, 400, 404, 422] {
            assert_eq!(c(Status(s), KEYED), Decision::Stop, "{s}");
        }
        assert_eq!(c(Status(401), KEYED), Decision::RefreshCredential);
        assert_eq!(c(Status(403), KEYED), Decision::RefreshCredential);
        assert_eq!(c(Status(409), KEYED), Decision::Retry(Reason::InFlight));
        assert_eq!(c(Status(429), KEYED), Decision::Retry(Reason::Throttled));
        for s in [502, 503, 504] {
            assert_eq!(c(Status(s), KEYED), Decision::Retry(Reason::Unavailable));
        }
        assert_eq!(
            c(Status(408), KEYED),
            Decision::Retry(Reason::RequestTimeout)
        );
        assert_eq!(c(Status(425), KEYED), Decision::Retry(Reason::TooEarly));
        assert_eq!(c(Status(500), KEYED), Decision::Retry(Reason::ServerError));
        assert_eq!(c(Status(500), BARE_POST), Decision::Stop);
        assert_eq!(c(Status(503), BARE_POST), Decision::Stop);
        assert_eq!(c(Fatal, KEYED), Decision::Stop);
    }
}

//! The retry policy of one client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::HeaderValue;

use crate::backoff::Backoff;
use crate::budget::RetryBudget;
use crate::classify::{Classify, DefaultClassifier};

/// Called once on 401/403: returns the new `Authorization` value, or `None`
/// if the credential could not be refreshed (then the call stops).
pub type RefreshHook = Arc<dyn Fn() -> BoxFuture<'static, Option<HeaderValue>> + Send + Sync>;

/// How one client retries. Build with [`RetryPolicy::builder`].
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Arc<Backoff>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    /// The shortest key given with `CallSpec::with_key` that is sent.
    pub(crate) min_key_len: usize,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    pub(crate) refresh: Option<RefreshHook>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("deadline", &self.deadline)
            .field("max_retry_after", &self.max_retry_after)
            .field("min_key_len", &self.min_key_len)
            .field("classifier", &self.classifier)
            .field("budget", &self.budget.is_some())
            .field("refresh", &self.refresh.is_some())
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::builder().build()
    }
}

impl RetryPolicy {
    /// The defaults: 3 attempts, full jitter from 100 ms capped at 10 s, no
    /// deadline, `Retry-After` honoured up to 60 s, the default classifier,
    /// a default [`RetryBudget`], no refresh hook.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            policy: RetryPolicy {
                max_attempts: 3,
                backoff: Arc::new(Backoff::new(
                    Duration::from_millis(100),
                    Duration::from_secs(10),
                )),
                deadline: None,
                max_retry_after: Duration::from_secs(60),
                min_key_len: idem_core::KeyPolicy::default().minimum_len(),
                classifier: Arc::new(DefaultClassifier),
                budget: Some(Arc::new(RetryBudget::default())),
                refresh: None,
            },
        }
    }

    /// The budget, if any, to inspect or share.
    pub fn budget(&self) -> Option<&Arc<RetryBudget>> {
        self.budget.as_ref()
    }
}

/// Builds a [`RetryPolicy`].
#[derive(Debug)]
pub struct RetryPolicyBuilder {
    policy: RetryPolicy,
}

impl RetryPolicyBuilder {
    /// Attempts per call, the first included. Default 3; at least 1.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.policy.max_attempts = n.max(1);
        self
    }

    /// The backoff. Default full jitter, 100 ms base, 10 s cap.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = Arc::new(backoff);
        self
    }

    /// The longest a call may take, retries and waits included. Default none.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.policy.deadline = Some(d);
        self
    }

    /// The shortest key of the caller's own ([`CallSpec::with_key`](crate::CallSpec::with_key))
    /// that is sent; a shorter one fails the call before anything is sent
    /// ([`RetryError::InvalidKey`](crate::RetryError::InvalidKey) with
    /// `KeyError::TooShort`). Default 16, the server's default
    /// (`idem serve --min-key-len`, `KeyPolicy::min_len`): set both alike.
    /// Generated keys (UUID v4, 36 characters) always pass.
    pub fn min_key_len(mut self, len: usize) -> Self {
        self.policy.min_key_len = len.clamp(1, 255);
        self
    }

    /// The longest `Retry-After` honoured; longer ones are capped. Default 60 s.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.policy.max_retry_after = d;
        self
    }

    /// The classifier. Default [`DefaultClassifier`].
    pub fn classifier(mut self, c: impl Classify + 'static) -> Self {
        self.policy.classifier = Arc::new(c);
        self
    }

    /// The retry budget shared by every call of this policy. Default
    /// [`RetryBudget::default`].
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.policy.budget = Some(budget);
        self
    }

    /// No budget: every call may use all its attempts. For tests and for
    /// comparison; a client in production should have one.
    pub fn no_budget(mut self) -> Self {
        self.policy.budget = None;
        self
    }

    /// The credential refresh hook for 401/403. Default none (401/403 stop).
    pub fn refresh_credential(mut self, hook: RefreshHook) -> Self {
        self.policy.refresh = Some(hook);
        self
    }

    /// The policy.
    pub fn build(self) -> RetryPolicy {
        self.policy
    }
}

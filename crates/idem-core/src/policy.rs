//! Per-operation rules: how long records live, how long a lease runs, what
//! a duplicate in flight gets, and which handler results are kept.

use std::collections::BTreeSet;
use std::time::Duration;

/// What a duplicate request gets while the first is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Concurrency {
    /// Answer at once with 409 and `Retry-After`. The default.
    Conflict,
    /// Wait up to `limit` for the first to finish and replay its response;
    /// 409 after that.
    Wait {
        /// The longest a duplicate waits.
        limit: Duration,
    },
}

/// What a claim does when it takes over a record whose executor's lease
/// ended with no outcome stored: the executor died (or stalled past its
/// lease) after it may have acted, so whether the operation happened is
/// unknown (docs/contract.md, *The crash window*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Takeover {
    /// Do not execute again: the key answers the `outcome-unresolved`
    /// problem, naming the read path, until an operator resolves the
    /// record (`idem records release` once the operation is known not to
    /// have happened) or it expires. The default: a duplicate payment is
    /// worse than a payment that waits for a person.
    #[default]
    Hold,
    /// Execute again, telling the handler it is a takeover of the key (the
    /// `Idem-Takeover` request header, whose value is the key, and
    /// `IdempotencyContext::is_takeover`), so that an operation that keeps
    /// its keys in its own transaction (atomic mode) can refuse the
    /// duplicate itself.
    Announce,
    /// Execute again, as if the first attempt never ran: only for
    /// operations that are safe to repeat, or whose downstream deduplicates
    /// by the forwarded key.
    Reexecute,
}

impl Takeover {
    /// The name used in configuration: `hold`, `announce`, `reexecute`.
    pub fn as_str(self) -> &'static str {
        match self {
            Takeover::Hold => "hold",
            Takeover::Announce => "announce",
            Takeover::Reexecute => "reexecute",
        }
    }

    /// The policy a configuration name stands for.
    pub fn from_name(name: &str) -> Option<Takeover> {
        Some(match name {
            "hold" => Takeover::Hold,
            "announce" => Takeover::Announce,
            "reexecute" => Takeover::Reexecute,
            _ => return None,
        })
    }

    /// Whether a takeover executes the operation again.
    pub fn executes(self) -> bool {
        !matches!(self, Takeover::Hold)
    }
}

/// What to do with the record once the handler has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Store as `completed` and replay it.
    Complete,
    /// Store as `failed` (deterministic failure) and replay it.
    Fail,
    /// Delete the claim: the failure was transient and a retry executes again.
    Release,
}

/// A policy whose numbers contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The ttl must be longer than the lease: a record that expires while its
    /// executor still holds the lease would let a second execution start.
    #[error("ttl ({ttl:?}) must be longer than the lease ({lease:?})")]
    TtlNotAboveLease {
        /// The configured ttl.
        ttl: Duration,
        /// The configured lease.
        lease: Duration,
    },
    /// The ttl must be longer than the wait limit.
    #[error("ttl ({ttl:?}) must be longer than the wait limit ({wait:?})")]
    TtlNotAboveWait {
        /// The configured ttl.
        ttl: Duration,
        /// The configured wait limit.
        wait: Duration,
    },
    /// Zero durations make no sense for a lease or ttl.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// A duration past its bound ([`Policy::MAX_TTL`], [`Policy::MAX_LEASE`],
    /// [`Policy::MAX_WAIT`]): a typo such as `3000000d` must not start a
    /// server whose expiry dates cannot even be written.
    #[error("{what} ({value:?}) must be at most {max:?}")]
    TooLong {
        /// `ttl`, `lease` or `wait`.
        what: &'static str,
        /// The configured value.
        value: Duration,
        /// The bound.
        max: Duration,
    },
}

/// The rules for one operation. Build with [`Policy::builder`]; a built
/// policy has been validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    ttl: Duration,
    lease: Duration,
    concurrency: Concurrency,
    takeover: Takeover,
    release: BTreeSet<u16>,
    keep: BTreeSet<u16>,
}

impl Default for Policy {
    fn default() -> Self {
        PolicyBuilder::default().build_unchecked()
    }
}

impl Policy {
    /// The longest ttl: 366 days. Keys are for retries, not archives; a
    /// longer ttl is almost always a unit typo.
    pub const MAX_TTL: Duration = Duration::from_secs(366 * 86_400);
    /// The longest lease: one day.
    pub const MAX_LEASE: Duration = Duration::from_secs(86_400);
    /// The longest a duplicate may wait in wait mode: five minutes (it holds
    /// a connection all that time).
    pub const MAX_WAIT: Duration = Duration::from_secs(300);

    /// Starts from the defaults: ttl 24 h, lease 30 s, conflict mode, the
    /// outcome rules of docs/contract.md, *Records and their state machine*.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    /// How long a record counts after its claim.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long an executor holds a claim before another may take it over.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// What a duplicate in flight gets.
    pub fn concurrency(&self) -> Concurrency {
        self.concurrency
    }

    /// What a takeover of an abandoned claim does.
    pub fn takeover(&self) -> Takeover {
        self.takeover
    }

    /// The same policy with another takeover rule (which no other setting
    /// constrains, so this needs no validation).
    pub fn with_takeover(mut self, takeover: Takeover) -> Policy {
        self.takeover = takeover;
        self
    }

    /// What to do with a handler's response status.
    ///
    /// By default: 2xx and 3xx complete; 4xx fail (kept and replayed) except
    /// 408, 409, 425 and 429, which release; 5xx release. Statuses named in
    /// [`PolicyBuilder::release_status`] and [`PolicyBuilder::keep_status`]
    /// override that.
    pub fn disposition(&self, status: u16) -> Disposition {
        if self.release.contains(&status) {
            return Disposition::Release;
        }
        let kept = self.keep.contains(&status);
        match status {
            400..=499 if kept || !matches!(status, 408 | 409 | 425 | 429) => Disposition::Fail,
            500..=599 if kept => Disposition::Fail,
            400..=599 => Disposition::Release,
            _ => Disposition::Complete,
        }
    }
}

/// Builds a [`Policy`].
#[derive(Debug, Clone)]
pub struct PolicyBuilder {
    ttl: Duration,
    lease: Duration,
    concurrency: Concurrency,
    takeover: Takeover,
    release: BTreeSet<u16>,
    keep: BTreeSet<u16>,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        PolicyBuilder {
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            concurrency: Concurrency::Conflict,
            takeover: Takeover::default(),
            release: BTreeSet::new(),
            keep: BTreeSet::new(),
        }
    }
}

impl PolicyBuilder {
    /// Record lifetime. Default 24 hours.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Executor lease. Default 30 seconds. Set it above the handler's own
    /// timeout: a handler that outlives its lease can be taken over.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Duplicate handling. Default [`Concurrency::Conflict`].
    pub fn concurrency(mut self, c: Concurrency) -> Self {
        self.concurrency = c;
        self
    }

    /// What a takeover of an abandoned claim does. Default
    /// [`Takeover::Hold`].
    pub fn takeover(mut self, takeover: Takeover) -> Self {
        self.takeover = takeover;
        self
    }

    /// Treat this status as transient: release the claim. None by default
    /// beyond the built-in rules.
    pub fn release_status(mut self, status: u16) -> Self {
        self.keep.remove(&status);
        self.release.insert(status);
        self
    }

    /// Keep and replay this 4xx/5xx status as `failed`, overriding the
    /// built-in release rule. None by default.
    pub fn keep_status(mut self, status: u16) -> Self {
        self.release.remove(&status);
        self.keep.insert(status);
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`PolicyError`] if the ttl is not above the lease and the wait limit,
    /// or a duration is zero.
    pub fn build(self) -> Result<Policy, PolicyError> {
        if self.ttl.is_zero() {
            return Err(PolicyError::Zero("ttl"));
        }
        if self.lease.is_zero() {
            return Err(PolicyError::Zero("lease"));
        }
        let bounded = |what, value: Duration, max: Duration| {
            if value > max {
                Err(PolicyError::TooLong { what, value, max })
            } else {
                Ok(())
            }
        };
        bounded("ttl", self.ttl, Policy::MAX_TTL)?;
        bounded("lease", self.lease, Policy::MAX_LEASE)?;
        if let Concurrency::Wait { limit } = self.concurrency {
            bounded("wait", limit, Policy::MAX_WAIT)?;
        }
        if self.ttl <= self.lease {
            return Err(PolicyError::TtlNotAboveLease {
                ttl: self.ttl,
                lease: self.lease,
            });
        }
        if let Concurrency::Wait { limit } = self.concurrency
            && self.ttl <= limit
        {
            return Err(PolicyError::TtlNotAboveWait {
                ttl: self.ttl,
                wait: limit,
            });
        }
        Ok(self.build_unchecked())
    }

    fn build_unchecked(self) -> Policy {
        Policy {
            ttl: self.ttl,
            lease: self.lease,
            concurrency: self.concurrency,
            takeover: self.takeover,
            release: self.release,
            keep: self.keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dispositions_follow_the_contract() {
        let p = Policy::default();
        for s in [200, 201, 204, 302] {
            assert_eq!(p.disposition(s), Disposition::Complete, "{s}");
        }
        for s in [400, 401, 403, 404, 422] {
            assert_eq!(p.disposition(s), Disposition::Fail, "{s}");
        }
        for s in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert_eq!(p.disposition(s), Disposition::Release, "{s}");
        }
    }

    #[test]
    fn overrides_apply() {
        let p = Policy::builder()
            .release_status(404)
            .keep_status(409)
            .keep_status(500)
            .build()
            .unwrap();
        assert_eq!(p.disposition(404), Disposition::Release);
        assert_eq!(p.disposition(409), Disposition::Fail);
        assert_eq!(p.disposition(500), Disposition::Fail);
        assert_eq!(p.disposition(503), Disposition::Release);
    }

    #[test]
    fn contradictory_policies_are_refused() {
        let s = Duration::from_secs;
        assert!(matches!(
            Policy::builder().ttl(s(10)).lease(s(10)).build(),
            Err(PolicyError::TtlNotAboveLease { .. })
        ));
        assert!(matches!(
            Policy::builder()
                .ttl(s(60))
                .lease(s(5))
                .concurrency(Concurrency::Wait { limit: s(60) })
                .build(),
            Err(PolicyError::TtlNotAboveWait { .. })
        ));
        assert_eq!(
            Policy::builder().lease(s(0)).build(),
            Err(PolicyError::Zero("lease"))
        );
        assert!(Policy::builder().build().is_ok());
    }

    #[test]
    fn durations_past_their_bounds_are_refused() {
        let d = |days: u64| Duration::from_secs(days * 86_400);
        assert!(matches!(
            Policy::builder().ttl(d(3_000_000)).build(),
            Err(PolicyError::TooLong { what: "ttl", .. })
        ));
        assert!(Policy::builder().ttl(Policy::MAX_TTL).build().is_ok());
        assert!(matches!(
            Policy::builder().lease(d(2)).ttl(d(3)).build(),
            Err(PolicyError::TooLong { what: "lease", .. })
        ));
        assert!(matches!(
            Policy::builder()
                .concurrency(Concurrency::Wait {
                    limit: Duration::from_secs(301)
                })
                .build(),
            Err(PolicyError::TooLong { what: "wait", .. })
        ));
    }
}

//! SQLite's `synchronous` setting, chosen on the builder and applied when
//! the writer's connection is opened.

/// SQLite's `synchronous` setting for the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is on disk before the store answers. The default, and the
    /// only setting that keeps the contract's durability promise across a
    /// power loss.
    #[default]
    Full,
    /// WAL commits survive a process crash but not a power loss. For tests
    /// and benchmarks that want to see the difference.
    Normal,
    /// No sync at all: SQLite hands commits to the operating system and
    /// goes on. A process crash keeps them; an OS crash or a power loss can
    /// lose or corrupt committed records. The gateway refuses it unless told
    /// to accept a volatile store.
    Off,
}

impl Synchronous {
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
            Synchronous::Off => "OFF",
        }
    }

    /// What this setting means for records (the store runs in WAL mode).
    pub(crate) fn verdict(self) -> idem_core::Verdict {
        use idem_core::Verdict;
        match self {
            Synchronous::Full => Verdict::Keeps,
            Synchronous::Normal => Verdict::Risky(
                "in WAL mode a power loss or OS crash can forget the last commits".into(),
            ),
            Synchronous::Off => Verdict::Loses(
                "a power loss or OS crash can lose or corrupt committed records".into(),
            ),
        }
    }
}

//! The crate's one error: bad user input, or a target that cannot be used.

/// Why a probe could not be configured or started.
///
/// Checks never fail with an `Error`: a request that fails during a check
/// becomes that check's evidence and its verdict ("could not tell").
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(Box<Inner>);

#[derive(Debug, thiserror::Error)]
enum Inner {
    #[error("{0}")]
    Input(String),
    #[error("cannot read {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// What kind of [`Error`] this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A flag's value was refused (a header, a body, a URL, a pointer).
    Input,
    /// An `@file` could not be read.
    File,
    /// The HTTP client could not be built.
    Client,
}

impl Error {
    pub(crate) fn input(message: impl Into<String>) -> Error {
        Error(Box::new(Inner::Input(message.into())))
    }

    pub(crate) fn file(path: &str, source: std::io::Error) -> Error {
        Error(Box::new(Inner::File {
            path: path.to_owned(),
            source,
        }))
    }

    pub(crate) fn client(message: impl Into<String>) -> Error {
        Error(Box::new(Inner::Client(message.into())))
    }

    /// The kind of failure. [`ErrorKind::Input`] and [`ErrorKind::File`]
    /// are usage errors (the `idem` binary exits 2 on them).
    pub fn kind(&self) -> ErrorKind {
        match *self.0 {
            Inner::Input(_) => ErrorKind::Input,
            Inner::File { .. } => ErrorKind::File,
            Inner::Client(_) => ErrorKind::Client,
        }
    }

    /// Whether the error is the user's input (exit 2 in the binary).
    pub fn is_usage(&self) -> bool {
        matches!(self.kind(), ErrorKind::Input | ErrorKind::File)
    }
}

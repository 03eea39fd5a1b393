//! Bad input, told apart from failures: every subcommand that finds its
//! arguments wrong before issuing any I/O returns a [`UsageError`], which
//! `main` turns into one line on stderr and exit status 2 (as the argument
//! parser does); anything else exits 1.

/// Bad input: one line on stderr and exit status 2, before any I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A [`UsageError`] saying `msg`.
pub fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// A namespace the controller does not have is bad input (exit status 2),
/// like a bad block range; any other error stays what it is.
pub fn no_such_namespace_is_usage(e: upnvme::Error) -> anyhow::Error {
    match e {
        e @ upnvme::Error::NoSuchNamespace { .. } => usage(e.to_string()).into(),
        e => e.into(),
    }
}

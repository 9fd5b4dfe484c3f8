//! The error type of the command: what went wrong, said once, on stderr.

use std::fmt;
use std::io;

/// A failure of a subcommand.
#[derive(Debug)]
pub enum CliError {
    /// The arguments cannot work together (a root outside the group, an
    /// algorithm the collective lacks, ...). Exit status 2, as clap's own
    /// usage errors.
    Usage(String),
    /// The library reported an error while running.
    Lib(ferrocoll::Error),
    /// Something else failed while running (a rank computed a result the
    /// others disagree with, writing output failed, ...).
    Run(String),
    /// stdout was closed by its reader; the command stops quietly.
    BrokenPipe,
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Lib(ferrocoll::Error::InvalidArgument(_))
            | CliError::Lib(ferrocoll::Error::UnknownAlgorithm { .. })
            | CliError::Lib(ferrocoll::Error::Config { .. }) => 2,
            CliError::Lib(_) | CliError::Run(_) => 1,
            CliError::BrokenPipe => 0,
        }
    }

    /// True for the errors a rank sees because *another* rank failed first
    /// (so the first rank's error is the one worth reporting).
    pub fn is_secondary(&self) -> bool {
        matches!(
            self,
            CliError::Lib(ferrocoll::Error::Aborted)
                | CliError::Lib(ferrocoll::Error::PeerLost { .. })
        )
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(msg) | CliError::Run(msg) => f.write_str(msg),
            CliError::Lib(e) => write!(f, "{e}"),
            CliError::BrokenPipe => f.write_str("output closed"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<ferrocoll::Error> for CliError {
    fn from(e: ferrocoll::Error) -> CliError {
        CliError::Lib(e)
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        if e.kind() == io::ErrorKind::BrokenPipe {
            CliError::BrokenPipe
        } else {
            CliError::Run(format!("writing output: {e}"))
        }
    }
}

/// The message of a library error without the `invalid argument: ` prefix,
/// for clap's "invalid value" errors which already say as much.
pub fn lib_message(e: ferrocoll::Error) -> String {
    match e {
        ferrocoll::Error::InvalidArgument(msg) => msg,
        other => other.to_string(),
    }
}

//! The error type of xtask: a message meant for a person.

use std::fmt;

/// An error with a message that says what failed and, where possible, what to do.
#[derive(Debug)]
pub struct Error {
    message: String,
}

/// The result type of xtask.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Creates an error from a message.
    pub fn new(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Adds what was being done to an error, e.g. `.context("reading X")`.
pub trait Context<T> {
    /// Turns the error into an [`Error`] whose message starts with `what`.
    fn context(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error::new(format!("{what}: {e}")))
    }
}

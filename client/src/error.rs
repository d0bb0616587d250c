//! Client errors, each with the [`Action`] a caller should take next.

use std::time::Duration;

pub use sluice_protocol::status::Action;
use sluice_protocol::Status;

/// Why a call did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer within the deadline; the request may or may not have been
    /// applied.
    #[error("no answer within the deadline of {0:?}")]
    Timeout(Duration),
    /// The connection closed before the answer came.
    #[error("the connection to the server was lost")]
    Disconnected,
    /// A connection could not be opened.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The server answered with an error.
    #[error("server said {}: {text}", status.map_or_else(|| format!("unknown code {code}"), |s| s.to_string()))]
    Server {
        /// The status, when this client knows the code.
        status: Option<Status>,
        /// The numeric code as sent.
        code: u16,
        /// The server's human text.
        text: String,
    },
    /// The server sent something this client cannot read.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The call's arguments can never succeed (checked before sending).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl Error {
    /// What to do next: retry the call, reconnect, fail over to the
    /// group's other node, give up, or (no answer to a request that was
    /// sent) know that it may have been applied.
    pub fn action(&self) -> Action {
        match self {
            // Sent, and no answer: it may have been applied.
            Error::Timeout(_) | Error::Disconnected => Action::OutcomeUnknown,
            Error::Connect { .. } | Error::Protocol(_) => Action::Reconnect,
            Error::Server {
                status: Some(s), ..
            } => s.action(),
            Error::Server { status: None, .. } => Action::GiveUp,
            Error::Invalid(_) => Action::GiveUp,
        }
    }

    /// The server status, for server errors.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Server { status, .. } => *status,
            _ => None,
        }
    }

    pub(crate) fn server(code: u16, text: String) -> Error {
        Error::Server {
            status: Status::from_code(code),
            code,
            text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_primary_says_where_the_primary_is_and_to_fail_over() {
        let text = "not primary: the primary is 127.0.0.1:7700 (epoch 3)".to_owned();
        let e = Error::server(19, text.clone());
        assert_eq!(e.status(), Some(Status::NotPrimary));
        assert_eq!(e.action(), Action::FailOver);
        assert_eq!(Error::Disconnected.action(), Action::OutcomeUnknown);
        assert_eq!(
            Error::Timeout(std::time::Duration::from_millis(5)).action(),
            Action::OutcomeUnknown
        );
        let shown = e.to_string();
        assert!(shown.contains(&text), "{shown}");
        // A code this client does not know still shows the server's text.
        let unknown = Error::server(999, "later".into());
        assert_eq!(unknown.action(), Action::GiveUp);
        assert!(unknown.to_string().contains("unknown code 999: later"));
    }
}

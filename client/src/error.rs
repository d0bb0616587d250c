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
    #[error("server said {}", server_said(*status, *code, text))]
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
    /// The key's group could not answer (cluster client, under
    /// `FailurePolicy::Error`): no member admitted, or (`outcome_unknown`)
    /// the spend was sent and no answer came.
    #[error("group {group} unavailable (last known primary {primary}){}{}",
        if *outcome_unknown { ": sent, no answer: it may have been applied" } else { ": not applied" },
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Unavailable {
        group: String,
        primary: String,
        outcome_unknown: bool,
        last_error: Option<String>,
    },
}

impl Error {
    /// The same error again (an `io::Error` cannot be cloned: its kind and
    /// words are), for every call of a batch that met it.
    pub(crate) fn copy(&self) -> Error {
        match self {
            Error::Timeout(d) => Error::Timeout(*d),
            Error::Disconnected => Error::Disconnected,
            Error::Connect { addr, source } => Error::Connect {
                addr: addr.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Server { status, code, text } => Error::Server {
                status: *status,
                code: *code,
                text: text.clone(),
            },
            Error::Protocol(t) => Error::Protocol(t.clone()),
            Error::Invalid(t) => Error::Invalid(t.clone()),
            Error::Unavailable {
                group,
                primary,
                outcome_unknown,
                last_error,
            } => Error::Unavailable {
                group: group.clone(),
                primary: primary.clone(),
                outcome_unknown: *outcome_unknown,
                last_error: last_error.clone(),
            },
        }
    }
}

/// A server error's words, each said once: the status's name and code,
/// then the server's text when it adds anything (`unknown tier (15)`, not
/// `unknown tier (15): unknown tier`).
fn server_said(status: Option<Status>, code: u16, text: &str) -> String {
    match status {
        Some(s) if text.is_empty() || text == s.text() => s.to_string(),
        Some(s) => match text.strip_prefix(s.text()) {
            Some(rest) => format!("{s}{rest}"),
            None => format!("{s}: {text}"),
        },
        None => format!("unknown code {code}: {text}"),
    }
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
            Error::Unavailable {
                outcome_unknown: true,
                ..
            } => Action::OutcomeUnknown,
            Error::Unavailable { .. } => Action::Retry,
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
        assert!(
            shown.contains("the primary is 127.0.0.1:7700 (epoch 3)"),
            "{shown}"
        );
        assert_eq!(
            shown.matches("not primary").count(),
            1,
            "said once: {shown}"
        );
        // A text that only repeats the status is not repeated.
        let tier = Error::server(Status::UnknownTier.code(), "unknown tier".into());
        assert_eq!(tier.to_string(), "server said unknown tier (15)");
        // A code this client does not know still shows the server's text.
        let unknown = Error::server(999, "later".into());
        assert_eq!(unknown.action(), Action::GiveUp);
        assert!(unknown.to_string().contains("unknown code 999: later"));
    }
}

//! One request's failure as a connector classifies it, and what the engine
//! makes of it: the single `Failure` type every connector's answer mapping
//! produces (an HTTP status, a gRPC code, a database error), turned into the
//! [`SinkError`] or [`ConnectorError`] the engine acts on.

use std::time::Duration;

use crate::connectors::{ConnectorError, Rejection, SinkError};

/// Why one request to a backend did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The same request may succeed later (no answer, a timeout, throttling,
    /// a server error); not before `retry_after` when the backend said so.
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The request itself is refused: sending it again changes nothing.
    Refused(String),
    /// The connector cannot go on (credentials, a missing target it may not
    /// create, a config the backend refuses).
    Fatal(String),
}

impl Failure {
    pub fn transient(reason: impl Into<String>) -> Self {
        Self::Transient {
            reason: reason.into(),
            retry_after: None,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Self::Transient { reason, .. } | Self::Refused(reason) | Self::Fatal(reason) => reason,
        }
    }

    /// The answer to a write whose request carried the messages at
    /// `indexes` of the batch: a refusal rejects each of them with the
    /// reason.
    pub fn for_messages(self, indexes: impl IntoIterator<Item = usize>) -> SinkError {
        match self {
            Self::Transient {
                reason,
                retry_after,
            } => SinkError::transient_after(reason, retry_after),
            Self::Refused(reason) => SinkError::Rejected(
                indexes
                    .into_iter()
                    .map(|index| Rejection {
                        index,
                        reason: reason.clone(),
                    })
                    .collect(),
            ),
            Self::Fatal(reason) => SinkError::fatal(reason),
        }
    }
}

/// At `open`, a `commit` or a `poll` nothing is rejected message by message:
/// a refused request is as final as a fatal one.
impl From<Failure> for ConnectorError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Transient { reason, .. } => ConnectorError::transient(reason),
            Failure::Refused(reason) | Failure::Fatal(reason) => ConnectorError::fatal(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_refusal_when_made_a_sink_error_should_reject_every_message_of_the_request() {
        let error = Failure::Refused("400: bad".into()).for_messages([2, 5]);
        let SinkError::Rejected(rejections) = error else {
            panic!("{error:?}");
        };
        assert_eq!(
            rejections,
            [
                Rejection {
                    index: 2,
                    reason: "400: bad".into()
                },
                Rejection {
                    index: 5,
                    reason: "400: bad".into()
                }
            ]
        );
    }

    #[test]
    fn given_a_throttled_request_when_made_a_sink_error_should_carry_the_wait() {
        let failure = Failure::Transient {
            reason: "429".into(),
            retry_after: Some(Duration::from_secs(7)),
        };
        assert!(matches!(
            failure.for_messages(0..3),
            SinkError::Transient {
                retry_after: Some(wait),
                ..
            } if wait == Duration::from_secs(7)
        ));
    }

    #[test]
    fn given_a_refusal_at_open_when_made_a_connector_error_should_be_fatal() {
        let error = ConnectorError::from(Failure::Refused("401".into()));
        assert!(matches!(error, ConnectorError::Fatal(_)));
        let error = ConnectorError::from(Failure::transient("refused"));
        assert!(error.is_transient());
    }
}

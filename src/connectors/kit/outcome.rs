//! A write's answer per message, gathered request by request as a sink
//! sends a batch in several requests (by count, by bytes, halves of a
//! refused one): which messages are durable, which refused, and what became
//! of the others; and the one `Result` the engine gets from it.

use super::failure::Failure;
use crate::connectors::{Rejection, SinkError};

#[derive(Debug, Default)]
pub struct Outcome {
    durable: Vec<usize>,
    rejected: Vec<Rejection>,
    /// What became of every message neither durable nor rejected; set by
    /// the first failure, after which the sink sends nothing more.
    rest: Option<SinkError>,
}

impl Outcome {
    /// What a sink gathered itself: the messages stored and those refused.
    pub fn settled(durable: Vec<usize>, rejected: Vec<Rejection>) -> Self {
        Self {
            durable,
            rejected,
            rest: None,
        }
    }

    /// The messages at `indexes` are stored.
    pub fn durable(&mut self, indexes: impl IntoIterator<Item = usize>) {
        self.durable.extend(indexes);
    }

    /// The message at `index` is refused for good.
    pub fn reject(&mut self, index: usize, reason: impl Into<String>) {
        self.rejected.push(Rejection {
            index,
            reason: reason.into(),
        });
    }

    /// The request carrying the messages at `indexes` failed: a refusal
    /// rejects each of them; anything else is what becomes of every message
    /// not settled, and the write stops (see [`stopped`](Self::stopped)).
    pub fn fail(&mut self, failure: Failure, indexes: impl IntoIterator<Item = usize>) {
        match failure {
            Failure::Refused(reason) => {
                for index in indexes {
                    self.reject(index, reason.clone());
                }
            }
            failure => self.stop(failure.for_messages([])),
        }
    }

    /// Whether a failure ended the write: what is not sent yet stays unsent
    /// (a backend that throttles or is down is not sent more), and the
    /// engine writes it again.
    pub fn stopped(&self) -> bool {
        self.rest.is_some()
    }

    /// `Ok` when nothing failed and nothing was refused: the caller settled
    /// every message of the batch as durable. Otherwise the error saying what
    /// is durable, what is refused and what failed how.
    pub fn into_result(self) -> Result<(), SinkError> {
        let Self {
            durable,
            rejected,
            rest,
        } = self;
        match rest {
            None if rejected.is_empty() => Ok(()),
            None if durable.is_empty() => Err(SinkError::Rejected(rejected)),
            // Every message is settled: the engine never reads this rest.
            None => Err(SinkError::partial(
                durable,
                rejected,
                SinkError::Rejected(Vec::new()),
            )),
            Some(rest) if durable.is_empty() && rejected.is_empty() => Err(rest),
            Some(rest) => Err(SinkError::partial(durable, rejected, rest)),
        }
    }

    /// A fatal failure outweighs a transient one; of two transient ones the
    /// first is kept, waiting the longer `retry_after` of the two.
    fn stop(&mut self, error: SinkError) {
        self.rest = match (self.rest.take(), error) {
            (None, error) => Some(error),
            (Some(kept @ SinkError::Fatal(_)), _) => Some(kept),
            (
                Some(SinkError::Transient {
                    error,
                    retry_after: kept,
                }),
                SinkError::Transient { retry_after, .. },
            ) => Some(SinkError::transient_after(error, kept.max(retry_after))),
            (Some(_), error @ SinkError::Fatal(_)) => Some(error),
            (Some(kept), _) => Some(kept),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn transient(reason: &str, seconds: Option<u64>) -> Failure {
        Failure::Transient {
            reason: reason.into(),
            retry_after: seconds.map(Duration::from_secs),
        }
    }

    #[test]
    fn given_every_message_durable_when_finished_should_be_ok() {
        let mut outcome = Outcome::default();
        outcome.durable([0, 1, 2]);
        assert!(outcome.into_result().is_ok());
    }

    #[test]
    fn given_only_refusals_when_finished_should_reject_each_message_of_the_request() {
        let mut outcome = Outcome::default();
        outcome.fail(Failure::Refused("400".into()), [1, 3]);
        assert!(!outcome.stopped());
        let Err(SinkError::Rejected(rejected)) = outcome.into_result() else {
            panic!("expected rejections");
        };
        assert_eq!(rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn given_stored_and_refused_messages_when_finished_should_keep_the_stored_out_of_the_retry() {
        let mut outcome = Outcome::default();
        outcome.durable([0, 2]);
        outcome.reject(1, "mapping");
        let Err(SinkError::Partial(partial)) = outcome.into_result() else {
            panic!("expected a partial answer");
        };
        assert_eq!(partial.durable, [0, 2]);
        assert_eq!(partial.rejected[0].index, 1);
    }

    #[test]
    fn given_a_throttled_request_after_a_stored_one_when_finished_should_retry_the_rest_after_the_longest_wait()
     {
        let mut outcome = Outcome::default();
        outcome.durable([0]);
        outcome.fail(transient("429", Some(2)), [1]);
        assert!(outcome.stopped());
        outcome.fail(transient("503", Some(7)), [2]);
        let Err(SinkError::Partial(partial)) = outcome.into_result() else {
            panic!("expected a partial answer");
        };
        assert_eq!(partial.durable, [0]);
        let SinkError::Transient { error, retry_after } = partial.rest else {
            panic!("{:?}", partial.rest);
        };
        assert_eq!(error.to_string(), "429");
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn given_a_transient_and_a_fatal_failure_when_finished_should_be_fatal() {
        let mut outcome = Outcome::default();
        outcome.fail(transient("503", None), [0]);
        outcome.fail(Failure::Fatal("index gone".into()), [1]);
        outcome.fail(transient("429", None), [2]);
        assert!(matches!(outcome.into_result(), Err(SinkError::Fatal(_))));
    }
}

//! Where accepted requests wait to become a batch, the batch in flight, and the
//! answers owed to their clients.
//!
//! Handlers `submit` a request's records; `next_batch` (the source's `poll`)
//! gathers every waiting request, up to `batch_length` messages, into one batch
//! and keeps the requests as a batch in flight; `commit` answers the requests of
//! the oldest batch in flight (a failed delivery is retried by the engine
//! with the same batch, so a batch in flight never comes back). Requests
//! that arrive while batches are in flight (the engine keeps retrying while
//! the broker is down) wait here; one that gives up before it was taken into a
//! batch is `withdraw`n and will never be delivered.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::message::SourceRecord;

/// How a waiting request ended, as told to its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The batch holding the request's messages is in Iggy.
    Committed,
    /// The source closed first. `in_flight` says the messages were in a batch
    /// being delivered, so they may still be in Iggy.
    Closed { in_flight: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the source is shutting down")]
    Closed,
    #[error("{waiting} messages are already waiting for the broker")]
    Full { waiting: usize },
}

/// How a request that waited for its batch ([`Inbox::deliver`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The batch holding its records is in Iggy.
    Committed,
    /// Refused on arrival: nothing was queued.
    Refused(SubmitError),
    /// Not committed in time (`closing: false`) or the source closed first.
    /// `maybe_delivered`: the records were in a batch being delivered, so
    /// they may be (or still get) in Iggy and a retry may duplicate them;
    /// otherwise they were taken back and will never be delivered.
    NotCommitted {
        closing: bool,
        maybe_delivered: bool,
    },
}

/// Identifies one submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// What became of a request that gave up waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawn {
    /// It was still waiting: its messages will never be delivered.
    Removed,
    /// It was already taken into a batch (one in flight, or one discarded
    /// after a NACK whose send may have landed, queued again): its messages
    /// may be delivered, and stay queued.
    TooLate,
}

/// A snapshot for the health endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    pub closed: bool,
    pub waiting_requests: usize,
    pub waiting_messages: usize,
    pub in_flight_messages: usize,
    /// How long the batch in flight has been waiting to be committed.
    pub in_flight_age: Option<Duration>,
    /// How long requests have been waiting without any batch being committed.
    pub stalled_for: Option<Duration>,
}

pub struct Inbox {
    state: Mutex<State>,
    arrived: Notify,
    batch_length: usize,
    linger_time: Duration,
    max_waiting_messages: usize,
    unhealthy_after: Duration,
}

#[derive(Default)]
struct State {
    closed: bool,
    waiting: VecDeque<Submission>,
    waiting_messages: usize,
    /// Oldest first.
    in_flight: VecDeque<InFlight>,
    next_ticket: u64,
    /// Since when there has been work (waiting or in flight) with no commit.
    stalled_since: Option<Instant>,
}

struct Submission {
    ticket: u64,
    records: Vec<SourceRecord>,
    /// `None` for requests already answered (`ack = "accepted"`).
    reply: Option<oneshot::Sender<Outcome>>,
    arrived_at: Instant,
}

struct InFlight {
    /// The requests, answered when the batch commits.
    submissions: Vec<Submission>,
    messages: usize,
    taken_at: Instant,
}

pub struct Limits {
    pub batch_length: usize,
    pub linger_time: Duration,
    pub max_waiting_messages: usize,
    pub unhealthy_after: Duration,
}

impl Inbox {
    pub fn new(limits: Limits) -> Self {
        Self {
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
            batch_length: limits.batch_length.max(1),
            linger_time: limits.linger_time,
            max_waiting_messages: limits.max_waiting_messages,
            unhealthy_after: limits.unhealthy_after,
        }
    }

    /// Queues a request's records for the next batch. `reply` hears the outcome;
    /// `None` when the client was already answered.
    pub fn submit(
        &self,
        records: Vec<SourceRecord>,
        reply: Option<oneshot::Sender<Outcome>>,
    ) -> Result<Ticket, SubmitError> {
        let count = records.len();
        let mut state = self.lock();
        if state.closed {
            return Err(SubmitError::Closed);
        }
        // One request may exceed the limit on its own when nothing else waits,
        // so a large (but size-checked) request is never refused forever.
        if state.waiting_messages > 0 && state.waiting_messages + count > self.max_waiting_messages
        {
            return Err(SubmitError::Full {
                waiting: state.waiting_messages,
            });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let now = Instant::now();
        state.stalled_since.get_or_insert(now);
        state.waiting_messages += count;
        state.waiting.push_back(Submission {
            ticket,
            records,
            reply,
            arrived_at: now,
        });
        drop(state);
        self.arrived.notify_one();
        Ok(Ticket(ticket))
    }

    /// Queues a request's records and waits up to `timeout` for their batch
    /// to be committed. A request that gives up (times out, or its future is
    /// dropped because the client hung up) before its records were taken
    /// into a batch is withdrawn: they are never delivered.
    pub async fn deliver(&self, records: Vec<SourceRecord>, timeout: Duration) -> Delivery {
        let (reply, mut outcome) = oneshot::channel();
        let ticket = match self.submit(records, Some(reply)) {
            Ok(ticket) => ticket,
            Err(refusal) => return Delivery::Refused(refusal),
        };
        let mut waiting = Waiting {
            inbox: self,
            ticket: Some(ticket),
        };
        let finished = tokio::time::timeout(timeout, &mut outcome).await;
        let ticket = waiting.ticket.take();
        let outcome = match finished {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Outcome::Closed { in_flight: true },
            Err(_) => {
                let withdrawn = ticket.map_or(Withdrawn::TooLate, |ticket| self.withdraw(ticket));
                match (withdrawn, outcome.try_recv()) {
                    (Withdrawn::TooLate, Ok(outcome)) => outcome,
                    (withdrawn, _) => {
                        return Delivery::NotCommitted {
                            closing: false,
                            maybe_delivered: withdrawn == Withdrawn::TooLate,
                        };
                    }
                }
            }
        };
        match outcome {
            Outcome::Committed => Delivery::Committed,
            Outcome::Closed { in_flight } => Delivery::NotCommitted {
                closing: true,
                maybe_delivered: in_flight,
            },
        }
    }

    /// Takes a request back if it is still waiting.
    pub fn withdraw(&self, ticket: Ticket) -> Withdrawn {
        let mut state = self.lock();
        let Some(position) = state
            .waiting
            .iter()
            .position(|submission| submission.ticket == ticket.0)
        else {
            return Withdrawn::TooLate;
        };
        if let Some(submission) = state.waiting.remove(position) {
            state.waiting_messages -= submission.records.len();
        }
        if state.waiting.is_empty() && state.in_flight.is_empty() {
            state.stalled_since = None;
        }
        Withdrawn::Removed
    }

    /// Waits for requests, lets the first one linger up to `linger_time` for
    /// others, then takes every waiting request (up to `batch_length` messages,
    /// never splitting a request) as the batch in flight.
    ///
    /// Cancel-safe: nothing is taken until the last step, which does not await.
    pub async fn next_batch(&self) -> Vec<SourceRecord> {
        loop {
            let arrived = self.arrived.notified();
            let deadline = {
                let mut state = self.lock();
                match state.waiting.front() {
                    None => None,
                    Some(first) => {
                        let deadline = first.arrived_at + self.linger_time;
                        if state.waiting_messages >= self.batch_length || deadline <= Instant::now()
                        {
                            let records = self.take(&mut state);
                            if !records.is_empty() {
                                return records;
                            }
                        }
                        Some(deadline)
                    }
                }
            };
            match deadline {
                None => arrived.await,
                Some(deadline) => {
                    let _ = tokio::time::timeout_at(deadline.into(), arrived).await;
                }
            }
        }
    }

    /// The oldest batch in flight is durable: answers its requests. Returns
    /// how many requests were answered.
    pub fn commit(&self) -> usize {
        let mut state = self.lock();
        let Some(in_flight) = state.in_flight.pop_front() else {
            return 0;
        };
        state.stalled_since = if state.waiting.is_empty() && state.in_flight.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        drop(state);
        let mut answered = 0;
        for reply in in_flight
            .submissions
            .into_iter()
            .filter_map(|submission| submission.reply)
        {
            // The client may have given up already; its messages are in Iggy anyway.
            answered += 1;
            let _ = reply.send(Outcome::Committed);
        }
        answered
    }

    /// Refuses new requests and answers every waiting one. Returns the requests
    /// answered and the messages dropped that had been acknowledged already
    /// (`ack = "accepted"`).
    pub fn close(&self) -> (usize, usize) {
        let mut state = self.lock();
        state.closed = true;
        let waiting = std::mem::take(&mut state.waiting);
        let in_flight = std::mem::take(&mut state.in_flight);
        state.waiting_messages = 0;
        state.stalled_since = None;
        drop(state);
        let mut answered = 0;
        let mut dropped = 0;
        for submission in waiting {
            match submission.reply {
                Some(reply) => {
                    answered += 1;
                    let _ = reply.send(Outcome::Closed { in_flight: false });
                }
                None => dropped += submission.records.len(),
            }
        }
        for submission in in_flight.into_iter().flat_map(|batch| batch.submissions) {
            match submission.reply {
                Some(reply) => {
                    answered += 1;
                    let _ = reply.send(Outcome::Closed { in_flight: true });
                }
                None => dropped += submission.records.len(),
            }
        }
        (answered, dropped)
    }

    pub fn health(&self) -> Health {
        let state = self.lock();
        let now = Instant::now();
        let stalled_for = state.stalled_since.map(|since| now - since);
        Health {
            healthy: !state.closed
                && stalled_for.is_none_or(|stalled| stalled < self.unhealthy_after),
            closed: state.closed,
            waiting_requests: state.waiting.len(),
            waiting_messages: state.waiting_messages,
            in_flight_messages: state.in_flight.iter().map(|batch| batch.messages).sum(),
            in_flight_age: state.in_flight.front().map(|batch| now - batch.taken_at),
            stalled_for,
        }
    }

    fn take(&self, state: &mut State) -> Vec<SourceRecord> {
        let mut records = Vec::with_capacity(state.waiting_messages.min(self.batch_length));
        let mut submissions = Vec::new();
        while let Some(next) = state.waiting.front() {
            if !records.is_empty() && records.len() + next.records.len() > self.batch_length {
                break;
            }
            let Some(submission) = state.waiting.pop_front() else {
                break;
            };
            state.waiting_messages -= submission.records.len();
            records.extend(submission.records.iter().cloned());
            submissions.push(submission);
        }
        if !records.is_empty() {
            state.in_flight.push_back(InFlight {
                submissions,
                messages: records.len(),
                taken_at: Instant::now(),
            });
        }
        records
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent, so a panic elsewhere while
        // holding the lock does not make it unusable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Withdraws a waiting request whose waiter went away.
struct Waiting<'a> {
    inbox: &'a Inbox,
    ticket: Option<Ticket>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.inbox.withdraw(ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;

    fn inbox(batch_length: usize, max_waiting: usize) -> Inbox {
        Inbox::new(Limits {
            batch_length,
            linger_time: Duration::ZERO,
            max_waiting_messages: max_waiting,
            unhealthy_after: Duration::from_secs(60),
        })
    }

    fn records(count: usize) -> Vec<SourceRecord> {
        (0..count)
            .map(|index| SourceRecord::new(Payload::Text(index.to_string())))
            .collect()
    }

    #[tokio::test]
    async fn given_waiting_requests_when_polled_should_take_whole_requests_up_to_the_limit() {
        let inbox = inbox(5, 100);
        for count in [2, 2, 2] {
            inbox.submit(records(count), None).unwrap();
        }
        assert_eq!(inbox.next_batch().await.len(), 4);
        inbox.commit();
        assert_eq!(inbox.next_batch().await.len(), 2);
    }

    #[tokio::test]
    async fn given_request_larger_than_batch_length_when_polled_should_not_split_it() {
        let inbox = inbox(3, 100);
        inbox.submit(records(7), None).unwrap();
        assert_eq!(inbox.next_batch().await.len(), 7);
    }

    #[tokio::test]
    async fn given_batch_in_flight_when_committed_should_answer_only_its_requests() {
        let inbox = inbox(10, 100);
        let (first_tx, first_rx) = oneshot::channel();
        inbox.submit(records(1), Some(first_tx)).unwrap();
        inbox.next_batch().await;
        let (second_tx, mut second_rx) = oneshot::channel();
        inbox.submit(records(1), Some(second_tx)).unwrap();
        assert_eq!(inbox.commit(), 1);
        assert_eq!(first_rx.await.unwrap(), Outcome::Committed);
        assert!(second_rx.try_recv().is_err(), "not committed yet");
    }

    #[tokio::test]
    async fn given_request_still_waiting_when_withdrawn_should_never_be_polled() {
        let inbox = inbox(10, 100);
        let ticket = inbox.submit(records(1), None).unwrap();
        inbox.submit(records(2), None).unwrap();
        assert_eq!(inbox.withdraw(ticket), Withdrawn::Removed);
        assert_eq!(inbox.next_batch().await.len(), 2);
    }

    #[tokio::test]
    async fn given_request_in_flight_when_withdrawn_should_say_too_late() {
        let inbox = inbox(10, 100);
        let ticket = inbox.submit(records(1), None).unwrap();
        inbox.next_batch().await;
        assert_eq!(inbox.withdraw(ticket), Withdrawn::TooLate);
    }

    #[test]
    fn given_full_inbox_when_submitting_should_refuse() {
        let inbox = inbox(10, 3);
        inbox.submit(records(3), None).unwrap();
        assert_eq!(
            inbox.submit(records(1), None),
            Err(SubmitError::Full { waiting: 3 })
        );
    }

    #[tokio::test]
    async fn given_waiting_and_in_flight_requests_when_closed_should_answer_all() {
        let inbox = inbox(1, 100);
        let (first_tx, first_rx) = oneshot::channel();
        let (second_tx, second_rx) = oneshot::channel();
        inbox.submit(records(1), Some(first_tx)).unwrap();
        inbox.submit(records(1), Some(second_tx)).unwrap();
        inbox.next_batch().await;
        assert_eq!(inbox.close(), (2, 0));
        assert_eq!(first_rx.await.unwrap(), Outcome::Closed { in_flight: true });
        assert_eq!(
            second_rx.await.unwrap(),
            Outcome::Closed { in_flight: false }
        );
        assert_eq!(inbox.submit(records(1), None), Err(SubmitError::Closed));
    }

    #[tokio::test]
    async fn given_work_without_commit_for_too_long_when_checked_should_be_unhealthy() {
        let inbox = Inbox::new(Limits {
            batch_length: 10,
            linger_time: Duration::ZERO,
            max_waiting_messages: 100,
            unhealthy_after: Duration::ZERO,
        });
        assert!(inbox.health().healthy, "idle is healthy");
        inbox.submit(records(1), None).unwrap();
        inbox.next_batch().await;
        let health = inbox.health();
        assert!(!health.healthy);
        assert_eq!(health.in_flight_messages, 1);
        inbox.commit();
        assert!(
            inbox.health().healthy,
            "a commit with nothing left is progress"
        );
    }
}

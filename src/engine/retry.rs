//! The engine's one retry loop: an operation is tried until it succeeds or
//! says to stop, or until its time is up, with a capped backoff after each
//! failure. Polls, writes, sends, commits and bus setup all retry through it.

use std::future::Future;
use std::time::Duration;

use crate::engine::Shutdown;
use crate::engine::backoff::Backoff;

/// What one attempt came to.
pub enum Attempt<T, F, E> {
    Done(T),
    /// Failed: report it, wait the backoff, try again.
    Failed(F),
    /// Failed, and the other side asked not to be tried again for this long
    /// (`Retry-After`): wait that or the backoff, whichever is longer.
    Throttled(F, Duration),
    /// Made progress without finishing (rejected messages were set aside, say):
    /// try again at once, without counting a failure.
    Again,
    /// Give up.
    Stop(E),
}

/// One failed attempt, for the caller to report (and to stop on: a NACK limit).
pub struct Failure<F> {
    /// Consecutive failures so far, from 1.
    pub attempt: u32,
    /// The wait before the next attempt.
    pub delay: Duration,
    pub error: F,
}

/// How long an operation is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Until a stop is requested: work nothing depends on yet (a poll, setup).
    StopRequested,
    /// Until the grace period after a stop request ran out: the batch in flight.
    GraceExpired,
}

/// Why a retried operation ended without a value.
#[derive(Debug, PartialEq, Eq)]
pub enum GaveUp<E> {
    /// The attempt, or the report of a failure, said to stop.
    Stopped(E),
    /// The time given by [`Until`] was up (the attempt running then is dropped).
    TimeUp,
}

impl<E> GaveUp<E> {
    /// The error to end with, `time_up()` when the time was up.
    pub fn or(self, time_up: impl FnOnce() -> E) -> E {
        match self {
            GaveUp::Stopped(error) => error,
            GaveUp::TimeUp => time_up(),
        }
    }
}

/// Runs `attempt` until it is done or stops, calling `failed` after each
/// failure (an `Err` from it stops), then waiting `backoff`. Gives up with
/// [`GaveUp::TimeUp`] once `until` says the time is up, during an attempt or
/// a wait.
pub async fn retry<T, F, E, Fut>(
    backoff: Backoff,
    shutdown: &Shutdown,
    until: Until,
    mut attempt: impl FnMut() -> Fut,
    failed: impl FnMut(Failure<F>) -> Result<(), E>,
) -> Result<T, GaveUp<E>>
where
    Fut: Future<Output = Attempt<T, F, E>>,
{
    let attempt = move |()| {
        let future = attempt();
        async move { ((), future.await) }
    };
    retry_with(backoff, shutdown, until, (), attempt, failed).await
}

/// [`retry`] for an attempt that changes `state` (mutable borrows, say): each
/// attempt takes it and hands it back, so the futures borrow nothing from the
/// closure and stay `Send` for spawned pipelines.
pub async fn retry_with<S, T, F, E, Fut>(
    backoff: Backoff,
    shutdown: &Shutdown,
    until: Until,
    mut state: S,
    mut attempt: impl FnMut(S) -> Fut,
    mut failed: impl FnMut(Failure<F>) -> Result<(), E>,
) -> Result<T, GaveUp<E>>
where
    Fut: Future<Output = (S, Attempt<T, F, E>)>,
{
    let time_up = async {
        match until {
            Until::StopRequested => shutdown.requested().await,
            Until::GraceExpired => shutdown.grace_expired().await,
        }
    };
    tokio::pin!(time_up);
    let mut failures = 0;
    loop {
        let outcome = tokio::select! {
            biased;
            () = &mut time_up => return Err(GaveUp::TimeUp),
            (returned, outcome) = attempt(state) => {
                state = returned;
                outcome
            }
        };
        let (error, asked) = match outcome {
            Attempt::Done(value) => return Ok(value),
            Attempt::Again => continue,
            Attempt::Stop(error) => return Err(GaveUp::Stopped(error)),
            Attempt::Failed(error) => (error, Duration::ZERO),
            Attempt::Throttled(error, wait) => (error, wait),
        };
        failures += 1;
        let delay = backoff.delay(failures).max(asked);
        failed(Failure {
            attempt: failures,
            delay,
            error,
        })
        .map_err(GaveUp::Stopped)?;
        tokio::select! {
            biased;
            () = &mut time_up => return Err(GaveUp::TimeUp),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;

    const QUICK: Backoff = Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(2),
        multiplier: 2.0,
    };

    #[tokio::test]
    async fn given_failures_when_retried_should_report_each_and_return_the_value() {
        let shutdown = Shutdown::new(CancellationToken::new(), Duration::ZERO);
        let mut reported = Vec::new();
        let result: Result<u32, GaveUp<()>> = retry_with(
            QUICK,
            &shutdown,
            Until::StopRequested,
            0,
            |calls| async move {
                let calls = calls + 1;
                let outcome = match calls {
                    1 | 3 => Attempt::Failed(calls),
                    2 => Attempt::Again,
                    _ => Attempt::Done(calls),
                };
                (calls, outcome)
            },
            |failure| {
                reported.push((failure.attempt, failure.error));
                Ok(())
            },
        )
        .await;
        assert_eq!(result, Ok(4));
        assert_eq!(reported, [(1, 1), (2, 3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn given_a_throttled_attempt_when_retried_should_wait_what_was_asked() {
        let shutdown = Shutdown::new(CancellationToken::new(), Duration::ZERO);
        let started = tokio::time::Instant::now();
        let mut delays = Vec::new();
        let result: Result<Duration, GaveUp<()>> = retry_with(
            QUICK,
            &shutdown,
            Until::StopRequested,
            0,
            |calls| async move {
                let outcome = match calls {
                    0 => Attempt::Throttled((), Duration::from_secs(30)),
                    _ => Attempt::Done(started.elapsed()),
                };
                (calls + 1, outcome)
            },
            |failure| {
                delays.push(failure.delay);
                Ok(())
            },
        )
        .await;
        // The paused clock moves only by the waits taken: exactly the 30 s
        // asked for, not the few milliseconds of the backoff.
        assert_eq!(result, Ok(Duration::from_secs(30)));
        assert_eq!(delays, [Duration::from_secs(30)]);
    }

    #[tokio::test]
    async fn given_a_report_that_stops_when_retried_should_give_up_with_it() {
        let shutdown = Shutdown::new(CancellationToken::new(), Duration::ZERO);
        let result: Result<(), GaveUp<&str>> = retry(
            QUICK,
            &shutdown,
            Until::StopRequested,
            || async { Attempt::Failed(()) },
            |failure| {
                if failure.attempt == 3 {
                    Err("limit")
                } else {
                    Ok(())
                }
            },
        )
        .await;
        assert_eq!(result, Err(GaveUp::Stopped("limit")));
    }

    #[tokio::test]
    async fn given_a_stop_request_when_retrying_should_give_up_by_its_deadline() {
        let token = CancellationToken::new();
        let shutdown = Shutdown::new(token.clone(), Duration::from_millis(20));
        token.cancel();
        let until_stop: Result<(), GaveUp<()>> = retry(
            QUICK,
            &shutdown,
            Until::StopRequested,
            || async { Attempt::Failed(()) },
            |_| Ok(()),
        )
        .await;
        assert_eq!(until_stop, Err(GaveUp::TimeUp));
        // With the grace period, attempts go on until it ran out.
        let mut failures = 0;
        let until_grace: Result<(), GaveUp<()>> = retry(
            QUICK,
            &shutdown,
            Until::GraceExpired,
            || async { Attempt::Failed(()) },
            |failure| {
                failures = failure.attempt;
                Ok(())
            },
        )
        .await;
        assert_eq!(until_grace, Err(GaveUp::TimeUp));
        assert!(failures > 1, "{failures}");
    }
}

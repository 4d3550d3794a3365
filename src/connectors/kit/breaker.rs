//! A circuit breaker: after `threshold` consecutive failed attempts the
//! endpoint is left alone for `cool_down`; then one probe request is let
//! through, and its outcome closes or reopens the breaker.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct CircuitBreaker {
    /// 0 disables the breaker.
    threshold: u32,
    cool_down: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; `since` lets a probe that never reported (its request
    /// was cancelled) be replaced after a cool-down.
    HalfOpen {
        since: Instant,
    },
}

/// A change the caller reports (log, metric, degraded flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
}

impl CircuitBreaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold,
            cool_down,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Whether a request may go out now. After the cool-down the first caller
    /// becomes the probe; the others are refused until it reports.
    pub fn allow(&self) -> bool {
        let mut state = self.lock();
        let now = Instant::now();
        match *state {
            State::Closed { .. } => true,
            State::Open { until } | State::HalfOpen { since: until } if now < until => false,
            State::Open { .. } | State::HalfOpen { .. } => {
                *state = State::HalfOpen {
                    since: now + self.cool_down,
                };
                true
            }
        }
    }

    pub fn record_success(&self) -> Option<Transition> {
        let mut state = self.lock();
        let was_open = !matches!(*state, State::Closed { .. });
        *state = State::Closed { failures: 0 };
        was_open.then_some(Transition::Closed)
    }

    pub fn record_failure(&self) -> Option<Transition> {
        if self.threshold == 0 {
            return None;
        }
        let mut state = self.lock();
        let open = State::Open {
            until: Instant::now() + self.cool_down,
        };
        match *state {
            State::Closed { failures } if failures + 1 >= self.threshold => {
                *state = open;
                Some(Transition::Opened)
            }
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                None
            }
            // A failed probe: stay away for another cool-down, still open.
            State::HalfOpen { .. } | State::Open { .. } => {
                *state = open;
                None
            }
        }
    }

    pub fn is_open(&self) -> bool {
        !matches!(*self.lock(), State::Closed { .. })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_threshold_failures_when_recorded_should_open_and_refuse() {
        let breaker = CircuitBreaker::new(2, Duration::from_secs(60));
        assert_eq!(breaker.record_failure(), None);
        assert!(breaker.allow());
        assert_eq!(breaker.record_failure(), Some(Transition::Opened));
        assert!(!breaker.allow());
    }

    #[test]
    fn given_success_between_failures_when_recorded_should_reset_the_count() {
        let breaker = CircuitBreaker::new(2, Duration::from_secs(60));
        breaker.record_failure();
        assert_eq!(breaker.record_success(), None);
        assert_eq!(breaker.record_failure(), None);
        assert!(breaker.allow());
    }

    #[test]
    fn given_cool_down_over_when_asked_should_let_one_probe_through() {
        let breaker = CircuitBreaker::new(1, Duration::ZERO);
        breaker.record_failure();
        assert!(breaker.allow(), "the probe");
        assert_eq!(breaker.record_success(), Some(Transition::Closed));
        assert!(!breaker.is_open());
    }

    #[test]
    fn given_probe_out_when_others_ask_should_refuse_them() {
        let breaker = CircuitBreaker::new(1, Duration::from_secs(60));
        breaker.record_failure();
        *breaker.lock() = State::Open {
            until: Instant::now(),
        };
        assert!(breaker.allow(), "the probe");
        assert!(!breaker.allow(), "others wait for the probe");
        assert_eq!(
            breaker.record_failure(),
            None,
            "a failed probe reopens quietly"
        );
        assert!(breaker.is_open());
    }

    #[test]
    fn given_zero_threshold_when_failing_should_never_open() {
        let breaker = CircuitBreaker::new(0, Duration::from_secs(60));
        for _ in 0..100 {
            breaker.record_failure();
        }
        assert!(breaker.allow());
    }
}

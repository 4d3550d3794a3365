//! Capped exponential backoff with jitter, for retrying the same work.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait before the first retry.
    pub initial: Duration,
    /// No wait is longer, jitter included.
    pub max: Duration,
    /// Growth per retry; values under 1 count as 1.
    pub multiplier: f64,
}

impl Backoff {
    /// The delay before retry number `attempt` (1-based): `initial` growing by
    /// `multiplier`, capped at `max`, with ±20 % jitter (never over `max`) so
    /// many connectors retrying at once do not move in lockstep.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.max(1.0).powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let jitter = 0.8 + rand::random::<f64>() * 0.4;
        Duration::from_secs_f64(capped * jitter).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_SECOND_DOUBLING: Backoff = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(5),
        multiplier: 2.0,
    };

    fn within(delay: Duration, low_ms: u64, high_ms: u64) -> bool {
        delay >= Duration::from_millis(low_ms) && delay <= Duration::from_millis(high_ms)
    }

    #[test]
    fn given_retries_when_delayed_should_grow_with_jitter_and_stay_capped() {
        for _ in 0..100 {
            let first = ONE_SECOND_DOUBLING.delay(1);
            assert!(within(first, 800, 1200), "{first:?}");
            let third = ONE_SECOND_DOUBLING.delay(3);
            assert!(within(third, 3200, 4800), "{third:?}");
            assert!(ONE_SECOND_DOUBLING.delay(10) <= Duration::from_secs(5));
            assert!(ONE_SECOND_DOUBLING.delay(u32::MAX) <= Duration::from_secs(5));
        }
    }

    #[test]
    fn given_a_multiplier_under_one_when_delayed_should_not_shrink() {
        let backoff = Backoff {
            multiplier: 0.1,
            ..ONE_SECOND_DOUBLING
        };
        let fifth = backoff.delay(5);
        assert!(within(fifth, 800, 1200), "{fifth:?}");
    }
}

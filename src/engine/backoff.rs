//! Capped exponential backoff with jitter, for retrying the same batch.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
}

impl Backoff {
    /// Retries of a source batch: 100 ms doubling, capped at 30 s (upstream
    /// caps at 5 s). With the default NACK limit the retries span more than
    /// two minutes, so a source rides out a broker restart by default.
    pub const SOURCE: Backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(30),
        multiplier: 2.0,
    };

    /// Retries of a sink write or a failing poll.
    pub const SINK: Backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(30),
        multiplier: 2.0,
    };

    /// The delay before retry number `attempt` (1-based), with ±20 % jitter so
    /// many connectors retrying at once do not move in lockstep.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let jitter = 0.8 + rand::random::<f64>() * 0.4;
        Duration::from_secs_f64(capped * jitter).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_attempts_when_delayed_should_grow_and_stay_capped() {
        let backoff = Backoff::SOURCE;
        let first = backoff.delay(1);
        assert!(
            first >= Duration::from_millis(80) && first <= Duration::from_millis(120),
            "{first:?}"
        );
        let third = backoff.delay(3);
        assert!(
            third >= Duration::from_millis(320) && third <= Duration::from_millis(480),
            "{third:?}"
        );
        assert!(backoff.delay(40) <= backoff.max);
    }
}

//! The engine's retry backoffs. The function itself is the connector kit's
//! [`Backoff`], shared with connectors that retry on their own.

use std::time::Duration;

pub use crate::connectors::kit::backoff::Backoff;

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

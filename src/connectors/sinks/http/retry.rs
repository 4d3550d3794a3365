//! When to retry a request and how long to wait first.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest `Retry-After` we honour; a server asking for more is waited on
/// this long, then asked again.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt of one request.
    pub max_retries: u32,
    pub retry_delay: Duration,
    pub multiplier: f64,
    pub max_retry_delay: Duration,
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based): `retry_delay` growing by
    /// `multiplier`, capped at `max_retry_delay`, with ±20 % jitter (never over
    /// the cap) so many sinks retrying at once do not move in lockstep.
    pub fn delay(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(30) as i32;
        let base = self.retry_delay.as_secs_f64() * self.multiplier.max(1.0).powi(exponent);
        let capped = base.min(self.max_retry_delay.as_secs_f64());
        let jitter = 0.8 + rand::random::<f64>() * 0.4;
        Duration::from_secs_f64(capped * jitter).min(self.max_retry_delay)
    }
}

/// Network trouble aside, these statuses say "try again later": timeouts,
/// throttling and server errors.
pub fn is_retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

/// The wait a response asks for in `Retry-After`: whole seconds or an HTTP date.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            retry_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_retry_delay: Duration::from_secs(5),
        }
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        headers
    }

    #[test]
    fn given_retries_when_delayed_should_grow_and_stay_capped() {
        let first = policy().delay(1);
        assert!(first >= Duration::from_millis(800) && first <= Duration::from_millis(1200));
        let third = policy().delay(3);
        assert!(third >= Duration::from_millis(3200) && third <= Duration::from_millis(4800));
        assert!(policy().delay(10) <= Duration::from_secs(5));
    }

    #[test]
    fn given_statuses_when_classified_should_retry_only_transient_ones() {
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert!(is_retryable_status(status), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 413, 422] {
            assert!(!is_retryable_status(status), "{status}");
        }
    }

    #[test]
    fn given_retry_after_in_seconds_or_date_when_parsed_should_give_the_wait() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(20));
        let wait = retry_after(&headers(&later), now).unwrap();
        assert!(
            wait > Duration::from_secs(18) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&headers("99999"), now), Some(MAX_RETRY_AFTER));
    }
}

//! What the influxdb source and sink share: how credentials become the
//! `Authorization` header, the health check at open, what an error answer
//! means, the engine's retry policy from upstream's retry fields, and the
//! circuit breaker with its degraded report.

#[cfg(feature = "influxdb-sink")]
pub mod sink;
#[cfg(feature = "influxdb-source")]
pub mod source;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::breaker::{CircuitBreaker, Transition};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Answer, Auth, HttpClient};
use crate::connectors::{ConnectorError, Degraded, RetrySettings};

/// Error answers are read up to this much (their messages fit well within).
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The engine's retry policy from upstream's fields: the first wait
/// `retry_delay`, doubling up to `retry_max_delay`; `max_retries` failed
/// writes in a row report the sink degraded.
pub fn retry_settings(
    retry_delay: Duration,
    retry_max_delay: Duration,
    max_retries: u32,
) -> RetrySettings {
    RetrySettings {
        backoff: Backoff {
            initial: retry_delay.min(retry_max_delay),
            max: retry_max_delay,
            multiplier: 2.0,
        },
        degraded_after: Some(max_retries),
    }
}

/// v1 (InfluxDB 1.x) takes basic auth, or `Token user:password` from 1.8 on
/// (it wins when set); v2 `Token ...`; v3 `Bearer ...`.
pub fn auth(
    v1: bool,
    bearer: bool,
    token: Option<&SecretString>,
    username: Option<&String>,
    password: Option<&SecretString>,
) -> Auth {
    let token_text = || token.map(|token| token.expose_secret()).unwrap_or("");
    match (v1, token, username) {
        (true, None, Some(username)) => Auth::Basic {
            username: username.clone(),
            password: password.cloned().unwrap_or_else(|| SecretString::from("")),
        },
        (true, None, None) => Auth::None,
        _ if bearer => Auth::Bearer(SecretString::from(token_text())),
        _ => Auth::Header {
            name: "Authorization".into(),
            value: SecretString::from(format!("Token {}", token_text())),
        },
    }
}

/// What an error answer of `target` means: credentials refused (naming
/// `credentials_field`) and a missing org, bucket or database (naming
/// `target_field`) stop the connector; otherwise 408, 429 and 5xx are
/// transient and the rest refuses the request.
pub fn failure(
    answer: &Answer,
    target: &str,
    credentials_field: &str,
    target_field: &str,
) -> Failure {
    let reason = answer.reason(target);
    match answer.status {
        401 | 403 => Failure::Fatal(format!(
            "{reason} (check plugin_config.{credentials_field})"
        )),
        404 => Failure::Fatal(format!(
            "{reason} (check plugin_config.{target_field}: it must exist)"
        )),
        _ => answer.failure(target),
    }
}

/// One `GET {base}/ping` (v1) or `/health`: no answer or a busy server is
/// transient (the engine opens the connector again), any other refusal
/// fatal.
pub async fn check_health(
    client: &HttpClient,
    base: &reqwest::Url,
    v1: bool,
) -> Result<(), ConnectorError> {
    let url = base
        .join(if v1 { "ping" } else { "health" })
        .map_err(|error| ConnectorError::fatal(error.to_string()))?;
    let request = client.empty(reqwest::Method::GET, url.clone());
    let answer = http::exchange(request, url.as_str(), MAX_ERROR_BYTES).await?;
    if answer.is_success() {
        return Ok(());
    }
    Err(match answer.failure(url.as_str()) {
        Failure::Refused(reason) => Failure::Fatal(format!(
            "health check failed: {reason} (check plugin_config.url and version)"
        )),
        failure => failure,
    }
    .into())
}

/// The circuit breaker, reporting the connector degraded while it is open.
pub struct Breaker {
    breaker: CircuitBreaker,
    threshold: u32,
    cool_down: Duration,
    pub degraded: Degraded,
    is_degraded: AtomicBool,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            breaker: CircuitBreaker::new(threshold, cool_down),
            threshold,
            cool_down,
            degraded: Degraded::default(),
            is_degraded: AtomicBool::new(false),
        }
    }

    /// `Err` with why, while the breaker keeps requests to `url` away.
    pub fn allow(&self, url: &str) -> Result<(), String> {
        if self.breaker.allow() {
            return Ok(());
        }
        Err(format!(
            "circuit breaker open: not calling {url} for up to {} after {} consecutive failures",
            humantime::format_duration(self.cool_down),
            self.threshold
        ))
    }

    pub fn success(&self, key: &str, url: &str) {
        if self.breaker.record_success() == Some(Transition::Closed) {
            info!(connector_key = %key, url, "circuit breaker closed: InfluxDB answers again");
        }
        if self.is_degraded.swap(false, Ordering::Relaxed) {
            self.degraded.clear();
        }
    }

    pub fn failure(&self, key: &str, url: &str, reason: &str) {
        if self.breaker.record_failure() == Some(Transition::Opened) {
            let message = format!(
                "circuit breaker open after {} consecutive failures (cool-down {}); last: {reason}",
                self.threshold,
                humantime::format_duration(self.cool_down)
            );
            warn!(connector_key = %key, url, "{message}");
            self.degraded.set(message);
            self.is_degraded.store(true, Ordering::Relaxed);
        }
    }
}

//! What the influxdb source and sink share: how credentials become the
//! `Authorization` header, the health check at open, the circuit breaker with
//! its degraded report, and how failures read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::breaker::{CircuitBreaker, Transition};
use crate::connectors::kit::http::{Auth, HttpClient, error_chain};
use crate::connectors::{ConnectorError, Degraded};

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

/// What a failed request reads as, naming the URL (without its query).
pub fn transport_error(url: &str, timeout: Duration, error: reqwest::Error) -> String {
    let error = error.without_url();
    if error.is_timeout() {
        format!(
            "request to {url} timed out after {}",
            humantime::format_duration(timeout)
        )
    } else {
        format!("request to {url} failed: {}", error_chain(&error))
    }
}

/// A non-success answer with the start of its body.
pub fn answer_reason(url: &str, status: u16, text: &str) -> String {
    let text: String = text.chars().take(300).collect();
    let text = text.trim();
    if text.is_empty() {
        format!("{url} answered {status}")
    } else {
        format!("{url} answered {status}: {text}")
    }
}

/// `GET {base}/ping` (v1) or `/health` until it answers 2xx, at most
/// `1 + max_retries` times.
pub async fn check_health(
    client: &HttpClient,
    base: &reqwest::Url,
    v1: bool,
    backoff: Backoff,
    max_retries: u32,
    timeout: Duration,
    key: &str,
) -> Result<(), ConnectorError> {
    let url = base
        .join(if v1 { "ping" } else { "health" })
        .map_err(|error| ConnectorError::fatal(error.to_string()))?;
    let mut attempt = 0;
    loop {
        let problem = match client.empty(reqwest::Method::GET, url.clone()).send().await {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => format!("{url} answered {}", response.status().as_u16()),
            Err(error) => transport_error(url.as_str(), timeout, error),
        };
        attempt += 1;
        if attempt > max_retries {
            return Err(ConnectorError::transient(format!(
                "health check failed {attempt} times: {problem}"
            )));
        }
        let delay = backoff.delay(attempt);
        warn!(connector_key = %key, retry = attempt, retry_in_ms = delay.as_millis() as u64, error = %problem, "InfluxDB health check failed, retrying");
        tokio::time::sleep(delay).await;
    }
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

//! The pipelines and their lifecycle. The engine knows no connector by name: it
//! drives `Source`/`Sink` trait objects over the `Bus` and enforces the delivery
//! contract whose numbered rules (S1-S8 for sources, K1-K6 for sinks, O1-O2
//! for opening) are in docs/ARCHITECTURE.md; the engine tests name the rule
//! each one proves (`tests/retries.rs`: O1, O2, K3's partial writes and
//! `Retry-After`).
//!
//! Connectors classify, the engine acts: it retries `open` while a backend
//! is down, reopens a connector whose connection is gone, writes again only
//! what a sink's answer left not durable, and waits what a backend asked for.

pub mod backoff;
pub mod dead_letter;
mod deferral;
pub mod lag;
pub mod metrics;
pub mod offsets;
pub mod retry;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod status;
pub mod tap;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

pub use runtime::Runtime;
pub use status::{Status, StatusSnapshot, StopReason};

/// Tracing target of upstream's per-batch `benchmark` events (connectors with
/// `benchmark = true`); `RUST_LOG=iggy_connectors::benchmark=info` shows them.
pub const BENCHMARK_TARGET: &str = "iggy_connectors::benchmark";

/// How a pipeline is told to stop, and how long it may take to finish the batch
/// in flight once told.
#[derive(Debug, Clone)]
pub struct Shutdown {
    token: CancellationToken,
    grace: Duration,
}

impl Shutdown {
    pub fn new(token: CancellationToken, grace: Duration) -> Self {
        Self { token, grace }
    }

    /// A shutdown that is requested with this one, and can also be requested on
    /// its own without affecting this one.
    pub fn child(&self) -> Self {
        Self {
            token: self.token.child_token(),
            grace: self.grace,
        }
    }

    pub fn request(&self) {
        self.token.cancel();
    }

    pub fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when a stop is requested.
    pub async fn requested(&self) {
        self.token.cancelled().await;
    }

    /// Sleeps for `delay` unless a stop is requested first. Returns whether to
    /// go on.
    pub async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.requested() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// Completes when the in-flight batch's time is up: `grace` after the stop
    /// was requested.
    pub async fn grace_expired(&self) {
        self.token.cancelled().await;
        tokio::time::sleep(self.grace).await;
    }
}

/// How long a connector's `close` may take before it is left behind.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// A connector's `close`, a panic caught as in [`catch_panic`], for at most
/// [`CLOSE_WAIT`]: a close waiting for a backend that does not answer would
/// hold a stop, or a reopen, for ever. `None` when it did not end in time;
/// the connector is then dropped unclosed, which loses nothing: what the
/// engine committed was acknowledged, the rest is read or written again.
pub async fn close_within<F: Future>(key: &str, close: F) -> Option<Result<F::Output, String>> {
    let closed = tokio::time::timeout(CLOSE_WAIT, catch_panic(close))
        .await
        .ok();
    if closed.is_none() {
        tracing::warn!(connector_key = %key, "the connector did not close within {CLOSE_WAIT:?}; left behind unclosed");
    }
    closed
}

/// Runs a connector call, turning a panic inside it into an error message so a
/// misbehaving connector stops alone instead of taking the process down.
pub async fn catch_panic<F: Future>(future: F) -> Result<F::Output, String> {
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|payload| panic_message(payload.as_ref()))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        format!("connector panicked: {text}")
    } else if let Some(text) = payload.downcast_ref::<String>() {
        format!("connector panicked: {text}")
    } else {
        "connector panicked".to_owned()
    }
}

#[cfg(test)]
mod tests;

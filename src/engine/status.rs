//! Connector status as operators see it, and why a connector stopped.

use std::fmt;
use std::sync::Mutex;

use serde::Serialize;

use crate::clock::now_micros;
use crate::connectors::ConnectorKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// A source another instance runs: this one waits for its lease (ours:
    /// `[state] type = "postgres"`).
    Standby,
    Starting,
    Running,
    Stopping,
    Stopped,
    Error,
}

/// Why a connector stopped without being asked to. Stable names: they appear in
/// the API, in `/health` and as metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A source's batch was NACKed `max_consecutive_nacks` times in a row.
    NackLimit,
    /// The connector reported an error it cannot recover from.
    Fatal,
    /// The connector panicked; only that connector stopped.
    Panic,
    /// A sink with `on_error = "stop"` met a message its backend refuses.
    Rejected,
    /// The connector could not start (bad config, corrupt state, `open` failed).
    StartFailed,
    /// A finite source produced everything it will ever produce.
    Completed,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::NackLimit => "nack_limit",
            StopReason::Fatal => "fatal",
            StopReason::Panic => "panic",
            StopReason::Rejected => "rejected",
            StopReason::StartFailed => "start_failed",
            StopReason::Completed => "completed",
        }
    }

    /// Whether this stop is a failure an operator must hear about.
    pub fn is_failure(self) -> bool {
        self != StopReason::Completed
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastError {
    pub message: String,
    /// Microseconds since the epoch.
    pub timestamp: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusSnapshot {
    pub status: Status,
    pub stop_reason: Option<StopReason>,
    pub last_error: Option<LastError>,
    /// When the connector entered its current status, microseconds since the epoch.
    pub since: u64,
    /// Failed attempts to open the connector since it last started (or lost
    /// its connection); 0 once it runs.
    pub open_attempts: u32,
}

/// The live status of one connector, shared by its pipeline and the API.
///
/// Transitions keep the `*_running` gauge exact: it moves up when the status
/// becomes `running` and down when it leaves `running`, once each.
#[derive(Debug)]
pub struct StatusCell {
    kind: ConnectorKind,
    inner: Mutex<StatusSnapshot>,
}

impl StatusCell {
    pub fn new(kind: ConnectorKind) -> Self {
        Self {
            kind,
            inner: Mutex::new(StatusSnapshot {
                status: Status::Stopped,
                stop_reason: None,
                last_error: None,
                since: now_micros(),
                open_attempts: 0,
            }),
        }
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        self.lock().clone()
    }

    pub fn status(&self) -> Status {
        self.lock().status
    }

    pub fn set_starting(&self) {
        self.transition(Status::Starting, None, true);
    }

    /// Waiting for the lease another instance holds.
    pub fn set_standby(&self) {
        self.transition(Status::Standby, None, false);
    }

    pub fn set_running(&self) {
        self.transition(Status::Running, None, false);
    }

    pub fn set_stopping(&self) {
        self.transition(Status::Stopping, None, false);
    }

    /// A stop the user asked for (or a normal shutdown).
    pub fn set_stopped(&self) {
        self.transition(Status::Stopped, None, false);
    }

    /// The connector stopped on its own. Failures become `error` with the reason
    /// and message; a completion becomes `stopped` with its reason.
    pub fn set_stopped_by(&self, reason: StopReason, message: impl Into<String>) {
        let status = if reason.is_failure() {
            Status::Error
        } else {
            Status::Stopped
        };
        let message = message.into();
        let mut inner = self.lock();
        if reason.is_failure() {
            inner.last_error = Some(LastError {
                message,
                timestamp: now_micros(),
            });
        }
        self.apply(&mut inner, status, Some(reason));
    }

    /// An attempt to open the connector failed and is retried: the status
    /// stays (or becomes) `starting`, with the error and the count.
    pub fn record_open_failure(&self, attempts: u32, message: impl Into<String>) {
        let mut inner = self.lock();
        inner.last_error = Some(LastError {
            message: message.into(),
            timestamp: now_micros(),
        });
        inner.open_attempts = attempts;
        self.apply(&mut inner, Status::Starting, None);
    }

    /// Records an error the connector keeps running through (a retried send, a
    /// transient write failure).
    pub fn record_error(&self, message: impl Into<String>) {
        self.lock().last_error = Some(LastError {
            message: message.into(),
            timestamp: now_micros(),
        });
    }

    fn transition(&self, status: Status, reason: Option<StopReason>, clear_error: bool) {
        let mut inner = self.lock();
        if clear_error {
            inner.last_error = None;
            inner.open_attempts = 0;
        }
        self.apply(&mut inner, status, reason);
    }

    fn apply(&self, inner: &mut StatusSnapshot, status: Status, reason: Option<StopReason>) {
        let was_running = inner.status == Status::Running;
        let is_running = status == Status::Running;
        if was_running != is_running {
            let gauge = match self.kind {
                ConnectorKind::Source => metrics::gauge!("iggy_connectors_sources_running"),
                ConnectorKind::Sink => metrics::gauge!("iggy_connectors_sinks_running"),
            };
            if is_running {
                gauge.increment(1.0);
            } else {
                gauge.decrement(1.0);
            }
        }
        if inner.status != status {
            inner.since = now_micros();
        }
        if status != Status::Starting {
            inner.open_attempts = 0;
        }
        inner.status = status;
        inner.stop_reason = reason;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusSnapshot> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_failure_stop_when_recorded_should_be_error_with_reason_and_message() {
        let cell = StatusCell::new(ConnectorKind::Source);
        cell.set_running();
        cell.set_stopped_by(StopReason::NackLimit, "5 NACKs");
        let snapshot = cell.snapshot();
        assert_eq!(snapshot.status, Status::Error);
        assert_eq!(snapshot.stop_reason, Some(StopReason::NackLimit));
        assert_eq!(snapshot.last_error.unwrap().message, "5 NACKs");
    }

    #[test]
    fn given_completion_when_recorded_should_be_stopped_not_error() {
        let cell = StatusCell::new(ConnectorKind::Source);
        cell.set_running();
        cell.set_stopped_by(StopReason::Completed, "done");
        let snapshot = cell.snapshot();
        assert_eq!(snapshot.status, Status::Stopped);
        assert_eq!(snapshot.stop_reason, Some(StopReason::Completed));
        assert!(snapshot.last_error.is_none());
    }

    #[test]
    fn given_failed_opens_when_recorded_should_be_starting_with_the_count_until_running() {
        let cell = StatusCell::new(ConnectorKind::Sink);
        cell.set_starting();
        cell.record_open_failure(1, "open failed: refused");
        cell.record_open_failure(2, "open failed: refused again");
        let snapshot = cell.snapshot();
        assert_eq!(snapshot.status, Status::Starting);
        assert_eq!(snapshot.open_attempts, 2);
        assert_eq!(
            snapshot.last_error.unwrap().message,
            "open failed: refused again"
        );
        cell.set_running();
        assert_eq!(cell.snapshot().open_attempts, 0);
    }

    #[test]
    fn given_restart_when_starting_should_clear_reason_and_error() {
        let cell = StatusCell::new(ConnectorKind::Sink);
        cell.set_stopped_by(StopReason::Panic, "boom");
        cell.set_starting();
        let snapshot = cell.snapshot();
        assert_eq!(snapshot.status, Status::Starting);
        assert_eq!(snapshot.stop_reason, None);
        assert!(snapshot.last_error.is_none());
    }
}

//! `GET /stats`: upstream's runtime fields (version, pid, CPU, memory, uptime,
//! counts) and per-connector counters and status.

use std::sync::{Arc, Mutex, OnceLock};

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use sysinfo::{Pid, ProcessesToUpdate, System};

use crate::api::ApiState;
use crate::clock::now_micros;
use crate::connectors::ConnectorKind;
use crate::engine::Status;
use crate::engine::metrics::LocalHistogram;
use crate::engine::runtime::ConnectorView;

const VERSION: &str = env!("CARGO_PKG_VERSION");

static SYSTEM: OnceLock<Option<Mutex<System>>> = OnceLock::new();

#[derive(Debug, Default)]
struct Probe {
    cpu_usage: f32,
    total_cpu_usage: f32,
    memory_usage: u64,
    total_memory: u64,
    available_memory: u64,
}

pub async fn stats(State(state): State<Arc<ApiState>>) -> Json<Value> {
    let views = state.runtime.views();
    Json(body(&state, &views).await)
}

/// The `/stats` answer for these views (`/events` sends it too).
pub(super) async fn body(state: &ApiState, views: &[ConnectorView]) -> Value {
    // sysinfo reads /proc synchronously.
    let probe = tokio::task::spawn_blocking(probe).await.unwrap_or_default();
    let count = |kind: ConnectorKind, running: bool| {
        views
            .iter()
            .filter(|view| view.config.kind == kind)
            .filter(|view| !running || view.status.status == Status::Running)
            .count()
    };
    let now = now_micros();
    json!({
        "connectors_runtime_version": VERSION,
        "connectors_runtime_version_semver": numeric_version(VERSION),
        "process_id": std::process::id(),
        "cpu_usage": probe.cpu_usage,
        "total_cpu_usage": probe.total_cpu_usage,
        "memory_usage": probe.memory_usage,
        "total_memory": probe.total_memory,
        "available_memory": probe.available_memory,
        "run_time": now.saturating_sub(state.started_at),
        "start_time": state.started_at,
        "sources_total": count(ConnectorKind::Source, false),
        "sources_running": count(ConnectorKind::Source, true),
        "sinks_total": count(ConnectorKind::Sink, false),
        "sinks_running": count(ConnectorKind::Sink, true),
        "connectors": views.iter().map(connector).collect::<Vec<_>>(),
    })
}

fn connector(view: &ConnectorView) -> Value {
    let config = &view.config;
    let metrics = &view.metrics;
    let source = config.kind == ConnectorKind::Source;
    let only = |wanted: bool, value: u64| wanted.then_some(value);
    json!({
        "key": config.key,
        "name": config.name,
        "connector_type": config.kind,
        // Connectors are compiled in: their version is the binary's.
        "version": VERSION,
        "version_semver": numeric_version(VERSION),
        "status": view.status.status,
        "enabled": config.enabled,
        "errors": metrics.errors.get(),
        "messages_produced": only(source, metrics.produced.get()),
        "messages_sent": only(source, metrics.sent.get()),
        "messages_consumed": only(!source, metrics.consumed.get()),
        "messages_processed": only(!source, metrics.processed.get()),
        "messages_filtered": metrics.filtered.get(),
        "connector": config.connector,
        "config_version": config.version,
        "stop_reason": view.status.stop_reason,
        "nacks": metrics.nacks.get(),
        "retries": metrics.retries.get(),
        "messages_dead_lettered": metrics.dead_lettered.get(),
        "messages_skipped": metrics.skipped.get(),
        "bytes": metrics.bytes.get(),
        "batch_durations": batch_durations(&metrics.batch_durations),
    })
}

/// Batches per duration bucket since start: `bounds_us[i]` is bucket `i`'s
/// upper bound (null for the last, open one). Clients diff two answers for a
/// recent percentile.
fn batch_durations(histogram: &LocalHistogram) -> Value {
    let bounds: Vec<Option<u64>> = (0..LocalHistogram::BUCKETS)
        .map(LocalHistogram::bound_micros)
        .collect();
    json!({"bounds_us": bounds, "counts": histogram.counts()})
}

/// Upstream's numeric version: major, then minor and patch on three digits
/// each (0.3.0 is 3000).
fn numeric_version(version: &str) -> Option<u64> {
    let core = version.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(str::parse::<u64>);
    let (major, minor, patch) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    Some(major * 1_000_000 + minor * 1_000 + patch)
}

/// CPU and memory of this process; the memory total and availability are the
/// cgroup's when the process runs under a memory limit (a container), since
/// the host's figures are memory it can never use.
fn probe() -> Probe {
    let Some(system) = SYSTEM.get_or_init(|| System::new().ok().map(Mutex::new)) else {
        return Probe::default();
    };
    let mut system = system
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let pid = Pid::from_u32(std::process::id());
    system.refresh_cpu_usage();
    system.refresh_memory();
    system.refresh_processes(ProcessesToUpdate::Some(&[pid]), true);
    let mut probe = Probe {
        total_cpu_usage: system.global_cpu_usage(),
        total_memory: system.total_memory(),
        available_memory: system.available_memory(),
        ..Probe::default()
    };
    if let Some(process) = system.process(pid) {
        probe.cpu_usage = process.cpu_usage();
        probe.memory_usage = process.memory();
    }
    if let Some(limits) = system.cgroup_limits() {
        probe.total_memory = limits.total_memory.min(probe.total_memory);
        probe.available_memory = limits.free_memory.min(probe.available_memory);
    }
    probe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_versions_when_made_numeric_should_follow_upstream() {
        assert_eq!(numeric_version("0.3.0"), Some(3000));
        assert_eq!(numeric_version("1.2.3"), Some(1_002_003));
        assert_eq!(numeric_version("0.5.0-edge.4"), Some(5000));
        assert_eq!(numeric_version("x"), None);
    }
}

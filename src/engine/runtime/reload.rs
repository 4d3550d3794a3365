//! Reloading the connector directory while running (`run --watch`, SIGHUP):
//! each connector whose active config changed restarts alone, resuming from
//! its committed state; a new one starts, a removed one stops. A file that
//! does not load leaves the running version in place, and the connector it
//! belongs to shows the refusal as its degraded reason until a reload
//! accepts its file again.

use std::sync::Arc;

use serde::Serialize;
use tracing::{debug, error, info};

use super::Runtime;
use crate::config::{ConfigIssue, ConnectorConfig};
use crate::connectors::ConnectorKind;

/// What a reload did, by `kind key`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    pub started: Vec<String>,
    pub restarted: Vec<String>,
    pub stopped: Vec<String>,
    /// Connectors kept at their running version: `kind key: file: field: why`.
    pub refused: Vec<String>,
    /// Errors in files no connector runs from.
    pub errors: Vec<String>,
}

impl ReloadReport {
    pub fn changed(&self) -> bool {
        !(self.started.is_empty() && self.restarted.is_empty() && self.stopped.is_empty())
    }
}

impl Runtime {
    /// Applies a fresh load of the connector directory (`configs` and the
    /// `issues` found reading it).
    pub async fn reload(
        self: &Arc<Self>,
        configs: Vec<ConnectorConfig>,
        issues: &[ConfigIssue],
    ) -> ReloadReport {
        let mut report = ReloadReport::default();
        let errors: Vec<&ConfigIssue> = issues.iter().filter(|issue| issue.is_error()).collect();
        let mut seen = Vec::new();
        for config in configs {
            seen.push((config.kind, config.key.clone()));
            self.reload_one(config, &errors, &mut report).await;
        }
        self.reload_missing(&seen, &errors, &mut report).await;
        let claimed: Vec<String> = report.refused.clone();
        report.errors = errors
            .iter()
            .map(|issue| issue.to_string())
            .filter(|text| {
                !claimed
                    .iter()
                    .any(|refused| refused.ends_with(text.as_str()))
            })
            .collect();
        log_reload(&report);
        report
    }

    /// A connector whose file loaded: added and started if new, left alone
    /// if unchanged or if its file no longer loads, restarted (or stopped,
    /// when disabled) with the new config otherwise.
    async fn reload_one(
        self: &Arc<Self>,
        config: ConnectorConfig,
        errors: &[&ConfigIssue],
        report: &mut ReloadReport,
    ) {
        let (kind, key) = (config.kind, config.key.clone());
        let lock = self.lifecycle_lock(kind, &key);
        let _serialized = lock.lock().await;
        let Ok(slot) = self.slot(kind, &key) else {
            let enabled = config.enabled;
            if self.add(config).is_ok() && enabled && self.start(kind, &key).await.is_ok() {
                report.started.push(name(kind, &key));
            }
            return;
        };
        let file = slot.config().file.clone();
        if let Some(issue) = errors
            .iter()
            .find(|issue| Some(&issue.file) == file.as_ref())
        {
            // Its running file no longer loads: keep what runs.
            report
                .refused
                .push(format!("{}: {issue}", name(kind, &key)));
            slot.set_reload_refusal(Some(format!("config reload refused: {issue}")));
            return;
        }
        slot.set_reload_refusal(None);
        if *slot.config() == config {
            return;
        }
        let enabled = config.enabled;
        let _ = self.replace_config(config);
        self.stop_slot(&slot).await;
        if enabled {
            self.start_slot(&slot).await;
            report.restarted.push(name(kind, &key));
        } else {
            report.stopped.push(name(kind, &key));
        }
    }

    /// Connectors the load did not name: stopped when their file is gone,
    /// kept (and the refusal shown) when it is there but does not load.
    async fn reload_missing(
        &self,
        seen: &[(ConnectorKind, String)],
        errors: &[&ConfigIssue],
        report: &mut ReloadReport,
    ) {
        let slots = self.lock_slots().clone();
        for slot in slots {
            if seen.contains(&(slot.kind, slot.key.clone())) {
                continue;
            }
            let lock = self.lifecycle_lock(slot.kind, &slot.key);
            let _serialized = lock.lock().await;
            let config = slot.config();
            let file_gone = config.file.as_ref().is_none_or(|file| !file.exists());
            let issue = errors
                .iter()
                .find(|issue| Some(&issue.file) == config.file.as_ref());
            match (file_gone, issue) {
                (false, Some(issue)) => {
                    report
                        .refused
                        .push(format!("{}: {issue}", name(slot.kind, &slot.key)));
                    slot.set_reload_refusal(Some(format!("config reload refused: {issue}")));
                }
                (false, None) => {}
                (true, _) => {
                    slot.set_reload_refusal(None);
                    if slot.is_running().await {
                        self.stop_slot(&slot).await;
                        report.stopped.push(name(slot.kind, &slot.key));
                    }
                }
            }
        }
    }
}

fn name(kind: ConnectorKind, key: &str) -> String {
    format!("{kind} {key}")
}

fn log_reload(report: &ReloadReport) {
    for refused in &report.refused {
        error!("config reload: {refused}; the running version stays");
    }
    for issue in &report.errors {
        error!("config reload: {issue}");
    }
    if report.changed() {
        info!(
            started = ?report.started,
            restarted = ?report.restarted,
            stopped = ?report.stopped,
            "connector configs reloaded"
        );
    } else {
        debug!("connector configs reloaded: nothing changed");
    }
}

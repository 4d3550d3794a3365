//! Sources under a lease, when the state store is shared by several
//! instances (`[state] type = "postgres"`): a source runs on the instance that
//! holds its lease; the others wait in standby and take over once it expires.
//!
//! The holder renews the lease every third of its duration. If it cannot (the
//! database is down, or another instance took the lease), it stops the source
//! before the lease runs out on its own clock: the time a renewal was sent
//! plus the duration is never later than the expiry the database computed, so
//! the source has stopped here before any other instance may start it. What
//! it had in flight is not committed (its state save is refused anyway:
//! fencing), so the instance that takes over repeats at most that.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::Runtime;
use super::slot::Slot;
use crate::engine::Shutdown;
use crate::state::{Acquired, Leases};

/// How often a standby asks for a lease at most.
const STANDBY_POLL: Duration = Duration::from_secs(1);

impl Runtime {
    /// Runs a source whenever this instance holds its lease, until a stop is
    /// requested or the source stops on its own.
    pub(super) async fn run_leased(&self, slot: &Slot, shutdown: Shutdown, leases: &dyn Leases) {
        loop {
            let Some(valid_until) = wait_for_lease(slot, &shutdown, leases).await else {
                slot.status.set_stopped();
                return;
            };
            info!(connector_key = %slot.key, "lease taken; starting the source here");
            slot.status.set_starting();
            let mut lost = tokio::select! {
                () = self.run_once(slot, &shutdown) => None,
                reason = keep_lease(leases, &slot.key, valid_until) => Some(reason),
            };
            // A pipeline that ended on its own because its saves were fenced
            // (the lease went before the renewal noticed) goes back to
            // standby rather than stopping for good.
            if lost.is_none()
                && !shutdown.is_requested()
                && !matches!(leases.renew(&slot.key).await, Ok(true))
            {
                lost = Some("its lease expired or another instance took it".to_owned());
            }
            if let Err(error) = leases.release(&slot.key).await {
                warn!(connector_key = %slot.key, %error, "cannot release the lease; it expires on its own");
            }
            let Some(reason) = lost else {
                return;
            };
            error!(connector_key = %slot.key, %reason, "source stopped here: it no longer holds its lease");
            metrics::counter!("iggy_connector_leases_lost_total", "connector_key" => slot.key.clone())
                .increment(1);
            slot.status
                .record_error(format!("source stopped: {reason}"));
            if shutdown.is_requested() {
                slot.status.set_stopped();
                return;
            }
        }
    }
}

/// Waits in standby until the lease is taken; `None` when a stop comes first.
/// Returns until when the lease is surely ours without renewal.
async fn wait_for_lease(slot: &Slot, shutdown: &Shutdown, leases: &dyn Leases) -> Option<Instant> {
    let duration = leases.duration();
    let mut shown_holder = None;
    loop {
        let sent = Instant::now();
        let wait = match leases.acquire(&slot.key).await {
            Ok(Acquired::Taken) => return Some(sent + duration),
            Ok(Acquired::HeldBy { holder, expires_in }) => {
                if slot.status.status() != crate::engine::status::Status::Standby {
                    slot.status.set_standby();
                }
                if shown_holder.as_ref() != Some(&holder) {
                    info!(connector_key = %slot.key, %holder, expires_in_ms = expires_in.as_millis() as u64, "standby: another instance holds the lease of this source");
                    shown_holder = Some(holder);
                }
                // Asked again soon: a holder that stops releases its lease.
                (expires_in + Duration::from_millis(50))
                    .min(duration / 3)
                    .min(STANDBY_POLL)
            }
            Err(error) => {
                if slot.status.status() != crate::engine::status::Status::Standby {
                    slot.status.set_standby();
                }
                warn!(connector_key = %slot.key, %error, "cannot take the lease of this source; retrying");
                slot.status
                    .record_error(format!("cannot take the lease: {error}"));
                duration / 3
            }
        };
        if !shutdown.pause(wait.max(Duration::from_millis(100))).await {
            return None;
        }
    }
}

/// Renews the lease of `key` until it cannot; returns why. Never returns
/// later than `valid_until` (moved on by each renewal) less a margin.
async fn keep_lease(leases: &dyn Leases, key: &str, mut valid_until: Instant) -> String {
    let duration = leases.duration();
    let margin = duration / 10;
    let mut wait = duration / 3;
    let mut last_error = String::new();
    loop {
        let deadline = valid_until - margin;
        tokio::time::sleep_until((Instant::now() + wait).min(deadline)).await;
        if Instant::now() >= deadline {
            return format!("its lease could not be renewed before it ran out ({last_error})");
        }
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, leases.renew(key)).await {
            Ok(Ok(true)) => {
                valid_until = sent + duration;
                wait = duration / 3;
            }
            Ok(Ok(false)) => {
                return "its lease expired or another instance took it".to_owned();
            }
            Ok(Err(error)) => {
                warn!(connector_key = %key, %error, "cannot renew the lease; retrying until it runs out");
                last_error = error.to_string();
                wait = duration / 10;
            }
            Err(_) => {
                return "renewing its lease did not answer before the lease ran out".to_owned();
            }
        }
    }
}

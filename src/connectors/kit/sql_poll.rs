//! The polling core the SQL sources (postgres, mysql) share: the cursor state
//! they persist, the batches staged until their commit, the caught-up and
//! finish logic (a caught-up poll asks the engine to wait `poll_interval`
//! before the next one), and the config pieces that mean the same in both. What
//! differs (the driver, the SQL, the row conversion) stays in each source.
//!
//! At-least-once: `poll` stages a batch with the state it leads to and what
//! its commit applies (DELETE/UPDATE of the delivered rows); only `commit`
//! moves the committed cursor, oldest batch first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::connectors::{
    ConnectorError, PluginConfigError, SourceBatch, SourceRecord, decode_state, encode_state,
};

/// What a SQL source persists after each batch: per table, the cursor of the
/// last delivered row (upstream's postgres field names; the mysql source uses
/// the same layout). Bounded by the number of configured tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollState {
    /// Table -> tracking value of the last delivered row (upstream's field name).
    pub tracking_offsets: BTreeMap<String, String>,
    /// Table -> key of that row, when ties are broken by a key column.
    #[serde(default)]
    pub tracking_keys: BTreeMap<String, String>,
    #[serde(default)]
    pub processed_rows: u64,
}

impl PollState {
    /// Drops cursors of tables no longer configured, so the state stays bounded.
    fn retain_tables(&mut self, tables: &[String]) {
        self.tracking_offsets
            .retain(|table, _| tables.contains(table));
        self.tracking_keys.retain(|table, _| tables.contains(table));
    }

    /// Moves `table`'s cursor to its last row read, if any: its tracking value
    /// and, when ties are broken by a key column, its key.
    pub fn advance(&mut self, table: &str, last: Option<(String, Option<String>)>) {
        if let Some((tracking, key)) = last {
            self.tracking_offsets.insert(table.to_owned(), tracking);
            match key {
                Some(key) => self.tracking_keys.insert(table.to_owned(), key),
                None => self.tracking_keys.remove(table),
            };
        }
    }
}

/// What the source does with rows once their batch is durable in Iggy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consume {
    /// Leave rows alone; a saved cursor says where to continue.
    Cursor,
    /// DELETE delivered rows.
    Delete,
    /// UPDATE delivered rows setting this boolean column to TRUE (and read only
    /// rows where it is not).
    Mark(String),
}

impl Consume {
    /// From the config's `processed_column` and `delete_after_read`.
    pub fn of(processed_column: Option<&String>, delete_after_read: bool) -> Self {
        match (processed_column, delete_after_read) {
            (_, true) => Self::Delete,
            (Some(column), false) => Self::Mark(column.clone()),
            (None, false) => Self::Cursor,
        }
    }

    /// Deleting or marking consumed rows leaves their only copy in Iggy.
    pub fn destructive(&self) -> bool {
        !matches!(self, Self::Cursor)
    }

    /// Several batches in flight in cursor mode. Delete and mark mode keep
    /// one for now: with several, the destructive-mode tests saw rows
    /// delivered twice after refused sends (never lost); the staging already
    /// reads past batches in flight for when that is understood.
    pub fn max_in_flight(&self) -> usize {
        match self {
            Self::Cursor => crate::config::connector::MAX_IN_FLIGHT as usize,
            Self::Delete | Self::Mark(_) => 1,
        }
    }
}

/// The config fields both SQL sources check the same way.
pub struct PollingChecks<'a> {
    pub batch_size: u32,
    pub max_connections: u32,
    pub delete_after_read: bool,
    pub processed_column: Option<&'a String>,
    pub custom_query: Option<&'a String>,
    pub initial_offset: Option<&'a String>,
}

impl PollingChecks<'_> {
    /// Checks what serde cannot: values that parse but make no sense together.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.max_connections == 0 {
            return Err(PluginConfigError::new(
                "max_connections",
                "expected at least 1",
            ));
        }
        if self.delete_after_read && self.processed_column.is_some() {
            return Err(PluginConfigError::new(
                "delete_after_read",
                "set either delete_after_read or processed_column, not both",
            ));
        }
        if let Some(query) = self.custom_query {
            if query.trim().is_empty() {
                return Err(PluginConfigError::new(
                    "custom_query",
                    "expected a SELECT statement",
                ));
            }
            if query.contains("$offset") && self.initial_offset.is_none() {
                return Err(PluginConfigError::new(
                    "initial_offset",
                    "custom_query uses $offset, so initial_offset must say where a fresh start begins",
                ));
            }
        }
        Ok(())
    }
}

pub fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

pub fn default_batch_size() -> u32 {
    1000
}

pub fn default_tracking_column() -> String {
    "id".to_owned()
}

/// `initial_offset` is a string, but TOML users naturally write
/// `initial_offset = 1000`; accept numbers and booleans too.
pub fn scalar_as_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(text)),
        Some(serde_json::Value::Number(number)) => Ok(Some(number.to_string())),
        Some(serde_json::Value::Bool(flag)) => Ok(Some(flag.to_string())),
        Some(other) => Err(serde::de::Error::custom(format!(
            "expected a string or a number, found {other}"
        ))),
    }
}

/// The most rows a polling source's lag probe counts per table: past it,
/// counting would cost more than the figure is worth.
pub const PENDING_CAP: u64 = 1_000_000;

/// The config fields the core's poll reads.
#[derive(Debug, Clone, Copy)]
pub struct PollSettings {
    pub poll_interval: Duration,
    pub stop_when_caught_up: bool,
    pub verbose_logging: bool,
}

/// The staged batches and the committed cursor of one polling SQL source;
/// `C` is what one table's commit applies (driver-specific).
pub struct PollCore<C> {
    /// Names the source in logs (`postgres`, `mysql`).
    name: &'static str,
    settings: PollSettings,
    /// The state of the last committed batch: where the next poll starts.
    committed: Mutex<PollState>,
    /// What each batch in flight applies on commit, oldest first.
    staged: Mutex<VecDeque<Staged<C>>>,
}

#[derive(Debug)]
struct Staged<C> {
    state: PollState,
    /// Per table: what the commit applies to the delivered rows.
    consume: Arc<Vec<C>>,
}

impl<C> PollCore<C> {
    pub fn new(name: &'static str, settings: PollSettings) -> Self {
        Self {
            name,
            settings,
            committed: Mutex::new(PollState::default()),
            staged: Mutex::new(VecDeque::new()),
        }
    }

    pub fn lock_committed(&self) -> MutexGuard<'_, PollState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<Staged<C>>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Loads a saved state at `open`, dropping tables no longer configured.
    pub fn restore(&self, bytes: &[u8], tables: &[String]) -> Result<(), ConnectorError> {
        let mut restored: PollState = decode_state(bytes)?;
        restored.retain_tables(tables);
        info!(tracking_offsets = ?restored.tracking_offsets, processed_rows = restored.processed_rows, "{} source restored its cursor", self.name);
        *self.lock_committed() = restored;
        Ok(())
    }

    /// Where the next poll starts: after the newest batch in flight, or after
    /// the last committed one. `true` when batches are in flight.
    pub fn poll_base(&self) -> (PollState, bool) {
        let staged = self.lock_staged();
        match staged.back() {
            Some(newest) => (newest.state.clone(), true),
            None => (self.lock_committed().clone(), false),
        }
    }

    /// Stages a poll's batch and answers it: `next` is the state after its
    /// `records`, `consume` what its commit applies, `full` whether some table
    /// filled a whole batch (so the next poll follows at once; otherwise every
    /// table is caught up and the engine polls again `poll_interval` after
    /// `started`, the poll's start, unless the source finishes then).
    pub fn finish_poll(
        &self,
        mut next: PollState,
        records: Vec<SourceRecord>,
        consume: Vec<C>,
        full: bool,
        tables: &[String],
        started: Instant,
    ) -> Result<SourceBatch, ConnectorError> {
        let next_poll = (!full && !self.settings.stop_when_caught_up)
            .then(|| started + self.settings.poll_interval);
        if records.is_empty() {
            // Staged too: each poll's batch is committed, in order, by one
            // `commit`, so an empty one must not take a later batch's turn.
            self.lock_staged().push_back(Staged {
                state: next,
                consume: Arc::new(Vec::new()),
            });
            // Every table is caught up past the batches in flight; the engine
            // ends the source once those (and this empty one) are committed,
            // and a NACK meanwhile is retried with the same batches.
            if self.settings.stop_when_caught_up {
                info!(tables = ?tables, "{} source caught up with every table; finishing", self.name);
            }
            return Ok(SourceBatch {
                finished: self.settings.stop_when_caught_up,
                next_poll,
                ..SourceBatch::default()
            });
        }
        next.processed_rows += records.len() as u64;
        let state = encode_state(&next)?;
        if self.settings.verbose_logging {
            info!(
                records = records.len(),
                "{} source polled a batch", self.name
            );
        } else {
            debug!(
                records = records.len(),
                "{} source polled a batch", self.name
            );
        }
        self.lock_staged().push_back(Staged {
            state: next,
            consume: Arc::new(consume),
        });
        Ok(SourceBatch {
            records,
            state: Some(state),
            finished: false,
            next_poll,
        })
    }

    /// What the oldest batch in flight applies on commit. The batch stays
    /// staged while it is applied, so a poll meanwhile still reads past its
    /// rows; a failure leaves it for the retry.
    pub fn oldest_consume(&self) -> Option<Arc<Vec<C>>> {
        self.lock_staged()
            .front()
            .map(|oldest| oldest.consume.clone())
    }

    /// The oldest batch is applied: its state becomes the committed one.
    pub fn committed_oldest(&self) {
        let mut staged = self.lock_staged();
        if let Some(oldest) = staged.pop_front() {
            *self.lock_committed() = oldest.state;
        }
    }

    /// Forgets every batch in flight (`close`).
    pub fn forget_in_flight(&self) {
        self.lock_staged().clear();
    }
}

/// The poll's clock, for `DatabaseRecord.timestamp` and `$now`/`$now_unix`.
pub struct Now {
    pub rfc3339: String,
    pub unix: u64,
}

impl Now {
    pub fn read() -> Self {
        let now = SystemTime::now();
        Self {
            rfc3339: humantime::format_rfc3339_micros(now).to_string(),
            unix: now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs()),
        }
    }
}

/// Why a table cannot be polled as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("table {0} does not exist (or is not visible to this user)")]
    MissingTable(String),
    #[error("table {table} has no column \"{column}\" ({field})")]
    MissingColumn {
        table: String,
        column: String,
        field: &'static str,
    },
}

/// One column of a polled table as the database's catalog describes it.
pub trait CatalogEntry {
    fn name(&self) -> &str;
    /// The table's single-column primary key.
    fn primary_key(&self) -> bool;
    /// Covered by a single-column unique index.
    fn unique(&self) -> bool;
}

/// The columns of one table a plan is built from, checked against its catalog.
pub struct PlanColumns<'c, C> {
    pub tracking: &'c C,
    /// The row's unique key for ties, ids and DELETE/UPDATE; `None` when the
    /// tracking column is itself the key.
    pub key: Option<&'c C>,
    /// Says when ties on the tracking column can be missed.
    pub warning: Option<String>,
}

impl<'c, C: CatalogEntry> PlanColumns<'c, C> {
    /// Finds the columns `config` names in `table`'s `catalog` (a missing one
    /// is an error naming its field) and chooses the key that breaks ties:
    /// `primary_key_column`, else none when the tracking column is unique (or
    /// the rows come from a custom query), else the primary key. `same_name`
    /// compares column names as the database does.
    pub fn find(
        config: &PlanConfig<'_>,
        table: &str,
        catalog: &'c [C],
        same_name: fn(&str, &str) -> bool,
    ) -> Result<Self, PlanError> {
        if catalog.is_empty() {
            return Err(PlanError::MissingTable(table.to_owned()));
        }
        let find = |column: &str, field: &'static str| {
            catalog
                .iter()
                .find(|candidate| same_name(candidate.name(), column))
                .ok_or_else(|| PlanError::MissingColumn {
                    table: table.to_owned(),
                    column: column.to_owned(),
                    field,
                })
        };
        let tracking = find(config.tracking_column, "tracking_column")?;
        if let Some(column) = config.payload_column {
            find(column, "payload_column")?;
        }
        if let Consume::Mark(column) = &config.consume {
            find(column, "processed_column")?;
        }
        let mut warning = None;
        let key = match config.primary_key_column {
            Some(column) => Some(find(column, "primary_key_column")?),
            None if config.custom_query || tracking.unique() => None,
            None => {
                let primary = catalog.iter().find(|column| column.primary_key());
                if primary.is_none() {
                    warning = Some(format!(
                        "table {table}: tracking column \"{}\" is not unique and the table has no single-column primary key; \
                         rows that share a tracking value across a batch boundary can be skipped. Set primary_key_column.",
                        tracking.name()
                    ));
                }
                primary
            }
        }
        .filter(|key| !same_name(key.name(), tracking.name()));
        Ok(Self {
            tracking,
            key,
            warning,
        })
    }
}

/// The config fields a table plan's columns come from.
pub struct PlanConfig<'a> {
    pub tracking_column: &'a str,
    /// The payload column, when the payload is one column.
    pub payload_column: Option<&'a str>,
    pub consume: Consume,
    pub primary_key_column: Option<&'a str>,
    pub custom_query: bool,
}

/// Values for a custom query's placeholders.
pub struct Placeholders<'a> {
    pub table: &'a str,
    pub offset: &'a str,
    pub limit: u32,
    pub now_rfc3339: &'a str,
    pub now_unix: u64,
}

impl Placeholders<'_> {
    /// Fills `$table`, `$offset`, `$limit`, `$now` and `$now_unix` (upstream's
    /// placeholders) in `template` in one pass, so `$now_unix` is not read as
    /// `$now` + `_unix`. `$offset` is meant to sit inside a quoted literal:
    /// `escape_offset` makes sure a value read from the table cannot end it.
    pub fn fill(&self, template: &str, escape_offset: fn(&str) -> String) -> String {
        const NAMES: [&str; 5] = ["$now_unix", "$offset", "$table", "$limit", "$now"];
        let mut out = String::with_capacity(template.len() + 64);
        let mut rest = template;
        while let Some(position) = rest.find('$') {
            out.push_str(&rest[..position]);
            let candidate = &rest[position..];
            let Some(name) = NAMES.iter().find(|name| candidate.starts_with(**name)) else {
                out.push('$');
                rest = &candidate[1..];
                continue;
            };
            match *name {
                "$now_unix" => out.push_str(&self.now_unix.to_string()),
                "$offset" => out.push_str(&escape_offset(self.offset)),
                "$table" => out.push_str(self.table),
                "$limit" => out.push_str(&self.limit.to_string()),
                _ => out.push_str(self.now_rfc3339),
            }
            rest = &candidate[name.len()..];
        }
        out.push_str(rest);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the postgres and mysql sources saved before they shared
    /// this core: existing state files must load and be written the same.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct SavedBefore {
        tracking_offsets: BTreeMap<String, String>,
        #[serde(default)]
        tracking_keys: BTreeMap<String, String>,
        #[serde(default)]
        processed_rows: u64,
    }

    #[test]
    fn given_a_state_saved_by_the_sql_sources_when_decoded_should_read_and_encode_the_same_bytes() {
        let saved = SavedBefore {
            tracking_offsets: BTreeMap::from([("a".into(), "10".into())]),
            tracking_keys: BTreeMap::from([("a".into(), "k".into())]),
            processed_rows: 7,
        };
        let bytes = encode_state(&saved).unwrap();
        let state: PollState = decode_state(&bytes).unwrap();
        assert_eq!(state.tracking_offsets, saved.tracking_offsets);
        assert_eq!(state.tracking_keys, saved.tracking_keys);
        assert_eq!(state.processed_rows, 7);
        assert_eq!(encode_state(&state).unwrap(), bytes);
        // States written before tie-break keys existed hold offsets only.
        let oldest = encode_state(&serde_json::json!({"tracking_offsets": {"a": "1"}})).unwrap();
        let state: PollState = decode_state(&oldest).unwrap();
        assert_eq!(state.processed_rows, 0);
        assert!(state.tracking_keys.is_empty());
    }

    #[test]
    fn given_a_last_row_when_advanced_should_move_the_cursor_and_keep_the_key_only_for_ties() {
        let mut state = PollState::default();
        state.advance("t", Some(("5".into(), Some("k5".into()))));
        assert_eq!(state.tracking_keys.get("t").map(String::as_str), Some("k5"));
        state.advance("t", None);
        assert_eq!(
            state.tracking_offsets.get("t").map(String::as_str),
            Some("5")
        );
        state.advance("t", Some(("6".into(), None)));
        assert_eq!(
            state.tracking_offsets.get("t").map(String::as_str),
            Some("6")
        );
        assert!(state.tracking_keys.is_empty());
    }

    fn core(stop_when_caught_up: bool) -> PollCore<()> {
        PollCore::new(
            "test",
            PollSettings {
                poll_interval: Duration::from_secs(5),
                stop_when_caught_up,
                verbose_logging: false,
            },
        )
    }

    fn rows(count: usize) -> Vec<SourceRecord> {
        (0..count)
            .map(|n| SourceRecord::new(crate::message::Payload::Json(serde_json::json!(n))))
            .collect()
    }

    #[test]
    fn given_a_poll_that_caught_up_when_finished_should_ask_the_engine_to_wait_from_its_start() {
        let core = core(false);
        let started = Instant::now();
        let tables = ["t".to_owned()];
        let finish = |records, full| {
            core.finish_poll(
                PollState::default(),
                records,
                Vec::new(),
                full,
                &tables,
                started,
            )
            .unwrap()
        };
        let waits = started + Duration::from_secs(5);
        assert_eq!(finish(rows(0), false).next_poll, Some(waits), "empty");
        assert_eq!(finish(rows(2), false).next_poll, Some(waits), "short");
        assert_eq!(finish(rows(3), true).next_poll, None, "a table was full");
    }

    #[test]
    fn given_stop_when_caught_up_when_a_poll_caught_up_should_finish_without_waiting() {
        let core = core(true);
        let tables = ["t".to_owned()];
        let batch = core
            .finish_poll(
                PollState::default(),
                rows(2),
                Vec::new(),
                false,
                &tables,
                Instant::now(),
            )
            .unwrap();
        assert_eq!((batch.finished, batch.next_poll), (false, None));
        let last = core
            .finish_poll(
                PollState::default(),
                rows(0),
                Vec::new(),
                false,
                &tables,
                Instant::now(),
            )
            .unwrap();
        assert_eq!((last.finished, last.next_poll), (true, None));
    }
}

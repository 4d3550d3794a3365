//! `mode = "cdc"` of the postgres source: logical replication with pgoutput,
//! read over the streaming replication protocol (`stream.rs`), acknowledged
//! to the slot only in `commit`.
//!
//! - Setup: the publication (for `tables`, when missing) is created before the
//!   slot, the slot (pgoutput, named per connector) when missing, and a session
//!   advisory lock named after the slot is held for the connector's life, so a
//!   second connector on the same slot fails to start instead of sharing it.
//! - Snapshot (`snapshot = "initial"`): after the slot exists, one REPEATABLE
//!   READ transaction reads each table in primary-key order, a batch at a time.
//!   The state keeps, per table, the last key delivered and which tables are
//!   done, plus the first snapshot's `pg_current_snapshot()`. Streamed
//!   transactions visible in that snapshot are skipped (their rows were in the
//!   snapshot); a snapshot resumed after a crash reads the rest under a newer
//!   snapshot, which still holds everything the first one saw.
//! - Streaming: one replication connection (`START_REPLICATION SLOT .. LOGICAL
//!   <lsn>`, opened on the first poll after the snapshot) stays open; each
//!   poll reads up to `batch_size` rows, and the batch's state is the end LSN
//!   of its last whole transaction (plus, when the batch ends inside a larger
//!   transaction, that transaction's commit LSN and how many of its changes
//!   were handed out). `commit` (Iggy has the batch, the state is saved)
//!   raises the flush LSN the connection reports (the slot's
//!   `confirmed_flush_lsn`) to that LSN; keepalives are answered with it too,
//!   never with more. Several batches may be in flight; a lost
//!   connection drops the connection, and the next poll starts replication
//!   again after the last batch it still holds. Transactions that end before the saved
//!   LSN (delivered, slot not yet moved when the process died) are skipped,
//!   and so are the changes a cut transaction handed out already, so a
//!   restart duplicates nothing that was committed.

mod lag;
mod pgoutput;
mod render;
mod stream;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{AssertSqlSafe, Connection, Row, Transaction};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::config::{Operation, PostgresSourceConfig, SnapshotMode};
use super::query::CATALOG_SQL;
use super::quote::{quote_identifier, quote_qualified};
use super::record::message_id;
use crate::connectors::kit::cdc::RecordShape;
use crate::connectors::postgres::{describe, is_transient, lazy_pool, with_connect_cause};
use crate::connectors::{
    ConnectorContext, ConnectorError, Degraded, LagProbe, Source, SourceBatch, decode_state,
    encode_state,
};
use crate::message::{Payload, SourceRecord};
use pgoutput::{OldTuple, Relation};
pub use pgoutput::{format_lsn, parse_lsn};
use stream::{Change, Stream, is_transient_replication};

/// How long `open` waits for the database before leaving the setup to `poll`.
const OPEN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Slot lag is read at most this often.
const LAG_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The prefix of the logical messages an idle source writes so its slot can
/// move past WAL that holds nothing for it.
const HEARTBEAT_PREFIX: &str = "iggy-connect-heartbeat";
/// An idle source writes a heartbeat once its slot retains this much WAL (or
/// half of `slot_lag_warning`, whichever is less).
const HEARTBEAT_LAG: u64 = 16 << 20;
/// Microseconds between 1970-01-01 and PostgreSQL's epoch, 2000-01-01.
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// What a CDC source persists after each batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdcState {
    /// The slot this state belongs to.
    pub slot: String,
    /// End LSN of the last transaction delivered (0: none yet).
    pub lsn: u64,
    /// The initial snapshot's progress; `None` before it started (or with
    /// `snapshot = "never"`).
    #[serde(default)]
    pub snapshot: Option<SnapshotProgress>,
    #[serde(default)]
    pub processed_rows: u64,
    /// The transaction a batch ended inside of, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
}

/// A transaction cut across batches: the slot stays before it (`lsn` is the
/// end of the transaction before) until its last change is delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The transaction's commit LSN (pgoutput's `final_lsn`).
    pub final_lsn: u64,
    /// How many of its changes (in order, every kind) were handed out.
    pub delivered: u32,
}

/// How far the initial snapshot got. Bounded by the number of tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// `pg_current_snapshot()` of the first snapshot transaction: streamed
    /// transactions it saw are skipped. `None` once streaming passed them.
    pub visible: Option<String>,
    /// When the first snapshot was taken: the rows' `timestamp`.
    pub taken_at: String,
    /// Table -> primary key of the last row delivered.
    pub keys: BTreeMap<String, String>,
    /// Tables read completely.
    pub done_tables: Vec<String>,
    pub done: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CdcError {
    #[error("invalid connection_string: {}", describe(.0))]
    ConnectionString(#[source] sqlx::Error),
    #[error("{what}: {}", describe(.source))]
    Database {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("replication_slot: {0}")]
    Slot(String),
    /// This connector's previous session still holds the slot's lock (the
    /// server has not noticed yet that its connection is gone).
    #[error("slot {slot} is still locked by this connector's previous session; waiting for it")]
    SlotLocked { slot: String },
    #[error("publication: {0}")]
    Publication(String),
    #[error("tables: {0}")]
    Table(String),
    #[error("slot {slot}: {source}")]
    Decode {
        slot: String,
        #[source]
        source: pgoutput::DecodeError,
    },
    #[error("replication from slot {slot}: {source}")]
    Replication {
        slot: String,
        #[source]
        source: pgwire_replication::PgWireError,
    },
    #[error("replication from slot {slot}: no message from the server while {what}")]
    Stalled { slot: String, what: &'static str },
    #[error("replication from slot {slot}: the server ended the stream")]
    StreamEnded { slot: String },
    #[error("the source is not open")]
    NotOpen,
}

impl From<CdcError> for ConnectorError {
    fn from(error: CdcError) -> Self {
        match &error {
            CdcError::Database { source, .. } if is_transient(source) || slot_busy(source) => {
                ConnectorError::transient(error)
            }
            CdcError::Replication { source, .. } if is_transient_replication(source) => {
                ConnectorError::transient(error)
            }
            CdcError::Stalled { .. }
            | CdcError::StreamEnded { .. }
            | CdcError::SlotLocked { .. } => ConnectorError::transient(error),
            _ => ConnectorError::fatal(error),
        }
    }
}

/// `object_in_use`: the slot is still held by the walsender of a connection
/// just closed (a restart right after a shutdown); it frees itself.
fn slot_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(database) if database.code().as_deref() == Some("55006"))
}

/// One table as the snapshot reads it.
#[derive(Debug, Clone)]
struct SnapshotPlan {
    name: String,
    sql: String,
}

/// What setup found: table OIDs (pgoutput's relation ids) to configured names,
/// and the snapshot queries.
#[derive(Debug)]
struct Setup {
    names: HashMap<u32, String>,
    snapshot: Vec<SnapshotPlan>,
}

/// A tuple's JSON: rendered here, or by PostgreSQL (in the order asked).
enum Text {
    Ready(String),
    Server,
}

/// A change's tuples: the new row, and the old row with whether it is whole
/// (`REPLICA IDENTITY FULL`) rather than the key.
type ChangeTexts = (Option<Text>, Option<(Text, bool)>);

pub struct CdcSource {
    config: PostgresSourceConfig,
    operations: Vec<Operation>,
    key: String,
    degraded: Degraded,
    pool: Option<PgPool>,
    setup: tokio::sync::OnceCell<Setup>,
    /// The connection holding the slot's advisory lock.
    lock: tokio::sync::Mutex<Option<PgConnection>>,
    /// The snapshot's REPEATABLE READ transaction while it runs.
    snapshot: tokio::sync::Mutex<Option<Transaction<'static, Postgres>>>,
    committed: Mutex<CdcState>,
    /// The states of the batches polled and not yet committed, oldest first.
    staged: Mutex<VecDeque<CdcState>>,
    /// The replication connection between polls; a poll takes it out while
    /// it reads, so a cancelled poll drops it and the next one reconnects.
    stream: tokio::sync::Mutex<Option<Stream>>,
    /// The slot's confirmed position as far as this source moved it (or
    /// asked the stream to): the flush LSN the stream may report.
    advanced: AtomicU64,
    /// `advanced`, for the poll holding the stream to pass on at once.
    acknowledged: watch::Sender<u64>,
    caught_up: AtomicBool,
    /// The server's WAL flush position as last read.
    flushed: AtomicU64,
    lag_checked: Mutex<Option<Instant>>,
    /// The slot's lag as last read, in bytes.
    lag: AtomicU64,
}

impl CdcSource {
    pub fn new(config: PostgresSourceConfig) -> Self {
        let operations = config.operations().unwrap_or_default();
        Self {
            config,
            operations,
            key: String::new(),
            degraded: Degraded::default(),
            pool: None,
            setup: tokio::sync::OnceCell::new(),
            lock: tokio::sync::Mutex::new(None),
            snapshot: tokio::sync::Mutex::new(None),
            committed: Mutex::new(CdcState::default()),
            staged: Mutex::new(VecDeque::new()),
            stream: tokio::sync::Mutex::new(None),
            advanced: AtomicU64::new(0),
            acknowledged: watch::Sender::new(0),
            caught_up: AtomicBool::new(false),
            flushed: AtomicU64::new(0),
            lag_checked: Mutex::new(None),
            lag: AtomicU64::new(0),
        }
    }

    /// `replication_slot`, or `iggy_` + the connector key made a valid name.
    pub fn slot_name(&self) -> Result<String, CdcError> {
        if let Some(slot) = &self.config.replication_slot {
            return Ok(slot.clone());
        }
        derived_slot_name(&self.key).ok_or_else(|| {
            CdcError::Slot("no connector key to name the slot after; set replication_slot".into())
        })
    }

    fn publication_name(&self) -> Result<String, CdcError> {
        match &self.config.publication {
            Some(publication) => Ok(publication.clone()),
            None => self.slot_name(),
        }
    }

    fn pool(&self) -> Result<&PgPool, CdcError> {
        self.pool.as_ref().ok_or(CdcError::NotOpen)
    }

    async fn ready(&self) -> Result<&Setup, CdcError> {
        self.setup.get_or_try_init(|| self.set_up()).await
    }

    async fn set_up(&self) -> Result<Setup, CdcError> {
        let pool = self.pool()?;
        let slot = self.slot_name()?;
        let publication = self.publication_name()?;
        let database = |what: &str| {
            let what = what.to_owned();
            move |source| CdcError::Database { what, source }
        };
        self.take_lock(pool, &slot).await?;
        // Tables first: a missing one is named before anything is created.
        let mut names = HashMap::new();
        for table in &self.config.tables {
            let quoted = quote_qualified(table).unwrap_or_default();
            let oid: Option<i64> = sqlx::query_scalar("SELECT to_regclass($1)::oid::int8")
                .bind(&quoted)
                .fetch_one(pool)
                .await
                .map_err(database("looking up the captured tables"))?;
            let oid = oid.ok_or_else(|| {
                CdcError::Table(format!(
                    "table {table} does not exist (or is not visible to this user)"
                ))
            })?;
            names.insert(oid as u32, table.clone());
        }
        // The publication must exist before the slot's start: pgoutput reads it
        // as of each change's position.
        self.ensure_publication(pool, &publication).await?;
        self.ensure_slot(pool, &slot).await?;
        let confirmed: Option<String> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot)
        .fetch_one(pool)
        .await
        .map_err(database("reading the slot's position"))?;
        let confirmed = confirmed.as_deref().and_then(parse_lsn).unwrap_or(0);
        self.advanced.store(confirmed, Ordering::SeqCst);
        let saved = self.lock_committed().lsn;
        if saved > confirmed {
            // Delivered and saved, but the process died before the stream
            // reported it.
            self.advance(pool, &slot, saved).await?;
        }
        self.acknowledged
            .send_replace(self.advanced.load(Ordering::SeqCst));
        let mut snapshot = Vec::new();
        // Only while a snapshot is to be read: a table without a primary key
        // is fine once it is done.
        if self.snapshot_pending(&self.lock_committed().clone()) {
            for table in &self.config.tables {
                snapshot.push(self.snapshot_plan(pool, table).await?);
            }
        }
        info!(connector_key = %self.key, %slot, %publication, slot_lsn = %format_lsn(confirmed), "postgres cdc source set up");
        Ok(Setup { names, snapshot })
    }

    async fn take_lock(&self, pool: &PgPool, slot: &str) -> Result<(), CdcError> {
        let mut guard = self.lock.lock().await;
        if guard.is_some() {
            return Ok(());
        }
        let mut connection = match pool.acquire().await {
            Ok(connection) => connection.detach(),
            Err(error) => {
                return Err(CdcError::Database {
                    what: "connecting".into(),
                    source: with_connect_cause(pool, error).await,
                });
            }
        };
        let database = |what: &str| {
            let what = what.to_owned();
            move |source| CdcError::Database { what, source }
        };
        // The lock's session carries this connector's key, so a session
        // holding it can be told apart: this connector's predecessor (killed a
        // moment ago, its connection not yet closed by the server: transient)
        // or another connector (a config error).
        let holder_name = format!("iggy-connect {}", self.key);
        let lock_key = format!("iggy-connect replication slot {slot}");
        let locked: Option<String> = sqlx::query_scalar(
            "SELECT CASE WHEN pg_try_advisory_lock(hashtextextended($2, 0)) THEN NULL \
             ELSE coalesce((SELECT a.application_name FROM pg_locks l \
                 JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                 AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended($2, 0) \
                 LIMIT 1), '') END \
             FROM (SELECT set_config('application_name', $1, false)) AS named",
        )
        .bind(&holder_name)
        .bind(&lock_key)
        .fetch_one(&mut connection)
        .await
        .map_err(database("locking the slot"))?;
        match locked {
            None => {}
            Some(holder) if holder == holder_name || holder.is_empty() => {
                return Err(CdcError::SlotLocked {
                    slot: slot.to_owned(),
                });
            }
            Some(holder) => {
                return Err(CdcError::Slot(format!(
                    "slot {slot} is in use by another connector ({holder}); give each connector its own replication_slot"
                )));
            }
        }
        *guard = Some(connection);
        Ok(())
    }

    async fn ensure_publication(&self, pool: &PgPool, publication: &str) -> Result<(), CdcError> {
        let database = |source| CdcError::Database {
            what: format!("checking publication {publication}"),
            source,
        };
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
                .bind(publication)
                .fetch_one(pool)
                .await
                .map_err(database)?;
        let quoted_tables = self
            .config
            .tables
            .iter()
            .map(|table| quote_qualified(table).unwrap_or_default())
            .collect::<Vec<_>>();
        if !exists {
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {}",
                quote_identifier(publication).unwrap_or_default(),
                quoted_tables.join(", ")
            );
            match sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await {
                Ok(_) => {
                    info!(connector_key = %self.key, %publication, "created publication");
                    return Ok(());
                }
                // Created meanwhile by someone else: check it like an old one.
                Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42710") => {}
                Err(source) => {
                    return Err(CdcError::Database {
                        what: format!("creating publication {publication}"),
                        source,
                    });
                }
            }
        }
        for (table, quoted) in self.config.tables.iter().zip(&quoted_tables) {
            let included: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = $1 AND (p.puballtables \
                 OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = to_regclass($2))))",
            )
            .bind(publication)
            .bind(quoted)
            .fetch_one(pool)
            .await
            .map_err(database)?;
            if !included {
                return Err(CdcError::Publication(format!(
                    "publication {publication} exists without table {table}; run ALTER PUBLICATION {publication} ADD TABLE {quoted}, or name another publication"
                )));
            }
        }
        Ok(())
    }

    async fn ensure_slot(&self, pool: &PgPool, slot: &str) -> Result<(), CdcError> {
        let database = |what: String| move |source| CdcError::Database { what, source };
        for _ in 0..2 {
            let existing = sqlx::query(
                "SELECT plugin::text, database::text, current_database()::text FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(slot)
            .fetch_optional(pool)
            .await
            .map_err(database(format!("checking slot {slot}")))?;
            if let Some(row) = existing {
                let plugin: Option<String> = row.try_get(0).unwrap_or_default();
                let slot_database: Option<String> = row.try_get(1).unwrap_or_default();
                let current: Option<String> = row.try_get(2).unwrap_or_default();
                if plugin.as_deref() != Some("pgoutput") {
                    return Err(CdcError::Slot(format!(
                        "slot {slot} exists with plugin {}; this source needs a pgoutput slot: drop it (SELECT pg_drop_replication_slot('{slot}')) or name another replication_slot",
                        plugin.as_deref().unwrap_or("none (a physical slot)")
                    )));
                }
                if slot_database != current {
                    return Err(CdcError::Slot(format!(
                        "slot {slot} belongs to database {}, not {}; name another replication_slot",
                        slot_database.unwrap_or_default(),
                        current.unwrap_or_default()
                    )));
                }
                return Ok(());
            }
            match sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
                .bind(slot)
                .execute(pool)
                .await
            {
                Ok(_) => {
                    info!(connector_key = %self.key, %slot, "created logical replication slot");
                    return Ok(());
                }
                Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42710") => {}
                Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("55000") => {
                    return Err(CdcError::Slot(format!(
                        "cannot create slot {slot}: {} (start PostgreSQL with wal_level = logical)",
                        error.message()
                    )));
                }
                Err(source) => return Err(database(format!("creating slot {slot}"))(source)),
            }
        }
        Err(CdcError::Slot(format!(
            "slot {slot} appears and disappears; is another process dropping it?"
        )))
    }

    async fn snapshot_plan(&self, pool: &PgPool, table: &str) -> Result<SnapshotPlan, CdcError> {
        let quoted = quote_qualified(table).unwrap_or_default();
        let rows = sqlx::query(CATALOG_SQL)
            .bind(&quoted)
            .fetch_all(pool)
            .await
            .map_err(|source| CdcError::Database {
                what: format!("reading the columns of table {table}"),
                source,
            })?;
        let key = rows.iter().find_map(|row| {
            let primary: bool = row.try_get(2).unwrap_or(false);
            let name: String = row.try_get(0).ok()?;
            let sql_type: String = row.try_get(1).ok()?;
            primary.then_some((name, sql_type))
        });
        let Some((key, key_type)) = key else {
            return Err(CdcError::Table(format!(
                "table {table} has no single-column primary key, which the initial snapshot reads in order; add one or set snapshot = \"never\""
            )));
        };
        let key = quote_identifier(&key).unwrap_or_default();
        Ok(SnapshotPlan {
            name: table.to_owned(),
            sql: format!(
                "SELECT src.{key}::text, row_to_json(src)::text FROM {quoted} AS src \
                 WHERE $1::text IS NULL OR src.{key} > CAST($1 AS {key_type}) \
                 ORDER BY src.{key} LIMIT $2"
            ),
        })
    }

    /// Moves the slot to `lsn` through SQL, before the stream opens (the
    /// slot is not held then, except by the walsender of a connection just
    /// closed).
    async fn advance(&self, pool: &PgPool, slot: &str, lsn: u64) -> Result<(), CdcError> {
        if lsn <= self.advanced.load(Ordering::SeqCst) {
            return Ok(());
        }
        // A slot still held by the walsender of a connection just closed
        // answers 55006, a transient error: the engine polls again.
        if let Err(error) =
            sqlx::query("SELECT pg_replication_slot_advance($1, CAST($2 AS pg_lsn))")
                .bind(slot)
                .bind(format_lsn(lsn))
                .execute(pool)
                .await
        {
            return Err(CdcError::Database {
                what: format!("advancing slot {slot}"),
                source: with_connect_cause(pool, error).await,
            });
        }
        self.advanced.fetch_max(lsn, Ordering::SeqCst);
        debug!(connector_key = %self.key, %slot, lsn = %format_lsn(lsn), "slot advanced");
        Ok(())
    }

    fn lock_committed(&self) -> MutexGuard<'_, CdcState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<CdcState>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn snapshot_pending(&self, state: &CdcState) -> bool {
        self.config.snapshot == SnapshotMode::Initial
            && state
                .snapshot
                .as_ref()
                .is_none_or(|progress| !progress.done)
    }

    /// Reads the next rows of the initial snapshot.
    async fn snapshot_batch(
        &self,
        setup: &Setup,
        base: &CdcState,
    ) -> Result<(Vec<SourceRecord>, CdcState), CdcError> {
        let pool = self.pool()?;
        let slot = self.slot_name()?;
        let mut guard = self.snapshot.lock().await;
        let mut next = base.clone();
        next.slot.clone_from(&slot);
        let database = |what: String| move |source| CdcError::Database { what, source };
        if guard.is_none() {
            let mut transaction = match pool.begin().await {
                Ok(transaction) => transaction,
                Err(error) => {
                    return Err(database("starting the snapshot".into())(
                        with_connect_cause(pool, error).await,
                    ));
                }
            };
            sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *transaction)
                .await
                .map_err(database("starting the snapshot".into()))?;
            let row = sqlx::query(
                "SELECT pg_current_snapshot()::text, \
                 to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            )
            .fetch_one(&mut *transaction)
            .await
            .map_err(database("starting the snapshot".into()))?;
            let visible: String = row
                .try_get(0)
                .map_err(database("starting the snapshot".into()))?;
            let taken_at: String = row
                .try_get(1)
                .map_err(database("starting the snapshot".into()))?;
            if next.snapshot.is_none() {
                info!(connector_key = %self.key, %slot, snapshot = %visible, "postgres cdc source starts its initial snapshot");
                next.snapshot = Some(SnapshotProgress {
                    visible: Some(visible),
                    taken_at,
                    ..SnapshotProgress::default()
                });
            } else {
                info!(connector_key = %self.key, %slot, "postgres cdc source resumes its initial snapshot");
            }
            *guard = Some(transaction);
        }
        let mut progress = next.snapshot.clone().unwrap_or_default();
        let mut records = Vec::new();
        for plan in &setup.snapshot {
            if progress.done_tables.contains(&plan.name) {
                continue;
            }
            let Some(transaction) = guard.as_mut() else {
                break;
            };
            let limit = self.config.batch_size as usize - records.len();
            let rows = sqlx::query(AssertSqlSafe(plan.sql.clone()))
                .bind(progress.keys.get(&plan.name))
                .bind(limit as i64)
                .fetch_all(&mut **transaction)
                .await;
            let rows = match rows {
                Ok(rows) => rows,
                Err(source) => {
                    // A fresh transaction next time; the state says where.
                    guard.take();
                    return Err(database(format!("snapshot of table {}", plan.name))(source));
                }
            };
            if rows.len() < limit {
                progress.done_tables.push(plan.name.clone());
            }
            for row in &rows {
                let key: String = row
                    .try_get(0)
                    .map_err(database(format!("snapshot of table {}", plan.name)))?;
                let data: String = row
                    .try_get(1)
                    .map_err(database(format!("snapshot of table {}", plan.name)))?;
                let id = message_id(&format!("{slot}/{}", plan.name), &key, None, false);
                let payload =
                    self.document(&plan.name, "SELECT", &progress.taken_at, Some(&data), None);
                records.push(SourceRecord::new(payload).with_id(id));
                progress.keys.insert(plan.name.clone(), key);
            }
            if records.len() >= self.config.batch_size as usize {
                break;
            }
        }
        if setup
            .snapshot
            .iter()
            .all(|plan| progress.done_tables.contains(&plan.name))
        {
            progress.done = true;
            progress.keys.clear();
            if let Some(transaction) = guard.take() {
                // Read only: nothing to keep; a failed COMMIT changes nothing.
                if let Err(error) = transaction.commit().await {
                    debug!(%error, "ending the snapshot transaction");
                }
            }
            info!(connector_key = %self.key, %slot, "postgres cdc source finished its initial snapshot; streaming changes");
        }
        next.processed_rows += records.len() as u64;
        next.snapshot = Some(progress);
        Ok((records, next))
    }

    /// Reads the next transactions from the replication stream, opening it
    /// after `base` when there is none.
    async fn stream_batch(
        &self,
        setup: &Setup,
        base: &CdcState,
    ) -> Result<(Vec<SourceRecord>, CdcState), CdcError> {
        let pool = self.pool()?;
        let slot = self.slot_name()?;
        let mut guard = self.stream.lock().await;
        // What the server has flushed now: the poll reads at least up to it.
        // While the stream has not reached the last reading, that one does.
        let flushed = self.flushed.load(Ordering::SeqCst);
        let target = if guard.as_ref().is_some_and(|stream| stream.before(flushed)) {
            flushed
        } else {
            let target: Option<String> =
                match sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
                    .fetch_one(pool)
                    .await
                {
                    Ok(target) => target,
                    Err(error) => {
                        return Err(CdcError::Database {
                            what: "reading the WAL position".into(),
                            source: with_connect_cause(pool, error).await,
                        });
                    }
                };
            let target = target.as_deref().and_then(parse_lsn).unwrap_or(0);
            self.flushed.store(target, Ordering::SeqCst);
            target
        };
        let mut stream = match guard.take() {
            Some(stream) => stream,
            None => {
                let publication = quote_identifier(&self.publication_name()?).unwrap_or_default();
                let config = stream::replication_config(
                    &self.config.connection_string,
                    &slot,
                    &publication,
                )?;
                let acknowledged = self.advanced.load(Ordering::SeqCst);
                let stream = Stream::open(config, base.lsn, acknowledged).await?;
                info!(connector_key = %self.key, %slot, lsn = %format_lsn(base.lsn.max(acknowledged)), "postgres cdc source started replication");
                stream
            }
        };
        let mut base = base.clone();
        base.slot.clone_from(&slot);
        let mut acknowledged = self.acknowledged.subscribe();
        // On an error the stream is dropped: what it read is read again by
        // the next connection.
        let batch = stream
            .read(
                &base,
                target,
                self.config.batch_size as usize,
                &mut acknowledged,
            )
            .await?;
        self.caught_up.store(!batch.full, Ordering::SeqCst);
        let stream::Batch {
            mut changes,
            mut next,
            ..
        } = batch;
        if changes.is_empty() && next.lsn == base.lsn {
            self.heartbeat(pool).await;
        }
        changes.retain(|change| self.operations.contains(&change.operation));
        let records = self
            .records(setup, &slot, &stream.relations, &changes)
            .await?;
        *guard = Some(stream);
        next.processed_rows += records.len() as u64;
        Ok((records, next))
    }

    async fn records(
        &self,
        setup: &Setup,
        slot: &str,
        relations: &HashMap<u32, Relation>,
        changes: &[Change],
    ) -> Result<Vec<SourceRecord>, CdcError> {
        let pool = self.pool()?;
        // Each tuple is rendered here when it can be; the others by
        // PostgreSQL, every such tuple of a relation in one query.
        let mut texts: Vec<ChangeTexts> = Vec::with_capacity(changes.len());
        let mut server: HashMap<u32, Vec<render::Tuple>> = HashMap::new();
        for change in changes {
            let Some(relation) = relations.get(&change.relation) else {
                let empty = || Text::Ready("{}".to_owned());
                texts.push((
                    change.new.as_ref().map(|_| empty()),
                    change
                        .old
                        .as_ref()
                        .map(|old| (empty(), matches!(old, OldTuple::Full(_)))),
                ));
                continue;
            };
            let mut text = |values: &[pgoutput::Value], key_only: bool| {
                let mut out = Vec::with_capacity(
                    values
                        .iter()
                        .map(|value| match value {
                            pgoutput::Value::Text(bytes) => bytes.len() + 16,
                            _ => 16,
                        })
                        .sum::<usize>()
                        + 2,
                );
                if render::local(relation, values, key_only, &mut out) {
                    // Only UTF-8 is written (checked values, escapes): the
                    // lossy branch never runs.
                    Text::Ready(String::from_utf8(out).unwrap_or_else(|error| {
                        String::from_utf8_lossy(error.as_bytes()).into_owned()
                    }))
                } else {
                    server
                        .entry(change.relation)
                        .or_default()
                        .push(render::Tuple::new(relation, values, key_only));
                    Text::Server
                }
            };
            let new = change.new.as_deref().map(|values| text(values, false));
            let old = change.old.as_ref().map(|old| match old {
                OldTuple::Key(values) => (text(values, true), false),
                OldTuple::Full(values) => (text(values, false), true),
            });
            texts.push((new, old));
        }
        let mut rendered: HashMap<u32, std::vec::IntoIter<String>> = HashMap::new();
        for (id, wanted) in &server {
            let Some(relation) = relations.get(id) else {
                continue;
            };
            let texts = render::render(pool, relation, wanted)
                .await
                .map_err(|source| CdcError::Database {
                    what: format!("rendering rows of {}.{}", relation.namespace, relation.name),
                    source,
                })?;
            rendered.insert(*id, texts.into_iter());
        }
        let hash = slot_hash(slot);
        let mut records = Vec::with_capacity(changes.len());
        for (change, (new, old)) in changes.iter().zip(texts) {
            let table = match setup.names.get(&change.relation) {
                Some(name) => Some(Cow::Borrowed(name.as_str())),
                None => relations.get(&change.relation).map(|relation| {
                    Cow::Owned(format!("{}.{}", relation.namespace, relation.name))
                }),
            };
            let Some(table) = table else {
                return Err(CdcError::Decode {
                    slot: slot.to_owned(),
                    source: pgoutput::DecodeError {
                        tag: 'R',
                        reason: format!(
                            "a change of relation {} came before its Relation message",
                            change.relation
                        ),
                    },
                });
            };
            let mut resolve = |text: Text| match text {
                Text::Ready(text) => text,
                Text::Server => rendered
                    .get_mut(&change.relation)
                    .and_then(Iterator::next)
                    .unwrap_or_else(|| "{}".to_owned()),
            };
            let new = new.map(&mut resolve);
            let old = old.map(|(text, full)| (resolve(text), full));
            let (data, old_data) = match change.operation {
                Operation::Insert => (new, None),
                Operation::Update => (new, old.map(|(text, _)| text)),
                Operation::Delete => match old {
                    Some((text, true)) => (Some(text.clone()), Some(text)),
                    Some((text, false)) => (Some(text), None),
                    None => (None, None),
                },
                Operation::Truncate => (None, None),
            };
            let payload = self.document(
                &table,
                change.operation.name(),
                &change.timestamp,
                data.as_deref(),
                old_data.as_deref(),
            );
            let id = (u128::from(change.final_lsn) << 64)
                | (u128::from(hash) << 32)
                | u128::from(change.position);
            records.push(SourceRecord::new(payload).with_id(id));
        }
        Ok(records)
    }

    /// Upstream's `DatabaseRecord` around rows rendered as JSON text (kept as
    /// PostgreSQL wrote them), or the row alone without `include_metadata`.
    fn document(
        &self,
        table: &str,
        operation: &str,
        timestamp: &str,
        data: Option<&str>,
        old_data: Option<&str>,
    ) -> Payload {
        RecordShape {
            include_metadata: self.config.include_metadata,
            snake_case_columns: self.config.snake_case_columns,
        }
        .payload(table, operation, timestamp, data, old_data)
    }

    /// Caught up, and the slot still retains WAL (other tables' changes,
    /// which the publication filters out, hold it back): writes a logical
    /// message the stream reads next, so `commit` can move the slot past it.
    async fn heartbeat(&self, pool: &PgPool) {
        let threshold = HEARTBEAT_LAG.min(self.config.slot_lag_warning / 2);
        if self.lag.load(Ordering::SeqCst) <= threshold {
            return;
        }
        // Once per lag reading.
        self.lag.store(0, Ordering::SeqCst);
        match sqlx::query("SELECT pg_logical_emit_message(false, $1, '')")
            .bind(HEARTBEAT_PREFIX)
            .execute(pool)
            .await
        {
            Ok(_) => debug!(connector_key = %self.key, "wrote a heartbeat for the idle slot"),
            Err(error) => {
                debug!(connector_key = %self.key, error = %describe(&error), "cannot write a heartbeat")
            }
        }
    }

    /// Reads how much WAL the slot retains: a metric, and degraded past
    /// `slot_lag_warning`. Failures only log: the lag is advisory.
    async fn check_lag(&self) {
        {
            let mut checked = self
                .lag_checked
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if checked.is_some_and(|at| at.elapsed() < LAG_CHECK_INTERVAL) {
                return;
            }
            *checked = Some(Instant::now());
        }
        let (Ok(pool), Ok(slot)) = (self.pool(), self.slot_name()) else {
            return;
        };
        let lag: Result<Option<i64>, _> = sqlx::query_scalar(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot)
        .fetch_one(pool)
        .await;
        match lag {
            Ok(Some(lag)) => {
                self.lag.store(lag.max(0) as u64, Ordering::SeqCst);
                metrics::gauge!("iggy_connector_postgres_slot_lag_bytes", "connector_key" => self.key.clone())
                    .set(lag as f64);
                if lag as u64 > self.config.slot_lag_warning {
                    self.degraded.set(format!(
                        "replication slot {slot} retains {lag} bytes of WAL (slot_lag_warning = {})",
                        self.config.slot_lag_warning
                    ));
                } else {
                    self.degraded.clear();
                }
            }
            Ok(None) => {}
            Err(error) => debug!(error = %describe(&error), "reading the slot lag"),
        }
    }
}

#[async_trait]
impl Source for CdcSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        self.degraded = context.degraded;
    }

    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        Some(Arc::new(lag::SlotLag {
            pool: self.pool.clone()?,
            slot: self.slot_name().ok()?,
        }))
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            let restored: CdcState = decode_state(bytes)?;
            info!(connector_key = %self.key, slot = %restored.slot, lsn = %format_lsn(restored.lsn), "postgres cdc source restored its position");
            *self.lock_committed() = restored;
        }
        self.pool = Some(
            lazy_pool(
                &self.config.connection_string,
                self.config.max_connections.max(3),
                Duration::from_secs(10),
            )
            .map_err(CdcError::ConnectionString)?,
        );
        match tokio::time::timeout(OPEN_CHECK_TIMEOUT, self.ready()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                let error = ConnectorError::from(error);
                if !error.is_transient() {
                    return Err(error);
                }
                warn!(connector_key = %self.key, %error, "postgres cdc source cannot reach the database yet; polls will retry");
            }
            Err(_) => {
                let cause = with_connect_cause(self.pool()?, sqlx::Error::PoolTimedOut).await;
                if !is_transient(&cause) {
                    return Err(ConnectorError::fatal(CdcError::Database {
                        what: "connecting".into(),
                        source: cause,
                    }));
                }
                warn!(connector_key = %self.key, error = %describe(&cause), "postgres cdc source cannot reach the database yet; polls will retry");
            }
        }
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = tokio::time::Instant::now();
        let setup = self.ready().await?;
        // After the batches still in flight.
        let base = {
            let staged = self.lock_staged();
            match staged.back() {
                Some(last) => last.clone(),
                None => self.lock_committed().clone(),
            }
        };
        let (records, next) = if self.snapshot_pending(&base) {
            self.snapshot_batch(setup, &base).await?
        } else {
            self.stream_batch(setup, &base).await?
        };
        self.check_lag().await;
        let state = if next == base {
            None
        } else {
            Some(encode_state(&next)?)
        };
        if self.config.verbose_logging {
            info!(connector_key = %self.key, records = records.len(), lsn = %format_lsn(next.lsn), "postgres cdc source polled a batch");
        }
        self.lock_staged().push_back(next);
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            // Caught up: the engine waits `poll_interval` from this poll's start.
            next_poll: self
                .caught_up
                .load(Ordering::SeqCst)
                .then(|| started + self.config.poll_interval),
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(next) = self.lock_staged().pop_front() else {
            return Ok(());
        };
        let lsn = next.lsn;
        if lsn > self.advanced.fetch_max(lsn, Ordering::SeqCst) {
            self.acknowledged.send_replace(lsn);
        }
        *self.lock_committed() = next;
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.lock_staged().clear();
        if let Some(stream) = self.stream.lock().await.take() {
            stream.close().await;
        }
        if let Some(transaction) = self.snapshot.lock().await.take()
            && let Err(error) = transaction.rollback().await
        {
            debug!(%error, "ending the snapshot transaction");
        }
        if let Some(connection) = self.lock.lock().await.take()
            && let Err(error) = connection.close().await
        {
            debug!(%error, "closing the slot lock connection");
        }
        if let Some(pool) = self.pool.take() {
            pool.close().await;
        }
        Ok(())
    }
}

/// `pg_current_snapshot()` parsed: which transaction ids it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
struct XidSnapshot {
    xmin: u64,
    xmax: u64,
    running: Vec<u64>,
}

impl XidSnapshot {
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let running = parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|part| !part.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Self {
            xmin,
            xmax,
            running,
        })
    }

    /// Whether the 32-bit `xid` (pgoutput's) had committed when the snapshot
    /// was taken. The epoch is the one that puts it nearest to `xmax`.
    fn sees(&self, xid: u32) -> bool {
        let epoch = self.xmax >> 32;
        let full = [epoch.wrapping_sub(1), epoch, epoch + 1]
            .into_iter()
            .map(|epoch| (epoch << 32) | u64::from(xid))
            .min_by_key(|candidate| candidate.abs_diff(self.xmax))
            .unwrap_or(u64::from(xid));
        full < self.xmin || (full < self.xmax && !self.running.contains(&full))
    }
}

/// `iggy_` + the key, lowercased, other characters as `_`, at most 63 bytes.
pub fn derived_slot_name(key: &str) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    let mut name: String = "iggy_"
        .chars()
        .chain(key.chars().map(|character| {
            let lower = character.to_ascii_lowercase();
            if lower.is_ascii_lowercase() || lower.is_ascii_digit() {
                lower
            } else {
                '_'
            }
        }))
        .collect();
    name.truncate(63);
    Some(name)
}

fn slot_hash(slot: &str) -> u32 {
    slot.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// A pgoutput timestamp (microseconds since 2000-01-01) as RFC 3339.
fn rfc3339(postgres_micros: i64) -> String {
    let unix_micros = postgres_micros.saturating_add(POSTGRES_EPOCH_MICROS).max(0) as u64;
    let time = UNIX_EPOCH + Duration::from_micros(unix_micros);
    humantime::format_rfc3339_micros(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_snapshot_when_asked_about_xids_should_see_only_those_committed_before_it() {
        let snapshot = XidSnapshot::parse("100:105:101,103").unwrap();
        assert!(snapshot.sees(99));
        assert!(snapshot.sees(102));
        assert!(!snapshot.sees(101), "running at the snapshot");
        assert!(!snapshot.sees(105), "started after it");
        let next_epoch =
            XidSnapshot::parse(&format!("{}:{}:", (1u64 << 32) + 5, (1u64 << 32) + 9)).unwrap();
        assert!(next_epoch.sees(u32::MAX), "the previous epoch's last xid");
        assert!(!next_epoch.sees(10));
    }

    #[test]
    fn given_connector_keys_when_slots_are_derived_should_be_valid_distinct_names() {
        assert_eq!(
            derived_slot_name("Orders-CDC").as_deref(),
            Some("iggy_orders_cdc")
        );
        assert_ne!(derived_slot_name("a"), derived_slot_name("b"));
        assert_eq!(derived_slot_name(&"k".repeat(100)).unwrap().len(), 63);
        assert_eq!(derived_slot_name(""), None);
    }

    #[test]
    fn given_a_pgoutput_timestamp_when_formatted_should_be_utc_rfc3339() {
        assert_eq!(rfc3339(0), "2000-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(1_500_000), "2000-01-01T00:00:01.500000Z");
    }
}

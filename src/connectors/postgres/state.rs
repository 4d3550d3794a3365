//! `[state] type = "postgres"`: every source's state in one PostgreSQL table,
//! shared by several instances, and a lease per source key so that one
//! instance at a time runs each source.
//!
//! Two tables (created when missing): `{table}` holds `(key, connector, data,
//! epoch, holder, updated_at)`, `{table}_leases` holds `(key, holder, epoch,
//! expires_at)`. Expiry is the database's clock, so instances need no
//! synchronised clocks. Taking a lease raises its epoch; a save runs in one
//! statement that checks, under a share lock of the lease row, that this
//! instance still holds the lease at the epoch it took: an instance that lost
//! its lease cannot overwrite the state of the one that took it over.
//!
//! The pool connects on first use: with the database down, sources wait in
//! standby (their leases cannot be taken) and sinks run.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;

use crate::config::runtime::StateConfig;
use crate::config::runtime::StateKind;
use crate::connectors::postgres::{describe, is_transient, lazy_pool, with_connect_cause};
use crate::state::{Acquired, Backend, Leases, StateError, StateStore, StoredState};

inventory::submit!(Backend {
    kind: StateKind::Postgres,
    open: |config| {
        Box::pin(async move {
            let store: std::sync::Arc<dyn StateStore> =
                std::sync::Arc::new(PostgresStateStore::open(config).await?);
            Ok(store)
        })
    },
});

/// The holder an operator's change (the API or the CLI, no lease) is saved under.
const OPERATOR: &str = "operator";

pub struct PostgresStateStore {
    pool: PgPool,
    table: String,
    leases: String,
    /// This process: the instance id and a random suffix, so a restarted
    /// instance waits for the lease its previous process held to expire.
    holder: String,
    lease_duration: Duration,
    /// The epoch of each lease this process took and has not released (a lost
    /// one included, so the saves of its pipeline stay fenced).
    held: Mutex<HashMap<String, i64>>,
    schema: OnceCell<()>,
    /// `host:port/database`, for messages.
    server: String,
}

impl PostgresStateStore {
    /// Opens the pool (the connection string was checked with the config)
    /// and, if the database answers, creates the tables. Bad credentials or a missing database fail here; a database
    /// that does not answer does not (the first lease or load retries).
    pub async fn open(config: &StateConfig) -> Result<Self, StateError> {
        let pool =
            lazy_pool(&config.connection_string, 4, Duration::from_secs(5)).map_err(|error| {
                StateError::Database {
                    action: "use",
                    location: format!("the state table {}", config.table),
                    message: format!("state.connection_string: {error}"),
                }
            })?;
        let options = pool.connect_options();
        let server = format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        );
        let store = Self {
            pool,
            leases: format!("{}_leases", config.table),
            table: config.table.clone(),
            holder: holder_name(&config.instance_id),
            lease_duration: config.lease_duration,
            held: Mutex::new(HashMap::new()),
            schema: OnceCell::new(),
            server,
        };
        match store.ensure_schema().await {
            Ok(()) => {}
            Err(StateError::Database { message, .. }) if !store.reachable().await => {
                tracing::warn!(server = %store.server, %message, "the postgres state store does not answer yet; sources wait in standby until it does");
            }
            Err(error) => return Err(error),
        }
        Ok(store)
    }

    /// The name this process holds leases under.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    async fn reachable(&self) -> bool {
        let probe = sqlx::query("SELECT 1").execute(&self.pool).await;
        match probe {
            Ok(_) => true,
            Err(error) => {
                let error = with_connect_cause(&self.pool, error).await;
                !is_transient(&error)
            }
        }
    }

    async fn ensure_schema(&self) -> Result<(), StateError> {
        self.schema
            .get_or_try_init(|| async {
                // Instances starting together would race on CREATE TABLE IF
                // NOT EXISTS (a unique violation in pg_type): one at a time.
                let mut transaction = self.pool.begin().await.map_err(|error| self.failed("create", error))?;
                for statement in [
                    "SELECT pg_advisory_xact_lock(hashtext('iggy-connect state schema'))".to_owned(),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (key TEXT PRIMARY KEY, connector TEXT NOT NULL, \
                         data BYTEA NOT NULL, epoch BIGINT NOT NULL, holder TEXT NOT NULL, \
                         updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                        self.table
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (key TEXT PRIMARY KEY, holder TEXT NOT NULL, \
                         epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
                        self.leases
                    ),
                ] {
                    sqlx::query(AssertSqlSafe(statement))
                        .execute(&mut *transaction)
                        .await
                        .map_err(|error| self.failed("create", error))?;
                }
                transaction.commit().await.map_err(|error| self.failed("create", error))
            })
            .await
            .map(|_| ())
    }

    fn failed(&self, action: &'static str, error: sqlx::Error) -> StateError {
        StateError::Database {
            action,
            location: format!("the state table {} on {}", self.table, self.server),
            message: describe(&error),
        }
    }

    async fn failed_with_cause(&self, action: &'static str, error: sqlx::Error) -> StateError {
        let error = with_connect_cause(&self.pool, error).await;
        self.failed(action, error)
    }

    fn epoch(&self, key: &str) -> Option<i64> {
        self.lock_held().get(key).copied()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn millis(&self) -> i64 {
        i64::try_from(self.lease_duration.as_millis()).unwrap_or(i64::MAX)
    }

    /// A save by this process under the lease it holds at `epoch`.
    async fn save_leased(
        &self,
        key: &str,
        state: &StoredState,
        epoch: i64,
    ) -> Result<(), StateError> {
        let statement = format!(
            "WITH lease AS (SELECT epoch FROM {leases} WHERE key = $1 AND holder = $2 AND epoch = $3 \
             AND expires_at > now() FOR SHARE) \
             INSERT INTO {table} AS state (key, connector, data, epoch, holder, updated_at) \
             SELECT $1, $4, $5, epoch, $2, now() FROM lease \
             ON CONFLICT (key) DO UPDATE SET connector = EXCLUDED.connector, data = EXCLUDED.data, \
             epoch = EXCLUDED.epoch, holder = EXCLUDED.holder, updated_at = now() \
             WHERE state.epoch <= EXCLUDED.epoch",
            leases = self.leases,
            table = self.table,
        );
        let written = sqlx::query(AssertSqlSafe(statement))
            .bind(key)
            .bind(&self.holder)
            .bind(epoch)
            .bind(&state.connector)
            .bind(&state.data)
            .execute(&self.pool)
            .await;
        match written {
            Ok(done) if done.rows_affected() == 1 => Ok(()),
            // The epoch stays until the engine releases the key: every later
            // save of the pipeline that lost the lease is refused the same way.
            Ok(_) => Err(StateError::LeaseLost {
                key: key.to_owned(),
            }),
            Err(error) => Err(self.failed_with_cause("save to", error).await),
        }
    }

    /// A change by an operator (no lease held here): refused while any
    /// instance holds a live lease on `key`. The lease row is locked for the
    /// change, so no instance takes the lease and loads the old state halfway.
    async fn change_unleased(
        &self,
        key: &str,
        state: Option<&StoredState>,
    ) -> Result<(), StateError> {
        let action = if state.is_some() { "save to" } else { "clear" };
        let fail = |error| self.failed(action, error);
        let mut transaction = self.pool.begin().await.map_err(fail)?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (key, holder, epoch, expires_at) VALUES ($1, '', 0, '-infinity') ON CONFLICT (key) DO NOTHING",
            self.leases
        )))
        .bind(key)
        .execute(&mut *transaction)
        .await
        .map_err(fail)?;
        let lease = sqlx::query(AssertSqlSafe(format!(
            "SELECT holder, epoch, expires_at > now() AS live FROM {} WHERE key = $1 FOR UPDATE",
            self.leases
        )))
        .bind(key)
        .fetch_one(&mut *transaction)
        .await
        .map_err(fail)?;
        if lease.get::<bool, _>("live") {
            return Err(StateError::Leased {
                key: key.to_owned(),
                holder: lease.get("holder"),
            });
        }
        let epoch: i64 = lease.get("epoch");
        let change = match state {
            Some(state) => sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (key, connector, data, epoch, holder, updated_at) VALUES ($1, $2, $3, $4, $5, now()) \
                 ON CONFLICT (key) DO UPDATE SET connector = EXCLUDED.connector, data = EXCLUDED.data, \
                 epoch = EXCLUDED.epoch, holder = EXCLUDED.holder, updated_at = now()",
                self.table
            )))
            .bind(key)
            .bind(&state.connector)
            .bind(&state.data)
            .bind(epoch)
            .bind(OPERATOR),
            None => sqlx::query(AssertSqlSafe(format!("DELETE FROM {} WHERE key = $1", self.table))).bind(key),
        };
        change.execute(&mut *transaction).await.map_err(fail)?;
        transaction.commit().await.map_err(fail)
    }
}

#[async_trait]
impl StateStore for PostgresStateStore {
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError> {
        self.ensure_schema().await?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT connector, data FROM {} WHERE key = $1",
            self.table
        )))
        .bind(key)
        .fetch_optional(&self.pool)
        .await;
        match row {
            Ok(row) => Ok(row.map(|row| StoredState {
                connector: row.get("connector"),
                data: row.get("data"),
            })),
            Err(error) => Err(self.failed_with_cause("read", error).await),
        }
    }

    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError> {
        self.ensure_schema().await?;
        match self.epoch(key) {
            Some(epoch) => self.save_leased(key, state, epoch).await,
            None => self.change_unleased(key, Some(state)).await,
        }
    }

    async fn clear(&self, key: &str) -> Result<(), StateError> {
        self.ensure_schema().await?;
        if self.epoch(key).is_some() {
            return Err(StateError::Leased {
                key: key.to_owned(),
                holder: self.holder.clone(),
            });
        }
        self.change_unleased(key, None).await
    }

    fn location(&self, key: &str) -> String {
        format!(
            "row \"{key}\" of the state table {} on {}",
            self.table, self.server
        )
    }

    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }
}

#[async_trait]
impl Leases for PostgresStateStore {
    async fn acquire(&self, key: &str) -> Result<Acquired, StateError> {
        self.ensure_schema().await?;
        let taken = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "INSERT INTO {leases} AS lease (key, holder, epoch, expires_at) \
             VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond') \
             ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, epoch = lease.epoch + 1, \
             expires_at = EXCLUDED.expires_at \
             WHERE lease.expires_at <= now() \
             RETURNING epoch",
            leases = self.leases
        )))
        .bind(key)
        .bind(&self.holder)
        .bind(self.millis())
        .fetch_optional(&self.pool)
        .await;
        match taken {
            Ok(Some(epoch)) => {
                self.lock_held().insert(key.to_owned(), epoch);
                Ok(Acquired::Taken)
            }
            Ok(None) => {
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT holder, GREATEST(EXTRACT(EPOCH FROM expires_at - now()), 0)::float8 AS left_s FROM {} WHERE key = $1",
                    self.leases
                )))
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(|error| self.failed("read", error))?;
                // Released between the two statements: the next attempt takes it.
                Ok(match row {
                    Some(row) => Acquired::HeldBy {
                        holder: row.get("holder"),
                        expires_in: Duration::from_secs_f64(row.get::<f64, _>("left_s")),
                    },
                    None => Acquired::HeldBy {
                        holder: String::new(),
                        expires_in: Duration::ZERO,
                    },
                })
            }
            Err(error) => Err(self.failed_with_cause("take a lease in", error).await),
        }
    }

    async fn renew(&self, key: &str) -> Result<bool, StateError> {
        let Some(epoch) = self.epoch(key) else {
            return Ok(false);
        };
        let renewed = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET expires_at = now() + $4 * interval '1 millisecond' \
             WHERE key = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()",
            self.leases
        )))
        .bind(key)
        .bind(&self.holder)
        .bind(epoch)
        .bind(self.millis())
        .execute(&self.pool)
        .await;
        match renewed {
            Ok(done) if done.rows_affected() == 1 => Ok(true),
            Ok(_) => Ok(false),
            Err(error) => Err(self.failed_with_cause("renew a lease in", error).await),
        }
    }

    async fn release(&self, key: &str) -> Result<(), StateError> {
        let Some(epoch) = self.lock_held().remove(key) else {
            return Ok(());
        };
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET expires_at = '-infinity' WHERE key = $1 AND holder = $2 AND epoch = $3",
            self.leases
        )))
        .bind(key)
        .bind(&self.holder)
        .bind(epoch)
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(|error| self.failed("release a lease in", error))
    }

    fn duration(&self) -> Duration {
        self.lease_duration
    }
}

/// `{instance_id}/{8 hex digits}`; the instance id defaults to the host name
/// (a pod's name on Kubernetes) and the process id.
fn holder_name(instance_id: &str) -> String {
    let instance = match instance_id.trim() {
        "" => {
            let host = std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
                .or_else(|| {
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .ok()
                        .map(|name| name.trim().to_owned())
                })
                .unwrap_or_else(|| "iggy-connect".into());
            format!("{host}:{}", std::process::id())
        }
        given => given.to_owned(),
    };
    format!("{instance}/{:08x}", rand::random::<u32>())
}

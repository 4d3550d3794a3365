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
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;

use crate::config::ConfigIssue;
use crate::config::env::Kind;
use crate::config::state::{StateConfig, StateField, StateKind};
use crate::connectors::postgres::{describe, is_transient, lazy_pool, with_connect_cause};
use crate::state::{Acquired, Backend, Leases, StateError, StateStore, StoredState};

inventory::submit!(StateKind {
    name: "postgres",
    feature: "postgres-state",
    fields: &[
        StateField::new("connection_string", Kind::Str),
        StateField::new("table", Kind::Str),
        StateField::new("lease_duration", Kind::Str),
        StateField::new("instance_id", Kind::Str),
    ],
    check,
});

inventory::submit!(Backend {
    kind: "postgres",
    open: |config| {
        Box::pin(async move {
            let store: std::sync::Arc<dyn StateStore> =
                std::sync::Arc::new(PostgresStateStore::open(config).await?);
            Ok(store)
        })
    },
});

/// `[state]` with `type = "postgres"`: its fields sit beside `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct PostgresStateConfig {
    /// The database: a `postgres://` or `postgresql://` URL.
    pub connection_string: SecretString,
    /// The state table; its leases live in `{table}_leases`.
    pub table: String,
    /// How long a source's lease lasts without renewal: a standby takes over
    /// a dead instance's sources this long after its last renewal.
    #[serde(with = "crate::config::duration")]
    pub lease_duration: Duration,
    /// Names this instance in the leases it holds (with a random suffix per
    /// start); the host name and process id when empty.
    pub instance_id: String,
}

impl Default for PostgresStateConfig {
    fn default() -> Self {
        Self {
            connection_string: SecretString::from(""),
            table: "iggy_connect_state".into(),
            lease_duration: Duration::from_secs(15),
            instance_id: String::new(),
        }
    }
}

/// Every field of the postgres store that is missing or malformed.
fn check(state: &StateConfig, file: &Path) -> Vec<ConfigIssue> {
    let config: PostgresStateConfig = match state.read(file) {
        Ok(config) => config,
        Err(issue) => return vec![issue],
    };
    let mut issues = Vec::new();
    if config.connection_string.expose_secret().trim().is_empty() {
        issues.push(ConfigIssue::error(
            file,
            "state.connection_string",
            "missing, expected a postgres:// URL (type = \"postgres\" keeps source state in that database)",
        ));
    } else if let Err(error) =
        crate::connectors::postgres::check_connection_string(&config.connection_string)
    {
        issues.push(ConfigIssue::error(
            file,
            "state.connection_string",
            error.message,
        ));
    }
    if !is_table_name(&config.table) {
        issues.push(ConfigIssue::error(
            file,
            "state.table",
            format!(
                "\"{}\" is not a table name: expected letters, digits and underscores, optionally schema-qualified (schema.table)",
                config.table
            ),
        ));
    }
    if config.lease_duration < Duration::from_secs(2) {
        issues.push(ConfigIssue::error(
            file,
            "state.lease_duration",
            "expected at least 2s (a lease is renewed every third of it)",
        ));
    }
    issues
}

/// `name` or `schema.name`, each part an unquoted SQL identifier.
fn is_table_name(table: &str) -> bool {
    let parts: Vec<&str> = table.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|part| {
            part.len() <= 50
                && part.starts_with(|character: char| {
                    character.is_ascii_alphabetic() || character == '_'
                })
                && part
                    .chars()
                    .all(|character| character.is_ascii_alphanumeric() || character == '_')
        })
}

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
    pub async fn open(state: &StateConfig) -> Result<Self, StateError> {
        let config: PostgresStateConfig = state
            .settings()
            .map_err(|error| StateError::Unavailable(error.to_string()))?;
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::RuntimeConfig;
    use crate::config::env::EnvVars;

    /// `config.toml` holding `state` after a `[connectors]` table, in a new
    /// directory with an empty `connectors` directory.
    fn runtime_file(state: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("connectors")).unwrap();
        let path = dir.path().join("config.toml");
        let text = format!(
            "[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n{state}",
            dir.path().join("connectors").display()
        );
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn error_fields(path: &Path, vars: &EnvVars) -> Vec<ConfigIssue> {
        match RuntimeConfig::load(path, vars) {
            Ok((_, issues)) => issues,
            Err(found) => found.0,
        }
        .into_iter()
        .filter(ConfigIssue::is_error)
        .collect()
    }

    #[test]
    fn given_a_postgres_state_store_without_its_settings_when_loaded_should_name_each_field() {
        let (_dir, path) = runtime_file(
            "[state]\ntype = \"postgres\"\ntable = \"bad-name\"\nlease_duration = \"1s\"\n",
        );
        let fields: Vec<String> = error_fields(&path, &EnvVars::default())
            .into_iter()
            .map(|issue| issue.field)
            .collect();
        assert_eq!(
            fields,
            [
                "state.connection_string",
                "state.table",
                "state.lease_duration"
            ]
        );
        let (_dir, path) =
            runtime_file("[state]\ntype = \"postgres\"\nconnection_string = \"mysql://u@db/x\"\n");
        let issues = error_fields(&path, &EnvVars::default());
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].field, "state.connection_string");
        assert!(issues[0].message.contains("postgres://"), "{issues:?}");
        let (_dir, path) = runtime_file("[state]\ntype = \"postgres\"\nlease_duration = 5\n");
        let issues = error_fields(&path, &EnvVars::default());
        assert_eq!(issues[0].field, "state.lease_duration", "{issues:?}");
    }

    #[test]
    fn given_a_postgres_state_store_from_the_environment_when_loaded_should_take_it() {
        let (_dir, path) = runtime_file("");
        let vars = EnvVars::from_pairs(
            [
                ("IGGY_CONNECTORS_STATE_TYPE", "postgres"),
                (
                    "IGGY_CONNECTORS_STATE_CONNECTION_STRING",
                    "postgres://user:secret@db:5432/state",
                ),
                ("IGGY_CONNECTORS_STATE_LEASE_DURATION", "30s"),
                ("IGGY_CONNECTORS_STATE_INSTANCE_ID", "pod-1"),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned())),
        );
        let (config, issues) = RuntimeConfig::load(&path, &vars).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(config.state.kind, "postgres");
        let settings: PostgresStateConfig = config.state.settings().unwrap();
        assert_eq!(settings.lease_duration, Duration::from_secs(30));
        assert_eq!(settings.instance_id, "pod-1");
        assert_eq!(settings.table, "iggy_connect_state");
        assert_eq!(
            settings.connection_string.expose_secret(),
            "postgres://user:secret@db:5432/state"
        );
    }

    #[test]
    fn given_a_misspelt_postgres_field_when_loaded_should_name_the_nearest() {
        let (_dir, path) = runtime_file(
            "[state]\ntype = \"postgres\"\nconnection_string = \"postgres://h/db\"\nlease_duraton = \"5s\"\n",
        );
        let issues = error_fields(&path, &EnvVars::default());
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].field, "state.lease_duraton");
        assert!(
            issues[0].message.contains("did you mean `lease_duration`?"),
            "{issues:?}"
        );
    }
}

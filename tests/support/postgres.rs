//! Shared helpers of the PostgreSQL integration tests: the server comes from
//! `scripts/with-postgres.sh`, every test uses its own tables (or database).
#![cfg(any(
    feature = "postgres-source",
    feature = "postgres-sink",
    feature = "postgres-state"
))]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::{ConnectorConfig, parse_connector_file};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::engine::runtime::ConnectorView;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::StateStore;
use serde_json::Value;
use sqlx::postgres::{PgPool, PgPoolOptions};

/// Polls an async condition until it holds, failing the test after `timeout`.
pub use super::wait::eventually as wait_for;

pub const URL_VARIABLE: &str = "IGGY_CONNECT_TEST_POSTGRES_URL";

/// The test server's URL. Missing means the tests were not started through
/// the script: that is a failure, not a skip.
pub fn database_url() -> String {
    std::env::var(URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{URL_VARIABLE} is not set: run the PostgreSQL tests through scripts/with-postgres.sh, \
             e.g. `scripts/with-postgres.sh cargo nextest run --features postgres-source,postgres-sink --test it -E 'test(/^postgres_source::/)'`"
        )
    })
}

pub async fn connect(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .unwrap_or_else(|error| panic!("cannot connect to the test PostgreSQL at {url}: {error}"))
}

/// A name no other test (or run) uses: prefix, process id, counter.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        rand_suffix()
    )
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    nanos % 100_000
}

/// A fresh database of its own, for tests that kill connections.
pub async fn create_database(admin: &PgPool) -> String {
    let name = unique("iggy_db");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin)
        .await
        .unwrap();
    let base = database_url();
    let (prefix, _) = base.rsplit_once('/').unwrap();
    format!("{prefix}/{name}")
}

pub async fn execute(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// A source connector file with one stream.
pub fn source_config(
    key: &str,
    stream: &str,
    topic: &str,
    schema: &str,
    plugin_config: &str,
) -> ConnectorConfig {
    parse(&format!(
        "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"postgres\"\n\
         max_consecutive_nacks = 0\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopic = \"{topic}\"\nschema = \"{schema}\"\n\n\
         [plugin_config]\n{plugin_config}\n"
    ))
}

/// A sink connector file reading one topic.
pub fn sink_config(
    key: &str,
    stream: &str,
    topic: &str,
    schema: &str,
    on_error: &str,
    plugin_config: &str,
) -> ConnectorConfig {
    parse(&format!(
        "type = \"sink\"\nkey = \"{key}\"\nenabled = true\npath = \"postgres\"\non_error = \"{on_error}\"\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopics = [\"{topic}\"]\nschema = \"{schema}\"\n\
         batch_length = 100\npoll_interval = \"5ms\"\n\n\
         [plugin_config]\n{plugin_config}\n"
    ))
}

fn parse(text: &str) -> ConnectorConfig {
    match parse_connector_file(
        Path::new("test.toml"),
        text,
        &EnvVars::from_pairs(Vec::new()),
    ) {
        Ok((config, _)) => config,
        Err(issues) => panic!("bad test config: {issues:?}\n{text}"),
    }
}

/// One source connector running on a memory bus, and what it delivered to
/// its topic.
pub struct Pipeline {
    pub runtime: Arc<Runtime>,
    pub bus: MemoryBus,
    pub key: String,
    pub stream: String,
    topic: &'static str,
}

impl Pipeline {
    /// Starts source `key` writing to `topic` of stream `{key}_stream`.
    pub async fn launch(
        key: String,
        topic: &'static str,
        schema: &str,
        plugin_config: &str,
        bus: MemoryBus,
        state: Arc<dyn StateStore>,
    ) -> Self {
        let stream = format!("{key}_stream");
        let runtime = Runtime::new(Arc::new(bus.clone()), state, Duration::from_secs(5));
        runtime
            .add(source_config(&key, &stream, topic, schema, plugin_config))
            .unwrap();
        runtime.start_enabled().await;
        Self {
            runtime,
            bus,
            key,
            stream,
            topic,
        }
    }

    /// Every delivered payload, as JSON, in delivery order.
    pub fn payloads(&self) -> Vec<Value> {
        self.bus
            .messages(&self.stream, self.topic)
            .iter()
            .map(|message| serde_json::from_slice(&message.payload).unwrap())
            .collect()
    }

    pub async fn wait_for_count(&self, expected: usize) {
        let what = format!("{expected} messages on {}", self.stream);
        wait_for(&what, Duration::from_secs(30), || async {
            self.bus.messages(&self.stream, self.topic).len() >= expected
        })
        .await;
    }

    pub fn view(&self) -> ConnectorView {
        self.runtime.view(ConnectorKind::Source, &self.key).unwrap()
    }
}

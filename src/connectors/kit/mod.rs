//! The connector kit: pieces every connector would otherwise write again.
//!
//! - [`backoff`]: capped exponential backoff with jitter (the engine's too);
//! - [`breaker`]: a circuit breaker for an endpoint that keeps failing;
//! - [`failure`]: one request's failure, classified (transient with an
//!   optional wait, refused, fatal), and the engine errors it becomes;
//! - [`batch`]: one request body from many encoded items, split by count and bytes;
//! - [`outcome`]: a write's answer per message, gathered over the requests
//!   of a batch, and the `SinkError` it makes;
//! - `row_id` (with the SQL sources): deterministic ids of database rows, snake_case columns;
//! - `sql` (with the SQL connectors): the open-time check, pool timeouts explained
//!   by their cause, client errors worth retrying, a sink's payload bytes;
//! - `cdc` (with the SQL sources): change kinds, the snapshot setting and the
//!   `DatabaseRecord` envelope of their change-data-capture modes;
//! - `sql_poll` (with the SQL sources): the polling core (cursor state, staged
//!   batches, caught-up and finish logic) and the config pieces they share;
//! - `row_id` (with the SQL and rabbitmq sources): deterministic ids of database rows
//!   and of keyed records, snake_case columns;
//! - `inbox` (with the push sources: http, otlp): where received requests wait
//!   for their batch and the answers owed to their clients once it is durable;
//! - `lake` (with the lakehouse sinks: delta, iceberg): the columns of a
//!   table they create, the flush triggers, JSON payloads into Arrow rows of
//!   a table's schema with the misfits rejected by index;
//! - [`size`]: sizes in config files (`"8MiB"`), for the file-writing sinks;
//! - `http` (with any HTTP-based connector): the HTTP client builder (TLS,
//!   timeouts, proxy, auth, gzip), `Retry-After` parsing, status classification
//!   and `exchange`, one request sent and its answer read (`exchange_whole`
//!   for an answer that must be read to its end).

pub mod backoff;
pub mod batch;
pub mod breaker;
#[cfg(any(feature = "postgres-source", feature = "mysql-source"))]
pub mod cdc;
pub mod failure;
#[cfg(feature = "kit-http")]
pub mod http;
#[cfg(any(feature = "http-source", feature = "otlp-source"))]
pub mod inbox;
#[cfg(any(feature = "delta-sink", feature = "iceberg-sink"))]
pub mod lake;
pub mod outcome;
#[cfg(any(
    feature = "postgres-source",
    feature = "mysql-source",
    feature = "rabbitmq-source"
))]
pub mod row_id;
pub mod size;
#[cfg(any(
    feature = "postgres-source",
    feature = "postgres-sink",
    feature = "postgres-state",
    feature = "mysql-source",
    feature = "mysql-sink"
))]
pub mod sql;
#[cfg(any(feature = "postgres-source", feature = "mysql-source"))]
pub mod sql_poll;

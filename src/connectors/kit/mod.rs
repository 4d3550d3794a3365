//! The connector kit: pieces every connector would otherwise write again. It
//! names no backend: the optional pieces (`sql`, `cdc`, ...) come with a
//! `kit-*` cargo feature that a connector's feature enables.
//!
//! - [`backoff`]: capped exponential backoff with jitter (the engine's too);
//! - [`breaker`]: a circuit breaker for an endpoint that keeps failing;
//! - [`crypto`]: rustls's process-wide provider, for client crates that need one;
//! - [`failure`]: one request's failure, classified (transient with an
//!   optional wait, refused, fatal), and the engine errors it becomes;
//! - [`batch`]: one request body from many encoded items, split by count and bytes;
//! - [`outcome`]: a write's answer per message, gathered over the requests
//!   of a batch, and the `SinkError` it makes;
//! - `sql` (with the SQL connectors): the open-time check, pool timeouts explained
//!   by their cause, client errors worth retrying, a sink's payload bytes;
//! - `cdc` (with the SQL sources): change kinds, the snapshot setting and the
//!   `DatabaseRecord` envelope of their change-data-capture modes;
//! - `sql_poll` (with the SQL sources): the polling core (cursor state, staged
//!   batches, caught-up and finish logic) and the config pieces they share;
//! - `row_id`: deterministic ids of database rows and of keyed records,
//!   snake_case columns;
//! - `inbox` (for push sources): where received requests wait
//!   for their batch and the answers owed to their clients once it is durable;
//! - `lake` (for lakehouse sinks): the columns of a
//!   table they create, the flush triggers, JSON payloads into Arrow rows of
//!   a table's schema with the misfits rejected by index;
//! - [`listener`]: an HTTP server's connection limit and timeouts (the push
//!   sources' listeners and the control API);
//! - `http` (with any HTTP-based connector): the HTTP client builder (TLS,
//!   timeouts, proxy, auth, gzip), `Retry-After` parsing, status classification
//!   and `exchange`, one request sent and its answer read (`exchange_whole`
//!   for an answer that must be read to its end);
//! - `json_line` (for the s3 and file sinks): a payload and a header value
//!   as JSON on one line;
//! - `store` (for the connectors that read or write objects): an
//!   `object_store` store from a URL and its options, and the store errors
//!   no retry fixes;
//! - `tls` (for clients taking a rustls config): the config from `ca_file`,
//!   `cert_file`, `key_file` and `tls_verify`, and which refused certificate
//!   a failed handshake means.

pub mod backoff;
pub mod batch;
pub mod breaker;
#[cfg(feature = "kit-cdc")]
pub mod cdc;
pub mod crypto;
pub mod failure;
#[cfg(feature = "kit-http")]
pub mod http;
#[cfg(feature = "kit-inbox")]
pub mod inbox;
#[cfg(any(feature = "s3-sink", feature = "file-sink"))]
pub mod json_line;
#[cfg(feature = "kit-lake")]
pub mod lake;
pub mod listener;
pub mod outcome;
#[cfg(feature = "kit-row-id")]
pub mod row_id;
#[cfg(feature = "kit-sql")]
pub mod sql;
#[cfg(feature = "kit-sql-poll")]
pub mod sql_poll;
#[cfg(feature = "kit-store")]
pub mod store;
#[cfg(feature = "kit-tls")]
pub mod tls;

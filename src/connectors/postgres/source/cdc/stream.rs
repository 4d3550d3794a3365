//! The replication connection of `mode = "cdc"`: `START_REPLICATION SLOT ..
//! LOGICAL <lsn>` over `pgwire-replication`, read a batch of changes at a
//! time.
//!
//! The connection is opened at the position after the last batch handed out
//! and stays open across polls, so each change is decoded once. A batch ends
//! at `batch_size` changes, inside a transaction too: its state then names
//! the transaction and how many of its changes were handed out
//! ([`Partial`]), and the LSN stays at the end of the transaction before, so
//! the slot moves past a transaction only with its last batch. What it
//! reports to the server (write, flush and apply in every standby status
//! update, and the answer to a keepalive that asks for one) is only ever the
//! last committed LSN: the source raises it in `commit`, and the poll that
//! holds the connection passes it on. A NACK or a lost connection drops the
//! connection; the next poll opens a new one at the right position.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{
    Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use tokio::sync::watch;
use tokio::time::Instant;

use super::pgoutput::{self, Message, OldTuple, Relation, Value};
use super::{CdcError, CdcState, HEARTBEAT_PREFIX, Partial, XidSnapshot, rfc3339};
use crate::connectors::postgres::source::config::Operation;

/// How long a poll waits for the server to send what was committed before
/// it began, between transactions; then it returns what it has.
const READ_WAIT: Duration = Duration::from_millis(500);
/// Inside a transaction the server sends the next message at once (it sends
/// committed transactions only): this long without one is a stalled stream.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long opening the stream may take (connect, authenticate, start).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the committed position reaches the server when it moved.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// What the values' text output depends on, set as sqlx sets it on the SQL
/// connections: the changes' values arrive as a polled row's would.
const SESSION_SETTINGS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=2";

/// An open replication stream and what it learnt so far.
pub(super) struct Stream {
    client: ReplicationClient,
    /// pgoutput sends a relation once per connection (and again when it
    /// changes): kept for the whole connection.
    pub relations: HashMap<u32, Relation>,
    /// How far the server has sent WAL: the last commit's end, a
    /// keepalive's `wal_end`, a heartbeat's position.
    position: u64,
    /// The transaction a batch ended inside of: the next read goes on with
    /// it.
    transaction: Option<Txn>,
}

/// What one poll read: whole transactions, the last one cut at the batch's
/// size when it is larger (`next.partial`).
pub(super) struct Batch {
    pub changes: Vec<Change>,
    pub next: CdcState,
    /// Stopped at `batch_size`, not because it caught up.
    pub full: bool,
}

/// One row change (or one truncated table) of a transaction.
pub(super) struct Change {
    pub relation: u32,
    pub operation: Operation,
    pub new: Option<Vec<Value>>,
    pub old: Option<OldTuple>,
    pub final_lsn: u64,
    /// The commit time, shared by the transaction's changes.
    pub timestamp: Arc<str>,
    pub position: u32,
}

/// Where the replication connection goes, from the source's
/// `connection_string` (a `postgres://` URL): host or socket, port, user,
/// password (from the URL or `PGPASSWORD`), database, `sslmode` and its
/// certificates, `options`.
pub(super) fn replication_config(
    connection_string: &SecretString,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, CdcError> {
    let text = connection_string.expose_secret();
    let options = PgConnectOptions::from_str(text).map_err(CdcError::ConnectionString)?;
    let url = url::Url::parse(text).ok();
    let parameter = |names: &[&str]| {
        url.as_ref().and_then(|url| {
            url.query_pairs()
                .find(|(key, _)| names.contains(&key.as_ref()))
                .map(|(_, value)| value.into_owned())
        })
    };
    let password = url
        .as_ref()
        .and_then(|url| url.password())
        .map(|password| {
            percent_encoding::percent_decode_str(password)
                .decode_utf8_lossy()
                .into_owned()
        })
        .or_else(|| parameter(&["password"]))
        .or_else(|| std::env::var("PGPASSWORD").ok())
        .unwrap_or_default();
    let user = options.get_username().to_owned();
    let database = options.get_database().unwrap_or(&user).to_owned();
    let mut config = match options.get_socket() {
        Some(directory) => ReplicationConfig::unix(
            directory.to_string_lossy(),
            options.get_port(),
            user,
            password,
            database,
            slot,
            publication,
        ),
        None => ReplicationConfig::new(
            options.get_host(),
            user,
            password,
            database,
            slot,
            publication,
        )
        .with_port(options.get_port())
        .with_tls(tls_config(
            options.get_ssl_mode(),
            parameter(&["sslrootcert", "ssl-root-cert", "ssl-ca"])
                .or_else(|| std::env::var("PGSSLROOTCERT").ok()),
            parameter(&["sslcert", "ssl-cert"]).zip(parameter(&["sslkey", "ssl-key"])),
        )),
    };
    // The text output the local rendering reads (`render.rs`): the SQL
    // connections' settings; the connection string's own come after and win.
    config = config.with_options(match options.get_options() {
        Some(session_options) => format!("{SESSION_SETTINGS} {session_options}"),
        None => SESSION_SETTINGS.to_owned(),
    });
    Ok(config
        .with_status_interval(STATUS_INTERVAL)
        .with_application_name(format!("iggy-connect {slot}")))
}

/// sqlx's `sslmode` as the replication client takes it. `allow` tries
/// without TLS first; the replication client has no second attempt.
fn tls_config(
    mode: PgSslMode,
    root_certificate: Option<String>,
    client_certificate: Option<(String, String)>,
) -> TlsConfig {
    let root = root_certificate.map(PathBuf::from);
    let tls = match mode {
        PgSslMode::Disable | PgSslMode::Allow => return TlsConfig::disabled(),
        PgSslMode::Prefer => TlsConfig {
            mode: pgwire_replication::SslMode::Prefer,
            ..TlsConfig::default()
        },
        // sqlx verifies the CA under `require` when a root certificate is given.
        PgSslMode::Require if root.is_some() => TlsConfig::verify_ca(root),
        PgSslMode::Require => TlsConfig::require(),
        PgSslMode::VerifyCa => TlsConfig::verify_ca(root),
        PgSslMode::VerifyFull => TlsConfig::verify_full(root),
    };
    match client_certificate {
        Some((certificate, key)) => tls.with_client_cert(certificate, key),
        None => tls,
    }
}

impl Stream {
    /// Starts replication at `start` (0: the slot's confirmed position),
    /// reporting `acknowledged` until the source commits more. A slot still
    /// held by the walsender of a connection just closed (SQLSTATE 55006) is
    /// a transient error: the engine polls again after its backoff.
    pub async fn open(
        config: ReplicationConfig,
        start: u64,
        acknowledged: u64,
    ) -> Result<Self, CdcError> {
        let slot = config.slot.clone();
        let config = config
            .with_start_lsn(Lsn::from_u64(start))
            .with_ack_lsn(Lsn::from_u64(acknowledged));
        let replication = |source| CdcError::Replication {
            slot: slot.clone(),
            source,
        };
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(replication)?;
        match tokio::time::timeout(START_TIMEOUT, client.wait_started()).await {
            Ok(Ok(())) => Ok(Self {
                client,
                relations: HashMap::new(),
                position: start.max(acknowledged),
                transaction: None,
            }),
            Ok(Err(error)) => Err(replication(error)),
            Err(_) => Err(CdcError::Stalled {
                slot,
                what: "starting replication",
            }),
        }
    }

    /// Whether the stream has not read up to `lsn` yet.
    pub fn before(&self, lsn: u64) -> bool {
        self.position < lsn
    }

    /// Reads the changes after `base` until `limit` changes are read or the
    /// stream has passed `target` (the WAL flushed when the poll began),
    /// waiting at most [`READ_WAIT`] between transactions; it stops inside a
    /// transaction only at `limit`. Transactions that end at or before
    /// `base.lsn` (delivered), the changes of `base.partial` already handed
    /// out, and the transactions the initial snapshot saw are skipped.
    /// Commits made meanwhile (`committed`) are passed on to the server.
    pub async fn read(
        &mut self,
        base: &CdcState,
        target: u64,
        limit: usize,
        committed: &mut watch::Receiver<u64>,
    ) -> Result<Batch, CdcError> {
        let slot = base.slot.clone();
        self.client
            .update_applied_lsn(Lsn::from_u64(*committed.borrow_and_update()));
        let visible = base
            .snapshot
            .as_ref()
            .and_then(|progress| progress.visible.as_deref())
            .and_then(XidSnapshot::parse);
        let mut next = base.clone();
        let mut changes: Vec<Change> = Vec::with_capacity(limit.min(4096));
        let mut transaction = self.transaction.take();
        if let Some(current) = transaction.as_mut() {
            current.first_change = 0;
        }
        let deadline = Instant::now() + READ_WAIT;
        let mut acknowledging = true;
        loop {
            let wait_until = match &transaction {
                _ if changes.len() >= limit => {
                    if let Some(current) = &transaction {
                        next.partial = Some(Partial {
                            final_lsn: current.final_lsn,
                            delivered: current.position,
                        });
                    }
                    self.transaction = transaction;
                    return Ok(Batch {
                        changes,
                        next,
                        full: true,
                    });
                }
                // Caught up: only what is there already, so that a broken
                // connection shows on an idle stream too.
                None if self.position >= target => Instant::now(),
                None => deadline,
                Some(_) => Instant::now() + STALL_TIMEOUT,
            };
            let event = tokio::select! {
                changed = committed.changed(), if acknowledging => {
                    match changed {
                        Ok(()) => self
                            .client
                            .update_applied_lsn(Lsn::from_u64(*committed.borrow_and_update())),
                        Err(_) => acknowledging = false,
                    }
                    continue;
                }
                event = tokio::time::timeout_at(wait_until, self.client.recv()) => event,
            };
            let event = match event {
                Err(_) if transaction.is_none() => break,
                Err(_) => {
                    return Err(CdcError::Stalled {
                        slot,
                        what: "reading a transaction",
                    });
                }
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => return Err(CdcError::StreamEnded { slot }),
                Ok(Err(source)) => return Err(CdcError::Replication { slot, source }),
            };
            let message = match event {
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    if transaction.is_none() {
                        self.position = self.position.max(wal_end.as_u64());
                    }
                    continue;
                }
                ReplicationEvent::Begin {
                    final_lsn,
                    xid,
                    commit_time_micros,
                } => Message::Begin {
                    final_lsn: final_lsn.as_u64(),
                    timestamp: commit_time_micros,
                    xid,
                },
                ReplicationEvent::Commit {
                    lsn,
                    end_lsn,
                    commit_time_micros,
                } => Message::Commit {
                    commit_lsn: lsn.as_u64(),
                    end_lsn: end_lsn.as_u64(),
                    timestamp: commit_time_micros,
                },
                ReplicationEvent::Message {
                    transactional,
                    lsn,
                    prefix,
                    ..
                } => Message::Logical {
                    transactional,
                    lsn: lsn.as_u64(),
                    prefix,
                },
                ReplicationEvent::XLogData { data, .. } => {
                    pgoutput::decode(&data).map_err(|source| CdcError::Decode {
                        slot: slot.clone(),
                        source,
                    })?
                }
                ReplicationEvent::StoppedAt { .. } => return Err(CdcError::StreamEnded { slot }),
            };
            self.apply(
                message,
                base,
                visible.as_ref(),
                &mut next,
                &mut transaction,
                &mut changes,
            );
        }
        Ok(Batch {
            changes,
            next,
            full: false,
        })
    }

    /// One decoded message: the batch's transactions, state and relations.
    fn apply(
        &mut self,
        message: Message,
        base: &CdcState,
        visible: Option<&XidSnapshot>,
        next: &mut CdcState,
        transaction: &mut Option<Txn>,
        changes: &mut Vec<Change>,
    ) {
        match message {
            Message::Begin {
                final_lsn,
                timestamp,
                xid,
            } => {
                let delivered = final_lsn < base.lsn;
                // Cut by an earlier batch: its first changes were handed out.
                let handed_out = base
                    .partial
                    .as_ref()
                    .filter(|partial| partial.final_lsn == final_lsn)
                    .map_or(0, |partial| partial.delivered);
                let filtering = next
                    .snapshot
                    .as_ref()
                    .is_some_and(|progress| progress.visible.is_some());
                let in_snapshot = filtering && visible.is_some_and(|snapshot| snapshot.sees(xid));
                if filtering
                    && !delivered
                    && !in_snapshot
                    && let Some(progress) = next.snapshot.as_mut()
                {
                    // Commit order: nothing after this one is in the snapshot.
                    progress.visible = None;
                }
                *transaction = Some(Txn {
                    final_lsn,
                    timestamp: rfc3339(timestamp).into(),
                    skip: delivered || in_snapshot,
                    handed_out,
                    position: 0,
                    first_change: changes.len(),
                });
            }
            Message::Commit { end_lsn, .. } => {
                self.position = self.position.max(end_lsn);
                if let Some(done) = transaction.take() {
                    if done.skip {
                        changes.truncate(done.first_change);
                    }
                    next.lsn = next.lsn.max(end_lsn);
                    next.partial = None;
                }
            }
            Message::Relation(relation) => {
                self.relations.insert(relation.id, relation);
            }
            Message::Insert { relation, new } => {
                push_change(
                    transaction,
                    changes,
                    relation,
                    Operation::Insert,
                    Some(new),
                    None,
                );
            }
            Message::Update { relation, old, new } => {
                push_change(
                    transaction,
                    changes,
                    relation,
                    Operation::Update,
                    Some(new),
                    old,
                );
            }
            Message::Delete { relation, old } => {
                push_change(
                    transaction,
                    changes,
                    relation,
                    Operation::Delete,
                    None,
                    Some(old),
                );
            }
            Message::Truncate { relations } => {
                for relation in relations {
                    push_change(
                        transaction,
                        changes,
                        relation,
                        Operation::Truncate,
                        None,
                        None,
                    );
                }
            }
            Message::Logical {
                transactional: false,
                lsn,
                prefix,
            } if prefix == HEARTBEAT_PREFIX && transaction.is_none() => {
                // Every transaction committed before it was read above.
                self.position = self.position.max(lsn);
                next.lsn = next.lsn.max(lsn);
            }
            Message::Logical { .. } | Message::Other(_) => {}
        }
    }

    /// Ends the stream (CopyDone) and waits a little for the worker, so the
    /// walsender lets go of the slot soon.
    pub async fn close(self) {
        self.client.stop();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.join()).await;
    }
}

/// The transaction being decoded.
struct Txn {
    final_lsn: u64,
    timestamp: Arc<str>,
    skip: bool,
    /// Its changes before this position went out in earlier batches.
    handed_out: u32,
    /// The position of its next change.
    position: u32,
    first_change: usize,
}

fn push_change(
    transaction: &mut Option<Txn>,
    changes: &mut Vec<Change>,
    relation: u32,
    operation: Operation,
    new: Option<Vec<Value>>,
    old: Option<OldTuple>,
) {
    let Some(current) = transaction.as_mut() else {
        return;
    };
    let position = current.position;
    current.position += 1;
    if current.skip || position < current.handed_out {
        return;
    }
    changes.push(Change {
        relation,
        operation,
        new,
        old,
        final_lsn: current.final_lsn,
        timestamp: current.timestamp.clone(),
        position,
    });
}

/// The SQLSTATE of a server error (`... (SQLSTATE 55006)`).
pub(super) fn sqlstate(error: &PgWireError) -> Option<&str> {
    let PgWireError::Server(message) = error else {
        return None;
    };
    let (_, tail) = message.rsplit_once("(SQLSTATE ")?;
    tail.strip_suffix(')')
}

/// Whether reconnecting may help: the connection broke, the server is
/// shutting down or restarting, the slot is still held by an old walsender.
pub(super) fn is_transient_replication(error: &PgWireError) -> bool {
    if error.is_transient() {
        return true;
    }
    sqlstate(error).is_some_and(|code| {
        code == "55006"
            || code.starts_with("08")
            || code.starts_with("53")
            || code.starts_with("57")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> ReplicationConfig {
        replication_config(&SecretString::from(url.to_owned()), "slot_a", "\"pub\"").unwrap()
    }

    #[test]
    fn given_a_url_when_configured_should_take_host_port_user_password_database_and_options() {
        let config = config(
            "postgres://repl:p%40ss@db.example:6543/orders?sslmode=disable&options=-c%20wal_sender_timeout%3D1s",
        );
        assert_eq!(
            (config.host.as_str(), config.port, config.user.as_str()),
            ("db.example", 6543, "repl")
        );
        assert_eq!(
            (config.password.as_str(), config.database.as_str()),
            ("p@ss", "orders")
        );
        assert_eq!(config.tls, TlsConfig::disabled());
        assert_eq!(
            config.options.as_deref(),
            Some(
                "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=2 -c wal_sender_timeout=1s"
            )
        );
        assert_eq!(config.slot, "slot_a");
        assert_eq!(
            config.application_name.as_deref(),
            Some("iggy-connect slot_a")
        );
    }

    #[test]
    fn given_no_database_when_configured_should_use_the_user_name_as_postgresql_does() {
        let config = config("postgres://alice@localhost?sslmode=disable");
        assert_eq!(config.database, "alice");
        assert_eq!(config.port, 5432);
    }

    #[test]
    fn given_ssl_modes_when_configured_should_map_to_the_replication_client_modes() {
        use pgwire_replication::SslMode;
        let mode = |query: &str| config(&format!("postgres://u@h/d?{query}")).tls.mode;
        assert_eq!(mode(""), SslMode::Prefer, "sqlx's default");
        assert_eq!(mode("sslmode=allow"), SslMode::Disable);
        assert_eq!(mode("sslmode=require"), SslMode::Require);
        assert_eq!(
            mode("sslmode=require&sslrootcert=/ca.pem"),
            SslMode::VerifyCa
        );
        assert_eq!(mode("sslmode=verify-full"), SslMode::VerifyFull);
        let tls = config(
            "postgres://u@h/d?sslmode=verify-ca&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .tls;
        assert_eq!(tls.ca_pem_path, Some(PathBuf::from("/ca.pem")));
        assert!(tls.is_mtls());
    }

    #[test]
    fn given_server_errors_when_classified_should_retry_only_what_a_reconnect_can_fix() {
        let server = |message: &str| PgWireError::Server(message.to_owned());
        let busy = server("replication slot \"s\" is active for PID 7 (SQLSTATE 55006)");
        assert_eq!(sqlstate(&busy), Some("55006"));
        assert!(is_transient_replication(&busy));
        assert!(is_transient_replication(&server(
            "terminating connection due to administrator command (SQLSTATE 57P01)"
        )));
        assert!(is_transient_replication(&PgWireError::Io(
            std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        )));
        assert!(!is_transient_replication(&server(
            "replication slot \"s\" does not exist (SQLSTATE 42704)"
        )));
        assert!(!is_transient_replication(&PgWireError::Auth(
            "password authentication failed".into()
        )));
        assert_eq!(sqlstate(&server("no code")), None);
    }
}

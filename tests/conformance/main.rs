//! The connector conformance suite: the same checks for every connector, each
//! connector supplying only a small fixture (its backend: how to point the
//! connector at it, feed or read it back, and inject a fault).
//!
//! The tests are generated at run time: for every connector compiled into
//! this binary (the registry), every fixture registered under its name and
//! kind, every check of that kind: `postgres_sink::restore`,
//! `postgres_source_cdc::restore`, ... Run it (PostgreSQL comes from the
//! script):
//!   scripts/with-postgres.sh cargo nextest run --features full,faulty-sink --test conformance
//! One connector or one check: add `-E 'test(/postgres_sink::/)'` or
//! `-E 'test(restore)'`.
//!
//! Adding a connector: write `fixtures/<name>_<kind>.rs` (a `SourceBackend`
//! or `SinkBackend`) gated by an inner `#![cfg(feature = "...")]` with a
//! `source_fixture!`/`sink_fixture!` line, and its `mod` line in
//! `fixtures/mod.rs`; `every_registered_connector_has_a_fixture` fails until
//! you do. `self_tests.rs` runs every check against deliberately broken
//! connectors, proving each check can fail.

mod fixtures;
mod reference;
mod self_tests;
mod sink;
mod source;
#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::LocalBoxFuture;
use iggy_connect::connectors::{ConnectorKind, Registry};
use libtest_mimic::{Arguments, Failed, Trial};

use crate::sink::{SinkBackend, SinkSubject};
use crate::source::{SourceBackend, SourceSubject};

/// What a check found wrong, or `Ok`.
pub type Outcome = Result<(), String>;

/// One backend set-up for one connector: every check of the connector's kind
/// runs against a fresh backend made by it. A connector may have several
/// (postgres: cursor, delete, mark, cdc).
pub struct Fixture {
    /// The tests' module name: `postgres_sink` names `postgres_sink::restore`.
    pub name: &'static str,
    /// The registry name of the connector the fixture is for.
    pub connector: &'static str,
    pub backend: NewBackend,
}

/// Makes a fresh backend for one check, and says the connector's kind.
pub enum NewBackend {
    Source(fn() -> LocalBoxFuture<'static, Box<dyn SourceBackend>>),
    Sink(fn() -> LocalBoxFuture<'static, Box<dyn SinkBackend>>),
}

impl Fixture {
    fn kind(&self) -> ConnectorKind {
        match self.backend {
            NewBackend::Source(_) => ConnectorKind::Source,
            NewBackend::Sink(_) => ConnectorKind::Sink,
        }
    }
}

// Every fixture compiled in: each fixture file adds its own with
// [`source_fixture!`] or [`sink_fixture!`], as connectors register themselves.
inventory::collect!(Fixture);

/// Registers a source fixture: `source_fixture!(module_name, "connector", backend_expr)`,
/// the expression evaluated (it may `.await`) once per check.
#[macro_export]
macro_rules! source_fixture {
    ($name:ident, $connector:literal, $backend:expr) => {
        inventory::submit! {
            {
                fn new()
                -> futures::future::LocalBoxFuture<'static, Box<dyn $crate::source::SourceBackend>>
                {
                    Box::pin(async { Box::new($backend) as Box<dyn $crate::source::SourceBackend> })
                }
                $crate::Fixture {
                    name: stringify!($name),
                    connector: $connector,
                    backend: $crate::NewBackend::Source(new),
                }
            }
        }
    };
}

/// Registers a sink fixture: `sink_fixture!(module_name, "connector", backend_expr)`.
#[macro_export]
macro_rules! sink_fixture {
    ($name:ident, $connector:literal, $backend:expr) => {
        inventory::submit! {
            {
                fn new() -> futures::future::LocalBoxFuture<'static, Box<dyn $crate::sink::SinkBackend>>
                {
                    Box::pin(async { Box::new($backend) as Box<dyn $crate::sink::SinkBackend> })
                }
                $crate::Fixture {
                    name: stringify!($name),
                    connector: $connector,
                    backend: $crate::NewBackend::Sink(new),
                }
            }
        }
    };
}

/// Fails the check with a message when `condition` does not hold.
#[macro_export]
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

fn main() {
    let arguments = Arguments::from_args();
    let mut trials = registry_trials();
    trials.push(Trial::test(
        "every_registered_connector_has_a_fixture",
        every_registered_connector_has_a_fixture,
    ));
    trials.extend(self_tests::trials());
    libtest_mimic::run(&arguments, trials).exit();
}

/// Registry x fixture x check: every check of its kind for every fixture of
/// every connector compiled in.
fn registry_trials() -> Vec<Trial> {
    let sources = Registry::sources().iter().flat_map(|entry| {
        fixtures_of(ConnectorKind::Source, entry.name).flat_map(move |fixture| {
            source::CHECKS.map(|check| source_trial(entry.name, fixture, check))
        })
    });
    let sinks = Registry::sinks().iter().flat_map(|entry| {
        fixtures_of(ConnectorKind::Sink, entry.name).flat_map(move |fixture| {
            sink::CHECKS.map(|check| sink_trial(entry.name, fixture, check))
        })
    });
    sources.chain(sinks).collect()
}

fn fixtures_of(kind: ConnectorKind, connector: &str) -> impl Iterator<Item = &'static Fixture> {
    inventory::iter::<Fixture>
        .into_iter()
        .filter(move |fixture| fixture.kind() == kind && fixture.connector == connector)
}

fn source_trial(connector: &'static str, fixture: &'static Fixture, check: &'static str) -> Trial {
    Trial::test(format!("{}::{check}", fixture.name), move || {
        let NewBackend::Source(new_backend) = fixture.backend else {
            return Err(format!("{} is not a source fixture", fixture.name).into());
        };
        block_on(async {
            let subject = SourceSubject::registered(connector);
            let backend = new_backend().await;
            source::run(check, &subject, backend.as_ref())
                .await
                .map_err(|failure| format!("{connector} source, {check}: {failure}"))
        })
    })
}

fn sink_trial(connector: &'static str, fixture: &'static Fixture, check: &'static str) -> Trial {
    Trial::test(format!("{}::{check}", fixture.name), move || {
        let NewBackend::Sink(new_backend) = fixture.backend else {
            return Err(format!("{} is not a sink fixture", fixture.name).into());
        };
        block_on(async {
            let subject = SinkSubject::registered(connector);
            let backend = new_backend().await;
            sink::run(check, &subject, backend.as_ref())
                .await
                .map_err(|failure| format!("{connector} sink, {check}: {failure}"))
        })
    })
}

/// Runs a test's body on a runtime of its own, as `#[tokio::test]` does.
fn block_on(body: impl Future<Output = Outcome>) -> Result<(), Failed> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("tokio runtime: {error}"))?
        .block_on(body)
        .map_err(Failed::from)
}

/// A registered connector with no fixture would run no check: that fails,
/// naming it. So does a fixture naming no registered connector (a typo, or a
/// fixture gated on the wrong feature), which would run nothing either.
fn every_registered_connector_has_a_fixture() -> Result<(), Failed> {
    let registered: Vec<(ConnectorKind, &str)> = Registry::sources()
        .iter()
        .map(|entry| (ConnectorKind::Source, entry.name))
        .chain(
            Registry::sinks()
                .iter()
                .map(|entry| (ConnectorKind::Sink, entry.name)),
        )
        .collect();
    let missing: Vec<String> = registered
        .iter()
        .filter(|(kind, name)| fixtures_of(*kind, name).next().is_none())
        .map(|(kind, name)| format!("{name} {kind}"))
        .collect();
    let orphans: Vec<String> = inventory::iter::<Fixture>
        .into_iter()
        .filter(|fixture| !registered.contains(&(fixture.kind(), fixture.connector)))
        .map(|fixture| {
            format!(
                "{} ({} {})",
                fixture.name,
                fixture.connector,
                fixture.kind()
            )
        })
        .collect();
    if missing.is_empty() && orphans.is_empty() {
        return Ok(());
    }
    Err(format!(
        "connectors without a conformance fixture: {missing:?}; fixtures for no registered connector: {orphans:?}"
    )
    .into())
}

/// A name no other check (or run) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Message ids of their own for each batch of messages the checks build.
pub fn id_base() -> u128 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    (u128::from(std::process::id()) << 64) | (u128::from(NEXT.fetch_add(1, Ordering::SeqCst)) << 32)
}

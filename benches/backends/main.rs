//! End-to-end throughput of the connectors through Iggy, one module per
//! backend (`postgres`, `http`, `redis`, ..., `pipeline` for the random source
//! and stdout sink, `replication` for iggy to iggy). A backend's module is
//! compiled in with its connectors' features and registers its cases itself.
//!
//!     cargo bench --bench backends                               # every case compiled in
//!     cargo bench --features redis-source,redis-sink --bench backends -- redis
//!     cargo bench --bench backends -- pipeline random_to_iggy    # one case of a backend
//!     cargo bench --bench backends -- raw_send random_iggy       # cases by (part of) name
//!
//! Arguments that name a backend select its cases; the others select cases
//! whose name is, or else contains, the argument. Each case runs in a fresh
//! child process and prints one `bench:` line, its figures beside the ceiling
//! the case measures in the same run (see `common/mod.rs`).

mod common;
#[path = "../../tests/support/mod.rs"]
mod support;

mod analytics;
mod delta;
mod elasticsearch;
mod file;
mod http;
mod iceberg;
mod kafka;
mod mongodb;
mod mqtt;
mod mysql;
mod nats;
mod object_store;
mod otlp;
mod pipeline;
mod postgres;
mod rabbitmq;
mod redis;
mod replication;
mod s3;
mod surrealdb;

use std::process::Command;

use futures::future::BoxFuture;

/// Set in the child process that runs one case: the case's name.
const CASE_ENV: &str = "IGGY_CONNECT_BENCH_CASE";

/// One backend's bench: its cases and how to run one.
pub struct Bench {
    pub name: &'static str,
    pub cases: &'static [&'static str],
    pub run: fn(String) -> BoxFuture<'static, ()>,
}

// Every backend bench compiled in; each module adds its own.
inventory::collect!(Bench);

fn main() {
    common::serve_if_asked();
    if let Ok(case) = std::env::var(CASE_ENV) {
        let bench = inventory::iter::<Bench>
            .into_iter()
            .find(|bench| bench.cases.contains(&case.as_str()))
            .unwrap_or_else(|| panic!("no bench case {case}"));
        iggy_connect::cli::process::prepare();
        common::run_case((bench.run)(case));
        return;
    }
    let arguments: Vec<String> = std::env::args()
        .skip(1)
        .filter(|argument| !argument.starts_with("--"))
        .collect();
    let selected = select(&arguments);
    if selected.is_empty() {
        let mut compiled: Vec<&str> = inventory::iter::<Bench>
            .into_iter()
            .map(|bench| bench.name)
            .collect();
        compiled.sort_unstable();
        eprintln!(
            "no bench case matches {arguments:?}; the backends compiled in are {compiled:?} \
             (a backend's bench needs its connectors' features, e.g. \
             `--features redis-source,redis-sink`)"
        );
        std::process::exit(2);
    }
    let exe = std::env::current_exe().expect("the bench knows its executable");
    let mut failed = Vec::new();
    for case in selected {
        let status = Command::new(&exe)
            .env(CASE_ENV, case)
            .status()
            .expect("the bench can run itself");
        if !status.success() {
            failed.push(case);
        }
    }
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}

/// The cases the arguments select, by backend name (sorted) then case order.
fn select(arguments: &[String]) -> Vec<&'static str> {
    let mut benches: Vec<&Bench> = inventory::iter::<Bench>.into_iter().collect();
    benches.sort_unstable_by_key(|bench| bench.name);
    let (named, filters): (Vec<&String>, Vec<&String>) = arguments
        .iter()
        .partition(|argument| benches.iter().any(|bench| bench.name == argument.as_str()));
    let cases: Vec<&'static str> = benches
        .iter()
        .filter(|bench| named.is_empty() || named.iter().any(|name| *name == bench.name))
        .flat_map(|bench| bench.cases.iter().copied())
        .collect();
    if filters.is_empty() {
        return cases;
    }
    cases
        .iter()
        .copied()
        .filter(|case| {
            filters.iter().any(|filter| {
                // A case's exact name selects that case alone, not the
                // cases it is a prefix of.
                if cases.contains(&filter.as_str()) {
                    case == filter
                } else {
                    case.contains(filter.as_str())
                }
            })
        })
        .collect()
}

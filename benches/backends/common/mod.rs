//! What the end-to-end benches share: where the Iggy server is, running each
//! case in its own process, per-batch latencies from the engine's own stage
//! timings, peak RSS, and the one-line report.
//!
//! The Iggy server is `IGGY_ADDRESS` (credentials `IGGY_USERNAME` /
//! `IGGY_PASSWORD`, default `iggy`/`iggy`) when set; otherwise the in-process
//! test server of `tests/support/`, started in a child process of its own so
//! that a case's peak RSS is the connectors' alone.
//!
//! Each case runs in a fresh child process (the same executable, given the
//! case's name: see `main.rs`), so one case's heap never inflates another's
//! peak RSS.
#![allow(dead_code)]

pub mod raw;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use iggy_connect::iggy::ConnectionSettings;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

use crate::support::iggy_server::IggyTestServer;

/// Set in the child process that serves the test server.
const SERVE_ENV: &str = "IGGY_CONNECT_BENCH_SERVE";

/// Serves the test server instead of returning when this process was started
/// for that ([`Iggy::start_test_server`]).
pub fn serve_if_asked() {
    if std::env::var_os(SERVE_ENV).is_some() {
        serve();
    }
}

/// Runs one case in this process, on a worker thread of a multi-threaded
/// runtime, as the engine's pipelines do: `block_on`'s own thread would add a
/// cross-thread wake-up to every I/O event.
pub fn run_case(case: BoxFuture<'static, ()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let case = runtime.spawn(case);
    runtime.block_on(case).expect("the case panicked");
}

/// Child-process mode: serve the test server until the parent closes stdin.
fn serve() -> ! {
    let server = IggyTestServer::start();
    println!("{}", server.address());
    std::io::stdout().flush().expect("stdout");
    let mut sink = String::new();
    while std::io::stdin()
        .read_line(&mut sink)
        .is_ok_and(|read| read > 0)
    {}
    drop(server);
    std::process::exit(0);
}

/// The Iggy server a case runs against.
pub struct Iggy {
    pub address: String,
    username: String,
    password: String,
    /// The test server's process, when this bench started it.
    child: Option<Child>,
}

impl Iggy {
    /// `IGGY_ADDRESS` when set, else a fresh test server in a child process.
    pub fn start() -> Self {
        match std::env::var("IGGY_ADDRESS") {
            Ok(address) => Self::external(address),
            Err(_) => Self::start_test_server(),
        }
    }

    /// The server at `address`, with `IGGY_USERNAME` / `IGGY_PASSWORD`
    /// (default `iggy`/`iggy`).
    pub fn external(address: String) -> Self {
        let (username, password) = credentials();
        Self {
            address,
            username,
            password,
            child: None,
        }
    }

    /// A fresh test server in a child process.
    pub fn start_test_server() -> Self {
        let (username, password) = credentials();
        let mut child = Command::new(std::env::current_exe().expect("executable"))
            .env(SERVE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the test server process");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the test server prints its address");
        Self {
            address: line.trim().to_owned(),
            username,
            password,
            child: Some(child),
        }
    }

    pub fn settings(&self) -> ConnectionSettings {
        ConnectionSettings::password(self.address.clone(), &self.username, &self.password)
    }

    /// `test-server` or `external`, for the report.
    pub fn kind(&self) -> &'static str {
        if self.child.is_some() {
            "test-server"
        } else {
            "external"
        }
    }

    /// The `[iggy]` section of a runtime config for this server.
    pub fn config_section(&self) -> String {
        format!(
            "[iggy]\naddress = \"{}\"\nusername = \"{}\"\npassword = \"{}\"\n",
            self.address, self.username, self.password
        )
    }
}

impl Drop for Iggy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Closing its stdin ends the server; kill it if it does not go.
            drop(child.stdin.take());
            for _ in 0..100 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn credentials() -> (String, String) {
    (
        std::env::var("IGGY_USERNAME").unwrap_or_else(|_| "iggy".into()),
        std::env::var("IGGY_PASSWORD").unwrap_or_else(|_| "iggy".into()),
    )
}

/// A name unique to this run, for streams and groups on a shared server.
pub fn unique(case: &str) -> String {
    format!("bench-{case}-{}", std::process::id())
}

/// The engine's per-batch stage durations (`total`: poll to commit for a
/// source, poll to offset commit for a sink; and the stages inside it),
/// collected by connector key and stage through a local `metrics` recorder:
/// the engine records them anyway, so measuring adds no cost to the hot path.
#[derive(Default)]
pub struct Stages {
    by_key: Mutex<HashMap<(String, String), Arc<Samples>>>,
}

#[derive(Default)]
pub struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().expect("samples").push(value);
    }
}

impl Stages {
    /// Installs the recorder; call before the runtime creates connectors.
    pub fn install() -> Arc<Stages> {
        let stages = Arc::new(Stages::default());
        metrics::set_global_recorder(StagesRecorder(stages.clone()))
            .unwrap_or_else(|_| panic!("a metrics recorder is already installed"));
        stages
    }

    /// Batch latencies (stage `total`) of one connector.
    pub fn latencies(&self, key: &str) -> Latencies {
        self.stage(key, "total")
    }

    /// Durations of one stage of one connector's batches.
    pub fn stage(&self, key: &str, stage: &str) -> Latencies {
        let samples = self
            .by_key
            .lock()
            .expect("stages")
            .get(&(key.to_owned(), stage.to_owned()))
            .cloned();
        Latencies::new(
            samples
                .map(|s| s.0.lock().expect("samples").clone())
                .unwrap_or_default(),
        )
    }

    /// `STAGE_p50_ms=...` for each stage but `total` that recorded something:
    /// where a batch's time goes.
    pub fn breakdown(&self, key: &str) -> Vec<(&'static str, String)> {
        [
            ("decode", "decode_p50_ms"),
            ("prepare", "prepare_p50_ms"),
            ("iggy_send", "iggy_send_p50_ms"),
            ("state_save", "state_save_p50_ms"),
            ("write", "write_p50_ms"),
            ("commit", "commit_p50_ms"),
        ]
        .into_iter()
        .filter_map(|(stage, name)| {
            let latencies = self.stage(key, stage);
            (latencies.batches() > 0).then(|| (name, format!("{:.3}", latencies.ms(0.5))))
        })
        .chain(self.state_saves(key))
        .collect()
    }

    /// How many state saves a source made and their mean: with several
    /// batches in flight one save may cover several (group commit), and the
    /// mean shows the slow fsyncs a median hides.
    fn state_saves(&self, key: &str) -> Vec<(&'static str, String)> {
        let saves = self.stage(key, "state_save");
        if saves.batches() == 0 {
            return Vec::new();
        }
        vec![
            ("state_saves", saves.batches().to_string()),
            ("state_save_mean_ms", format!("{:.3}", saves.mean_ms())),
        ]
    }
}

struct StagesRecorder(Arc<Stages>);

impl Recorder for StagesRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let label = |name: &str| {
            key.labels()
                .find(|label| label.key() == name)
                .map(|label| label.value().to_owned())
        };
        if key.name() != "iggy_connector_stage_duration_seconds" {
            return Histogram::noop();
        }
        let connector = label("connector_key").unwrap_or_default();
        let stage = label("stage").unwrap_or_default();
        let samples = self
            .0
            .by_key
            .lock()
            .expect("stages")
            .entry((connector, stage))
            .or_default()
            .clone();
        Histogram::from_arc(samples)
    }
}

/// Sorted latencies, in seconds.
pub struct Latencies(Vec<f64>);

impl Latencies {
    pub fn new(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        Self(samples)
    }

    pub fn from_durations(samples: &[Duration]) -> Self {
        Self::new(samples.iter().map(Duration::as_secs_f64).collect())
    }

    pub fn batches(&self) -> usize {
        self.0.len()
    }

    /// The mean in milliseconds; 0 without samples.
    pub fn mean_ms(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.iter().sum::<f64>() / self.0.len() as f64 * 1000.0
    }

    /// The `quantile` (0..=1) in milliseconds, nearest rank; 0 without samples.
    pub fn ms(&self, quantile: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let rank = ((quantile * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1] * 1000.0
    }
}

/// Peak resident set size of this process (VmHWM), in MB.
pub fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Where report lines go: standard output, or its saved copy once a case sent
/// standard output to /dev/null.
static OUT: OnceLock<Mutex<File>> = OnceLock::new();

/// Sends this process's standard output (fd 1) to /dev/null, as a shell
/// redirection would for the real binary, keeping a copy for report lines.
pub fn stdout_to_dev_null() {
    std::io::stdout().flush().expect("flush stdout");
    // SAFETY: plain descriptor calls on descriptors this process owns; `saved`
    // is a fresh descriptor handed to exactly one `File`.
    unsafe {
        let saved = libc::dup(1);
        assert!(saved >= 0, "dup stdout");
        let null = File::options()
            .write(true)
            .open("/dev/null")
            .expect("open /dev/null");
        assert!(
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1) >= 0,
            "redirect stdout"
        );
        let _ = OUT.set(Mutex::new(File::from_raw_fd(saved)));
    }
}

/// One result line: `bench: name=... messages=N seconds=S msgs_per_s=R
/// p50_ms=... p99_ms=... rss_mb=...`, then case-specific `key=value` pairs.
pub struct Report<'a> {
    pub name: &'a str,
    pub messages: u64,
    pub elapsed: Duration,
    pub latencies: Latencies,
    pub extra: Vec<(&'static str, String)>,
}

impl Report<'_> {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }

    pub fn print(&self) {
        let mut line = format!(
            "bench: name={} messages={} seconds={:.3} msgs_per_s={:.0} p50_ms={:.2} p99_ms={:.2} rss_mb={:.1} batches={}",
            self.name,
            self.messages,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.latencies.ms(0.50),
            self.latencies.ms(0.99),
            peak_rss_mb(),
            self.latencies.batches(),
        );
        for (key, value) in &self.extra {
            line.push_str(&format!(" {key}={value}"));
        }
        line.push('\n');
        match OUT.get() {
            Some(out) => {
                let mut out = out.lock().expect("out");
                out.write_all(line.as_bytes()).expect("write report");
                out.flush().expect("flush report");
            }
            None => {
                print!("{line}");
                std::io::stdout().flush().expect("flush report");
            }
        }
    }
}

/// The sinks' and the raw consumer's `poll_interval`: `BENCH_POLL_INTERVAL`
/// (humantime, default `1ms`). The iggy consumer keeps at least this gap
/// between two poll requests, busy or not, and tokio sleeps in whole
/// milliseconds, so 1 ms makes a poll cycle about 2 ms; `0ms` sends the next
/// poll at once (and polls an idle topic in a loop).
pub fn poll_interval() -> Duration {
    std::env::var("BENCH_POLL_INTERVAL")
        .ok()
        .and_then(|value| humantime::parse_duration(&value).ok())
        .unwrap_or(Duration::from_millis(1))
}

/// A source's `max_in_flight_bytes` line when `BENCH_MAX_IN_FLIGHT_BYTES`
/// (a size such as `8MiB`) is set, for comparing windows without a rebuild;
/// empty otherwise (the default).
pub fn max_in_flight_bytes_line() -> String {
    std::env::var("BENCH_MAX_IN_FLIGHT_BYTES")
        .map(|size| format!("max_in_flight_bytes = \"{size}\"\n"))
        .unwrap_or_default()
}

/// Runs the connector of connector file `file` (its `key` is `key`) through
/// a [`Pipeline`] until it is done with `messages`, shuts the runtime down
/// and prints the case's report.
pub async fn run_connector(
    case: &str,
    iggy: &Iggy,
    kind: iggy_connect::connectors::ConnectorKind,
    key: &str,
    file: &str,
    messages: u64,
) {
    let stages = Stages::install();
    let pipeline = Pipeline::new(iggy, file);
    let elapsed = pipeline.run_until_done(kind, key, messages).await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies(key),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
}

/// `BENCH_SCALE` (default 1) times `base`, at least `min`.
pub fn scaled(base: u64, min: u64) -> u64 {
    let scale: f64 = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1.0);
    ((base as f64 * scale) as u64).max(min)
}

/// One connector in a runtime built as `iggy-connect run` builds one: the
/// Iggy bus, a file state store (in a temporary directory), a 10 s grace.
pub struct Pipeline {
    pub runtime: Arc<iggy_connect::engine::Runtime>,
    state: tempfile::TempDir,
}

impl Pipeline {
    /// The runtime with the connector of the connector file `text`.
    pub fn new(iggy: &Iggy, text: &str) -> Self {
        Self::with_state(iggy, text, tempfile::tempdir().expect("state dir"))
    }

    /// As [`Pipeline::new`], resuming from the state an earlier pipeline left
    /// in `state` (see [`Pipeline::into_state`]).
    pub fn with_state(iggy: &Iggy, text: &str, state: tempfile::TempDir) -> Self {
        let runtime = iggy_connect::engine::Runtime::new(
            Arc::new(iggy_connect::iggy::IggyBus::new(iggy.settings())),
            Arc::new(iggy_connect::state::FileStateStore::new(state.path()).expect("state store")),
            Duration::from_secs(10),
        );
        runtime.add(connector(text)).expect("add the connector");
        Self { runtime, state }
    }

    /// Whether connector `key` has saved a state yet.
    pub async fn has_state(&self, key: &str) -> bool {
        use iggy_connect::state::StateStore;
        let store =
            iggy_connect::state::FileStateStore::new(self.state.path()).expect("state store");
        store.load(key).await.expect("read the state").is_some()
    }

    /// The state directory, for a later [`Pipeline::with_state`].
    pub fn into_state(self) -> tempfile::TempDir {
        self.state
    }

    /// Starts the runtime and waits (10 minutes at most) until connector
    /// `key` is done with `messages`: a source's acknowledged by Iggy, a
    /// sink's written; the time that took.
    pub async fn run_until_done(
        &self,
        kind: iggy_connect::connectors::ConnectorKind,
        key: &str,
        messages: u64,
    ) -> Duration {
        let started = std::time::Instant::now();
        self.runtime.start_enabled().await;
        let deadline = started + Duration::from_secs(600);
        loop {
            let view = self.runtime.view(kind, key).expect("view");
            let done = match kind {
                iggy_connect::connectors::ConnectorKind::Source => view.metrics.sent.get(),
                iggy_connect::connectors::ConnectorKind::Sink => view.metrics.processed.get(),
            };
            if done >= messages {
                return started.elapsed();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{key} is done with {done} of {messages}: {:?}",
                view.status
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A connector file's text as the runtime reads it; panics on a bad one.
pub fn connector(text: &str) -> iggy_connect::config::ConnectorConfig {
    iggy_connect::config::connector::parse_connector_file(
        std::path::Path::new("bench.toml"),
        text,
        &iggy_connect::config::env::EnvVars::default(),
    )
    .unwrap_or_else(|issues| panic!("bad bench config: {issues}"))
    .0
}

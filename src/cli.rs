//! The command line: `run` (long-running, upstream's config format), `pipe`
//! (one-shot, in memory), `list`, `describe`, `validate` and `test` (a
//! connector file's unit tests).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod admin;
mod control;
mod dlq;
mod pipe;
pub mod process;
mod tap;
mod testing;
#[cfg(feature = "top")]
mod top;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::{self, ApiServer, ApiState};
use crate::config::env::EnvVars;
use crate::config::http_provider;
use crate::config::runtime::{ConnectorsConfig, HttpProviderConfig, LogFormat};
use crate::config::{ConfigIssue, ConnectorConfig, RuntimeConfig, load_connector_dir};
use crate::connectors::{self, ConnectorKind, Registry};
use crate::engine::Runtime;
use crate::iggy::{ConnectionSettings, IggyBus};
use crate::telemetry::Telemetry;

/// Exit code for configuration errors.
const EXIT_CONFIG: u8 = 2;

/// Exit code of a `pipe` interrupted with records undelivered, and of a `run`
/// stopped at once by a second signal (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// How long the exit waits for blocking tasks a command left running.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Parser)]
#[command(
    name = "iggy-connect",
    version,
    about = "Move data between external systems and Apache Iggy streams"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the connectors of a runtime config (upstream's `config.toml` format)
    /// until Ctrl-C or SIGTERM.
    Run {
        /// The runtime config file.
        #[arg(
            long,
            short,
            env = "IGGY_CONNECTORS_CONFIG_PATH",
            default_value = "config.toml"
        )]
        config: PathBuf,
        /// Reload the connector directory when a file in it changes (as
        /// `[connectors] watch = true`); SIGHUP reloads it either way.
        #[arg(long)]
        watch: bool,
    },
    /// Run one source into one sink in this process, through an in-memory topic.
    /// Nothing is durable: for trying connectors out and one-shot jobs.
    Pipe(pipe::PipeArgs),
    /// List the connectors compiled into this binary, with their cargo features
    /// (`describe KIND NAME` shows one's fields).
    List,
    /// Show a connector's `plugin_config` fields (type, default, required,
    /// description), an example connector file, or a JSON Schema of its file.
    Describe {
        /// `source` or `sink`.
        kind: ConnectorKind,
        /// The connector's name (see `list`).
        name: String,
        /// Print a complete connector file that `validate` accepts.
        #[arg(long, conflicts_with = "format")]
        example: bool,
        /// `text` (the fields as a table) or `json-schema` (the connector file's
        /// JSON Schema).
        #[arg(long, default_value = "text")]
        format: DescribeFormat,
    },
    /// Check a runtime config and every connector file it points to; report all
    /// problems with file and field. Exits non-zero on any error.
    Validate {
        #[arg(
            long,
            short,
            env = "IGGY_CONNECTORS_CONFIG_PATH",
            default_value = "config.toml"
        )]
        config: PathBuf,
    },
    /// Run the unit tests of connector files (`[[tests]]` in the file, or in
    /// `NAME.test.toml` beside it) through the file's decode, transforms and
    /// encode, with no Iggy server and no backend. Exits 1 when a test
    /// fails, 2 when a file or a test cannot be read.
    Test {
        /// Connector files (or their `NAME.test.toml`), or directories: every
        /// connector file with tests under them.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show, replace or clear a source's committed state, with the runtime
    /// stopped (while it runs: stop the connector, then the HTTP API's
    /// `/sources/{key}/state`).
    State {
        #[arg(
            long,
            short,
            env = "IGGY_CONNECTORS_CONFIG_PATH",
            default_value = "config.toml",
            global = true
        )]
        config: PathBuf,
        #[command(subcommand)]
        command: admin::StateCommand,
    },
    /// Move a sink's consumer-group offsets, with the runtime stopped (while
    /// it runs: stop the sink, then `POST /sinks/{key}/offsets`).
    Offsets {
        #[arg(
            long,
            short,
            env = "IGGY_CONNECTORS_CONFIG_PATH",
            default_value = "config.toml"
        )]
        config: PathBuf,
        /// The sink's key.
        key: String,
        /// `earliest`, `latest`, `timestamp:<RFC 3339 time or microseconds>`
        /// (the first message at or after it) or `<partition>=<next offset>,...`.
        #[arg(long)]
        to: String,
        /// With `--topic`: move only this topic of the sink.
        #[arg(long, requires = "topic")]
        stream: Option<String>,
        #[arg(long, requires = "stream")]
        topic: Option<String>,
    },
    /// Show a running connector's live messages, sampled, from the control
    /// API (`GET /{sources|sinks}/{key}/tap`): messages on stdout, notices
    /// such as "N dropped" on stderr.
    Tap(tap::TapArgs),
    /// A running connector's dead letters, from the control API: `list`
    /// shows where each came from and why; `replay` delivers a range of
    /// them again (`GET /{sources|sinks}/{key}/dlq`, `POST .../dlq/replay`).
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// A terminal dashboard of a running runtime, from its control API: per
    /// connector status, rates, errors, dead letters, lag, p99 batch latency
    /// and last error; `s`/`x`/`r` start, stop and restart the selected one.
    #[cfg(feature = "top")]
    Top(top::TopArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout: `iggy-connect man > iggy-connect.1`.
    Man,
}

/// Parses the command line; `--version` also names the compiled-in features.
pub fn parse() -> Cli {
    let command = Cli::command().version(version_text());
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
}

fn command() -> clap::Command {
    Cli::command().version(version_text())
}

/// The crate version and the connector features compiled in.
fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let mut features: Vec<&str> = Registry::sources()
            .iter()
            .map(|entry| entry.feature)
            .chain(Registry::sinks().iter().map(|entry| entry.feature))
            .collect();
        features.sort_unstable();
        features.dedup();
        format!(
            "{} (features: {})",
            env!("CARGO_PKG_VERSION"),
            if features.is_empty() {
                "none".to_owned()
            } else {
                features.join(", ")
            }
        )
    })
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::List => {
            print!("{}", list());
            eprintln!("{LIST_HINT}");
            ExitCode::SUCCESS
        }
        Command::Describe {
            kind,
            name,
            example,
            format,
        } => describe(kind, &name, example, format),
        Command::Validate { config } => validate(&config),
        Command::Test { files } => testing::test(&files),
        Command::Run { config, watch } => with_runtime(|| run_config(&config, watch)),
        Command::Pipe(args) => with_runtime(|| pipe::pipe(args)),
        Command::State { config, command } => with_runtime(|| admin::state(&config, command)),
        Command::Offsets {
            config,
            key,
            to,
            stream,
            topic,
        } => with_runtime(|| async {
            let only = stream.as_deref().zip(topic.as_deref());
            admin::offsets(&config, &key, &to, only).await
        }),
        Command::Tap(args) => with_runtime(|| tap::tap(args)),
        Command::Dlq(command) => with_runtime(|| dlq::dlq(command)),
        #[cfg(feature = "top")]
        Command::Top(args) => with_runtime(|| top::top(args)),
        Command::Completions { shell } => {
            // Generated into memory first: clap_complete panics on a write
            // error, and a reader that stops early (`| head`) is not one.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command(), "iggy-connect", &mut script);
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write the completions: {error}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Command::Man => match clap_mangen::Man::new(command()).render(&mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: cannot write the manual page: {error}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The compiled-in connectors as a table, its columns as wide as their longest cell.
pub fn list() -> String {
    let rows: Vec<[&str; 4]> = std::iter::once(["KIND", "NAME", "FEATURE", "DESCRIPTION"])
        .chain(Registry::all().iter().map(|info| {
            let kind = match info.kind {
                ConnectorKind::Source => "source",
                ConnectorKind::Sink => "sink",
            };
            [kind, info.name, info.feature, info.description]
        }))
        .collect();
    let width = |column: usize| rows.iter().map(|row| row[column].len()).max().unwrap_or(0);
    let (kind, name, feature) = (width(0), width(1), width(2));
    rows.iter()
        .map(|[k, n, f, description]| {
            format!("{k:<kind$} {n:<name$} {f:<feature$} {description}\n")
        })
        .collect()
}

/// Printed after `list`'s table, on stderr so the table stays one row per connector.
const LIST_HINT: &str = "`iggy-connect describe KIND NAME` shows a connector's fields; add `--example` for a connector file.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DescribeFormat {
    Text,
    JsonSchema,
}

fn describe(kind: ConnectorKind, name: &str, example: bool, format: DescribeFormat) -> ExitCode {
    let info = match Registry::info(kind, name) {
        Ok(info) => info,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match (example, format) {
        (true, _) => print!("{}", connectors::describe::example_file(&info)),
        (false, DescribeFormat::Text) => print!("{}", connectors::describe::fields_table(&info)),
        (false, DescribeFormat::JsonSchema) => {
            let schema = connectors::describe::file_schema(&info);
            match serde_json::to_string_pretty(&schema) {
                Ok(text) => println!("{text}"),
                Err(error) => {
                    eprintln!("error: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}

fn with_runtime<F, Fut>(main: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(main()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    };
    // What the command awaited is done; a blocking task still running (a
    // client's close waiting for a backend that is gone) must not hold the
    // exit for ever, as dropping the runtime would.
    runtime.shutdown_timeout(EXIT_WAIT);
    code
}

fn validate(path: &Path) -> ExitCode {
    let vars = EnvVars::from_process();
    let (runtime, mut issues) = match RuntimeConfig::load(path, &vars) {
        Ok((runtime, issues)) => (Some(runtime), issues),
        Err(found) => (None, found.0),
    };
    if let Some(Err(error)) = runtime
        .as_ref()
        .map(|runtime| ConnectionSettings::from_config(&runtime.iggy))
    {
        issues.push(ConfigIssue::error(path, "", error.to_string()));
    }
    let mut connectors = Vec::new();
    if let Some(dir) = runtime.as_ref().and_then(RuntimeConfig::connector_dir) {
        let (found, dir_issues) = load_connector_dir(dir, &vars);
        connectors = found;
        issues.extend(dir_issues);
    }
    for issue in &issues {
        eprintln!("{issue}");
    }
    let errors = issues.iter().filter(|issue| issue.is_error()).count();
    if errors > 0 {
        eprintln!("{errors} error(s) found");
        return ExitCode::from(EXIT_CONFIG);
    }
    if let Some(ConnectorsConfig::Http(http)) = runtime.as_ref().map(|runtime| &runtime.connectors)
    {
        println!(
            "config OK; the connectors come from the HTTP provider {} and are checked when `run` reads them",
            http.base_url
        );
        return ExitCode::SUCCESS;
    }
    println!("config OK: {} connector(s)", connectors.len());
    for config in &connectors {
        println!(
            "  {} {} ({}, version {}, {})",
            config.kind,
            config.key,
            config.connector,
            config.version,
            if config.enabled {
                "enabled"
            } else {
                "disabled"
            }
        );
    }
    ExitCode::SUCCESS
}

async fn run_config(path: &Path, watch: bool) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?.with_hangup()?;
    let vars = EnvVars::from_process();
    let (config, issues) = match RuntimeConfig::load(path, &vars) {
        Ok(loaded) => loaded,
        Err(found) => return Ok(config_failure(&found.0, failure_format(path, &vars))),
    };
    let format = config.logging.format;
    let (telemetry, export) = match Telemetry::init(&config.telemetry) {
        Ok(installed) => installed.unzip(),
        Err(error) => {
            return Ok(config_failure(
                &[ConfigIssue::error(path, error.field(), error.to_string())],
                format,
            ));
        }
    };
    crate::logging::init(format, export);
    let ended = match run_logged(path, watch, config, issues, vars, &mut signals).await {
        // The logs are JSON lines: so is the error that ends the run.
        Err(error) if format == LogFormat::Json => {
            eprintln!(
                "{}",
                crate::logging::json_line("ERROR", "iggy_connect", &format!("{error:#}"), [])
            );
            Ok(ExitCode::FAILURE)
        }
        ended => ended,
    };
    if let Some(telemetry) = telemetry {
        // Blocks until the last batches are exported.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    ended
}

async fn run_logged(
    path: &Path,
    watch: bool,
    config: RuntimeConfig,
    mut issues: Vec<ConfigIssue>,
    vars: EnvVars,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    if let Some(dir) = config.connector_dir() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create connector directory {}", dir.display()))?;
    }
    let source = ConfigSource::of(&config, &vars);
    let (connectors, dir_issues) = source.load().await.map_err(anyhow::Error::msg)?;
    issues.extend(dir_issues);
    if issues.iter().any(ConfigIssue::is_error) {
        return Ok(config_failure(&issues, config.logging.format));
    }
    for issue in &issues {
        tracing::warn!("{issue}");
    }
    let settings = match ConnectionSettings::from_config(&config.iggy) {
        Ok(settings) => settings,
        Err(error) => {
            return Ok(config_failure(
                &[ConfigIssue::error(path, "", error.to_string())],
                config.logging.format,
            ));
        }
    };
    // Held until the runtime exits: one runtime per state directory, and
    // `state` / `offsets` refuse to run beside it.
    let _lock = admin::RuntimeLock::for_state(&config.state)?;
    let state = crate::state::open(&config.state)
        .await
        .context("cannot open the state store")?;
    // Before any connector is added: metric handles resolved earlier record nowhere.
    let prometheus = match config.http.enabled && config.http.metrics.enabled {
        true => Some(api::metrics::install().context("cannot install the Prometheus recorder")?),
        false => None,
    };
    let runtime = Runtime::configured(
        Arc::new(IggyBus::new(settings)),
        state.clone(),
        &config.engine,
    );
    let watch = watch || config.watch();
    let started: Vec<String> = connectors
        .iter()
        .filter(|connector| connector.enabled)
        .map(|connector| {
            format!(
                "{} {} ({})",
                connector.kind, connector.key, connector.connector
            )
        })
        .collect();
    for connector in connectors {
        runtime.add(connector)?;
    }
    tracing::info!(
        config = %path.display(),
        iggy_address = %config.iggy.address,
        connectors = %started.join(", "),
        "iggy-connect starting {} connector(s)",
        started.len()
    );
    runtime.start_enabled().await;
    let server = match config.http.enabled {
        true => {
            let mut api_state = ApiState::new(runtime.clone(), state);
            if let Some(dir) = config.connector_dir() {
                api_state = api_state.with_config_dir(dir, vars.clone());
            }
            if let Some(handle) = prometheus {
                api_state = api_state.with_prometheus(handle);
            }
            match ApiServer::start(&config.http, api_state).await {
                Ok(server) => {
                    tracing::info!("HTTP API listening on {}", server.url());
                    Some(server)
                }
                Err(error) => {
                    runtime.shutdown().await;
                    return Err(error.into());
                }
            }
        }
        false => None,
    };
    reload_until_stopped(&runtime, &source, watch, signals).await;
    tracing::info!("shutting down; a second Ctrl-C or SIGTERM stops at once");
    let graceful = signals
        .unless_stopped(async {
            if let Some(server) = server {
                server.shutdown().await;
            }
            runtime.shutdown().await;
        })
        .await;
    if graceful.is_none() {
        tracing::warn!(
            "second stop signal: stopping at once; the batches in flight are not committed \
             and will be delivered again"
        );
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where `run` reads its connector configs.
enum ConfigSource {
    None,
    Dir { dir: PathBuf, vars: EnvVars },
    Http(HttpProviderConfig),
}

impl ConfigSource {
    fn of(config: &RuntimeConfig, vars: &EnvVars) -> Self {
        match (&config.connectors, config.connector_dir()) {
            (ConnectorsConfig::Http(http), _) => ConfigSource::Http(http.clone()),
            (_, Some(dir)) => ConfigSource::Dir {
                dir: dir.to_path_buf(),
                vars: vars.clone(),
            },
            (_, None) => ConfigSource::None,
        }
    }

    async fn load(&self) -> Result<(Vec<ConnectorConfig>, Vec<ConfigIssue>), String> {
        match self {
            ConfigSource::None => Ok((Vec::new(), Vec::new())),
            ConfigSource::Dir { dir, vars } => Ok(load_connector_dir(dir, vars)),
            ConfigSource::Http(http) => http_provider::active_configs(http)
                .await
                .map_err(|error| error.to_string()),
        }
    }

    /// How often `--watch` looks, and what it compares (`None`: the
    /// provider's answer itself; a reload of unchanged configs changes
    /// nothing).
    fn watched(&self) -> (std::time::Duration, Option<u64>) {
        match self {
            ConfigSource::Dir { dir, .. } => (
                std::time::Duration::from_secs(1),
                Some(dir_fingerprint(dir)),
            ),
            ConfigSource::Http(http) => (http.watch_interval, None),
            ConfigSource::None => (std::time::Duration::from_secs(3600), Some(0)),
        }
    }
}

/// Until Ctrl-C or SIGTERM: reloads the connector configs on SIGHUP and,
/// with `watch`, when the directory's files change (checked every second)
/// or every `watch_interval` from an HTTP provider.
async fn reload_until_stopped(
    runtime: &Arc<Runtime>,
    source: &ConfigSource,
    watch: bool,
    signals: &mut Signals,
) {
    let (every, mut seen) = source.watched();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            received = signals.next() => match received {
                Received::Stop => return,
                Received::Reload => tracing::info!("SIGHUP: reloading the connector configs"),
            },
            _ = tick.tick(), if watch => {
                let (_, now) = source.watched();
                if now.is_some() && now == seen {
                    continue;
                }
            }
        }
        seen = source.watched().1;
        match source.load().await {
            Ok((configs, issues)) => {
                runtime.reload(configs, &issues).await;
            }
            Err(error) => {
                tracing::error!(%error, "config reload failed; the running connectors stay as they are")
            }
        }
    }
}

/// A hash of the connector directory's file names and contents (connector
/// files and `.active_versions.toml`).
fn dir_fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<(std::ffi::OsString, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.ends_with(".toml"))
        })
        .map(|entry| {
            (
                entry.file_name(),
                std::fs::read(entry.path()).unwrap_or_default(),
            )
        })
        .collect();
    files.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut hasher);
    hasher.finish()
}

pub(crate) fn config_failure(issues: &[ConfigIssue], format: LogFormat) -> ExitCode {
    let errors = issues.iter().filter(|issue| issue.is_error()).count();
    let summary = format!("{errors} configuration error(s); nothing started");
    match format {
        LogFormat::Text => {
            for issue in issues {
                eprintln!("{issue}");
            }
            eprintln!("{summary}");
        }
        // A log shipper reads stderr as JSON lines: every line is one.
        LogFormat::Json => {
            for issue in issues {
                let level = match issue.is_error() {
                    true => "ERROR",
                    false => "WARN",
                };
                let fields = [
                    ("file", issue.file.display().to_string()),
                    ("field", issue.field.clone()),
                ];
                let line = crate::logging::json_line(
                    level,
                    "iggy_connect::config",
                    &issue.message,
                    fields,
                );
                eprintln!("{line}");
            }
            eprintln!(
                "{}",
                crate::logging::json_line("ERROR", "iggy_connect::config", &summary, [])
            );
        }
    }
    ExitCode::from(EXIT_CONFIG)
}

/// The log format of a run whose config did not load: the environment's
/// `IGGY_CONNECTORS_LOGGING_FORMAT`, else the file's `[logging] format` if
/// the file is TOML that far, else text.
fn failure_format(path: &Path, vars: &EnvVars) -> LogFormat {
    let from_file = || {
        let text = std::fs::read_to_string(path).ok()?;
        let table: toml::Table = toml::from_str(&text).ok()?;
        table
            .get("logging")?
            .get("format")?
            .as_str()
            .map(str::to_owned)
    };
    let format = vars
        .get("LOGGING_FORMAT")
        .map(str::to_owned)
        .or_else(from_file);
    match format.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

/// Ctrl-C (SIGINT) and SIGTERM, listened to from the moment this is created,
/// so a stop asked for while the connectors are still starting is graceful too.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
    /// SIGHUP, listened to by `run` only (it reloads the connector
    /// directory); elsewhere it keeps its default action.
    hangup: Option<Signal>,
}

/// What [`Signals::next`] received.
pub enum Received {
    Stop,
    Reload,
}

impl Signals {
    pub fn install() -> anyhow::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            hangup: None,
        })
    }

    /// Also listens to SIGHUP, for [`next`](Self::next).
    pub fn with_hangup(mut self) -> anyhow::Result<Self> {
        self.hangup = Some(signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?);
        Ok(self)
    }

    /// A stop (as [`recv`](Self::recv)) or a SIGHUP.
    pub async fn next(&mut self) -> Received {
        let hangup = async {
            match self.hangup.as_mut() {
                Some(hangup) => hangup.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.interrupt.recv() => Received::Stop,
            _ = self.terminate.recv() => Received::Stop,
            _ = hangup => Received::Reload,
        }
    }

    /// `work`, unless SIGINT or SIGTERM arrives first: `None` then. A graceful
    /// shutdown runs through this, so a second Ctrl-C need not wait for it.
    pub async fn unless_stopped<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = work => Some(done),
            () = self.recv() => None,
        }
    }

    /// Completes when either signal arrives (at once if one already did).
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

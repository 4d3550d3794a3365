//! The command line: `run` (long-running, upstream's config format), `pipe`
//! (one-shot, in memory), `list` and `validate`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::{self, ApiServer, ApiState};
use crate::config::connector::{DEFAULT_BATCH_LENGTH, DEFAULT_LINGER_TIME, DEFAULT_POLL_INTERVAL};
use crate::config::env::EnvVars;
use crate::config::runtime::LogFormat;
use crate::config::{
    ConfigIssue, ConnectorConfig, KindConfig, OnError, RuntimeConfig, SinkStream, SourceStream,
    load_connector_dir,
};
use crate::connectors::{ConnectorKind, Registry};
use crate::engine::codec::Schema;
use crate::engine::{Runtime, Status};
use crate::iggy::{ConnectionSettings, IggyBus, MemoryBus};
use crate::state::{FileStateStore, MemoryStateStore, StateStore};

/// Exit code for configuration errors.
const EXIT_CONFIG: u8 = 2;

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
    },
    /// Run one source into one sink in this process, through an in-memory topic.
    /// Nothing is durable: for trying connectors out and one-shot jobs.
    Pipe {
        /// Source connector name (see `list`).
        #[arg(long)]
        source: String,
        /// Sink connector name (see `list`).
        #[arg(long)]
        sink: String,
        /// `source.FIELD=VALUE` or `sink.FIELD=VALUE`: a `plugin_config` field. VALUE
        /// is read as TOML (`1000`, `true`, `[1, 2]`), else as a string.
        #[arg(long = "set", value_name = "TARGET.FIELD=VALUE")]
        settings: Vec<String>,
        /// Schema of the in-memory topic.
        #[arg(long, default_value = "json")]
        schema: String,
    },
    /// List the connectors compiled into this binary, with their cargo features.
    List,
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
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::List => {
            print!("{}", list());
            ExitCode::SUCCESS
        }
        Command::Validate { config } => validate(&config),
        Command::Run { config } => with_runtime(|| run_config(&config)),
        Command::Pipe {
            source,
            sink,
            settings,
            schema,
        } => with_runtime(|| pipe(&source, &sink, &settings, &schema)),
    }
}

/// The compiled-in connectors as a table.
pub fn list() -> String {
    let mut out = format!(
        "{:<8} {:<12} {:<18} {}\n",
        "KIND", "NAME", "FEATURE", "DESCRIPTION"
    );
    for entry in Registry::sources() {
        out.push_str(&format!(
            "{:<8} {:<12} {:<18} {}\n",
            "source", entry.name, entry.feature, entry.description
        ));
    }
    for entry in Registry::sinks() {
        out.push_str(&format!(
            "{:<8} {:<12} {:<18} {}\n",
            "sink", entry.name, entry.feature, entry.description
        ));
    }
    out
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
    match runtime.block_on(main()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
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

async fn run_config(path: &Path) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?;
    let vars = EnvVars::from_process();
    let (config, mut issues) = match RuntimeConfig::load(path, &vars) {
        Ok(loaded) => loaded,
        Err(found) => return Ok(config_failure(&found.0)),
    };
    crate::logging::init(config.logging.format);
    if let Some(dir) = config.connector_dir() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create connector directory {}", dir.display()))?;
    }
    let (connectors, dir_issues) = match config.connector_dir() {
        Some(dir) => load_connector_dir(dir, &vars),
        None => (Vec::new(), Vec::new()),
    };
    issues.extend(dir_issues);
    if issues.iter().any(ConfigIssue::is_error) {
        return Ok(config_failure(&issues));
    }
    for issue in &issues {
        tracing::warn!("{issue}");
    }
    let settings = match ConnectionSettings::from_config(&config.iggy) {
        Ok(settings) => settings,
        Err(error) => {
            return Ok(config_failure(&[ConfigIssue::error(
                path,
                "",
                error.to_string(),
            )]));
        }
    };
    let state: Arc<dyn StateStore> = Arc::new(
        FileStateStore::new(&config.state.path).context("cannot prepare the state directory")?,
    );
    // Before any connector is added: metric handles resolved earlier record nowhere.
    let prometheus = match config.http.enabled && config.http.metrics.enabled {
        true => Some(api::metrics::install().context("cannot install the Prometheus recorder")?),
        false => None,
    };
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(settings)),
        state.clone(),
        config.engine.shutdown_timeout,
    );
    for connector in connectors {
        runtime.add(connector)?;
    }
    runtime.start_enabled().await;
    let server = match config.http.enabled {
        true => {
            let mut api_state = ApiState::new(runtime.clone(), state);
            if let Some(dir) = config.connector_dir() {
                api_state = api_state.with_config_dir(dir, vars);
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
    signals.recv().await;
    tracing::info!("shutting down");
    if let Some(server) = server {
        server.shutdown().await;
    }
    runtime.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn pipe(
    source: &str,
    sink: &str,
    settings: &[String],
    schema: &str,
) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?;
    crate::logging::init(LogFormat::Text);
    let schema: Schema = schema
        .parse()
        .map_err(anyhow::Error::msg)
        .context("--schema")?;
    let (source_config, sink_config) = pipe_plugin_configs(settings)?;
    let source = pipe_connector(ConnectorKind::Source, source, source_config, schema)?;
    let sink = pipe_connector(ConnectorKind::Sink, sink, sink_config, schema)?;
    eprintln!(
        "iggy-connect pipe: {} -> {} through an in-memory topic. NOTHING IS DURABLE in this mode: \
         messages in flight are lost if the process stops. Use `iggy-connect run` with an Iggy server for durable pipelines.",
        source.connector, sink.connector
    );
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(10),
    );
    let (source_key, sink_key) = (source.key.clone(), sink.key.clone());
    runtime.add(source)?;
    runtime.add(sink)?;
    runtime.start_enabled().await;

    let drained = async {
        runtime
            .wait_until_stopped(ConnectorKind::Source, &source_key)
            .await?;
        loop {
            let sink_status = runtime.view(ConnectorKind::Sink, &sink_key)?.status.status;
            if bus.is_drained(PIPE_STREAM, PIPE_TOPIC, PIPE_GROUP)
                || !matches!(sink_status, Status::Running | Status::Starting)
            {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        result = drained => result?,
        () = signals.recv() => tracing::info!("interrupted"),
    }
    runtime.shutdown().await;
    let mut code = ExitCode::SUCCESS;
    for view in runtime.views() {
        if view.status.status == Status::Error {
            let message = view
                .status
                .last_error
                .map(|error| error.message)
                .unwrap_or_default();
            eprintln!(
                "error: {} {} stopped: {message}",
                view.config.kind, view.config.key
            );
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

const PIPE_STREAM: &str = "pipe";
const PIPE_TOPIC: &str = "pipe";
const PIPE_GROUP: &str = "pipe";

/// Splits `--set` values into the source's and the sink's `plugin_config`.
fn pipe_plugin_configs(
    settings: &[String],
) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let mut source = toml::Table::new();
    let mut sink = toml::Table::new();
    for setting in settings {
        let Some((path, value)) = setting.split_once('=') else {
            bail!("--set {setting}: expected TARGET.FIELD=VALUE, e.g. source.max_count=1000");
        };
        let (target, field) = match path.split_once('.') {
            Some(("source", field)) => (&mut source, field),
            Some(("sink", field)) => (&mut sink, field),
            _ => bail!(
                "--set {setting}: the target must be `source` or `sink`, e.g. source.max_count=1000"
            ),
        };
        insert_dotted(target, field, parse_value(value));
    }
    Ok((
        crate::config::connector::toml_to_json(&toml::Value::Table(source)),
        crate::config::connector::toml_to_json(&toml::Value::Table(sink)),
    ))
}

/// Reads a `--set` value as TOML when it is one, else as a plain string.
fn parse_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("value = {text}"))
        .ok()
        .and_then(|mut table| table.remove("value"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

fn insert_dotted(table: &mut toml::Table, path: &str, value: toml::Value) {
    match path.split_once('.') {
        None => {
            table.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            let entry = table
                .entry(head.to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(nested) = entry {
                insert_dotted(nested, rest, value);
            }
        }
    }
}

fn pipe_connector(
    kind: ConnectorKind,
    name: &str,
    plugin_config: serde_json::Value,
    schema: Schema,
) -> anyhow::Result<ConnectorConfig> {
    let built = match kind {
        ConnectorKind::Source => {
            Registry::source(name).map(|entry| (entry.build)(&plugin_config).map(drop))
        }
        ConnectorKind::Sink => {
            Registry::sink(name).map(|entry| (entry.build)(&plugin_config).map(drop))
        }
    };
    match built {
        Err(error) => bail!("--{kind} {name}: {error}"),
        Ok(Err(error)) => bail!(
            "--{kind} {name}: invalid setting `{kind}.{}`: {}",
            error.field,
            error.message
        ),
        Ok(Ok(())) => {}
    }
    let kind_config = match kind {
        ConnectorKind::Source => KindConfig::Source {
            streams: vec![SourceStream {
                stream: PIPE_STREAM.into(),
                topic: PIPE_TOPIC.into(),
                schema,
                batch_length: DEFAULT_BATCH_LENGTH,
                linger_time: DEFAULT_LINGER_TIME,
                partitions: 1,
            }],
            max_consecutive_nacks: None,
            max_in_flight: None,
        },
        ConnectorKind::Sink => KindConfig::Sink {
            streams: vec![SinkStream {
                stream: PIPE_STREAM.into(),
                topics: vec![PIPE_TOPIC.into()],
                schema,
                batch_length: DEFAULT_BATCH_LENGTH,
                poll_interval: DEFAULT_POLL_INTERVAL,
                consumer_group: PIPE_GROUP.into(),
            }],
            on_error: OnError::Stop,
        },
    };
    Ok(ConnectorConfig {
        kind,
        key: format!("pipe-{kind}"),
        enabled: true,
        version: 0,
        name: name.to_owned(),
        path: name.to_owned(),
        connector: name.to_owned(),
        plugin_config_format: None,
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config,
        file: None,
    })
}

fn config_failure(issues: &[ConfigIssue]) -> ExitCode {
    for issue in issues {
        eprintln!("{issue}");
    }
    let errors = issues.iter().filter(|issue| issue.is_error()).count();
    eprintln!("{errors} configuration error(s); nothing started");
    ExitCode::from(EXIT_CONFIG)
}

/// Ctrl-C (SIGINT) and SIGTERM, listened to from the moment this is created,
/// so a stop asked for while the connectors are still starting is graceful too.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    /// Completes when either signal arrives (at once if one already did).
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

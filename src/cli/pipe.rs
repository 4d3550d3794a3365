//! `pipe`: one source into one sink in this process, through an in-memory topic
//! that frees what the sink committed. For trying connectors out and one-shot
//! jobs: progress on stderr, a summary at the end, limits by count or time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{EXIT_CONFIG, EXIT_INTERRUPTED, Signals};
use crate::codec::Schema;
use crate::config::connector::{
    DEFAULT_BATCH_LENGTH, DEFAULT_LINGER_TIME, DEFAULT_POLL_INTERVAL, parse_connector_file,
    toml_to_json,
};
use crate::config::env::EnvVars;
use crate::config::runtime::LogFormat;
use crate::config::{ConfigIssue, ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream};
use crate::connectors::{
    BatchPolicy, BuildError, ConnectorContext, ConnectorError, ConnectorKind, Registry, Source,
    SourceBatch, describe,
};
use crate::engine::metrics::{ConnectorMetrics, DualCounter};
use crate::engine::runtime::{ConnectorFactory, RegistryFactory, RuntimeOptions};
use crate::engine::{Runtime, Status};
use crate::iggy::MemoryBus;
use crate::state::MemoryStateStore;

/// Uncommitted messages the in-memory topic holds before the source waits.
const TOPIC_CAPACITY: usize = 20_000;

const PIPE_STREAM: &str = "pipe";
const PIPE_TOPIC: &str = "pipe";
const PIPE_GROUP: &str = "pipe";

#[derive(Debug, clap::Args)]
pub struct PipeArgs {
    /// Source connector name (see `list`).
    #[arg(long, required_unless_present = "source_file")]
    source: Option<String>,
    /// Sink connector name (see `list`).
    #[arg(long, required_unless_present = "sink_file")]
    sink: Option<String>,
    /// A source connector file (upstream's format), run with its streams,
    /// schema, transforms and plugin_config.
    #[arg(long, value_name = "FILE", conflicts_with = "source")]
    source_file: Option<PathBuf>,
    /// A sink connector file (upstream's format), run with its streams, schema,
    /// transforms and plugin_config.
    #[arg(long, value_name = "FILE", conflicts_with = "sink")]
    sink_file: Option<PathBuf>,
    /// `source.FIELD=VALUE` or `sink.FIELD=VALUE`: a `plugin_config` field (over
    /// the file's, if any). VALUE is read as TOML (`1000`, `true`, `[1, 2]`),
    /// else as a string; one value for a list field is a list of one.
    #[arg(long = "set", value_name = "TARGET.FIELD=VALUE")]
    settings: Vec<String>,
    /// Schema of the in-memory topic when neither side comes from a file.
    #[arg(long, default_value = "json")]
    schema: String,
    /// Stop the source once it has produced N records (it finishes the batch
    /// it is on), then deliver everything to the sink and exit.
    #[arg(long, value_name = "N")]
    max_messages: Option<u64>,
    /// Stop the source after this long (`30s`, `5m`), then deliver everything
    /// to the sink and exit.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// How often progress is printed to stderr.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "5s")]
    progress_interval: Duration,
    /// Log (and progress) format on stderr.
    #[arg(long, env = "IGGY_CONNECTORS_LOGGING_FORMAT", value_parser = ["text", "json"], ignore_case = true, default_value = "text")]
    log_format: String,
}

/// The connectors `pipe` runs and where the sink's data comes from.
struct Plan {
    source: ConnectorConfig,
    sink: ConnectorConfig,
    /// (stream, topic, group) the sink consumes.
    reads: Vec<(String, String, String)>,
}

pub async fn pipe(args: PipeArgs) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?;
    let format = match args.log_format.to_ascii_lowercase().as_str() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    };
    crate::logging::init(format, None);
    let out = Reporter { format };
    let plan = match plan(&args) {
        Ok(plan) => plan,
        Err(message) => {
            // One line per problem, each with one `error:` prefix.
            for line in message.lines() {
                out.line("ERROR", &format!("error: {line}"), serde_json::json!({}));
            }
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    out.line(
        "WARN",
        &format!(
            "iggy-connect pipe: {} -> {} through an in-memory topic. NOTHING IS DURABLE in this mode: \
             messages in flight are lost if the process stops. Use `iggy-connect run` with an Iggy server for durable pipelines.",
            plan.source.connector, plan.sink.connector
        ),
        serde_json::json!({"source": plan.source.connector, "sink": plan.sink.connector}),
    );
    let bus = MemoryBus::bounded(TOPIC_CAPACITY);
    let runtime = Runtime::with_options(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::latest_only()),
        RuntimeOptions {
            factory: Arc::new(PipeFactory {
                max_messages: args.max_messages,
            }),
            ..RuntimeOptions::default()
        },
    );
    let (source_key, sink_key) = (plan.source.key.clone(), plan.sink.key.clone());
    runtime.add(plan.source)?;
    runtime.add(plan.sink)?;
    let started = Instant::now();
    runtime.start_enabled().await;

    // What the source read and the sink delivered so far.
    let counts = {
        let runtime = runtime.clone();
        let (source_key, sink_key) = (source_key.clone(), sink_key.clone());
        move || {
            let count = |kind, key: &str, metric: fn(&ConnectorMetrics) -> &DualCounter| {
                runtime
                    .view(kind, key)
                    .map_or(0, |view| metric(&view.metrics).get())
            };
            (
                count(ConnectorKind::Source, &source_key, |metrics| {
                    &metrics.produced
                }),
                count(ConnectorKind::Sink, &sink_key, |metrics| &metrics.processed),
            )
        }
    };
    let progress = {
        let counts = counts.clone();
        let interval = args.progress_interval.max(Duration::from_millis(100));
        tokio::spawn(async move {
            let (mut last, mut last_at) = (0, Instant::now());
            loop {
                tokio::time::sleep(interval).await;
                let ((read, now), at) = (counts(), Instant::now());
                let rate = (now - last.min(now)) as f64 / at.duration_since(last_at).as_secs_f64();
                out.line(
                    "INFO",
                    &format!("pipe: {read} records read, {now} delivered, {rate:.0} records/s"),
                    serde_json::json!({"records": now, "read": read, "rate": rate.round()}),
                );
                (last, last_at) = (now, at);
            }
        })
    };

    let mut interrupted = false;
    let mut source_stop_asked = false;
    loop {
        tokio::select! {
            () = signals.recv() => {
                interrupted = true;
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        if !source_stop_asked
            && args
                .duration
                .is_some_and(|limit| started.elapsed() >= limit)
        {
            source_stop_asked = true;
            let runtime = runtime.clone();
            let key = source_key.clone();
            tokio::spawn(async move { runtime.stop(ConnectorKind::Source, &key).await });
        }
        let status = |kind, key: &str| runtime.view(kind, key).map(|view| view.status.status);
        let source_active = matches!(
            status(ConnectorKind::Source, &source_key)?,
            Status::Starting | Status::Running | Status::Stopping
        );
        let sink_active = matches!(
            status(ConnectorKind::Sink, &sink_key)?,
            Status::Starting | Status::Running
        );
        let drained = plan
            .reads
            .iter()
            .all(|(stream, topic, group)| bus.is_drained(stream, topic, group));
        if !sink_active || (!source_active && drained) {
            break;
        }
    }
    progress.abort();
    if interrupted {
        out.line(
            "INFO",
            "pipe: interrupted, stopping (Ctrl-C again stops at once)",
            serde_json::json!({}),
        );
    }
    if signals.unless_stopped(runtime.shutdown()).await.is_none() {
        let text = match interrupted {
            true => "pipe: interrupted again, stopping at once",
            false => "pipe: interrupted, stopping at once",
        };
        out.line("WARN", text, serde_json::json!({}));
        interrupted = true;
    }

    let undelivered: u64 = plan
        .reads
        .iter()
        .map(|(stream, topic, group)| bus.undelivered(stream, topic, group))
        .sum();
    let views = runtime.views();
    let total = |count: fn(&ConnectorMetrics) -> u64| -> u64 {
        views.iter().map(|view| count(&view.metrics)).sum()
    };
    let errors = total(|metrics| metrics.errors.get());
    let dropped = total(|metrics| {
        metrics.filtered.get() + metrics.skipped.get() + metrics.dead_lettered.get()
    });
    let (_, records) = counts();
    let seconds = started.elapsed().as_secs_f64();
    out.line(
        "INFO",
        &format!(
            "pipe: {records} records in {seconds:.1} s, {errors} errors, {dropped} dropped{}",
            if interrupted { " (interrupted)" } else { "" }
        ),
        serde_json::json!({
            "records": records, "seconds": (seconds * 10.0).round() / 10.0,
            "errors": errors, "dropped": dropped, "interrupted": interrupted,
        }),
    );
    let mut code = ExitCode::SUCCESS;
    for view in &views {
        if view.status.status == Status::Error {
            let message = view
                .status
                .last_error
                .as_ref()
                .map(|error| error.message.clone())
                .unwrap_or_default();
            out.line(
                "ERROR",
                &format!(
                    "error: {} {} stopped: {message}",
                    view.config.kind, view.config.key
                ),
                serde_json::json!({"connector_key": view.config.key}),
            );
            code = ExitCode::FAILURE;
        }
    }
    if undelivered > 0 {
        out.line(
            "ERROR",
            &format!(
                "pipe: {undelivered} records read from the source were not delivered to the sink"
            ),
            serde_json::json!({"undelivered": undelivered}),
        );
        if interrupted {
            code = ExitCode::from(EXIT_INTERRUPTED);
        } else {
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

/// What `pipe` prints on stderr besides the logs: plain lines, or JSON objects
/// under `--log-format json` so every stderr line parses.
#[derive(Clone, Copy)]
struct Reporter {
    format: LogFormat,
}

impl Reporter {
    fn line(self, level: &str, text: &str, fields: serde_json::Value) {
        match self.format {
            LogFormat::Text => eprintln!("{text}"),
            LogFormat::Json => {
                let mut object = serde_json::Map::new();
                object.insert(
                    "timestamp".into(),
                    humantime::format_rfc3339_micros(std::time::SystemTime::now())
                        .to_string()
                        .into(),
                );
                object.insert("level".into(), level.into());
                object.insert("target".into(), "iggy_connect::pipe".into());
                object.insert("message".into(), text.into());
                if let serde_json::Value::Object(fields) = fields {
                    object.extend(fields);
                }
                eprintln!("{}", serde_json::Value::Object(object));
            }
        }
    }
}

/// Builds both connector configs from names or files and `--set`; every
/// problem here is a configuration error.
fn plan(args: &PipeArgs) -> Result<Plan, String> {
    let vars = EnvVars::from_process();
    let (source_settings, sink_settings) = pipe_plugin_configs(&args.settings)?;
    let source_file = args
        .source_file
        .as_deref()
        .map(|path| connector_file(path, ConnectorKind::Source, &vars))
        .transpose()?;
    let sink_file = args
        .sink_file
        .as_deref()
        .map(|path| connector_file(path, ConnectorKind::Sink, &vars))
        .transpose()?;
    let schema = || -> Result<Schema, String> {
        args.schema
            .parse()
            .map_err(|error| format!("--schema: {error}"))
    };
    // The topics between the two: the file's, else the other file's, else ours.
    let source_streams = match (&source_file, &sink_file) {
        (Some(file), _) => source_streams(file),
        (None, Some(sink)) => sink_streams(sink)
            .iter()
            .flat_map(|stream| {
                stream.topics.iter().map(|topic| SourceStream {
                    stream: stream.stream.clone(),
                    topic: topic.clone(),
                    schema: stream.schema.clone(),
                    batch_length: DEFAULT_BATCH_LENGTH,
                    linger_time: DEFAULT_LINGER_TIME,
                    partitions: 1,
                })
            })
            .take(1)
            .collect(),
        (None, None) => vec![SourceStream {
            stream: PIPE_STREAM.into(),
            topic: PIPE_TOPIC.into(),
            schema: schema()?,
            batch_length: DEFAULT_BATCH_LENGTH,
            linger_time: DEFAULT_LINGER_TIME,
            partitions: 1,
        }],
    };
    let mut source = match source_file {
        Some(config) => config,
        None => named(
            ConnectorKind::Source,
            args.source.as_deref().unwrap_or_default(),
            KindConfig::Source {
                streams: source_streams.clone(),
                max_consecutive_nacks: None,
                max_in_flight: None,
                max_in_flight_bytes: None,
            },
        ),
    };
    let mut sink = match sink_file {
        Some(config) => config,
        None => named(
            ConnectorKind::Sink,
            args.sink.as_deref().unwrap_or_default(),
            KindConfig::Sink {
                streams: source_streams
                    .iter()
                    .map(|stream| SinkStream {
                        stream: stream.stream.clone(),
                        topics: vec![stream.topic.clone()],
                        schema: stream.schema.clone(),
                        batch_length: DEFAULT_BATCH_LENGTH,
                        poll_interval: DEFAULT_POLL_INTERVAL,
                        consumer_group: PIPE_GROUP.into(),
                    })
                    .collect(),
                on_error: OnError::Stop,
            },
        ),
    };
    // `pipe --sink stdout` is for seeing what flows: it prints the payloads
    // unless `--set sink.print_payload=false` (a runtime's stdout sink, and
    // one from `--sink-file`, keep upstream's default of a summary only).
    if args.sink_file.is_none() && args.sink.as_deref() == Some("stdout") {
        sink.plugin_config["print_payload"] = true.into();
    }
    for (config, settings) in [(&mut source, source_settings), (&mut sink, sink_settings)] {
        let settings = listed(config, settings);
        merge(&mut config.plugin_config, settings);
    }
    for config in [&mut source, &mut sink] {
        config.enabled = true;
    }
    let origin = |config: &ConnectorConfig| match &config.file {
        Some(_) => config.origin().display().to_string(),
        None => format!("--{} {}", config.kind, config.connector),
    };
    let refused = |config: &ConnectorConfig, error: BuildError| {
        format!(
            "{}: {}",
            origin(config),
            set_hint(&error.to_string(), config.kind)
        )
    };
    RegistryFactory
        .source(&source)
        .map(drop)
        .map_err(|error| refused(&source, error))?;
    RegistryFactory
        .sink(&sink)
        .map(drop)
        .map_err(|error| refused(&sink, error))?;
    let mut reads = Vec::new();
    for stream in sink_streams(&sink) {
        for topic in &stream.topics {
            if !source_streams
                .iter()
                .any(|written| written.stream == stream.stream && written.topic == *topic)
            {
                return Err(format!(
                    "{}: the sink reads stream \"{}\" topic \"{topic}\", which the source does not write",
                    origin(&sink),
                    stream.stream
                ));
            }
            reads.push((
                stream.stream.clone(),
                topic.clone(),
                stream.consumer_group.clone(),
            ));
        }
    }
    Ok(Plan {
        source,
        sink,
        reads,
    })
}

/// Names the `--set` spelling of a plugin_config field in a factory's message.
fn set_hint(message: &str, target: ConnectorKind) -> String {
    message.replace("field `plugin_config.", &format!("field `{target}."))
}

fn source_streams(config: &ConnectorConfig) -> Vec<SourceStream> {
    match &config.kind_config {
        KindConfig::Source { streams, .. } => streams.clone(),
        KindConfig::Sink { .. } => Vec::new(),
    }
}

fn sink_streams(config: &ConnectorConfig) -> Vec<SinkStream> {
    match &config.kind_config {
        KindConfig::Sink { streams, .. } => streams.clone(),
        KindConfig::Source { .. } => Vec::new(),
    }
}

fn connector_file(
    path: &Path,
    kind: ConnectorKind,
    vars: &EnvVars,
) -> Result<ConnectorConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("{}: cannot read: {error}", path.display()))?;
    let (config, issues) = parse_connector_file(path, &text, vars).map_err(|found| {
        found
            .0
            .iter()
            .filter(|issue| issue.is_error())
            .map(ConfigIssue::located)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    for issue in issues {
        tracing::warn!("{issue}");
    }
    if config.kind != kind {
        return Err(format!(
            "{}: field `type`: expected a {kind} connector file, found a {}",
            path.display(),
            config.kind
        ));
    }
    Ok(config)
}

fn named(kind: ConnectorKind, name: &str, kind_config: KindConfig) -> ConnectorConfig {
    ConnectorConfig {
        kind,
        key: format!("pipe-{kind}"),
        enabled: true,
        version: 0,
        name: name.to_owned(),
        path: name.to_owned(),
        connector: name.to_owned(),
        plugin_config_format: None,
        plugin_config: serde_json::Value::Object(serde_json::Map::new()),
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config,
        file: None,
    }
}

/// Lays `overrides` over `base`, object by object.
fn merge(base: &mut serde_json::Value, overrides: serde_json::Value) {
    match (base, overrides) {
        (serde_json::Value::Object(base), serde_json::Value::Object(overrides)) => {
            for (key, value) in overrides {
                match base.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, overrides) => *base = overrides,
    }
}

/// Splits `--set` values into the source's and the sink's `plugin_config`.
fn pipe_plugin_configs(
    settings: &[String],
) -> Result<(serde_json::Value, serde_json::Value), String> {
    let mut source = toml::Table::new();
    let mut sink = toml::Table::new();
    for setting in settings {
        let Some((path, value)) = setting.split_once('=') else {
            return Err(format!(
                "--set {setting}: expected TARGET.FIELD=VALUE, e.g. source.max_count=1000"
            ));
        };
        let (target, field) = match path.split_once('.') {
            Some(("source", field)) => (&mut source, field),
            Some(("sink", field)) => (&mut sink, field),
            _ => {
                return Err(format!(
                    "--set {setting}: the target must be `source` or `sink`, e.g. source.max_count=1000"
                ));
            }
        };
        insert_dotted(target, field, parse_value(value));
    }
    Ok((
        toml_to_json(&toml::Value::Table(source)),
        toml_to_json(&toml::Value::Table(sink)),
    ))
}

/// `settings` with a single value given to a list field of the connector
/// wrapped in a list (`--set source.topics=orders`): on a command line one
/// value is what a user writes, where a file writes the list.
fn listed(config: &ConnectorConfig, mut settings: serde_json::Value) -> serde_json::Value {
    let Ok(info) = Registry::info(config.kind, &config.connector) else {
        return settings;
    };
    let Some(fields) = settings.as_object_mut() else {
        return settings;
    };
    for field in describe::fields(&info) {
        let scalar = fields
            .get(&field.name)
            .is_some_and(|value| !value.is_array() && !value.is_object());
        if scalar && field.kind.starts_with("array of ") {
            let value = fields.remove(&field.name).unwrap_or_default();
            fields.insert(field.name, serde_json::Value::Array(vec![value]));
        }
    }
    settings
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

/// The registry's connectors; with `--max-messages`, the source is wrapped to
/// finish at the batch that reaches the count.
struct PipeFactory {
    max_messages: Option<u64>,
}

impl ConnectorFactory for PipeFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        let source = RegistryFactory.source(config)?;
        Ok(match self.max_messages {
            Some(limit) => Box::new(Limited {
                inner: source,
                limit,
                polled: AtomicU64::new(0),
            }),
            None => source,
        })
    }

    fn sink(
        &self,
        config: &ConnectorConfig,
    ) -> Result<Box<dyn crate::connectors::Sink>, BuildError> {
        RegistryFactory.sink(config)
    }
}

/// A source that says it is finished once it has produced `limit` records;
/// the batch that reaches the limit is delivered whole (nothing is cut off).
struct Limited {
    inner: Box<dyn Source>,
    limit: u64,
    polled: AtomicU64,
}

#[async_trait]
impl Source for Limited {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        self.inner.open(state).await
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        if self.polled.load(Ordering::SeqCst) >= self.limit {
            return Ok(SourceBatch {
                records: Vec::new(),
                state: None,
                finished: true,
                next_poll: None,
            });
        }
        let mut batch = self.inner.poll().await?;
        let count = batch.records.len() as u64;
        if self.polled.fetch_add(count, Ordering::SeqCst) + count >= self.limit {
            batch.finished = true;
        }
        Ok(batch)
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        self.inner.commit().await
    }

    fn batch_policy(&self) -> BatchPolicy {
        self.inner.batch_policy()
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.inner.attach(context);
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.inner.close().await
    }
}

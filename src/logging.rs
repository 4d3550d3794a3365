//! Logs go to standard error through `tracing`, as text or JSON; `RUST_LOG`
//! sets the filter (default `info`, with the iggy client crates at `warn`: they
//! log three INFO lines per reconnect attempt, and the engine logs one line per
//! attempt with its number). Standard output is left to sinks.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::runtime::LogFormat;

/// The filter when `RUST_LOG` is not set.
// Directives match target prefixes: `iggy=warn` alone would also quiet `iggy_connect`.
pub const DEFAULT_FILTER: &str =
    "info,iggy=warn,iggy_common=warn,iggy_binary_protocol=warn,iggy_connect=info";

/// A layer of the global subscriber (the OTLP log export, src/telemetry.rs).
pub type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// The filter of exported log events: that of standard error, without the
/// exporters' own crates (an export reporting on itself would loop).
pub fn export_filter() -> EnvFilter {
    // Directives match target prefixes: `opentelemetry` covers `_sdk`,
    // `-otlp`; `hyper` covers `hyper_util`.
    [
        "opentelemetry=off",
        "tonic=off",
        "h2=off",
        "hyper=off",
        "reqwest=off",
        "tower=off",
    ]
    .into_iter()
    .filter_map(|directive| directive.parse().ok())
    .fold(env_filter(), EnvFilter::add_directive)
}

/// Installs the global subscriber: standard error in `format`, plus `export`
/// when given.
pub fn init(format: LogFormat, export: Option<BoxedLayer>) {
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let stderr = match format {
        LogFormat::Text => stderr.with_filter(env_filter()).boxed(),
        LogFormat::Json => stderr
            .fmt_fields(JsonFields::new())
            .event_format(JsonLine)
            .with_filter(env_filter())
            .boxed(),
    };
    let layers: Vec<BoxedLayer> = std::iter::once(stderr).chain(export).collect();
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

/// A line printed outside `tracing` (before it is set up, or after it ended)
/// in the shape [`JsonLine`] gives events: `timestamp`, `level`, `target`,
/// `message`, then `fields`.
pub fn json_line<const N: usize>(
    level: &str,
    target: &str,
    message: &str,
    fields: [(&str, String); N],
) -> String {
    let mut object = Map::new();
    object.insert(
        "timestamp".into(),
        humantime::format_rfc3339_micros(std::time::SystemTime::now())
            .to_string()
            .into(),
    );
    object.insert("level".into(), level.into());
    object.insert("target".into(), target.into());
    object.insert("message".into(), message.into());
    for (name, value) in fields {
        object.insert(name.into(), value.into());
    }
    Value::Object(object).to_string()
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message`, the
/// event's fields, then the fields of its spans (`connector_key`, ...) that the
/// event did not set, every key once. A field that repeats a key already
/// written (`message` when an event also has a `message` field) is written as
/// `error` (the field holds an error text wherever we log one), else with a
/// numeric suffix.
struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        let mut fields = Fields(Map::new());
        fields.0.insert(
            "timestamp".into(),
            humantime::format_rfc3339_micros(std::time::SystemTime::now())
                .to_string()
                .into(),
        );
        fields
            .0
            .insert("level".into(), metadata.level().as_str().into());
        fields.0.insert("target".into(), metadata.target().into());
        event.record(&mut fields);
        if let Some(scope) = context.event_scope() {
            for span in scope {
                let extensions = span.extensions();
                let Some(formatted) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                let Ok(Value::Object(span_fields)) = serde_json::from_str(formatted.as_str())
                else {
                    continue;
                };
                for (key, value) in span_fields {
                    fields.0.entry(key).or_insert(value);
                }
            }
        }
        let line = serde_json::to_string(&Value::Object(fields.0)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

struct Fields(Map<String, Value>);

impl Fields {
    fn insert(&mut self, name: &str, value: Value) {
        let mut key = name.to_owned();
        if self.0.contains_key(&key) && name == "message" {
            key = "error".to_owned();
        }
        let mut suffix = 2;
        while self.0.contains_key(&key) {
            key = format!("{name}_{suffix}");
            suffix += 1;
        }
        self.0.insert(key, value);
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.insert(field.name(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field.name(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field.name(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field.name(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field.name(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field.name(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.insert(field.name(), value.to_string().into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_repeated_key_when_inserted_should_keep_both_under_unique_names() {
        let mut fields = Fields(Map::new());
        fields.insert("message", "bus unreachable, retrying".into());
        fields.insert("message", "connection refused".into());
        fields.insert("message", "third".into());
        assert_eq!(fields.0["message"], "bus unreachable, retrying");
        assert_eq!(fields.0["error"], "connection refused");
        assert_eq!(fields.0["message_2"], "third");
    }
}

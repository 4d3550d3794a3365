//! The OpenTelemetry SDK behind [`super`]: OTLP exporters, batch processors on
//! the Tokio runtime, and the batch spans.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::logs::log_processor_with_async_runtime::BatchLogProcessor;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_subscriber::Layer as _;

use super::{Outcome, TelemetryError, TraceParent};
use crate::config::runtime::{OtlpExport, OtlpTransport, TelemetryConfig};

/// The tracer of the batch spans, set once when telemetry is installed.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// How long one export may take (the last one included, at shutdown).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The instrumentation scope of everything exported.
const SCOPE: &str = "iggy-connect";

pub(super) struct Providers {
    traces: SdkTracerProvider,
    logs: SdkLoggerProvider,
}

impl Providers {
    pub(super) fn install(
        config: &TelemetryConfig,
    ) -> Result<(Self, crate::logging::BoxedLayer), TelemetryError> {
        let resource = Resource::builder()
            .with_service_name(config.service_name().to_owned())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let spans = span_exporter(&config.traces)?;
        let traces = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_span_processor(BatchSpanProcessor::builder(spans, Tokio).build())
            .build();
        let records = log_exporter(&config.logs)?;
        let logs = SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_log_processor(BatchLogProcessor::builder(records, Tokio).build())
            .build();
        // A second install (never in the binary) keeps the first tracer.
        let _ = TRACER.set(traces.tracer(SCOPE));
        let layer = opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(&logs)
            .with_filter(crate::logging::export_filter())
            .boxed();
        Ok((Self { traces, logs }, layer))
    }

    /// Both signals flush at once, so an unresponsive collector delays the
    /// exit by one [`EXPORT_TIMEOUT`], not two.
    pub(super) fn shutdown(self) {
        let Self { traces, logs } = self;
        let logs = std::thread::spawn(move || logs.shutdown());
        if let Err(error) = traces.shutdown() {
            tracing::warn!(%error, "flushing the OTLP traces failed");
        }
        if let Ok(Err(error)) = logs.join() {
            // The log export is gone; standard error is not.
            eprintln!("flushing the OTLP logs failed: {error}");
        }
    }
}

/// The HTTP URL of a signal: the endpoint as given, or with the signal's
/// standard path when it has none (`http://host:4318` -> `.../v1/traces`).
fn http_url(endpoint: &str, path: &str) -> String {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    match rest.find('/') {
        Some(at) if rest[at..] != *"/" => endpoint.to_owned(),
        _ => format!("{}{path}", endpoint.trim_end_matches('/')),
    }
}

fn exporter_error(signal: &'static str, export: &OtlpExport) -> impl Fn(String) -> TelemetryError {
    move |message| TelemetryError::Exporter {
        signal,
        endpoint: export.endpoint.clone(),
        message,
    }
}

fn span_exporter(export: &OtlpExport) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let built = match export.transport {
        OtlpTransport::Grpc => builder
            .with_tonic()
            .with_endpoint(export.endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build(),
        OtlpTransport::Http => builder
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(http_url(&export.endpoint, "/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build(),
    };
    built.map_err(|error| exporter_error("traces", export)(error.to_string()))
}

fn log_exporter(export: &OtlpExport) -> Result<opentelemetry_otlp::LogExporter, TelemetryError> {
    let builder = opentelemetry_otlp::LogExporter::builder();
    let built = match export.transport {
        OtlpTransport::Grpc => builder
            .with_tonic()
            .with_endpoint(export.endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build(),
        OtlpTransport::Http => builder
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(http_url(&export.endpoint, "/v1/logs"))
            .with_timeout(EXPORT_TIMEOUT)
            .build(),
    };
    built.map_err(|error| exporter_error("logs", export)(error.to_string()))
}

/// A recording batch span and the clock pair that turns `Instant`s into
/// the wall-clock times spans carry.
pub(super) struct Batch {
    tracer: &'static SdkTracer,
    context: Context,
    origin: (Instant, SystemTime),
}

impl Batch {
    pub(super) fn start(kind: &'static str, connector_key: &str, started: Instant) -> Option<Self> {
        let tracer = TRACER.get()?;
        let origin = (Instant::now(), SystemTime::now());
        let mut batch = Self {
            tracer,
            context: Context::new(),
            origin,
        };
        let span = tracer
            .span_builder(format!("{kind} batch"))
            .with_start_time(batch.at(started))
            .with_attributes([
                KeyValue::new("connector_key", connector_key.to_owned()),
                KeyValue::new("connector_type", kind),
            ])
            .start(tracer);
        batch.context = Context::new().with_span(span);
        Some(batch)
    }

    fn at(&self, instant: Instant) -> SystemTime {
        let (now, wall) = self.origin;
        match instant.checked_duration_since(now) {
            Some(later) => wall + later,
            None => wall - now.duration_since(instant),
        }
    }

    pub(super) fn stage(
        &mut self,
        name: &'static str,
        from: Instant,
        to: Instant,
        error: Option<&str>,
    ) {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_start_time(self.at(from))
            .start_with_context(self.tracer, &self.context);
        if let Some(error) = error {
            opentelemetry::trace::Span::set_status(&mut span, Status::error(error.to_owned()));
        }
        opentelemetry::trace::Span::end_with_timestamp(&mut span, self.at(to));
    }

    pub(super) fn link(&mut self, parent: &TraceParent, tracestate: Option<&str>) {
        let state = tracestate
            .and_then(|state| TraceState::from_str(state).ok())
            .unwrap_or_default();
        let context = SpanContext::new(
            TraceId::from_bytes(parent.trace_id),
            SpanId::from_bytes(parent.span_id),
            TraceFlags::new(parent.flags),
            true,
            state,
        );
        self.context.span().add_link(context, Vec::new());
    }

    pub(super) fn end(self, records: usize, nacks: u32, outcome: Outcome) {
        let span = self.context.span();
        span.set_attributes([
            KeyValue::new("records", records as i64),
            KeyValue::new("nacks", i64::from(nacks)),
        ]);
        end(&span, outcome);
    }
}

fn end(span: &opentelemetry::trace::SpanRef<'_>, outcome: Outcome) {
    span.set_attribute(KeyValue::new("outcome", outcome.as_str()));
    if outcome == Outcome::Nack {
        span.set_status(Status::error("the batch was not committed"));
    }
    span.end();
}

/// A batch dropped before [`Batch::end`] (discarded after a NACK, or left in
/// flight at a stop) was not committed.
impl Drop for Batch {
    fn drop(&mut self) {
        let span = self.context.span();
        if span.is_recording() {
            end(&span, Outcome::Nack);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::http_url;

    #[test]
    fn given_an_http_endpoint_without_a_path_when_resolved_should_get_the_signal_path() {
        assert_eq!(
            http_url("http://127.0.0.1:4318", "/v1/traces"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://127.0.0.1:4318/", "/v1/logs"),
            "http://127.0.0.1:4318/v1/logs"
        );
        assert_eq!(
            http_url("http://127.0.0.1:4318/custom/traces", "/v1/traces"),
            "http://127.0.0.1:4318/custom/traces"
        );
    }
}

//! What the otlp source and sink share: the three OTLP signals (logs, traces,
//! metrics) behind one trait, how an export request is split into Iggy
//! messages and merged back, and how a stored message is recognised as OTLP
//! JSON or protobuf.
//!
//! Every Iggy message either connector handles is itself a complete OTLP
//! export request (`ExportLogsServiceRequest`, ...), as OTLP JSON or as
//! protobuf, so any OTLP library can read it and the sink can send it on as is.

#[cfg(feature = "otlp-sink")]
pub mod sink;
#[cfg(feature = "otlp-source")]
pub mod source;

use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric::Data};
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The user header naming a message's signal (`logs`, `traces`, `metrics`).
pub const SIGNAL_HEADER: &str = "otlp-signal";

/// One OTLP signal's export request.
pub trait Signal:
    Message + Default + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// `logs`, `traces` or `metrics`: the HTTP path's last part and the header value.
    const NAME: &'static str;
    /// What a partial success counts: log records, spans or data points.
    const ITEM: &'static str;
    type Response: Message + Default + Serialize + DeserializeOwned + Send + 'static;

    /// Log records, spans or metric data points in the request.
    fn items(&self) -> usize;
    /// One request per resource and scope (`per_record`: per log record, span
    /// or metric), each keeping its resource and scope.
    fn split(self, per_record: bool) -> Vec<Self>;
    /// Appends `other`'s resources to this request.
    fn append(&mut self, other: Self);
    fn response(rejected: i64, message: String) -> Self::Response;
    /// The rejected count and message of a response's partial success.
    fn rejected(response: &Self::Response) -> Option<(i64, String)>;
}

/// Splits `$resources` of a request into one request per scope (or record).
macro_rules! split_by_scope {
    ($request:expr, $per_record:expr, $resources:ident, $scopes:ident, $records:ident) => {{
        let mut parts = Vec::new();
        for mut resource in $request.$resources {
            let scopes = std::mem::take(&mut resource.$scopes);
            for mut scope in scopes {
                let records = std::mem::take(&mut scope.$records);
                let groups: Vec<_> = if $per_record {
                    records.into_iter().map(|record| vec![record]).collect()
                } else {
                    vec![records]
                };
                for group in groups {
                    let mut scope = scope.clone();
                    scope.$records = group;
                    let mut resource = resource.clone();
                    resource.$scopes = vec![scope];
                    parts.push(Self {
                        $resources: vec![resource],
                    });
                }
            }
        }
        parts
    }};
}

impl Signal for ExportLogsServiceRequest {
    const NAME: &'static str = "logs";
    const ITEM: &'static str = "log records";
    type Response = ExportLogsServiceResponse;

    fn items(&self) -> usize {
        self.resource_logs
            .iter()
            .flat_map(|resource| &resource.scope_logs)
            .map(|scope| scope.log_records.len())
            .sum()
    }

    fn split(self, per_record: bool) -> Vec<Self> {
        split_by_scope!(self, per_record, resource_logs, scope_logs, log_records)
    }

    fn append(&mut self, other: Self) {
        self.resource_logs.extend(other.resource_logs);
    }

    fn response(rejected: i64, message: String) -> Self::Response {
        ExportLogsServiceResponse {
            partial_success: (rejected > 0 || !message.is_empty()).then_some(
                ExportLogsPartialSuccess {
                    rejected_log_records: rejected,
                    error_message: message,
                },
            ),
        }
    }

    fn rejected(response: &Self::Response) -> Option<(i64, String)> {
        let partial = response.partial_success.as_ref()?;
        Some((partial.rejected_log_records, partial.error_message.clone()))
    }
}

impl Signal for ExportTraceServiceRequest {
    const NAME: &'static str = "traces";
    const ITEM: &'static str = "spans";
    type Response = ExportTraceServiceResponse;

    fn items(&self) -> usize {
        self.resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .map(|scope| scope.spans.len())
            .sum()
    }

    fn split(self, per_record: bool) -> Vec<Self> {
        split_by_scope!(self, per_record, resource_spans, scope_spans, spans)
    }

    fn append(&mut self, other: Self) {
        self.resource_spans.extend(other.resource_spans);
    }

    fn response(rejected: i64, message: String) -> Self::Response {
        ExportTraceServiceResponse {
            partial_success: (rejected > 0 || !message.is_empty()).then_some(
                ExportTracePartialSuccess {
                    rejected_spans: rejected,
                    error_message: message,
                },
            ),
        }
    }

    fn rejected(response: &Self::Response) -> Option<(i64, String)> {
        let partial = response.partial_success.as_ref()?;
        Some((partial.rejected_spans, partial.error_message.clone()))
    }
}

impl Signal for ExportMetricsServiceRequest {
    const NAME: &'static str = "metrics";
    const ITEM: &'static str = "data points";
    type Response = ExportMetricsServiceResponse;

    fn items(&self) -> usize {
        self.resource_metrics
            .iter()
            .flat_map(|resource| &resource.scope_metrics)
            .flat_map(|scope| &scope.metrics)
            .map(data_points)
            .sum()
    }

    fn split(self, per_record: bool) -> Vec<Self> {
        split_by_scope!(self, per_record, resource_metrics, scope_metrics, metrics)
    }

    fn append(&mut self, other: Self) {
        self.resource_metrics.extend(other.resource_metrics);
    }

    fn response(rejected: i64, message: String) -> Self::Response {
        ExportMetricsServiceResponse {
            partial_success: (rejected > 0 || !message.is_empty()).then_some(
                ExportMetricsPartialSuccess {
                    rejected_data_points: rejected,
                    error_message: message,
                },
            ),
        }
    }

    fn rejected(response: &Self::Response) -> Option<(i64, String)> {
        let partial = response.partial_success.as_ref()?;
        Some((partial.rejected_data_points, partial.error_message.clone()))
    }
}

fn data_points(metric: &Metric) -> usize {
    match &metric.data {
        None => 0,
        Some(Data::Gauge(gauge)) => gauge.data_points.len(),
        Some(Data::Sum(sum)) => sum.data_points.len(),
        Some(Data::Histogram(histogram)) => histogram.data_points.len(),
        Some(Data::ExponentialHistogram(histogram)) => histogram.data_points.len(),
        Some(Data::Summary(summary)) => summary.data_points.len(),
    }
}

/// How an export request travels: OTLP JSON or protobuf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    /// A stored message's encoding: OTLP JSON starts with `{` (after
    /// whitespace); a protobuf export request never does (`{` would be field
    /// 15 as a group, which no export request has).
    pub fn sniff(bytes: &[u8]) -> Self {
        match bytes.iter().find(|byte| !byte.is_ascii_whitespace()) {
            Some(b'{') => Self::Json,
            _ => Self::Protobuf,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Protobuf => "application/x-protobuf",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not an OTLP/JSON {signal} export request: {reason}")]
    Json {
        signal: &'static str,
        reason: String,
    },
    #[error("not a protobuf OTLP {signal} export request: {reason}")]
    Protobuf {
        signal: &'static str,
        reason: String,
    },
}

pub fn decode<S: Signal>(encoding: Encoding, bytes: &[u8]) -> Result<S, DecodeError> {
    match encoding {
        Encoding::Json => serde_json::from_slice(bytes).map_err(|error| DecodeError::Json {
            signal: S::NAME,
            reason: error.to_string(),
        }),
        Encoding::Protobuf => S::decode(bytes).map_err(|error| DecodeError::Protobuf {
            signal: S::NAME,
            reason: error.to_string(),
        }),
    }
}

/// `message` encoded as JSON or protobuf. JSON serialization of these types
/// cannot fail (no maps with non-string keys), so an empty body is never sent
/// in practice.
pub fn encode<M: Message + Serialize>(encoding: Encoding, message: &M) -> Vec<u8> {
    match encoding {
        Encoding::Json => serde_json::to_vec(message).unwrap_or_default(),
        Encoding::Protobuf => message.encode_to_vec(),
    }
}

/// An export response as OTLP/JSON: an absent partial success is left out
/// (not `null`) and its count is a decimal string, as OTLP/JSON writes int64.
pub fn response_json<R: Serialize>(response: &R) -> Vec<u8> {
    let mut value = serde_json::to_value(response).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        match object.get_mut("partialSuccess") {
            Some(serde_json::Value::Object(partial)) => {
                for field in partial.values_mut() {
                    if let serde_json::Value::Number(number) = field {
                        *field = serde_json::Value::String(number.to_string());
                    }
                }
            }
            _ => {
                object.remove("partialSuccess");
            }
        }
    }
    value.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    fn logs(scopes: &[usize]) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: scopes
                    .iter()
                    .enumerate()
                    .map(|(index, &records)| ScopeLogs {
                        scope: Some(InstrumentationScope {
                            name: format!("scope-{index}"),
                            ..Default::default()
                        }),
                        log_records: (0..records)
                            .map(|n| LogRecord {
                                time_unix_nano: n as u64,
                                ..Default::default()
                            })
                            .collect(),
                        schema_url: String::new(),
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn given_two_scopes_when_split_should_give_one_request_per_scope_keeping_every_record() {
        let parts = logs(&[2, 3]).split(false);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts.iter().map(Signal::items).collect::<Vec<_>>(), [2, 3]);
        let scope = |part: &ExportLogsServiceRequest| {
            part.resource_logs[0].scope_logs[0]
                .scope
                .clone()
                .unwrap()
                .name
        };
        assert_eq!(scope(&parts[1]), "scope-1");
    }

    #[test]
    fn given_per_record_when_split_should_give_one_request_per_record() {
        let parts = logs(&[2, 3]).split(true);
        assert_eq!(parts.len(), 5);
        assert!(parts.iter().all(|part| part.items() == 1));
    }

    #[test]
    fn given_both_encodings_when_sniffed_should_tell_them_apart() {
        let request = logs(&[1]);
        assert_eq!(
            Encoding::sniff(&encode(Encoding::Json, &request)),
            Encoding::Json
        );
        assert_eq!(
            Encoding::sniff(&encode(Encoding::Protobuf, &request)),
            Encoding::Protobuf
        );
        let json = encode(Encoding::Json, &request);
        assert_eq!(
            decode::<ExportLogsServiceRequest>(Encoding::Json, &json).unwrap(),
            request
        );
    }
}

//! `[telemetry]`: the runtime's own traces and logs over OTLP (gRPC or
//! HTTP/protobuf), with upstream's fields. Every batch a pipeline handles is a
//! span (`source batch`, `sink batch`) whose stages are child spans with
//! their measured start and end (`poll`, `transform`, `send`, `state_save`,
//! `commit`; `decode`, `write`, `dead_letter`, `commit`); log events go out as
//! OTLP log records. Export is batched and flushed by [`Telemetry::shutdown`].
//!
//! With telemetry off (or built without the `telemetry` feature) nothing is
//! installed: a [`BatchSpan`] is then an empty `Option` and each call on it one
//! branch, nothing allocated.

use std::time::Instant;

use crate::config::runtime::TelemetryConfig;

#[cfg(feature = "telemetry")]
mod otel;

/// The W3C trace-context headers an HTTP source copies into its messages.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the OTLP {signal} exporter for {endpoint}: {message}")]
    Exporter {
        signal: &'static str,
        endpoint: String,
        message: String,
    },
    #[error("this build has no OpenTelemetry export (cargo feature `telemetry`)")]
    NotBuilt,
}

impl TelemetryError {
    /// The runtime config field the error is about.
    pub fn field(&self) -> String {
        match self {
            TelemetryError::Exporter { signal, .. } => format!("telemetry.{signal}.endpoint"),
            TelemetryError::NotBuilt => "telemetry.enabled".into(),
        }
    }
}

/// The installed exporters; [`Telemetry::shutdown`] flushes what is batched.
pub struct Telemetry {
    #[cfg(feature = "telemetry")]
    inner: otel::Providers,
}

impl Telemetry {
    /// Installs the trace exporter and returns, with it, the layer that
    /// exports log events (for [`crate::logging::init`]); `None` when
    /// telemetry is off. Must run inside the Tokio runtime (the exporters
    /// run on it).
    pub fn init(
        config: &TelemetryConfig,
    ) -> Result<Option<(Self, crate::logging::BoxedLayer)>, TelemetryError> {
        if !config.enabled {
            return Ok(None);
        }
        #[cfg(feature = "telemetry")]
        {
            let (inner, logs) = otel::Providers::install(config)?;
            Ok(Some((Self { inner }, logs)))
        }
        #[cfg(not(feature = "telemetry"))]
        Err(TelemetryError::NotBuilt)
    }

    /// Exports what is batched and stops the exporters (blocking: run it
    /// off the async workers).
    pub fn shutdown(self) {
        #[cfg(feature = "telemetry")]
        self.inner.shutdown();
    }
}

/// How a batch ended, the span's `outcome` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Committed, every record delivered.
    Ok,
    /// Committed, some records refused (dropped or dead-lettered).
    Rejected,
    /// Not committed: delivery gave up (a stop, the NACK limit, a fatal error).
    Nack,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Rejected => "rejected",
            Outcome::Nack => "nack",
        }
    }
}

/// The span of one batch; inert when telemetry is off.
#[derive(Default)]
pub struct BatchSpan {
    #[cfg(feature = "telemetry")]
    inner: Option<otel::Batch>,
}

#[cfg_attr(not(feature = "telemetry"), allow(unused_variables))]
impl BatchSpan {
    /// Starts the span of a batch that began at `started`; `kind` is
    /// `source` or `sink`.
    pub fn start(kind: &'static str, connector_key: &str, started: Instant) -> Self {
        Self {
            #[cfg(feature = "telemetry")]
            inner: otel::Batch::start(kind, connector_key, started),
        }
    }

    /// Whether anything is recorded (telemetry on).
    pub fn is_recording(&self) -> bool {
        #[cfg(feature = "telemetry")]
        return self.inner.is_some();
        #[cfg(not(feature = "telemetry"))]
        false
    }

    /// A stage of the batch, as a child span from `from` to `to`; `error`
    /// marks it failed.
    pub fn stage(&mut self, name: &'static str, from: Instant, to: Instant, error: Option<&str>) {
        #[cfg(feature = "telemetry")]
        if let Some(inner) = &mut self.inner {
            inner.stage(name, from, to, error);
        }
    }

    /// Links the span to the trace of an incoming request (a W3C
    /// `traceparent` header value and its `tracestate`); an invalid value is
    /// ignored.
    pub fn link(&mut self, traceparent: &str, tracestate: Option<&str>) {
        #[cfg(feature = "telemetry")]
        if let Some(inner) = &mut self.inner
            && let Some(parent) = TraceParent::parse(traceparent)
        {
            inner.link(&parent, tracestate);
        }
    }

    /// Ends the span with its record count, outcome and NACKed attempts.
    pub fn end(self, records: usize, nacks: u32, outcome: Outcome) {
        #[cfg(feature = "telemetry")]
        if let Some(inner) = self.inner {
            inner.end(records, nacks, outcome);
        }
    }
}

/// A parsed W3C `traceparent` (version 00 layout; later versions are read by
/// their first four fields, as the spec asks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let version = hex::<1>(parts.next()?)?[0];
        let trace_id = hex::<16>(parts.next()?)?;
        let span_id = hex::<8>(parts.next()?)?;
        let flags = hex::<1>(parts.next()?)?[0];
        let valid = version != 0xff
            && (version != 0 || parts.next().is_none())
            && trace_id != [0; 16]
            && span_id != [0; 8];
        valid.then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }
}

/// Exactly `N` bytes of lowercase hex.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (index, pair) in bytes.chunks_exact(2).enumerate() {
        out[index] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_w3c_traceparents_when_parsed_should_accept_only_valid_ones() {
        let parsed =
            TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(parsed.trace_id[0], 0x0a);
        assert_eq!(parsed.span_id[7], 0x31);
        assert_eq!(parsed.flags, 1);
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-extra")
                .is_some()
        );
        for invalid in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceParent::parse(invalid), None, "{invalid:?}");
        }
    }
}

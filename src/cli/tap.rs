//! `tap`: a running runtime's live messages of one connector, read from its
//! control API (`GET /{sources|sinks}/{key}/tap`, Server-Sent Events).
//! Messages go to stdout, notices ("N dropped") to stderr.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

use super::control::ControlArgs;
use crate::connectors::ConnectorKind;

#[derive(Debug, Args)]
pub struct TapArgs {
    /// The connector's key.
    key: String,
    /// `source` or `sink`; by default the source with this key, else the sink.
    #[arg(long)]
    kind: Option<ConnectorKind>,
    /// `in` (as read), `out` (as delivered) or `dlq` (dead-lettered).
    #[arg(long, default_value = "in")]
    stage: String,
    /// Most messages shown per interval; the rest are counted as dropped.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// The sampling interval, in milliseconds.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Payload bytes shown per message.
    #[arg(long, default_value_t = 4096)]
    max_bytes: usize,
    /// `json` (one frame per line) or `text`.
    #[arg(long, default_value = "text")]
    format: TapFormat,
    /// Exit after this many messages (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
    #[command(flatten)]
    control: ControlArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TapFormat {
    Json,
    Text,
}

pub async fn tap(args: TapArgs) -> anyhow::Result<ExitCode> {
    let control = match args.control.clone().resolve() {
        Ok(control) => control,
        Err(code) => return Ok(code),
    };
    let client = control.client()?;
    let kinds = match args.kind {
        Some(kind) => vec![kind],
        None => vec![ConnectorKind::Source, ConnectorKind::Sink],
    };
    let mut last_refusal = String::new();
    for kind in kinds {
        let url = format!(
            "{}/{kind}s/{}/tap?stage={}&limit={}&interval_ms={}&max_bytes={}",
            control.url, args.key, args.stage, args.limit, args.interval_ms, args.max_bytes
        );
        let mut request = client.get(&url);
        if let Some(key) = &control.api_key {
            request = request.header("api-key", key);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the control API at {}", control.url))?;
        let status = response.status();
        if status.is_success() {
            return follow(response, &args).await;
        }
        let body = response.text().await.unwrap_or_default();
        last_refusal = refusal(status, &body);
        if status != reqwest::StatusCode::NOT_FOUND {
            break;
        }
    }
    bail!("{last_refusal}")
}

/// Prints the stream's events until it ends or `--count` messages were shown.
async fn follow(mut response: reqwest::Response, args: &TapArgs) -> anyhow::Result<ExitCode> {
    let mut buffer = String::new();
    let mut shown = 0;
    let mut stdout = std::io::stdout();
    while let Some(chunk) = response.chunk().await.context("the tap stream failed")? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some((event, data)) = parse_event(&block) else {
                continue;
            };
            if event != "message" {
                eprintln!("{}", notice_text(&data));
                continue;
            }
            let line = match args.format {
                TapFormat::Json => data.to_string(),
                TapFormat::Text => frame_text(&data),
            };
            if writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // The reader went away (`| head`): done.
                return Ok(ExitCode::SUCCESS);
            }
            shown += 1;
            if args.count.is_some_and(|count| shown >= count) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    bail!("the runtime closed the tap stream")
}

/// An SSE block's event name and JSON data; `None` for a keep-alive.
fn parse_event(block: &str) -> Option<(String, Value)> {
    let mut event = "message".to_owned();
    let mut data = String::new();
    for line in block.lines() {
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(text) = line.strip_prefix("data:") {
            data.push_str(text.strip_prefix(' ').unwrap_or(text));
        }
    }
    let data = serde_json::from_str(&data).ok()?;
    Some((event, data))
}

fn notice_text(data: &Value) -> String {
    let text = data["message"].as_str().unwrap_or_default();
    format!("[{}] {text}", data["notice"].as_str().unwrap_or("notice"))
}

/// `time stage stream/topic partition offset headers payload`, one line.
fn frame_text(frame: &Value) -> String {
    let field = |name: &str| match &frame[name] {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let headers = frame["headers"]
        .as_object()
        .map(|headers| {
            headers
                .iter()
                .map(|(name, value)| format!("{name}={}", value.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let truncated = if frame["truncated"] == Value::Bool(true) {
        "…"
    } else {
        ""
    };
    format!(
        "{} {} {}/{} partition={} offset={} headers={{{headers}}} {}:{}{truncated}",
        field("time"),
        field("stage"),
        field("stream"),
        field("topic"),
        field("partition"),
        field("offset"),
        field("encoding"),
        field("payload"),
    )
}

pub(super) fn refusal(status: reqwest::StatusCode, body: &str) -> String {
    let reason = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|value| value["reason"].as_str().map(str::to_owned));
    match (status, reason) {
        (reqwest::StatusCode::UNAUTHORIZED, _) => {
            "the control API refused the API key (--api-key or IGGY_CONNECTORS_HTTP_API_KEY)"
                .to_owned()
        }
        (_, Some(reason)) => format!("the control API answered {status}: {reason}"),
        (_, None) => format!("the control API answered {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_frame_when_shown_as_text_should_name_where_it_was_seen() {
        let frame = serde_json::json!({
            "time": "t", "stage": "out", "stream": "s", "topic": "x", "partition": 1,
            "offset": null, "headers": {"a": "b"}, "encoding": "utf8", "payload": "{}",
            "truncated": true,
        });
        assert_eq!(
            frame_text(&frame),
            "t out s/x partition=1 offset=- headers={a=b} utf8:{}…"
        );
    }

    #[test]
    fn given_an_sse_block_when_parsed_should_give_event_and_data() {
        let parsed = parse_event("event: notice\ndata: {\"notice\":\"dropped\"}\n\n");
        assert_eq!(
            parsed,
            Some(("notice".into(), serde_json::json!({"notice": "dropped"})))
        );
        assert_eq!(parse_event(": keep-alive\n\n"), None);
    }
}

//! `dlq list` and `dlq replay`: a running runtime's dead letters of one
//! connector, read and replayed through its control API
//! (`GET /{sources|sinks}/{key}/dlq`, `POST .../dlq/replay`).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::control::{Control, ControlArgs};
use crate::cli::tap::refusal;
use crate::connectors::ConnectorKind;

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List a connector's dead letters: where each came from, why it failed,
    /// whether a replay delivered it, and its payload.
    List(ListArgs),
    /// Deliver a range of a connector's dead letters again: to a fresh
    /// instance of the sink (default) or back to their origin topic.
    Replay(ReplayArgs),
}

/// Which connector, and where its runtime's API is.
#[derive(Debug, Args)]
pub struct Target {
    /// The connector's key.
    key: String,
    /// `source` or `sink`; by default the sink with this key, else the source.
    #[arg(long)]
    kind: Option<ConnectorKind>,
    /// The dead-letter topic's partition.
    #[arg(long, default_value_t = 0)]
    partition: u32,
    #[command(flatten)]
    control: ControlArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    connector: Target,
    /// The first dead-letter offset to read.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Most dead letters shown (1-1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Payload bytes shown per dead letter.
    #[arg(long, default_value_t = 4096)]
    max_bytes: usize,
    /// `text` (one line each) or `json` (the API's answer).
    #[arg(long, default_value = "text")]
    format: ListFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    Json,
    Text,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    connector: Target,
    /// The first dead-letter offset to replay.
    #[arg(long)]
    from: Option<u64>,
    /// The last dead-letter offset to replay (inclusive).
    #[arg(long)]
    to: Option<u64>,
    /// Most dead letters to replay.
    #[arg(long)]
    count: Option<usize>,
    /// Only dead letters of this error class (`rejected`, `decode`,
    /// `transform`, `encode`, `unstorable`).
    #[arg(long)]
    filter: Option<String>,
    /// Only dead letters that failed at this stage (`write`, `decode`, ...).
    #[arg(long)]
    stage: Option<String>,
    /// `sink` (a fresh instance of the sink; sinks only) or `origin` (the
    /// topic each came from).
    #[arg(long)]
    target: Option<String>,
    /// Replay dead letters a replay delivered before too.
    #[arg(long)]
    again: bool,
    /// How long to wait for the replay, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
}

pub async fn dlq(command: DlqCommand) -> anyhow::Result<ExitCode> {
    match command {
        DlqCommand::List(args) => list(args).await,
        DlqCommand::Replay(args) => replay(args).await,
    }
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let control = match args.connector.control.clone().resolve() {
        Ok(control) => control,
        Err(code) => return Ok(code),
    };
    let query = format!(
        "/dlq?from={}&limit={}&partition={}&max_bytes={}",
        args.from, args.limit, args.connector.partition, args.max_bytes
    );
    let answer = call(&args.connector, &control, &query, None).await?;
    match args.format {
        ListFormat::Json => println!("{answer}"),
        ListFormat::Text => {
            let dead_letters = answer["dead_letters"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for dead in &dead_letters {
                println!("{}", dead_letter_text(dead));
            }
            if let Some(next) = answer["next"].as_u64() {
                eprintln!("more from --from {next}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let control = match args.connector.control.clone().resolve() {
        Ok(control) => control,
        Err(code) => return Ok(code),
    };
    let mut body = Map::new();
    body.insert("partition".into(), json!(args.connector.partition));
    body.insert("again".into(), json!(args.again));
    body.insert("timeout_ms".into(), json!(args.timeout_ms));
    let optional = [
        ("from", args.from.map(|from| json!(from))),
        ("to", args.to.map(|to| json!(to))),
        ("count", args.count.map(|count| json!(count))),
        ("target", args.target.as_ref().map(|target| json!(target))),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            body.insert(name.into(), value);
        }
    }
    body.insert(
        "filter".into(),
        json!({ "error_class": args.filter, "stage": args.stage }),
    );
    let answer = call(
        &args.connector,
        &control,
        "/dlq/replay",
        Some(Value::Object(body)),
    )
    .await?;
    println!("{answer}");
    let failed = answer["stopped"].is_string();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Calls `path` under the connector (GET, or POST with `body`), trying the
/// sink and then the source with the key unless `--kind` says which.
async fn call(
    target: &Target,
    control: &Control,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let client = control.client()?;
    let kinds = match target.kind {
        Some(kind) => vec![kind],
        None => vec![ConnectorKind::Sink, ConnectorKind::Source],
    };
    let mut last_refusal = String::new();
    for kind in kinds {
        let url = format!("{}/{kind}s/{}{path}", control.url, target.key);
        let mut request = match &body {
            Some(body) => client.post(&url).json(body),
            None => client.get(&url),
        };
        if let Some(key) = &control.api_key {
            request = request.header("api-key", key);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the control API at {}", control.url))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str(&text).context("the control API answered no JSON");
        }
        last_refusal = refusal(status, &text);
        if status != reqwest::StatusCode::NOT_FOUND {
            break;
        }
    }
    bail!("{last_refusal}")
}

/// `offset time class stage origin attempts replayed error payload`, one line.
fn dead_letter_text(dead: &Value) -> String {
    let field = |value: &Value| match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let origin = &dead["origin"];
    let truncated = if dead["truncated"] == Value::Bool(true) {
        "…"
    } else {
        ""
    };
    format!(
        "{} {} {} {} from={}/{} partition={} offset={} attempts={}{} error={:?} {}:{}{truncated}",
        field(&dead["offset"]),
        field(&dead["timestamp"]),
        field(&dead["error_class"]),
        field(&dead["stage"]),
        field(&origin["stream"]),
        field(&origin["topic"]),
        field(&origin["partition"]),
        field(&origin["offset"]),
        field(&dead["attempts"]),
        if dead["replayed"] == Value::Bool(true) {
            " replayed"
        } else {
            ""
        },
        field(&dead["error"]),
        field(&dead["encoding"]),
        field(&dead["payload"]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_dead_letter_when_shown_as_text_should_say_where_from_and_why() {
        let dead = json!({
            "offset": 3, "timestamp": "t", "error_class": "rejected", "stage": "write",
            "origin": {"stream": "s", "topic": "x", "partition": 0, "offset": 13},
            "attempts": 1, "replayed": true, "error": "no", "encoding": "utf8",
            "payload": "{}", "truncated": false,
        });
        assert_eq!(
            dead_letter_text(&dead),
            "3 t rejected write from=s/x partition=0 offset=13 attempts=1 replayed error=\"no\" utf8:{}"
        );
    }
}

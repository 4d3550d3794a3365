//! `top`: a terminal dashboard of a running runtime, read from its control
//! API (`/stats`, `/sources`, `/sinks`) every interval; `s`, `x` and `r`
//! start, stop and restart the selected connector through the same API.

mod model;
mod view;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use serde_json::Value;
use tokio::sync::mpsc;

use super::control::ControlArgs;
use crate::connectors::ConnectorKind;
use model::Sample;
use view::{Action, App};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// How often the figures are read, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    #[command(flatten)]
    control: ControlArgs,
}

pub async fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    let control = match args.control.resolve() {
        Ok(control) => control,
        Err(code) => return Ok(code),
    };
    let api = Api {
        client: control.client()?,
        url: control.url,
        api_key: control.api_key,
    };
    // Refuse a wrong URL or key before taking over the terminal.
    let first = api.samples().await?;
    let mut app = App::new(api.url.clone());
    app.update(first, Duration::ZERO);
    let mut terminal = ratatui::try_init().context("top needs a terminal")?;
    let keys = read_keys();
    let outcome = run(&mut terminal, &mut app, &api, keys, args.interval_ms).await;
    ratatui::restore();
    outcome.map(|()| ExitCode::SUCCESS)
}

async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    api: &Api,
    mut keys: mpsc::Receiver<Event>,
    interval_ms: u64,
) -> anyhow::Result<()> {
    let mut ticks = tokio::time::interval(Duration::from_millis(interval_ms.max(100)));
    ticks.tick().await;
    let mut sampled = Instant::now();
    loop {
        terminal.draw(|frame| app.draw(frame))?;
        tokio::select! {
            _ = ticks.tick() => {}
            event = keys.recv() => {
                let Some(event) = event else { return Ok(()) };
                let Event::Key(key) = event else { continue };
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match app.handle_key(key) {
                    None => continue,
                    Some(Action::Quit) => return Ok(()),
                    Some(Action::Lifecycle { kind, key, verb }) => {
                        app.message = match api.lifecycle(kind, &key, verb).await {
                            Ok(()) => format!("{verb}: {kind} {key} done"),
                            Err(error) => format!("{verb}: {kind} {key}: {error:#}"),
                        };
                    }
                }
            }
        }
        match api.samples().await {
            Ok(samples) => {
                app.update(samples, sampled.elapsed());
                sampled = Instant::now();
            }
            Err(error) => app.message = format!("{error:#}"),
        }
    }
}

/// Terminal events, read on a thread of their own (crossterm's reads block).
fn read_keys() -> mpsc::Receiver<Event> {
    let (sender, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        while let Ok(event) = event::read() {
            if sender.blocking_send(event).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The control API, as `top` uses it.
struct Api {
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
}

impl Api {
    async fn samples(&self) -> anyhow::Result<Vec<Sample>> {
        let (stats, sources, sinks) =
            tokio::try_join!(self.get("stats"), self.get("sources"), self.get("sinks"))?;
        Ok(Sample::all(&stats, &sources, &sinks))
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self
            .request(self.client.get(format!("{}/{path}", self.url)))
            .await?;
        response
            .json()
            .await
            .with_context(|| format!("GET /{path}: not JSON"))
    }

    async fn lifecycle(&self, kind: ConnectorKind, key: &str, verb: &str) -> anyhow::Result<()> {
        let url = format!("{}/{kind}s/{key}/{verb}", self.url);
        self.request(self.client.post(url)).await?;
        Ok(())
    }

    async fn request(&self, request: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let request = match &self.api_key {
            Some(key) => request.header("api-key", key),
            None => request,
        };
        let response = request
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("cannot reach the control API at {}", self.url))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!(
                "the control API refused the API key (--api-key or IGGY_CONNECTORS_HTTP_API_KEY)"
            );
        }
        let body = response.text().await.unwrap_or_default();
        let reason = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|value| value["reason"].as_str().map(str::to_owned));
        match reason {
            Some(reason) => bail!("the control API answered {status}: {reason}"),
            None => bail!("the control API answered {status}"),
        }
    }
}

//! The dashboards as operators use them, against a running runtime (the real
//! binary and the in-process Iggy protocol test server): `iggy-connect top`
//! driven in tmux, and the `/ui` page in a headless Chromium driven over
//! WebDriver (chromedriver). tmux, chromium and chromium-driver come from
//! Debian (`scripts/ensure-debian-packages`, run by scripts/test).
// A random source and a stdout sink (the default features) make the traffic.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::binary::{Running, Workspace};
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(60);
const API_KEY: &str = "k3y";

/// A runtime with its API behind [`API_KEY`], a random source `gen` and a
/// stdout sink `print` reading what it writes.
struct Pipeline {
    running: Option<Running>,
    workspace: Workspace,
    url: String,
    _server: IggyTestServer,
}

impl Pipeline {
    fn start(stream: &str) -> Pipeline {
        Pipeline::start_with(stream, "")
    }

    /// With `http` (lines) added to `[http]`.
    fn start_with(stream: &str, http: &str) -> Pipeline {
        let server = IggyTestServer::start();
        let workspace = Workspace::with_api(&server.address().to_string(), "");
        let config = workspace.path("config.toml");
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            text.replace(
                "[http]\n",
                &format!("[http]\napi_key = \"{API_KEY}\"\n{http}"),
            ),
        )
        .unwrap();
        workspace.add_connector(
            "a.toml",
            &format!(
                "type = \"source\"\nkey = \"gen\"\nenabled = true\nversion = 0\nname = \"Random\"\npath = \"random\"\n\
                 [[streams]]\nstream = \"{stream}\"\ntopic = \"t\"\nschema = \"json\"\n\
                 [plugin_config]\ninterval = \"10ms\"\nmessages_range = [2, 2]\n"
            ),
        );
        workspace.add_connector(
            "b.toml",
            &format!(
                "type = \"sink\"\nkey = \"print\"\nenabled = true\nversion = 0\nname = \"Stdout\"\npath = \"stdout\"\n\
                 [[streams]]\nstream = \"{stream}\"\ntopics = [\"t\"]\nschema = \"json\"\npoll_interval = \"5ms\"\n\
                 consumer_group = \"{stream}\"\n"
            ),
        );
        let running = workspace.run();
        wait_until("the API", LONG, || !workspace.api_urls().is_empty());
        let url = workspace.api_urls().pop().unwrap();
        Pipeline {
            running: Some(running),
            workspace,
            url,
            _server: server,
        }
    }

    /// `GET path` with the key, as JSON.
    fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.url);
        block_on(async move {
            reqwest::Client::new()
                .get(url)
                .header("api-key", API_KEY)
                .send()
                .await
                .expect("the API answers")
                .json()
                .await
                .expect("JSON")
        })
    }

    /// `POST path` with the key; its status.
    fn post(&self, path: &str) -> u16 {
        block_on(self.post_async(path))
    }

    async fn post_async(&self, path: &str) -> u16 {
        reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .header("api-key", API_KEY)
            .send()
            .await
            .expect("the API answers")
            .status()
            .as_u16()
    }

    /// The Prometheus text of `/metrics`.
    fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.url);
        block_on(async move {
            reqwest::Client::new()
                .get(url)
                .header("api-key", API_KEY)
                .send()
                .await
                .expect("the API answers")
                .text()
                .await
                .expect("text")
        })
    }

    fn sink_status(&self, key: &str) -> String {
        self.get(&format!("/sinks/{key}"))["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.terminate();
            assert!(
                running.wait_exit(LONG).success(),
                "{}",
                self.workspace.stderr()
            );
        }
    }
}

fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

fn require(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|output| output.status.success());
    assert!(
        found,
        "{program} is not installed: run scripts/ensure-debian-packages {package} (scripts/test does)"
    );
}

/// A tmux server of its own (`-L`), so the test never touches another one.
#[cfg(feature = "top")]
struct Tmux {
    socket: String,
}

#[cfg(feature = "top")]
impl Tmux {
    fn start(command: &[&str]) -> Tmux {
        require("tmux", "tmux");
        let tmux = Tmux {
            socket: format!("iggy-connect-top-{}", std::process::id()),
        };
        let mut args = vec!["new-session", "-d", "-x", "150", "-y", "12", "--"];
        args.extend_from_slice(command);
        tmux.run(&args);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("tmux runs");
        assert!(
            output.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        self.run(&args);
    }
}

/// The words of the screen line naming `connector` (`source gen`), from it on.
#[cfg(feature = "top")]
fn row(screen: &str, connector: &str) -> Vec<String> {
    let Some(line) = screen.lines().find(|line| line.contains(connector)) else {
        return Vec::new();
    };
    let start = line.find(connector).unwrap_or(0);
    line[start..]
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[cfg(feature = "top")]
impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

#[cfg(feature = "top")]
#[test]
fn top_in_tmux_shows_live_rates_of_every_connector_and_x_stops_the_selected_one() {
    let pipeline = Pipeline::start("top_tmux");
    let binary = env!("CARGO_BIN_EXE_iggy-connect");
    let tmux = Tmux::start(&[
        binary,
        "top",
        "--url",
        &pipeline.url,
        "--api-key",
        API_KEY,
        "--interval-ms",
        "200",
    ]);
    // Rows: CONNECTOR (kind, key), STATUS, IN/s, OUT/s, ...; rates are
    // numbers once two samples were taken, and non-zero while data flows.
    let flowing = |row: &[String]| {
        row.len() > 4 && row[2] == "running" && row[3] != "-" && row[3] != "0" && row[4] != "0"
    };
    let mut last = String::new();
    wait_until("top shows both connectors with traffic", LONG, || {
        last = tmux.screen();
        flowing(&row(&last, "source gen")) && flowing(&row(&last, "sink print"))
    });
    assert!(last.contains("2 connectors, 2 running"), "{last}");
    let capture = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("top.txt");
    std::fs::write(&capture, &last).expect("capture written");
    for title in [
        "IN/s",
        "OUT/s",
        "BYTES/s",
        "ERRORS",
        "DLQ",
        "LAG",
        "P99",
        "LAST ERROR",
    ] {
        assert!(last.contains(title), "no {title} column:\n{last}");
    }

    // Sorted by kind then key: the source first, selected; down to the sink.
    tmux.keys(&["Down", "x"]);
    wait_until("the sink stopped through the API", LONG, || {
        pipeline.sink_status("print") == "stopped"
    });
    wait_until("top shows the sink stopped", LONG, || {
        last = tmux.screen();
        row(&last, "sink print").get(2).map(String::as_str) == Some("stopped")
            && last.contains("stop: sink print done")
    });
    assert_eq!(
        row(&last, "source gen").get(2).map(String::as_str),
        Some("running"),
        "{last}"
    );
    tmux.keys(&["q"]);
    drop(tmux);
    pipeline.stop();
}

/// A WebDriver session in a headless Chromium, through chromedriver's HTTP
/// API (plain JSON over reqwest: no driver crate).
struct Browser {
    driver: std::process::Child,
    base: String,
    session: String,
    client: reqwest::Client,
}

impl Browser {
    async fn start() -> Browser {
        require("chromium", "chromium");
        require("chromedriver", "chromium-driver");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            client,
        };
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,640"],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let mut answer = Value::Null;
        for _ in 0..100 {
            match browser.post_raw("/session", &capabilities).await {
                Some(value) => {
                    answer = value;
                    break;
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        browser.session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_owned();
        browser
    }

    /// `None` while chromedriver does not listen yet.
    async fn post_raw(&self, path: &str, body: &Value) -> Option<Value> {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .ok()?;
        response.json().await.ok()
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.client.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("JSON");
        assert!(
            answer["value"]["error"].is_null(),
            "WebDriver {path}: {answer}"
        );
        answer["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Runs `script` (a function body) in the page and returns its value.
    async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// The console entries logged since the last call.
    async fn console(&self) -> Vec<Value> {
        let logs = self
            .command(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await;
        logs.as_array().cloned().unwrap_or_default()
    }

    async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let encoded = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 PNG"))
            .expect("valid base64")
    }

    /// Polls `script` until it returns `true`.
    async fn wait(&self, what: &str, script: &str) {
        let deadline = tokio::time::Instant::now() + LONG;
        while self.eval(script).await != Value::Bool(true) {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `cell(kind, key, column)`: a connector row's cell text in the page, or null.
const CELL: &str = "const cell = (kind, key, column) => {
    const row = document.querySelector(`tr[data-kind=\"${kind}\"][data-key=\"${key}\"]`);
    return row ? row.children[column].textContent : null;
};";

#[test]
fn ui_in_headless_chromium_lists_every_connector_and_a_stop_button_stops_one() {
    let pipeline = Pipeline::start("ui_browser");
    block_on(async {
        let browser = Browser::start().await;
        let page = format!("{}/ui", pipeline.url);
        browser.go(&page).await;
        // Without the key the page asks for it; the login field gives it.
        browser
            .wait(
                "the page asks for the API key",
                "return document.getElementById('message').textContent.includes('API key');",
            )
            .await;
        browser
            .eval(&format!(
                "document.getElementById('api-key').value = '{API_KEY}';
                 document.querySelector('#login button').click();"
            ))
            .await;
        browser
            .wait(
                "the connectors listed after login",
                &format!("{CELL} return cell('sink', 'print', 3) !== null;"),
            )
            .await;
        // Only the refused requests before the key was given may be errors.
        for entry in browser.console().await {
            let message = entry["message"].as_str().unwrap_or_default();
            assert!(
                entry["level"] != "SEVERE" || message.contains("401"),
                "console error before login: {entry}"
            );
        }

        // A reload keeps the key (session storage): no error from here on.
        browser.go(&page).await;
        browser
            .wait(
                "both connectors running, with rates",
                &format!(
                    "{CELL}
                     const moving = (kind, key) => !['-', '0', null].includes(cell(kind, key, 4));
                     return cell('source', 'gen', 3) === 'running' && cell('sink', 'print', 3) === 'running'
                         && moving('source', 'gen') && moving('sink', 'print');"
                ),
            )
            .await;
        // The tap of the selected sink shows its messages as delivered.
        browser
            .eval(
                "document.getElementById('tap-stage').value = 'out';
                 document.querySelector('button[data-action=\"tap\"][data-kind=\"sink\"][data-key=\"print\"]').click();",
            )
            .await;
        browser
            .wait(
                "the tap panel shows the sink's messages",
                "return document.getElementById('tap').textContent.split('\\n')
                     .filter((line) => line.includes(' out ui_browser/t ')).length >= 3;",
            )
            .await;
        let shot = browser.screenshot().await;
        assert!(shot.starts_with(b"\x89PNG"), "not a PNG");
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui.png");
        std::fs::write(&path, &shot).expect("screenshot written");

        browser
            .eval(
                "document.querySelector('button[data-action=\"stop\"][data-kind=\"sink\"][data-key=\"print\"]').click();",
            )
            .await;
        browser
            .wait(
                "the page shows the sink stopped",
                &format!("{CELL} return cell('sink', 'print', 3) === 'stopped';"),
            )
            .await;

        // A change made elsewhere (the API, not the page) is pushed to the
        // page, which is not reloaded (its marker stays) and polls nothing.
        browser.eval("window.notReloaded = true;").await;
        assert_eq!(pipeline.post_async("/sources/gen/stop").await, 204);
        browser
            .wait(
                "the page shows the source stopped through the API",
                &format!(
                    "{CELL} return window.notReloaded === true && cell('source', 'gen', 3) === 'stopped';"
                ),
            )
            .await;
        let polled = browser
            .eval(
                "return performance.getEntriesByType('resource')
                     .map((entry) => new URL(entry.name).pathname)
                     .filter((path) => ['/stats', '/sources', '/sinks'].includes(path));",
            )
            .await;
        assert_eq!(polled, json!([]), "the page polled");
        let errors: Vec<Value> = browser
            .console()
            .await
            .into_iter()
            .filter(|entry| entry["level"] == "SEVERE")
            .collect();
        assert!(errors.is_empty(), "console errors: {errors:?}");
    });
    // The page's stop went through the API: the runtime says so.
    assert_eq!(pipeline.sink_status("print"), "stopped");
    pipeline.stop();
}

#[test]
fn ui_without_the_tap_lists_the_connectors_without_tap_buttons_or_console_errors() {
    let pipeline = Pipeline::start_with("ui_no_tap", "tap = false\n");
    block_on(async {
        let browser = Browser::start().await;
        // The key is in the tab's session storage before the page loads
        // (set on another page of the same origin), so nothing is refused.
        browser.go(&format!("{}/health", pipeline.url)).await;
        browser
            .eval(&format!(
                "sessionStorage.setItem('iggy-connect-api-key', '{API_KEY}');"
            ))
            .await;
        // That page's own entries (its favicon's 404) are not the status page's.
        browser.console().await;
        browser.go(&format!("{}/ui", pipeline.url)).await;
        browser
            .wait(
                "both connectors running",
                &format!(
                    "{CELL} return cell('source', 'gen', 3) === 'running' && cell('sink', 'print', 3) === 'running';"
                ),
            )
            .await;
        let buttons = browser
            .eval(
                "return [...document.querySelectorAll('button[data-action]')]
                     .map((button) => `${button.dataset.kind}/${button.dataset.action}`);",
            )
            .await;
        let buttons: Vec<&str> = buttons
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !buttons.iter().any(|button| button.ends_with("/tap")),
            "{buttons:?}"
        );
        assert!(buttons.contains(&"sink/stop"), "{buttons:?}");
        assert_eq!(pipeline.post_async("/sinks/print/stop").await, 204);
        browser
            .wait(
                "the page shows the sink stopped",
                &format!("{CELL} return cell('sink', 'print', 3) === 'stopped';"),
            )
            .await;
        let errors: Vec<Value> = browser
            .console()
            .await
            .into_iter()
            .filter(|entry| entry["level"] == "SEVERE")
            .filter(|entry| {
                !entry["message"]
                    .as_str()
                    .is_some_and(|message| message.contains("/favicon.ico"))
            })
            .collect();
        assert!(errors.is_empty(), "console errors: {errors:?}");
    });
    pipeline.stop();
}

/// Reads Server-Sent Events off a streaming answer.
struct EventReader {
    response: reqwest::Response,
    buffer: String,
}

impl EventReader {
    /// The next `(event, data)`; `None` when the stream ended.
    async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event = name.trim().to_owned();
                    } else if let Some(text) = line.strip_prefix("data:") {
                        data.push_str(text.strip_prefix(' ').unwrap_or(text));
                    }
                }
                if !data.is_empty() {
                    return Some((event, data));
                }
                continue;
            }
            let chunk = self.response.chunk().await.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next `snapshot` event's JSON.
    async fn snapshot(&mut self) -> Option<Value> {
        loop {
            let (event, data) = self.next().await?;
            if event == "snapshot" {
                return Some(serde_json::from_str(&data).expect("a JSON snapshot"));
            }
        }
    }
}

/// `snapshot[list]`'s entry for `key`.
fn entry<'a>(snapshot: &'a Value, list: &str, key: &str) -> &'a Value {
    snapshot[list]
        .as_array()
        .and_then(|entries| entries.iter().find(|entry| entry["key"] == key))
        .unwrap_or(&Value::Null)
}

fn produced(snapshot: &Value) -> u64 {
    snapshot["stats"]["connectors"]
        .as_array()
        .and_then(|connectors| connectors.iter().find(|counters| counters["key"] == "gen"))
        .and_then(|counters| counters["messages_produced"].as_u64())
        .unwrap_or(0)
}

#[test]
fn events_push_status_counters_and_lag_and_a_stop_made_through_the_api() {
    let mut pipeline = Pipeline::start("events_api");
    let url = format!("{}/events?interval_ms=200", pipeline.url);
    let running = pipeline.running.take().expect("running");
    block_on(async {
        let client = reqwest::Client::new();
        let refused = client.get(&url).send().await.expect("the API answers");
        assert_eq!(refused.status().as_u16(), 401);
        let response = client
            .get(&url)
            .header("api-key", API_KEY)
            .send()
            .await
            .expect("the API answers");
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap_or_default();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        let mut events = EventReader {
            response,
            buffer: String::new(),
        };

        let first = events.snapshot().await.expect("a first snapshot");
        assert_eq!(first["tap"], true, "{first}");
        assert_eq!(first["stats"]["sources_total"], 1, "{first}");
        assert_eq!(first["stats"]["sinks_total"], 1, "{first}");
        assert_eq!(entry(&first, "sources", "gen")["connector"], "random");
        assert_eq!(entry(&first, "sinks", "print")["connector"], "stdout");

        // Both run, the source's counters grow from one snapshot to the
        // next, and the sink's lag (measured by its watcher) shows up.
        let deadline = tokio::time::Instant::now() + LONG;
        let mut last_produced = produced(&first);
        let mut grew = 0;
        loop {
            let snapshot = events.snapshot().await.expect("snapshots keep coming");
            let running = entry(&snapshot, "sources", "gen")["status"] == "running"
                && entry(&snapshot, "sinks", "print")["status"] == "running";
            if running && produced(&snapshot) > last_produced {
                grew += 1;
            }
            last_produced = produced(&snapshot);
            let lag = &entry(&snapshot, "sinks", "print")["lag"];
            if grew >= 2 && lag["messages"].is_u64() && lag["partitions"].is_array() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no growing counters and sink lag: {snapshot}"
            );
        }

        // A stop made by another client is pushed.
        assert_eq!(pipeline.post_async("/sinks/print/stop").await, 204);
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let snapshot = events.snapshot().await.expect("snapshots keep coming");
            let sink = entry(&snapshot, "sinks", "print");
            if sink["status"] == "stopped" {
                assert_eq!(snapshot["stats"]["sinks_running"], 0, "{snapshot}");
                assert_eq!(entry(&snapshot, "sources", "gen")["status"], "running");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stop was not pushed: {snapshot}"
            );
        }

        // The stream ends when the runtime shuts down.
        running.terminate();
        while events.next().await.is_some() {}
    });
    let exit = running.wait_exit(LONG);
    assert!(exit.success(), "{}", pipeline.workspace.stderr());
    pipeline.stop();
}

/// The messages the status answer counts as `/sinks/print`'s lag.
fn sink_lag(pipeline: &Pipeline) -> Option<u64> {
    pipeline.get("/sinks/print")["lag"]["messages"].as_u64()
}

#[test]
fn a_stopped_sink_shows_its_lag_grow_while_its_topic_grows() {
    let pipeline = Pipeline::start("stopped_lag");
    wait_until("the running sink's lag measured", LONG, || {
        pipeline.sink_status("print") == "running" && sink_lag(&pipeline).is_some()
    });
    assert_eq!(pipeline.post("/sinks/print/stop"), 204);
    assert_eq!(pipeline.sink_status("print"), "stopped");
    let at_stop = sink_lag(&pipeline).unwrap_or(0);
    // The source keeps writing 200 messages a second to the sink's topic.
    wait_until("the stopped sink's lag grows", LONG, || {
        sink_lag(&pipeline).is_some_and(|lag| lag > at_stop + 100)
    });
    let metrics = pipeline.metrics();
    let gauge = metrics
        .lines()
        .find(|line| {
            line.starts_with("iggy_connector_lag{") && line.contains("connector_key=\"print\"")
        })
        .unwrap_or_else(|| panic!("no iggy_connector_lag of the sink:\n{metrics}"));
    let value: f64 = gauge
        .rsplit(' ')
        .next()
        .and_then(|value| value.parse().ok())
        .unwrap_or_default();
    assert!(value > 0.0, "{gauge}");
    pipeline.stop();
}

//! Running the real `iggy-connect` binary with a config written to a temp dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A runtime config directory: `config.toml`, `connectors/`, `state/`, and the
/// files the binary writes its standard output and error to.
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    /// A workspace whose runtime config points at an Iggy server; no HTTP API.
    pub fn new(iggy_address: &str, extra: &str) -> Self {
        Self::create(iggy_address, "[http]\nenabled = false\n", extra)
    }

    /// A workspace whose binary serves the HTTP API (with metrics) on a free
    /// port; see [`Workspace::api_url`].
    pub fn with_api(iggy_address: &str, extra: &str) -> Self {
        Self::create(
            iggy_address,
            "[http]\nenabled = true\naddress = \"127.0.0.1:0\"\n[http.metrics]\nenabled = true\n",
            extra,
        )
    }

    /// A workspace with the HTTP API (as [`with_api`](Self::with_api))
    /// whose `[state]` section holds `state` (the lines after the header)
    /// instead of a file store in the workspace.
    pub fn with_state(iggy_address: &str, state: &str) -> Self {
        Self::build(
            iggy_address,
            "[http]\nenabled = true\naddress = \"127.0.0.1:0\"\n",
            Some(state),
            "",
        )
    }

    fn create(iggy_address: &str, http: &str, extra: &str) -> Self {
        Self::build(iggy_address, http, None, extra)
    }

    fn build(iggy_address: &str, http: &str, state: Option<&str>, extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("connectors")).expect("connectors dir");
        let state = match state {
            Some(state) => state.to_owned(),
            None => format!("path = \"{}\"", dir.path().join("state").display()),
        };
        let config = format!(
            "[iggy]\naddress = \"{iggy_address}\"\nusername = \"iggy\"\npassword = \"iggy\"\n\
             {http}\
             [state]\n{state}\n\
             [connectors]\nconfig_type = \"local\"\nconfig_dir = \"{connectors}\"\n{extra}\n",
            connectors = dir.path().join("connectors").display(),
        );
        std::fs::write(dir.path().join("config.toml"), config).expect("config.toml");
        Self { dir }
    }

    /// The URLs the API listened on, one per start of the binary so far.
    pub fn api_urls(&self) -> Vec<String> {
        const MARK: &str = "HTTP API listening on ";
        let log = self.stderr();
        log.match_indices(MARK)
            .map(|(at, _)| {
                let rest = &log[at + MARK.len()..];
                let end = rest
                    .find(|character: char| character.is_whitespace() || character == '"')
                    .unwrap_or(rest.len());
                rest[..end].to_owned()
            })
            .collect()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn add_connector(&self, file: &str, text: &str) {
        std::fs::write(self.path("connectors").join(file), text).expect("connector file");
    }

    /// Starts `iggy-connect run`; its stdout and stderr are appended to
    /// `stdout.log` and `stderr.log` in the workspace (across restarts).
    pub fn run(&self) -> Running {
        self.run_with(&[])
    }

    /// [`run`](Self::run) with more arguments (`--watch`).
    pub fn run_with(&self, args: &[&str]) -> Running {
        let append = |name: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.path(name))
                .expect("log file")
        };
        let child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
            .args(["run", "--config"])
            .arg(self.path("config.toml"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(append("stdout.log")))
            .stderr(Stdio::from(append("stderr.log")))
            .spawn()
            .expect("iggy-connect starts");
        Running { child }
    }

    /// Kills `running` (SIGKILL) and starts the binary again `kills` times,
    /// each once `topic` of `stream` on `server` grew since the last start,
    /// and a random 20-300 ms later; returns the last run.
    pub async fn kill_while_progressing(
        &self,
        mut running: Running,
        server: &super::iggy_server::IggyTestServer,
        (stream, topic): (&str, &str),
        kills: usize,
    ) -> Running {
        for _ in 0..kills {
            let before = server.message_count(stream, topic);
            super::wait::wait_for(
                "the binary to make progress",
                Duration::from_secs(60),
                || server.message_count(stream, topic) > before,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(20..300))).await;
            running.kill();
            running = self.run();
        }
        running
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.path("stdout.log")).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

pub struct Running {
    child: Child,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGHUP: `run` reloads its connector directory.
    pub fn hangup(&self) {
        signal(self.pid(), "HUP");
    }

    /// SIGTERM, as an orchestrator stops a container.
    pub fn terminate(&self) {
        signal(self.pid(), "TERM");
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit, failing the test after `timeout`.
    pub fn wait_exit(mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("iggy-connect did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Reads a file that may not exist yet.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

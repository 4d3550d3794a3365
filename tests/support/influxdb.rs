//! A real InfluxDB 1.x (Debian's `influxdb` 1.6, installed by
//! `scripts/ensure-debian-packages`) for one test: its own temp directory,
//! free loopback ports (HTTP and the RPC bind address), no auth, stopped by
//! PID on drop. It starts in about 0.2 s.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct InfluxDb {
    child: Child,
    _dir: tempfile::TempDir,
    pub port: u16,
}

impl InfluxDb {
    /// Starts influxd on free loopback ports. A server that exits before it
    /// answers (a port taken between choosing it and binding it) is started
    /// again on other ports.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// `start` with more settings of the `[data]` section (such as
    /// `max-values-per-tag = 1000`).
    pub fn start_with(data: &str) -> Self {
        for _ in 0..3 {
            if let Some(server) = Self::try_start(data) {
                return server;
            }
        }
        panic!("influxd did not start in three attempts");
    }

    fn try_start(data: &str) -> Option<Self> {
        let binary = ["/usr/bin/influxd", "/usr/sbin/influxd"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .unwrap_or_else(|| {
                panic!("influxd is not installed: run scripts/ensure-debian-packages (scripts/test does)")
            });
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        let port = super::ports::free_port();
        let rpc = super::ports::free_port();
        let config = format!(
            r#"reporting-enabled = false
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
{data}
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{port}"
  log-enabled = false
[continuous_queries]
  enabled = false
[subscriber]
  enabled = false
"#
        );
        let path = dir.path().join("influxdb.conf");
        std::fs::write(&path, config).unwrap();
        let mut command = Command::new(binary);
        command
            .args(["run", "-config"])
            .arg(&path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches nothing of the parent.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("start influxd");
        let mut server = Self {
            child,
            _dir: dir,
            port,
        };
        server.wait_ready().then_some(server)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether the server answers `/ping`; false when it exited first.
    fn wait_ready(&mut self) -> bool {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut pause = Duration::from_millis(5);
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let mut answer = String::new();
                if stream
                    .write_all(b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                    .is_ok()
                    && stream.read_to_string(&mut answer).is_ok()
                    && answer.starts_with("HTTP/1.0 204")
                {
                    return true;
                }
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "influxd did not answer within 90 s"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Runs an InfluxQL statement; the JSON answer (times in µs).
    pub async fn query(&self, db: &str, q: &str) -> serde_json::Value {
        self.query_epoch(db, q, "u").await
    }

    /// `query` with times in `epoch` (`ns`, `u`, `ms`, ...).
    pub async fn query_epoch(&self, db: &str, q: &str, epoch: &str) -> serde_json::Value {
        let response = reqwest::Client::new()
            .post(format!("{}/query", self.url()))
            .query(&[("db", db), ("q", q), ("epoch", epoch)])
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{q}: {}", response.status());
        let answer: serde_json::Value = response.json().await.unwrap();
        assert!(answer["results"][0]["error"].is_null(), "{q}: {answer}");
        answer
    }

    /// The rows of a `SELECT`, each as column -> value.
    pub async fn rows(&self, db: &str, q: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        self.rows_epoch(db, q, "u").await
    }

    /// `rows` with times in `epoch`.
    pub async fn rows_epoch(
        &self,
        db: &str,
        q: &str,
        epoch: &str,
    ) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let answer = self.query_epoch(db, q, epoch).await;
        let Some(series) = answer["results"][0]["series"].as_array() else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for series in series {
            let columns: Vec<String> = series["columns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|column| column.as_str().unwrap().to_owned())
                .collect();
            for values in series["values"].as_array().unwrap() {
                rows.push(
                    columns
                        .iter()
                        .cloned()
                        .zip(values.as_array().unwrap().iter().cloned())
                        .collect(),
                );
            }
        }
        rows
    }

    /// Writes line protocol (setup only).
    pub async fn write(&self, db: &str, lines: &str) {
        let response = reqwest::Client::new()
            .post(format!("{}/write", self.url()))
            .query(&[("db", db), ("precision", "u")])
            .body(lines.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status().as_u16(),
            204,
            "{}",
            response.text().await.unwrap()
        );
    }
}

impl Drop for InfluxDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

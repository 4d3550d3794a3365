//! A real ClickHouse server (Debian's `clickhouse-server`, installed by
//! `scripts/ensure-debian-packages`) for one test: its own temp directory, a
//! free loopback HTTP port, users `default` (no password) and `iggy`
//! (password `secret`), stopped by PID on drop. It starts in well under a
//! second, so each test has its own and they run in parallel.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ClickHouse {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
}

/// The server binary: `clickhouse-server`, or `clickhouse server` of the
/// single binary.
fn binary() -> Command {
    for path in ["/usr/bin/clickhouse-server", "/usr/sbin/clickhouse-server"] {
        if std::path::Path::new(path).exists() {
            return Command::new(path);
        }
    }
    if std::path::Path::new("/usr/bin/clickhouse").exists() {
        let mut command = Command::new("/usr/bin/clickhouse");
        command.arg("server");
        return command;
    }
    panic!(
        "clickhouse-server is not installed: run scripts/ensure-debian-packages (scripts/test does)"
    );
}

impl ClickHouse {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let port = super::ports::free_port();
        // Its native TCP and interserver ports are left unset: only HTTP listens.
        let config = format!(
            r#"<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{root}/server.log</log><errorlog>{root}/error.log</errorlog></logger>
  <http_port>{port}</http_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>5368709</mark_cache_size>
  <max_concurrent_queries>50</max_concurrent_queries>
</yandex>
"#,
            root = root.display()
        );
        let users = r#"<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <users>
    <default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default>
    <iggy><password>secret</password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></iggy>
  </users>
  <quotas><default></default></quotas>
</yandex>
"#;
        std::fs::write(root.join("config.xml"), config).unwrap();
        std::fs::write(root.join("users.xml"), users).unwrap();
        let mut command = binary();
        command
            .arg(format!(
                "--config-file={}",
                root.join("config.xml").display()
            ))
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        let child = command.spawn().expect("start clickhouse-server");
        let server = Self { child, dir, port };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pause = Duration::from_millis(5);
        while !self.pings() {
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
                panic!("clickhouse-server did not answer within 30 s; its error log:\n{log}");
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// `GET /ping` answers `Ok.` (blocking, before any runtime exists).
    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let request = "GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        let mut answer = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.ends_with("Ok.\n")
    }

    /// Runs `sql` as `default`; panics on an error.
    pub async fn query(&self, sql: &str) -> String {
        let response = reqwest::Client::new()
            .post(format!("{}/", self.url()))
            .body(sql.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{sql}: {status} {text}");
        text
    }

    /// Each line of a `FORMAT JSONEachRow` answer, parsed.
    pub async fn rows(&self, sql: &str) -> Vec<serde_json::Value> {
        self.query(&format!("{sql} FORMAT JSONEachRow"))
            .await
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        // By PID: the server this test started, nothing else.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server dies with the test process, even when it is killed.
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches nothing of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

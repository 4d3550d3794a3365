//! A real Redis server (Debian's `redis-server` 7.0, installed by
//! `scripts/ensure-debian-packages`) for one test: a free loopback port, its
//! data in a temp directory with the append-only file fsynced on every write
//! (so a kill -9 and a restart keep every stream, group and pending entry),
//! stopped by PID on drop. It starts in a few milliseconds, so each test has
//! its own.
#![cfg(any(feature = "redis-sink", feature = "redis-source"))]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

pub struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub port: u16,
    password: Option<String>,
    tls: Option<Tls>,
}

/// A second port that takes TLS: the server's certificate and key, and the
/// CA its clients' certificates must be signed by.
struct Tls {
    port: u16,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::launch(None, None)
    }

    /// A server that wants `requirepass`.
    pub fn with_password(password: &str) -> Self {
        Self::launch(Some(password.to_owned()), None)
    }

    /// A server that also takes TLS (`rediss://`, [`RedisServer::tls_url`])
    /// with the test PKI's server certificate, besides its plain port; a
    /// TLS client must present a certificate the test CA signed.
    pub fn with_tls(pki: &super::pki::TestPki) -> Self {
        let tls = Tls {
            port: super::ports::free_port(),
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            ca: pki.ca.clone(),
        };
        Self::launch(None, Some(tls))
    }

    fn launch(password: Option<String>, tls: Option<Tls>) -> Self {
        let mut server = Self {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: super::ports::free_port(),
            password,
            tls,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let binary = "/usr/bin/redis-server";
        assert!(
            std::path::Path::new(binary).exists(),
            "redis-server is not installed: run scripts/ensure-debian-packages (scripts/test does)"
        );
        let mut command = Command::new(binary);
        command
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--daemonize", "no", "--logfile", "redis.log"]);
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        if let Some(tls) = &self.tls {
            command
                .arg("--tls-port")
                .arg(tls.port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", "yes"]);
        }
        command
            .current_dir(self.dir.path())
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
        self.child = Some(command.spawn().expect("start redis-server"));
        self.wait_ready();
    }

    /// `rediss://` to the TLS port of a server [`RedisServer::with_tls`].
    pub fn tls_url(&self) -> String {
        let tls = self.tls.as_ref().expect("a server with TLS");
        format!("rediss://127.0.0.1:{}", tls.port)
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server (SIGKILL, by its PID) and waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub async fn client(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pause = Duration::from_millis(5);
        let ping = match &self.password {
            Some(password) => format!("AUTH {password}\r\nPING\r\n"),
            None => "PING\r\n".to_owned(),
        };
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let mut answer = [0u8; 64];
                if stream.write_all(ping.as_bytes()).is_ok()
                    && let Ok(read) = stream.read(&mut answer)
                    && String::from_utf8_lossy(&answer[..read]).contains("PONG")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer within 30 s"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every entry of `stream` as (id, field -> value) with values as text.
pub async fn entries(
    connection: &mut MultiplexedConnection,
    stream: &str,
) -> Vec<(String, Vec<(String, String)>)> {
    let value: redis::Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(connection)
        .await
        .unwrap();
    let redis::Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let redis::Value::Array(mut parts) = item else {
                return None;
            };
            let fields = parts.pop()?;
            let id: String = redis::from_redis_value(parts.pop()?).ok()?;
            let fields: Vec<Vec<u8>> = redis::from_redis_value(fields).ok()?;
            let pairs = fields
                .chunks(2)
                .map(|pair| {
                    (
                        String::from_utf8_lossy(&pair[0]).into_owned(),
                        String::from_utf8_lossy(pair.get(1).map_or(&[][..], |v| v)).into_owned(),
                    )
                })
                .collect();
            Some((id, pairs))
        })
        .collect()
}

/// The value of `field` in an entry's fields.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

//! A real NATS server with JetStream (Debian's `nats-server` 2.9, installed by
//! `scripts/ensure-debian-packages`): its own temp store directory and a free
//! loopback port, stopped by PID on drop. `restart` stops it (SIGTERM, as an
//! operator would) and starts it again on the same port and store.
#![cfg(any(feature = "nats-source", feature = "nats-sink"))]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub port: u16,
    /// The certificate and key it serves TLS with (clients must use TLS).
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

const BINARY: &str = "/usr/sbin/nats-server";

impl NatsServer {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A server that takes TLS connections only, with the test PKI's server
    /// certificate.
    pub fn start_tls(pki: &super::pki::TestPki) -> Self {
        Self::start_with(Some((pki.server_cert.clone(), pki.server_key.clone())))
    }

    fn start_with(tls: Option<(std::path::PathBuf, std::path::PathBuf)>) -> Self {
        assert!(
            std::path::Path::new(BINARY).exists(),
            "nats-server is not installed: run scripts/ensure-debian-packages (scripts/test does)"
        );
        let mut server = Self {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: super::ports::free_port(),
            tls,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGTERM (JetStream flushes its store), then the same server again.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops the server until [`NatsServer::resume`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    pub fn resume(&mut self) {
        self.spawn();
    }

    fn spawn(&mut self) {
        let mut command = Command::new(BINARY);
        command
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.dir.path())
            .args(self.tls.iter().flat_map(|(cert, key)| {
                [
                    "--tls".as_ref(),
                    "--tlscert".as_ref(),
                    cert.as_os_str(),
                    "--tlskey".as_ref(),
                    key.as_os_str(),
                ]
            }))
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
        self.child = Some(command.spawn().expect("start nats-server"));
        self.wait_ready();
    }

    /// Until the server greets with JetStream enabled.
    fn wait_ready(&self) {
        use std::io::{BufRead, BufReader};
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let mut line = String::new();
                if BufReader::new(stream).read_line(&mut line).is_ok()
                    && line.starts_with("INFO")
                    && line.contains("\"jetstream\":true")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A client of this server and its JetStream context.
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .reconnect_delay_callback(|_| Duration::from_millis(100))
            .connect(self.url())
            .await
            .unwrap();
        async_nats::jetstream::new(client)
    }
}

/// Creates stream `name` capturing `subjects` (file storage, a duplicate window
/// of two minutes).
pub async fn create_stream(
    jetstream: &async_nats::jetstream::Context,
    name: &str,
    subjects: &[&str],
) {
    jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: subjects.iter().map(|subject| subject.to_string()).collect(),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// How many messages stream `name` holds.
pub async fn stream_messages(jetstream: &async_nats::jetstream::Context, name: &str) -> u64 {
    match jetstream.get_stream(name).await {
        Ok(mut stream) => match stream.info().await {
            Ok(info) => info.state.messages,
            Err(_) => 0,
        },
        Err(_) => 0,
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

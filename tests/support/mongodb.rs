//! A MongoDB server for one test: `nx-27017` (a MongoDB wire-protocol server
//! on SQLite, from PyPI, in the venv `scripts/mongo-emulator` prepares) on a
//! free loopback port with an in-memory database, stopped by PID on drop. An
//! emulator: no real mongod can be installed here. With
//! `IGGY_CONNECT_TEST_MONGODB_URL` set, tests use that server instead (a real
//! mongod; change streams need it to be a replica set).
#![cfg(any(feature = "mongodb-sink", feature = "mongodb-source"))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};

/// The environment variable naming a real MongoDB for the tests.
pub const REAL_URL: &str = "IGGY_CONNECT_TEST_MONGODB_URL";

pub struct MongoServer {
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
    uri: String,
    /// Whether this is a real mongod (from `IGGY_CONNECT_TEST_MONGODB_URL`).
    pub real: bool,
}

impl MongoServer {
    pub fn start() -> Self {
        if let Ok(uri) = std::env::var(REAL_URL) {
            return Self {
                child: None,
                _dir: None,
                uri,
                real: true,
            };
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/mongo-emulator"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/mongo-emulator runs");
        assert!(prepared.status.success(), "scripts/mongo-emulator failed");
        let binary = String::from_utf8(prepared.stdout)
            .unwrap()
            .trim()
            .to_owned();
        let dir = tempfile::tempdir().unwrap();
        let port = super::ports::free_port();
        let mut command = Command::new(&binary);
        command
            .args(["--db", "memory", "--host", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("--log-file")
            .arg(dir.path().join("nx.log"))
            .arg("--pid-file")
            .arg(dir.path().join("nx.pid"))
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
        let child = command.spawn().expect("start nx-27017");
        let server = Self {
            child: Some(child),
            _dir: Some(dir),
            uri: format!("mongodb://127.0.0.1:{port}"),
            real: false,
        };
        server.wait_ready(port);
        server
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The port of the server's URI (the emulator's, or the real one's first host).
    pub fn addr(&self) -> std::net::SocketAddr {
        let rest = self.uri.trim_start_matches("mongodb://");
        let host = rest.rsplit('@').next().unwrap_or(rest);
        let host = host.split(['/', ',', '?']).next().unwrap();
        std::net::ToSocketAddrs::to_socket_addrs(host)
            .unwrap()
            .next()
            .unwrap()
    }

    pub async fn client(&self) -> mongodb::Client {
        let mut options = mongodb::options::ClientOptions::parse(&self.uri)
            .await
            .unwrap();
        options.server_selection_timeout = Some(Duration::from_secs(10));
        mongodb::Client::with_options(options).unwrap()
    }

    /// Every document of `database.collection`, sorted by `_id`.
    pub async fn documents(&self, database: &str, collection: &str) -> Vec<Document> {
        use futures::TryStreamExt;
        self.client()
            .await
            .database(database)
            .collection::<Document>(collection)
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }

    fn wait_ready(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pause = Duration::from_millis(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nx-27017 did not listen within 30 s"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

impl Drop for MongoServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A database name no other test (or earlier run against a real server) uses.
pub fn unique_database(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

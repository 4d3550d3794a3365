//! A real MariaDB (Debian's `mariadb-server` 10.11, installed by
//! `scripts/ensure-debian-packages`) with the row binlog on, one per test
//! process (nextest runs each test in its own process; plain `cargo test` shares
//! one per test binary): a free loopback port, a data directory copied from a
//! template that `mariadb-install-db` builds once per machine (4-5 s, then
//! about 0.3 s per server), every test in a database of its own. The server
//! is killed by PID and its directory removed when the process exits.
#![cfg(any(feature = "mysql-source", feature = "mysql-sink"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

pub struct MariaDb {
    pub port: u16,
    pub pid: u32,
}

/// The server of this process, started on first use.
pub fn server() -> &'static MariaDb {
    static SERVER: OnceLock<MariaDb> = OnceLock::new();
    SERVER.get_or_init(MariaDb::start)
}

/// A fresh database on this process's server, and its URL (user root, no
/// password).
pub async fn create_database(prefix: &str) -> String {
    let server = server();
    let name = unique(prefix);
    let admin = connect(&server.url("mysql")).await;
    execute(&admin, &format!("CREATE DATABASE `{name}`")).await;
    admin.close().await;
    server.url(&name)
}

pub async fn connect(url: &str) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .unwrap_or_else(|error| panic!("cannot connect to the test MariaDB at {url}: {error}"))
}

pub async fn execute(pool: &MySqlPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

pub async fn count(pool: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        nanos % 100_000
    )
}

/// Options shared by the template's install and every server, so the
/// InnoDB files match (a small redo log keeps a copy at ~30 MB).
const INNODB_OPTIONS: [&str; 2] = ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"];

/// What the exit handler stops and removes.
static RUNNING: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

extern "C" fn stop_at_exit() {
    let running = RUNNING.lock().ok().and_then(|mut running| running.take());
    if let Some((pid, dir)) = running {
        // SAFETY: kill and waitpid on the child this process started.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
            libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl MariaDb {
    fn start() -> Self {
        let mariadbd = binary("mariadbd");
        let template = template();
        let dir = tempfile::Builder::new()
            .prefix("iggy-connect-mariadb-")
            .tempdir()
            .unwrap()
            .keep();
        let data = dir.join("data");
        copy_dir(&template, &data);
        // Its own temp files: servers sharing /tmp collide on temp table names.
        let tmp = dir.join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let port = super::ports::free_port();
        let mut command = Command::new(mariadbd);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--user=root",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-bin={}", data.join("binlog").display()))
            .args([
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--server-id=1",
                "--max-connections=500",
                "--innodb-flush-log-at-trx-commit=2",
            ])
            .args(INNODB_OPTIONS)
            .arg(format!("--log-error={}", dir.join("error.log").display()))
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
        // Spawned from a thread that never ends: PR_SET_PDEATHSIG fires when
        // the spawning thread exits, and a test's thread ends with the test.
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(command.spawn());
            loop {
                std::thread::park();
            }
        });
        let child = receiver.recv().unwrap().expect("start mariadbd");
        let pid = child.id();
        std::mem::forget(child);
        *RUNNING.lock().unwrap() = Some((pid, dir.clone()));
        // SAFETY: registers a plain extern "C" function.
        unsafe {
            libc::atexit(stop_at_exit);
        }
        let server = Self { port, pid };
        server.wait_ready(&dir);
        server
    }

    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    fn wait_ready(&self, dir: &Path) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // The server accepts TCP only once InnoDB and the grant tables are up.
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::Read;
                let mut greeting = [0u8; 5];
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                if stream.read_exact(&mut greeting).is_ok() && greeting[4] == 10 {
                    return;
                }
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                panic!("mariadbd did not accept connections within 60 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn binary(name: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: run scripts/ensure-debian-packages (scripts/test does)"
            )
        })
}

/// A data directory fresh from `mariadb-install-db`, built once per machine
/// and version: built aside, then renamed into place, so concurrent test
/// processes never see half of one.
fn template() -> PathBuf {
    let version = Command::new(binary("mariadbd"))
        .arg("--version")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    let tag = version
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let template = std::env::temp_dir().join(format!(
        "iggy-connect-mariadb-template-{tag}-uid{}",
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    ));
    if template.join("mysql").is_dir() {
        return template;
    }
    let building = tempfile::Builder::new()
        .prefix("iggy-connect-mariadb-install-")
        .tempdir()
        .unwrap();
    let data = building.path().join("data");
    let output = Command::new(binary("mariadb-install-db"))
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args([
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .args(INNODB_OPTIONS)
        .output()
        .expect("run mariadb-install-db");
    assert!(
        output.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Another process may have won the race; its template is as good.
    let _ = std::fs::rename(&data, &template);
    assert!(
        template.join("mysql").is_dir(),
        "no template at {template:?}"
    );
    template
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(status.success(), "cp -a {from:?} {to:?} failed");
}

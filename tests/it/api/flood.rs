//! The probe's connection flood against the real binary: 20,000 idle
//! connections to the control API, then slowloris clients (a request head
//! trickled a line at a time) past `max_connections`. The API must answer
//! `/health` on a fresh connection at once (one try, a 1 s request timeout),
//! keep its own descriptors near `max_connections` instead of one per flood
//! connection, and every connector must keep running and moving messages.
//!
//! The binary runs with the probe's 20,000-descriptor limit (this machine's
//! hard limit, which the binary raises its soft limit to). No process here
//! may hold more, so the idle connections are held by two `python3`
//! processes of 10,000 each (python3 is already a test dependency).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::future::join_all;
use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::{Options, random_source, start, stdout_sink, unique};
use crate::support::iggy_server::IggyTestServer;

const IDLE: usize = 20_000;
const SLOWLORIS: usize = 300;
/// `[http] max_connections` by default.
const MAX_CONNECTIONS: usize = 256;

/// Opens `count` connections to `address` and holds them until its stdin
/// closes.
const HOLDER: &str = r#"
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(count):
    held.append(socket.create_connection((host, port)))
print(len(held), flush=True)
sys.stdin.read()
"#;

/// A `python3` process holding idle connections; killed on drop.
struct Holder(Child);

impl Holder {
    /// Returns once all `count` connections are open.
    fn open(address: &str, count: usize) -> Self {
        let (host, port) = address.rsplit_once(':').unwrap();
        let mut child = Command::new("python3")
            .args(["-c", HOLDER, host, port, &count.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            count.to_string(),
            "connections the holder opened"
        );
        Self(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many descriptors process `pid` has open.
fn open_files_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Opens `count` connections to `address`, a batch at a time.
async fn open(address: &str, count: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(count);
    while streams.len() < count {
        let batch = (count - streams.len()).min(500);
        let opened = join_all((0..batch).map(|_| TcpStream::connect(address))).await;
        for stream in opened {
            streams.push(stream.expect("the kernel completes the connection"));
        }
    }
    streams
}

/// A slowloris client: a request head one header line every 200 ms, never
/// finished, until `stop` (or the server closes the connection).
async fn slowloris(mut stream: TcpStream, stop: CancellationToken) {
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        if stream.write_all(b"x-slow: 1\r\n").await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_idle_connections_and_slowloris_leave_health_answering_and_connectors_running()
 {
    let server = IggyTestServer::start();
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let connect = start(
        Options::for_server(&server),
        &[
            random_source(&source, &topic, "", ""),
            stdout_sink(&sink, &topic, ""),
        ],
    );
    connect.wait_for_status("sources", &source, "running").await;
    connect.wait_for_status("sinks", &sink, "running").await;
    let address = connect.url.trim_start_matches("http://").to_owned();

    let idle = tokio::task::spawn_blocking({
        let address = address.clone();
        move || {
            [
                Holder::open(&address, IDLE / 2),
                Holder::open(&address, IDLE / 2),
            ]
        }
    })
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let slow: Vec<_> = open(&address, SLOWLORIS)
        .await
        .into_iter()
        .map(|stream| tokio::spawn(slowloris(stream, stop.clone())))
        .collect();
    let group = format!("iggy-connect-sink-{sink}");
    let offset = || server.stored_offset("api", &topic, &group, 0).unwrap_or(0);
    let before = offset();

    let health = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
        .get(format!("{}/health", connect.url))
        .send()
        .await
        .expect("/health answers within 1 s during the flood (one try)");
    assert_eq!(health.status(), StatusCode::OK);
    let open_files = open_files_of(connect.child.id());
    assert!(
        open_files < MAX_CONNECTIONS + 1_000,
        "the binary holds {open_files} descriptors with {IDLE} idle and {SLOWLORIS} slowloris \
         connections open: the flood, not its connectors, owns them"
    );
    connect.wait_for_status("sources", &source, "running").await;
    connect.wait_for_status("sinks", &sink, "running").await;
    connect
        .wait_for(
            "the sink to commit more messages during the flood",
            async |_| offset() > before + 100,
        )
        .await;
    let log = connect.log_lines().join("\n");
    assert!(
        !log.contains("Too many open files"),
        "a connector ran out of descriptors:\n{log}"
    );
    stop.cancel();
    join_all(slow).await;
    drop(idle);
}

//! A real MQTT broker: Debian's `mosquitto` 2.0 (installed by
//! `scripts/ensure-debian-packages`), one per test, with a config generated
//! in a temp dir (a listener on a free loopback port, persistence there, no
//! limit on queued messages), stopped by PID on drop. `kill_9` and `resume`
//! crash and restart it on the same port and store; `snapshot` makes it
//! write its store first (SIGUSR1), since mosquitto saves only now and then.
//!
//! Also the tests' own MQTT clients: `publish` (QoS 1, every PUBACK awaited)
//! and `Collector`, a QoS 1 subscriber in a persistent session.
#![cfg(any(feature = "mqtt-source", feature = "mqtt-sink"))]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

pub struct Mosquitto {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub port: u16,
    /// The TLS listener of [`Mosquitto::with_tls`].
    pub tls_port: Option<u16>,
    /// The WebSocket listeners of [`Mosquitto::with_websockets`]: plain and TLS.
    pub ws_ports: Option<(u16, u16)>,
}

const BINARY: &str = "/usr/sbin/mosquitto";

impl Mosquitto {
    /// Anyone may connect.
    pub fn start() -> Self {
        Self::with_config("allow_anonymous true\n")
    }

    /// Anyone may connect; `extra` adds config lines.
    pub fn start_with(extra: &str) -> Self {
        Self::with_config(&format!("allow_anonymous true\n{extra}\n"))
    }

    /// Only `username` with `password` may connect.
    pub fn with_login(username: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("passwords");
        let made = Command::new("/usr/bin/mosquitto_passwd")
            .arg("-b")
            .arg("-c")
            .arg(&file)
            .args([username, password])
            .status()
            .expect("run mosquitto_passwd");
        assert!(made.success(), "mosquitto_passwd failed");
        let auth = format!("allow_anonymous false\npassword_file {}\n", file.display());
        Self::in_dir(dir, &auth)
    }

    /// Anyone may connect; `acl` is the ACL file's text (lines before any
    /// `user` line apply to anonymous clients).
    pub fn with_acl(acl: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("acl");
        std::fs::write(&file, acl).unwrap();
        // mosquitto 2.0.11 with no limit on queued messages drops an MQTT
        // 5 connection after a denied QoS 1 publish (instead of going on).
        let config = format!(
            "allow_anonymous true\nacl_file {}\nmax_queued_messages 1000\n",
            file.display()
        );
        Self::in_dir(dir, &config)
    }

    /// Anyone may connect, on `port` as on `tls_port`, where the broker
    /// serves `pki`'s server certificate and, with `require_certificate`,
    /// wants a client certificate its CA signed.
    pub fn with_tls(pki: &super::pki::TestPki, require_certificate: bool) -> Self {
        let tls_port = super::ports::free_port();
        let listener = format!(
            "allow_anonymous true\nlistener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\n\
             keyfile {}\nrequire_certificate {require_certificate}\n",
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display()
        );
        let mut broker = Self::with_config(&listener);
        broker.tls_port = Some(tls_port);
        broker
    }

    /// Anyone may connect, on `port` as over WebSocket on two more ports:
    /// plain and TLS, where the broker serves `pki`'s server certificate and,
    /// with `require_certificate`, wants a client certificate its CA signed.
    /// Mosquitto 2.0.11 binds a WebSocket listener on every address
    /// (libwebsockets takes no bind address) and starts none without a plain
    /// listener beside it.
    pub fn with_websockets(pki: &super::pki::TestPki, require_certificate: bool) -> Self {
        let (ws_port, wss_port) = (super::ports::free_port(), super::ports::free_port());
        let listeners = format!(
            "allow_anonymous true\nlistener {ws_port}\nprotocol websockets\n\
             listener {wss_port}\nprotocol websockets\ncafile {}\ncertfile {}\nkeyfile {}\n\
             require_certificate {require_certificate}\n",
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display()
        );
        let mut broker = Self::with_config(&listeners);
        broker.ws_ports = Some((ws_port, wss_port));
        // The plain listener may be up before the WebSocket ones.
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in [ws_port, wss_port] {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "mosquitto's WebSocket listener {port} did not listen within 30 s: {}",
                    broker.log()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        broker
    }

    /// The plain WebSocket listener's URL, `ws://127.0.0.1:port/mqtt`.
    pub fn ws_url(&self) -> String {
        let (port, _) = self.ws_ports.expect("a broker started with_websockets");
        format!("ws://127.0.0.1:{port}/mqtt")
    }

    /// The TLS WebSocket listener's URL, `wss://localhost:port/mqtt`, by name.
    pub fn wss_url(&self) -> String {
        let (_, port) = self.ws_ports.expect("a broker started with_websockets");
        format!("wss://localhost:{port}/mqtt")
    }

    /// The TLS listener's URL, `mqtts://host:port`, by name.
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("a broker started with_tls");
        format!("mqtts://localhost:{port}")
    }

    fn with_config(auth: &str) -> Self {
        Self::in_dir(tempfile::tempdir().unwrap(), auth)
    }

    fn in_dir(dir: tempfile::TempDir, auth: &str) -> Self {
        assert!(
            std::path::Path::new(BINARY).exists(),
            "mosquitto is not installed: run scripts/ensure-debian-packages (scripts/test does)"
        );
        let port = super::ports::free_port();
        let unlimited = if auth.contains("max_queued_messages") {
            ""
        } else {
            "max_queued_messages 0\n"
        };
        let config = format!(
            "listener {port} 127.0.0.1\n{auth}\
             persistence true\npersistence_location {dir}/\n\
             {unlimited}\
             user root\n\
             log_dest file {dir}/mosquitto.log\n",
            dir = dir.path().display()
        );
        std::fs::write(dir.path().join("mosquitto.conf"), config).unwrap();
        let mut broker = Self {
            child: None,
            dir,
            port,
            tls_port: None,
            ws_ports: None,
        };
        broker.spawn();
        broker
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("mosquitto.db")
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Makes the broker write its store now, and waits until it did.
    pub fn snapshot(&self) {
        let before = std::fs::metadata(self.store())
            .and_then(|meta| meta.modified())
            .ok();
        let child = self.child.as_ref().expect("the broker is running");
        signal(child.id(), "-USR1");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = std::fs::metadata(self.store())
                .and_then(|meta| meta.modified())
                .ok();
            if now.is_some() && now != before {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "mosquitto did not write its store"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL: what the store does not hold yet is gone.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: mosquitto writes its store and exits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts the broker again on the same port and store.
    pub fn resume(&mut self) {
        self.spawn();
    }

    fn spawn(&mut self) {
        let mut command = Command::new(BINARY);
        command
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
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
        self.child = Some(command.spawn().expect("start mosquitto"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("mosquitto exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill_9();
    }
}

fn options(port: u16, client_id: &str) -> MqttOptions {
    let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
    options
        .set_keep_alive(Duration::from_secs(5))
        .set_max_packet_size(8 * 1024 * 1024, 8 * 1024 * 1024);
    options
}

/// A name no other client of this process uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

/// Publishes each payload to `topic` with QoS 1 and returns once the broker
/// acknowledged every one.
pub async fn publish(port: u16, topic: &str, payloads: Vec<Bytes>) {
    let mut options = options(port, &unique("test-publisher"));
    options.set_inflight(200);
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    let count = payloads.len();
    let sender = client.clone();
    let topic = topic.to_owned();
    let sending = tokio::spawn(async move {
        for payload in payloads {
            sender
                .publish_bytes(topic.clone(), QoS::AtLeastOnce, false, payload)
                .await
                .unwrap();
        }
    });
    let mut acked = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked < count {
        let event = tokio::time::timeout_at(deadline, eventloop.poll())
            .await
            .expect("the broker acknowledged every publish within 60 s")
            .expect("publishing");
        if let Event::Incoming(Packet::PubAck(_)) = event {
            acked += 1;
        }
    }
    sending.await.unwrap();
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(event) = eventloop.poll().await {
            if event == Event::Outgoing(Outgoing::Disconnect) {
                break;
            }
        }
    })
    .await;
}

/// Creates the persistent session `client_id` subscribed to `filter` with
/// QoS 1, as a source's first start does, so that what is published from
/// now on waits in it.
pub async fn create_session(port: u16, client_id: &str, filter: &str) {
    let mut options = options(port, client_id);
    options.set_clean_session(false).set_manual_acks(true);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let event = tokio::time::timeout_at(deadline, eventloop.poll())
            .await
            .expect("a SUBACK within 30 s")
            .expect("subscribing");
        if let Event::Incoming(Packet::SubAck(_)) = event {
            break;
        }
    }
    let _ = client.try_disconnect();
    while let Ok(event) = eventloop.poll().await {
        if event == Event::Outgoing(Outgoing::Disconnect) {
            break;
        }
    }
}

/// Connects as `client_id` (its persistent session), takes what the broker
/// hands over until `done` says it is enough or `within` passed, and leaves
/// without acknowledging any of it: the session keeps it all.
pub async fn held_for(
    port: u16,
    client_id: &str,
    within: Duration,
    mut done: impl FnMut(&[Bytes]) -> bool,
) -> Vec<Bytes> {
    let mut options = options(port, client_id);
    options.set_clean_session(false).set_manual_acks(true);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let mut held = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while !done(&held) {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(publish))) => held.push(publish.payload),
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(event) = eventloop.poll().await {
            if event == Event::Outgoing(Outgoing::Disconnect) {
                break;
            }
        }
    })
    .await;
    held
}

/// A QoS 1 subscriber in a persistent session that keeps every payload it
/// receives (acknowledging it) and reconnects after a broker restart.
pub struct Collector {
    received: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
    port: u16,
    topic: String,
}

impl Collector {
    /// Subscribed to `filter`; `topic` (matching it) carries the markers of
    /// [`Collector::settled`].
    pub async fn start(port: u16, filter: &str, topic: &str) -> Self {
        let mut options = options(port, &unique("test-collector"));
        options.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(options, 16);
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => break,
                Ok(_) => {}
                Err(error) => panic!("the collector cannot subscribe: {error}"),
            }
        }
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        let filter = filter.to_owned();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        kept.lock().unwrap().push(publish.payload)
                    }
                    // A broker that lost the session (a crash before it
                    // saved it) lost the subscription too.
                    Ok(Event::Incoming(Packet::ConnAck(connack))) if !connack.session_present => {
                        let _ = client.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        Self {
            received,
            task,
            port,
            topic: topic.to_owned(),
        }
    }

    /// Every payload received so far, markers left out.
    pub fn received(&self) -> Vec<Bytes> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|payload| !payload.starts_with(b"marker-"))
            .cloned()
            .collect()
    }

    /// Waits until everything the broker acknowledged before this call has
    /// reached the collector: a marker published now arrives after it.
    pub async fn settled(&self) -> Result<(), String> {
        let marker = Bytes::from(unique("marker"));
        publish(self.port, &self.topic, vec![marker.clone()]).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.received.lock().unwrap().contains(&marker) {
            if Instant::now() > deadline {
                return Err("the collector's marker did not arrive within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

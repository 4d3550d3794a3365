//! A real RabbitMQ broker (Debian's `rabbitmq-server` 3.10, installed by
//! `scripts/ensure-debian-packages`), one per test process: it takes seconds
//! to start, so tests sharing a process (plain `cargo test`; nextest gives each
//! its own) share it and keep apart by unique queue
//! and exchange names. Everything of it is its own: a temp directory for its
//! data (mnesia), logs, config and Erlang cookie (`HOME`), a free loopback
//! AMQP port, a free distribution port, and an `epmd` of its own on a free
//! port (so nothing collides with another broker or test process). No plugin
//! is enabled (no management). An AMQPS listener on `tls_port` serves a
//! certificate of a test PKI generated at start (`pki`), asking for a client
//! certificate and verifying one that is sent, but not requiring it. Both processes are children of a thread that
//! lives as long as the binary and die with it (`PR_SET_PDEATHSIG`); `kill`
//! stops the broker by its PID with SIGKILL, `restart` starts it again on the
//! same port and data directory.
#![cfg(any(feature = "rabbitmq-source", feature = "rabbitmq-sink"))]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use amqprs::BasicProperties;
use amqprs::channel::{
    BasicAckArguments, BasicGetArguments, BasicPublishArguments, Channel, ConfirmSelectArguments,
    QueueBindArguments, QueueDeclareArguments, QueuePurgeArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};

const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const EPMD: &str = "/usr/bin/epmd";

pub struct RabbitServer {
    broker: Option<Child>,
    epmd: Option<Child>,
    dir: tempfile::TempDir,
    node: String,
    pub port: u16,
    /// The AMQPS listener.
    pub tls_port: u16,
    pub pki: super::pki::TestPki,
    dist_port: u16,
    epmd_port: u16,
}

/// Runs `job` on a thread that lives as long as the test process, so a
/// process it spawns (dying with its parent thread) outlives any one test.
fn on_keeper<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> T {
    type Job = Box<dyn FnOnce() + Send>;
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("rabbitmq-keeper".into())
            .spawn(move || {
                for job in jobs {
                    job();
                }
                // Keep the children's parent thread alive until the process ends.
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
        Mutex::new(sender)
    });
    let (done, result) = mpsc::channel();
    keeper
        .lock()
        .unwrap()
        .send(Box::new(move || {
            let _ = done.send(job());
        }))
        .unwrap();
    result.recv().unwrap()
}

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

/// The broker of this test process, started on first use.
pub fn shared() -> std::sync::MutexGuard<'static, RabbitServer> {
    static SHARED: OnceLock<Mutex<RabbitServer>> = OnceLock::new();
    SHARED
        .get_or_init(|| Mutex::new(RabbitServer::start()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The shared broker's AMQP port.
pub fn port() -> u16 {
    shared().port
}

/// A name no other test of this run uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl RabbitServer {
    pub fn start() -> Self {
        assert!(
            std::path::Path::new(SERVER).exists(),
            "rabbitmq-server is not installed: run scripts/ensure-debian-packages (scripts/test does)"
        );
        let dir = tempfile::tempdir().unwrap();
        for sub in ["home", "mnesia", "log"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").unwrap();
        let pki = super::pki::TestPki::generate();
        let tls_port = super::ports::free_port();
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!(
                "disk_free_limit.absolute = 1MB\nlog.console = false\nlog.file.level = warning\n\
                 listeners.ssl.1 = 127.0.0.1:{tls_port}\n\
                 ssl_options.cacertfile = {}\nssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\nssl_options.verify = verify_peer\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                pki.ca.display(),
                pki.server_cert.display(),
                pki.server_key.display()
            ),
        )
        .unwrap();
        let mut server = Self {
            broker: None,
            epmd: None,
            node: format!("{}@localhost", unique("rabbit").replace('-', "_")),
            dir,
            port: super::ports::free_port(),
            tls_port,
            pki,
            dist_port: super::ports::free_port(),
            epmd_port: super::ports::free_port(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        if self.epmd.is_none() {
            let mut epmd = Command::new(EPMD);
            epmd.args([
                "-port",
                &self.epmd_port.to_string(),
                "-address",
                "127.0.0.1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            die_with_parent(&mut epmd);
            self.epmd = Some(on_keeper(move || epmd.spawn().expect("start epmd")));
        }
        let dir = self.dir.path();
        let mut command = Command::new(SERVER);
        command
            .arg("-noinput")
            .env("HOME", dir.join("home"))
            .env("RABBITMQ_ALLOW_INPUT", "1")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_PID_FILE", dir.join("rabbit.pid"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        self.broker = Some(on_keeper(move || {
            command.spawn().expect("start rabbitmq-server")
        }));
        self.wait_ready();
    }

    /// Until the broker answers the AMQP protocol header with its
    /// `connection.start` (it listens only once it has booted).
    fn wait_ready(&mut self) {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut frame_type = [0u8; 1];
                if stream.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
                    && stream.read_exact(&mut frame_type).is_ok()
                    && frame_type[0] == 1
                {
                    return;
                }
            }
            if let Some(broker) = self.broker.as_mut()
                && let Ok(Some(status)) = broker.try_wait()
            {
                panic!(
                    "rabbitmq-server exited with {status}; logs: {}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "rabbitmq-server did not answer within 90 s; logs: {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("log")) {
            for entry in entries.flatten() {
                text += &std::fs::read_to_string(entry.path()).unwrap_or_default();
            }
        }
        text.chars()
            .rev()
            .take(4000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    }

    /// Kills the broker (SIGKILL, by its PID) and waits until it is gone.
    /// Definitions declared since the last
    /// [`sync_definitions`](Self::sync_definitions) may not survive it.
    pub fn kill(&mut self) {
        if let Some(mut broker) = self.broker.take() {
            let _ = broker.kill();
            let _ = broker.wait();
        }
    }

    /// Starts the broker again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts the broker after [`kill`](Self::kill).
    pub fn resume(&mut self) {
        if self.broker.is_none() {
            self.spawn();
        }
    }
}

impl RabbitServer {
    /// The messages of `queue` ready and delivered-unacknowledged, as the
    /// broker counts them (`rabbitmqctl list_queues`).
    pub fn counts(&self, queue: &str) -> (u64, u64) {
        let text = self.ctl(&[
            "list_queues",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ]);
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [name, ready, unacked] = fields[..]
                && name == queue
            {
                return (ready.parse().unwrap(), unacked.parse().unwrap());
            }
        }
        panic!("rabbitmqctl lists no queue {queue}: {text}");
    }

    /// Writes the broker's definitions (queues, exchanges, bindings) to disk
    /// now, so that a [`kill`](Self::kill) after this keeps them.
    ///
    /// RabbitMQ 3.10 keeps its definitions in Mnesia. A declaration changes
    /// a RAM table and a disc table, so Mnesia commits it with its
    /// asymmetric protocol and logs two records: the change, marked
    /// "presume abort", and then its outcome, "committed". The outcome goes
    /// through `disk_log:alog`, whose write cache holds it for up to two
    /// seconds, and `declare-ok` does not wait for it. A broker killed in
    /// that window rolls the declaration back on restart: the queue is gone,
    /// with the messages it had confirmed. `mnesia:sync_log()` writes and
    /// fsyncs that cache.
    pub fn sync_definitions(&self) {
        let answer = self.ctl(&["eval", "mnesia:sync_log()."]);
        assert_eq!(answer.trim(), "ok", "mnesia:sync_log() answered {answer}");
    }

    /// `rabbitmqctl` with `args` against this broker: its standard output,
    /// after it succeeded.
    fn ctl(&self, args: &[&str]) -> String {
        let home = self.dir.path();
        let output = Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
            .args(["-n", &self.node, "-q"])
            .args(args)
            .env("HOME", home.join("home"))
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_CONF_ENV_FILE", home.join("rabbitmq-env.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                home.join("enabled_plugins"),
            )
            .output()
            .expect("run rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for RabbitServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut epmd) = self.epmd.take() {
            let _ = epmd.kill();
            let _ = epmd.wait();
        }
    }
}

/// A client connection (guest) with one channel.
pub struct Client {
    pub connection: Connection,
    pub channel: Channel,
}

pub async fn client(port: u16) -> Client {
    let connection = Connection::open(&OpenConnectionArguments::new(
        "127.0.0.1",
        port,
        "guest",
        "guest",
    ))
    .await
    .unwrap();
    let channel = connection.open_channel(None).await.unwrap();
    Client {
        connection,
        channel,
    }
}

impl Client {
    /// Declares durable queue `queue`, bound to `exchange` with `key` when given.
    pub async fn queue(&self, queue: &str, binding: Option<(&str, &str)>) {
        self.channel
            .queue_declare(QueueDeclareArguments::durable_client_named(queue).finish())
            .await
            .unwrap();
        if let Some((exchange, key)) = binding {
            self.channel
                .queue_bind(QueueBindArguments::new(queue, exchange, key))
                .await
                .unwrap();
        }
    }

    /// How many messages `queue` holds ready (delivered-unacked ones excluded).
    pub async fn ready(&self, queue: &str) -> u32 {
        let declared = self
            .channel
            .queue_declare(QueueDeclareArguments::new(queue).passive(true).finish())
            .await
            .unwrap();
        declared.map_or(0, |(_, ready, _)| ready)
    }

    pub async fn purge(&self, queue: &str) {
        self.channel
            .queue_purge(QueuePurgeArguments::new(queue))
            .await
            .unwrap();
    }

    /// Takes every ready message of `queue` (acked): its properties and body.
    ///
    /// On a channel of its own, opened again when a `basic.get` fails:
    /// amqprs 2.1 can lose the race between registering a get's responder
    /// and the broker's fast answer ("get responder must be registered"),
    /// which kills the channel. A message got and not yet acked goes back
    /// to the queue with the dead channel, so nothing is lost or doubled.
    pub async fn drain(&self, queue: &str) -> Vec<(BasicProperties, Vec<u8>)> {
        let mut messages = Vec::new();
        for attempt in 1..=5 {
            let channel = self.connection.open_channel(None).await.unwrap();
            loop {
                let got = match channel.basic_get(BasicGetArguments::new(queue)).await {
                    Ok(got) => got,
                    Err(error) if attempt < 5 => {
                        eprintln!("drain {queue}: basic.get failed ({error}); on a new channel");
                        break;
                    }
                    Err(error) => {
                        panic!("drain {queue}: basic.get failed {attempt} times: {error}")
                    }
                };
                let Some((get_ok, properties, body)) = got else {
                    let _ = channel.close().await;
                    return messages;
                };
                if channel
                    .basic_ack(BasicAckArguments::new(get_ok.delivery_tag(), false))
                    .await
                    .is_err()
                {
                    break;
                }
                messages.push((properties, body));
            }
        }
        unreachable!("the last attempt returns or panics")
    }
}

/// What the broker answered the test's publishes: the highest confirmed tag
/// and how many messages it returned as unroutable.
#[derive(Clone, Default)]
struct Confirms {
    acked: std::sync::Arc<std::sync::atomic::AtomicU64>,
    returned: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl amqprs::callbacks::ChannelCallback for Confirms {
    async fn close(
        &mut self,
        _: &Channel,
        close: amqprs::CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        panic!("the broker closed the test's publishing channel: {close}");
    }
    async fn cancel(&mut self, _: &Channel, _: amqprs::Cancel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }
    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _: &Channel, ack: amqprs::Ack) {
        // Tags come in order; `multiple` covers all before it, and a single
        // ack comes only after the ones before it were acked too.
        self.acked.fetch_max(ack.delivery_tag(), Ordering::SeqCst);
    }
    async fn publish_nack(&mut self, _: &Channel, nack: amqprs::Nack) {
        panic!("the broker nacked test message {}", nack.delivery_tag());
    }
    async fn publish_return(
        &mut self,
        _: &Channel,
        _: amqprs::Return,
        _: BasicProperties,
        _: Vec<u8>,
    ) {
        // The broker sends a return before the confirm of the same message.
        self.returned.fetch_add(1, Ordering::SeqCst);
    }
}

/// Publishes each body to `exchange` with routing key `key` (`""` and a queue
/// name: to that queue), persistent, and waits until the broker confirmed
/// every one (each is then on disk in its durable queue).
pub async fn publish_to(
    port: u16,
    exchange: &str,
    key: &str,
    bodies: impl IntoIterator<Item = Vec<u8>>,
) {
    let persistent = BasicProperties::default().with_persistence(true).finish();
    let messages = bodies.into_iter().map(|body| (persistent.clone(), body));
    publish_messages(port, exchange, key, messages).await;
}

/// Publishes each (properties, body) `mandatory` and waits until every one
/// was confirmed and routed to a queue; a message the broker returns as
/// unroutable fails the test. A restarted broker recovers its durable queues
/// and bindings before it listens, so a return means a wrong binding or a
/// definition the restart lost (see [`RabbitServer::sync_definitions`]).
pub async fn publish_messages(
    port: u16,
    exchange: &str,
    key: &str,
    messages: impl IntoIterator<Item = (BasicProperties, Vec<u8>)>,
) {
    let client = client(port).await;
    let confirms = Confirms::default();
    client
        .channel
        .register_callback(confirms.clone())
        .await
        .unwrap();
    client
        .channel
        .confirm_select(ConfirmSelectArguments::new(false))
        .await
        .unwrap();
    let mut count = 0u64;
    for (properties, body) in messages {
        client
            .channel
            .basic_publish(
                properties,
                body,
                BasicPublishArguments::new(exchange, key)
                    .mandatory(true)
                    .finish(),
            )
            .await
            .unwrap();
        count += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while confirms.acked.load(Ordering::SeqCst) < count {
        assert!(
            Instant::now() < deadline,
            "the broker did not confirm the test's messages within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let returned = confirms.returned.load(Ordering::SeqCst);
    assert_eq!(
        returned, 0,
        "the broker returned {returned} of {count} test messages as unroutable \
         (exchange {exchange:?}, routing key {key:?})"
    );
    let _ = client.channel.close().await;
    let _ = client.connection.close().await;
}

/// [`publish_to`] the queue `queue` through the default exchange.
pub async fn publish(port: u16, queue: &str, bodies: impl IntoIterator<Item = Vec<u8>>) {
    publish_to(port, "", queue, bodies).await;
}

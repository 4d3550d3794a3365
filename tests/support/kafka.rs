//! A real Kafka-protocol broker for the kafka connectors' tests and bench:
//! tansu 0.6.0 (an independent Kafka-protocol broker in Rust, Apache-2.0),
//! installed by `scripts/ensure-tansu`, one per test on a free loopback port
//! with memory storage, stopped by its PID when dropped (and dying with the
//! test process). A raw rdkafka producer and consumer read and write the
//! other side, never the connector under test.
#![cfg(any(feature = "kafka-source", feature = "kafka-sink"))]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// librdkafka's default session timeout makes tansu's group join take
/// about 23 s; with this one it takes about 3 s.
pub const SESSION_TIMEOUT_MS: &str = "6000";

pub struct KafkaBroker {
    child: Option<Child>,
    /// The port it listens on.
    pub port: u16,
    /// The port it tells clients to connect to (a proxy's, or its own).
    pub advertised: u16,
    setup: BrokerSetup,
}

/// How a broker is started besides its ports.
#[derive(Debug, Clone, Default)]
pub struct BrokerSetup {
    /// An S3 API endpoint and bucket to keep the data in (through tansu's
    /// `s3://` storage engine), so it survives a restart of the broker;
    /// memory storage when `None`.
    pub s3: Option<(String, String)>,
    /// Require SASL from every client (`--authentication`).
    pub authentication: bool,
}

/// The tansu binary `scripts/ensure-tansu` installs.
pub fn tansu() -> PathBuf {
    let path = match std::env::var_os("IGGY_CONNECT_TANSU") {
        Some(path) => PathBuf::from(path),
        None => {
            let cache = std::env::var_os("IGGY_CONNECT_TANSU_DIR")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME")
                        .map(|dir| PathBuf::from(dir).join("iggy-connect/tansu"))
                })
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/iggy-connect/tansu")
                });
            cache.join("0.6.0/tansu")
        }
    };
    assert!(
        path.is_file(),
        "tansu is not installed at {}: run scripts/ensure-tansu (scripts/test does)",
        path.display()
    );
    path
}

impl KafkaBroker {
    /// A broker on a free port of its own.
    pub fn start() -> Self {
        let port = super::ports::free_port();
        Self::start_at(port, port)
    }

    /// A broker listening on `port` that sends clients to `advertised`.
    pub fn start_at(port: u16, advertised: u16) -> Self {
        Self::start_with(port, advertised, BrokerSetup::default())
    }

    /// A broker listening on `port`, sending clients to `advertised`, started
    /// with `setup`.
    pub fn start_with(port: u16, advertised: u16, setup: BrokerSetup) -> Self {
        let mut broker = Self {
            child: None,
            port,
            advertised,
            setup,
        };
        broker.spawn();
        broker
    }

    /// Kills the broker (SIGKILL) and starts it again on the same port with
    /// `setup`; what it stored survives only with S3 storage. tansu 0.6.0
    /// restarted (SIGKILL or SIGTERM) with a produce in flight can report
    /// that batch delivered and still lose it: a raw idempotent rdkafka
    /// producer (acks=all) found its batch reported delivered and missing
    /// after the restart in 2 of 8 runs with SIGKILL, 1 of 10 with SIGTERM.
    pub fn restart_with(&mut self, setup: BrokerSetup) {
        self.kill();
        self.setup = setup;
        self.spawn();
    }

    /// Kills the broker (SIGKILL) and starts it again as it was.
    pub fn restart(&mut self) {
        self.restart_with(self.setup.clone());
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    fn spawn(&mut self) {
        let listen = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://127.0.0.1:{}", self.advertised);
        let mut command = Command::new(tansu());
        command
            .args(["broker", "--listener-url", &listen])
            .args(["--advertised-listener-url", &advertised])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match &self.setup.s3 {
            None => {
                command.args(["--storage-engine", "memory://tansu/"]);
            }
            Some((endpoint, bucket)) => {
                command
                    .args(["--storage-engine", &format!("s3://{bucket}/")])
                    .env("AWS_ENDPOINT", endpoint)
                    .env("AWS_ALLOW_HTTP", "true")
                    .env("AWS_DEFAULT_REGION", "us-east-1")
                    .env("AWS_ACCESS_KEY_ID", "test")
                    .env("AWS_SECRET_ACCESS_KEY", "test");
            }
        }
        if self.setup.authentication {
            command.arg("--authentication");
        }
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
        self.child = Some(command.spawn().expect("start tansu"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the broker (SIGKILL, by its PID).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.kill();
    }
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

fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    config
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = client_config(bootstrap).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    for result in created {
        result.unwrap_or_else(|(topic, error)| panic!("creating {topic}: {error:?}"));
    }
}

/// A record as produced or read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

/// Produces `(key, payload)` records to `topic` (partition chosen by key,
/// or `partition` when given), waiting for each delivery.
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    partition: Option<i32>,
    records: impl IntoIterator<Item = (Option<String>, Vec<u8>)>,
) {
    let producer: FutureProducer = client_config(bootstrap)
        .set("linger.ms", "5")
        // Every record is queued before the first is awaited: a million-
        // record topic must fit librdkafka's queue (100,000 by default).
        .set("queue.buffering.max.messages", "2000000")
        .create()
        .unwrap();
    let mut deliveries = Vec::new();
    for (key, payload) in records {
        let headers = OwnedHeaders::new().insert(Header {
            key: "origin",
            value: Some("test"),
        });
        let mut record = FutureRecord::to(topic).payload(&payload).headers(headers);
        if let Some(key) = &key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(error, _)| error)
                .unwrap(),
        );
    }
    for delivery in deliveries {
        delivery.await.unwrap().map_err(|(error, _)| error).unwrap();
    }
}

/// Every record of `topic`'s `partitions` from the beginning, read without
/// a group, until `count` were read or `timeout` passed.
pub async fn read_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    count: usize,
    timeout: Duration,
) -> Vec<Record> {
    read(bootstrap, topic, partitions, count, timeout, None).await
}

/// Every record of `topic`'s `partitions` from the beginning, read until
/// none came for `idle` (tansu's high watermark is not to be trusted after a
/// batch of several records, so the end is not asked for).
pub async fn read_until_idle(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    idle: Duration,
) -> Vec<Record> {
    read(
        bootstrap,
        topic,
        partitions,
        usize::MAX,
        Duration::from_secs(60),
        Some((idle, true)),
    )
    .await
}

/// As [`read_until_idle`], for at most `timeout` in all (a large topic
/// takes longer than the minute that one allows).
pub async fn read_until_idle_within(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    idle: Duration,
    timeout: Duration,
) -> Vec<Record> {
    read(
        bootstrap,
        topic,
        partitions,
        usize::MAX,
        timeout,
        Some((idle, false)),
    )
    .await
}

async fn read(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    count: usize,
    timeout: Duration,
    // How long no record may come before the read ends, and whether that
    // holds before the first record too (otherwise the first may take up
    // to `timeout`: a large topic on S3 storage is slow to answer).
    idle: Option<(Duration, bool)>,
) -> Vec<Record> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&bootstrap)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        // A topic the broker created itself may have more partitions.
        let known = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .ok()
            .and_then(|metadata| {
                let found = metadata.topics().first()?.partitions().len();
                i32::try_from(found).ok()
            })
            .unwrap_or(0);
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions.max(known) {
            assignment
                .add_partition_offset(&topic, partition, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let deadline = Instant::now() + timeout;
        let mut records = Vec::new();
        let mut last = Instant::now();
        while records.len() < count && Instant::now() < deadline {
            let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) else {
                if idle.is_some_and(|(idle, before_first)| {
                    (before_first || !records.is_empty()) && last.elapsed() >= idle
                }) {
                    break;
                }
                continue;
            };
            last = Instant::now();
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|header| {
                            (
                                header.key.to_owned(),
                                header.value.unwrap_or_default().to_vec(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            records.push(Record {
                partition: message.partition(),
                offset: message.offset(),
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().unwrap_or_default().to_vec(),
                headers,
            });
        }
        records
    })
    .await
    .unwrap()
}

/// The offsets `group` committed for `topic`'s `partitions` (`None` where
/// it committed nothing).
pub async fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<Option<i64>> {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&bootstrap)
            .set("group.id", &group)
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        committed
            .elements()
            .iter()
            .map(|element| match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            })
            .collect()
    })
    .await
    .unwrap()
}

/// A TLS terminator on the port a broker advertises, in front of its
/// listener: tansu 0.6.0 serves no TLS. A connection that opens with a TLS
/// handshake record (first byte 0x16; a Kafka request opens with its
/// length, whose first byte is 0 for any request under 16 MiB) is
/// terminated here with the test PKI's server certificate, which requires
/// a client certificate the test CA signed; any other connection is relayed
/// as it is, so the raw clients of this module keep speaking plaintext to
/// the same advertised address. Counts the TLS sessions it relays.
pub struct TlsFront {
    /// The port to advertise.
    pub port: u16,
    sessions: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Listens on a port of its own (for the broker to advertise) and
    /// relays to the broker listening on `broker`.
    pub async fn start(broker: u16, pki: &super::pki::TestPki) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use std::sync::Arc;
        let certificates = |path: &PathBuf| -> Vec<CertificateDer<'static>> {
            CertificateDer::pem_file_iter(path)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for certificate in certificates(&pki.ca) {
            roots.add(certificate).unwrap();
        }
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(clients)
            .with_single_cert(
                certificates(&pki.server_cert),
                PrivateKeyDer::from_pem_file(&pki.server_key).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sessions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = sessions.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    let mut first = [0u8; 1];
                    if inbound.peek(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", broker)).await
                    else {
                        return;
                    };
                    if first[0] == 0x16 {
                        // A handshake that fails (the client refused our
                        // certificate, or sent none) ends the connection.
                        let Ok(mut inbound) = acceptor.accept(inbound).await else {
                            return;
                        };
                        counted.fetch_add(1, Ordering::Relaxed);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    } else {
                        let mut inbound = inbound;
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            port,
            sessions,
            task,
        }
    }

    /// TLS sessions established so far (handshake completed).
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Relaxed)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A SASL front on the port a broker advertises: tansu 0.6.0 offers no
/// PLAIN, and no SCRAM user can log in to it. It answers a client's
/// `SaslHandshake` (v0-1) and `SaslAuthenticate` (v0-1, the versions
/// librdkafka speaks) itself, from the Kafka protocol's documentation and
/// RFC 5802/7677 for SCRAM, accepting one user and password with the
/// mechanisms it offers, and relays everything else to the broker: the
/// `ApiVersions` before the login (tansu's answer lists both SASL
/// requests), and the whole connection after it. A connection whose first
/// request after `ApiVersions` is not a login (the raw test clients) is
/// relayed as it is. Counts the logins it accepted.
pub struct SaslFront {
    /// The port to advertise.
    pub port: u16,
    logins: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const API_VERSIONS: i16 = 18;
/// Kafka's error codes for a mechanism not offered and a refused login.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const SASL_AUTHENTICATION_FAILED: i16 = 58;
const SCRAM_ITERATIONS: u32 = 4096;

/// Who a [`SaslFront`] lets in, and how.
struct Login {
    user: String,
    password: String,
    mechanisms: Vec<String>,
}

impl SaslFront {
    /// Listens on a port of its own (for the broker to advertise), accepts
    /// `user` with `password` through any of `mechanisms` (`PLAIN`,
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512`), and relays to the broker
    /// listening on `broker`.
    pub async fn start(broker: u16, user: &str, password: &str, mechanisms: &[&str]) -> Self {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let logins = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = logins.clone();
        let login = Arc::new(Login {
            user: user.to_owned(),
            password: password.to_owned(),
            mechanisms: mechanisms.iter().map(|&name| name.to_owned()).collect(),
        });
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (counted, login) = (counted.clone(), login.clone());
                tokio::spawn(async move {
                    let _ = sasl_relay(inbound, broker, &login, &counted).await;
                });
            }
        });
        Self { port, logins, task }
    }

    /// Logins accepted so far.
    pub fn logins(&self) -> usize {
        self.logins.load(Ordering::Relaxed)
    }
}

impl Drop for SaslFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a login through a [`SaslFront`] came to after one `SaslAuthenticate`.
enum Step {
    /// Send these bytes back and wait for the client's next message.
    Challenge(Vec<u8>),
    /// Logged in: send these bytes back, then relay the connection.
    Accepted(Vec<u8>),
    Refused,
}

/// One connection through a [`SaslFront`].
async fn sasl_relay(
    mut inbound: tokio::net::TcpStream,
    broker: u16,
    login: &Login,
    logins: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut outbound = tokio::net::TcpStream::connect(("127.0.0.1", broker)).await?;
    let mut mechanism = String::new();
    let mut scram: Option<Scram> = None;
    loop {
        let request = read_frame(&mut inbound).await?;
        let (api_key, version, correlation, body) = parse_request(&request)?;
        let mut response = correlation.to_be_bytes().to_vec();
        match api_key {
            API_VERSIONS => {
                outbound.write_all(&frame(&request)).await?;
                let answer = read_frame(&mut outbound).await?;
                inbound.write_all(&frame(&answer)).await?;
                continue;
            }
            SASL_HANDSHAKE => {
                mechanism = String::from_utf8_lossy(kafka_bytes(body, 2)?).into_owned();
                let offered = login.mechanisms.contains(&mechanism);
                let error = if offered {
                    0
                } else {
                    UNSUPPORTED_SASL_MECHANISM
                };
                response.extend(error.to_be_bytes());
                response.extend((login.mechanisms.len() as i32).to_be_bytes());
                for name in &login.mechanisms {
                    response.extend((name.len() as i16).to_be_bytes());
                    response.extend(name.as_bytes());
                }
                inbound.write_all(&frame(&response)).await?;
            }
            SASL_AUTHENTICATE => {
                let token = kafka_bytes(body, 4)?;
                let step = match mechanism.as_str() {
                    // `authzid \0 authcid \0 password`, the authzid empty.
                    "PLAIN"
                        if token == format!("\0{}\0{}", login.user, login.password).as_bytes() =>
                    {
                        Step::Accepted(Vec::new())
                    }
                    "SCRAM-SHA-256" | "SCRAM-SHA-512" => match scram.take() {
                        None => {
                            let (state, challenge) = Scram::first(&mechanism, login, token);
                            scram = state;
                            challenge
                        }
                        Some(state) => state.last(login, token),
                    },
                    _ => Step::Refused,
                };
                let (error, message, bytes) = match &step {
                    Step::Challenge(bytes) | Step::Accepted(bytes) => (0, None, bytes.as_slice()),
                    Step::Refused => (
                        SASL_AUTHENTICATION_FAILED,
                        Some("Authentication failed: Invalid username or password"),
                        &[][..],
                    ),
                };
                response.extend(error.to_be_bytes());
                match message {
                    Some(text) => {
                        response.extend((text.len() as i16).to_be_bytes());
                        response.extend(text.as_bytes());
                    }
                    None => response.extend((-1i16).to_be_bytes()),
                }
                response.extend((bytes.len() as i32).to_be_bytes());
                response.extend(bytes);
                if version >= 1 {
                    response.extend(0i64.to_be_bytes());
                }
                inbound.write_all(&frame(&response)).await?;
                match step {
                    Step::Challenge(_) => {}
                    Step::Accepted(_) => {
                        logins.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Step::Refused => return Ok(()),
                }
            }
            _ => {
                outbound.write_all(&frame(&request)).await?;
                break;
            }
        }
    }
    tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
    Ok(())
}

/// A SCRAM exchange between the client's first message and its last.
struct Scram {
    hash: ScramHash,
    /// `n=USER,r=CLIENT_NONCE`, the server's first message, and the nonce.
    client_first_bare: String,
    server_first: String,
    nonce: String,
    salt: Vec<u8>,
}

/// The hash functions of one SCRAM mechanism.
struct ScramHash {
    hmac: fn(&[u8], &[u8]) -> Vec<u8>,
    hash: fn(&[u8]) -> Vec<u8>,
    salted: fn(&[u8], &[u8], u32) -> Vec<u8>,
}

macro_rules! scram_hash {
    ($digest:ty) => {
        ScramHash {
            hmac: |key, data| {
                use hmac::{KeyInit as _, Mac as _};
                let mut mac = hmac::Hmac::<$digest>::new_from_slice(key).unwrap();
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            },
            hash: |data| <$digest as sha2::Digest>::digest(data).to_vec(),
            salted: |password, salt, rounds| {
                let mut out = vec![0; <$digest as sha2::Digest>::output_size()];
                pbkdf2::pbkdf2::<hmac::Hmac<$digest>>(password, salt, rounds, &mut out).unwrap();
                out
            },
        }
    };
}

impl Scram {
    /// Takes `n,,n=USER,r=CLIENT_NONCE` and answers `r=NONCE,s=SALT,i=N`.
    fn first(mechanism: &str, login: &Login, token: &[u8]) -> (Option<Self>, Step) {
        let text = String::from_utf8_lossy(token);
        let Some(bare) = text.strip_prefix("n,,") else {
            return (None, Step::Refused);
        };
        let fields = scram_fields(bare);
        let (Some(user), Some(client_nonce)) = (fields.get("n"), fields.get("r")) else {
            return (None, Step::Refused);
        };
        if *user != login.user {
            return (None, Step::Refused);
        }
        let nonce = format!("{client_nonce}{:016x}", rand::random::<u64>());
        let salt = rand::random::<[u8; 16]>().to_vec();
        let server_first = format!("r={nonce},s={},i={SCRAM_ITERATIONS}", base64_encode(&salt));
        let hash = match mechanism {
            "SCRAM-SHA-512" => scram_hash!(sha2::Sha512),
            _ => scram_hash!(sha2::Sha256),
        };
        let challenge = Step::Challenge(server_first.clone().into_bytes());
        let state = Self {
            hash,
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
            salt,
        };
        (Some(state), challenge)
    }

    /// Takes `c=biws,r=NONCE,p=PROOF`, checks the proof against the
    /// password, and answers `v=SERVER_SIGNATURE`.
    fn last(self, login: &Login, token: &[u8]) -> Step {
        let text = String::from_utf8_lossy(token);
        let Some((without_proof, proof)) = text.rsplit_once(",p=") else {
            return Step::Refused;
        };
        if scram_fields(without_proof).get("r") != Some(&self.nonce.as_str()) {
            return Step::Refused;
        }
        let Some(proof) = base64_decode(proof) else {
            return Step::Refused;
        };
        let ScramHash { hmac, hash, salted } = self.hash;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let salted = salted(login.password.as_bytes(), &self.salt, SCRAM_ITERATIONS);
        let stored_key = hash(&hmac(&salted, b"Client Key"));
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        if proof.len() != signature.len() || hash(&client_key) != stored_key {
            return Step::Refused;
        }
        let server_signature = hmac(&hmac(&salted, b"Server Key"), auth_message.as_bytes());
        Step::Accepted(format!("v={}", base64_encode(&server_signature)).into_bytes())
    }
}

/// `a=1,b=2` as a map.
fn scram_fields(text: &str) -> BTreeMap<&str, &str> {
    text.split(',')
        .filter_map(|field| field.split_once('='))
        .collect()
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

fn short() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, "short Kafka request")
}

/// One size-prefixed Kafka frame, without its size.
async fn read_frame(stream: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let size = stream.read_i32().await?;
    let mut frame = vec![0; usize::try_from(size).map_err(|_| short())?];
    stream.read_exact(&mut frame).await?;
    Ok(frame)
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut framed = (payload.len() as i32).to_be_bytes().to_vec();
    framed.extend(payload);
    framed
}

/// A request header v1 (`api_key`, `api_version`, `correlation_id`,
/// `client_id`), as the SASL requests and `ApiVersions` are sent, and the
/// body after it.
fn parse_request(request: &[u8]) -> std::io::Result<(i16, i16, i32, &[u8])> {
    let field = |range: std::ops::Range<usize>| request.get(range).ok_or_else(short);
    let api_key = i16::from_be_bytes(field(0..2)?.try_into().unwrap());
    let version = i16::from_be_bytes(field(2..4)?.try_into().unwrap());
    let correlation = i32::from_be_bytes(field(4..8)?.try_into().unwrap());
    let client_id = i16::from_be_bytes(field(8..10)?.try_into().unwrap()).max(0) as usize;
    Ok((
        api_key,
        version,
        correlation,
        field(10 + client_id..request.len())?,
    ))
}

/// The bytes of a Kafka `STRING` (`size` 2) or `BYTES` (`size` 4) at the
/// start of `body`.
fn kafka_bytes(body: &[u8], size: usize) -> std::io::Result<&[u8]> {
    let mut length = [0u8; 4];
    length[4 - size..].copy_from_slice(body.get(..size).ok_or_else(short)?);
    let length = usize::try_from(i32::from_be_bytes(length)).map_err(|_| short())?;
    body.get(size..size + length).ok_or_else(short)
}

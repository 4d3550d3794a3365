//! What the kafka source and sink share: the client fields (where the
//! cluster is, how to log in, TLS, the pass-through of any other librdkafka
//! property), the `ClientConfig` built from them, the check that the cluster
//! answers at open, and how librdkafka's error codes map onto the delivery
//! contract.

#[cfg(feature = "kafka-source")]
mod lag;
#[cfg(feature = "kafka-sink")]
pub mod sink;
#[cfg(feature = "kafka-source")]
pub mod source;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::connectors::{ConnectorError, PluginConfigError};

/// Declares the client fields inside a connector's config struct (each config
/// declares them, since a flattened struct cannot deny unknown fields).
macro_rules! client_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            /// The brokers to bootstrap from, `host:port` separated by commas
            /// (librdkafka's `bootstrap.servers`; required).
            #[serde(default)]
            pub bootstrap_servers: String,
            /// The client id the brokers see (default `iggy-connect-<key>`).
            #[serde(default)]
            pub client_id: Option<String>,
            /// SASL login: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`
            /// (none by default).
            #[serde(default)]
            pub sasl_mechanism: Option<crate::connectors::kafka::SaslMechanism>,
            /// The SASL user name.
            #[serde(default)]
            pub sasl_username: Option<String>,
            /// The SASL password; a secret.
            #[serde(default)]
            #[schemars(with = "Option<String>")]
            pub sasl_password: Option<secrecy::SecretString>,
            /// Speak TLS to the brokers (on by itself when `ca_file` or
            /// `cert_file` is set).
            #[serde(default)]
            pub tls: bool,
            /// PEM file of the CA certificates to trust (default: the system's).
            #[serde(default)]
            pub ca_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate, for mutual TLS.
            #[serde(default)]
            pub cert_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate's private key.
            #[serde(default)]
            pub key_file: Option<std::path::PathBuf>,
            /// Verify the brokers' certificates and host names (on by default).
            #[serde(default = "crate::connectors::kafka::default_true")]
            pub tls_verify: bool,
            /// How long `open` waits for the cluster's metadata before it
            /// counts as unreachable (and is retried by the engine).
            #[serde(
                default = "crate::connectors::kafka::default_open_timeout",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub open_timeout: std::time::Duration,
            /// Any other librdkafka property, as `name = "value"` (such as
            /// `"session.timeout.ms" = "6000"`); checked by librdkafka when the
            /// config is validated. These win over the fields above.
            #[serde(default)]
            pub client_options: std::collections::BTreeMap<String, String>,
            $($body)*
        }

        impl $name {
            pub fn client(&self) -> crate::connectors::kafka::ClientFields<'_> {
                crate::connectors::kafka::ClientFields {
                    bootstrap_servers: &self.bootstrap_servers,
                    client_id: self.client_id.as_deref(),
                    sasl_mechanism: self.sasl_mechanism,
                    sasl_username: self.sasl_username.as_deref(),
                    sasl_password: self.sasl_password.as_ref(),
                    tls: self.tls,
                    ca_file: self.ca_file.as_deref(),
                    cert_file: self.cert_file.as_deref(),
                    key_file: self.key_file.as_deref(),
                    tls_verify: self.tls_verify,
                    client_options: &self.client_options,
                }
            }
        }
    };
}
pub(crate) use client_fields;

pub fn default_true() -> bool {
    true
}

pub fn default_open_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The SASL mechanisms librdkafka speaks without a Kerberos library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// A view of the client fields of either connector's config.
pub struct ClientFields<'a> {
    pub bootstrap_servers: &'a str,
    pub client_id: Option<&'a str>,
    pub sasl_mechanism: Option<SaslMechanism>,
    pub sasl_username: Option<&'a str>,
    pub sasl_password: Option<&'a SecretString>,
    pub tls: bool,
    pub ca_file: Option<&'a std::path::Path>,
    pub cert_file: Option<&'a std::path::Path>,
    pub key_file: Option<&'a std::path::Path>,
    pub tls_verify: bool,
    pub client_options: &'a BTreeMap<String, String>,
}

impl ClientFields<'_> {
    /// The librdkafka config of these fields plus `settings` (the
    /// connector's own properties, which `client_options` override), checked
    /// by librdkafka itself without connecting: an unknown property or a
    /// value it refuses is an error naming the field.
    pub fn config(
        &self,
        key: &str,
        settings: &[(&str, String)],
    ) -> Result<ClientConfig, PluginConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(PluginConfigError::new(
                "bootstrap_servers",
                "expected the brokers to bootstrap from, such as \"localhost:9092\"",
            ));
        }
        let mut config = ClientConfig::new();
        config.set_log_level(RDKafkaLogLevel::Warning);
        config.set("bootstrap.servers", self.bootstrap_servers);
        let client_id = match self.client_id {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ if key.is_empty() => "iggy-connect".to_owned(),
            _ => format!("iggy-connect-{key}"),
        };
        config.set("client.id", client_id);
        self.security(&mut config)?;
        for (name, value) in settings {
            config.set(*name, value);
        }
        check(&config, "")?;
        // Each option on its own first, so that every one librdkafka
        // refuses is named at once (it stops at the first).
        let mut refused = self.client_options.iter().filter_map(|(name, value)| {
            let mut alone = config.clone();
            alone.set(name, value);
            check(&alone, "client_options").err()
        });
        if let Some(mut first) = refused.next() {
            first.more = refused.collect();
            return Err(first);
        }
        for (name, value) in self.client_options {
            config.set(name, value);
        }
        check(&config, "client_options")?;
        Ok(config)
    }

    fn security(&self, config: &mut ClientConfig) -> Result<(), PluginConfigError> {
        let tls = self.tls || self.ca_file.is_some() || self.cert_file.is_some();
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(PluginConfigError::new(
                "key_file",
                "expected both cert_file and key_file, or neither",
            ));
        }
        let protocol = match (tls, self.sasl_mechanism) {
            (false, None) => "plaintext",
            (true, None) => "ssl",
            (false, Some(_)) => "sasl_plaintext",
            (true, Some(_)) => "sasl_ssl",
        };
        config.set("security.protocol", protocol);
        if let Some(mechanism) = self.sasl_mechanism {
            let (Some(username), Some(password)) = (self.sasl_username, self.sasl_password) else {
                return Err(PluginConfigError::new(
                    "sasl_username",
                    "expected sasl_username and sasl_password with sasl_mechanism",
                ));
            };
            config.set("sasl.mechanism", mechanism.as_str());
            config.set("sasl.username", username);
            config.set("sasl.password", password.expose_secret());
        }
        if tls {
            if let Some(path) = self.ca_file {
                config.set("ssl.ca.location", path.display().to_string());
            }
            if let (Some(cert), Some(key)) = (self.cert_file, self.key_file) {
                config.set("ssl.certificate.location", cert.display().to_string());
                config.set("ssl.key.location", key.display().to_string());
            }
            let verify = if self.tls_verify { "true" } else { "false" };
            config.set("enable.ssl.certificate.verification", verify);
            let identification = if self.tls_verify { "https" } else { "none" };
            config.set("ssl.endpoint.identification.algorithm", identification);
        }
        Ok(())
    }
}

/// Has librdkafka take every property of `config` (no connection is made).
fn check(config: &ClientConfig, field: &str) -> Result<(), PluginConfigError> {
    config.create_native_config().map(drop).map_err(|error| {
        let message = match error {
            KafkaError::ClientConfig(_, description, name, value) => {
                format!("librdkafka refuses {name} = {value:?}: {description}")
            }
            other => other.to_string(),
        };
        PluginConfigError::new(field, message)
    })
}

/// How an error of librdkafka maps onto the contract: a refused login or
/// missing permission stops the connector, anything else (a broker down,
/// a timeout, a leader moving) is retried by the engine.
pub fn classify(context: &str, error: KafkaError) -> ConnectorError {
    let message = format!("{context}: {error}");
    if is_fatal(&error) {
        ConnectorError::fatal(message)
    } else {
        ConnectorError::transient(message)
    }
}

/// Whether retrying cannot help: authentication and authorization failures,
/// and librdkafka's own fatal errors.
pub fn is_fatal(error: &KafkaError) -> bool {
    if matches!(
        error,
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_)
    ) {
        return true;
    }
    error.rdkafka_error_code().is_some_and(|code| {
        matches!(
            code,
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::UnsupportedSASLMechanism
                | RDKafkaErrorCode::Fatal
        )
    })
}

/// What a refusal librdkafka reported says to fix, naming the field: a SASL
/// login the broker refused, a mechanism it does not offer, a broker
/// certificate OpenSSL refused, or the alert of a broker that refused the
/// client's certificate (or wanted one). `None` for anything else.
fn refusal(librdkafka: &str) -> Option<String> {
    const CLIENT_REFUSED: [&str; 4] = [
        "alert certificate required",
        "alert bad certificate",
        "alert unknown ca",
        "alert certificate unknown",
    ];
    let (field, fix) = if librdkafka.contains("Unsupported SASL mechanism") {
        ("sasl_mechanism", "choose a mechanism the broker offers")
    } else if librdkafka.contains("SASL authentication error") {
        (
            "sasl_password",
            "the broker refused the login: check sasl_username and sasl_password",
        )
    } else if librdkafka.contains("certificate verify failed") {
        (
            "ca_file",
            "the broker's TLS certificate was refused: set ca_file to the CA that signed it, \
             and connect by a name the certificate holds",
        )
    } else if CLIENT_REFUSED
        .iter()
        .any(|alert| librdkafka.contains(alert))
    {
        (
            "cert_file",
            "the broker refused the TLS session: it wants a client certificate (cert_file and \
             key_file) signed by a CA it trusts",
        )
    } else {
        return None;
    };
    Some(format!(
        "plugin_config.{field}: {fix} (librdkafka: {librdkafka})"
    ))
}

/// How long a librdkafka warning or error repeating one already logged is
/// logged at debug level only. With a broker down, librdkafka reports the
/// same refused connection through its log and its error callbacks, and
/// "1/1 brokers are down" sixty times per attempt to open.
const REPEAT_QUIET: Duration = Duration::from_secs(30);

/// librdkafka's logs and errors, as this process's tracing events with the
/// connector's key; a repeat within [`REPEAT_QUIET`] at debug level.
#[derive(Debug, Clone, Default)]
pub struct Logging {
    pub key: String,
    /// The last error librdkafka reported for the whole client, such as a
    /// refused login: a failed request says only "transport failure" then.
    last_error: Arc<Mutex<Option<String>>>,
}

/// When each recent librdkafka warning or error was last logged, by
/// connector key and its text without librdkafka's thread and timing
/// details. For the whole process: the engine builds a connector anew for
/// each attempt to open it.
static LOGGED: LazyLock<Mutex<HashMap<(String, String), Instant>>> = LazyLock::new(Mutex::default);

impl Logging {
    pub fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            ..Self::default()
        }
    }

    /// Whether `message` repeats one logged less than [`REPEAT_QUIET`] ago
    /// (and if not, notes it as logged now).
    fn repeated(&self, message: &str) -> bool {
        let text = message
            .split_once("]: ")
            .filter(|(thread, _)| thread.starts_with("[thrd:"))
            .map_or(message, |(_, text)| text);
        let text = text.split(" (after ").next().unwrap_or(text);
        let now = Instant::now();
        let mut logged = LOGGED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let seen = (self.key.clone(), text.to_owned());
        if logged
            .get(&seen)
            .is_some_and(|at| now.duration_since(*at) < REPEAT_QUIET)
        {
            return true;
        }
        logged.retain(|_, at| now.duration_since(*at) < REPEAT_QUIET);
        logged.insert(seen, now);
        false
    }

    fn remember(&self, message: &str) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(message.to_owned());
    }

    /// `error` with the last client error librdkafka reported, if any, so
    /// that a login the broker refused reads as such in the status. A login
    /// or a TLS certificate refused either way is fatal and names the field
    /// to fix: retrying cannot change a password or a certificate.
    pub fn explain(&self, error: ConnectorError) -> ConnectorError {
        let last = self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let Some(last) = last else {
            return error;
        };
        if let Some(refused) = refusal(&last) {
            return ConnectorError::fatal(refused);
        }
        let message = format!("{error} (last librdkafka error: {last})");
        if error.is_transient() {
            ConnectorError::transient(message)
        } else {
            ConnectorError::fatal(message)
        }
    }
}

impl ClientContext for Logging {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let key = self.key.as_str();
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                if self.repeated(message) {
                    tracing::debug!(connector_key = key, facility, "librdkafka: {message}");
                } else {
                    tracing::error!(connector_key = key, facility, "librdkafka: {message}");
                }
                // Logged from librdkafka's own threads right away (a
                // consumer's error events wait for it to be polled).
                self.remember(message);
            }
            RDKafkaLogLevel::Warning if self.repeated(message) => {
                tracing::debug!(connector_key = key, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(connector_key = key, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(connector_key = key, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(connector_key = key, facility, "librdkafka: {message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.repeated(reason) {
            tracing::debug!(connector_key = %self.key, %error, "librdkafka: {reason}");
        } else {
            tracing::warn!(connector_key = %self.key, %error, "librdkafka: {reason}");
        }
        // "All brokers are down" follows the error that took them down.
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown) {
            self.remember(reason);
        }
    }
}

/// Runs a blocking librdkafka call (a metadata request, a synchronous
/// commit) off the async threads and classifies its error.
pub async fn blocking<T: Send + 'static>(
    context: &'static str,
    job: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, ConnectorError> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|error| ConnectorError::transient(format!("{context}: {error}")))?
        .map_err(|error| classify(context, error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(options: &'a BTreeMap<String, String>) -> ClientFields<'a> {
        ClientFields {
            bootstrap_servers: "localhost:9092",
            client_id: None,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_verify: true,
            client_options: options,
        }
    }

    #[test]
    fn given_client_options_librdkafka_knows_when_built_should_pass_them_through() {
        let options = BTreeMap::from([("session.timeout.ms".to_owned(), "6000".to_owned())]);
        let config = fields(&options).config("orders", &[]).unwrap();
        assert_eq!(config.get("session.timeout.ms"), Some("6000"));
        assert_eq!(config.get("client.id"), Some("iggy-connect-orders"));
    }

    #[test]
    fn given_an_unknown_or_invalid_client_option_when_built_should_name_client_options() {
        for (name, value) in [("no.such.property", "1"), ("session.timeout.ms", "soon")] {
            let options = BTreeMap::from([(name.to_owned(), value.to_owned())]);
            let error = fields(&options).config("k", &[]).unwrap_err();
            assert_eq!(error.field, "client_options", "{error}");
            assert!(error.message.contains(name), "{error}");
        }
    }

    #[test]
    fn given_several_refused_client_options_when_built_should_name_each() {
        let options = BTreeMap::from([
            ("linger.ms".to_owned(), "abc".to_owned()),
            ("no.such.property".to_owned(), "1".to_owned()),
            ("session.timeout.ms".to_owned(), "6000".to_owned()),
        ]);
        let error = fields(&options).config("k", &[]).unwrap_err();
        let named: Vec<String> = error.all().map(ToString::to_string).collect();
        assert_eq!(named.len(), 2, "{named:?}");
        assert!(named[0].contains("linger.ms"), "{named:?}");
        assert!(named[1].contains("no.such.property"), "{named:?}");
    }

    #[test]
    fn given_librdkafkas_refusals_when_explained_should_be_fatal_and_name_the_field() {
        // The shapes of librdkafka 2.12's messages (rdkafka_broker.c,
        // rdkafka_sasl_scram.c, rdkafka_ssl.c); the TLS and SCRAM ones are
        // also met for real in tests/it/kafka.rs.
        let cases = [
            (
                "127.0.0.1:9092/bootstrap: SASL PLAIN mechanism handshake failed: Broker: \
                 Unsupported SASL mechanism: broker's supported mechanisms: SCRAM-SHA-256",
                Some("sasl_mechanism"),
            ),
            (
                "127.0.0.1:9092/bootstrap: SASL authentication error: SASL SCRAM \
                 authentication failed: broker responded with unknown-user",
                Some("sasl_password"),
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL \
                 routines::certificate verify failed: broker certificate could not be verified",
                Some("ca_file"),
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: Receive failed: error:0A00045C:SSL \
                 routines::tlsv13 alert certificate required: SSL alert number 116",
                Some("cert_file"),
            ),
            (
                "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection \
                 refused",
                None,
            ),
        ];
        for (last, field) in cases {
            let logging = Logging::new("k");
            logging.remember(last);
            let error =
                logging.explain(ConnectorError::transient("fetching the cluster's metadata"));
            match field {
                Some(field) => {
                    assert!(!error.is_transient(), "{last}");
                    let text = error.to_string();
                    assert!(
                        text.starts_with(&format!("plugin_config.{field}: ")),
                        "{text}"
                    );
                    assert!(text.contains(last), "{text}");
                }
                None => assert!(error.is_transient(), "{last}"),
            }
        }
    }

    #[test]
    fn given_sasl_without_credentials_or_no_bootstrap_when_built_should_name_the_field() {
        let options = BTreeMap::new();
        let mut sasl = fields(&options);
        sasl.sasl_mechanism = Some(SaslMechanism::ScramSha512);
        assert_eq!(sasl.config("k", &[]).unwrap_err().field, "sasl_username");
        let mut empty = fields(&options);
        empty.bootstrap_servers = " ";
        assert_eq!(
            empty.config("k", &[]).unwrap_err().field,
            "bootstrap_servers"
        );
    }

    #[test]
    fn given_sasl_and_a_ca_file_when_built_should_speak_sasl_over_tls() {
        let options = BTreeMap::new();
        let password = SecretString::from("secret");
        let mut secure = fields(&options);
        secure.sasl_mechanism = Some(SaslMechanism::ScramSha256);
        secure.sasl_username = Some("iggy");
        secure.sasl_password = Some(&password);
        secure.ca_file = Some(std::path::Path::new("/etc/ssl/certs/ca-certificates.crt"));
        let config = secure.config("k", &[]).unwrap();
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        assert_eq!(
            config.get("ssl.endpoint.identification.algorithm"),
            Some("https")
        );
    }

    #[test]
    fn given_authorization_and_transport_errors_when_classified_should_stop_only_on_the_first() {
        let denied = KafkaError::MetadataFetch(RDKafkaErrorCode::SaslAuthenticationFailed);
        assert!(!classify("open", denied).is_transient());
        let down = KafkaError::MetadataFetch(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(classify("open", down).is_transient());
    }

    #[test]
    fn given_a_repeated_librdkafka_message_when_logged_should_be_quiet_for_a_while() {
        let logging = Logging::new("repeat-test");
        let refused = "Connect to ipv4#127.0.0.1:1 failed: Connection refused";
        assert!(!logging.repeated(&format!(
            "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: {refused} (after 0ms in state CONNECT)"
        )));
        // The error callback's form of it, and the next attempt's.
        assert!(logging.repeated(&format!(
            "127.0.0.1:1/bootstrap: {refused} (after 1ms in state CONNECT, 1 identical error(s) suppressed)"
        )));
        assert!(!logging.repeated("1/1 brokers are down"));
        assert!(logging.repeated("1/1 brokers are down"));
        assert!(!logging.repeated("SASL authentication error: Authentication failed"));
    }
}

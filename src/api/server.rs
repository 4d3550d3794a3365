//! Listening: plain HTTP or TLS (rustls with PEM files, no OpenSSL), CORS as
//! upstream configures it, graceful shutdown.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::{ApiError, ApiState, router};
use crate::config::runtime::{CorsConfig, HttpConfig, HttpTlsConfig};
use crate::connectors::kit::listener::ConnectionLimits;

/// How long a shutdown lets requests in flight finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ApiSetupError {
    #[error("cannot listen on [http] address \"{address}\": {source}")]
    Bind {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("[http.tls] {field} {path}: {message}")]
    Tls {
        field: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("[http.cors] {field}: {message}")]
    Cors {
        field: &'static str,
        message: String,
    },
    #[error("[http.metrics] endpoint \"{endpoint}\": {message}")]
    MetricsEndpoint { endpoint: String, message: String },
}

/// The running API server.
pub struct ApiServer {
    address: SocketAddr,
    tls: bool,
    handle: Handle<SocketAddr>,
    task: JoinHandle<io::Result<()>>,
    closing: CancellationToken,
}

impl ApiServer {
    /// Binds `[http] address` and serves in the background. A bind failure, a
    /// bad certificate or a bad CORS setting is an error here, before anything
    /// is served.
    pub async fn start(config: &HttpConfig, state: ApiState) -> Result<Self, ApiSetupError> {
        let closing = state.closing.clone();
        let app = router(config, Arc::new(state))?;
        let tls = match config.tls.enabled {
            true => Some(tls_config(&config.tls)?),
            false => None,
        };
        let bind_error = |source| ApiSetupError::Bind {
            address: config.address.clone(),
            source,
        };
        let listener = tokio::net::TcpListener::bind(&config.address)
            .await
            .map_err(bind_error)?;
        let address = listener.local_addr().map_err(bind_error)?;
        let listener = listener.into_std().map_err(bind_error)?;
        let handle = Handle::new();
        let service = app.into_make_service();
        let limits = connection_limits(config);
        let refusal = ApiError::TooManyConnections {
            limit: config.max_connections,
        }
        .json_text();
        let refused = metrics::counter!("iggy_connector_api_connections_refused_total");
        let acceptor = limits.acceptor(refusal, refused).evicting();
        let server = axum_server::from_tcp(listener)
            .map_err(bind_error)?
            .handle(handle.clone());
        let server = limits.configure(server);
        let task = match tls {
            Some(tls) => {
                let tls = RustlsAcceptor::new(RustlsConfig::from_config(tls))
                    .handshake_timeout(config.header_read_timeout)
                    .acceptor(acceptor);
                tokio::spawn(server.acceptor(tls).serve(service))
            }
            None => tokio::spawn(server.acceptor(acceptor).serve(service)),
        };
        Ok(Self {
            address,
            tls: config.tls.enabled,
            handle,
            task,
            closing,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://host:port` or `https://host:port`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }

    /// Stops accepting, lets requests in flight finish (bounded), and waits.
    /// Event streams (taps) end at once rather than when the grace runs out.
    pub async fn shutdown(self) {
        self.closing.cancel();
        self.handle.graceful_shutdown(Some(SHUTDOWN_GRACE));
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the HTTP API stopped with an error"),
            Err(error) => tracing::warn!(%error, "the HTTP API task failed"),
        }
    }
}

/// `[http]`'s limits. A refused client is told to retry after a second: the
/// API's requests are short.
fn connection_limits(config: &HttpConfig) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: config.max_connections,
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        retry_after_secs: 1,
    }
}

fn tls_config(config: &HttpTlsConfig) -> Result<Arc<rustls::ServerConfig>, ApiSetupError> {
    let tls_error = |field, path: &Path, message: String| ApiSetupError::Tls {
        field,
        path: path.to_owned(),
        message,
    };
    let certificates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(&config.cert_file)
            .and_then(|certificates| certificates.collect())
            .map_err(|error| tls_error("cert_file", &config.cert_file, error.to_string()))?;
    if certificates.is_empty() {
        return Err(tls_error(
            "cert_file",
            &config.cert_file,
            "no PEM certificate found".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&config.key_file)
        .map_err(|error| tls_error("key_file", &config.key_file, error.to_string()))?;
    // Named explicitly: more than one rustls provider is compiled in (through
    // the iggy client), and rustls refuses to guess.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder
                .with_no_client_auth()
                .with_single_cert(certificates, key)
        })
        .map_err(|error| tls_error("key_file", &config.key_file, error.to_string()))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(server))
}

/// Upstream's `[http.cors]`: a first origin of `*` allows any origin; empty
/// entries are dropped. Where upstream panics (an unknown method, a `*` after
/// the first origin), this is a startup error naming the field.
pub fn cors_layer(config: &CorsConfig) -> Result<Option<CorsLayer>, ApiSetupError> {
    if !config.enabled {
        return Ok(None);
    }
    let cors_error = |field, message: String| ApiSetupError::Cors { field, message };
    let origins: Vec<&String> = config
        .allowed_origins
        .iter()
        .filter(|origin| !origin.is_empty())
        .collect();
    let any_origin = origins.first().is_some_and(|origin| *origin == "*");
    let allow_origin = if any_origin {
        AllowOrigin::any()
    } else {
        let mut values = Vec::with_capacity(origins.len());
        for origin in origins {
            if origin == "*" {
                return Err(cors_error(
                    "allowed_origins",
                    "\"*\" must be the first and only origin".into(),
                ));
            }
            values.push(HeaderValue::from_str(origin).map_err(|_| {
                cors_error("allowed_origins", format!("invalid origin \"{origin}\""))
            })?);
        }
        AllowOrigin::list(values)
    };
    if any_origin && config.allow_credentials {
        return Err(cors_error(
            "allow_credentials",
            "cannot be true when any origin (\"*\") is allowed".into(),
        ));
    }
    let mut methods = Vec::new();
    for method in config
        .allowed_methods
        .iter()
        .filter(|method| !method.is_empty())
    {
        let parsed = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .ok()
            .filter(|parsed| KNOWN_METHODS.contains(parsed))
            .ok_or_else(|| cors_error("allowed_methods", format!("unknown method \"{method}\"")))?;
        methods.push(parsed);
    }
    let headers = |field, names: &[String]| -> Result<Vec<HeaderName>, ApiSetupError> {
        names
            .iter()
            .filter(|name| !name.is_empty())
            .map(|name| {
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| cors_error(field, format!("invalid header name \"{name}\"")))
            })
            .collect()
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow_origin)
            .allow_methods(methods)
            .allow_headers(headers("allowed_headers", &config.allowed_headers)?)
            .expose_headers(headers("exposed_headers", &config.exposed_headers)?)
            .allow_credentials(config.allow_credentials)
            .allow_private_network(config.allow_private_network),
    ))
}

const KNOWN_METHODS: &[Method] = &[
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
    Method::CONNECT,
    Method::PATCH,
    Method::TRACE,
];

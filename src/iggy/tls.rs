//! `[iggy.tls]`: checked once when the config is resolved (a CA file that
//! cannot be read or a server name that cannot be, are config errors), and a
//! handshake of our own to say why a TLS connect failed, since the `iggy`
//! client reports every failed handshake as "Cannot establish connection".

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::runtime::IggyTlsConfig;
use crate::iggy::settings::SettingsError;

/// TLS settings that were checked: the CA file holds certificates and the
/// server name is valid.
#[derive(Clone)]
pub(crate) struct TlsSettings {
    /// Handed to the client, which reads the file again when it connects.
    pub(crate) ca_file: PathBuf,
    /// As configured; empty makes the client use the host of the address.
    pub(crate) domain: String,
    roots: Arc<RootCertStore>,
    server_name: ServerName<'static>,
}

impl TlsSettings {
    /// `None` when TLS is disabled.
    pub(crate) fn from_config(
        config: &IggyTlsConfig,
        address: &str,
    ) -> Result<Option<Self>, SettingsError> {
        if !config.enabled {
            return Ok(None);
        }
        let ca_file = match &config.ca_file {
            Some(path) if !path.as_os_str().is_empty() => path.clone(),
            _ => return Err(SettingsError::MissingTlsCaFile),
        };
        let roots = read_roots(&ca_file).map_err(|reason| SettingsError::TlsCaFile {
            path: ca_file.display().to_string(),
            reason,
        })?;
        let name = match config.domain.trim() {
            "" => host_of(address),
            domain => domain.to_owned(),
        };
        let server_name =
            ServerName::try_from(name.clone()).map_err(|_| SettingsError::TlsDomain { name })?;
        Ok(Some(Self {
            ca_file,
            domain: config.domain.trim().to_owned(),
            roots: Arc::new(roots),
            server_name,
        }))
    }

    /// Why a TLS handshake with `address` fails, as a clause to append to the
    /// client's error; `None` when it succeeds (the failure was elsewhere).
    pub(crate) async fn diagnose(&self, address: &str, timeout: Duration) -> Option<String> {
        let name = self.server_name.to_str();
        let ca_file = self.ca_file.display();
        match tokio::time::timeout(timeout, self.handshake(address)).await {
            Ok(Ok(())) => None,
            Ok(Err(Failure::Tcp(error))) => Some(format!("TCP connect failed: {error}")),
            Ok(Err(Failure::Tls(error))) if is_closed(&error) => Some(format!(
                "the server closed the connection during the TLS handshake \
                 ({error}); is it serving TLS on this port?"
            )),
            Ok(Err(Failure::Tls(error))) => Some(format!(
                "TLS handshake failed: {error} (server name {name}, iggy.tls.ca_file {ca_file})"
            )),
            Err(_) => Some(format!(
                "no TLS handshake answer within {timeout:?}; is the server serving TLS on this port?"
            )),
        }
    }

    async fn handshake(&self, address: &str) -> Result<(), Failure> {
        let stream = TcpStream::connect(address).await.map_err(Failure::Tcp)?;
        // Its own provider, the one the client installs as the process default.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| Failure::Tls(io::Error::other(error)))?
            .with_root_certificates(Arc::clone(&self.roots))
            .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
            .connect(self.server_name.clone(), stream)
            .await
            .map(drop)
            .map_err(Failure::Tls)
    }
}

enum Failure {
    Tcp(io::Error),
    Tls(io::Error),
}

fn is_closed(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
    )
}

fn read_roots(ca_file: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca_file).map_err(|error| error.to_string())? {
        let certificate = certificate.map_err(|error| error.to_string())?;
        roots
            .add(certificate)
            .map_err(|error| format!("not a usable CA certificate: {error}"))?;
    }
    if roots.is_empty() {
        return Err("no PEM certificate in it".to_owned());
    }
    Ok(roots)
}

/// The name the client verifies when no domain is configured: the host of
/// `address` (an IP address as itself).
fn host_of(address: &str) -> String {
    if let Ok(socket) = address.parse::<SocketAddr>() {
        return socket.ip().to_string();
    }
    address
        .rsplit_once(':')
        .map_or(address, |(host, _port)| host)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    fn enabled(ca_file: Option<PathBuf>, domain: &str) -> IggyTlsConfig {
        IggyTlsConfig {
            enabled: true,
            ca_file,
            domain: domain.to_owned(),
        }
    }

    #[test]
    fn given_tls_disabled_when_resolved_should_need_no_ca_file() {
        let settings = TlsSettings::from_config(&IggyTlsConfig::default(), "localhost:8090");
        assert!(matches!(settings, Ok(None)));
    }

    #[test]
    fn given_tls_enabled_without_a_ca_file_when_resolved_should_fail_naming_the_field() {
        for ca_file in [None, Some(PathBuf::new())] {
            let error = TlsSettings::from_config(&enabled(ca_file, ""), "localhost:8090")
                .err()
                .unwrap();
            assert_eq!(error, SettingsError::MissingTlsCaFile);
            assert!(error.to_string().contains("iggy.tls.ca_file"), "{error}");
        }
    }

    #[test]
    fn given_a_missing_or_certificate_less_ca_file_when_resolved_should_fail_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let key_only = fixture("api_tls_key.pem");
        for path in [missing, key_only] {
            let error = TlsSettings::from_config(&enabled(Some(path.clone()), ""), "localhost:1")
                .err()
                .unwrap();
            assert!(
                matches!(&error, SettingsError::TlsCaFile { path: named, .. } if *named == path.display().to_string()),
                "{error}"
            );
            assert!(error.to_string().starts_with("iggy.tls.ca_file"), "{error}");
        }
    }

    #[test]
    fn given_an_invalid_domain_when_resolved_should_fail_naming_it() {
        let config = enabled(Some(fixture("api_tls_cert.pem")), "not a host!");
        let error = TlsSettings::from_config(&config, "localhost:8090")
            .err()
            .unwrap();
        assert_eq!(
            error,
            SettingsError::TlsDomain {
                name: "not a host!".to_owned()
            }
        );
    }

    #[test]
    fn given_an_empty_domain_when_resolved_should_verify_the_host_of_the_address() {
        let cases = [
            ("localhost:8090", "localhost"),
            ("127.0.0.1:8090", "127.0.0.1"),
            ("[::1]:8090", "::1"),
            ("iggy.example.com:8090", "iggy.example.com"),
        ];
        for (address, expected) in cases {
            let config = enabled(Some(fixture("api_tls_cert.pem")), " ");
            let settings = TlsSettings::from_config(&config, address).unwrap().unwrap();
            assert_eq!(settings.server_name.to_str(), expected, "{address}");
            assert_eq!(settings.domain, "");
        }
    }
}

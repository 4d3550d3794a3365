//! TLS for a backend whose client crate takes a rustls client config: the
//! config built from the connector's `ca_file`, `cert_file`,
//! `key_file` and `tls_verify` fields, and what a failed handshake means. A
//! certificate the verifier refused, or a server refusing ours, is fatal and
//! names the field to fix: retrying cannot change a certificate.
//!
//! The verifier records what it refused, since the client crates report a
//! failed handshake as text.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::connectors::{ConnectorError, PluginConfigError};

/// The TLS fields of a connector, as configured.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// PEM file of the CA certificates to trust (`None`: the system's).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// Verify the server's certificate and name.
    pub verify: bool,
}

/// A rustls client config and what its verifier refused.
#[derive(Clone)]
pub struct TlsClient {
    pub config: Arc<ClientConfig>,
    refused: Arc<Mutex<Option<rustls::Error>>>,
    ca_file: Option<PathBuf>,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl TlsOptions {
    /// Whether any TLS file is set (which asks for TLS by itself).
    pub fn any_file(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Checks what can be checked without reading the files.
    pub fn check(&self) -> Result<(), PluginConfigError> {
        for (field, path) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if path
                .as_ref()
                .is_some_and(|path| path.as_os_str().is_empty())
            {
                return Err(PluginConfigError::new(
                    field,
                    "expected a path to a PEM file, found \"\" (leave it out instead)",
                ));
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(PluginConfigError::new(
                "key_file",
                "cert_file needs its key_file",
            )),
            (None, Some(_)) => Err(PluginConfigError::new(
                "cert_file",
                "key_file needs its cert_file",
            )),
            _ => Ok(()),
        }
    }

    /// Reads the files and builds the client config; an unreadable file or
    /// one holding no certificate (key) is an error naming its field.
    pub fn client(&self) -> Result<TlsClient, PluginConfigError> {
        self.check()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let roots = match &self.ca_file {
            Some(path) => read_roots(path).map_err(|reason| file_error("ca_file", path, reason))?,
            None => system_roots(),
        };
        let refused = Arc::new(Mutex::new(None));
        let verifier: Arc<dyn ServerCertVerifier> = if self.verify {
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|error| {
                        PluginConfigError::new(
                            "ca_file",
                            format!("no usable CA certificate: {error}"),
                        )
                    })?;
            Arc::new(Recording {
                inner,
                refused: refused.clone(),
            })
        } else {
            Arc::new(Unverified {
                provider: provider.clone(),
            })
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| PluginConfigError::new("ca_file", error.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert_file), Some(key_file)) => {
                let chain = read_certificates(cert_file)
                    .map_err(|reason| file_error("cert_file", cert_file, reason))?;
                let key = PrivateKeyDer::from_pem_file(key_file).map_err(|error| {
                    file_error("key_file", key_file, format!("no private key: {error}"))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|error| {
                    PluginConfigError::new("key_file", format!("does not fit cert_file: {error}"))
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(TlsClient {
            config: Arc::new(config),
            refused,
            ca_file: self.ca_file.clone(),
        })
    }
}

/// Whether a client crate's error text is rustls refusing the server's
/// certificate (for a crate that takes no verifier of ours).
pub fn refused_their_certificate(error: &str) -> bool {
    error.contains("invalid peer certificate")
}

/// Whether a client crate's error text is the server's TLS alert about our
/// certificate (missing, unknown, refused).
pub fn refused_our_certificate(error: &str) -> bool {
    let Some(alert) = error.split("received fatal alert: ").nth(1) else {
        return false;
    };
    [
        "BadCertificate",
        "UnsupportedCertificate",
        "CertificateRevoked",
        "CertificateExpired",
        "CertificateUnknown",
        "UnknownCA",
        "AccessDenied",
        "CertificateRequired",
    ]
    .iter()
    .any(|name| alert.starts_with(name))
}

impl TlsClient {
    /// What a failed connect means when the TLS handshake is to blame: the
    /// server's certificate refused here (naming `ca_file`, or `name_field`
    /// for a name it is not valid for), or ours refused by the server
    /// (`cert_file`). `None` when TLS is not to blame.
    pub fn refusal(&self, name_field: &str, server: &str, error: &str) -> Option<ConnectorError> {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some(refused) = refused {
            return Some(ConnectorError::fatal(
                self.describe(name_field, server, &refused),
            ));
        }
        refused_our_certificate(error).then(|| {
            ConnectorError::fatal(format!(
                "plugin_config.cert_file: {server} refused the TLS handshake ({error}); it wants \
                 a client certificate (cert_file and key_file) signed by a CA it trusts"
            ))
        })
    }

    fn describe(&self, name_field: &str, server: &str, refused: &rustls::Error) -> String {
        let trusted = match &self.ca_file {
            Some(path) => format!("the CA in {}", path.display()),
            None => "the system's CAs".to_owned(),
        };
        match refused {
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "plugin_config.{name_field}: the TLS certificate of {server} is not valid for \
                 the name connected to ({refused}); connect by a name the certificate holds"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            ) => format!(
                "plugin_config.ca_file: the TLS certificate of {server} is not signed by \
                 {trusted} ({refused}); set ca_file to the CA that signed the server's certificate"
            ),
            other => format!(
                "plugin_config.ca_file: the TLS certificate of {server} was refused ({other}; \
                 trusting {trusted})"
            ),
        }
    }
}

/// Verifies like webpki and keeps what it refused.
#[derive(Debug)]
struct Recording {
    inner: Arc<WebPkiServerVerifier>,
    refused: Arc<Mutex<Option<rustls::Error>>>,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .inspect_err(|error| {
                *self
                    .refused
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error.clone());
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `tls_verify = false`: any certificate for any name (the handshake's
/// signatures are still checked, so the peer holds the certificate's key).
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn file_error(field: &str, path: &Path, reason: impl fmt::Display) -> PluginConfigError {
    PluginConfigError::new(field, format!("{}: {reason}", path.display()))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| error.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())?;
    if certificates.is_empty() {
        return Err("no PEM certificate in it".to_owned());
    }
    Ok(certificates)
}

fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots
            .add(certificate)
            .map_err(|error| format!("not a usable CA certificate: {error}"))?;
    }
    Ok(roots)
}

/// The system's trust store; certificates it cannot use are left out.
fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(%error, "reading the system's CA certificates");
    }
    roots.add_parsable_certificates(found.certs);
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> TlsOptions {
        TlsOptions {
            ca_file: None,
            cert_file: None,
            key_file: None,
            verify: true,
        }
    }

    #[test]
    fn given_a_certificate_without_its_key_when_checked_should_name_the_missing_field() {
        let cert_only = TlsOptions {
            cert_file: Some("client.pem".into()),
            ..options()
        };
        assert_eq!(cert_only.check().unwrap_err().field, "key_file");
        let key_only = TlsOptions {
            key_file: Some("client.key".into()),
            ..options()
        };
        assert_eq!(key_only.check().unwrap_err().field, "cert_file");
        let empty = TlsOptions {
            ca_file: Some(PathBuf::new()),
            ..options()
        };
        assert_eq!(empty.check().unwrap_err().field, "ca_file");
    }

    #[test]
    fn given_a_missing_or_certificate_less_ca_file_when_built_should_name_ca_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        for path in [missing, not_pem] {
            let error = TlsOptions {
                ca_file: Some(path.clone()),
                ..options()
            }
            .client()
            .unwrap_err();
            assert_eq!(error.field, "ca_file");
            assert!(
                error.to_string().contains(&path.display().to_string()),
                "{error}"
            );
        }
    }

    #[test]
    fn given_a_server_alert_about_certificates_when_judged_should_blame_cert_file() {
        let client = options().client().unwrap();
        let refused = client
            .refusal(
                "host",
                "broker",
                "io: received fatal alert: CertificateRequired",
            )
            .unwrap();
        assert!(!refused.is_transient());
        assert!(
            refused.to_string().contains("plugin_config.cert_file"),
            "{refused}"
        );
        assert!(
            client
                .refusal("host", "broker", "connection refused")
                .is_none()
        );
    }
}

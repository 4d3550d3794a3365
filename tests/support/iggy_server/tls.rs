//! TLS for the test server: the same protocol inside a rustls session, as a
//! real server started with `tcp.tls.enabled` serves it.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The PEM files a TLS test server presents.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// An acceptor with its own crypto provider, so nothing depends on which
    /// provider (if any) the process installed as its default.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", self.cert.display()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|error| panic!("bad certificate in {}: {error}", self.cert.display()));
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .unwrap_or_else(|error| panic!("bad key in {}: {error}", self.key.display()));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default protocol versions")
            .with_no_client_auth()
            .with_single_cert(certificates, key)
            .expect("the certificate matches the key");
        TlsAcceptor::from(Arc::new(config))
    }
}

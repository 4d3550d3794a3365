//! A test PKI made at test time with `rcgen`: a CA, a server certificate it
//! signs for `localhost` and `127.0.0.1`, a client certificate it signs (for
//! mutual TLS), and a second CA that signed none of them (the wrong CA). All
//! written as PEM files into a temp dir that lives as long as the value.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub struct TestPki {
    dir: tempfile::TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    /// A client certificate signed by the other CA.
    pub other_client_cert: PathBuf,
    pub other_client_key: PathBuf,
}

impl TestPki {
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca = authority("iggy-connect test CA");
        let other = authority("some other CA");
        let (server_cert, server_key) = leaf(
            &ca,
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(&ca, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
        let (other_client_cert, other_client_key) =
            leaf(&other, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
        Self {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            other_ca: write("other-ca.pem", other.pem()),
            other_client_cert: write("other-client.pem", other_client_cert),
            other_client_key: write("other-client.key", other_client_key),
            dir,
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate signed by `issuer`, and its key, as PEM.
fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "iggy-connect test");
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().unwrap();
    let certificate = params.signed_by(&key, issuer).unwrap();
    (certificate.pem(), key.serialize_pem())
}

/// Asserts that `error` (a connector's failed `open`) is for good and names
/// `plugin_config.FIELD` first: what a refused certificate or login must
/// give. Its text.
pub fn assert_refused(error: &iggy_connect::connectors::ConnectorError, field: &str) -> String {
    assert!(!error.is_transient(), "{field}: {error}");
    let text = error.to_string();
    assert!(
        text.starts_with(&format!("plugin_config.{field}:")),
        "{field}: {text}"
    );
    text
}

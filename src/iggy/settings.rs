//! What is wrong with the `[iggy]` settings: credentials and TLS.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("iggy.token: cannot read token file {path}: {reason}")]
    TokenFile { path: String, reason: String },
    #[error("iggy.token: token file {path} is empty")]
    EmptyTokenFile { path: String },
    #[error("iggy.username and iggy.password are required when no iggy.token is set")]
    MissingCredentials,
    #[error("iggy.tls.ca_file is required when iggy.tls.enabled is true")]
    MissingTlsCaFile,
    #[error("iggy.tls.ca_file: cannot use {path}: {reason}")]
    TlsCaFile { path: String, reason: String },
    #[error(
        "iggy.tls.domain: {name:?} is not a valid server name (a DNS name or an IP address; \
         empty uses the host of iggy.address)"
    )]
    TlsDomain { name: String },
}

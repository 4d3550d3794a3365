//! rustls's process-wide crypto provider. This build has both of rustls's
//! providers (aws-lc-rs, ours everywhere, and ring, which sqlx brings), so
//! rustls cannot pick one on its own, and a client crate that builds its TLS
//! config with `ClientConfig::builder()` (async-nats, redis) panicked at its
//! first TLS connection. The connectors built on such crates call
//! [`ensure_default_provider`] before they connect, and so does the binary at
//! start.

/// Installs aws-lc-rs as the process default, once; a default installed
/// before (by an embedding program) stays.
pub fn ensure_default_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
}

//! How `tap`, `top` and `dlq` reach a running runtime's control API: `--url`
//! and `--api-key`, or the `[http]` section of the runtime config it runs
//! (`--config`), so the key need not be copied onto a command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use secrecy::ExposeSecret;

use super::EXIT_CONFIG;
use crate::config::env::EnvVars;
use crate::config::runtime::HttpConfig;
use crate::config::{ConfigIssue, RuntimeConfig};

const DEFAULT_URL: &str = "http://127.0.0.1:8081";

#[derive(Debug, Clone, clap::Args)]
pub struct ControlArgs {
    /// The control API's URL [default: from `--config`, else
    /// http://127.0.0.1:8081].
    #[arg(long, env = "IGGY_CONNECT_URL")]
    url: Option<String>,
    /// The API key (`[http] api_key`) [default: from `--config`].
    #[arg(long, env = "IGGY_CONNECTORS_HTTP_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The runtime config the runtime runs: the URL comes from its `[http]`
    /// address and TLS, the key from its `api_key` (with the environment's
    /// overrides, as `run` reads them). `--url` and `--api-key` win.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Where the control API is and the key it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// Without a trailing `/`.
    pub url: String,
    pub api_key: Option<String>,
    /// The API's own certificate (`[http.tls] cert_file`), trusted beside the
    /// system's roots, so a self-signed one is reached too.
    pub certificate: Option<PathBuf>,
}

impl Control {
    /// An HTTP client that trusts [`certificate`](Self::certificate).
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &self.certificate {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read the API's certificate {}", path.display()))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
                format!("no certificate in the API's certificate {}", path.display())
            })?;
            builder = builder.tls_certs_merge(certificates);
        }
        builder.build().context("cannot build the HTTP client")
    }
}

impl ControlArgs {
    /// The URL and key; a config that does not load is printed as `validate`
    /// prints it, and the command's exit code (2) returned.
    pub fn resolve(self) -> Result<Control, ExitCode> {
        let from_config = match &self.config {
            Some(path) if self.url.is_none() || self.api_key.is_none() => Some(from_config(path)?),
            _ => None,
        };
        let url = self
            .url
            .or_else(|| from_config.as_ref().map(|control| control.url.clone()))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let (api_key, certificate) = match from_config {
            Some(control) => (self.api_key.or(control.api_key), control.certificate),
            None => (self.api_key, None),
        };
        Ok(Control {
            url: url.trim_end_matches('/').to_owned(),
            api_key,
            certificate,
        })
    }
}

fn from_config(path: &std::path::Path) -> Result<Control, ExitCode> {
    let refuse = |issues: &[ConfigIssue]| {
        for issue in issues {
            eprintln!("{issue}");
        }
        ExitCode::from(EXIT_CONFIG)
    };
    let (config, _) =
        RuntimeConfig::load(path, &EnvVars::from_process()).map_err(|issues| refuse(&issues.0))?;
    if !config.http.enabled {
        return Err(refuse(&[ConfigIssue::error(
            path,
            "http.enabled",
            "the runtime serves no control API (`[http] enabled = false`)",
        )]));
    }
    Ok(of_http(&config.http))
}

/// Where a runtime with this `[http]` section answers, seen from this host:
/// a wildcard listen address is reached on loopback.
fn of_http(http: &HttpConfig) -> Control {
    let address = http.address.trim();
    let address = match address.rsplit_once(':') {
        Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => address.to_owned(),
    };
    let scheme = if http.tls.enabled { "https" } else { "http" };
    let key = http.api_key.expose_secret();
    Control {
        url: format!("{scheme}://{address}"),
        api_key: (!key.is_empty()).then(|| key.to_owned()),
        certificate: http.tls.enabled.then(|| http.tls.cert_file.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(address: &str, tls: bool, key: &str) -> HttpConfig {
        let mut http = HttpConfig {
            address: address.to_owned(),
            api_key: key.to_owned().into(),
            ..HttpConfig::default()
        };
        http.tls.enabled = tls;
        http
    }

    #[test]
    fn given_an_http_section_when_read_should_reach_its_address_with_its_key() {
        assert_eq!(
            of_http(&http("0.0.0.0:9000", false, "k")),
            Control {
                url: "http://127.0.0.1:9000".into(),
                api_key: Some("k".into()),
                certificate: None,
            }
        );
        let tls = of_http(&http("[::]:9000", true, ""));
        assert_eq!(
            (tls.url.as_str(), tls.api_key, tls.certificate.is_some()),
            ("https://[::1]:9000", None, true)
        );
        assert_eq!(
            of_http(&http("api.internal:8081", false, "")).url,
            "http://api.internal:8081"
        );
    }

    #[test]
    fn given_a_url_and_a_key_when_resolved_should_not_read_the_config() {
        let args = ControlArgs {
            url: Some("http://h:1/".into()),
            api_key: Some("k".into()),
            config: Some("/no/such/config.toml".into()),
        };
        assert_eq!(
            args.resolve().unwrap(),
            Control {
                url: "http://h:1".into(),
                api_key: Some("k".into()),
                certificate: None,
            }
        );
    }
}

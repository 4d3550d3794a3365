//! HTTP plumbing for connectors that call an HTTP API: one client builder
//! (rustls, timeouts, a CA file, accept-invalid-certs, a proxy, basic / bearer /
//! header auth, gzip request bodies), `Retry-After` parsing, the
//! transient/permanent classification of statuses, and [`exchange`]: one
//! request sent and its answer read, the part of every HTTP-speaking
//! connector that is not about its backend.

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use flate2::Compression;
use flate2::read::GzEncoder;
use reqwest::header::{
    AUTHORIZATION, CONTENT_ENCODING, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER,
};
use secrecy::{ExposeSecret, SecretString};

use super::failure::Failure;
use crate::connectors::PluginConfigError;

/// The longest `Retry-After` honoured; a server asking for more is waited on
/// this long, then asked again.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// What a non-success status says about trying the same request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// Timeouts (408), throttling (429) and server errors (5xx): try again later.
    Transient,
    /// Anything else: the request itself is refused; sending it again changes nothing.
    Permanent,
}

pub fn classify(status: u16) -> StatusClass {
    if status == 408 || status == 429 || (500..=599).contains(&status) {
        StatusClass::Transient
    } else {
        StatusClass::Permanent
    }
}

/// The wait a response asks for in `Retry-After`: whole seconds or an HTTP
/// date (a date in the past is no wait), at most [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// How much of an answer's body goes into a failure's reason.
const REASON_BODY_CHARS: usize = 512;

/// A backend's answer to one request: its status, the wait it asked for and
/// its body, read up to a limit so the connection goes back to the pool.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

/// Sends `request` and reads its answer, up to `body_limit` bytes of body.
/// No answer at all (refused, reset, a name that does not resolve, a
/// timeout), or one cut off before the end of its body, is a transient
/// [`Failure`] naming `target` (the URL without credentials) and the cause.
pub async fn exchange(
    request: reqwest::RequestBuilder,
    target: &str,
    body_limit: usize,
) -> Result<Answer, Failure> {
    let response = request
        .send()
        .await
        .map_err(|error| no_answer(target, error))?;
    Answer::read(response, target, body_limit).await
}

/// [`exchange`] for an answer that must be read whole (query results): a
/// body the connection cut short is a transient failure, as no answer is,
/// and a body past `body_limit` bytes is refused, naming the limit.
pub async fn exchange_whole(
    request: reqwest::RequestBuilder,
    target: &str,
    body_limit: usize,
) -> Result<Answer, Failure> {
    let answer = exchange(request, target, body_limit.saturating_add(1)).await?;
    if answer.body.len() > body_limit {
        return Err(Failure::Refused(format!(
            "the answer of {target} is larger than {body_limit} bytes"
        )));
    }
    Ok(answer)
}

/// A request that got no answer, as a transient failure naming its cause.
pub fn no_answer(target: &str, error: reqwest::Error) -> Failure {
    let error = error.without_url();
    let reason = if error.is_timeout() {
        format!("request to {target} timed out")
    } else {
        format!("request to {target} failed: {}", error_chain(&error))
    };
    Failure::transient(reason)
}

impl Answer {
    /// A response already received (by a connector that looked at its
    /// headers first: a redirect's `Location`), read as [`exchange`] does.
    pub async fn read(
        mut response: reqwest::Response,
        target: &str,
        body_limit: usize,
    ) -> Result<Self, Failure> {
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let mut body = Vec::new();
        while body.len() < body_limit {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                // Whatever it said is lost with the rest of it.
                Err(error) => {
                    let error = error.without_url();
                    return Err(Failure::transient(if error.is_timeout() {
                        format!("the answer of {target} ({status}) timed out before its end")
                    } else {
                        format!(
                            "the answer of {target} ({status}) was cut off: {}",
                            error_chain(&error)
                        )
                    }));
                }
            }
        }
        Ok(Self {
            status,
            retry_after,
            body: Bytes::from(body),
        })
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// `"{target} answered {status}: {body}"`, the body cut short.
    pub fn reason(&self, target: &str) -> String {
        let text = self.text();
        let text = text.trim();
        if text.is_empty() {
            return format!("{target} answered {}", self.status);
        }
        let cut: String = text.chars().take(REASON_BODY_CHARS).collect();
        let more = if cut.len() < text.len() { "..." } else { "" };
        format!("{target} answered {}: {cut}{more}", self.status)
    }

    /// The usual reading of an answer that is not a success: 408, 429 and
    /// 5xx are transient (after the `Retry-After` asked for), anything else
    /// refuses the request. Connectors whose backend says more (per-item
    /// results, its own codes) read the body themselves first.
    pub fn failure(&self, target: &str) -> Failure {
        let reason = self.reason(target);
        match classify(self.status) {
            StatusClass::Transient => Failure::Transient {
                reason,
                retry_after: self.retry_after,
            },
            StatusClass::Permanent => Failure::Refused(reason),
        }
    }
}

/// A service's base URL from a connector's `url` field: http or https, query
/// and fragment dropped, a path kept with a trailing `/` so paths join under it.
pub fn base_url(text: &str) -> Result<reqwest::Url, PluginConfigError> {
    let mut url = reqwest::Url::parse(text)
        .map_err(|error| PluginConfigError::new("url", format!("not a valid URL: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(PluginConfigError::new(
            "url",
            format!(
                "expected an http or https URL, found scheme \"{}\"",
                url.scheme()
            ),
        ));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

/// `url` as logs and errors may show it: without the user and password a
/// URL can carry.
pub fn display(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    // Both fail only for URLs that cannot carry credentials at all.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

/// How requests authenticate; sent with every request, marked sensitive.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    #[default]
    None,
    Basic {
        username: String,
        password: SecretString,
    },
    Bearer(SecretString),
    /// A header of the API's own (`X-API-Key: ...`).
    Header {
        name: String,
        value: SecretString,
    },
}

/// Everything the client builder applies. Defaults: 30 s request timeout,
/// certificates verified against the built-in roots, no proxy, no auth.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A whole request, response included.
    pub timeout: Duration,
    /// Connecting alone; `None`: bounded by `timeout` only.
    pub connect_timeout: Option<Duration>,
    /// PEM file of CA certificates trusted besides the built-in roots.
    pub ca_file: Option<PathBuf>,
    /// Skip certificate verification (the caller warns).
    pub accept_invalid_certs: bool,
    /// `http://host:port` of a proxy every request goes through.
    pub proxy: Option<String>,
    pub auth: Auth,
    /// Sent with every request, after `auth` (mark secret values sensitive:
    /// they then never show in debug output).
    pub headers: HeaderMap,
    /// Gzip request bodies (`Content-Encoding: gzip`).
    pub gzip: bool,
    /// Idle connections kept per host.
    pub max_idle_per_host: usize,
    /// Idle pooled connections are closed after this long.
    pub pool_idle_timeout: Duration,
    /// Keepalive probes find connections a load balancer dropped silently.
    pub tcp_keepalive: Duration,
    /// Follow redirects (up to 10); off hands 3xx answers to the caller (a
    /// connector that checks where a redirect goes before following it).
    pub follow_redirects: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            connect_timeout: None,
            ca_file: None,
            accept_invalid_certs: false,
            proxy: None,
            auth: Auth::None,
            headers: HeaderMap::new(),
            gzip: false,
            max_idle_per_host: 10,
            pool_idle_timeout: Duration::from_secs(90),
            tcp_keepalive: Duration::from_secs(30),
            follow_redirects: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read the CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the CA file {} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("the CA file {} is not valid PEM: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("not a usable proxy URL: {0}")]
    Proxy(String),
    #[error("{0} is not a valid HTTP header name")]
    HeaderName(String),
    #[error("the {0} header holds characters a header cannot carry")]
    HeaderValue(String),
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// A built client: reqwest's, plus what it adds to each request.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    gzip: bool,
}

impl HttpClient {
    pub fn new(options: &ClientOptions) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .timeout(options.timeout)
            .pool_max_idle_per_host(options.max_idle_per_host)
            .pool_idle_timeout(options.pool_idle_timeout)
            .tcp_keepalive(options.tcp_keepalive)
            .tls_danger_accept_invalid_certs(options.accept_invalid_certs)
            .default_headers(default_headers(options)?);
        if let Some(timeout) = options.connect_timeout {
            builder = builder.connect_timeout(timeout);
        }
        if !options.follow_redirects {
            builder = builder.redirect(reqwest::redirect::Policy::none());
        }
        if let Some(path) = &options.ca_file {
            for certificate in read_ca_file(path)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        builder = match &options.proxy {
            Some(url) => builder.proxy(
                reqwest::Proxy::all(url.as_str())
                    .map_err(|error| ClientError::Proxy(error_chain(&error)))?,
            ),
            None => builder.no_proxy(),
        };
        let client = builder
            .build()
            .map_err(|error| ClientError::Build(error_chain(&error)))?;
        Ok(Self {
            client,
            gzip: options.gzip,
        })
    }

    /// A request carrying `body`, gzipped when the client is set to.
    pub fn request(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        body: Bytes,
    ) -> reqwest::RequestBuilder {
        let request = self.client.request(method, url);
        if self.gzip {
            request
                .header(CONTENT_ENCODING, HeaderValue::from_static("gzip"))
                .body(gzip(&body))
        } else {
            request.body(body)
        }
    }

    /// A request without a body (a health check).
    pub fn empty(&self, method: reqwest::Method, url: reqwest::Url) -> reqwest::RequestBuilder {
        self.client.request(method, url)
    }
}

/// `body` as one gzip member, at the fastest level: a request body is sent
/// once, not stored, and JSON lines still shrink sevenfold at it.
fn gzip(body: &[u8]) -> Vec<u8> {
    let mut compressed = Vec::with_capacity(body.len() / 4 + 32);
    GzEncoder::new(body, Compression::fast())
        .read_to_end(&mut compressed)
        .expect("reading from memory into memory cannot fail");
    compressed
}

fn default_headers(options: &ClientOptions) -> Result<HeaderMap, ClientError> {
    let mut headers = HeaderMap::new();
    let auth = match &options.auth {
        Auth::None => None,
        Auth::Basic { username, password } => Some((
            AUTHORIZATION,
            format!(
                "Basic {}",
                STANDARD.encode(format!("{username}:{}", password.expose_secret()))
            ),
        )),
        Auth::Bearer(token) => Some((AUTHORIZATION, format!("Bearer {}", token.expose_secret()))),
        Auth::Header { name, value } => Some((
            HeaderName::try_from(name.as_str())
                .map_err(|_| ClientError::HeaderName(name.clone()))?,
            value.expose_secret().to_owned(),
        )),
    };
    if let Some((name, value)) = auth {
        let mut value =
            HeaderValue::try_from(value).map_err(|_| ClientError::HeaderValue(name.to_string()))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    for (name, value) in &options.headers {
        headers.insert(name, value.clone());
    }
    Ok(headers)
}

fn read_ca_file(path: &PathBuf) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let pem = std::fs::read(path).map_err(|source| ClientError::CaFile {
        path: path.clone(),
        source,
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|error| {
        ClientError::BadCertificate {
            path: path.clone(),
            reason: error_chain(&error),
        }
    })?;
    if certificates.is_empty() {
        return Err(ClientError::NoCertificate { path: path.clone() });
    }
    Ok(certificates)
}

/// Up to `limit` bytes of a response body as text (lossy UTF-8), reading
/// the rest of a short body so the connection goes back to the pool.
pub async fn read_text(response: reqwest::Response, limit: usize) -> String {
    String::from_utf8_lossy(&read_bytes(response, limit).await).into_owned()
}

/// Up to `limit` bytes of a response body, reading the rest of a short
/// body so the connection goes back to the pool.
pub async fn read_bytes(mut response: reqwest::Response, limit: usize) -> Bytes {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(body)
}

/// An error with its causes ("connection refused" hides under "error sending request").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        headers
    }

    #[test]
    fn given_statuses_when_classified_should_retry_only_transient_ones() {
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify(status), StatusClass::Transient, "{status}");
        }
        for status in [100, 200, 301, 400, 401, 403, 404, 409, 413, 422, 499] {
            assert_eq!(classify(status), StatusClass::Permanent, "{status}");
        }
    }

    #[test]
    fn given_retry_after_in_seconds_when_parsed_should_give_the_wait_capped() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(retry_after(&headers(" 0 "), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("99999"), now), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn given_retry_after_as_a_date_when_parsed_should_give_the_wait_until_then() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(20));
        assert_eq!(
            retry_after(&headers(&later), now),
            Some(Duration::from_secs(20))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(20));
        assert_eq!(retry_after(&headers(&earlier), now), Some(Duration::ZERO));
        // The obsolete RFC 850 form is an HTTP date too.
        assert_eq!(
            retry_after(&headers("Tuesday, 14-Nov-23 22:13:40 GMT"), now),
            Some(Duration::from_secs(20))
        );
    }

    #[test]
    fn given_no_or_garbage_retry_after_when_parsed_should_give_none() {
        let now = SystemTime::now();
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&headers("-5"), now), None);
    }

    #[test]
    fn given_a_url_with_credentials_when_displayed_should_leave_them_out() {
        let url = reqwest::Url::parse("https://user:s3cret@h:9200/es/_bulk?x=1").unwrap();
        assert_eq!(display(&url), "https://h:9200/es/_bulk?x=1");
    }

    #[test]
    fn given_auth_when_building_headers_should_mark_the_secret_sensitive() {
        let options = ClientOptions {
            auth: Auth::Bearer(SecretString::from("t0ken")),
            ..ClientOptions::default()
        };
        let headers = default_headers(&options).unwrap();
        assert!(headers[AUTHORIZATION].is_sensitive());
        assert!(!format!("{headers:?}").contains("t0ken"));
    }

    #[test]
    fn given_a_bad_auth_header_name_when_building_should_name_it() {
        let options = ClientOptions {
            auth: Auth::Header {
                name: "bad name".into(),
                value: SecretString::from("v"),
            },
            ..ClientOptions::default()
        };
        let error = HttpClient::new(&options).unwrap_err();
        assert!(error.to_string().contains("bad name"), "{error}");
    }
}

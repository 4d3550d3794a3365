//! The connector kit's HTTP plumbing against real local servers (the scripted
//! server of `support::http_server`): every client-builder option is seen to
//! take effect on the wire, `Retry-After` is read from real responses, and the
//! harness's own faults behave as the sinks' tests rely on.
#![cfg(feature = "kit-http")]

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use iggy_connect::connectors::kit::failure::Failure;
use iggy_connect::connectors::kit::http::{
    Auth, ClientError, ClientOptions, HttpClient, exchange_whole, retry_after,
};
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderValue};
use secrecy::SecretString;

use crate::support;
use crate::support::http_server::{Reply, ScriptedServer};

const BODY: &[u8] = b"{\"n\":1}\n{\"n\":2}\n";

fn client(options: ClientOptions) -> HttpClient {
    HttpClient::new(&options).expect("a client")
}

async fn post(client: &HttpClient, url: &str) -> reqwest::Result<reqwest::Response> {
    client
        .request(Method::POST, url.parse().unwrap(), Bytes::from_static(BODY))
        .send()
        .await
}

fn quick() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    }
}

/// A certificate for `localhost`, self-signed: the server's and, in a PEM
/// file, the CA the client trusts.
struct TestCertificate {
    cert_pem: String,
    key_pem: String,
    ca_file: tempfile::NamedTempFile,
}

fn test_certificate() -> TestCertificate {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = generated.cert.pem();
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &cert_pem).unwrap();
    TestCertificate {
        cert_pem,
        key_pem: generated.signing_key.serialize_pem(),
        ca_file,
    }
}

#[tokio::test]
async fn a_ca_file_makes_the_client_trust_a_server_it_issued() {
    let certificate = test_certificate();
    let server =
        ScriptedServer::start_tls(Vec::new(), &certificate.cert_pem, &certificate.key_pem).await;
    let url = server.https_url("/ingest");

    let untrusting = client(quick());
    let error = post(&untrusting, &url).await.unwrap_err();
    assert!(error.is_connect(), "{error:?}");

    let trusting = client(ClientOptions {
        ca_file: Some(certificate.ca_file.path().to_owned()),
        ..quick()
    });
    let response = post(&trusting, &url).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.received()[0].body, BODY);
}

#[tokio::test]
async fn accept_invalid_certs_talks_to_a_server_nobody_vouches_for() {
    let certificate = test_certificate();
    let server =
        ScriptedServer::start_tls(Vec::new(), &certificate.cert_pem, &certificate.key_pem).await;
    let reckless = client(ClientOptions {
        accept_invalid_certs: true,
        ..quick()
    });
    let response = post(&reckless, &server.https_url("/ingest")).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_ca_file_that_cannot_be_used_is_named_in_the_error() {
    let missing = ClientOptions {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..quick()
    };
    let error = HttpClient::new(&missing).unwrap_err();
    assert!(matches!(error, ClientError::CaFile { .. }), "{error:?}");
    assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");

    let empty = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(empty.path(), "not a certificate\n").unwrap();
    let error = HttpClient::new(&ClientOptions {
        ca_file: Some(empty.path().to_owned()),
        ..quick()
    })
    .unwrap_err();
    assert!(
        matches!(error, ClientError::NoCertificate { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn each_auth_reaches_the_server_in_its_header() {
    let server = ScriptedServer::start(Vec::new()).await;
    let cases = [
        (
            Auth::Basic {
                username: "iggy".into(),
                password: SecretString::from("s3cret"),
            },
            "authorization",
            // base64("iggy:s3cret")
            "Basic aWdneTpzM2NyZXQ=",
        ),
        (
            Auth::Bearer(SecretString::from("t0ken")),
            "authorization",
            "Bearer t0ken",
        ),
        (
            Auth::Header {
                name: "X-API-Key".into(),
                value: SecretString::from("k3y"),
            },
            "x-api-key",
            "k3y",
        ),
    ];
    for (auth, header, expected) in cases {
        let client = client(ClientOptions { auth, ..quick() });
        post(&client, &server.url("/ingest")).await.unwrap();
        let received = server.received().pop().unwrap();
        assert_eq!(received.headers[header], expected, "{header}");
    }
}

#[tokio::test]
async fn extra_headers_go_with_every_request() {
    let server = ScriptedServer::start(Vec::new()).await;
    let mut headers = HeaderMap::new();
    headers.insert("x-tenant", HeaderValue::from_static("tenant-1"));
    let client = client(ClientOptions { headers, ..quick() });
    post(&client, &server.url("/a")).await.unwrap();
    post(&client, &server.url("/b")).await.unwrap();
    for received in server.received() {
        assert_eq!(received.headers["x-tenant"], "tenant-1");
    }
}

#[tokio::test]
async fn a_gzip_client_sends_bodies_the_server_decodes() {
    let server = ScriptedServer::start(Vec::new()).await;
    let body: Vec<u8> = (0..2000)
        .flat_map(|n| format!("{{\"event\":\"click\",\"n\":{n}}}\n").into_bytes())
        .collect();
    let gzip = client(ClientOptions {
        gzip: true,
        ..quick()
    });
    gzip.request(
        Method::POST,
        server.url("/ingest").parse().unwrap(),
        Bytes::from(body.clone()),
    )
    .send()
    .await
    .unwrap();
    let received = server.received().pop().unwrap();
    assert_eq!(received.headers["content-encoding"], "gzip");
    assert!(
        received.body.len() * 4 < body.len(),
        "compressed {} -> {}",
        body.len(),
        received.body.len()
    );
    assert_eq!(received.decoded_body(), body);
}

#[tokio::test]
async fn a_proxy_carries_every_request() {
    let proxy = ScriptedServer::start(Vec::new()).await;
    let client = client(ClientOptions {
        proxy: Some(proxy.url("")),
        ..quick()
    });
    // A host that does not exist: only the proxy can answer for it.
    let response = post(&client, "http://upstream.invalid/ingest")
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let received = proxy.received().pop().unwrap();
    assert_eq!(received.uri.to_string(), "http://upstream.invalid/ingest");
    assert_eq!(received.body, BODY);
}

#[tokio::test]
async fn a_bad_proxy_url_is_refused_when_building() {
    let error = HttpClient::new(&ClientOptions {
        proxy: Some("not a url".into()),
        ..quick()
    })
    .unwrap_err();
    assert!(matches!(error, ClientError::Proxy(_)), "{error:?}");
}

#[tokio::test]
async fn the_timeout_ends_a_request_the_server_never_answers() {
    let server = ScriptedServer::start(vec![Reply::Stall]).await;
    let client = client(ClientOptions {
        timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    });
    // The client's 300 ms must end it, long before this 10 s guard.
    let error = tokio::time::timeout(
        Duration::from_secs(10),
        post(&client, &server.url("/ingest")),
    )
    .await
    .expect("the client's own timeout ended the request")
    .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(server.count(), 1, "the request arrived");
}

#[tokio::test]
async fn retry_after_is_read_in_seconds_and_as_a_date_from_real_answers() {
    let in_a_minute = SystemTime::now() + Duration::from_secs(60);
    let server = ScriptedServer::start(vec![
        Reply::retry_after(429, 7),
        Reply::retry_at(503, in_a_minute),
    ])
    .await;
    let client = client(quick());
    let first = post(&client, &server.url("/")).await.unwrap();
    assert_eq!(first.status(), 429);
    assert_eq!(
        retry_after(first.headers(), SystemTime::now()),
        Some(Duration::from_secs(7))
    );
    let second = post(&client, &server.url("/")).await.unwrap();
    assert_eq!(second.status(), 503);
    let wait = retry_after(second.headers(), SystemTime::now()).unwrap();
    assert!(
        wait > Duration::from_secs(55) && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
}

#[tokio::test]
async fn a_dropped_connection_fails_the_request_without_an_answer() {
    let server = ScriptedServer::start(vec![Reply::Drop]).await;
    let client = client(quick());
    let error = post(&client, &server.url("/")).await.unwrap_err();
    assert!(!error.is_timeout() && error.status().is_none(), "{error:?}");
    let response = post(&client, &server.url("/")).await.unwrap();
    assert_eq!(response.status(), 200, "the next connection is answered");
}

#[tokio::test]
async fn a_refusing_server_closes_its_port_until_it_accepts_again() {
    let server = ScriptedServer::start(Vec::new()).await;
    let client = client(quick());
    post(&client, &server.url("/")).await.unwrap();
    server.refuse();
    support::wait::eventually("the port to close", Duration::from_secs(10), async || {
        std::net::TcpStream::connect(server.address).is_err()
    })
    .await;
    let error = post(&client, &server.url("/")).await.unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    server.accept();
    support::wait::eventually("the port to open", Duration::from_secs(10), async || {
        std::net::TcpStream::connect(server.address).is_ok()
    })
    .await;
    assert_eq!(post(&client, &server.url("/")).await.unwrap().status(), 200);
}

/// A server that answers every connection with `answer`, as it is, and
/// closes it.
async fn raw_server(answer: &'static [u8]) -> reqwest::Url {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(answer).await;
        }
    });
    url.parse().unwrap()
}

#[tokio::test]
async fn exchange_whole_tells_a_body_cut_short_or_too_large_from_a_whole_one() {
    let client = client(quick());
    let cut = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"rows\":").await;
    let failure = exchange_whole(client.empty(Method::GET, cut), "the server", 1024)
        .await
        .unwrap_err();
    assert!(matches!(failure, Failure::Transient { .. }), "{failure:?}");
    let whole = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{\"rows\":1}").await;
    let answer = exchange_whole(client.empty(Method::GET, whole.clone()), "the server", 10)
        .await
        .unwrap();
    assert_eq!(answer.body.as_ref(), b"{\"rows\":1}");
    let failure = exchange_whole(client.empty(Method::GET, whole), "the server", 9)
        .await
        .unwrap_err();
    assert!(
        matches!(&failure, Failure::Refused(reason) if reason.contains("9 bytes")),
        "{failure:?}"
    );
}

//! The HTTPS listener over real TLS on loopback: serving, certificate rotation by symlink swap
//! (as kubelet updates Secret volumes), mTLS, and draining on shutdown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::serve::SecretDir;
use common::*;
use gpu_share::certs::{self, PemPair};
use gpu_share::server::tls::{ReloadingTls, TlsFiles};
use gpu_share::server::{router, serve_tls};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

struct Server {
    addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(files: TlsFiles, check_every: Duration) -> Server {
    start_with_drain(files, check_every, Duration::ZERO).await
}

async fn start_with_drain(files: TlsFiles, check_every: Duration, drain: Duration) -> Server {
    install_crypto();
    let tls = Arc::new(ReloadingTls::load(files, check_every).expect("certificates load"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(serve_tls(
        listener,
        tls,
        router(dev_state()),
        rx,
        drain,
        Duration::from_secs(5),
    ));
    Server { addr, stop, task }
}

fn client_config(trust: &str, client: Option<&PemPair>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(trust.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder().with_root_certificates(roots);
    match client {
        None => b.with_no_client_auth(),
        Some(p) => {
            let chain = CertificateDer::pem_slice_iter(p.cert_pem.as_bytes())
                .map(Result::unwrap)
                .collect();
            b.with_client_auth_cert(
                chain,
                PrivateKeyDer::from_pem_slice(p.key_pem.as_bytes()).unwrap(),
            )
            .unwrap()
        }
    }
}

/// One HTTPS POST on a new connection; returns (status, body, the server's leaf certificate).
async fn https_post(
    addr: std::net::SocketAddr,
    config: rustls::ClientConfig,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, String, Vec<u8>), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http handshake: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let text =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    Ok((status, text, leaf))
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

fn mutate_body() -> Vec<u8> {
    serde_json::to_vec(&fixture("admission/mig-mixed.json")).unwrap()
}

#[tokio::test]
async fn serves_mutate_over_tls() {
    let pair = certs::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    let secret = SecretDir::new(&pair);
    let server = start(secret.files(None), Duration::from_secs(1)).await;
    let (status, body, _) = https_post(
        server.addr,
        client_config(&pair.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let (status, body, _) = https_post(
        server.addr,
        client_config(&pair.cert_pem, None),
        "/mutate",
        b"{".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("error"));
    server.stop.send(true).unwrap();
    server.task.await.unwrap();
}

#[tokio::test]
async fn rotation_by_symlink_swap_is_picked_up_without_restart() {
    let old = certs::self_signed(&["localhost"]).unwrap();
    let new = certs::self_signed(&["localhost"]).unwrap();
    let mut secret = SecretDir::new(&old);
    let server = start(secret.files(None), Duration::ZERO).await;
    let (_, _, leaf) = https_post(
        server.addr,
        client_config(&old.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await
    .unwrap();
    assert_eq!(leaf, der(&old.cert_pem));

    secret.publish(&new);
    let (status, _, leaf) = https_post(
        server.addr,
        client_config(&new.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        leaf,
        der(&new.cert_pem),
        "the rotated certificate is served"
    );
    assert!(
        https_post(
            server.addr,
            client_config(&old.cert_pem, None),
            "/mutate",
            mutate_body()
        )
        .await
        .is_err(),
        "old CA no longer matches"
    );

    // A broken rotation keeps the last good certificate.
    secret.publish(&PemPair {
        cert_pem: "garbage".into(),
        key_pem: "garbage".into(),
    });
    let (status, _, leaf) = https_post(
        server.addr,
        client_config(&new.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(leaf, der(&new.cert_pem));
    server.stop.send(true).unwrap();
    server.task.await.unwrap();
}

#[tokio::test]
async fn client_ca_requires_a_client_certificate() {
    let bundle = certs::ca_and_serving("test-ca", &["localhost".to_string()], 30).unwrap();
    let secret = SecretDir::new(&bundle.serving);
    let ca_file = secret.root.path().join("client-ca.crt");
    std::fs::write(&ca_file, &bundle.ca.cert_pem).unwrap();
    let server = start(secret.files(Some(ca_file)), Duration::from_secs(1)).await;

    let anonymous = https_post(
        server.addr,
        client_config(&bundle.ca.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate must be refused"
    );

    // A client certificate signed by the same CA is accepted.
    let client = client_cert_signed_by(&bundle.ca);
    let (status, _, _) = https_post(
        server.addr,
        client_config(&bundle.ca.cert_pem, Some(&client)),
        "/mutate",
        mutate_body(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    server.stop.send(true).unwrap();
    server.task.await.unwrap();
}

fn client_cert_signed_by(ca: &PemPair) -> PemPair {
    let key = rcgen::KeyPair::from_pem(&ca.key_pem).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, key).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["kube-apiserver".to_string()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&client_key, &issuer).unwrap();
    PemPair {
        cert_pem: cert.pem(),
        key_pem: client_key.serialize_pem(),
    }
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let pair = certs::self_signed(&["localhost"]).unwrap();
    let secret = SecretDir::new(&pair);
    let server = start(secret.files(None), Duration::from_secs(1)).await;
    server.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("drains promptly")
        .unwrap();
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn shutdown_keeps_serving_new_connections_for_the_drain() {
    let pair = certs::self_signed(&["localhost"]).unwrap();
    let secret = SecretDir::new(&pair);
    let drain = Duration::from_millis(1500);
    let server = start_with_drain(secret.files(None), Duration::from_secs(1), drain).await;
    let stopped_at = std::time::Instant::now();
    server.stop.send(true).unwrap();
    // The apiserver may still route new calls here until the endpoints drop the pod.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _, _) = https_post(
        server.addr,
        client_config(&pair.cert_pem, None),
        "/mutate",
        mutate_body(),
    )
    .await
    .expect("a new connection during the drain is served");
    assert_eq!(status, 200);
    assert!(
        stopped_at.elapsed() < drain,
        "the request was not made within the drain; the test machine is too slow"
    );
    tokio::time::timeout(Duration::from_secs(10), server.task)
        .await
        .expect("stops after the drain")
        .unwrap();
    assert!(
        stopped_at.elapsed() >= drain,
        "stopped before the drain ended"
    );
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "listener closed"
    );
}

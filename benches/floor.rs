//! The floor for `benches/run.sh`: the same stack as gpu-share (axum, hyper, rustls with ring,
//! TLS 1.2/1.3, HTTP/1.1 and HTTP/2, TCP_NODELAY) answering every request with a constant, after
//! reading its body. What gpu-share costs over it is gpu-share's own work.
//!
//! ```text
//! floor --listen 127.0.0.1:9443 [--nodes nodes.json]
//! ```
//!
//! `POST /mutate` answers an allowed AdmissionReview without a patch. `POST /scheduler/filter`
//! and `/scheduler/prioritize` answer what gpu-share would for every node of `--nodes`
//! (every node passes; every node scores 5), so the replies are as large as gpu-share's.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9443")]
    listen: SocketAddr,
    /// A NodeList whose node names the extender replies carry.
    #[arg(long)]
    nodes: Option<std::path::PathBuf>,
}

const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-0000-0000-000000000000","allowed":true}}"#;

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let names: Vec<String> = match &args.nodes {
        Some(p) => {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(p).expect("read --nodes")).expect("JSON");
            v["items"]
                .as_array()
                .expect("a NodeList")
                .iter()
                .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
                .collect()
        }
        None => Vec::new(),
    };
    let filter = Bytes::from(
        serde_json::to_vec(&json!({"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}))
            .unwrap(),
    );
    let prioritize = Bytes::from(
        serde_json::to_vec(
            &names
                .iter()
                .map(|n| json!({"Host": n, "Score": 5}))
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    );
    let constant = |reply: Bytes| {
        move |_body: Bytes| {
            let reply = reply.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], reply).into_response() }
        }
    };
    let app = Router::new()
        .route(
            "/mutate",
            post(constant(Bytes::from_static(REVIEW.as_bytes()))),
        )
        .route("/scheduler/filter", post(constant(filter)))
        .route("/scheduler/prioritize", post(constant(prioritize)))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20));

    let pair = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("certificate");
    let certs = vec![CertificateDer::from_pem_slice(pair.cert.pem().as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(pair.signing_key.serialize_pem().as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("TLS config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .expect("bind");
        eprintln!("floor listening on {}", args.listen);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
}

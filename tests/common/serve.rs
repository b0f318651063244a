//! A `gpu-share serve --dev` process, and the raw clients that talk to it (TLS without
//! verification, HTTP/1 by hand, hyper for HTTP/1 and HTTP/2).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A running `gpu-share serve --dev`; killed on drop.
pub struct DevServer {
    pub child: Child,
    pub https: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl DevServer {
    /// Starts the binary with `--dev`, loopback ports and `extra` flags; waits for `/readyz`.
    pub fn start(extra: &[&str]) -> DevServer {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let (https, admin) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .args([
                "serve",
                "--dev",
                "--listen",
                &https.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = DevServer {
            child,
            https,
            admin,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some((200, _)) = http_get(admin, "/readyz") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "serve never became ready: {}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory in MiB.
    pub fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb / 1024.0
    }

    /// Open descriptors of the process.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of one sample in `/metrics` (0 when absent).
    pub fn metric(&self, sample: &str) -> f64 {
        let (_, text) = http_get(self.admin, "/metrics").expect("metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits for the process to exit by itself (SIGKILL after `limit`).
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status (SIGKILL after 30 s).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking GET over plain HTTP/1.0 with a 5 s budget: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Some((status, body.to_string()))
}

/// Raises this process's open-file limit to its hard limit.
pub fn raise_fd_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024)
}

/// A client configuration that trusts any certificate, for the given protocol versions and ALPN.
pub fn client_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    super::install_crypto();
    let provider = rustls::crypto::ring::default_provider();
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(gpu_share::status::NoVerify::ring())
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}

/// A TCP connection from a chosen loopback address (`127.0.0.2` is another client).
pub async fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(addr).await
}

/// A TLS connection (TLS 1.2 or 1.3, HTTP/1.1 unless `h2`).
pub async fn tls_connect(addr: SocketAddr, h2: bool) -> std::io::Result<TlsStream<TcpStream>> {
    tls_connect_from([127, 0, 0, 1], addr, h2).await
}

/// A TLS connection from a chosen loopback address.
pub async fn tls_connect_from(
    from: [u8; 4],
    addr: SocketAddr,
    h2: bool,
) -> std::io::Result<TlsStream<TcpStream>> {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let config = client_config(rustls::ALL_VERSIONS, alpn);
    let tcp = connect_from(from, addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// An AdmissionReview for a pod asking `timeslice-50`.
pub fn mutate_body(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ml", "annotations": {"gpu-share": "timeslice-50"}},
                "spec": {"containers": [{"name": "main", "image": "x"}]}
            }
        }
    }))
    .unwrap()
}

/// One POST on a new HTTP/1.1 TLS connection: status and body.
pub async fn post(addr: SocketAddr, path: &str, body: Vec<u8>) -> Result<(u16, String), String> {
    let tls = tls_connect(addr, false)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
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
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A kept-alive HTTP/2 connection.
pub async fn h2_client<B>(
    addr: SocketAddr,
) -> Result<hyper::client::conn::http2::SendRequest<B>, String>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = tls_connect(addr, true)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Writes `head` (and `body`) on a new TLS connection and reads what comes back until the
/// server closes it or `within` passes.
pub async fn raw_exchange(
    addr: SocketAddr,
    head: &str,
    body: &[u8],
    within: Duration,
) -> std::io::Result<String> {
    let mut tls = tls_connect(addr, false).await?;
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(body).await?;
    tls.flush().await?;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Reads from `s` until EOF or error (`true`), or `within` passes (`false`).
pub async fn closes_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// A Secret-volume-like layout: `dir/tls.crt -> ..data/tls.crt`, `..data -> ..<version>`.
pub struct SecretDir {
    pub root: tempfile::TempDir,
    version: u32,
}

impl SecretDir {
    pub fn new(pair: &gpu_share::certs::PemPair) -> Self {
        let mut s = SecretDir {
            root: tempfile::tempdir().unwrap(),
            version: 0,
        };
        s.publish(pair);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), s.root.path().join(f)).unwrap();
        }
        s
    }

    /// Writes a new version and swaps `..data` atomically, like kubelet's AtomicWriter.
    pub fn publish(&mut self, pair: &gpu_share::certs::PemPair) {
        self.version += 1;
        let dir = self.root.path().join(format!("..v{}", self.version));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
        let tmp = self.root.path().join("..data_tmp");
        std::os::unix::fs::symlink(format!("..v{}", self.version), &tmp).unwrap();
        std::fs::rename(&tmp, self.root.path().join("..data")).unwrap();
    }

    pub fn files(&self, client_ca: Option<std::path::PathBuf>) -> gpu_share::server::tls::TlsFiles {
        gpu_share::server::tls::TlsFiles {
            cert: self.root.path().join("tls.crt"),
            key: self.root.path().join("tls.key"),
            client_ca,
        }
    }
}

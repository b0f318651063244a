//! Accepted connections under stated bounds, for both listeners.
//!
//! - **Connection limit.** Each listener admits at most `max_connections`. At the limit, a new
//!   connection closes an idle one (no request in progress): the longest-idle connection of the
//!   client address holding the most idle connections. Only when every connection is busy is
//!   the new one refused. So one client opening connections cannot lock out kubelet's probes,
//!   Prometheus or the API server, which come from other addresses.
//! - **First request.** The TLS handshake, HTTP/1-or-2 detection and the first request's head
//!   must arrive within `header_timeout` of the accept.
//! - **Idle.** A connection with no request in progress for `idle_timeout` is closed (HTTP/2:
//!   GOAWAY). HTTP/2 pings do not count as activity; an unfinished HTTP/1 head does not either.
//! - **Bodies** are bounded in time and bytes by [`super::body`].
//!
//! Shutdown: when `shutdown` turns true the listener keeps accepting for `drain`, then stops,
//! asks every connection to finish (HTTP/1 after the current request, HTTP/2 by GOAWAY) and
//! waits up to `grace` for them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

use super::tls::ReloadingTls;
use crate::metrics::Metrics;

/// How long a closing connection (idle, evicted) may take to go before it is dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Most concurrent HTTP/2 streams on one connection.
pub const H2_MAX_STREAMS: u32 = 64;

/// The bounds of one listener.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Which listener (`https` or `admin`), for logs and metrics.
    pub listener: &'static str,
    pub max_connections: usize,
    /// From accept to the first request's head: handshake, protocol detection, headers.
    pub header_timeout: Duration,
    /// No request in progress for this long: closed.
    pub idle_timeout: Duration,
}

impl ConnLimits {
    /// The defaults `serve` states in `--help`.
    pub fn new(listener: &'static str, max_connections: usize) -> Self {
        ConnLimits {
            listener,
            max_connections,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// One connection's activity, shared by its task, its service and the registry.
struct Conn {
    ip: IpAddr,
    accepted: Instant,
    in_flight: AtomicUsize,
    /// A request has begun on it.
    served: AtomicBool,
    /// Milliseconds after `accepted` when the last request ended (0: none yet).
    idle_since_ms: AtomicU64,
    /// Request begun or ended: the task recomputes its deadline.
    changed: Notify,
    /// The registry asks it to close (evicted for a newer connection).
    evict: Notify,
}

impl Conn {
    fn new(ip: IpAddr) -> Self {
        Conn {
            ip,
            accepted: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            changed: Notify::new(),
            evict: Notify::new(),
        }
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Since when it has had no request in progress.
    fn idle_since(&self) -> Instant {
        self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire))
    }

    /// When it is to be closed if nothing happens before; `None` while a request is in progress.
    fn deadline(&self, limits: &ConnLimits) -> Option<(Instant, &'static str)> {
        if self.busy() {
            return None;
        }
        if self.served.load(Ordering::Acquire) {
            Some((self.idle_since() + limits.idle_timeout, "idle"))
        } else {
            Some((self.accepted + limits.header_timeout, "no_request"))
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(self.clone())
    }
}

/// A request in progress; dropping it (done or cancelled) ends it.
struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        let ms = c.accepted.elapsed().as_millis().max(1) as u64;
        c.idle_since_ms.store(ms, Ordering::Release);
        c.in_flight.fetch_sub(1, Ordering::AcqRel);
        c.changed.notify_one();
    }
}

/// The open connections of one listener.
pub struct Registry {
    limits: ConnLimits,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    /// Signalled whenever a connection goes.
    gone: Notify,
    metrics: Arc<Metrics>,
    /// When "refused" was last logged (at most one line per 10 s).
    refused_logged: Mutex<Option<Instant>>,
    refused_unlogged: AtomicU64,
}

/// A connection's place in the registry; dropping it frees the place.
struct Admitted {
    id: u64,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut m = self.registry.lock();
        m.remove(&self.id);
        let open = m.len();
        drop(m);
        self.registry
            .metrics
            .connections(self.registry.limits.listener, open as i64);
        self.registry.gone.notify_waiters();
    }
}

impl Registry {
    pub fn new(limits: ConnLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Registry {
            limits,
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            gone: Notify::new(),
            metrics,
            refused_logged: Mutex::new(None),
            refused_unlogged: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        crate::sync::lock(&self.conns)
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.lock().len()
    }

    /// A place for a new connection from `ip`: free, or taken from an idle one (see the module
    /// docs); `None` when every connection has a request in progress.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let mut m = self.lock();
        if m.len() >= self.limits.max_connections {
            let mut idle_by_ip: HashMap<IpAddr, usize> = HashMap::new();
            for c in m.values().filter(|c| !c.busy()) {
                *idle_by_ip.entry(c.ip).or_default() += 1;
            }
            let heaviest = idle_by_ip
                .into_iter()
                .max_by_key(|(ip, n)| (*n, *ip))
                .map(|(ip, _)| ip);
            let oldest = m
                .iter()
                .filter(|(_, c)| !c.busy() && Some(c.ip) == heaviest)
                .min_by_key(|(_, c)| c.idle_since())
                .map(|(id, _)| *id);
            match oldest.and_then(|id| m.remove(&id)) {
                Some(evicted) => {
                    evicted.evict.notify_one();
                    self.metrics
                        .connection_closed(self.limits.listener, "evicted");
                }
                None => {
                    drop(m);
                    self.refused();
                    return None;
                }
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(ip));
        m.insert(id, conn.clone());
        let open = m.len();
        drop(m);
        self.metrics.connections(self.limits.listener, open as i64);
        Some(Admitted {
            id,
            conn,
            registry: self.clone(),
        })
    }

    fn refused(&self) {
        self.metrics
            .connection_closed(self.limits.listener, "refused");
        let mut last = crate::sync::lock(&self.refused_logged);
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            self.refused_unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(Instant::now());
        let more = self.refused_unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            listener = self.limits.listener,
            limit = self.limits.max_connections,
            refused_since_last_line = more,
            "connection refused: every connection has a request in progress"
        );
    }

    /// Resolves when no connection is open.
    async fn all_gone(&self) {
        loop {
            let notified = self.gone.notified();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Serves `listener` until shutdown: TLS when `tls` is given, plain HTTP otherwise.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    app: Router,
    registry: Arc<Registry>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
    grace: Duration,
) {
    let name = registry.limits.listener;
    let (closing_tx, closing) = watch::channel(false);
    let drained = async {
        crate::shared::stopped(&mut shutdown).await;
        if !drain.is_zero() {
            tracing::info!(
                listener = name,
                ?drain,
                "shutting down: still serving while the endpoints catch up"
            );
            tokio::time::sleep(drain).await;
        }
    };
    tokio::pin!(drained);
    let mut accept_errors = AcceptErrors::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut drained => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_errors.log(name, &e);
                    // Out of descriptors (or another transient error): let connections close.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(admitted) = registry.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        // Replies go out at once: with Nagle's algorithm a reply's last segment waits for the
        // client's delayed ACK (up to 40 ms on Linux), which kube-scheduler pays on every
        // filter and prioritize call it makes over a kept-alive connection.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let tls = tls.clone();
        let closing = closing.clone();
        let limits = registry.limits.clone();
        tokio::spawn(async move {
            connection(stream, peer, tls, app, admitted, limits, closing).await;
        });
    }
    drop(listener);
    tracing::info!(
        listener = name,
        open = registry.open(),
        "stopped accepting; finishing in-flight requests"
    );
    let _ = closing_tx.send(true);
    tokio::select! {
        _ = registry.all_gone() => tracing::info!(listener = name, "all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!(listener = name, ?grace, open = registry.open(), "in-flight requests did not finish in time; closing"),
    }
}

/// Logs accept errors at most once per 10 s, with how many were not logged.
#[derive(Default)]
struct AcceptErrors {
    last: Option<Instant>,
    unlogged: u64,
}

impl AcceptErrors {
    fn log(&mut self, listener: &str, e: &std::io::Error) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            self.unlogged += 1;
            return;
        }
        self.last = Some(Instant::now());
        tracing::warn!(listener, error = %e, not_logged_since_last_line = self.unlogged, "accept failed");
        self.unlogged = 0;
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<ReloadingTls>>,
    app: Router,
    admitted: Admitted,
    limits: ConnLimits,
    closing: watch::Receiver<bool>,
) {
    let conn = admitted.conn.clone();
    let metrics = admitted.registry.metrics.clone();
    match tls {
        None => {
            serve_http(
                TokioIo::new(stream),
                peer,
                app,
                &conn,
                &limits,
                &metrics,
                closing,
            )
            .await
        }
        Some(tls) => {
            let acceptor = tls.acceptor().await;
            let deadline = conn.accepted + limits.header_timeout;
            let handshake = tokio::select! {
                r = tokio::time::timeout_at(deadline.into(), acceptor.accept(stream)) => r,
                _ = conn.evict.notified() => return,
            };
            let tls_stream = match handshake {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics.connection_closed(limits.listener, "handshake_timeout");
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            serve_http(
                TokioIo::new(tls_stream),
                peer,
                app,
                &conn,
                &limits,
                &metrics,
                closing,
            )
            .await
        }
    }
    drop(admitted);
}

/// The peer's address, as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

async fn serve_http<I>(
    io: TokioIo<I>,
    peer: SocketAddr,
    app: Router,
    conn: &Arc<Conn>,
    limits: &ConnLimits,
    metrics: &Metrics,
    mut closing: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let for_service = conn.clone();
    let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        let in_flight = for_service.begin();
        req.extensions_mut().insert(Peer(peer));
        let app = app.clone();
        async move {
            let response = app.oneshot(req.map(axum::body::Body::new)).await;
            drop(in_flight);
            response
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Waiting for the next request's head is idling: the idle timeout bounds it (the watch
        // below closes it and counts why; hyper's own timer, a second later, is a backstop).
        .header_read_timeout(limits.idle_timeout + Duration::from_secs(1))
        .max_buf_size(64 << 10);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(64 << 10)
        .max_pending_accept_reset_streams(64)
        .max_local_error_reset_streams(Some(256));
    let served = builder.serve_connection(io, service);
    tokio::pin!(served);
    let mut close_by: Option<Instant> = None;
    // Shutdown reached a connection on which no request has begun yet: the client has most
    // likely just sent one, so it gets a second for it (then the reply) before the close.
    let mut close_after_first: Option<Instant> = None;
    loop {
        if let Some(at) = close_after_first
            && (conn.served.load(Ordering::Acquire) || at <= Instant::now())
        {
            close_after_first = None;
            served.as_mut().graceful_shutdown();
            close_by = Some(Instant::now() + Duration::from_secs(3600));
        }
        let deadline = conn.deadline(limits);
        let wake = close_by
            .or(close_after_first)
            .or(deadline.map(|(at, _)| at))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let changed = conn.changed.notified();
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if close_after_first.is_some() {
                    continue;
                }
                if close_by.is_some() {
                    tracing::debug!(%peer, "connection did not close in time; dropped");
                    return;
                }
                if let Some((at, why)) = conn.deadline(limits)
                    && at <= Instant::now()
                {
                    metrics.connection_closed(limits.listener, why);
                    tracing::debug!(%peer, reason = why, "closing connection");
                    if why == "no_request" {
                        // Nothing was ever asked on it (a slow or silent head): just drop it.
                        return;
                    }
                    served.as_mut().graceful_shutdown();
                    close_by = Some(Instant::now() + CLOSE_WAIT);
                }
            }
            _ = changed => {}
            _ = conn.evict.notified(), if close_by.is_none() && close_after_first.is_none() => {
                tracing::debug!(%peer, "closing the longest-idle connection for a new one");
                served.as_mut().graceful_shutdown();
                close_by = Some(Instant::now() + CLOSE_WAIT);
            }
            _ = closing.wait_for(|c| *c), if close_by.is_none() && close_after_first.is_none() && !*closing.borrow() => {
                if conn.served.load(Ordering::Acquire) || conn.busy() {
                    served.as_mut().graceful_shutdown();
                    // Shutdown: the server's grace bounds how long in-flight requests may take.
                    close_by = Some(Instant::now() + Duration::from_secs(3600));
                } else {
                    close_after_first = Some(Instant::now() + Duration::from_secs(1));
                }
            }
        }
    }
}

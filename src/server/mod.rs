//! The HTTPS service and the plain-HTTP admin listener: routers, TLS accept loop with
//! per-connection certificate reload, policy reload, readiness, graceful shutdown.

pub mod body;
pub mod conn;
mod policy;
pub mod shutdown;
mod start;
pub mod tls;

pub use crate::shared::{LoadedPolicy, PolicyStore, Readiness, json_error, stopped};
pub use policy::*;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::{Role, ServeArgs};
use crate::cluster::ClusterFacts;
use crate::extender::handlers as ext;
use crate::extender::state::{DEFAULT_ASSUME_TTL, ExtenderState, Mode};
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::{Error, Result, admission, extender};
use start::{certificate_files, connect, extender_state, load_policy_at_start};

/// Largest AdmissionReview body accepted (a pod is at most ~1.5 MiB in etcd).
pub const MUTATE_BODY_LIMIT: usize = 4 << 20;

/// Largest extender body accepted (full Node objects of a large cluster when not
/// `nodeCacheCapable`).
pub const EXTENDER_BODY_LIMIT: usize = 64 << 20;

/// The small body budget: the first 64 KiB of every body in flight (512 such bodies at once).
pub const SMALL_BODY_BUDGET: usize = 32 << 20;

/// The body budgets for a role: `memory` bytes in all, the large part at least the largest
/// body the role accepts.
pub fn body_budget(role: Role, memory: usize, timeout: Duration) -> body::BodyBudget {
    let largest = if role.extender() {
        EXTENDER_BODY_LIMIT
    } else {
        MUTATE_BODY_LIMIT
    };
    body::BodyBudget::new(
        SMALL_BODY_BUDGET,
        memory.saturating_sub(SMALL_BODY_BUDGET).max(largest),
        timeout,
    )
}

/// The routers' state: the shared parts, each handler taking only the part it needs (axum's
/// `FromRef`: `/mutate` an [`admission::Context`], the verbs an [`extender::Context`]). Cloning
/// it clones handles.
#[derive(Clone)]
pub struct AppState {
    pub role: Role,
    pub policy: Arc<PolicyStore>,
    /// `None` in `--dev` (no cluster).
    pub cluster: Option<ClusterFacts>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<Readiness>,
    /// The extender's state (`--role extender|all`).
    pub extender: Option<Arc<ExtenderState>>,
    /// The memory request bodies may take, over every connection.
    pub body: Arc<body::BodyBudget>,
    /// The usernames that may write gpu-share's later annotations on admitted pods.
    pub annotation_writers: Arc<Vec<String>>,
    /// What the reservation pods are made of (per-GPU sharing).
    pub reservations: Arc<crate::reservation::Template>,
    /// `--dev` with `--nodes`: the nodes' MIG forms, for the webhook's `mig.strategy: auto`.
    pub dev_mig_offers: Option<Arc<crate::inventory::MigOffers>>,
    /// The ResourceQuotas, watched by the extender (each namespace's GPUs against its quotas).
    pub quotas: Arc<crate::cluster::quotas::Seen>,
}

impl AppState {
    /// State for `--dev` and tests: the given policy, no cluster, everything ready.
    pub fn dev(role: Role, policy: Policy) -> Self {
        AppState {
            role,
            policy: Arc::new(PolicyStore::new(policy)),
            cluster: None,
            metrics: Arc::new(Metrics::new()),
            ready: Arc::new(Readiness::all_ready()),
            extender: role
                .extender()
                .then(|| Arc::new(ExtenderState::new(Mode::Dev, DEFAULT_ASSUME_TTL))),
            body: Arc::new(body_budget(role, 96 << 20, Duration::from_secs(10))),
            annotation_writers: Arc::new(vec![admission::guard::DEFAULT_WRITER.to_string()]),
            reservations: Arc::default(),
            dev_mig_offers: None,
            quotas: Arc::default(),
        }
    }
}

impl FromRef<AppState> for admission::Context {
    fn from_ref(app: &AppState) -> Self {
        admission::Context {
            policy: app.policy.clone(),
            cluster: app.cluster.clone(),
            metrics: app.metrics.clone(),
            annotation_writers: app.annotation_writers.clone(),
            dev_mig_offers: app.dev_mig_offers.clone(),
        }
    }
}

impl FromRef<AppState> for extender::Context {
    fn from_ref(app: &AppState) -> Self {
        extender::Context {
            extender: app.extender.clone(),
            policy: app.policy.clone(),
            metrics: app.metrics.clone(),
            cluster: app.cluster.clone(),
            reservations: app.reservations.clone(),
            quotas: app.quotas.clone(),
        }
    }
}

/// The HTTPS routes.
pub fn router(state: AppState) -> Router {
    let bounded = |route: MethodRouter<AppState>, endpoint: &'static str, limit: usize| {
        let rule = Arc::new(body::BodyRule {
            endpoint,
            limit,
            budget: state.body.clone(),
            metrics: state.metrics.clone(),
        });
        route
            .layer(DefaultBodyLimit::max(limit))
            .layer(axum::middleware::from_fn_with_state(rule, body::bounded))
    };
    let mut r = Router::new();
    if state.role.webhook() {
        r = r
            .route(
                "/mutate",
                bounded(post(admission::review::mutate), "mutate", MUTATE_BODY_LIMIT),
            )
            .route(
                "/validate",
                bounded(
                    post(admission::workloads::validate),
                    "validate",
                    MUTATE_BODY_LIMIT,
                ),
            )
            .route(
                "/mutate-templates",
                bounded(
                    post(admission::workloads::mutate_templates),
                    "mutate_templates",
                    MUTATE_BODY_LIMIT,
                ),
            );
    }
    if state.role.extender() {
        r = r
            .route(
                "/scheduler/filter",
                bounded(post(ext::filter_handler), "filter", EXTENDER_BODY_LIMIT),
            )
            .route(
                "/scheduler/prioritize",
                bounded(
                    post(ext::prioritize_handler),
                    "prioritize",
                    EXTENDER_BODY_LIMIT,
                ),
            )
            .route(
                "/scheduler/bind",
                bounded(
                    post(extender::bind::bind_handler),
                    "bind",
                    EXTENDER_BODY_LIMIT,
                ),
            )
            .route(
                "/scheduler/preempt",
                bounded(
                    post(crate::extender::preempt::preempt_handler),
                    "preempt",
                    EXTENDER_BODY_LIMIT,
                ),
            )
            .route("/v1/nodes", get(ext::nodes_handler))
            .route("/v1/quotas", get(crate::quota::report::handler));
    }
    r.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The metrics label of a path: its endpoint, or `unrouted`.
fn endpoint_of(path: &str) -> &'static str {
    match path {
        "/mutate" => "mutate",
        "/validate" => "validate",
        "/mutate-templates" => "mutate_templates",
        "/scheduler/filter" => "filter",
        "/scheduler/prioritize" => "prioritize",
        "/scheduler/bind" => "bind",
        "/scheduler/preempt" => "preempt",
        "/v1/nodes" => "nodes",
        "/v1/quotas" => "quotas",
        "/livez" => "livez",
        "/readyz" => "readyz",
        "/metrics" => "metrics",
        "/" => "page",
        _ => "unrouted",
    }
}

async fn not_found(State(state): State<AppState>, uri: Uri) -> Response {
    state
        .metrics
        .observe("unrouted", "not_found", Duration::ZERO);
    json_error(
        StatusCode::NOT_FOUND,
        &format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed(State(state): State<AppState>, method: Method, uri: Uri) -> Response {
    let endpoint = endpoint_of(uri.path());
    state
        .metrics
        .observe(endpoint, "method_not_allowed", Duration::ZERO);
    let allowed = match endpoint {
        "mutate" | "validate" | "mutate_templates" | "filter" | "prioritize" | "bind"
        | "preempt" => "POST",
        _ => "GET",
    };
    let mut r = json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{} does not take {method}; use {allowed}", uri.path()),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
    r
}

/// The plain-HTTP admin routes: `/livez`, `/readyz`, `/metrics`.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/nodes", get(local_nodes))
        .route("/v1/quotas", get(local_quotas))
        .route("/", get(local_page))
        .route("/ui/style.css", get(crate::ui::style_handler))
        .route("/ui/page.js", get(crate::ui::script_handler))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The occupancy page (`/`) on the plain-HTTP admin port: it names pods, so, as `/v1/nodes`,
/// only to loopback clients (a `kubectl port-forward`, or the pod itself).
async fn local_page(
    state: State<extender::Context>,
    query: axum::extract::Query<crate::ui::page::Filter>,
    peer: Option<axum::Extension<conn::Peer>>,
) -> Response {
    match peer {
        Some(axum::Extension(conn::Peer(addr))) if addr.ip().to_canonical().is_loopback() => {
            crate::ui::page_handler(state, query).await
        }
        _ => json_error(
            StatusCode::FORBIDDEN,
            "the occupancy page names pods, so the plain-HTTP admin port serves it to loopback clients only: use kubectl port-forward to this port",
        ),
    }
}

/// `/v1/nodes` on the plain-HTTP admin port: it names pods, so only to loopback clients (a
/// `kubectl port-forward`, or the pod itself). The HTTPS port serves it to anyone it trusts.
async fn local_nodes(
    state: State<extender::Context>,
    peer: Option<axum::Extension<conn::Peer>>,
) -> Response {
    match peer {
        // An IPv4 client on a dual-stack socket reads ::ffff:127.0.0.1: canonical first.
        Some(axum::Extension(conn::Peer(addr))) if addr.ip().to_canonical().is_loopback() => {
            ext::nodes_handler(state).await
        }
        _ => json_error(
            StatusCode::FORBIDDEN,
            "/v1/nodes names pods, so the plain-HTTP admin port serves it to loopback clients only: use kubectl port-forward to this port, or the HTTPS port",
        ),
    }
}

/// `/v1/quotas` on the plain-HTTP admin port: it names namespaces, so, as `/v1/nodes`, only to
/// loopback clients.
async fn local_quotas(
    state: State<extender::Context>,
    peer: Option<axum::Extension<conn::Peer>>,
) -> Response {
    match peer {
        Some(axum::Extension(conn::Peer(addr))) if addr.ip().to_canonical().is_loopback() => {
            crate::quota::report::handler(state).await
        }
        _ => json_error(
            StatusCode::FORBIDDEN,
            "/v1/quotas names namespaces, so the plain-HTTP admin port serves it to loopback clients only: use kubectl port-forward to this port, or the HTTPS port",
        ),
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    let missing = state.ready.missing();
    if missing.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join("; ")),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = {
        let _scrape = state.metrics.scrape_lock();
        state.metrics.ready(state.ready.missing().is_empty());
        if let Some(ext) = &state.extender {
            extender::report::update_gauges(ext, &state.metrics, &state.policy.current().mig);
        }
        state.metrics.encode()
    };
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// How long the listener keeps accepting after SIGTERM while reporting not ready, so that the
/// Service's endpoints drop the pod before it stops answering (taken from the shutdown grace).
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Serves HTTPS on `listener` with the default connection bounds (see [`conn::serve`]).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<tls::ReloadingTls>,
    app: Router,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
    grace: Duration,
) {
    let registry = conn::Registry::new(
        conn::ConnLimits::new("https", 1000),
        Arc::new(Metrics::new()),
    );
    conn::serve(listener, Some(tls), app, registry, shutdown, drain, grace).await;
}

/// Raises the soft open-file limit to the hard one, and returns how many descriptors the two
/// listeners' connections may use (the limit less room for files, the API client and logs).
pub fn descriptor_budget() -> usize {
    const RESERVED: u64 = 128;
    let soft = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit; assuming 1024");
            1024
        }
    };
    soft.saturating_sub(RESERVED).max(16).min(usize::MAX as u64) as usize
}

/// The bounds of the HTTPS and admin listeners from the flags, the connection limits lowered
/// (HTTPS first) to fit `descriptors`.
pub fn connection_limits(
    args: &ServeArgs,
    descriptors: usize,
) -> (conn::ConnLimits, conn::ConnLimits) {
    let admin_max = args
        .admin_max_connections
        .clamp(1, (descriptors / 4).max(1));
    let https_max = args
        .max_connections
        .clamp(1, descriptors.saturating_sub(admin_max).max(1));
    if https_max < args.max_connections || admin_max < args.admin_max_connections {
        tracing::warn!(
            requested = args.max_connections,
            admin_requested = args.admin_max_connections,
            https = https_max,
            admin = admin_max,
            descriptors,
            "connection limits lowered to fit the open-file limit"
        );
    }
    let bounds = |listener, max| conn::ConnLimits {
        listener,
        max_connections: max,
        header_timeout: Duration::from_secs(args.header_timeout_seconds.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout_seconds.max(1)),
    };
    (bounds("https", https_max), bounds("admin", admin_max))
}

/// The accept queue asked of the kernel (capped by `net.core.somaxconn`): a burst of connections
/// waits there instead of having its SYNs dropped and retried a second later.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a TCP listener, naming the address on failure.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listen = || {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| Error::Listen { addr, source })
}

/// `gpu-share serve`: load the policy and the certificate, build the extender's state, connect
/// to the cluster and start its tasks, then serve until a signal.
pub async fn run(args: ServeArgs) -> Result<()> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    shutdown::spawn_signal_handler(shutdown_tx);
    let ready = Arc::new(Readiness::default());
    let metrics = Arc::new(Metrics::new());

    let (store, policy_bytes) = load_policy_at_start(&args)?;
    ready.policy.store(true, Ordering::Release);
    // `--keep-certs`: the webhook's own certificates in place (and their files written) first.
    let keeper = keep_certs_at_start(&args).await?;
    // The `--dev` certificate's directory lives as long as the service.
    let (files, _dev_dir) = certificate_files(&args)?;
    let tls = Arc::new(tls::ReloadingTls::load(files, Duration::from_secs(1))?);
    ready.certificate.store(true, Ordering::Release);
    if let Some((client, k)) = keeper {
        crate::cluster::certs::spawn(client, k, shutdown_rx.clone());
    }
    let extender = extender_state(&args, &store)?;
    let cluster = connect(&args, &extender, &store, &ready, &metrics, &shutdown_rx).await?;
    if let Some(path) = &args.policy {
        spawn_policy_reloader(
            path.clone(),
            policy_bytes,
            store.clone(),
            metrics.clone(),
            Duration::from_secs(args.policy_reload_seconds.max(1)),
            shutdown_rx.clone(),
        );
    }
    if let Some(ext) = &extender {
        extender::sync::spawn_maintenance(
            ext.clone(),
            Duration::from_secs(10),
            shutdown_rx.clone(),
        );
    }
    if let (Some(_), Some(c)) = (&extender, &cluster) {
        crate::cluster::skew::spawn(c.client().clone());
    }
    let reservation_image =
        crate::cluster::reservation_api::image(args.reservation_image.as_deref(), cluster.as_ref())
            .await;
    let reservations = Arc::new(crate::reservation::Template {
        image: reservation_image,
        ..Default::default()
    });
    if let (Some(ext), Some(c)) = (&extender, &cluster) {
        extender::reservation_controller::spawn(
            c.client().clone(),
            ext.clone(),
            store.clone(),
            reservations.clone(),
            metrics.clone(),
            crate::cluster::leadership::Leadership::new(&args.leader_lease),
            shutdown_rx.clone(),
        );
        extender::defrag_controller::spawn(
            c.client().clone(),
            ext.clone(),
            store.clone(),
            metrics.clone(),
            crate::cluster::leadership::Leadership::new(&args.leader_lease),
            shutdown_rx.clone(),
        );
    }
    let quotas = Arc::new(crate::cluster::quotas::Seen::default());
    if let (Some(_), Some(c)) = (&extender, &cluster) {
        quotas.watch(c.client().clone(), shutdown_rx.clone());
    }
    let dev_mig_offers = policy::dev_mig_offers(&args, &store)?;
    let state = AppState {
        role: args.role,
        policy: store,
        cluster,
        metrics,
        ready,
        extender,
        body: Arc::new(body_budget(
            args.role,
            args.body_memory_mib.saturating_mul(1 << 20),
            Duration::from_secs(args.body_timeout_seconds.max(1)),
        )),
        annotation_writers: Arc::new(args.annotation_writers.clone()),
        reservations,
        dev_mig_offers,
        quotas,
    };
    serve(&args, state, tls, shutdown_rx).await
}

/// `--keep-certs`: the keeper's first pass (a CA, the serving certificate, the caBundles, and
/// the serving files written), for up to two minutes; the client and keeper to run on with.
async fn keep_certs_at_start(
    args: &ServeArgs,
) -> Result<Option<(kube::Client, crate::cluster::certs::Keeper)>> {
    if !args.keep_certs.keep_certs || args.dev {
        return Ok(None);
    }
    let (cert, key) = start::cert_and_key(args)?;
    let client = kube::Client::try_default()
        .await
        .map_err(Error::NoCluster)?;
    let k = keeper_of(&args.keep_certs, cert, key);
    crate::cluster::certs::first(&client, &k, Duration::from_secs(120)).await?;
    tracing::info!(secret = %k.tls_secret, configuration = %k.webhook_configuration, "certificate keeper: the webhook's certificates are in place");
    Ok(Some((client, k)))
}

/// The keeper `serve --keep-certs` runs, serving from `cert_file` and `key_file`.
fn keeper_of(
    args: &crate::cli::KeepCertsArgs,
    cert_file: std::path::PathBuf,
    key_file: std::path::PathBuf,
) -> crate::cluster::certs::Keeper {
    let secs = |s: u64| time::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX));
    crate::cluster::certs::Keeper {
        namespace: args.certs_namespace.clone(),
        ca_secret: args.ca_secret.clone(),
        tls_secret: args.tls_secret.clone(),
        webhook_configuration: args.webhook_configuration.clone(),
        settings: crate::certs::keeper::Settings {
            sans: crate::cli::service_sans(&args.webhook_service, &args.certs_namespace),
            serving_validity: secs(args.cert_validity_seconds),
            ca_validity: secs(args.ca_validity_seconds),
            propagation: secs(args.cert_propagation_seconds),
        },
        cert_file,
        key_file,
    }
}

/// Binds both listeners and serves until shutdown. On the first signal: report not ready at
/// once, keep serving for the drain, then stop accepting and finish in-flight requests; the
/// drain comes out of the shutdown grace. The admin listener (`/readyz` says "shutting down")
/// stays up until the HTTPS one is done.
async fn serve(
    args: &ServeArgs,
    state: AppState,
    tls: Arc<tls::ReloadingTls>,
    shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let limits = connection_limits(args, descriptor_budget());
    let https = conn::Registry::new(limits.0, state.metrics.clone());
    let admin_registry = conn::Registry::new(limits.1, state.metrics.clone());
    let listen = args.listen_addr();
    let admin_listen = args.admin_listen_addr();
    let listener = bind(listen).await?;
    let admin = bind(admin_listen).await?;
    tracing::info!(%listen, %admin_listen, role = ?args.role, dev = args.dev, "gpu-share serving");
    {
        let ready = state.ready.clone();
        let mut rx = shutdown.clone();
        tokio::spawn(async move {
            stopped(&mut rx).await;
            ready.draining.store(true, Ordering::Release);
        });
    }
    let total = Duration::from_secs(args.shutdown_grace_seconds);
    let drain = SHUTDOWN_DRAIN.min(total);
    let (admin_stop, admin_stop_rx) = watch::channel(false);
    let admin_task = tokio::spawn(conn::serve(
        admin,
        None,
        admin_router(state.clone()),
        admin_registry,
        admin_stop_rx,
        Duration::ZERO,
        Duration::from_secs(2),
    ));
    conn::serve(
        listener,
        Some(tls),
        router(state),
        https,
        shutdown,
        drain,
        total.saturating_sub(drain),
    )
    .await;
    let _ = admin_stop.send(true);
    let _ = admin_task.await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/v1/nodes` on the admin port: to loopback clients only, IPv4 seen through a dual-stack
    /// socket included.
    #[tokio::test]
    async fn v1_nodes_on_the_admin_port_is_for_loopback_clients_only() {
        use tower::ServiceExt;
        let state = AppState::dev(Role::All, Policy::default_policy());
        let ask = |peer: Option<&str>| {
            let router = admin_router(state.clone());
            let mut req = axum::http::Request::get("/v1/nodes")
                .body(axum::body::Body::empty())
                .unwrap();
            if let Some(p) = peer {
                req.extensions_mut().insert(conn::Peer(p.parse().unwrap()));
            }
            async move { router.oneshot(req).await.unwrap() }
        };
        for ok in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
            assert_eq!(ask(Some(ok)).await.status(), StatusCode::OK, "{ok}");
        }
        for refused in ["10.0.0.7:5000", "[::ffff:10.0.0.7]:5000", "[fd00::7]:5000"] {
            let r = ask(Some(refused)).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{refused}");
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            assert!(
                String::from_utf8_lossy(&body).contains("loopback clients only"),
                "{refused}: refused in words"
            );
        }
        assert_eq!(
            ask(None).await.status(),
            StatusCode::FORBIDDEN,
            "no peer known"
        );
    }

    #[tokio::test]
    async fn a_change_made_before_the_reloader_starts_is_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, crate::policy::DEFAULT_POLICY_YAML).unwrap();
        let (policy, bytes) = load_policy_bytes(&path).unwrap();
        assert_eq!(bytes, crate::policy::DEFAULT_POLICY_YAML.as_bytes());
        let store = Arc::new(PolicyStore::new(policy));
        // The ConfigMap changes between the first read and the reloader's start.
        let changed = crate::policy::DEFAULT_POLICY_YAML.replace(
            "schedulerName: gpu-share-scheduler",
            "schedulerName: other-scheduler",
        );
        assert_ne!(changed, crate::policy::DEFAULT_POLICY_YAML);
        std::fs::write(&path, &changed).unwrap();
        let (_stop, rx) = watch::channel(false);
        let task = spawn_policy_reloader(
            path,
            bytes,
            store.clone(),
            Arc::new(Metrics::new()),
            Duration::from_millis(20),
            rx,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.current().policy.scheduler_name != "other-scheduler" {
            assert!(
                std::time::Instant::now() < deadline,
                "the change was never loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
    }

    #[test]
    fn a_policy_file_that_is_not_utf8_is_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, b"\xff\xfe").unwrap();
        let e = load_policy_bytes(&path).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}

//! The command line (clap): `serve`, `check-policy`. Every `serve` flag has an environment
//! fallback (`GPU_SHARE_<FLAG>`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::telemetry::LogFormat;

/// `gpu-share --version`: the crate's version and the git revision it was built from
/// (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GPU_SHARE_REVISION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "gpu-share",
    version = VERSION,
    about = "Share NVIDIA GPUs in Kubernetes: admission webhook and scheduler extender"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "GPU_SHARE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTPS service (webhook and/or extender) and the admin listener.
    Serve(Box<ServeArgs>),
    /// Validate a policy file and print the effective policy.
    CheckPolicy {
        /// The policy file (YAML).
        file: PathBuf,
    },
    /// Print every GPU node's occupancy: from a running service, or straight from the cluster.
    Status(StatusArgs),
    /// Create a CA and a serving certificate for the webhook Service and print the caBundle.
    Certs(CertsArgs),
    /// Run a reservation pod: find the one GPU the device plugin gave it (NVML), write its UUID
    /// onto the pod, and hold it until stopped. gpu-share creates these pods itself.
    Reserve(gpu_share_agent::ReserveArgs),
    /// Replay a trace (openb CSV, or a NodeList and annotated pods) under packing policies and
    /// report unallocated GPU and fragmentation.
    Simulate(gpu_share_simulator::args::SimulateArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// A running service: its admin listener (e.g. http://127.0.0.1:8080) or its HTTPS port.
    /// Without it, nodes and pods are read from the cluster (KUBECONFIG or in-cluster).
    #[arg(long, env = "GPU_SHARE_SERVER")]
    pub server: Option<String>,
    /// CA certificate (PEM) to verify an https:// --server.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Do not verify an https:// --server's certificate (a --dev service on loopback).
    #[arg(long)]
    pub insecure: bool,
    /// Policy file (for the shared resource name and MIG table) when reading the cluster.
    #[arg(long, env = "GPU_SHARE_POLICY")]
    pub policy: Option<PathBuf>,
    /// Output format, as kubectl's `-o`: the table, `wide` (more columns), or the `/v1/nodes`
    /// shape as `json` or `yaml`.
    #[arg(short = 'o', long, value_enum, default_value_t = crate::status::Output::Table)]
    pub output: crate::status::Output,
    /// The same as `-o json`.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// After the first listing, read again every 2 s and print it again whenever it changed
    /// (as `kubectl get -w`), until interrupted.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// The kubeconfig file to read the cluster with (default: KUBECONFIG, ~/.kube/config, or
    /// the in-cluster configuration), as kubectl's flag.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current one), as kubectl's flag.
    #[arg(long)]
    pub context: Option<String>,
    /// List only this namespace's pending pods and pod names (the GPU accounting still counts
    /// every namespace). As kubectl's flag, so `kubectl gpu-share status -n ml` works.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// Namespace of the webhook Service.
    #[arg(long, default_value = "gpu-share")]
    pub namespace: String,
    /// Name of the webhook Service.
    #[arg(long, default_value = "gpu-share")]
    pub service: String,
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Validity of the certificates, in days (1 to 3650).
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(i64).range(1..=crate::certs::MAX_DAYS))]
    pub days: i64,
}

impl CertsArgs {
    /// The serving certificate's SANs: the Service's DNS names, and loopback for the extender
    /// sidecar.
    pub fn sans(&self) -> Vec<String> {
        service_sans(&self.service, &self.namespace)
    }
}

/// A Service's DNS names, and loopback: what a serving certificate of gpu-share's names.
pub fn service_sans(service: &str, namespace: &str) -> Vec<String> {
    let (s, n) = (service, namespace);
    vec![
        s.to_string(),
        format!("{s}.{n}"),
        format!("{s}.{n}.svc"),
        format!("{s}.{n}.svc.cluster.local"),
        "localhost".into(),
        "127.0.0.1".into(),
    ]
}

/// The webhook's own certificates, kept by itself (`serve --keep-certs`).
#[derive(Debug, Clone, Args)]
pub struct KeepCertsArgs {
    /// Keep the webhook's certificates (the chart's default): a CA in Secret --ca-secret, the
    /// serving certificate and the CAs to trust in Secret --tls-secret, and the caBundle of the
    /// webhook configurations named --webhook-configuration, all renewed before they expire; the
    /// serving certificate is written to --tls-cert and --tls-key, which this process serves.
    #[arg(long, env = "GPU_SHARE_KEEP_CERTS")]
    pub keep_certs: bool,
    /// The namespace of the Secrets and of the webhook Service.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-share")]
    pub certs_namespace: String,
    /// The Secret that holds the serving certificate (tls.crt, tls.key) and the CAs (ca.crt).
    #[arg(long, default_value = "gpu-share-tls")]
    pub tls_secret: String,
    /// The Secret that holds the CA (tls.crt, tls.key); no pod mounts it.
    #[arg(long, default_value = "gpu-share-ca")]
    pub ca_secret: String,
    /// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration whose caBundle to set.
    #[arg(long, default_value = "gpu-share")]
    pub webhook_configuration: String,
    /// The webhook Service, named by the serving certificate.
    #[arg(long, default_value = "gpu-share")]
    pub webhook_service: String,
    /// The serving certificate's validity, seconds (renewed with a third left).
    #[arg(long, default_value_t = 365 * 86_400, value_parser = clap::value_parser!(u64).range(60..=3650 * 86_400))]
    pub cert_validity_seconds: u64,
    /// The CA's validity, seconds (renewed with a third left, beside the old one).
    #[arg(long, default_value_t = 3650 * 86_400, value_parser = clap::value_parser!(u64).range(60..=3650 * 86_400))]
    pub ca_validity_seconds: u64,
    /// How long a new CA bundle or serving certificate takes to reach the API server and every
    /// replica, seconds: a new CA signs nothing before, and an old one leaves the bundle after.
    #[arg(long, default_value_t = 300)]
    pub cert_propagation_seconds: u64,
}

/// Which halves of the service run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Role {
    /// The mutating admission webhook only (needs no pod or node watches).
    Webhook,
    /// The scheduler extender only (the scheduler's sidecar).
    Extender,
    /// Both.
    #[default]
    All,
}

impl Role {
    pub fn webhook(self) -> bool {
        matches!(self, Role::Webhook | Role::All)
    }

    pub fn extender(self) -> bool {
        matches!(self, Role::Extender | Role::All)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// HTTPS address [default: 0.0.0.0:8443; 127.0.0.1:8443 with --dev].
    #[arg(long, env = "GPU_SHARE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Plain-HTTP admin address for /livez, /readyz, /metrics [default: 0.0.0.0:8080; 127.0.0.1:8080 with --dev].
    #[arg(long, env = "GPU_SHARE_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Serving certificate (PEM); re-read when it changes.
    #[arg(long, env = "GPU_SHARE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Serving private key (PEM).
    #[arg(long, env = "GPU_SHARE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM) for client certificates: when set, clients must present one (mTLS).
    #[arg(long, env = "GPU_SHARE_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    #[command(flatten)]
    pub keep_certs: KeepCertsArgs,
    /// Policy file (YAML) [default: the embedded policies/default.yaml]; reloaded when it changes.
    #[arg(long, env = "GPU_SHARE_POLICY")]
    pub policy: Option<PathBuf>,
    /// Which halves to run.
    #[arg(long, env = "GPU_SHARE_ROLE", value_enum, default_value_t = Role::All)]
    pub role: Role,
    /// A NodeList (YAML or JSON) of GPU nodes, for --dev extenders in NodeNames mode.
    #[arg(long, env = "GPU_SHARE_NODES")]
    pub nodes: Option<PathBuf>,
    /// Run with no cluster and no files: a self-signed certificate, loopback listeners, the embedded policy.
    #[arg(long, env = "GPU_SHARE_DEV")]
    pub dev: bool,
    /// Who may write gpu-share's later annotations (gpu-share.io/gpus, gpu-share.io/requeued-at)
    /// on an admitted pod: the extender's ServiceAccount as the API server names it. Repeat the
    /// flag, or separate with commas.
    #[arg(long = "annotation-writer", env = "GPU_SHARE_ANNOTATION_WRITERS", value_delimiter = ',',
          default_value = crate::admission::guard::DEFAULT_WRITER)]
    pub annotation_writers: Vec<String>,
    /// The image of the reservation pods that hold the GPUs gpu-share shares per GPU (they run
    /// `gpu-share reserve`). Default: this container's own image, read from its Pod (POD_NAME,
    /// POD_NAMESPACE).
    #[arg(long, env = "GPU_SHARE_RESERVATION_IMAGE")]
    pub reservation_image: Option<String>,
    /// The Lease (NAMESPACE/NAME) of kube-scheduler's leader election: only the replica whose
    /// kube-scheduler holds it runs the reservation controller. No such Lease: this one runs it.
    #[arg(
        long,
        env = "GPU_SHARE_LEADER_LEASE",
        default_value = "gpu-share/gpu-share-scheduler"
    )]
    pub leader_lease: String,
    /// How often the extender lists nodes and pods to repair drift in its ledger, in seconds.
    #[arg(long, env = "GPU_SHARE_RECONCILE_SECONDS", default_value_t = 60)]
    pub reconcile_seconds: u64,
    /// How long a bound allocation may stay unseen in the API before it frees itself, in seconds.
    #[arg(long, env = "GPU_SHARE_ASSUME_TTL_SECONDS", default_value_t = 120)]
    pub assume_ttl_seconds: u64,
    /// Nudge pods waiting for GPU capacity (annotation gpu-share.io/requeued-at) when an
    /// allocation is released, so kube-scheduler retries them after the extender has seen the
    /// release rather than at its next unrelated event. `false` turns it off.
    #[arg(long, env = "GPU_SHARE_REQUEUE_NUDGE", default_value_t = true, action = clap::ArgAction::Set)]
    pub requeue_nudge: bool,
    /// How often the --policy file is checked for changes, in seconds.
    #[arg(long, env = "GPU_SHARE_POLICY_RELOAD_SECONDS", default_value_t = 5)]
    pub policy_reload_seconds: u64,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, env = "GPU_SHARE_SHUTDOWN_GRACE_SECONDS", default_value_t = 25)]
    pub shutdown_grace_seconds: u64,
    /// Most open HTTPS connections. At the limit a new connection closes the longest-idle one;
    /// it is refused only when every connection has a request in progress. Lowered to fit the
    /// open-file limit if needed.
    #[arg(long, env = "GPU_SHARE_MAX_CONNECTIONS", default_value_t = 1000)]
    pub max_connections: usize,
    /// Most open admin connections (same rule as --max-connections).
    #[arg(long, env = "GPU_SHARE_ADMIN_MAX_CONNECTIONS", default_value_t = 64)]
    pub admin_max_connections: usize,
    /// Seconds from accepting a connection to its first request's head (TLS handshake,
    /// protocol detection and headers), on both listeners.
    #[arg(long, env = "GPU_SHARE_HEADER_TIMEOUT_SECONDS", default_value_t = 10)]
    pub header_timeout_seconds: u64,
    /// Seconds a connection may stay open with no request in progress, on both listeners
    /// (longer than the 90 s idle timeout of Go's HTTP clients, so the API server and
    /// kube-scheduler close first).
    #[arg(long, env = "GPU_SHARE_IDLE_TIMEOUT_SECONDS", default_value_t = 120)]
    pub idle_timeout_seconds: u64,
    /// Seconds a request body may take to arrive (408 after).
    #[arg(long, env = "GPU_SHARE_BODY_TIMEOUT_SECONDS", default_value_t = 10)]
    pub body_timeout_seconds: u64,
    /// MiB of request bodies held in memory at once, over every connection: 32 MiB for the
    /// first 64 KiB of each body, the rest for the remainder (at least the largest body
    /// accepted). A body that cannot be held within --body-timeout-seconds gets 429.
    #[arg(long, env = "GPU_SHARE_BODY_MEMORY_MIB", default_value_t = 96)]
    pub body_memory_mib: usize,
}

impl ServeArgs {
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen.unwrap_or_else(|| {
            if self.dev {
                ([127, 0, 0, 1], 8443).into()
            } else {
                ([0, 0, 0, 0], 8443).into()
            }
        })
    }

    pub fn admin_listen_addr(&self) -> SocketAddr {
        self.admin_listen.unwrap_or_else(|| {
            if self.dev {
                ([127, 0, 0, 1], 8080).into()
            } else {
                ([0, 0, 0, 0], 8080).into()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_dev() {
        let cli = Cli::try_parse_from(["gpu-share", "serve", "--dev"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.listen_addr().to_string(), "127.0.0.1:8443");
        assert_eq!(a.admin_listen_addr().to_string(), "127.0.0.1:8080");
        assert_eq!(a.role, Role::All);
        let cli = Cli::try_parse_from([
            "gpu-share",
            "serve",
            "--role",
            "webhook",
            "--listen",
            "0.0.0.0:9443",
        ])
        .unwrap();
        let Command::Serve(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.listen_addr().to_string(), "0.0.0.0:9443");
        assert_eq!(a.admin_listen_addr().to_string(), "0.0.0.0:8080");
        assert!(a.role.webhook() && !a.role.extender());
        assert!(Cli::try_parse_from(["gpu-share", "serve", "--role", "both"]).is_err());
    }
}

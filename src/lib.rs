//! gpu-share: share NVIDIA GPUs in Kubernetes safely and densely.
//!
//! This crate is the service: one HTTPS service that is a mutating admission webhook (one
//! `gpu-share` annotation becomes everything a GPU-sharing pod needs) and a kube-scheduler
//! extender, and the one `gpu-share` binary. The node agent (`gpu-share reserve`) is
//! `gpu_share_agent` (crates/agent), the simulator (`gpu-share simulate`) `gpu_share_simulator`
//! (crates/simulator); both stand on the pure core, `gpu_share_core` (crates/core), as this does. Decisions are pure
//! functions over plain data ([`request`], [`mig`], [`policy`], [`admission::plan`]); HTTP, TLS
//! and the Kubernetes API are a thin shell around them ([`server`], [`cluster`]).
#![forbid(unsafe_code)]

// The pure core (crates/core), at the paths the service and its tests have always used.
pub use gpu_share_core::{
    cache, defrag, documents, dra, enforcement, inventory, ledger, mig, nvidia, packing, policy,
    request, skew, sync, workloads,
};

pub mod admission;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod extender;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod metrics;
pub mod quota;
pub mod reservation;
pub mod server;
pub mod shared;
pub mod signal;
pub mod status;
pub mod telemetry;
pub mod ui;

/// Errors that stop the service at start, each naming what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{flag}: cannot read {path}: {source}")]
    ReadFile {
        flag: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag}: {reason}")]
    Tls { flag: &'static str, reason: String },
    #[error("policy file {path}: {reason}")]
    Policy { path: String, reason: String },
    #[error("{flag} is required (or run with --dev)")]
    MissingFlag { flag: &'static str },
    #[error("--dev: {what}: {source}")]
    DevFiles {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("--dev: {0}")]
    DevCertificate(#[source] certs::CertError),
    #[error("--nodes {}: {source}", .path.display())]
    ReadNodes {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--nodes {}: {source}", .path.display())]
    Nodes {
        path: std::path::PathBuf,
        #[source]
        source: documents::DocumentError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no Kubernetes configuration found ({0}): set KUBECONFIG, run in a pod with a service account, or use --dev to run without a cluster"
    )]
    NoCluster(#[source] kube::Error),
    #[error("--keep-certs: {0}")]
    KeepCerts(#[from] crate::cluster::certs::KeepError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

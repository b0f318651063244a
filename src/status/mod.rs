//! `gpu-share status`: the occupancy of every GPU node as a table, from a running service
//! (`GET /v1/nodes`) or straight from the cluster (the same ledger, rebuilt from the API).

use std::path::Path;
use std::sync::Arc;

use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::extender::report::{NodeReport, by_node, report};
use crate::ledger::Ledger;
use crate::policy::Policy;
use crate::quota::usage::NamespaceUse;

mod table;
pub use table::*;

/// Why `gpu-share status` could not read the ledger, in words, each cause chained.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("--server {url}: {source}")]
    Url {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error("{url}: no answer within 15s")]
    Timeout { url: String },
    /// The connection failed: `message` tells an untrusted certificate and a server that is
    /// not there apart, with what to do.
    #[error("{message}")]
    Connect {
        message: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{url}: {source}")]
    Read {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{url}{path} answered {status}: {body}")]
    Answered {
        url: String,
        path: &'static str,
        status: http::StatusCode,
        body: String,
    },
    #[error("{url}{path}: unexpected body: {source}")]
    Body {
        url: String,
        path: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("--ca {}: {source}", .path.display())]
    ReadCa {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--ca {}: {source}", .path.display())]
    Ca {
        path: std::path::PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot list nodes and pods: {0}")]
    List(#[source] kube::Error),
    #[error("cannot list pending pods: {0}")]
    ListPending(#[source] kube::Error),
    #[error(
        "no Kubernetes configuration found ({0}): set KUBECONFIG, pass --kubeconfig, or use --server URL"
    )]
    NoConfig(#[source] kube::Error),
    #[error("--kubeconfig {}: {source}", .path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot read the kubeconfig (KUBECONFIG or ~/.kube/config): {0}")]
    DefaultKubeconfig(#[source] kube::config::KubeconfigError),
    #[error("--context {context}: {source}")]
    Context {
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(transparent)]
    Config(kube::config::KubeconfigError),
    #[error(transparent)]
    Client(kube::Error),
}

/// Reads `/v1/nodes` from a running service (`http://` admin port or `https://` service port),
/// and `/v1/quotas` (`None` from a service that does not serve it yet).
pub async fn from_server(
    url: &str,
    ca: Option<&Path>,
    insecure: bool,
) -> Result<(Vec<NodeReport>, Option<Vec<NamespaceUse>>), StatusError> {
    let tls = client_tls(ca, insecure)?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Empty<bytes::Bytes>>(connector);
    let nodes = get_json(&client, url, "/v1/nodes").await?;
    let quotas = match get_json(&client, url, "/v1/quotas").await {
        Ok(q) => Some(q),
        Err(StatusError::Answered { status, .. }) if status == http::StatusCode::NOT_FOUND => None,
        Err(e) => return Err(e),
    };
    Ok((nodes, quotas))
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<bytes::Bytes>,
>;

/// `GET url + path`, read as JSON.
async fn get_json<T: serde::de::DeserializeOwned>(
    client: &HttpClient,
    url: &str,
    path: &'static str,
) -> Result<T, StatusError> {
    let base = url.trim_end_matches('/');
    let uri: http::Uri = format!("{base}{path}")
        .parse()
        .map_err(|source| StatusError::Url {
            url: url.to_string(),
            source,
        })?;
    let req = http::Request::get(uri).body(Empty::new())?;
    let resp = tokio::time::timeout(std::time::Duration::from_secs(15), client.request(req))
        .await
        .map_err(|_| StatusError::Timeout {
            url: url.to_string(),
        })?
        .map_err(|source| StatusError::Connect {
            message: connect_error(url, &source),
            source,
        })?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|source| StatusError::Read {
            url: url.to_string(),
            source,
        })?
        .to_bytes();
    if !status.is_success() {
        return Err(StatusError::Answered {
            url: url.to_string(),
            path,
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    serde_json::from_slice(&body).map_err(|source| StatusError::Body {
        url: url.to_string(),
        path,
        source,
    })
}

/// Why a request to `url` failed, in words: a certificate this client does not trust and a
/// server that is not there are told apart, each with what to do.
fn connect_error(url: &str, e: &(dyn std::error::Error + 'static)) -> String {
    let mut chain: Vec<&(dyn std::error::Error + 'static)> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        chain.push(err);
        // io::Error's source() skips the error it wraps: look inside it too.
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    if let Some(tls) = chain
        .iter()
        .find_map(|err| err.downcast_ref::<rustls::Error>())
    {
        return format!(
            "{url}: the server's TLS certificate is not trusted ({tls}): pass --ca FILE with the CA that signed it (for a cluster, the gpu-share-tls Secret's ca.crt), or --insecure for a --dev service on this machine"
        );
    }
    if let Some(io) = chain
        .iter()
        .find_map(|err| err.downcast_ref::<std::io::Error>())
    {
        match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                return format!(
                    "{url}: nothing is listening there (connection refused): is gpu-share running, and is this its address and port?"
                );
            }
            std::io::ErrorKind::TimedOut => {
                return format!(
                    "{url}: the connection timed out: is the address reachable from here?"
                );
            }
            _ => {}
        }
    }
    let words: Vec<String> = chain.iter().map(|err| err.to_string()).collect();
    format!("{url}: {}", words.join(": "))
}

fn client_tls(ca: Option<&Path>, insecure: bool) -> Result<rustls::ClientConfig, StatusError> {
    let builder = rustls::ClientConfig::builder();
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(NoVerify::ring())
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|source| StatusError::ReadCa {
            path: ca.to_path_buf(),
            source,
        })?;
        let mut reader = std::io::BufReader::new(&pem[..]);
        for cert in rustls_pemfile_certs(&mut reader) {
            roots.add(cert).map_err(|source| StatusError::Ca {
                path: ca.to_path_buf(),
                source,
            })?;
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

fn rustls_pemfile_certs(
    reader: &mut dyn std::io::BufRead,
) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    let mut data = Vec::new();
    let _ = reader.read_to_end(&mut data);
    rustls::pki_types::CertificateDer::pem_slice_iter(&data)
        .filter_map(Result::ok)
        .collect()
}

/// Accepts any server certificate (`--insecure`, for a `--dev` service on loopback).
/// A server-certificate verifier that accepts any certificate (signatures are still checked):
/// for `status --insecure`, and for the tests and the load generator, which talk to `--dev`'s
/// throwaway certificate.
#[derive(Debug)]
pub struct NoVerify(rustls::crypto::CryptoProvider);

impl NoVerify {
    /// With the ring provider, the service's own.
    pub fn ring() -> Arc<NoVerify> {
        Arc::new(NoVerify(rustls::crypto::ring::default_provider()))
    }
}

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Builds the reports from the cluster: lists nodes and pods and rebuilds the ledger as the
/// extender does; and lists the gpu-share pods still waiting for a node.
/// What `gpu-share status` read from the cluster: the node reports, the pending pods, and each
/// namespace's GPUs against its quotas (or why the ResourceQuotas could not be listed).
#[derive(Debug)]
pub struct FromCluster {
    pub reports: Vec<NodeReport>,
    pub pending: Vec<PendingPod>,
    pub quotas: Result<Vec<NamespaceUse>, QuotasUnreadable>,
}

pub async fn from_cluster(
    policy: &Policy,
    access: &ClusterAccess,
) -> Result<FromCluster, StatusError> {
    let client = access.client().await?;
    let listed =
        crate::extender::sync::list_compact(&client, &crate::inventory::Reading::of(policy))
            .await
            .map_err(StatusError::List)?;
    let mut pending = list_pending(&client)
        .await
        .map_err(StatusError::ListPending)?;
    let mut reports = reports_of(policy, listed);
    let quotas = crate::cluster::quotas::list(&client, access.namespace.as_deref())
        .await
        .map(|q| quotas_of(&reports, &q))
        .map_err(QuotasUnreadable);
    if let Some(ns) = &access.namespace {
        pending.retain(|p| &p.namespace == ns);
        let prefix = format!("{ns}/");
        for r in &mut reports {
            r.pods.retain(|p| &p.namespace == ns);
            for g in &mut r.shared_gpus {
                g.shares.retain(|s| s.starts_with(&prefix));
            }
        }
    }
    let quotas = quotas.map(|mut q| {
        if let Some(ns) = &access.namespace {
            q.retain(|u| &u.namespace == ns);
        }
        q
    });
    Ok(FromCluster {
        reports,
        pending,
        quotas,
    })
}

/// Each namespace's GPUs from the node reports' pods (gpu-share's reservations left out) beside
/// the ResourceQuotas.
pub fn quotas_of(
    reports: &[NodeReport],
    quotas: &[k8s_openapi::api::core::v1::ResourceQuota],
) -> Vec<NamespaceUse> {
    let held = reports
        .iter()
        .flat_map(|r| &r.pods)
        .filter(|p| p.kind != "reservation")
        .map(|p| (p.namespace.as_str(), p.gpus));
    crate::quota::usage::by_namespace(held, quotas)
}

/// How `status` reaches the cluster: kubectl's `--kubeconfig`, `--context` and `--namespace`,
/// so that it works as the kubectl plugin `kubectl gpu-share` (installed as `kubectl-gpu_share`).
#[derive(Debug, Clone, Default)]
pub struct ClusterAccess {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
}

impl ClusterAccess {
    async fn client(&self) -> Result<kube::Client, StatusError> {
        if self.kubeconfig.is_none() && self.context.is_none() {
            return kube::Client::try_default()
                .await
                .map_err(StatusError::NoConfig);
        }
        let kubeconfig = match &self.kubeconfig {
            Some(path) => kube::config::Kubeconfig::read_from(path).map_err(|source| {
                StatusError::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?,
            None => kube::config::Kubeconfig::read().map_err(StatusError::DefaultKubeconfig)?,
        };
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|source| match &self.context {
                Some(c) => StatusError::Context {
                    context: c.clone(),
                    source,
                },
                None => StatusError::Config(source),
            })?;
        kube::Client::try_from(config).map_err(StatusError::Client)
    }
}

/// Lists unbound, pending pods (a page of 500 at a time) and keeps the gpu-share ones.
async fn list_pending(client: &kube::Client) -> Result<Vec<PendingPod>, kube::Error> {
    let pods: kube::Api<Pod> = kube::Api::all(client.clone());
    let mut params = kube::api::ListParams::default()
        .fields("spec.nodeName=,status.phase=Pending")
        .limit(500);
    let mut out = Vec::new();
    loop {
        let page = pods.list(&params).await?;
        out.extend(pending_of(&page.items));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

/// PURE: the gpu-share pods among `pods` that are pending without a node.
pub fn pending_of(pods: &[Pod]) -> Vec<PendingPod> {
    use crate::request::{ANNOTATION, ANNOTATION_REQUEST};
    pods.iter()
        .filter(|p| crate::ledger::waits_for_a_node(p))
        .filter_map(|p| {
            let annotations = p.metadata.annotations.as_ref()?;
            let class = annotations
                .get(ANNOTATION_REQUEST)
                .or_else(|| annotations.get(ANNOTATION))?
                .clone();
            let condition = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| {
                    c.iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                });
            let reason = crate::extender::pending::scheduling_reason(p)
                .unwrap_or_else(|| "not tried by the scheduler yet".into());
            Some(PendingPod {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                class,
                since: condition
                    .and_then(|c| c.last_transition_time.as_ref())
                    .map(|t| t.0.to_string()),
                reason,
            })
        })
        .collect()
}

/// The reports for what a list kept.
pub fn reports_of(policy: &Policy, listed: crate::extender::sync::Listed) -> Vec<NodeReport> {
    let reservations = by_node(listed.reservations().to_vec());
    let cordoned = listed.cordoned();
    let (inventory, observed) = listed.into_parts();
    let l = Ledger::rebuild(inventory, &observed);
    let mig = policy.mig_table();
    l.snapshot()
        .values()
        .map(|nl| {
            let r = reservations.get(&nl.node.name).map(Vec::as_slice);
            NodeReport {
                cordoned: cordoned.contains(&nl.node.name),
                ..report(nl, &mig, r.unwrap_or_default())
            }
        })
        .collect()
}

/// The reports for listed nodes and pods.
pub fn reports_from(policy: &Policy, nodes: &[Node], pods: &[Pod]) -> Vec<NodeReport> {
    let reading = crate::inventory::Reading::of(policy);
    let mut listed = crate::extender::sync::Listed::default();
    for n in nodes {
        listed.node(n, &reading);
    }
    for p in pods {
        listed.pod(p);
    }
    reports_of(policy, listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_namespace_against_its_quotas_under_the_table() {
        let nodes =
            crate::server::parse_nodes(include_str!("../../tests/fixtures/extender/nodes.yaml"))
                .unwrap();
        let pod = |name: &str, request: &str, node: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                             "annotations": {"gpu-share.io/request": request}},
                "spec": {"containers": [{"name": "c"}], "nodeName": node},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let pods = [
            pod("trainer", "mig-3g.40gb", "a100-mig"),
            pod("infer", "exclusive", "l40s-plain"),
        ];
        let reports = reports_from(&Policy::default_policy(), &nodes, &pods);
        let quota: k8s_openapi::api::core::v1::ResourceQuota =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "gpus", "namespace": "ml"},
                "spec": {"hard": {"requests.gpu-share.io/gpu-milli": "2k"}},
                "status": {"used": {"requests.gpu-share.io/gpu-milli": "428"}},
            }))
            .unwrap();
        let quotas = quotas_of(&reports, &[quota]);
        assert_eq!(quotas.len(), 1);
        assert_eq!((quotas[0].pods, quotas[0].held_gpus), (2, 1.43));
        let table = format(&reports, Some(&[]), Some(&Ok(quotas)), Output::Table);
        let section = &table[table.find("GPUs per namespace").expect(&table)..];
        assert!(section.contains("NAMESPACE"), "{section}");
        let row = section.lines().find(|l| l.starts_with("ml")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells, ["ml", "2", "1.43", "gpus", "0.43", "2.00"]);
        assert!(
            section.contains("ml: 1 GPUs held by pods that carry no gpu-share.io/gpu-milli"),
            "{section}"
        );
        let unreadable = format(
            &reports,
            None,
            Some(&Err(QuotasUnreadable(kube::Error::TlsRequired))),
            Output::Table,
        );
        assert!(
            unreadable.contains("\nquotas: cannot list ResourceQuotas: "),
            "{unreadable}"
        );
        let json = format(&reports, None, Some(&Ok(vec![])), Output::Json);
        assert!(!json.contains("NAMESPACE"), "JSON is /v1/nodes' shape");
    }

    /// A defragmentation plan posted on a node (`/v1/nodes`' `defragPlans`) is said under the
    /// table, with the node's name; a node with none carries no field.
    #[test]
    fn a_defragmentation_plan_is_said() {
        let nodes =
            crate::server::parse_nodes(include_str!("../../tests/fixtures/extender/nodes.yaml"))
                .unwrap();
        let mut reports = reports_from(&Policy::default_policy(), &nodes, &[]);
        let name = reports[0].name.clone();
        let plan = "for ml/big: moving ml/a from node x to y makes room on node x (plan only: nothing moves)";
        reports[0].defrag_plans = vec![plan.to_string()];
        let table = format(&reports, None, None, Output::Table);
        assert!(
            table.contains(&format!("defragmentation plan: {name}: {plan}")),
            "{table}"
        );
        let json = serde_json::to_value(&reports).unwrap();
        let with: Vec<&serde_json::Value> = json
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r.get("defragPlans"))
            .collect();
        assert_eq!(with, [&serde_json::json!([plan])]);
    }

    /// A node cordoned (`kubectl cordon`) is said to be so, straight from the cluster as from
    /// a service: read where the node's other facts are (`cache::NodeFacts::read`).
    #[test]
    fn a_cordoned_node_says_so() {
        let mut nodes =
            crate::server::parse_nodes(include_str!("../../tests/fixtures/extender/nodes.yaml"))
                .unwrap();
        let name = nodes[0].metadata.name.clone().unwrap();
        nodes[0]
            .spec
            .get_or_insert_with(Default::default)
            .unschedulable = Some(true);
        let reports = reports_from(&Policy::default_policy(), &nodes, &[]);
        let cordoned: Vec<&str> = reports
            .iter()
            .filter(|r| r.cordoned)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(cordoned, [name.as_str()]);
        let table = format(&reports, None, None, Output::Table);
        let row = table.lines().find(|l| l.starts_with(&name)).unwrap();
        assert!(row.contains(", cordoned"), "{row}");
        let others = table.lines().filter(|l| l.contains("cordoned")).count();
        assert_eq!(others, 1, "{table}");
        let json = serde_json::to_value(&reports).unwrap();
        let flagged = json
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.get("cordoned").is_some())
            .count();
        assert_eq!(flagged, 1, "only a cordoned node carries the field");
    }

    #[test]
    fn table_from_listed_nodes_and_pods() {
        let nodes =
            crate::server::parse_nodes(include_str!("../../tests/fixtures/extender/nodes.yaml"))
                .unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer", "namespace": "ml", "uid": "u1",
                         "annotations": {"gpu-share.io/request": "mig-3g.40gb"}},
            "spec": {"containers": [{"name": "c"}], "nodeName": "a100-mig"},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let reports = reports_from(&Policy::default_policy(), &nodes, &[pod]);
        assert_eq!(reports.len(), 4);
        let a100 = reports.iter().find(|r| r.name == "a100-mig").unwrap();
        assert_eq!(a100.mig["3g.40gb"], "1/8");
        // One GPU count, the physical GPUs (GFD's nvidia.com/gpu.count), and the MIG devices
        // apart, by their compute share: 21 x 1/7 + 8 x 3/7; 3/7 used. Each device counts in
        // whole thousandths, rounded down (29 devices: under 0.03 lost).
        assert_eq!(a100.gpus, 8);
        let mig = 21.0 / 7.0 + 8.0 * 3.0 / 7.0;
        assert!(
            a100.mig_gpus <= mig && mig - a100.mig_gpus < 0.03,
            "{}",
            a100.mig_gpus
        );
        assert!((a100.used_gpus - 0.429).abs() < 0.01, "{}", a100.used_gpus);
        let table = render(&reports);
        assert!(table.starts_with("NODE"));
        assert!(table.contains("ml/trainer(mig-3g.40gb)"), "{table}");
        assert!(table.contains("time-slicing x4"));
        // The same total as the simulator's (tests/simulate.rs: 8, 8, 8, 4 GPUs).
        let total: u32 = reports.iter().map(|r| r.gpus).sum();
        assert_eq!(total, 28);
        assert!(table.contains("4 GPU nodes, 28 GPUs: "), "{table}");
        assert!(table.contains("in all\n"), "{table}");
    }

    /// A node shared per GPU reports each shared GPU with its reservation, the UUID it
    /// published and the shares bound to it, as read from the API alone: a replaced reservation
    /// yields to its successor, a GPU whose reservation is gone says so, and a reservation that
    /// waits says why.
    #[test]
    fn shared_gpus_with_their_reservations_uuids_and_shares() {
        let nodes =
            crate::server::parse_nodes(include_str!("../../tests/cluster/per-gpu-node.yaml"))
                .unwrap();
        let share = |name: &str, gpus: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"),
                    "annotations": {"gpu-share.io/request": "timeslice-30",
                                    "gpu-share.io/gpus": gpus}},
                "spec": {"nodeName": "a100-per-gpu", "containers": [{"name": "c",
                    "resources": {"limits": {"gpu-share.io/shared-gpu": "1"}},
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef":
                        {"name": format!("gpu-share-devices-{name}"),
                         "key": "NVIDIA_VISIBLE_DEVICES"}}}]}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let template = crate::reservation::Template {
            image: "gpu-share:test".into(),
            ..Default::default()
        };
        let reservation = |gpu: u32, uid: &str, extra: serde_json::Value| -> Pod {
            let mut p = crate::reservation::pod("a100-per-gpu", gpu, false, &template);
            p["metadata"]["uid"] = uid.into();
            json_patch::merge(&mut p, &extra);
            serde_json::from_value(p).unwrap()
        };
        let uuid = "GPU-8a3f0c52-1c2d-4e5f-9a0b-123456789abc";
        let pods = [
            share("a", "1:300"),
            share("b", "1:300"),
            share("c", "3:300"),
            reservation(
                1,
                "r-old",
                serde_json::json!({"metadata":
                {"deletionTimestamp": "2026-11-26T10:00:00Z"}}),
            ),
            reservation(
                1,
                "r1",
                serde_json::json!({"metadata":
                {"annotations": {"gpu-share.io/gpu-uuid": uuid}}, "status": {"phase": "Running"}}),
            ),
            reservation(
                2,
                "r2",
                serde_json::json!({"status": {"phase": "Pending",
                "containerStatuses": [{"name": "reserve", "image": "gpu-share:test",
                    "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "ImagePullBackOff",
                                          "message": "pull access denied"}}}]}}),
            ),
        ];
        let reports = reports_from(&Policy::default_policy(), &nodes, &pods);
        let r = &reports[0];
        let name = |gpu| Some(crate::reservation::name("a100-per-gpu", gpu));
        let got: Vec<_> = r
            .shared_gpus
            .iter()
            .map(|g| {
                (
                    g.gpu,
                    g.reservation.clone(),
                    g.state.as_str(),
                    g.uuid.as_deref(),
                    g.detail.as_deref(),
                    g.shares.join(" "),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    1,
                    name(1),
                    "ready",
                    Some(uuid),
                    None,
                    "ml/a ml/b".to_string()
                ),
                (
                    2,
                    name(2),
                    "starting",
                    None,
                    Some("ImagePullBackOff: pull access denied"),
                    String::new()
                ),
                (3, None, "absent", None, None, "ml/c".to_string()),
            ]
        );
        let table = render(&reports);
        assert!(table.contains("GPUs shared per GPU:"), "{table}");
        let row = table
            .lines()
            .find(|l| l.contains(uuid))
            .expect("a row with the UUID");
        assert!(row.contains("ready") && row.ends_with("ml/a ml/b"), "{row}");
        assert!(
            table.contains("a100-per-gpu GPU 2: ImagePullBackOff: pull access denied"),
            "{table}"
        );
        // The JSON of `/v1/nodes` reads back the same.
        let json = serde_json::to_string(&reports).unwrap();
        let back: Vec<NodeReport> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, reports);
    }

    #[test]
    fn physical_gpus_of_every_mig_layout() {
        use crate::inventory::{GpuNode, MigLayout};
        let mut single = GpuNode::whole("s", "A100-40GB", 0, 40960);
        single.slots = 14;
        single.mig = MigLayout::Single {
            profile: "1g.5gb".into(),
            per_gpu: 7,
        };
        assert_eq!(single.physical_gpus(), 2);
        single.mig = MigLayout::Single {
            profile: "3g.20gb".into(),
            per_gpu: 2,
        };
        single.slots = 3;
        assert_eq!(single.physical_gpus(), 2, "3 devices, 2 per GPU");
        let mut mixed = GpuNode::whole("m", "A100-80GB", 1, 81920);
        mixed.mig = MigLayout::Mixed {
            instances: [("3g.40gb".to_string(), 4)].into(),
        };
        assert_eq!(mixed.physical_gpus(), 3, "1 full + 12/7 by compute share");
        mixed.labelled_gpus = Some(4);
        assert_eq!(
            mixed.physical_gpus(),
            4,
            "GFD's count when larger: 3g + 3g per GPU"
        );
    }

    #[test]
    fn pending_gpu_share_pods_with_their_last_reason() {
        let pods: Vec<Pod> = serde_json::from_value(serde_json::json!([
            {"metadata": {"name": "waits", "namespace": "ml",
                          "annotations": {"gpu-share": "mps-75", "gpu-share.io/request": "mps-75"}},
             "spec": {"containers": [{"name": "c"}]},
             "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "lastTransitionTime": "2026-11-24T05:00:00Z",
                "message": "0/12 nodes are available: 3 MPS replicas on this node are smaller than the request."}]}},
            {"metadata": {"name": "new", "namespace": "ml", "annotations": {"gpu-share": "exclusive"}},
             "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}},
            {"metadata": {"name": "plain", "namespace": "ml"},
             "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}},
            {"metadata": {"name": "bound", "namespace": "ml", "annotations": {"gpu-share": "exclusive"}},
             "spec": {"containers": [{"name": "c"}], "nodeName": "n1"}, "status": {"phase": "Pending"}},
            {"metadata": {"name": "failed", "namespace": "ml", "annotations": {"gpu-share": "exclusive"}},
             "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Failed"}}
        ]))
        .unwrap();
        let pending = pending_of(&pods);
        assert_eq!(
            pending.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["waits", "new"]
        );
        let text = render_pending(&pending);
        assert!(
            text.contains("ml/waits (mps-75) since 2026-11-24T05:00:00Z: 0/12 nodes are available: 3 MPS replicas"),
            "{text}"
        );
        assert!(
            text.contains("ml/new (exclusive): not tried by the scheduler yet"),
            "{text}"
        );
        assert_eq!(render_pending(&[]), "no gpu-share pod is pending\n");
    }
}

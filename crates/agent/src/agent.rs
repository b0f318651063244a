//! `gpu-share reserve`: the process of a reservation pod. It asks NVML which GPU the device
//! plugin gave the pod (exactly one, or it fails in words), writes the GPU's UUID onto its own
//! pod, and idles until it is stopped. A failure is written where it is seen: the container's
//! termination message, an annotation on the pod ([`model::ANNOTATION_ERROR`]) and an Event.
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`, which the nvidia runtime mounts into the
//! container), so the binary runs anywhere and says plainly when the driver is not there.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::json;

use super::model;

/// What `gpu-share reserve` needs to know.
#[derive(Debug, Clone, clap::Args)]
pub struct ReserveArgs {
    /// The reservation pod's name (the downward API's metadata.name).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// Its namespace (metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: String,
    /// Where the container's termination message goes.
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: std::path::PathBuf,
    /// The NVML library to load.
    #[arg(long, default_value = "libnvidia-ml.so.1")]
    pub nvml_library: String,
    /// Also run the GPU's MPS control daemon ([`super::mps`]), its pipe directory published on
    /// the pod once its defaults are set.
    #[arg(long)]
    pub mps: bool,
    /// Write the GPU's own CDI device (`gpu-share.io/gpu=<UUID>`: NVIDIA's edits for the GPU,
    /// nothing added) before the UUID is published, and remove it when stopped: time-sliced
    /// shares that take their GPU through a CDI device name it.
    #[arg(long, conflicts_with = "mps")]
    pub gpu_device: bool,
    /// Where each GPU's MPS pipe and log directories go (`<root>/<uuid>/{pipe,log}`).
    #[arg(long, default_value = "/run/gpu-share/mps")]
    pub mps_root: std::path::PathBuf,
    /// The GPU's own MPS directory instead (`pipe`, `log`, and `shm`, which must be the
    /// container's `/dev/shm`), the same path on the node and in the container.
    #[arg(long)]
    pub mps_dir: Option<std::path::PathBuf>,
    /// Where the GPU's CDI device (`gpu-share.io/mps=<UUID>`, or with `--gpu-device`
    /// `gpu-share.io/gpu=<UUID>`) is written, the node's CDI directory, mounted at the same
    /// path; `none`: no device (the daemon serves only clients that reach its pipe otherwise).
    #[arg(long, default_value = model::CDI_DIR)]
    pub cdi_dir: std::path::PathBuf,
    /// Where NVIDIA's CDI specs are read from (their edits for the GPU are the device's own).
    #[arg(long, value_delimiter = ',', default_values = [model::CDI_STATIC_MOUNT, model::CDI_DIR])]
    pub cdi_specs: Vec<std::path::PathBuf>,
    /// `nvidia-cuda-mps-control` (default: found in PATH or NVIDIA's directories).
    #[arg(long)]
    pub mps_control: Option<std::path::PathBuf>,
    /// The MPS server's default active-thread percentage.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mps_thread_percentage: u32,
    /// The MPS server's default pinned device-memory limit per client, MiB (default: none, the
    /// clients' own limits only).
    #[arg(long)]
    pub mps_pinned_memory_mib: Option<u64>,
    /// Seconds between the daemon's health checks.
    #[arg(long, default_value_t = 2)]
    pub mps_health_seconds: u64,
    /// How many times a failed daemon is started again before the reservation fails.
    #[arg(long, default_value_t = 3)]
    pub mps_restarts: u32,
}

impl ReserveArgs {
    /// The MPS daemon's settings, when asked for.
    fn mps_settings(&self) -> Result<Option<super::mps::Settings>, super::mps::MpsError> {
        if !self.mps {
            return Ok(None);
        }
        let control = match &self.mps_control {
            Some(c) => c.clone(),
            None => super::mps::find_control().ok_or(super::mps::MpsError::NoControl)?,
        };
        Ok(Some(super::mps::Settings {
            control,
            root: self.mps_root.clone(),
            dir: self.mps_dir.clone(),
            thread_percentage: self.mps_thread_percentage,
            pinned_mib: self.mps_pinned_memory_mib,
            health_every: Duration::from_secs(self.mps_health_seconds.max(1)),
            restarts: self.mps_restarts,
        }))
    }
}

/// Why `gpu-share reserve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("no Kubernetes configuration: {0}")]
    NoCluster(#[source] kube::Error),
    #[error("cannot write the GPU's UUID onto pod {namespace}/{name}: {source}")]
    Publish {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    NoGpu(#[from] model::NoGpu),
    #[error("the GPU's MPS daemon: {0}")]
    Mps(#[from] super::mps::MpsError),
    #[error("the GPU's CDI device: {0}")]
    Cdi(#[from] DeviceError),
}

/// Why the GPU's CDI device could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    NoSpec(#[from] super::cdi::CdiError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why NVML could not list the GPUs.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot load or start NVML ({library}): {source}")]
    Load {
        library: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("cannot count GPUs: {0}")]
    Count(#[source] nvml_wrapper::error::NvmlError),
    #[error("cannot read GPU {index}'s UUID: {source}")]
    Uuid {
        index: u32,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("the NVML probe stopped: {0}")]
    Stopped(String),
}

/// Writes the GPU's CDI device ([`super::cdi`]) into `--cdi-dir`: `gpu-share.io/mps=<UUID>`
/// for the MPS daemon `daemon`, else `gpu-share.io/gpu=<UUID>`; under a temporary name then
/// renamed (the runtime reads only `*.json`, so never half a file). `None`: `--cdi-dir none`.
fn write_device(
    args: &ReserveArgs,
    uuid: &str,
    daemon: Option<&super::mps::Daemon>,
) -> Result<Option<std::path::PathBuf>, DeviceError> {
    if args.cdi_dir.as_os_str() == "none" {
        return Ok(None);
    }
    let specs = read_specs(&args.cdi_specs);
    let minor = minor_of(&args.nvml_library, uuid);
    let (version, edits) = super::cdi::gpu_edits(&specs, uuid, minor)?;
    let (spec, file, kind) = match daemon {
        Some(daemon) => {
            let shm = daemon
                .pipe
                .parent()
                .map(|d| d.join("shm"))
                .unwrap_or_else(|| "/dev/shm".into());
            let spec = super::cdi::mps_spec(
                &version,
                &edits,
                uuid,
                &daemon.pipe.display().to_string(),
                &shm.display().to_string(),
            );
            (spec, super::cdi::file_name(uuid), model::MPS_CDI_KIND)
        }
        None => (
            super::cdi::gpu_spec(&version, &edits, uuid),
            super::cdi::gpu_file_name(uuid),
            model::GPU_CDI_KIND,
        ),
    };
    let path = args.cdi_dir.join(file);
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec_pretty(&spec).unwrap_or_default();
    std::fs::create_dir_all(&args.cdi_dir)
        .and_then(|()| std::fs::write(&tmp, &text))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| DeviceError::Write {
            path: path.display().to_string(),
            source,
        })?;
    tracing::info!(path = %path.display(), device = %format!("{kind}={uuid}"), "the GPU's CDI device written");
    Ok(Some(path))
}

/// NVIDIA's CDI specs in `dirs` (`*.json`, `*.yaml`, `*.yml`), with their paths; a file that
/// does not read is skipped, with a warning.
fn read_specs(dirs: &[std::path::PathBuf]) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or_default();
            let parsed = match ext {
                "json" => std::fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string())),
                "yaml" | "yml" => std::fs::read_to_string(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|t| serde_saphyr::from_str(&t).map_err(|e| e.to_string())),
                _ => continue,
            };
            match parsed {
                Ok(v) => out.push((path.display().to_string(), v)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "a CDI spec that does not read: skipped")
                }
            }
        }
    }
    out
}

/// The GPU's device-node minor number, from NVML.
fn minor_of(library: &str, uuid: &str) -> Option<u32> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(library))
        .init()
        .ok()?;
    nvml.device_by_uuid(uuid).ok()?.minor_number().ok()
}

/// The GPU UUIDs NVML sees, or why it cannot tell.
pub fn probe(library: &str) -> Result<Vec<String>, ProbeError> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(library))
        .init()
        .map_err(|source| ProbeError::Load {
            library: library.to_string(),
            source,
        })?;
    let count = nvml.device_count().map_err(ProbeError::Count)?;
    (0..count)
        .map(|index| {
            nvml.device_by_index(index)
                .and_then(|d| d.uuid())
                .map_err(|source| ProbeError::Uuid { index, source })
        })
        .collect()
}

/// Runs the reservation: probe, publish, idle until SIGTERM (or fail in words).
pub async fn run(args: &ReserveArgs) -> Result<(), AgentError> {
    // Listened for from the start: a SIGTERM while the reservation starts, or while it writes a
    // failure, is kept for the wait that follows.
    let mut stop = crate::signal::listen();
    let library = args.nvml_library.clone();
    let found = tokio::task::spawn_blocking(move || probe(&library))
        .await
        .unwrap_or_else(|e| Err(ProbeError::Stopped(e.to_string())));
    let outcome = model::one_gpu(found);
    if let Err(no_gpu) = &outcome {
        let why = no_gpu.to_string();
        tracing::error!("{why}");
        if let Err(e) = std::fs::write(&args.termination_log, &why) {
            tracing::debug!(error = %e, path = %args.termination_log.display(), "no termination log");
        }
    }
    let client = Client::try_default().await.map_err(AgentError::NoCluster)?;
    match outcome {
        Ok(uuid) => {
            let mps = match args.mps_settings() {
                Ok(Some(settings)) => {
                    match super::mps::Daemon::start(&settings, &uuid, &args.nvml_library).await {
                        Ok(d) => Some(d),
                        Err(e) => return fail(&client, args, AgentError::Mps(e)).await,
                    }
                }
                Ok(None) => None,
                Err(e) => return fail(&client, args, AgentError::Mps(e)).await,
            };
            // The device the shares name, once the daemon answers: written before the pipe (or,
            // time-sliced, the UUID) is published, removed before the daemon quits.
            let device = match (&mps, args.gpu_device) {
                (Some(d), _) => match write_device(args, &uuid, Some(d)) {
                    Ok(path) => path,
                    Err(e) => {
                        d.release().await;
                        return fail(&client, args, AgentError::Cdi(e)).await;
                    }
                },
                (None, true) => match write_device(args, &uuid, None) {
                    Ok(path) => path,
                    Err(e) => return fail(&client, args, AgentError::Cdi(e)).await,
                },
                (None, false) => None,
            };
            let remove_device = {
                let device = device.clone();
                move || {
                    if let Some(p) = &device {
                        match std::fs::remove_file(p) {
                            Ok(()) => {
                                tracing::info!(path = %p.display(), "the GPU's CDI device removed")
                            }
                            Err(e) => {
                                tracing::warn!(path = %p.display(), error = %e, "cannot remove the GPU's CDI device")
                            }
                        }
                    }
                }
            };
            let pipe = mps.as_ref().map(|d| d.pipe.display().to_string());
            let state = Published {
                uuid: Some(&uuid),
                error: None,
                mps_pipe: pipe.as_deref(),
                mps_down: None,
            };
            publish(&client, args, state).await?;
            tracing::info!(uuid, pod = %args.pod_name, mps = pipe.as_deref().unwrap_or("none"), "holding the GPU");
            let Some(mut daemon) = mps else {
                stop.wait().await;
                remove_device();
                tracing::info!("stopping: the GPU is released with this pod");
                return Ok(());
            };
            // While the daemon is down the pod says why (`gpu-share.io/mps-down`) and its pipe is
            // withdrawn: every change written, in order.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<String>>();
            let writer = {
                let (client, args, uuid, pipe) =
                    (client.clone(), args.clone(), uuid.clone(), pipe.clone());
                tokio::spawn(async move {
                    while let Some(down) = rx.recv().await {
                        let pipe = if down.is_some() {
                            None
                        } else {
                            pipe.as_deref()
                        };
                        let state = Published {
                            uuid: Some(&uuid),
                            error: None,
                            mps_pipe: pipe,
                            mps_down: down.as_deref(),
                        };
                        if let Err(e) = publish(&client, &args, state).await {
                            tracing::error!("{e}");
                        }
                    }
                })
            };
            let stopped = {
                let remove_device = remove_device.clone();
                let stop = &mut stop;
                async move {
                    stop.wait().await;
                    remove_device();
                }
            };
            let outcome = daemon
                .supervise(stopped, |why| {
                    let _ = tx.send(why.map(str::to_string));
                })
                .await;
            drop(tx);
            let _ = writer.await;
            match outcome {
                Ok(()) => {
                    tracing::info!(
                        "stopping: the GPU and its MPS daemon are released with this pod"
                    );
                    Ok(())
                }
                Err(e) => {
                    // Failed for good: said on the pod (gpu-share moves the shares and removes
                    // the reservation), the GPU closed to new contexts until then.
                    remove_device();
                    let failed = fail(&client, args, AgentError::Mps(e)).await;
                    stop.wait().await;
                    daemon.release().await;
                    failed
                }
            }
        }
        Err(no_gpu) => fail(&client, args, AgentError::NoGpu(no_gpu)).await,
    }
}

/// A reservation that cannot hold its GPU: the reason on the pod, in its termination log and as
/// an Event; the process then exits non-zero (the controller moves or evicts the shares).
async fn fail(client: &Client, args: &ReserveArgs, error: AgentError) -> Result<(), AgentError> {
    let why = error.to_string();
    tracing::error!("{why}");
    if let Err(e) = std::fs::write(&args.termination_log, &why) {
        tracing::debug!(error = %e, path = %args.termination_log.display(), "no termination log");
    }
    let state = Published {
        uuid: None,
        error: Some(&why),
        mps_pipe: None,
        mps_down: None,
    };
    if let Err(e) = publish(client, args, state).await {
        tracing::error!("{e}");
    }
    record_event(client.clone(), args, &why).await;
    Err(error)
}

/// Writes the UUID or the error onto the pod (the other one removed), retrying for about a
/// minute: the API server may be a moment away when the pod starts.
/// What the reservation says on its pod (each `None` removes its annotation).
#[derive(Debug, Clone, Copy)]
struct Published<'a> {
    uuid: Option<&'a str>,
    error: Option<&'a str>,
    mps_pipe: Option<&'a str>,
    mps_down: Option<&'a str>,
}

async fn publish(
    client: &Client,
    args: &ReserveArgs,
    state: Published<'_>,
) -> Result<(), AgentError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &args.pod_namespace);
    let patch = json!({"metadata": {"annotations": {
        model::ANNOTATION_UUID: state.uuid,
        model::ANNOTATION_ERROR: state.error,
        model::ANNOTATION_MPS_PIPE: state.mps_pipe,
        model::ANNOTATION_MPS_DOWN: state.mps_down,
    }}});
    let mut delay = Duration::from_millis(250);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api
            .patch(
                &args.pod_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if attempt < 12 && retriable(&e) => {
                tracing::warn!(error = %e, attempt, "cannot write to the pod yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
            }
            Err(source) => {
                return Err(AgentError::Publish {
                    namespace: args.pod_namespace.clone(),
                    name: args.pod_name.clone(),
                    source,
                });
            }
        }
    }
}

/// Errors worth another try: the API server unreachable, overloaded or briefly failing; never
/// a refusal (forbidden, not found, invalid).
fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

async fn record_event(client: Client, args: &ReserveArgs, why: &str) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "gpu-share-reserve".into(),
            instance: Some(args.pod_name.clone()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(args.pod_name.clone()),
        namespace: Some(args.pod_namespace.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "GpuReservationFailed".into(),
        note: Some(why.chars().take(1000).collect()),
        action: "Reserve".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "cannot record the failure as an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real NVML that cannot load says so (the stand-in library is tested through the binary).
    #[test]
    fn an_nvml_that_cannot_load_is_said_in_words() {
        // On this machine (no driver), NVML cannot load: said in words.
        let e = probe("libnvidia-ml-absent.so.1").unwrap_err().to_string();
        assert!(e.contains("libnvidia-ml-absent.so.1"), "{e}");
        let e = model::one_gpu(Err(e)).unwrap_err().to_string();
        assert!(
            e.starts_with("NVML failed: cannot load or start NVML"),
            "{e}"
        );
    }
}

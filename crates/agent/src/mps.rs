//! The MPS control daemon of a GPU gpu-share shares per GPU, run by the GPU's reservation
//! (`gpu-share reserve --mps`), the way NVIDIA's device plugin and DRA driver run theirs:
//!
//! - **start**: `nvidia-cuda-mps-control -d` starts with a pipe directory and a log directory
//!   of the GPU's own (`<root>/<uuid>/pipe`, `.../log`) and `CUDA_VISIBLE_DEVICES` set to the GPU;
//!   the server's defaults are set (`set_default_active_thread_percentage`,
//!   `set_default_device_pinned_mem_limit`) and read back; then the GPU's compute mode becomes
//!   `EXCLUSIVE_PROCESS` (through NVML), so that the MPS server is the one process with a context
//!   on it. Only then is the pipe directory published on the reservation's pod.
//! - **health**: `get_default_active_thread_percentage` every few seconds must answer the
//!   default set. When it does not, the GPU's compute mode becomes `PROHIBITED` at once: a
//!   client that no MPS server serves would run with the whole GPU, its limits unheld (an MPS
//!   client whose daemon is gone runs without MPS, and nothing says so: benches/results/gpu-runs.md), so no
//!   new context may start until the daemon is back. It is started again, a few times in a row;
//!   when it cannot be, the GPU stays closed until the reservation goes.
//! - **release**: `quit`, and the compute mode back to `DEFAULT`.
//!
//! A start first clears what an earlier daemon on the same pipe left (a reservation killed
//! before its release).
//!
//! The defaults and the health check's words are pure ([`setup_commands`], [`answers`]); the
//! processes and NVML are the thin shell around them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// The control daemon's name, looked up in `PATH` and where NVIDIA's stacks put it.
pub const CONTROL: &str = "nvidia-cuda-mps-control";
const CONTROL_DIRS: [&str; 3] = ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin"];
/// How long one control command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a started daemon may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How the daemon of one GPU is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `nvidia-cuda-mps-control`.
    pub control: PathBuf,
    /// Where each GPU's pipe and log directories go (`<root>/<uuid>/{pipe,log}`).
    pub root: PathBuf,
    /// The GPU's own directory, in place of `<root>/<uuid>` (a reservation pod mounts the one
    /// of its GPU index: [`super::model::mps_dir`]).
    pub dir: Option<PathBuf>,
    /// The server's default active-thread percentage (100: clients narrow it themselves).
    pub thread_percentage: u32,
    /// The server's default pinned device-memory limit per client, MiB (`None`: the GPU's).
    pub pinned_mib: Option<u64>,
    /// How often the daemon is asked whether it is up.
    pub health_every: Duration,
    /// How many times a failed daemon is started again before the reservation fails.
    pub restarts: u32,
}

/// The GPU's compute modes gpu-share sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
    Prohibited,
}

impl ComputeMode {
    pub fn word(self) -> &'static str {
        match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
            ComputeMode::Prohibited => "PROHIBITED",
        }
    }
}

/// Why the daemon could not be run, in words.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("{CONTROL} not found (looked in PATH and {dirs})", dirs = CONTROL_DIRS.join(", "))]
    NoControl,
    #[error("cannot make the MPS directory {path}: {source}")]
    Dir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {CONTROL} ({what}): {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{CONTROL} {what} failed: {output}")]
    Command { what: String, output: String },
    #[error("{CONTROL} {what} gave no answer within {seconds} s")]
    Timeout { what: String, seconds: u64 },
    #[error("the MPS server's default {what} reads {got:?}, not {want}")]
    Unexpected {
        what: &'static str,
        got: String,
        want: String,
    },
    #[error("cannot set the GPU's compute mode to {mode}: {source}")]
    ComputeMode {
        mode: &'static str,
        #[source]
        source: ModeError,
    },
}

/// Why NVML did not set a compute mode.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
    #[error("the NVML call stopped: {0}")]
    Stopped(String),
}

/// PURE: the commands that set the server's defaults for GPU `uuid`.
pub fn setup_commands(s: &Settings, uuid: &str) -> Vec<String> {
    let mut out = vec![format!(
        "set_default_active_thread_percentage {}",
        s.thread_percentage
    )];
    if let Some(m) = s.pinned_mib {
        out.push(format!("set_default_device_pinned_mem_limit {uuid} {m}M"));
    }
    out
}

/// PURE: whether the daemon's answer to `get_default_active_thread_percentage` is `want`
/// (it prints `25.0`, or `25`).
pub fn answers(output: &str, want: u32) -> bool {
    output
        .split_whitespace()
        .last()
        .and_then(|w| w.parse::<f64>().ok())
        .is_some_and(|got| (got - f64::from(want)).abs() < 0.01)
}

/// The control daemon, found in `PATH` or NVIDIA's directories.
pub fn find_control() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(CONTROL_DIRS.iter().map(PathBuf::from))
        .map(|d| d.join(CONTROL))
        .find(|p| p.is_file())
}

/// One GPU's running daemon.
#[derive(Debug)]
pub struct Daemon {
    settings: Settings,
    uuid: String,
    nvml_library: String,
    pub pipe: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// The GPU's directories under `root`.
    pub fn dirs(root: &Path, uuid: &str) -> (PathBuf, PathBuf) {
        let base = root.join(uuid);
        (base.join("pipe"), base.join("log"))
    }

    /// Starts the daemon of GPU `uuid`: compute mode, directories, daemon, defaults, read back.
    pub async fn start(
        settings: &Settings,
        uuid: &str,
        nvml_library: &str,
    ) -> Result<Daemon, MpsError> {
        let (pipe, log) = match &settings.dir {
            Some(dir) => (dir.join("pipe"), dir.join("log")),
            None => Self::dirs(&settings.root, uuid),
        };
        let d = Daemon {
            settings: settings.clone(),
            uuid: uuid.to_string(),
            nvml_library: nvml_library.to_string(),
            pipe,
            log,
        };
        d.clear_leftovers().await;
        for dir in [&d.pipe, &d.log] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Dir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let out = d.run(&["-d"], None).await?;
        tracing::info!(uuid, pipe = %d.pipe.display(), output = %out.trim(), "MPS control daemon started");
        let started = tokio::time::Instant::now();
        loop {
            match d.control("get_default_active_thread_percentage").await {
                Ok(_) => break,
                Err(e) if started.elapsed() < START_TIMEOUT => {
                    tracing::debug!(error = %e, "the MPS daemon does not answer yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
        for command in setup_commands(settings, uuid) {
            let done = match d.control(&command).await {
                // A daemon that takes no UUID for the device: the GPU is its device 0
                // (CUDA_VISIBLE_DEVICES is that GPU alone).
                Err(e) if command.contains(uuid) => {
                    let by_index = command.replace(uuid, "0");
                    tracing::warn!(uuid, error = %e, command = by_index, "the MPS daemon refused the GPU's UUID; its index instead");
                    d.control(&by_index).await.map(|_| by_index)
                }
                other => other.map(|_| command),
            }?;
            tracing::info!(uuid, command = done, "MPS server default set");
        }
        d.check().await?;
        // Last: until the daemon answers with its defaults, the GPU keeps the mode it had
        // (`PROHIBITED` while a failed daemon is started again).
        d.compute_mode(ComputeMode::ExclusiveProcess).await?;
        Ok(d)
    }

    /// Whether the daemon answers with the default it was given.
    pub async fn check(&self) -> Result<(), MpsError> {
        let out = self.control("get_default_active_thread_percentage").await?;
        if answers(&out, self.settings.thread_percentage) {
            Ok(())
        } else {
            Err(MpsError::Unexpected {
                what: "active thread percentage",
                got: out.trim().to_string(),
                want: self.settings.thread_percentage.to_string(),
            })
        }
    }

    /// Stops the daemon (`quit`) and gives the GPU back to any process (`DEFAULT`).
    pub async fn quit(&self) {
        match self.control("quit").await {
            Ok(_) => tracing::info!(uuid = %self.uuid, "MPS control daemon stopped"),
            Err(e) => tracing::warn!(uuid = %self.uuid, error = %e, "MPS daemon quit"),
        }
        if let Err(e) = self.compute_mode(ComputeMode::Default).await {
            tracing::warn!(uuid = %self.uuid, error = %e, "compute mode after quit");
        }
    }

    /// Watches the daemon until `stop` resolves (then `quit`, and the GPU back to `DEFAULT`):
    /// on a failed check, no new context on the GPU (`PROHIBITED`, said through `on_change`) and
    /// the daemon started again, up to [`Settings::restarts`] times in a row; the GPU reopens
    /// once it answers with its defaults. `Err`: it could not be brought back, and the GPU stays
    /// `PROHIBITED` ([`Daemon::release`] reopens it when the reservation goes).
    pub async fn supervise(
        &mut self,
        stop: impl std::future::Future<Output = ()>,
        mut on_change: impl FnMut(Option<&str>),
    ) -> Result<(), MpsError> {
        tokio::pin!(stop);
        loop {
            // A stop is heard during a check or a restart too: what is in flight is dropped (its
            // processes killed) and the daemon quits.
            let outcome = tokio::select! {
                _ = &mut stop => None,
                r = self.watch_once(&mut on_change) => Some(r),
            };
            match outcome {
                None => {
                    self.quit().await;
                    return Ok(());
                }
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e),
            }
        }
    }

    /// One health period: wait, check, and on a failure close the GPU and start the daemon
    /// again.
    async fn watch_once(
        &mut self,
        on_change: &mut impl FnMut(Option<&str>),
    ) -> Result<(), MpsError> {
        tokio::time::sleep(self.settings.health_every).await;
        let Err(e) = self.check().await else {
            return Ok(());
        };
        let why = format!("the MPS daemon failed its health check: {e}");
        tracing::error!(uuid = %self.uuid, "{why}; no new context on the GPU until it is back");
        self.compute_mode(ComputeMode::Prohibited).await?;
        on_change(Some(&why));
        for attempt in 1..=self.settings.restarts {
            match Daemon::start(&self.settings, &self.uuid, &self.nvml_library).await {
                Ok(d) => {
                    tracing::info!(uuid = %self.uuid, attempt, "MPS daemon started again");
                    *self = d;
                    on_change(None);
                    return Ok(());
                }
                Err(again) => {
                    tracing::error!(uuid = %self.uuid, attempt, error = %again, "MPS daemon did not start again");
                }
            }
        }
        Err(e)
    }

    /// The reservation goes after its daemon failed for good: what is left of it quits, and the
    /// GPU takes any process again (it leaves the node's shares behind with the reservation).
    pub async fn release(&self) {
        self.quit().await;
    }

    /// What a previous daemon on this pipe left: a live one quits; a dead one's pipe and lock
    /// files, which would make a new one refuse to start, are removed. A daemon that does not
    /// answer `quit` is left: the new one then fails to start, and the GPU stays closed.
    async fn clear_leftovers(&self) {
        match self.control("quit").await {
            Ok(_) => tracing::info!(uuid = %self.uuid, "an earlier MPS daemon on this pipe quit"),
            Err(MpsError::Command { output, .. })
                if output.contains("Cannot find MPS control daemon") =>
            {
                clear(&self.pipe)
            }
            Err(e) => {
                tracing::warn!(uuid = %self.uuid, error = %e, "an earlier MPS daemon did not quit")
            }
        }
    }

    /// One command on the daemon's standard input; its output.
    async fn control(&self, command: &str) -> Result<String, MpsError> {
        self.run(&[], Some(command)).await
    }

    /// Runs the control binary with the GPU's environment.
    async fn run(&self, args: &[&str], input: Option<&str>) -> Result<String, MpsError> {
        let what = input.map_or_else(|| args.join(" "), str::to_string);
        // Starting (`-d`), the daemon it leaves behind would hold captured output open: only
        // its exit status is read then (the daemon logs to its log directory).
        let output = || {
            if input.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            }
        };
        let mut cmd = tokio::process::Command::new(&self.settings.control);
        cmd.args(args)
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .env("CUDA_VISIBLE_DEVICES", &self.uuid)
            .stdin(output())
            .stdout(output())
            .stderr(output())
            // A `-d` that daemonized has exited: this kills only one that hangs.
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| MpsError::Spawn {
            what: what.clone(),
            source,
        })?;
        if let (Some(mut stdin), Some(line)) = (child.stdin.take(), input) {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
        }
        let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| MpsError::Timeout {
                what: what.clone(),
                seconds: COMMAND_TIMEOUT.as_secs(),
            })?
            .map_err(|source| MpsError::Spawn {
                what: what.clone(),
                source,
            })?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The control program answers "Cannot find MPS control daemon process" (and exits
        // non-zero) when no daemon listens on the pipe.
        if !out.status.success() || text.contains("Cannot find MPS control daemon") {
            return Err(MpsError::Command {
                what,
                output: text.trim().to_string(),
            });
        }
        Ok(text)
    }

    /// Sets the GPU's compute mode through NVML.
    async fn compute_mode(&self, mode: ComputeMode) -> Result<(), MpsError> {
        let (library, uuid) = (self.nvml_library.clone(), self.uuid.clone());
        let call = tokio::task::spawn_blocking(move || set_compute_mode(&library, &uuid, mode));
        tokio::time::timeout(COMMAND_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Ok(Err(ModeError::Stopped(format!(
                    "no answer from NVML within {} s",
                    COMMAND_TIMEOUT.as_secs()
                ))))
            })
            .unwrap_or_else(|e| Err(ModeError::Stopped(e.to_string())))
            .map_err(|source| MpsError::ComputeMode {
                mode: mode.word(),
                source,
            })?;
        tracing::info!(uuid = %self.uuid, mode = mode.word(), "GPU compute mode set");
        Ok(())
    }
}

/// Removes what a dead daemon left in its pipe directory.
fn clear(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let removed = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(err) = removed {
            tracing::warn!(path = %p.display(), error = %err, "cannot clear the old MPS pipe");
        }
    }
}

fn set_compute_mode(library: &str, uuid: &str, mode: ComputeMode) -> Result<(), ModeError> {
    use nvml_wrapper::enum_wrappers::device::ComputeMode as Nvml;
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(library))
        .init()?;
    let mut device = nvml.device_by_uuid(uuid)?;
    device.set_compute_mode(match mode {
        ComputeMode::Default => Nvml::Default,
        ComputeMode::ExclusiveProcess => Nvml::ExclusiveProcess,
        ComputeMode::Prohibited => Nvml::Prohibited,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            control: PathBuf::from(CONTROL),
            root: PathBuf::from("/run/gpu-share/mps"),
            dir: None,
            thread_percentage: 100,
            pinned_mib: Some(40960),
            health_every: Duration::from_secs(2),
            restarts: 3,
        }
    }

    #[test]
    fn the_defaults_name_the_gpu_and_read_back() {
        let uuid = "GPU-150d62e7-6ac7-9aeb-27a6-4d200dab509e";
        assert_eq!(
            setup_commands(&settings(), uuid),
            [
                "set_default_active_thread_percentage 100".to_string(),
                format!("set_default_device_pinned_mem_limit {uuid} 40960M"),
            ]
        );
        let none = Settings {
            pinned_mib: None,
            ..settings()
        };
        assert_eq!(setup_commands(&none, uuid).len(), 1);
        assert!(answers("100.0\n", 100));
        assert!(answers("25", 25));
        assert!(!answers("25.0", 100));
        assert!(!answers("Cannot find MPS control daemon process", 100));
        assert!(!answers("", 100));
        let (pipe, log) = Daemon::dirs(Path::new("/run/gpu-share/mps"), uuid);
        assert_eq!(
            pipe,
            PathBuf::from(format!("/run/gpu-share/mps/{uuid}/pipe"))
        );
        assert_eq!(log, PathBuf::from(format!("/run/gpu-share/mps/{uuid}/log")));
    }
}

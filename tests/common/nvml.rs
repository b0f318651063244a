//! NVML for `gpu-share reserve` without a GPU: the stand-in `libnvidia-ml.so.1` of
//! tests/node/standin/nvml (the one the real-node tests mount into containers), built from its
//! source once per source into the tests' target directory, and a device directory that plays
//! the container's `/dev`. The agent loads it as it loads the driver's (`--nvml-library`), so no
//! test reaches a branch of its own in gpu-share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/node/standin/nvml/nvml.c"
);

/// The stand-in library, built on first use (with `$CC`, else `cc`); the same path for every
/// test of a source, written under a temporary name and renamed, so parallel test binaries
/// never load half a file.
pub fn library() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let source = std::fs::read(SOURCE).expect("the stand-in NVML's source");
        let digest = ring::digest::digest(&ring::digest::SHA256, &source);
        let tag: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-nvml-{tag}"));
        let lib = dir.join("libnvidia-ml.so.1");
        if lib.exists() {
            return lib;
        }
        std::fs::create_dir_all(&dir).expect("a directory for the stand-in NVML");
        let tmp = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .args([
                "-std=c11",
                "-D_GNU_SOURCE",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
            ])
            .args(["-fPIC", "-shared", "-fvisibility=hidden"])
            .arg("-Wl,-soname,libnvidia-ml.so.1")
            .arg("-o")
            .arg(&tmp)
            .arg(SOURCE)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("{cc} (a C compiler, for the stand-in NVML): {e}"));
        assert!(
            out.status.success(),
            "building the stand-in NVML: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &lib).expect("the stand-in NVML in place");
        lib
    })
}

/// What a reservation's NVML sees.
pub enum Gpus<'a> {
    /// These GPUs, by minor number and UUID (device node `nvidia<minor>` and the stand-in's
    /// marker each).
    Visible(&'a [(u32, &'a str)]),
    /// Every init fails with this `nvmlReturn_t` code (15: the GPU fell off the bus).
    Failing(u32),
    /// No driver: the device directory has no `nvidiactl`.
    NoDriver,
}

/// Points `cmd` (a `gpu-share reserve`) at the stand-in library with `gpus` in the device
/// directory `dev` (made here; plain files, which is all the stand-in looks for), and its
/// compute-mode log in `log` (`<log>/compute-mode.log`, one `<uuid> <MODE>` line per change).
pub fn give(cmd: &mut Command, dev: &Path, log: &Path, gpus: Gpus<'_>) {
    std::fs::create_dir_all(dev).expect("the device directory");
    std::fs::create_dir_all(log).expect("the NVML log directory");
    if !matches!(gpus, Gpus::NoDriver) {
        std::fs::write(dev.join("nvidiactl"), b"").expect("nvidiactl");
    }
    match gpus {
        Gpus::Visible(list) => {
            for (minor, uuid) in list {
                std::fs::write(dev.join(format!("nvidia{minor}")), b"").expect("a GPU node");
                cmd.env(format!("GPU_SHARE_STANDIN_GPU_{minor}"), uuid);
            }
        }
        Gpus::Failing(code) => {
            cmd.env("GPU_SHARE_STANDIN_NVML_FAIL", code.to_string());
        }
        Gpus::NoDriver => {}
    }
    cmd.arg("--nvml-library")
        .arg(library())
        .env("GPU_SHARE_STANDIN_DEV_DIR", dev)
        .env("GPU_SHARE_STANDIN_NVML_LOG", log);
}

/// The compute modes set through the stand-in, oldest first (`DEFAULT`, `EXCLUSIVE_PROCESS`,
/// `PROHIBITED`), for GPU `uuid`.
pub fn modes(log: &Path, uuid: &str) -> Vec<String> {
    std::fs::read_to_string(log.join("compute-mode.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(uuid)?.strip_prefix(' '))
        .map(str::to_string)
        .collect()
}

//! Stamps the git revision into the binary for `gpu-share --version`: GPU_SHARE_GIT_REVISION when
//! set (the Dockerfile passes its GIT_REVISION build argument, as .dockerignore keeps .git out),
//! else `git rev-parse` of the checkout, else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPU_SHARE_GIT_REVISION");
    let from_env = std::env::var("GPU_SHARE_GIT_REVISION")
        .ok()
        .filter(|r| !r.is_empty());
    let revision = from_env.clone().or_else(|| {
        // Rebuild when HEAD moves: the file HEAD names (a branch ref) and the packed refs.
        for path in ["HEAD", "packed-refs"] {
            if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                println!("cargo:rerun-if-changed={p}");
            }
        }
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"])
            && let Some(p) = git(&["rev-parse", "--git-path", &reference])
        {
            println!("cargo:rerun-if-changed={p}");
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    println!(
        "cargo:rustc-env=GPU_SHARE_REVISION={}",
        revision.unwrap_or_else(|| "unknown".to_string())
    );
}

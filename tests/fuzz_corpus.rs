//! Replays every file of every fuzz corpus (fuzz/corpus/<target>/, kept in the repository)
//! through the entry points the fuzz targets call, so that what fuzzing found stays fixed. A
//! missing corpus directory fails: the corpora are part of the repository.

use std::path::Path;

fn replay(target: &str, run: impl Fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&data)));
        assert!(result.is_ok(), "{target}: {} breaks a promise", f.display());
    }
    eprintln!("{target}: {} corpus files replayed", files.len());
}

#[test]
fn annotation() {
    replay("annotation", gpu_share::fuzzing::annotation);
}

#[test]
fn admission() {
    replay("admission", gpu_share::fuzzing::admission);
}

#[test]
fn extender_verbs() {
    for verb in ["filter", "prioritize", "bind", "preempt"] {
        replay(verb, |d| gpu_share::fuzzing::extender(verb, d));
    }
}

#[test]
fn policy() {
    replay("policy", gpu_share::fuzzing::policy);
}

#[test]
fn simulator_inputs() {
    replay("openb", gpu_share::fuzzing::openb);
    replay("kube_inputs", gpu_share::fuzzing::kube_inputs);
}

#[test]
fn binds() {
    replay("binds", gpu_share::fuzzing::binds);
}

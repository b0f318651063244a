//! The source stays in files a reader can hold, and its modules import one way:
//! - no file of any crate (the service's src/, the pure core's crates/core/src/, the node
//!   agent's crates/agent/src/, the simulator's crates/simulator/src/) has more than 700 lines
//!   before its `#[cfg(test)] mod tests` (tests beside the code do not count);
//! - `admission`, `extender` and `cluster` never import `server` (it wires them together);
//! - no module imports one that imports it back, directly or around a longer loop, between a
//!   crate's top-level modules and between its files (ARCHITECTURE.md);
//! - the core does no I/O: Cargo keeps the Kubernetes client, the async runtime and HTTP out of
//!   its dependencies, and this checks that its manifest still leaves them out and that its code
//!   opens no file or socket; the service's own pure modules import only each other and the
//!   core, and the node agent's CDI specs are pure too;
//! - the simulator depends on the core alone (Cargo then keeps it from calling the extender),
//!   and this checks that its manifest still does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The service's sources.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The pure core's sources (crates/core).
fn core_src() -> PathBuf {
    crate_src("core")
}

/// The sources of the workspace's crate in `crates/<name>`.
fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates")
        .join(name)
        .join("src")
}

/// The names of the dependencies a crate's manifest (`crates/<name>/Cargo.toml`) declares.
fn dependencies_of(name: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(crate_src(name).join("../Cargo.toml")).unwrap();
    manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap_or_default()
        .split("\n[")
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim().to_string()))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect()
}

/// The code of a file before its `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        // A test module, private or shared with the crate's other tests.
        if l.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.starts_with("mod ") || n.starts_with("pub(crate) mod "))
        {
            break;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// A file's module path under its crate's `root`: `src/extender/state.rs` is
/// `extender::state`, `src/extender/mod.rs` is `extender`, `src/lib.rs` the crate root (empty).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        f => parts.push(f.trim_end_matches(".rs").to_string()),
    }
    parts
}

#[test]
fn no_source_file_is_over_700_lines_before_its_tests() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for name in ["core", "agent", "simulator"] {
        rust_files(&crate_src(name), &mut files);
    }
    assert!(
        files.len() > 100,
        "found only {} files under src/ and crates/",
        files.len()
    );
    let mut long = Vec::new();
    for f in files {
        let code = code_of(&std::fs::read_to_string(&f).unwrap())
            .lines()
            .count();
        if code > MAX_LINES {
            long.push(format!("{} ({code} lines)", f.display()));
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines before #[cfg(test)]: {long:?}; split along the file's seams"
    );
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn skip_ws(s: &[u8], i: &mut usize) {
    while *i < s.len() && s[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

/// The paths a `use` tree or a path expression starting at `i` names: `a::{b, c::d}` is
/// `a::b` and `a::c::d`.
fn paths_at(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    skip_ws(s, i);
    if *i < s.len() && s[*i] == b'{' {
        *i += 1;
        let mut out = Vec::new();
        loop {
            skip_ws(s, i);
            if *i >= s.len() {
                return out;
            }
            if s[*i] == b'}' {
                *i += 1;
                return out;
            }
            out.extend(paths_at(s, i));
            // Past `as name` or anything else, to the next item.
            let mut depth = 0;
            while *i < s.len() {
                match s[*i] {
                    b'{' => depth += 1,
                    b'}' if depth == 0 => break,
                    b'}' => depth -= 1,
                    b',' if depth == 0 => {
                        *i += 1;
                        break;
                    }
                    _ => {}
                }
                *i += 1;
            }
        }
    }
    let start = *i;
    while *i < s.len() && is_ident(s[*i]) {
        *i += 1;
    }
    if start == *i {
        return vec![Vec::new()];
    }
    let ident = String::from_utf8_lossy(&s[start..*i]).into_owned();
    if s[*i..].starts_with(b"::") {
        *i += 2;
        paths_at(s, i)
            .into_iter()
            .map(|mut p| {
                p.insert(0, ident.clone());
                p
            })
            .collect()
    } else {
        vec![vec![ident]]
    }
}

/// Drops `//` comments (doc links are not imports).
fn without_comments(code: &str) -> String {
    code.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The core's file modules, at the paths the service names them by: its lib.rs re-exports each
/// at its own name, and `reservation` as `reservation::model`.
fn core_modules() -> BTreeSet<Vec<String>> {
    let mut files = Vec::new();
    rust_files(&core_src(), &mut files);
    files
        .iter()
        .map(|f| module_of(&core_src(), f))
        .filter(|m| !m.is_empty())
        .map(|mut m| {
            if m[0] == "reservation" {
                m.insert(1, "model".into());
            }
            m
        })
        .collect()
}

/// The service's file modules and the modules each one's code names: the core's, at the paths
/// the service names them by, are targets without edges of their own (the core's graph is
/// [`core_graph`]).
fn import_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    graph_of(&src(), &core_modules())
}

/// The core's file modules and the modules each one's code names.
fn core_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    graph_of(&core_src(), &BTreeSet::new())
}

/// Every file module of the crate at `root` and the modules its code names (`crate::`,
/// `super::`, `self::` and child paths), resolved to the longest module path that is a file
/// there or in `elsewhere` (modules another crate gives it at those paths).
fn graph_of(
    root: &Path,
    elsewhere: &BTreeSet<Vec<String>>,
) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let known: BTreeSet<Vec<String>> = modules.keys().chain(elsewhere).cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let children: BTreeSet<String> = known
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let code = without_comments(&code_of(&std::fs::read_to_string(file).unwrap()));
        let s = code.as_bytes();
        let mut targets = BTreeSet::new();
        let mut i = 0;
        while i < s.len() {
            let boundary = i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == b':');
            if !boundary || !is_ident(s[i]) {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < s.len() && is_ident(s[j]) {
                j += 1;
            }
            let first = &code[i..j];
            let rooted = matches!(first, "crate" | "super" | "self") || children.contains(first);
            if !rooted || !s[j..].starts_with(b"::") {
                i = j;
                continue;
            }
            let mut k = i;
            for path in paths_at(s, &mut k) {
                let mut at: Vec<String> = Vec::new();
                let mut rest = path.as_slice();
                match rest.first().map(String::as_str) {
                    Some("crate") => rest = &rest[1..],
                    Some("self") => {
                        at = module.clone();
                        rest = &rest[1..];
                    }
                    Some("super") => {
                        at = module.clone();
                        while rest.first().is_some_and(|p| p == "super") {
                            at.pop();
                            rest = &rest[1..];
                        }
                    }
                    _ => at = module.clone(),
                }
                at.extend(rest.iter().filter(|p| *p != "self").cloned());
                let target = (0..=at.len())
                    .rev()
                    .map(|n| at[..n].to_vec())
                    .find(|m| known.contains(m))
                    .unwrap_or_default();
                if !target.is_empty() && &target != module {
                    targets.insert(target);
                }
            }
            i = k.max(j);
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

/// A loop in a directed graph, as the path around it, if there is one.
fn find_loop<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        done: &mut BTreeSet<N>,
        path: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut cycle = path[at..].to_vec();
            cycle.push(n.clone());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_import_graph_reader_sees_what_the_code_names() {
    let graph = import_graph();
    let of = |m: &str| -> BTreeSet<String> {
        let key: Vec<String> = m.split("::").map(String::from).collect();
        graph[&key].iter().map(|t| t.join("::")).collect()
    };
    // `use crate::{a, b::c}`, `super::`, and a parent naming its child all count.
    let server = of("server");
    for m in [
        "admission",
        "extender",
        "cluster",
        "shared",
        "server::policy",
    ] {
        assert!(server.contains(m), "server imports {m}: {server:?}");
    }
    assert!(of("extender::bind").contains("extender::handlers"));
    assert!(of("extender").contains("extender::state"));
    let mut looped = BTreeMap::new();
    looped.insert("a", BTreeSet::from(["b"]));
    looped.insert("b", BTreeSet::from(["c"]));
    looped.insert("c", BTreeSet::from(["a"]));
    assert_eq!(find_loop(&looped), Some(vec!["a", "b", "c", "a"]));
    looped.insert("c", BTreeSet::new());
    assert_eq!(find_loop(&looped), None);
}

#[test]
fn admission_extender_and_cluster_never_import_server() {
    let mut files = Vec::new();
    for dir in ["admission", "extender", "cluster"] {
        rust_files(&src().join(dir), &mut files);
    }
    assert!(files.len() >= 10, "{files:?}");
    let mut found = Vec::new();
    for f in files {
        // Tests included: they build the sub-state they need, not the server's.
        let text = without_comments(&std::fs::read_to_string(&f).unwrap());
        let s = text.as_bytes();
        for (i, _) in text.match_indices("crate::") {
            let mut k = i;
            if paths_at(s, &mut k)
                .iter()
                .any(|p| p.get(1).is_some_and(|m| m == "server"))
            {
                found.push(f.display().to_string());
            }
        }
    }
    assert!(
        found.is_empty(),
        "these import crate::server, which imports them: {found:?}"
    );
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for (name, files, least) in [
        ("service", import_graph(), 30),
        ("core", core_graph(), 30),
        ("agent", graph_of(&crate_src("agent"), &BTreeSet::new()), 4),
        (
            "simulator",
            graph_of(&crate_src("simulator"), &BTreeSet::new()),
            10,
        ),
    ] {
        assert!(files.len() >= least, "{name}: {} files", files.len());
        if let Some(cycle) = find_loop(&files) {
            let shown: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!(
                "{name}: files import each other around: {}",
                shown.join(" -> ")
            );
        }
        let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, targets) in &files {
            let Some(a) = m.first() else { continue };
            let entry = top.entry(a.clone()).or_default();
            for t in targets {
                if t[0] != *a {
                    entry.insert(t[0].clone());
                }
            }
        }
        if let Some(cycle) = find_loop(&top) {
            panic!(
                "{name}: modules import each other around: {}",
                cycle.join(" -> ")
            );
        }
    }
}

/// The service's own modules that decide: pure functions over plain data (ARCHITECTURE.md),
/// beside the core's (crates/core), which are all pure.
const PURE: [&str; 13] = [
    "admission::plan",
    "admission::steps",
    "admission::patch",
    "admission::affinity",
    "admission::template",
    "admission::devices",
    "admission::limits",
    "admission::guard",
    "reservation::plan",
    "reservation::view",
    "quota::advertise",
    "quota::usage",
    "extender::defrag_controller::gather",
];

/// What a pure module never names: the Kubernetes client, the async runtime, HTTP, files and
/// sockets.
const IO: [&str; 6] = [
    "kube::", "axum::", "tokio::", "hyper::", "std::fs", "std::net",
];

/// The code (before its tests, without comments) of the file of `module` under `root`.
fn module_code(root: &Path, module: &[String]) -> String {
    // `a/mod.rs`, or `a.rs` (whose children may live in `a/`); the root is `lib.rs`.
    let mut p = root.join(module.join("/"));
    if module.is_empty() {
        p = root.join("lib.rs");
    } else if p.join("mod.rs").is_file() {
        p = p.join("mod.rs");
    } else {
        p.set_extension("rs");
    }
    without_comments(&code_of(&std::fs::read_to_string(&p).unwrap()))
}

#[test]
fn the_pure_modules_import_only_each_other_and_no_io() {
    let core = core_modules();
    let graph = import_graph();
    let pure = |m: &[String]| {
        let name = m.join("::");
        core.contains(m)
            || PURE
                .iter()
                .any(|p| name == *p || name.starts_with(&format!("{p}::")))
    };
    let mut seen = 0;
    let mut broken = Vec::new();
    for (module, targets) in &graph {
        if !pure(module) {
            continue;
        }
        seen += 1;
        for t in targets {
            if !pure(t) {
                broken.push(format!("{} imports {}", module.join("::"), t.join("::")));
            }
        }
        let code = module_code(&src(), module);
        for io in IO.iter().filter(|io| code.contains(*io)) {
            broken.push(format!("{} uses {io}", module.join("::")));
        }
    }
    assert!(
        seen >= 11,
        "only {seen} of the service's pure modules found"
    );
    // The node agent's CDI specs: made of NVIDIA's spec and the GPU's UUID, written by its shell.
    let cdi = without_comments(&code_of(
        &std::fs::read_to_string(crate_src("agent").join("cdi.rs")).unwrap(),
    ));
    assert!(cdi.contains("fn mps_spec"), "the agent's cdi.rs, read");
    for io in IO.iter().filter(|io| cdi.contains(*io)) {
        broken.push(format!("agent cdi uses {io}"));
    }
    // The core: every file, and what its manifest lets it depend on.
    for module in core_graph().keys() {
        let code = module_code(&core_src(), module);
        for io in IO.iter().filter(|io| code.contains(*io)) {
            broken.push(format!("core {} uses {io}", module.join("::")));
        }
    }
    let deps = dependencies_of("core");
    assert!(
        deps.iter().any(|d| d == "serde"),
        "the core's dependencies, read: {deps:?}"
    );
    for io in [
        "kube",
        "kube-runtime",
        "tokio",
        "axum",
        "hyper",
        "hyper-util",
        "tower",
        "reqwest",
    ] {
        if deps.iter().any(|d| d == io) {
            broken.push(format!("the core (crates/core/Cargo.toml) depends on {io}"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The simulator places pods with the core's packing and depends on nothing of the service:
/// its manifest names the core and no Kubernetes client, async runtime or HTTP, so Cargo keeps
/// it from calling the extender; its replay names the packing.
#[test]
fn the_simulator_shares_the_packing_and_never_calls_the_extender() {
    let deps = dependencies_of("simulator");
    assert!(
        deps.iter().any(|d| d == "gpu-share-core"),
        "the simulator's dependencies, read: {deps:?}"
    );
    let mut broken: Vec<String> = deps
        .iter()
        .filter(|d| {
            [
                "gpu-share",
                "gpu-share-agent",
                "kube",
                "tokio",
                "axum",
                "hyper",
            ]
            .contains(&d.as_str())
        })
        .map(|d| format!("crates/simulator/Cargo.toml depends on {d}"))
        .collect();
    let graph = graph_of(&crate_src("simulator"), &BTreeSet::new());
    let replay = module_code(&crate_src("simulator"), &["replay".to_string()]);
    if !replay.contains("packing::") {
        broken.push("the simulator's replay names no packing".into());
    }
    assert!(graph.len() >= 10, "{} simulator files", graph.len());
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The `Result<..>` types a text names whose error is a bare `String`.
fn string_errors(text: &str) -> Vec<String> {
    let s = text.as_bytes();
    let mut found = Vec::new();
    for (at, _) in text.match_indices("Result<") {
        if at > 0 && is_ident(s[at - 1]) {
            continue;
        }
        let start = at + "Result<".len();
        let (mut depth, mut i, mut last) = (1, start, start);
        while i < s.len() && depth > 0 {
            match s[i] {
                b'<' | b'(' | b'[' => depth += 1,
                b'>' if i > 0 && s[i - 1] == b'-' => {}
                b'>' | b')' | b']' => depth -= 1,
                b',' if depth == 1 => last = i + 1,
                _ => {}
            }
            i += 1;
        }
        if last > start && text[last..i - 1].trim() == "String" {
            found.push(text[at..i].to_string());
        }
    }
    found
}

#[test]
fn no_result_has_a_bare_string_for_its_error() {
    assert_eq!(
        string_errors("fn a() -> Result<Vec<(u8, u8)>, String> {} fn b() -> io::Result<String>"),
        vec!["Result<Vec<(u8, u8)>, String>"]
    );
    assert!(string_errors("Result<BTreeMap<String, String>, Error>").is_empty());
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(&core_src(), &mut files);
    let mut found = Vec::new();
    for f in files {
        let text = without_comments(&std::fs::read_to_string(&f).unwrap());
        for r in string_errors(&text) {
            found.push(format!("{}: {r}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "errors are typed (thiserror, with their causes as #[source]): {found:#?}"
    );
}

//! The source stays in files a reader can hold, and its modules import one way:
//! - no file in src/ has more than 700 lines before its `#[cfg(test)] mod tests` (tests beside
//!   the code do not count);
//! - `admission`, `extender` and `cluster` never import `server` (it wires them together);
//! - no module imports one that imports it back, directly or around a longer loop, between the
//!   crate's top-level modules and between its files (ARCHITECTURE.md).

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

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The code of a file before its `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|n| n.starts_with("mod ")) {
            break;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// A file's module path: `src/extender/state.rs` is `extender::state`, `src/extender/mod.rs`
/// is `extender`, `src/lib.rs` the crate root (empty).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
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
    assert!(
        files.len() > 30,
        "found only {} files under src/",
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

/// Every file module and the modules its code names (`crate::`, `super::`, `self::` and child
/// paths), resolved to the longest module path that is a file.
fn import_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let children: BTreeSet<String> = modules
            .keys()
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
                    .find(|m| modules.contains_key(m))
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
    let files = import_graph();
    assert!(files.len() > 30);
    if let Some(cycle) = find_loop(&files) {
        let shown: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
        panic!("files import each other around: {}", shown.join(" -> "));
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
        panic!("modules import each other around: {}", cycle.join(" -> "));
    }
}

/// The modules that decide: pure functions over plain data (ARCHITECTURE.md).
const PURE: [&str; 26] = [
    "cache",
    "request",
    "skew",
    "workloads",
    "mig",
    "nvidia",
    "policy",
    "inventory",
    "packing",
    "admission::plan",
    "admission::steps",
    "admission::patch",
    "admission::affinity",
    "admission::template",
    "admission::devices",
    "admission::limits",
    "reservation::model",
    "reservation::plan",
    "reservation::cdi",
    "reservation::view",
    "enforcement",
    "quota::advertise",
    "quota::usage",
    "dra",
    "ledger",
    "documents",
];

#[test]
fn the_pure_modules_import_only_each_other_and_no_io() {
    let graph = import_graph();
    let pure = |m: &[String]| {
        let name = m.join("::");
        PURE.iter()
            .any(|p| name == *p || name.starts_with(&format!("{p}::")))
            || name == "admission::guard"
    };
    let mut seen = 0;
    let mut broken = Vec::new();
    for (module, targets) in &graph {
        if !pure(module) {
            continue;
        }
        seen += 1;
        for t in targets {
            // `sync`: the poison-tolerant lock of the warned-once set in `inventory`.
            if !pure(t) && t.join("::") != "sync" {
                broken.push(format!("{} imports {}", module.join("::"), t.join("::")));
            }
        }
        let file = {
            // `a/mod.rs`, or `a.rs` (whose children may live in `a/`).
            let mut p = src().join(module.join("/"));
            if p.join("mod.rs").is_file() {
                p = p.join("mod.rs");
            } else {
                p.set_extension("rs");
            }
            p
        };
        let code = without_comments(&code_of(&std::fs::read_to_string(&file).unwrap()));
        for io in [
            "kube::", "axum::", "tokio::", "hyper::", "std::fs", "std::net",
        ] {
            if code.contains(io) {
                broken.push(format!("{} uses {io}", module.join("::")));
            }
        }
    }
    assert!(seen >= 14, "only {seen} pure modules found");
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn the_simulator_shares_the_packing_and_never_calls_the_extender() {
    let graph = import_graph();
    let mut broken = Vec::new();
    for (module, targets) in &graph {
        if module.first().is_none_or(|m| m != "simulate") {
            continue;
        }
        for t in targets {
            if ["extender", "server", "cluster", "admission"].contains(&t[0].as_str()) {
                broken.push(format!("{} imports {}", module.join("::"), t.join("::")));
            }
        }
    }
    let simulate: BTreeSet<String> = graph
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|m| m == "simulate"))
        .flat_map(|(_, t)| t.iter().map(|t| t[0].clone()))
        .collect();
    assert!(simulate.contains("packing"), "{simulate:?}");
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

//! The source stays in files a reader can hold: no file in src/ has more than 700 lines before
//! its `#[cfg(test)]` module (tests beside the code do not count).

const MAX_LINES: usize = 700;

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_700_lines_before_its_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 30,
        "found only {} files under src/",
        files.len()
    );
    let mut long = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text
            .lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
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

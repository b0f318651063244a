//! The performance table in docs/performance.md ("Over the wire") is the one `benches/run.sh`
//! last wrote (benches/results/wire.md), line for line: the machine, the table and the ledger's
//! figures. The README's "Performance" section sums it up and points there.

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text of the `## <title>` section of `doc`, up to the next `## ` heading.
fn section<'a>(doc: &'a str, path: &str, title: &str) -> &'a str {
    doc.split(&format!("\n## {title}\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_else(|| panic!("{path} has no \"{title}\" section"))
}

#[test]
fn docs_performance_shows_the_table_benches_run_sh_wrote() {
    let doc = read("docs/performance.md");
    let wire = read("benches/results/wire.md");
    let lines: Vec<&str> = wire.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().filter(|l| l.starts_with('|')).count() >= 10,
        "benches/results/wire.md holds no table"
    );
    assert!(lines[0].starts_with("Machine: "), "{}", lines[0]);
    let over_the_wire = section(&doc, "docs/performance.md", "Over the wire");
    for l in lines {
        assert!(
            over_the_wire.lines().any(|r| r == l),
            "docs/performance.md's \"Over the wire\" section lacks this line of \
             benches/results/wire.md:\n{l}"
        );
    }
}

#[test]
fn the_readme_sums_up_performance_and_points_to_the_table() {
    let readme = read("README.md");
    let performance = section(&readme, "README.md", "Performance");
    assert!(
        performance.contains("docs/performance.md") && performance.contains("benches/run.sh"),
        "README's Performance section should name benches/run.sh and point to docs/performance.md"
    );
}

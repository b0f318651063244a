//! The README's performance table is the one `benches/run.sh` last wrote
//! (benches/results/wire.md), line for line: the machine, the table and the ledger's figures.

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_readme_shows_the_table_benches_run_sh_wrote() {
    let readme = read("README.md");
    let wire = read("benches/results/wire.md");
    let lines: Vec<&str> = wire.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().filter(|l| l.starts_with('|')).count() >= 10,
        "benches/results/wire.md holds no table"
    );
    assert!(lines[0].starts_with("Machine: "), "{}", lines[0]);
    let section = readme
        .split("\n## Performance\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has a Performance section");
    for l in lines {
        assert!(
            section.lines().any(|r| r == l),
            "README's Performance section lacks this line of benches/results/wire.md:\n{l}"
        );
    }
}

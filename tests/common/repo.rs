//! Checks against what the repository ships beside the code: the README's command
//! blocks, and Prometheus's own linter for `/metrics`.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};

/// The `sh` block under README heading `heading`.
pub fn readme_block(heading: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let section = readme
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .expect(heading);
    let block = section.split("```sh\n").nth(1).expect("an sh block");
    block.split("```").next().unwrap().to_string()
}

/// `promtool check metrics` (the Prometheus project's own linter: exposition syntax,
/// HELP and TYPE, `_total` on counters, base units) finds nothing in `metrics`.
/// tools/test.sh installs it (package prometheus) where it is missing.
pub fn promtool_check(metrics: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (package prometheus; tools/test.sh installs it)");
    let mut input = promtool.stdin.take().unwrap();
    input.write_all(metrics.as_bytes()).unwrap();
    drop(input);
    let out = promtool.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}\n{metrics}"
    );
}

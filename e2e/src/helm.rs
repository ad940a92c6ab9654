//! The chart and the command-line tools around it, for tests: the Helm CLI that
//! `scripts/build-e2e.sh` built (pointed at the test environment), rendering, and
//! running commands with their output checked.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::{env, repo_root};

pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/herald")
}

/// A tool `scripts/build-e2e.sh` built into `HERALD_BIN_DIR`; panics when it is missing.
pub fn built_tool(name: &str) -> PathBuf {
    let bin_dir = std::env::var_os("HERALD_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/herald/bin")
        });
    let tool = bin_dir.join(name);
    assert!(
        tool.exists(),
        "{} is missing: run scripts/build-e2e.sh first",
        tool.display()
    );
    tool
}

/// The Helm CLI `scripts/build-e2e.sh` built, pointed at the test environment.
pub fn helm() -> Command {
    let mut cmd = Command::new(built_tool("helm"));
    cmd.env("KUBECONFIG", env().kubeconfig());
    cmd
}

/// helm-docs as `scripts/build-e2e.sh` built it; needs no test environment.
pub fn helm_docs() -> Command {
    Command::new(built_tool("helm-docs"))
}

/// Runs `cmd`, feeding it `stdin`, and returns what it did.
pub fn output(mut cmd: Command, stdin: Option<&str>) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("writing stdin");
    }
    child.wait_with_output().expect("waiting for the command")
}

/// Runs `cmd` and returns its stdout; panics with its stderr when it fails.
pub fn ok(cmd: Command, stdin: Option<&str>) -> String {
    let described = format!("{cmd:?}");
    let out = output(cmd, stdin);
    assert!(
        out.status.success(),
        "{described} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// `helm template` of the chart as release `release` in `namespace` with `--set` values.
pub fn template(release: &str, namespace: &str, set: &[&str]) -> String {
    let mut cmd = helm();
    cmd.args(["template", release])
        .arg(chart_dir())
        .args(["--namespace", namespace]);
    for value in set {
        cmd.args(["--set", value]);
    }
    ok(cmd, None)
}

/// Every non-empty document of a multi-document YAML stream.
pub fn documents(yaml: &str) -> Vec<Value> {
    let mut docs = vec![String::new()];
    for line in yaml.lines() {
        if line == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.iter()
        .map(|doc| serde_norway::from_str::<Value>(doc).expect("rendered YAML parses"))
        .filter(|doc| !doc.is_null())
        .collect()
}

pub fn kinds(docs: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    kinds
}

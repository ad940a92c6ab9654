//! Taking a node down: its processes, its containers, the mounts and cgroups it made,
//! and what a test killed before it could clean up left behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Where a failed test's node logs (containerd, kubelet, scheduler, controllers) are kept.
pub fn kept_logs() -> PathBuf {
    std::env::temp_dir().join(format!("herald-node-logs-{}", std::process::id()))
}

/// Tears down what a node whose test process is gone left behind (a test killed before
/// it could clean up): every `herald-node-<pid>` in the temp dir whose process is gone;
/// removes the logs such a test kept.
pub fn clean_up_stale_nodes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("herald-node-") else {
            continue;
        };
        let (logs, pid) = match rest.strip_prefix("logs-") {
            Some(pid) => (true, pid),
            None => (false, rest),
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if logs {
            // A failed run's logs, kept until the next run.
            let _ = std::fs::remove_dir_all(entry.path());
        } else {
            eprintln!("node: tearing down {name}, left by a test that is gone");
            teardown(&entry.path());
        }
    }
}

/// Stops every process of the node in `dir` and removes what it left on the machine:
/// the processes started from `dir` (containerd, its shims, the kubelet, scheduler and
/// controllers), every process in the kubelet's cgroups (the containers), the mounts
/// under `dir`, the cgroups, the paths the kubelet does not let one choose, and `dir`.
pub(super) fn teardown(dir: &Path) {
    let needle = dir.display().to_string();
    for _ in 0..3 {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if pid != std::process::id() && String::from_utf8_lossy(&cmdline).contains(&needle) {
                pids.push(pid);
            }
        }
        pids.extend(cgroup_processes());
        if pids.is_empty() {
            break;
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(500));
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&needle))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in under {
        let _ = Command::new("umount").args(["-l", mount]).status();
    }
    for cgroup in kubelet_cgroups() {
        remove_cgroup(&cgroup);
    }
    for path in ["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"] {
        let _ = std::fs::remove_dir_all(path);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The kubelet's cgroup trees in every hierarchy.
fn kubelet_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let tree = hierarchy.path().join("kubepods");
        if tree.is_dir() {
            found.push(tree);
        }
    }
    found
}

/// Every process in the kubelet's cgroups.
fn cgroup_processes() -> Vec<u32> {
    fn walk(dir: &Path, pids: &mut Vec<u32>) {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&entry.path(), pids);
            }
        }
    }
    let mut pids = Vec::new();
    for tree in kubelet_cgroups() {
        walk(&tree, &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Removes an (empty) cgroup and its children, deepest first.
fn remove_cgroup(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

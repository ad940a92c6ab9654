//! CPU time of processes and their children, from `/proc`.

use super::*;

/// CPU time (user + system) of a process so far, from /proc (USER_HZ = 100).
pub(crate) fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; the fields after it start with `state`.
    let fields: Vec<f64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(|f| f.parse().unwrap_or(0.0)))
        .into_iter()
        .flatten()
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0);
    Duration::from_secs_f64(ticks / 100.0)
}

/// The processes whose parent is `parent` (the cluster's nats-server nodes under testenv).
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1));
            ppid.and_then(|p| p.parse::<u32>().ok()) == Some(parent)
        })
        .collect()
}

pub(crate) fn total_cpu(pids: &[u32]) -> Duration {
    pids.iter().map(|p| cpu_of(*p)).sum()
}

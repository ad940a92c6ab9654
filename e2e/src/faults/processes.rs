//! Dispatcher and operator processes of a scenario, to SIGKILL, stop and restart.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Processes of one program started by a scenario, by id (`--replica-id` of a
/// dispatcher, `--identity` of an operator). Each one's stdout and stderr go to one log
/// file in the temp dir, appended across restarts. Dropping the set SIGKILLs whatever
/// still runs. [`Dispatchers`] and [`Operators`] are this with their program's flags.
pub struct Processes {
    bin: PathBuf,
    args: Vec<String>,
    label: String,
    /// The flag that gives a process its id.
    id_flag: &'static str,
    /// The signal of a graceful stop.
    stop_signal: &'static str,
    running: BTreeMap<String, Child>,
    logs: BTreeMap<String, PathBuf>,
    /// Environment variables of every process started from now on.
    envs: Vec<(String, String)>,
}

impl Processes {
    /// Sets an environment variable (e.g. `RUST_LOG`) for every process started from now.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.envs.push((name.to_owned(), value.to_owned()));
    }

    /// The log file of process `id`.
    pub fn log(&self, id: &str) -> PathBuf {
        std::env::temp_dir().join(format!("herald-fault-{}-{id}.log", self.label))
    }

    /// Starts process `id` (again).
    pub fn start(&mut self, id: &str) {
        assert!(!self.running.contains_key(id), "replica {id} already runs");
        let path = self.log(id);
        let fresh = !self.logs.contains_key(id);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(!fresh)
            .truncate(fresh)
            .open(&path)
            .expect("opening a process log");
        let _ = writeln!(
            file,
            "==== fault suite: starting replica {id} at {}",
            jiff::Timestamp::now()
        );
        let child = Command::new(&self.bin)
            .args(&self.args)
            .args([self.id_flag, id])
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log handle"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.logs.insert(id.to_owned(), path);
        self.running.insert(id.to_owned(), child);
    }

    /// SIGKILLs process `id` (a crash: nothing is flushed, no lease is released) and
    /// reaps it.
    pub fn kill(&mut self, id: &str) {
        let mut child = self
            .running
            .remove(id)
            .unwrap_or_else(|| panic!("replica {id} is not running"));
        let _ = child.kill();
        let _ = child.wait();
        self.note(id, "SIGKILLed");
    }

    /// The graceful stop signal (SIGINT for a dispatcher, SIGTERM for an operator) to
    /// process `id`, then waits (at most 30 s, then SIGKILL) for it to exit. Returns how
    /// long it took.
    pub async fn stop(&mut self, id: &str) -> Duration {
        let Some(mut child) = self.running.remove(id) else {
            return Duration::ZERO;
        };
        let started = Instant::now();
        let _ = Command::new("kill")
            .args([&format!("-{}", self.stop_signal), &child.id().to_string()])
            .status();
        let deadline = started + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.note(id, "did not stop within 30 s of the stop signal; SIGKILLed");
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.note(id, &format!("stopped (SIG{})", self.stop_signal));
        started.elapsed()
    }

    /// Stops every running process gracefully.
    pub async fn stop_all(&mut self) {
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in ids {
            self.stop(&id).await;
        }
    }

    /// The process id of process `id`, while it runs.
    pub fn pid(&self, id: &str) -> Option<u32> {
        self.running.get(id).map(Child::id)
    }

    /// CPU time (user and system) process `id` has used so far, while it runs.
    pub fn cpu_time(&self, id: &str) -> Option<Duration> {
        cpu_time(self.pid(id)?)
    }

    /// The processes running now.
    pub fn running(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Processes that exited on their own (a crash the test did not cause), with status.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        self.running
            .iter_mut()
            .filter_map(|(id, child)| match child.try_wait() {
                Ok(Some(status)) => Some((id.clone(), status.to_string())),
                _ => None,
            })
            .collect()
    }

    /// Log lines of every process that contain one of `needles` (at most `max` per
    /// process), for the evidence of a failure.
    pub fn grep(&self, needles: &[&str], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (id, path) in &self.logs {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            out.extend(
                text.lines()
                    .filter(|l| needles.iter().any(|n| l.contains(n)))
                    .take(max)
                    .map(|l| format!("[{id}] {l}")),
            );
        }
        out
    }

    /// Every log file so far.
    pub fn log_files(&self) -> Vec<PathBuf> {
        self.logs.values().cloned().collect()
    }

    fn note(&self, id: &str, what: &str) {
        if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(self.log(id)) {
            let _ = writeln!(
                file,
                "==== fault suite: replica {id} {what} at {}",
                jiff::Timestamp::now()
            );
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.running.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// CPU time (user and system) process `pid` has used so far, from `/proc/<pid>/stat`
/// (Linux; clock ticks taken as the usual 100 per second).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of the whole line are 12 and 13 after ")".
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// The most memory process `pid` has held (its peak resident set, `VmHWM`), KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    try_peak_rss_kib(pid).expect("VmHWM in the process's /proc status")
}

/// [`peak_rss_kib`], or `None` once the process has exited (a zombie has no `VmHWM`).
pub fn try_peak_rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Dispatcher processes (`herald-test-dispatcher`) of one scenario, by replica id (see
/// [`Processes`]; a graceful stop is SIGINT).
pub struct Dispatchers(Processes);

impl Dispatchers {
    /// Replicas of `bin` (pass `env!("CARGO_BIN_EXE_herald-test-dispatcher")`) against
    /// `nats_url` (a comma-separated list in a cluster), with the test flags: 4 shards,
    /// loopback allowed, health every second, a 5 s grace period. `label` names the logs.
    pub fn new(bin: impl Into<PathBuf>, nats_url: &str, label: &str) -> Self {
        let args = [
            "--nats-url",
            nats_url,
            "--shards",
            &crate::dataplane::TEST_SHARDS.to_string(),
            "--allow-network",
            "127.0.0.0/8",
            "--allow-http",
            "--listen",
            "127.0.0.1:0",
            "--health-interval",
            "1s",
            "--grace",
            "5s",
        ]
        .map(str::to_owned)
        .to_vec();
        Self(Processes {
            bin: bin.into(),
            args,
            label: label.to_owned(),
            id_flag: "--replica-id",
            stop_signal: "INT",
            running: BTreeMap::new(),
            logs: BTreeMap::new(),
            envs: Vec::new(),
        })
    }

    /// Adds flags (e.g. `--jetstream-replicas 3`) for every replica started from now on.
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.0.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

impl std::ops::Deref for Dispatchers {
    type Target = Processes;

    fn deref(&self) -> &Processes {
        &self.0
    }
}

impl std::ops::DerefMut for Dispatchers {
    fn deref_mut(&mut self) -> &mut Processes {
        &mut self.0
    }
}

/// Operator processes (`herald-test-operator`) of one scenario, by identity (see
/// [`Processes`]; a graceful stop is SIGTERM, which releases the Lease).
pub struct Operators(Processes);

impl Operators {
    /// Replicas of `bin` (pass `env!("CARGO_BIN_EXE_herald-test-operator")`) against
    /// `env`, reconciling only `namespace` and electing their leader with a Lease there,
    /// with the test flags: 4 shards (as the test dispatchers), loopback and `http`
    /// allowed, status at most every second, a 5 s Lease renewed every second. `label`
    /// names the logs.
    pub fn new(
        bin: impl Into<PathBuf>,
        env: &crate::TestEnv,
        namespace: &str,
        label: &str,
    ) -> Self {
        let kubeconfig = env.kubeconfig().display().to_string();
        let args = [
            "--nats-url",
            env.nats_url(),
            "--shards",
            &crate::dataplane::TEST_SHARDS.to_string(),
            "--namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--kubeconfig",
            &kubeconfig,
            "--listen",
            "127.0.0.1:0",
            "--allow-network",
            "127.0.0.0/8",
            "--allow-http",
            "--status-interval",
            "1s",
            // The fault suite follows lastDelivery, a gauge (refreshed every 5 min by
            // default).
            "--status-refresh",
            "1s",
            "--lease-duration",
            "5s",
            "--lease-renew",
            "1s",
        ]
        .map(str::to_owned)
        .to_vec();
        Self(Processes {
            bin: bin.into(),
            args,
            label: label.to_owned(),
            id_flag: "--identity",
            stop_signal: "TERM",
            running: BTreeMap::new(),
            logs: BTreeMap::new(),
            envs: Vec::new(),
        })
    }

    /// Adds flags for every replica started from now on (a later flag wins).
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.0.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

impl std::ops::Deref for Operators {
    type Target = Processes;

    fn deref(&self) -> &Processes {
        &self.0
    }
}

impl std::ops::DerefMut for Operators {
    fn deref_mut(&mut self) -> &mut Processes {
        &mut self.0
    }
}

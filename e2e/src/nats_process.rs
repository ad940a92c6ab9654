//! A nats-server of another release than the test environment's, as a process of its
//! own: the oldest release Herald supports (`nats-server-oldest`) and one older than
//! that (`nats-server-old`), both built by `scripts/build-e2e.sh`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use crate::helm::built_tool;

/// A nats-server process on a free loopback port, killed (and its store removed) on drop.
pub struct NatsProcess {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

impl NatsProcess {
    /// Starts `binary` (a tool `scripts/build-e2e.sh` built), with JetStream on file
    /// storage when `jetstream`, and waits until it listens.
    pub fn start(binary: &str, jetstream: bool) -> Self {
        let bin = built_tool(binary);
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("herald-{binary}-{port}"));
        let mut command = Command::new(&bin);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        if jetstream {
            command.args(["-js", "-sd"]).arg(&dir);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{binary} did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            dir,
        }
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

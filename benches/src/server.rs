//! `--spawn-server CONFIG`: starts a local `shoal` for the run (the binary beside this one, the
//! given config, a fresh data directory, ephemeral native and metrics ports), waits for its
//! readiness line, and stops it (SIGTERM, then SIGKILL after a bound) and removes its directory
//! afterwards.
//!
//! It owns that one child process; it never talks the protocol.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long the spawned server may take to become ready or to stop.
const DEADLINE: Duration = Duration::from_secs(120);

/// A server started for the run; stopped when dropped.
#[derive(Debug)]
pub struct SpawnedServer {
    child: Option<Child>,
    dir: PathBuf,
    /// Its native address.
    pub address: String,
    /// Its metrics endpoint's address (`None`: the config turned it off).
    pub metrics: Option<String>,
}

/// The `shoal` binary beside the running executable.
fn shoal_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating shoal-bench: {e}"))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Test binaries run from `target/<profile>/deps`.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let shoal = dir.join("shoal");
    if shoal.exists() {
        Ok(shoal)
    } else {
        Err(format!("no shoal binary at {} (build the workspace first)", shoal.display()))
    }
}

impl SpawnedServer {
    /// Starts `shoal --config CONFIG` on a new data directory under the system temp directory.
    pub fn start(config: &Path) -> Result<SpawnedServer, String> {
        let binary = shoal_binary()?;
        let unique = format!(
            "shoal-bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let dir = std::env::temp_dir().join(unique);
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting shoal: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut server =
            SpawnedServer { child: Some(child), dir, address: String::new(), metrics: None };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).map_err(|_| "shoal did not become ready")?;
        let ready: serde_json::Value = serde_json::from_str(line.trim())
            .map_err(|_| format!("shoal printed {line:?}, not a readiness line"))?;
        server.address = ready["native"].as_str().ok_or("no native address")?.to_string();
        server.metrics = ready["metrics"].as_str().map(str::to_string);
        Ok(server)
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill takes a pid and a signal number; no memory is involved.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let (tx, rx) = mpsc::channel();
            let pid = child.id();
            std::thread::spawn(move || {
                let _ = tx.send(child.wait());
            });
            if rx.recv_timeout(DEADLINE).is_err() {
                // SAFETY: as above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

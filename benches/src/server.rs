//! `--spawn-server CONFIG`: starts a local `shoal` for the run (the binary beside this one, the
//! given config, a fresh data directory, ephemeral native and metrics ports), waits for its
//! readiness line, and stops it (SIGTERM, then SIGKILL after a bound) and removes its directory
//! afterwards. Starting, waiting and stopping are `shoal_testkit::ShoalProcess`'s, the same as
//! the end-to-end tests'.
//!
//! It owns that one child process; it never talks the protocol.

use std::path::Path;
use std::time::Duration;

use shoal_testkit::ShoalProcess;

/// How long the spawned server may take to become ready or to stop.
const DEADLINE: Duration = Duration::from_secs(120);

/// A server started for the run; stopped when dropped.
#[derive(Debug)]
pub struct SpawnedServer {
    process: ShoalProcess,
    /// Its native address.
    pub address: String,
    /// Its metrics endpoint's address (`None`: the config turned it off).
    pub metrics: Option<String>,
}

impl SpawnedServer {
    /// Starts `shoal --config CONFIG` on a new data directory under the system temp directory.
    pub fn start(config: &Path) -> Result<SpawnedServer, String> {
        let exe = std::env::current_exe().map_err(|e| format!("locating shoal-bench: {e}"))?;
        let binary = shoal_testkit::shoal_binary_beside(&exe)?;
        let unique = format!(
            "shoal-bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let dir = std::env::temp_dir().join(unique);
        let mut command = ShoalProcess::command(&binary, &dir);
        command.arg("--config").arg(config);
        let process = ShoalProcess::start_owning(command, DEADLINE, dir)
            .map_err(|error| error.to_string())?;
        let address = process.native().to_string();
        let metrics = process.metrics().map(str::to_string);
        Ok(SpawnedServer { process, address, metrics })
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        // Past the deadline it is killed; either way the process's own drop removes the
        // directory.
        let _ = self.process.terminate();
    }
}

//! [`ShoalProcess`]: one `shoal` server started from its caller's command line, ready once its
//! readiness line came (bounded by a deadline), with the addresses it announced; signalled
//! (SIGTERM, SIGSTOP, SIGCONT), killed with SIGKILL, and restarted on the same data directory.
//!
//! It owns the child process and, if asked, its data directory, and never leaves either behind:
//! dropping it kills the server (SIGKILL) and reaps it, then removes an owned directory. It never
//! picks ports or directories itself (the command line does, so servers run side by side), never
//! signals a pid it has reaped, and never sleeps in place of a wait.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::ready::{Ready, first_line_within, parse_ready};
use crate::wait::exits_within;

/// A running `shoal` (or one that was killed or exited, until [`ShoalProcess::restart`]).
#[derive(Debug)]
pub struct ShoalProcess {
    /// How it is started; [`ShoalProcess::restart`] runs it again.
    command: Command,
    /// Bounds every wait: for the readiness line and for an exit.
    deadline: Duration,
    /// `None` once it was killed, or exited and was reaped.
    child: Option<Child>,
    /// What the latest successful start announced.
    ready: Ready,
    /// Removed, after the kill, when dropped.
    owned_data_dir: Option<PathBuf>,
}

/// Why a start or a stop did not go as asked.
#[derive(Debug)]
pub enum ProcessError {
    /// The command could not be spawned.
    Spawn(io::Error),
    /// No readiness line within the deadline (the server was killed).
    NotReady(Duration),
    /// The first line on stdout was not a readiness line (`""`: it exited first; it was killed).
    NotReadinessLine(String),
    /// It did not exit within the deadline (it was then killed).
    NotExited(Duration),
    /// Reaping it failed.
    Wait(io::Error),
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessError::Spawn(error) => write!(f, "starting shoal: {error}"),
            ProcessError::NotReady(deadline) => {
                write!(f, "shoal did not become ready within {deadline:?}")
            }
            ProcessError::NotReadinessLine(line) => {
                write!(f, "shoal printed {line:?}, not a readiness line")
            }
            ProcessError::NotExited(deadline) => {
                write!(f, "shoal did not exit within {deadline:?}, so it was killed")
            }
            ProcessError::Wait(error) => write!(f, "waiting for shoal: {error}"),
        }
    }
}

impl std::error::Error for ProcessError {}

impl ShoalProcess {
    /// `BINARY --data-dir DATA_DIR --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0
    /// --kafka-listen 127.0.0.1:0`, stdin
    /// and stderr on /dev/null: a server on ephemeral ports. Callers add the rest (`--config
    /// FILE`, `--shards N`, `SHOAL_*` variables, a log file for stderr); flags win over the
    /// config file wherever they stand, and a later flag over an earlier one.
    pub fn command(binary: &Path, data_dir: &Path) -> Command {
        let mut command = Command::new(binary);
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .args(["--kafka-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// Spawns `command` and waits up to `deadline` for its readiness line. stdout is taken for
    /// that line; stdin and stderr are as `command` sets them (inherited by default). A server
    /// that does not get ready is killed before this returns.
    pub fn start(command: Command, deadline: Duration) -> Result<ShoalProcess, ProcessError> {
        ShoalProcess::start_with(command, deadline, None)
    }

    /// [`ShoalProcess::start`] for a server whose data directory (`--data-dir` in `command`) it
    /// owns: removed when it is dropped, after the kill, or when the start fails.
    pub fn start_owning(
        command: Command,
        deadline: Duration,
        data_dir: PathBuf,
    ) -> Result<ShoalProcess, ProcessError> {
        ShoalProcess::start_with(command, deadline, Some(data_dir))
    }

    /// The native protocol address of the latest start.
    pub fn native(&self) -> &str {
        &self.ready.native
    }

    /// The metrics endpoint's address of the latest start (`None`: the endpoint is off).
    pub fn metrics(&self) -> Option<&str> {
        self.ready.metrics.as_deref()
    }

    /// The Kafka listener's address from the readiness line, if the listener is on.
    pub fn kafka(&self) -> Option<&str> {
        self.ready.kafka.as_deref()
    }

    /// Each shard's own listener of the latest start, by shard (empty: `[network]
    /// shard_listen` is off).
    pub fn shards(&self) -> &[String] {
        &self.ready.shards
    }

    /// The process id (`None`: killed, or exited and reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is still running (a stopped process is). One that exited is reaped here.
    pub fn is_running(&mut self) -> bool {
        let running = matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)));
        if !running {
            self.kill_9();
        }
        running
    }

    /// Sends `signal`. Panics if it was killed or reaped, or if the signal cannot be sent.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = self.pid().expect("the server runs");
        // SAFETY: kill takes a pid and a signal number; no memory is involved. The pid is our
        // unreaped child's, so it names no other process.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}): {}", io::Error::last_os_error());
    }

    /// SIGSTOP: it is frozen (its sockets stay open, nothing is answered) until
    /// [`ShoalProcess::cont`].
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT: a stopped server carries on.
    pub fn cont(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL (`kill -9`, as a crash would) and reap. Nothing happens if it is not running.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to the deadline for it to exit (after a signal that stops it) and reaps it; past
    /// the deadline it is killed. Panics if it was already killed or reaped.
    pub fn wait_exit(&mut self) -> Result<ExitStatus, ProcessError> {
        let pid = self.pid().expect("the server runs");
        if !exits_within(pid, self.deadline) {
            self.kill_9();
            return Err(ProcessError::NotExited(self.deadline));
        }
        let mut child = self.child.take().expect("the server runs");
        child.wait().map_err(ProcessError::Wait)
    }

    /// SIGTERM (a graceful shutdown), then [`ShoalProcess::wait_exit`].
    pub fn terminate(&mut self) -> Result<ExitStatus, ProcessError> {
        self.signal(libc::SIGTERM);
        self.wait_exit()
    }

    /// Starts it again from the same command line (so on the same data directory, on new
    /// ephemeral ports) and waits for the readiness line again. One still running is killed
    /// first (`kill -9`).
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill_9();
        self.launch()
    }

    fn start_with(
        mut command: Command,
        deadline: Duration,
        owned_data_dir: Option<PathBuf>,
    ) -> Result<ShoalProcess, ProcessError> {
        command.stdout(Stdio::piped());
        let unannounced =
            Ready { native: String::new(), metrics: None, kafka: None, shards: Vec::new() };
        // Exists before the spawn, so a failed start still removes an owned directory.
        let mut process =
            ShoalProcess { command, deadline, child: None, ready: unannounced, owned_data_dir };
        process.launch()?;
        Ok(process)
    }

    /// Spawns the command and waits for its readiness line; kills it if none comes.
    fn launch(&mut self) -> Result<(), ProcessError> {
        let mut child = self.command.spawn().map_err(ProcessError::Spawn)?;
        let stdout = child.stdout.take().expect("stdout is piped");
        // Held before the wait, so a server that never gets ready is killed too.
        self.child = Some(child);
        let ready = match first_line_within(stdout, self.deadline) {
            None => Err(ProcessError::NotReady(self.deadline)),
            Some(line) => parse_ready(&line).ok_or(ProcessError::NotReadinessLine(line)),
        };
        match ready {
            Ok(ready) => {
                self.ready = ready;
                Ok(())
            }
            Err(error) => {
                self.kill_9();
                Err(error)
            }
        }
    }
}

impl Drop for ShoalProcess {
    fn drop(&mut self) {
        self.kill_9();
        if let Some(dir) = &self.owned_data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The `shoal` binary of the build that made `exe` (a binary in `target/<profile>/`, or a test
/// executable in `target/<profile>/deps/`), or why it is missing.
pub fn shoal_binary_beside(exe: &Path) -> Result<PathBuf, String> {
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let shoal = dir.join("shoal");
    if shoal.exists() {
        Ok(shoal)
    } else {
        Err(format!(
            "no shoal binary at {} (build the workspace first: `cargo test --workspace` builds it)",
            shoal.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    //! `sh` stands in for `shoal`: the process handling does not depend on what the server does.

    use super::*;

    const READY: &str = r#"echo '{"ready":true,"native":"127.0.0.1:1","shards":["127.0.0.1:2"]}'"#;

    /// Long enough for any start on a loaded machine.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// Past this, a start or a stop that must not happen has not happened.
    const SHORT: Duration = Duration::from_millis(300);

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]).stdin(Stdio::null()).stderr(Stdio::null());
        command
    }

    /// Waits (bounded) for the child `pid` to report `state` (`WSTOPPED` or `WCONTINUED`).
    fn reports(pid: u32, state: libc::c_int) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: siginfo_t is plain old data, for which all zeros is a valid value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes only into the struct we own; WNOWAIT reaps nothing.
            let rc = unsafe {
                libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, state | libc::WNOWAIT)
            };
            let _ = tx.send(rc);
        });
        rx.recv_timeout(DEADLINE) == Ok(0)
    }

    #[test]
    fn a_ready_process_stops_continues_is_killed_and_restarts() {
        let mut process =
            ShoalProcess::start(sh(&format!("{READY}; exec sleep 60")), DEADLINE).expect("ready");
        assert_eq!(process.native(), "127.0.0.1:1");
        assert_eq!(process.metrics(), None);
        assert_eq!(process.shards(), ["127.0.0.1:2".to_string()]);
        let pid = process.pid().expect("running");
        process.stop();
        assert!(reports(pid, libc::WSTOPPED), "stopped");
        assert!(process.is_running(), "a stopped process still runs");
        process.cont();
        assert!(reports(pid, libc::WCONTINUED), "continued");
        process.kill_9();
        assert_eq!(process.pid(), None, "killed and reaped");
        assert!(!process.is_running());
        process.restart().expect("ready again");
        assert!(process.is_running());
        let status = process.terminate().expect("exits on SIGTERM");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM));
        assert_eq!(process.pid(), None, "reaped");
    }

    #[test]
    fn a_start_without_a_readiness_line_fails_and_removes_its_owned_directory() {
        let dir = std::env::temp_dir().join(format!("shoal-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let silent = ShoalProcess::start_owning(sh("exec sleep 60"), SHORT, dir.clone());
        assert!(matches!(silent, Err(ProcessError::NotReady(_))), "{silent:?}");
        assert!(!dir.exists(), "the owned directory is removed");
        let chatty = ShoalProcess::start(sh("echo hello; exec sleep 60"), DEADLINE);
        assert!(matches!(&chatty, Err(ProcessError::NotReadinessLine(l)) if l == "hello\n"));
        let exited = ShoalProcess::start(sh("exit 3"), DEADLINE);
        assert!(matches!(&exited, Err(ProcessError::NotReadinessLine(l)) if l.is_empty()));
    }

    #[test]
    fn a_process_that_ignores_sigterm_is_killed_past_the_deadline() {
        let script = format!("trap '' TERM; {READY}; exec sleep 60");
        let mut process = ShoalProcess::start(sh(&script), DEADLINE).expect("ready");
        process.deadline = SHORT;
        assert!(matches!(process.terminate(), Err(ProcessError::NotExited(_))));
        assert_eq!(process.pid(), None, "killed and reaped");
    }
}

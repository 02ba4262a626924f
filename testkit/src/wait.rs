//! Bounded waits for child processes: for a child's exit and output, and for a child's exit
//! without reaping it.
//!
//! Nothing here sleeps in place of synchronisation: each wait blocks in a helper thread and the
//! caller waits on a channel with a timeout. It never reaps a child it did not take ownership of.

use std::process::{Child, Output};
use std::sync::mpsc;
use std::time::Duration;

/// Waits for `child` to exit and collects its output; kills it and panics, naming `what`, if it
/// has not exited within `deadline`.
pub fn output_within(child: Child, deadline: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.expect("output"),
        Err(_) => {
            // SAFETY: kill takes a pid and a signal number; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{what} did not exit within {deadline:?}");
        }
    }
}

/// Whether the child `pid` exits within `deadline`. It is left unreaped (`WNOWAIT`): its
/// `Child` still owns it, so the caller reaps it with `Child::wait` (at once, when this returned
/// `true`) and may still kill it by that `Child` when this returned `false`.
pub(crate) fn exits_within(pid: u32, deadline: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        loop {
            // SAFETY: siginfo_t is plain old data, for which all zeros is a valid value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes only into the struct we own; WNOWAIT leaves the child
            // unreaped, so its pid stays ours.
            let rc = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            // Any error but an interruption means there is nothing left to wait for.
            if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                break;
            }
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(deadline).is_ok()
}

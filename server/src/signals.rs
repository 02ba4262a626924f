//! Two-stage shutdown on SIGINT/SIGTERM: the first asks every shard to stop gracefully, a second
//! exits at once. The signals are blocked in every thread and taken synchronously with `sigwait`
//! on the main thread, so no handler runs in an arbitrary context.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The blocked signal set.
pub struct Signals {
    set: libc::sigset_t,
}

/// Blocks SIGINT and SIGTERM in this thread (and every thread it starts later).
pub fn block() -> Result<Signals, String> {
    // SAFETY: the sigset is initialised by sigemptyset before use, and pthread_sigmask only reads
    // it; all pointers are to locals that outlive the calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let result = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if result != 0 {
            return Err(std::io::Error::from_raw_os_error(result).to_string());
        }
        Ok(Signals { set })
    }
}

/// Watches for signals on a thread of its own from now on, through start-up and serving alike:
/// the first sets `signalled`, then `stop` (every shard stops gracefully, a start under way
/// gives up), a second exits the process at once.
pub fn watch(signals: Signals, stop: Arc<AtomicBool>, signalled: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let signal = wait(&signals);
        tracing::info!(signal, "shutting down (signal again to exit at once)");
        signalled.store(true, Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        let signal = wait(&signals);
        tracing::warn!(signal, "second signal: exiting now");
        std::process::exit(130);
    });
}

fn wait(signals: &Signals) -> i32 {
    let mut signal = 0;
    // SAFETY: `signals.set` was initialised in `block`; `signal` is a valid out pointer.
    unsafe { libc::sigwait(&signals.set, &mut signal) };
    signal
}

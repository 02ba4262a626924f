//! The data-directory lock: an exclusive `flock` on `DIR/LOCK`, held for the life of the process,
//! so a second server can never serve the same directory (the kernel drops it when the process
//! dies, however it dies).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

/// The held lock; released when dropped or when the process exits.
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, String> {
        let path = dir.join("LOCK");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: `file` owns a valid descriptor for the duration of the call; flock takes no
        // pointers.
        let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock {
                return Err(format!("cannot lock {}: {error}", path.display()));
            }
            return Err(format!(
                "data directory {} is locked by another shoal process; stop it or choose \
                 another --data-dir",
                dir.display()
            ));
        }
        Ok(DataDirLock { _file: file })
    }
}

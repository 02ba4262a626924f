//! One sync for a whole file system (`syncfs(2)`), and where it is known to be one: the blocking
//! calls behind [`super::Storage::sync_filesystem`] of the real-file backends.
//!
//! It owns only the two system calls and the file-system check; it never decides when to sync
//! (the shard does, `crate::direct`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Whether `syncfs(2)` on the file system holding `path` is known to make every completed write
/// durable, O_DIRECT ones included. On ext4 it commits the journal (the size and extent changes
/// of the writes) and then flushes the device's write cache, also when there was nothing to
/// commit (`ext4_sync_fs`'s explicit barrier). Other file systems are not assumed to flush the
/// device cache when they have no metadata to commit, so the engine keeps to one sync per file
/// there (docs/storage-format.md, "Assumptions").
pub fn filesystem_sync_supported(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` only writes into the zeroed struct we own; the path is NUL-terminated
    // and outlives the call.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    // ext2, ext3 and ext4 share the magic number; ext4's driver mounts all three.
    rc == 0 && stat.f_type == libc::EXT4_SUPER_MAGIC
}

/// `syncfs(2)` on the file system holding the directory or file `path`: blocks until every
/// write that completed before the call, on every file of that file system, is durable.
///
/// # Errors
/// Opening `path` failed, or the file system reported a write-back error.
pub fn sync_filesystem_blocking(path: &Path) -> io::Result<()> {
    let anchor = File::open(path)?;
    // SAFETY: plain syscall on a file descriptor we own for the call's duration.
    let rc = unsafe { libc::syncfs(anchor.as_raw_fd()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// A copy of `error` (io errors are not `Clone`): one file-system sync's outcome answers every
/// write it covered.
pub fn copy_io_error(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ext4_is_known_to_flush_on_one_sync() {
        assert!(!filesystem_sync_supported(Path::new("/proc")), "procfs");
        assert!(!filesystem_sync_supported(Path::new("/no/such/dir")));
        let dir = std::env::temp_dir();
        // SAFETY: a zeroed `statfs` is a valid value of the plain C struct.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: as in `filesystem_sync_supported`.
        assert_eq!(unsafe { libc::statfs(c_path.as_ptr(), &mut stat) }, 0);
        assert_eq!(filesystem_sync_supported(&dir), stat.f_type == libc::EXT4_SUPER_MAGIC);
        sync_filesystem_blocking(&dir).expect("syncfs of the temporary directory's file system");
        assert!(sync_filesystem_blocking(Path::new("/no/such/dir")).is_err());
    }
}

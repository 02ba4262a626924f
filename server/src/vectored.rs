//! A reply written from several buffers with one `writev` per try, none of them copied: the
//! iovecs over [`Bytes`] parts that monoio's `writev` takes, advanced correctly past a partial
//! write.
//!
//! monoio 0.2.4's own `write_vectored_all` cannot be used for this: after a partial write it
//! shortens the iovec that was cut but does not move its base (the advanced pointer is
//! discarded), and it keeps reporting the iovecs already written, so a reply larger than the
//! socket buffer would go out garbled. This module owns no socket and never copies a part.

use std::io;

use bytes::Bytes;
use monoio::buf::IoVecBuf;
use monoio::io::AsyncWriteRent;

/// The parts of one reply and the iovecs pointing into them, from the first byte not yet
/// written on.
pub struct Parts {
    /// Held so the memory the iovecs point at lives while the runtime owns them.
    parts: Vec<Bytes>,
    iovecs: Vec<libc::iovec>,
    /// The first iovec with bytes left to write.
    first: usize,
}

// SAFETY: the iovecs point into `parts`' buffers, which `Bytes` keeps at a fixed address for as
// long as `parts` holds them (moving a `Bytes` does not move its bytes); `first` never passes
// the end, so the pointer and the count describe valid iovecs.
unsafe impl IoVecBuf for Parts {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs[self.first..].as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iovecs.len() - self.first
    }
}

impl Parts {
    /// The reply made of `parts`, in order (empty parts are skipped).
    pub fn new(parts: Vec<Bytes>) -> Parts {
        let iovecs = parts
            .iter()
            .filter(|part| !part.is_empty())
            .map(|part| libc::iovec {
                iov_base: part.as_ptr() as *mut libc::c_void,
                iov_len: part.len(),
            })
            .collect();
        Parts { parts, iovecs, first: 0 }
    }

    /// Bytes left to write.
    pub fn remaining_bytes(&self) -> usize {
        self.iovecs[self.first..].iter().map(|iovec| iovec.iov_len).sum()
    }

    /// Records that the next `written` bytes went out.
    ///
    /// # Panics
    /// If more was written than remained (the kernel never reports that).
    fn advance(&mut self, mut written: usize) {
        while written > 0 {
            let iovec = &mut self.iovecs[self.first];
            if written < iovec.iov_len {
                // SAFETY: `written < iov_len`, so the new base stays inside the same part.
                iovec.iov_base = unsafe { iovec.iov_base.cast::<u8>().add(written) }.cast();
                iovec.iov_len -= written;
                return;
            }
            written -= iovec.iov_len;
            self.first += 1;
        }
    }

    /// Writes every part to `writer`, as many `writev`s as the socket needs; returns the bytes
    /// written and the parts (their memory can then be let go).
    pub async fn write_all<W: AsyncWriteRent>(
        mut self,
        writer: &mut W,
    ) -> (io::Result<usize>, Vec<Bytes>) {
        let total = self.remaining_bytes();
        while self.first < self.iovecs.len() {
            let (result, back) = writer.writev(self).await;
            self = back;
            match result {
                Ok(0) => {
                    let error = io::Error::new(io::ErrorKind::WriteZero, "the peer took nothing");
                    return (Err(error), self.parts);
                }
                Ok(written) => self.advance(written),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return (Err(error), self.parts),
            }
        }
        (Ok(total), self.parts)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    fn pending(parts: &Parts) -> Vec<u8> {
        let mut bytes = Vec::new();
        for iovec in &parts.iovecs[parts.first..] {
            // SAFETY: the iovecs describe live memory of `parts` (see the `IoVecBuf` impl).
            let slice =
                unsafe { std::slice::from_raw_parts(iovec.iov_base as *const u8, iovec.iov_len) };
            bytes.extend_from_slice(slice);
        }
        bytes
    }

    /// A socket that takes at most `per_call` bytes per `writev`, as a full send buffer does.
    struct Trickle {
        per_call: usize,
        received: Vec<u8>,
        calls: usize,
    }

    impl AsyncWriteRent for Trickle {
        async fn write<T: monoio::buf::IoBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            (Ok(0), buf)
        }

        async fn writev<T: IoVecBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            self.calls += 1;
            let mut left = self.per_call;
            for index in 0..buf.read_iovec_len() {
                // SAFETY: `IoVecBuf` promises this many valid iovecs at the pointer.
                let iovec = unsafe { &*buf.read_iovec_ptr().add(index) };
                let take = iovec.iov_len.min(left);
                // SAFETY: a valid iovec describes `iov_len` readable bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(iovec.iov_base as *const u8, take) };
                self.received.extend_from_slice(bytes);
                left -= take;
                if left == 0 {
                    break;
                }
            }
            (Ok(self.per_call - left), buf)
        }

        async fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }

        async fn shutdown(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_reply_larger_than_each_write_arrives_whole_and_in_order() {
        let parts: Vec<Bytes> =
            (0..20u8).map(|n| Bytes::from(vec![n; usize::from(n) * 3])).collect();
        let expected: Vec<u8> = parts.iter().flat_map(|part| part.iter().copied()).collect();
        let mut socket = Trickle { per_call: 7, received: Vec::new(), calls: 0 };
        let result = {
            let mut write = std::pin::pin!(Parts::new(parts).write_all(&mut socket));
            let mut context = std::task::Context::from_waker(std::task::Waker::noop());
            let std::task::Poll::Ready((result, _)) = write.as_mut().poll(&mut context) else {
                panic!("the trickle socket never waits");
            };
            result
        };
        assert_eq!(result.unwrap(), expected.len());
        assert_eq!(socket.received, expected);
        assert_eq!(socket.calls, expected.len().div_ceil(7));
    }

    #[test]
    fn partial_writes_resume_at_the_first_byte_not_written() {
        let parts =
            vec![Bytes::from_static(b"head"), Bytes::new(), Bytes::from_static(b"body-bytes")];
        let mut parts = Parts::new(parts);
        assert_eq!(parts.remaining_bytes(), 14);
        parts.advance(2);
        assert_eq!(pending(&parts), b"adbody-bytes");
        parts.advance(2);
        assert_eq!(pending(&parts), b"body-bytes", "a part written whole is passed");
        parts.advance(5);
        assert_eq!(pending(&parts), b"bytes");
        assert_eq!(parts.read_iovec_len(), 1);
        parts.advance(5);
        assert_eq!(parts.remaining_bytes(), 0);
        assert_eq!(parts.read_iovec_len(), 0);
    }
}

//! The monoio TCP transport: one socket carrying one [`Connection`].
//!
//! It owns the socket and the two buffers that cross it by value (monoio's owned-buffer I/O):
//! the read buffer, refilled in place, and a spare write buffer swapped with the connection's
//! outgoing bytes, so steady-state traffic allocates nothing. It moves bytes only: the protocol
//! state is the connection's, and timeouts, reconnects and retries are the client's. It is the
//! only module of the library that performs I/O; a transport whose I/O failed must be dropped,
//! never reused, because an interrupted owned-buffer operation leaves the stream in an unknown
//! state.

use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::connection::{Connection, ConnectionConfig, Reply};
use crate::error::{ClientError, Result};

/// Bytes asked of the kernel per read.
pub(crate) const READ_CHUNK_BYTES: usize = 64 << 10;

/// Reads the next bytes of `reader` into `read_buf` (refilled in place, so steady-state reads
/// allocate nothing); returns how many, 0 meaning the stream ended.
pub(crate) async fn read_chunk<R: AsyncReadRent>(
    reader: &mut R,
    read_buf: &mut Vec<u8>,
) -> Result<usize> {
    let mut buffer = std::mem::take(read_buf);
    // The read fills from the start of the buffer's capacity; an empty capacity would make it
    // return 0, which means end of stream.
    buffer.clear();
    buffer.reserve(READ_CHUNK_BYTES);
    let (result, buffer) = reader.read(buffer).await;
    *read_buf = buffer;
    result.map_err(ClientError::io)
}

/// Writes all of `outgoing` to `writer` and keeps its buffer in `spare` for the next request's
/// bytes, so steady-state writes allocate nothing.
pub(crate) async fn write_keeping<W: AsyncWriteRent>(
    writer: &mut W,
    outgoing: Vec<u8>,
    spare: &mut Vec<u8>,
) -> Result<()> {
    let (result, buffer) = writer.write_all(outgoing).await;
    *spare = buffer;
    result.map(|_| ()).map_err(ClientError::io)
}

/// One open TCP connection to a server.
#[derive(Debug)]
pub(crate) struct Transport {
    stream: TcpStream,
    pub(crate) connection: Connection,
    read_buf: Vec<u8>,
    spare: Vec<u8>,
}

impl Transport {
    /// Opens a TCP connection to `address` (`HOST:PORT`); nothing is sent yet.
    pub(crate) async fn connect(address: &str, config: ConnectionConfig) -> Result<Transport> {
        let stream = TcpStream::connect(address).await.map_err(|error| {
            ClientError::io(std::io::Error::new(
                error.kind(),
                format!("connect to {address}: {error}"),
            ))
        })?;
        // Requests are whole frames written at once; Nagle would only add latency.
        stream.set_nodelay(true)?;
        Ok(Transport {
            stream,
            connection: Connection::new(config),
            read_buf: Vec::with_capacity(READ_CHUNK_BYTES),
            spare: Vec::new(),
        })
    }

    /// Gives up the socket and the connection state, for [`crate::split`].
    pub(crate) fn into_parts(self) -> (TcpStream, Connection) {
        (self.stream, self.connection)
    }

    /// Writes every byte the connection has queued.
    pub(crate) async fn write_pending(&mut self) -> Result<()> {
        if !self.connection.wants_write() {
            return Ok(());
        }
        let outgoing = self.connection.take_outgoing(std::mem::take(&mut self.spare));
        write_keeping(&mut self.stream, outgoing, &mut self.spare).await
    }

    /// Reads until the connection yields the next reply, or fails.
    pub(crate) async fn read_reply(&mut self) -> Result<Reply> {
        loop {
            if let Some(reply) = self.connection.poll_reply()? {
                return Ok(reply);
            }
            let read = read_chunk(&mut self.stream, &mut self.read_buf).await?;
            if read == 0 {
                return Err(self.connection.on_closed());
            }
            self.connection.on_bytes(&self.read_buf[..read]);
        }
    }

    /// Writes what is queued, then reads the next reply.
    pub(crate) async fn round_trip(&mut self) -> Result<Reply> {
        self.write_pending().await?;
        self.read_reply().await
    }
}

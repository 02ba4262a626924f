//! `shoal-bench loopback`: the TCP round trip a benchmark's latency should be judged against — a
//! request of the same size as the benchmark's batches, answered by a small reply (as a produce
//! is by its acknowledgement), over loopback between two pinned threads, one request at a time.
//!
//! It owns both ends of one connection and nothing else; it never talks to a server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use serde_json::{Value, json};

use crate::actor::pin;
use crate::stats::Latency;

/// Size of the reply to each request (a produce acknowledgement's frame is about this).
const REPLY_BYTES: usize = 272;

/// Measures `samples` round trips of `request_bytes`; returns the report object.
pub fn measure(
    request_bytes: usize,
    samples: usize,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> Result<Value, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || -> Result<(), String> {
        pin(server_cpu)?;
        let (mut stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut request = vec![0u8; request_bytes];
        let reply = vec![1u8; REPLY_BYTES];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&reply).map_err(|e| format!("reply: {e}"))?;
        }
        Ok(())
    });
    pin(client_cpu)?;
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let request = vec![7u8; request_bytes];
    let mut reply = vec![0u8; REPLY_BYTES];
    let mut latency = Latency::new();
    let warmup = samples / 10;
    let started = Instant::now();
    for sample in 0..samples + warmup {
        let sent = Instant::now();
        stream.write_all(&request).map_err(|e| format!("request: {e}"))?;
        stream.read_exact(&mut reply).map_err(|e| format!("reply: {e}"))?;
        if sample >= warmup {
            latency.record_us(sent.elapsed().as_micros() as u64);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(stream);
    server.join().map_err(|_| "the echo thread panicked".to_string())??;
    Ok(json!({
        "mode": "loopback",
        "request_bytes": request_bytes,
        "reply_bytes": REPLY_BYTES,
        "samples": samples,
        "round_trips_per_s": ((samples + warmup) as f64 / elapsed).round(),
        "latency_us": latency.summary().to_json(),
        "cpus": {"server": server_cpu, "client": client_cpu},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_measures_every_sample() {
        let report = measure(64 << 10, 200, None, None).unwrap();
        assert_eq!(report["latency_us"]["count"], 200);
        assert!(report["latency_us"]["p99"].as_u64().is_some_and(|p99| p99 > 0));
    }
}

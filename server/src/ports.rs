//! Whether another socket already listens on a port this node is about to listen on.
//!
//! The shards share the native and Kafka listeners with `SO_REUSEPORT`, which the kernel
//! grants to any process of the same user: a second server started on the same ports would join
//! the first one's listeners without a word, and the kernel would split connections between
//! them. A probe bind without `SO_REUSEPORT` cannot tell that apart from a restart on the same
//! port (the previous process's connections linger, and conflict with such a bind though no one
//! listens), so the kernel's own table of sockets is read instead: only a socket in the LISTEN
//! state counts, and only one a process holds. A server that just exited leaves its listeners
//! behind for a moment, held by nothing but its io_uring's teardown: a restart must not take
//! those for another server. A listener of another user is not seen as held (its process's
//! descriptors cannot be read), and needs not be: the kernel refuses to share a port across
//! users, so the bind fails by itself. Two servers started at the same instant can still both
//! pass the check before either binds: it catches the common mistake, not every race. It owns
//! that parsing; it never binds, connects or changes anything.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `/proc/net/tcp`'s state code for LISTEN.
const STATE_LISTEN: &str = "0A";

/// The listener of this network namespace, held by a process this one may inspect, that
/// `address` would share a port with; None when there is none. An unreadable table counts as
/// empty: the check is a courtesy to the operator, and the bind that follows still fails on a
/// port truly taken by a socket without `SO_REUSEPORT`. The processes' descriptors are read
/// only when a listener is on the port at all (a machine may run many processes).
pub fn taken(address: SocketAddr) -> Option<SocketAddr> {
    let candidates: Vec<(SocketAddr, u64)> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| parse_listening(&table))
        .filter(|&(other, _)| shares_port(address, other))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let held = held_socket_inodes();
    candidates.into_iter().find(|(_, inode)| held.contains(inode)).map(|(other, _)| other)
}

/// The inodes of every socket a process holds open, of the processes whose descriptors this
/// one may read (`/proc/PID/fd/N` links read `socket:[INODE]`).
fn held_socket_inodes() -> HashSet<u64> {
    let Ok(processes) = std::fs::read_dir("/proc") else { return HashSet::new() };
    processes
        .flatten()
        .filter(|entry| entry.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
        .filter_map(|entry| std::fs::read_dir(entry.path().join("fd")).ok())
        .flat_map(|descriptors| descriptors.flatten())
        .filter_map(|descriptor| std::fs::read_link(descriptor.path()).ok())
        .filter_map(|target| socket_inode(target.to_str()?))
        .collect()
}

/// The inode of a descriptor link `socket:[INODE]`.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Whether a listener on `other` takes `address`'s port: the same port on the same IP, or
/// either IP unspecified (a listener on `0.0.0.0` or `::` takes every address). Port 0 shares
/// nothing: the kernel picks a free port.
fn shares_port(address: SocketAddr, other: SocketAddr) -> bool {
    address.port() != 0
        && other.port() == address.port()
        && (other.ip() == address.ip()
            || other.ip().is_unspecified()
            || address.ip().is_unspecified()
            || v4_mapped(other.ip()) == Some(address.ip()))
}

fn v4_mapped(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        IpAddr::V4(_) => None,
    }
}

/// The local addresses and inodes of the LISTEN rows of one `/proc/net/tcp` or
/// `/proc/net/tcp6` table; rows that do not parse are skipped.
fn parse_listening(table: &str) -> Vec<(SocketAddr, u64)> {
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            // sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, timeout, inode
            let fields: Vec<&str> = row.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            if *state != STATE_LISTEN {
                return None;
            }
            Some((parse_address(local)?, inode.parse().ok()?))
        })
        .collect()
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word of the address
/// as the kernel holds it in memory, printed as a number, so its bytes come back little-endian.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_le_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (index, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(index * 8..index * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when \
                       retrnsmt   uid  timeout inode\n\
       0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 213 1\n\
       1: 0100007F:1B9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 7 1\n\
       2: 0100007F:92D6 0100007F:1B9E 06 00000000:00000000 03:00000112 00000000 0 0 0 3\n\
       3: garbage\n";
    const TCP6: &str = "  sl  local_address                         remote_address   st\n\
       0: 00000000000000000000000000000000:2384 00000000000000000000000000000000:0000 0A \
          00000000:00000000 00:00000000 00000000 0 0 9 1\n\
       1: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A \
          00000000:00000000 00:00000000 00000000 0 0 10 1\n\
       2: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 01 \
          00000000:00000000 00:00000000 00000000 0 0 11 1\n";

    fn addresses(table: &str) -> Vec<SocketAddr> {
        parse_listening(table).into_iter().map(|(address, _)| address).collect()
    }

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_listening_rows_are_read_in_both_families() {
        assert_eq!(addresses(TCP), [at("0.0.0.0:2024"), at("127.0.0.1:7070")]);
        assert_eq!(addresses(TCP6), [at("[::]:9092"), at("[::ffff:127.0.0.1]:8080")]);
        let inodes: Vec<u64> = parse_listening(TCP).into_iter().map(|(_, inode)| inode).collect();
        assert_eq!(inodes, [213, 7]);
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("pipe:[4242]"), None);
    }

    /// A listener this process holds is seen as held, with its address.
    #[test]
    fn this_processs_own_listener_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        assert_eq!(taken(address), Some(address));
        drop(listener);
        assert_eq!(taken(address), None);
    }

    #[test]
    fn a_port_is_taken_on_the_same_ip_or_through_an_unspecified_one() {
        let listening: Vec<SocketAddr> =
            addresses(TCP).into_iter().chain(addresses(TCP6)).collect();
        let shared_with = |address: &str| {
            listening.iter().copied().find(|&other| shares_port(at(address), other))
        };
        assert_eq!(shared_with("127.0.0.1:7070"), Some(at("127.0.0.1:7070")));
        assert_eq!(shared_with("0.0.0.0:7070"), Some(at("127.0.0.1:7070")));
        assert_eq!(shared_with("10.0.0.1:7070"), None, "another IP of the host");
        assert_eq!(shared_with("10.0.0.1:2024"), Some(at("0.0.0.0:2024")));
        assert_eq!(shared_with("127.0.0.1:9092"), Some(at("[::]:9092")));
        assert_eq!(shared_with("127.0.0.1:8080"), Some(at("[::ffff:127.0.0.1]:8080")));
        assert_eq!(shared_with("127.0.0.1:7071"), None);
        assert_eq!(shared_with("127.0.0.1:0"), None, "port 0 is the kernel's choice");
        // The connection in row 2 does not listen.
        assert_eq!(shared_with("127.0.0.1:37590"), None);
    }
}

//! Loopback ports handed to a server before it starts (a node restarted on
//! the address its clients know, etcd's client and peer URLs).
//!
//! The usual trick, bind port 0 and release it, is a race: that port comes
//! from the kernel's ephemeral range, which every outgoing connection on the
//! machine also takes its local port from, so between the release and the
//! server's bind any `connect` may take it (CI once saw "Address already in
//! use" on exactly that). [`reserve`] picks from just below the ephemeral
//! range instead, where no `connect` ever lands, and holds the same port
//! number in UDP until this process exits: a lock that the kernel releases
//! with the process, so that two drills (or two tests) running at once
//! never pick the same one. (Neither sluiced nor etcd uses UDP.)

use std::io;
use std::net::{TcpListener, UdpSocket};
use std::sync::Mutex;

/// How many ports below the ephemeral range [`reserve`] picks from.
const SPAN: u32 = 8192;

/// A loopback port that no one listens on, that no outgoing connection will
/// take, and that no other caller of `reserve` (in any process) gets while
/// this process lives.
pub fn reserve() -> io::Result<u16> {
    static HELD: Mutex<Vec<UdpSocket>> = Mutex::new(Vec::new());
    let (low, span) = range();
    // Spread processes over the range, so that they rarely even try the
    // same lock.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % span;
    for i in 0..span {
        let port = u16::try_from(low + (start + i) % span).expect("the range is below 65536");
        let Ok(lock) = UdpSocket::bind(("127.0.0.1", port)) else {
            continue;
        };
        // Someone outside the lock (another program) may use it.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
        return Ok(port);
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free loopback port in {low}..{}", low + span),
    ))
}

/// The first port and the number of ports to pick from: the `SPAN` ports
/// below the kernel's ephemeral range, or above it when there is no room
/// below.
fn range() -> (u32, u32) {
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut w = s.split_whitespace().map(|w| w.parse::<u32>().ok());
            Some((w.next()??, w.next()??))
        })
        .unwrap_or((32768, 60999));
    if lo >= 1024 + SPAN {
        (lo - SPAN, SPAN)
    } else if hi + SPAN <= 65535 {
        (hi + 1, SPAN)
    } else {
        // An ephemeral range over nearly everything: no safe place, so
        // the locks alone keep callers apart.
        (1024, SPAN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (low, span) = range();
        let ports: Vec<u16> = (0..16).map(|_| reserve().unwrap()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((low..low + span).contains(&u32::from(p)), "{p}");
            TcpListener::bind(("127.0.0.1", p)).unwrap();
            // Held: no other caller can take it.
            assert!(
                UdpSocket::bind(("127.0.0.1", p)).is_err(),
                "{p} is not held"
            );
        }
    }
}

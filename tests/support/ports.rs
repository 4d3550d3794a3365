//! Ports for test servers that listen again on the same port after a restart
//! or an outage.
//!
//! A port the kernel hands out for `127.0.0.1:0` comes from its ephemeral
//! range, and that is unsafe for such servers: while one is down, a client
//! retrying `127.0.0.1:P` can be given P as its own local port and connect to
//! itself (TCP simultaneous open), which holds P, so the server cannot listen
//! on it again (`eaddrinuse`). These ports come from below that range, where
//! no connection is given a local port.

use std::net::TcpListener;

/// A listener on 127.0.0.1 at a port below the ephemeral range.
pub fn listener() -> TcpListener {
    let (low, high) = range();
    for _ in 0..1000 {
        let port = rand::random_range(low..high);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener;
        }
    }
    panic!("no free port on 127.0.0.1 in {low}..{high}")
}

/// A port below the ephemeral range that was free a moment ago, for a server
/// started as another process.
pub fn free_port() -> u16 {
    listener()
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// The upper half of the ports below the ephemeral range (Linux's
/// `ip_local_port_range`, 32768 by default).
fn range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|low| *low > 2048)
        .unwrap_or(32768);
    (ephemeral_low / 2, ephemeral_low)
}

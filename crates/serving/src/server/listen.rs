//! Listening as `serve` does: `SO_REUSEADDR`, a backlog of 1024, both stacks on `[::]`.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// The listen backlog of both ports (tokio's own for `TcpListener::bind`).
const LISTEN_BACKLOG: u32 = 1024;

/// Listens on `addr` as `serve` does: with `SO_REUSEADDR` and a backlog of 1024, and for an IPv6
/// address on both stacks (`IPV6_V6ONLY` off), so the default `[::]` accepts IPv4 clients too.
/// Where `[::]` cannot be bound because the host has no IPv6, listens on `0.0.0.0` with the same
/// port instead and logs it ([`ipv4_fallback`]); any other address is used as it is. Call it
/// within a Tokio runtime.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    match listen_exactly(addr) {
        Err(e) => match ipv4_fallback(addr, &e) {
            Some(v4) => {
                tracing::info!(requested = %addr, listen = %v4, error = %e,
                    "IPv6 is not available on this host; listening on IPv4 only");
                listen_exactly(v4)
            }
            None => Err(e),
        },
        listening => listening,
    }
}

fn listen_exactly(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => {
            let socket = tokio::net::TcpSocket::new_v6()?;
            socket2::SockRef::from(&socket).set_only_v6(false)?;
            socket
        }
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Where to listen instead when listening on `addr` failed with `error`: `0.0.0.0` with the same
/// port when `addr` is the unspecified IPv6 address and the error says the host has no IPv6
/// (`EAFNOSUPPORT`: the kernel has no IPv6; `EADDRNOTAVAIL`, `EPROTONOSUPPORT`: IPv6 disabled);
/// `None` otherwise.
pub fn ipv4_fallback(addr: SocketAddr, error: &std::io::Error) -> Option<SocketAddr> {
    let SocketAddr::V6(v6) = addr else {
        return None;
    };
    let no_ipv6 = error.kind() == std::io::ErrorKind::AddrNotAvailable
        || matches!(
            error.raw_os_error(),
            Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
        );
    (v6.ip().is_unspecified() && no_ipv6)
        .then(|| SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, v6.port())))
}

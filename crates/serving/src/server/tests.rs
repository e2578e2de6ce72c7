use super::*;
use std::io::{Error, ErrorKind};

#[test]
fn only_the_unspecified_ipv6_address_falls_back_to_ipv4_and_only_without_ipv6() {
    let any6: SocketAddr = "[::]:8443".parse().unwrap();
    let any4: SocketAddr = "0.0.0.0:8443".parse().unwrap();
    let no_ipv6 = [
        Error::from_raw_os_error(libc::EAFNOSUPPORT),
        Error::from_raw_os_error(libc::EADDRNOTAVAIL),
        Error::from_raw_os_error(libc::EPROTONOSUPPORT),
        Error::from(ErrorKind::AddrNotAvailable),
    ];
    for e in &no_ipv6 {
        assert_eq!(ipv4_fallback(any6, e), Some(any4), "{e}");
        assert_eq!(
            ipv4_fallback("[::]:8080".parse().unwrap(), e),
            Some("0.0.0.0:8080".parse().unwrap()),
            "{e}: the same port"
        );
        // Any other address is used as it is.
        for explicit in [
            "[::1]:8443",
            "[fd00::1]:8443",
            "0.0.0.0:8443",
            "127.0.0.1:8443",
        ] {
            assert_eq!(
                ipv4_fallback(explicit.parse().unwrap(), e),
                None,
                "{explicit}"
            );
        }
    }
    // Other errors are not about IPv6.
    for e in [
        Error::from_raw_os_error(libc::EADDRINUSE),
        Error::from_raw_os_error(libc::EACCES),
        Error::from(ErrorKind::AddrInUse),
        Error::from(ErrorKind::PermissionDenied),
    ] {
        assert_eq!(ipv4_fallback(any6, &e), None, "{e}");
    }
}

//! The open-file limit, and connection caps that fit under it.
//!
//! Every connection is a file descriptor, and so is every connection of the Kubernetes client,
//! every file read and the runtime's own. When the process runs out, `accept` fails (EMFILE) on
//! every port at once: a flood of one port then takes the others down with it. So at start
//! `confighash serve` raises its soft `RLIMIT_NOFILE` to the hard limit (what the container
//! runtime allows; as Go programs do, kube-apiserver included), and sizes `--max-connections`
//! so that the webhook port, the admin port and [`RESERVED_FILES`] all fit under it.

/// Open files kept aside for everything but the two ports' connections: the Kubernetes client's
/// connections (its watches, and its lookups in flight), the certificate, key and CA files while
/// they are re-read, standard streams, and the runtime's epoll, event and signal descriptors.
pub const RESERVED_FILES: u64 = 256;

/// The process's open-file limit after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now: what `accept` and `open` are held to.
    pub soft: u64,
    /// The hard limit (`u64::MAX`: unlimited).
    pub hard: u64,
}

/// The soft and hard `RLIMIT_NOFILE` of this process.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub fn open_file_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a pointer to a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. An unlimited hard limit cannot be the soft
/// limit of open files on Linux: the kernel's `fs.nr_open` is used instead.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // a C call: see its SAFETY comment
pub fn raise_open_file_limit() -> std::io::Result<OpenFileLimit> {
    let (soft, hard) = open_file_limit()?;
    let target = if hard == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(soft)
    } else {
        hard
    };
    if target > soft {
        let limit = libc::rlimit {
            rlim_cur: target,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads one rlimit through a pointer to a live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let (now, hard) = open_file_limit()?;
    Ok(OpenFileLimit {
        before: soft,
        soft: now,
        hard: if hard == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            hard
        },
    })
}

/// Elsewhere the limit is left as it is.
#[cfg(not(target_os = "linux"))]
pub fn open_file_limit() -> std::io::Result<(u64, u64)> {
    Err(std::io::Error::other(
        "reading the open-file limit is implemented for Linux only",
    ))
}

/// Elsewhere the limit is left as it is.
#[cfg(not(target_os = "linux"))]
pub fn raise_open_file_limit() -> std::io::Result<OpenFileLimit> {
    Err(std::io::Error::other(
        "raising the open-file limit is implemented for Linux only",
    ))
}

/// What [`fit_max_connections`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The requested cap fits.
    Fits(usize),
    /// It did not; this one does.
    Lowered { requested: usize, to: usize },
}

impl Fit {
    /// The webhook's connection cap to use.
    pub fn max_connections(self) -> usize {
        match self {
            Fit::Fits(n) | Fit::Lowered { to: n, .. } => n,
        }
    }
}

/// Why no connection cap fits.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "the open-file limit ({limit}) leaves no room for webhook connections: the admin port takes \
     {admin}, and {reserved} are kept for the Kubernetes client and files; raise the limit \
     (the container runtime's default ulimit, or LimitNOFILE) to at least {needed}"
)]
pub struct NoRoom {
    pub limit: u64,
    pub admin: usize,
    pub reserved: u64,
    pub needed: u64,
}

/// The webhook's connection cap: `requested` if it fits under the soft open-file limit `limit`
/// together with the admin port's `admin` connections and [`RESERVED_FILES`], else the largest
/// that does; an error if not even one fits. Each port may hold one connection more than its cap
/// for a moment (one accepted while another is being closed), so that is counted too.
pub fn fit_max_connections(requested: usize, admin: usize, limit: u64) -> Result<Fit, NoRoom> {
    let taken = (admin as u64)
        .saturating_add(1)
        .saturating_add(RESERVED_FILES)
        .saturating_add(1);
    let room = limit.saturating_sub(taken);
    if room == 0 {
        return Err(NoRoom {
            limit,
            admin,
            reserved: RESERVED_FILES,
            needed: taken + 1,
        });
    }
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    Ok(if requested <= room {
        Fit::Fits(requested)
    } else {
        Fit::Lowered {
            requested,
            to: room,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_lowered_to_fit_under_the_limit() {
        // 64 admin + 1, 256 reserved, 1 for the webhook's moment over its cap.
        assert_eq!(
            fit_max_connections(1024, 64, 1_048_576),
            Ok(Fit::Fits(1024))
        );
        assert_eq!(fit_max_connections(702, 64, 1024), Ok(Fit::Fits(702)));
        assert_eq!(
            fit_max_connections(1024, 64, 1024),
            Ok(Fit::Lowered {
                requested: 1024,
                to: 702
            })
        );
        assert_eq!(
            fit_max_connections(1024, 64, 323).map(Fit::max_connections),
            Ok(1)
        );
        let err = fit_max_connections(1024, 64, 322).unwrap_err();
        assert_eq!(err.needed, 323);
        assert!(err.to_string().contains("at least 323"), "{err}");
        assert_eq!(fit_max_connections(1024, 64, 0).unwrap_err().needed, 323);
        assert_eq!(
            fit_max_connections(usize::MAX, 64, u64::MAX).map(Fit::max_connections),
            Ok(usize::try_from(u64::MAX - 322).unwrap_or(usize::MAX))
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_limit_can_be_read() {
        let (soft, hard) = open_file_limit().unwrap();
        assert!(soft > 0 && soft <= hard, "{soft} {hard}");
    }
}

//! Socket addresses between `std::net` and the C `sockaddr` the RDMA CM takes.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A `sockaddr_storage` holding an IPv4 or IPv6 address, as librdmacm reads it.
#[derive(Clone, Copy)]
pub(crate) struct RawAddr {
    storage: libc::sockaddr_storage,
}

impl RawAddr {
    /// The C form of `addr`.
    pub(crate) fn new(addr: SocketAddr) -> Self {
        // SAFETY: all-zero bytes are a valid `sockaddr_storage`.
        let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in`.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin)
                };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in6`.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6)
                };
            }
        }
        RawAddr { storage }
    }

    /// The pointer librdmacm takes (it only reads through it).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.storage as *mut libc::sockaddr_storage).cast()
    }
}

/// Reads an IPv4 or IPv6 `sockaddr`; `None` for a null pointer or another family.
///
/// # Safety
/// `sa` is null or points to a `sockaddr` whose family says how long it is.
pub(crate) unsafe fn from_raw(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable sockaddr; the family says its type.
    unsafe {
        match (*sa).sa_family as i32 {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for a in [
            "198.18.0.1:7174",
            "[::ffff:198.18.0.1]:1",
            "[fe80::1]:65535",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let mut raw = RawAddr::new(addr);
            // SAFETY: `raw` holds a valid sockaddr of its family.
            assert_eq!(unsafe { from_raw(raw.as_mut_ptr()) }, Some(addr));
        }
        // SAFETY: null is allowed.
        assert_eq!(unsafe { from_raw(std::ptr::null()) }, None);
    }
}

//! Liveness of a peer's host: TCP keepalive on a session's bootstrap connection.
//!
//! A peer whose process ends closes its socket, and the poller sees that at once.
//! A peer whose host dies (crash, power, a cut link) sends nothing at all, and RC
//! cannot tell either: rxe retransmits for ever at the usual retry count 7, and a
//! session with nothing in flight has nothing to retransmit. The bootstrap TCP
//! connection stays open for the session's life, so keepalive probes on it find
//! such a host: after `Config::peer_timeout` without an answer the kernel fails
//! the socket with `ETIMEDOUT`, which closes the session.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Probes that go unanswered before the kernel gives up.
const PROBES: u32 = 6;

/// The keepalive timing that gives up about `timeout` after the peer fell
/// silent: idle for a third of it, then [`PROBES`] probes spread over the
/// rest; every value at least one second (the kernel's unit).
pub(crate) fn timing(timeout: Duration) -> (u32, u32, u32) {
    let secs = timeout.as_secs().clamp(1, u64::from(u32::MAX)) as u32;
    let idle = (secs / 3).max(1);
    let interval = ((secs - idle.min(secs)) / PROBES).max(1);
    (idle, interval, PROBES)
}

/// Turns keepalive on for `tcp` so that a silent peer host fails the socket
/// about `timeout` later; `Duration::ZERO` leaves it off.
pub(crate) fn enable(tcp: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    if timeout.is_zero() {
        return Ok(());
    }
    let (idle, interval, count) = timing(timeout);
    let fd = tcp.as_raw_fd();
    set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval)?;
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count)
}

fn set(fd: i32, level: i32, name: i32, value: u32) -> std::io::Result<()> {
    let value = value.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: `fd` is an open socket (borrowed from a live `TcpStream`); the option
    // value is a valid `c_int` whose size is passed with it.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn get(tcp: &TcpStream, level: i32, name: i32) -> i32 {
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live socket; `value` and `len` are valid for the kernel to fill.
        let ret = unsafe {
            libc::getsockopt(
                tcp.as_raw_fd(),
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(ret, 0, "{}", std::io::Error::last_os_error());
        value
    }

    #[test]
    fn timing_spends_about_the_timeout() {
        for secs in [1u64, 3, 10, 30, 120, 3600] {
            let (idle, interval, count) = timing(Duration::from_secs(secs));
            let total = u64::from(idle + interval * count);
            assert!(idle >= 1 && interval >= 1, "{secs}: {idle} {interval}");
            assert!(
                total <= secs.max(7) && total + u64::from(PROBES) + 2 >= secs,
                "{secs} s gives {total} s"
            );
        }
    }

    #[test]
    fn the_socket_carries_the_options() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        enable(&tcp, Duration::from_secs(30)).unwrap();
        assert_eq!(get(&tcp, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 10);
        assert_eq!(get(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 3);
        assert_eq!(get(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 6);
        let off = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        enable(&off, Duration::ZERO).unwrap();
        assert_eq!(get(&off, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
    }
}

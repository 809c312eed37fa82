//! The places for handshakes the accept loop runs at once (`Config::max_handshakes`).
//!
//! A client that connects and says nothing holds a place until the handshake's
//! deadline (`Config::timeout`). Without more, a few such connections, renewed as
//! they are cut, would keep every other client out. So a newcomer that finds every
//! place taken takes the place of the oldest connection that has not sent its
//! hello within the grace ([`grace`]): that connection is shut down and its
//! handshake ends with [`Ticket::was_cut`] set. A client that sends its hello at
//! once, as every KIARA client does, is never cut this way; one that has sent it
//! keeps its place until its handshake ends.

use parking_lot::Mutex;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection may keep its place without sending its hello while
/// others wait: a quarter of the handshake's `timeout`.
pub(crate) fn grace(timeout: Duration) -> Duration {
    timeout / 4
}

/// The places, shared by the accept loop and the handshakes' threads.
pub(crate) struct Handshakes {
    inner: Mutex<Inner>,
    max: usize,
    grace: Duration,
}

struct Inner {
    next: u64,
    /// Handshakes holding a place, oldest first.
    live: Vec<Entry>,
    /// Handshakes cut for a newcomer whose threads have not ended yet.
    cutting: usize,
}

struct Entry {
    id: u64,
    started: Instant,
    heard: bool,
    /// A handle on the connection, to shut it down if it is cut.
    tcp: TcpStream,
}

/// A handshake's place, given back when dropped.
pub(crate) struct Ticket {
    set: Arc<Handshakes>,
    id: u64,
}

impl Handshakes {
    /// `max` places; a connection silent for `grace` may be cut for a newcomer.
    pub(crate) fn new(max: usize, grace: Duration) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            inner: Mutex::new(Inner {
                next: 0,
                live: Vec::new(),
                cutting: 0,
            }),
            max,
            grace,
        })
    }

    /// Handshakes holding a place.
    pub(crate) fn running(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// A place for the connection `tcp`, accepted `now`: a free one, or that of the
    /// oldest connection that has not sent its hello within the grace, which is
    /// shut down. `Err` with the handshakes running when neither exists, or when
    /// as many cut handshakes as there are places have not ended yet.
    pub(crate) fn admit(self: &Arc<Self>, tcp: &TcpStream, now: Instant) -> Result<Ticket, usize> {
        let handle = tcp.try_clone().map_err(|_| self.running())?;
        let mut inner = self.inner.lock();
        if inner.live.len() >= self.max {
            let grace = self.grace;
            let silent = inner
                .live
                .iter()
                .position(|e| !e.heard && now.saturating_duration_since(e.started) >= grace);
            match silent {
                Some(i) if inner.cutting < self.max => {
                    let cut = inner.live.remove(i);
                    inner.cutting += 1;
                    // Its thread's next read fails and its handshake ends.
                    let _ = cut.tcp.shutdown(Shutdown::Both);
                }
                _ => return Err(inner.live.len()),
            }
        }
        let id = inner.next;
        inner.next += 1;
        inner.live.push(Entry {
            id,
            started: now,
            heard: false,
            tcp: handle,
        });
        Ok(Ticket {
            set: self.clone(),
            id,
        })
    }
}

impl Ticket {
    /// The client's hello is in: this handshake keeps its place until it ends.
    pub(crate) fn heard(&self) {
        let mut inner = self.set.inner.lock();
        if let Some(e) = inner.live.iter_mut().find(|e| e.id == self.id) {
            e.heard = true;
        }
    }

    /// Whether this handshake's connection was cut for a newcomer.
    pub(crate) fn was_cut(&self) -> bool {
        !self.set.inner.lock().live.iter().any(|e| e.id == self.id)
    }

    /// The grace it had, for the log line of a cut handshake.
    pub(crate) fn grace(&self) -> Duration {
        self.set.grace
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.set.inner.lock();
        match inner.live.iter().position(|e| e.id == self.id) {
            Some(i) => {
                inner.live.remove(i);
            }
            None => inner.cutting -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A connected pair on the loopback: (the server's end, the client's end).
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (server, client)
    }

    #[test]
    fn a_newcomer_takes_the_place_of_the_oldest_silent_connection_past_the_grace() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let set = Handshakes::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        let (s1, mut c1) = pair(&listener);
        let (s2, mut c2) = pair(&listener);
        let (s3, _c3) = pair(&listener);
        let first = set.admit(&s1, t0).unwrap();
        let second = set.admit(&s2, t0 + Duration::from_millis(100)).unwrap();
        // Full, and nobody past the grace: refused.
        assert_eq!(
            set.admit(&s3, t0 + Duration::from_millis(900)).err(),
            Some(2)
        );
        // The first has sent its hello: it keeps its place past the grace; the
        // second, silent, is cut for the newcomer.
        first.heard();
        let third = set.admit(&s3, t0 + Duration::from_millis(1100)).unwrap();
        assert!(!first.was_cut());
        assert!(second.was_cut());
        assert!(!third.was_cut());
        assert_eq!(set.running(), 2);
        // The cut connection was shut down: its client reads the end.
        let mut buf = [0u8; 1];
        assert_eq!(c2.read(&mut buf).unwrap(), 0);
        // The kept one was not.
        c1.set_nonblocking(true).unwrap();
        assert!(c1.read(&mut buf).is_err());
        drop(second);
        drop(first);
        assert_eq!(set.running(), 1);
        drop(third);
        assert_eq!(set.running(), 0);
        assert_eq!(set.inner.lock().cutting, 0);
    }

    #[test]
    fn cut_handshakes_that_have_not_ended_bound_the_newcomers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let set = Handshakes::new(1, Duration::ZERO);
        let t0 = Instant::now();
        let ends: Vec<_> = (0..4).map(|_| pair(&listener)).collect();
        let a = set.admit(&ends[0].0, t0).unwrap();
        // `a` is cut for `b`; its thread has not ended (the ticket lives).
        let b = set.admit(&ends[1].0, t0).unwrap();
        assert!(a.was_cut());
        // One place, one cut handshake still running: no more cutting.
        assert_eq!(set.admit(&ends[2].0, t0).err(), Some(1));
        drop(a);
        let c = set.admit(&ends[3].0, t0).unwrap();
        assert!(b.was_cut() && !c.was_cut());
    }
}

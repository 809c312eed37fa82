//! The places for handshakes the accept loop runs at once (`Config::max_handshakes`).
//!
//! A client that connects and says nothing holds a place until the handshake's
//! deadline (`Config::timeout`). Without more, a few such connections, renewed as
//! they are cut, would keep every other client out. So a newcomer that finds every
//! place taken takes the place of the oldest connection that has not sent its
//! hello within the grace ([`grace`]): that connection is shut down, and its
//! handshake learns it from [`Ticket::finish`]. A KIARA client sends its hello as
//! soon as it has made its queue pair, so it is not cut this way unless its hello
//! is late by a quarter of the handshake's `timeout`; one whose hello is in keeps
//! its place until its handshake ends. The sessions' room (`Config::max_sessions`)
//! caps the places too, and taking one over changes neither count.

use parking_lot::Mutex;
use std::net::{IpAddr, Shutdown, TcpStream};
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
    /// The client's address.
    from: IpAddr,
    /// A handle on the connection, to shut it down if it is cut.
    tcp: TcpStream,
}

/// A handshake's place, given back by [`Ticket::finish`] or when dropped.
pub(crate) struct Ticket {
    set: Arc<Handshakes>,
    id: u64,
    /// Given back already (by `finish`).
    done: bool,
}

/// Why a connection gets no place.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Every place is taken (this many handshakes), none by a silent connection
    /// past the grace.
    Full(usize),
    /// The sessions left room for no more handshakes than run (this many).
    Sessions(usize),
    /// The connection could not be duplicated to be cut later.
    Io(std::io::Error),
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
    #[cfg(test)]
    fn running(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// Handshakes holding a place whose client connected from `ip` (as given to
    /// [`Handshakes::admit`]).
    pub(crate) fn held_for(&self, ip: IpAddr) -> usize {
        self.inner
            .lock()
            .live
            .iter()
            .filter(|e| e.from == ip)
            .count()
    }

    /// A place for the connection `tcp` from `from`, accepted `now`, where the sessions leave
    /// room for `room` handshakes: a free place, or that of the oldest connection
    /// that has not sent its hello within the grace, which is shut down (taking
    /// its place changes neither count). Refused when neither exists, or when as
    /// many cut handshakes as there are places have not ended yet.
    pub(crate) fn admit(
        self: &Arc<Self>,
        tcp: &TcpStream,
        from: IpAddr,
        now: Instant,
        room: usize,
    ) -> Result<Ticket, Refusal> {
        let handle = tcp.try_clone().map_err(Refusal::Io)?;
        let mut inner = self.inner.lock();
        let running = inner.live.len();
        let cap = self.max.min(room);
        if running >= cap {
            let grace = self.grace;
            let silent = inner
                .live
                .iter()
                .position(|e| !e.heard && now.saturating_duration_since(e.started) >= grace);
            match silent {
                Some(i) if running <= cap && inner.cutting < self.max => {
                    let cut = inner.live.remove(i);
                    inner.cutting += 1;
                    // Its thread's next read fails and its handshake ends.
                    let _ = cut.tcp.shutdown(Shutdown::Both);
                }
                _ if room < self.max => return Err(Refusal::Sessions(running)),
                _ => return Err(Refusal::Full(running)),
            }
        }
        let id = inner.next;
        inner.next += 1;
        inner.live.push(Entry {
            id,
            started: now,
            heard: false,
            from,
            tcp: handle,
        });
        Ok(Ticket {
            set: self.clone(),
            id,
            done: false,
        })
    }

    /// Ends the handshake `id`: out of the places if it holds one (false), else
    /// one cut handshake fewer running (true).
    fn give_back(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        match inner.live.iter().position(|e| e.id == id) {
            Some(i) => {
                inner.live.remove(i);
                false
            }
            None => {
                inner.cutting -= 1;
                true
            }
        }
    }
}

impl Ticket {
    /// The client's hello is in: this handshake keeps its place until it ends.
    /// False if a newcomer took the place already (the connection was cut between
    /// the hello's read and this): the handshake must then allocate nothing more.
    pub(crate) fn heard(&self) -> bool {
        let mut inner = self.set.inner.lock();
        match inner.live.iter_mut().find(|e| e.id == self.id) {
            Some(e) => {
                e.heard = true;
                true
            }
            None => false,
        }
    }

    /// Gives the place back; true if it had been taken by a newcomer already
    /// (the connection was cut).
    pub(crate) fn finish(mut self) -> bool {
        self.done = true;
        self.set.give_back(self.id)
    }

    /// The grace it had, for the log line of a cut handshake.
    pub(crate) fn grace(&self) -> Duration {
        self.set.grace
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.set.give_back(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Ipv4Addr, TcpListener};

    /// The clients' address in these tests.
    const HERE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

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
        let first = set.admit(&s1, HERE, t0, 10).unwrap();
        let second = set
            .admit(&s2, HERE, t0 + Duration::from_millis(100), 10)
            .unwrap();
        // Full, and nobody past the grace: refused.
        let early = set.admit(&s3, HERE, t0 + Duration::from_millis(900), 10);
        assert!(matches!(early, Err(Refusal::Full(2))), "{:?}", early.err());
        // The first has sent its hello: it keeps its place past the grace; the
        // second, silent, is cut for the newcomer.
        assert!(first.heard());
        let third = set
            .admit(&s3, HERE, t0 + Duration::from_millis(1100), 10)
            .unwrap();
        assert_eq!(set.running(), 2);
        // The cut connection was shut down: its client reads the end.
        let mut buf = [0u8; 1];
        assert_eq!(c2.read(&mut buf).unwrap(), 0);
        // The kept one was not.
        c1.set_nonblocking(true).unwrap();
        assert!(c1.read(&mut buf).is_err());
        // Its hello, read in the moment before the cut, is too late: no place.
        assert!(!second.heard(), "a cut handshake still held its place");
        assert!(second.finish(), "the silent one was cut");
        assert!(!first.finish(), "the one that spoke kept its place");
        assert_eq!(set.running(), 1);
        assert!(!third.finish());
        assert_eq!(set.running(), 0);
        assert_eq!(set.inner.lock().cutting, 0);
    }

    #[test]
    fn cut_handshakes_that_have_not_ended_bound_the_newcomers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let set = Handshakes::new(1, Duration::ZERO);
        let t0 = Instant::now();
        let ends: Vec<_> = (0..4).map(|_| pair(&listener)).collect();
        let a = set.admit(&ends[0].0, HERE, t0, 10).unwrap();
        // `a` is cut for `b`; its thread has not ended (the ticket lives).
        let b = set.admit(&ends[1].0, HERE, t0, 10).unwrap();
        // One place, one cut handshake still running: no more cutting.
        let c = set.admit(&ends[2].0, HERE, t0, 10);
        assert!(matches!(c, Err(Refusal::Full(1))), "{:?}", c.err());
        assert!(a.finish());
        let d = set.admit(&ends[3].0, HERE, t0, 10).unwrap();
        // Dropped without `finish`, the tickets give their places back too.
        drop(b);
        drop(d);
        assert_eq!(set.running(), 0);
        assert_eq!(set.inner.lock().cutting, 0);
    }

    #[test]
    fn the_sessions_room_caps_the_places_and_a_silent_one_is_still_taken_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let set = Handshakes::new(4, Duration::from_secs(1));
        let t0 = Instant::now();
        let ends: Vec<_> = (0..4).map(|_| pair(&listener)).collect();
        // The sessions leave room for two handshakes.
        let a = set.admit(&ends[0].0, HERE, t0, 2).unwrap();
        let b = set.admit(&ends[1].0, HERE, t0, 2).unwrap();
        let c = set.admit(&ends[2].0, HERE, t0, 2);
        assert!(matches!(c, Err(Refusal::Sessions(2))), "{:?}", c.err());
        // Past the grace, a silent one gives way: the counts stay as they were.
        assert!(b.heard());
        let later = t0 + Duration::from_secs(2);
        let d = set.admit(&ends[2].0, HERE, later, 2).unwrap();
        assert_eq!(set.running(), 2);
        // The room shrank below what runs: nobody is taken over, not even `d`,
        // silent past the grace by then.
        let e = set.admit(&ends[3].0, HERE, later + Duration::from_secs(2), 1);
        assert!(matches!(e, Err(Refusal::Sessions(2))), "{:?}", e.err());
        assert!(a.finish() && !b.finish() && !d.finish());
    }

    #[test]
    fn the_places_are_counted_per_address() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let set = Handshakes::new(4, Duration::from_secs(1));
        let t0 = Instant::now();
        let ends: Vec<_> = (0..3).map(|_| pair(&listener)).collect();
        let there = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        let a = set.admit(&ends[0].0, HERE, t0, 10).unwrap();
        let b = set.admit(&ends[1].0, there, t0, 10).unwrap();
        let c = set.admit(&ends[2].0, HERE, t0, 10).unwrap();
        assert_eq!((set.held_for(HERE), set.held_for(there)), (2, 1));
        assert!(!a.finish());
        assert_eq!((set.held_for(HERE), set.held_for(there)), (1, 1));
        drop(b);
        drop(c);
        assert_eq!((set.held_for(HERE), set.held_for(there)), (0, 0));
    }
}

//! The poller thread: reaps the completion queues nobody else is reaping, sleeping
//! on the completion channel; and, in a sweep at most every [`SWEEP_EVERY`], reads
//! every session's bootstrap socket (a readable one means the peer went away) and
//! keeps the acknowledgement timeouts.
//!
//! Between sweeps it waits on the channel alone, and looks only at the queues the
//! channel reported and those it could not arm at its last look (a thread was
//! spinning on them): the cost of a round stays the same however many sessions the
//! transport holds, and with a thousand sessions the poller does not take a core
//! from the threads that do the work.

use crate::conn::{Conn, Event};
use crate::engine::Engine;
use crate::error::CloseReason;
use rdma_safe::WorkCompletion;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Sockets are read and timeouts ticked at least this often.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// How long the poller sleeps while a thread spins on some queue: it looks again
/// soon, to arm that queue once it is quiet.
const SHORT_WAIT: Duration = Duration::from_millis(2);

/// How long the poller sleeps while callback runners spin over the queues: they
/// reap them and arm each before they stop, so the poller has nothing to look at
/// meanwhile but the channel (which wakes it). Only a queue whose arm found it
/// busy waits this long for a look.
const RUNNERS_SPIN_WAIT: Duration = Duration::from_millis(10);

/// The poller's loop; ends with the engine. Never inlined: `cargo xtask bench`'s
/// code rows name it to leave the poller's work, which runs on a clock and not per
/// message, out of their counts.
#[inline(never)]
pub(crate) fn poll_loop(engine: Weak<Engine>) {
    let mut poller = Poller {
        wcs: [WorkCompletion::default(); 32],
        events: Vec::with_capacity(64),
        fds: Vec::with_capacity(64),
        watched: Vec::with_capacity(64),
        fired: Vec::with_capacity(64),
        pending: Vec::with_capacity(64),
        looking: Vec::with_capacity(64),
        everything: true,
        asking: Vec::new(),
        seen: u64::MAX,
        last_sweep: None,
    };
    let mut failures = 0u32;
    loop {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.stop.load(Ordering::SeqCst) {
            return;
        }
        // A bug of kiara-ib's in a round must not end the poller: without it no
        // timeout, sweep or liveness check runs, no sleeping waiter is woken, and
        // closed sessions are never forgotten. The session whose drain failed is
        // closed by its guard (`Conn::try_drain`); the poller starts over with
        // fresh scratch space, looking at every session, after a pause that
        // doubles while rounds keep failing.
        let round = std::panic::catch_unwind(AssertUnwindSafe(|| poller.round(&engine)));
        if let Err(panic) = round {
            poller.start_over(&engine);
            failures = failures.saturating_add(1);
            engine.session_line(&format!(
                "the poller failed ({}): a bug in kiara-ib, please report it; it goes on",
                crate::runners::panic_text(&*panic)
            ));
            drop(engine);
            std::thread::sleep(Duration::from_millis(1 << failures.min(10)));
        } else {
            failures = 0;
        }
    }
}

/// The poller's state, reused from round to round.
struct Poller {
    wcs: [WorkCompletion; 32],
    events: Vec<Event>,
    /// The channel's descriptor, then (in a sweep) one socket per watched session.
    fds: Vec<libc::pollfd>,
    /// The engine's sessions, refreshed when they change.
    watched: Vec<Arc<Conn>>,
    /// The queues the channel reported this round.
    fired: Vec<*mut rdma_safe::sys::ibv_cq>,
    /// Sessions to look at next round: left unarmed, or drained unarmed.
    pending: Vec<Arc<Conn>>,
    /// Last round's `pending`, being looked at.
    looking: Vec<Arc<Conn>>,
    /// The next look covers every session (runners stopped spinning since).
    everything: bool,
    /// Sessions that asked for READ targets, taken from the registrar.
    asking: Vec<u64>,
    seen: u64,
    last_sweep: Option<Instant>,
}

impl Poller {
    /// After a round that unwound: what it was in the middle of is dropped (the
    /// next round looks at every session, so nothing is left unlooked-at).
    fn start_over(&mut self, engine: &Engine) {
        // Events the round read but did not get to: those queues' marks of being
        // armed are stale (their notification was used up), and a queue marked
        // armed is never armed again. Every queue is taken as unarmed; arming one
        // that is armed changes nothing.
        for conn in &self.watched {
            conn.event_read();
        }
        if let Some(pool) = &engine.shared_recv {
            pool.event_read();
        }
        self.events.clear();
        self.fired.clear();
        self.pending.clear();
        self.looking.clear();
        self.everything = true;
        self.last_sweep = None;
    }

    /// One round: reap, sleep until the channel (or, in a sweep, a socket) wakes
    /// us, reap again, and sweep when one is due.
    fn round(&mut self, engine: &Engine) {
        #[cfg(feature = "fault-injection")]
        crate::faults::poller_round();
        let seen = self.seen;
        engine.sessions_into(&mut self.watched, &mut self.seen);
        // New sessions are looked at (and armed) at once.
        self.everything |= seen != self.seen;
        let since_sweep = self.last_sweep.map(|t| t.elapsed());
        let sweep = since_sweep.is_none_or(|d| d >= SWEEP_EVERY);
        // Arm the CQs and sleep. The poller never spins: threads waiting in `recv`
        // or `wait` spin on their own session's CQ, callback runners between
        // callbacks on all of them, and a spinning poller would only take a core
        // from them and from the device.
        let reaped = self.first_look(engine, sweep);
        // Before anything that may return early: a busy poller registers too.
        self.register_targets(engine);
        // Busy: straight back to reaping, but a due sweep is not put off, nor the
        // other sessions' events when a busy session's drain stopped at its limit.
        if reaped.active && !sweep && !reaped.capped {
            return;
        }
        let mut wait = if reaped.runners_spin {
            RUNNERS_SPIN_WAIT
        } else if reaped.unarmed {
            SHORT_WAIT
        } else {
            SWEEP_EVERY
        };
        if let Some(d) = since_sweep.filter(|_| !sweep) {
            wait = wait.min(SWEEP_EVERY - d);
        }
        if reaped.active {
            wait = Duration::ZERO;
        }
        self.fill_fds(engine, sweep);
        // A raw poll on purpose: the list grows with the sessions, and each socket's
        // POLLRDHUP is read back (rdma_safe::poll_readable takes a fixed array).
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
        let n = unsafe {
            libc::poll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                wait.as_millis() as libc::c_int,
            )
        };
        if n < 0 {
            return;
        }
        self.fired.clear();
        // The registrar's wake-up is read whenever it fired, asked-for work or not:
        // a counter left set would end every later sleep at once.
        if self.fds[1].revents != 0 {
            engine.registrar.consume_wake();
        }
        if self.fds[0].revents != 0 {
            while let Ok(Some(cq)) = engine.channel.get_event(Some(Duration::ZERO)) {
                self.fired.push(cq);
            }
        }
        self.drain_fired(engine);
        self.register_targets(engine);
        if sweep {
            self.sweep(engine);
            self.last_sweep = Some(Instant::now());
        }
        // A callback blocked past `runners::STALL` gets a runner to stand in.
        engine.runners.check(&engine.me);
    }

    /// Registers the READ targets sessions asked for (`crate::registrar`), each
    /// session's in turn, and routes what letting their READs go caused.
    fn register_targets(&mut self, engine: &Engine) {
        if !engine.registrar.asked() {
            return;
        }
        let mut ids = std::mem::take(&mut self.asking);
        engine.registrar.take(&mut ids);
        ids.sort_unstable();
        ids.dedup();
        for &id in &ids {
            let Some(conn) = engine.conn_by_id(id) else {
                continue;
            };
            // A bug while registering for one session closes that session, not
            // the others whose requests were taken with it.
            let done = std::panic::catch_unwind(AssertUnwindSafe(|| {
                conn.register_targets(&mut |ev| engine.route(&conn, ev))
            }));
            if let Err(panic) = done {
                let why = format!(
                    "kiara-ib failed registering READ targets for the session ({}): a bug, \
                     please report it",
                    crate::runners::panic_text(&*panic)
                );
                let closed = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    conn.close(CloseReason::Local(why))
                }));
                if closed.is_err() {
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| conn.closed_by_force()));
                }
            }
        }
        ids.clear();
        self.asking = ids;
    }

    /// Reaps and arms every session in a sweep (or after runners spun), else the
    /// ones left from last round; those it cannot arm are looked at again next round.
    fn first_look(&mut self, engine: &Engine, sweep: bool) -> Reaped {
        std::mem::swap(&mut self.pending, &mut self.looking);
        self.pending.clear();
        let all = sweep || self.everything;
        let set = if all { &self.watched } else { &self.looking };
        let (wcs, events) = (&mut self.wcs, &mut self.events);
        let r = reap(engine, set, wcs, events, &mut self.pending);
        self.looking.clear();
        // While runners spin they reap; once they stop, every queue is looked at.
        self.everything = r.runners_spin;
        r
    }

    /// Drains the queues the channel reported, unarmed (the next round's first
    /// look arms them). While runners spin these are cold sessions' queues, which
    /// the runners leave alone: their sessions are warmed, so the runners poll them
    /// again.
    fn drain_fired(&mut self, engine: &Engine) {
        let runners_spin = engine.runners.waiting.is_spun();
        for &cq in &self.fired {
            if let Some(pool) = engine
                .shared_recv
                .as_ref()
                .filter(|p| p.cq().as_raw() == cq)
            {
                // The shared receive queue's CQ: reaped now, armed at the next look.
                pool.event_read();
                engine.reap_shared(false);
                continue;
            }
            let conn = match self.watched.iter().find(|c| c.cq.as_raw() == cq) {
                Some(conn) => conn.clone(),
                None => {
                    // A session that joined since the list was made: all are looked
                    // at next round. Its event is read here, so its mark of being
                    // armed is cleared here too, else its drains would never arm it
                    // again and only sweeps would reap it. (Found in the engine:
                    // `watched` stays as it was, paired with this round's sockets.
                    // One not joined yet was never marked.)
                    self.everything = true;
                    match engine.conn_by_cq(cq) {
                        Some(conn) => conn,
                        None => continue,
                    }
                }
            };
            let conn = &conn;
            conn.event_read();
            if runners_spin {
                conn.heat.warm();
            }
            let (wcs, events) = (&mut self.wcs, &mut self.events);
            conn.try_drain(wcs, events, false, &mut |ev| engine.route(conn, ev));
            if !runners_spin {
                self.pending.push(conn.clone());
            }
        }
    }

    /// The channel's descriptor, and in a sweep every watched session's socket.
    fn fill_fds(&mut self, engine: &Engine, sweep: bool) {
        self.fds.clear();
        self.fds.push(libc::pollfd {
            fd: engine.channel.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.fds.push(libc::pollfd {
            fd: engine.registrar.fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        if sweep {
            self.fds
                .extend(self.watched.iter().map(|conn| libc::pollfd {
                    fd: conn.tcp.as_raw_fd(),
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                }));
        }
    }

    /// Closes the sessions whose socket says the peer went away, ticks every
    /// session's timeouts, and lets closed sessions leave the engine.
    fn sweep(&mut self, engine: &Engine) {
        for (pfd, conn) in self.fds[2..].iter().zip(&self.watched) {
            if pfd.revents == 0 || conn.closed().is_some() {
                continue;
            }
            if let Some(reason) = peer_gone(engine, conn) {
                engine.session_line(&format!(
                    "session {} ({}) closed: {reason}",
                    conn.id, conn.peer
                ));
                conn.close(reason);
            }
        }
        // A cold session whose event went astray (its queue could not be armed while
        // another thread drained it) is found here, within one sweep.
        if engine.runners.waiting.is_spun() {
            for conn in self.watched.iter().filter(|c| c.heat.is_cold()) {
                let (wcs, events) = (&mut self.wcs, &mut self.events);
                let drained = conn.try_drain(wcs, events, true, &mut |ev| engine.route(conn, ev));
                if drained.is_none_or(|d| d.active || d.capped) {
                    conn.heat.warm();
                }
            }
        }
        // Acknowledgement timeouts (the core keeps the time; this is its clock).
        let now = Instant::now();
        for conn in &self.watched {
            conn.tick(now, &mut self.events);
            for ev in self.events.drain(..) {
                engine.route(conn, ev);
            }
            engine.hand_over_stragglers(conn);
        }
        // Slots the shared receive queue refused back, should no receive come to
        // post them again (and the first refusal's line, outside the receive path).
        if let Some(pool) = &engine.shared_recv {
            pool.look();
        }
        // Closed sessions leave the engine; their users still hold them to ask why.
        engine.forget_closed();
        engine.look_at_session_lines();
    }
}

/// Why a readable bootstrap socket means the session is over (the peer closed it,
/// broke the protocol, or its host stopped answering); `None` if it was not.
fn peer_gone(engine: &Engine, conn: &Conn) -> Option<CloseReason> {
    let mut byte = [0u8; 1];
    Some(match (&conn.tcp).read(&mut byte) {
        Ok(0) => CloseReason::PeerGone("the peer closed the connection (process ended?)".into()),
        Ok(_) => CloseReason::Protocol(
            "the peer sent unexpected bytes on the bootstrap connection".into(),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
        Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => CloseReason::PeerGone(format!(
            "its host did not answer for about {:?} (keepalive on the bootstrap \
             connection): down or unreachable",
            engine.config.peer_timeout
        )),
        Err(e) => CloseReason::PeerGone(format!("the bootstrap connection failed: {e}")),
    })
}

/// What one `reap` found.
struct Reaped {
    /// Some completion was handled.
    active: bool,
    /// Some CQ was left unarmed because a thread spins on it.
    unarmed: bool,
    /// Runners spin over the queues: nothing was looked at.
    runners_spin: bool,
    /// Some drain stopped at its batch limit: the round goes on to the channel,
    /// sockets and sweeps before it comes back, so that one busy session does not
    /// keep the poller to itself.
    capped: bool,
}

/// Drains each of `conns`' CQs that no thread is spinning on, routes what it
/// delivers, and arms each one no thread has spun on lately. Those left unarmed go
/// to `unarmed`.
fn reap(
    engine: &Engine,
    conns: &[Arc<Conn>],
    wcs: &mut [WorkCompletion],
    events: &mut Vec<Event>,
    unarmed: &mut Vec<Arc<Conn>>,
) -> Reaped {
    let mut r = Reaped {
        active: false,
        unarmed: false,
        runners_spin: false,
        capped: false,
    };
    // A runner spinning over the queues reaps them all; once it stopped, they are
    // armed after a quiet look.
    let runners = &engine.runners.waiting;
    if runners.is_spun() {
        r.unarmed = true;
        r.runners_spin = true;
        return r;
    }
    let runners_quiet = runners.poller_may_arm();
    // The shared receive queue's CQ (if any): reaped, and armed once empty; if it
    // could not be (another thread was reaping it), looked at again soon.
    r.active |= engine.reap_shared(runners_quiet);
    r.unarmed |= engine.shared_recv.as_ref().is_some_and(|p| !p.armed());
    for conn in conns {
        // A thread that spins on this CQ, or spun on it since the last look, reaps
        // it (and arms it before it sleeps): competing for it would only cost, and
        // on a busy machine the poller preempted while it holds the session's drain
        // lock would stall that thread. Such a queue is looked at next round.
        let quiet = !conn.waiting.is_spun() && conn.waiting.poller_may_arm();
        let arm = runners_quiet && quiet;
        let drained = match arm {
            true => conn.try_drain(wcs, events, arm, &mut |ev| engine.route(conn, ev)),
            false => None,
        };
        r.active |= drained.is_some_and(|d| d.active);
        // Left unarmed: another thread had it, or the drain stopped at its batch
        // limit with completions left.
        let capped = drained.is_some_and(|d| d.capped);
        r.capped |= capped;
        if !arm || drained.is_none() || capped {
            r.unarmed = true;
            unarmed.push(conn.clone());
        }
    }
    r
}

//! The shared receive CQ: one completion queue for the receives of every session on
//! the shared receive queue, sized to the queue's slots, so that a session's own CQ
//! holds its sends only and stays as small as with its own slots.
//!
//! A completion names its queue pair; the reaper (the poller, a spinning runner or
//! a waiting `recv`, whichever holds the reap lock) routes it to that session's
//! [`Mailbox`] and then drains the sessions it routed to, so the session's driver
//! handles it in order with the rest (`Conn::try_drain` takes a session's mail with
//! its own CQ). Every slot still comes back:
//! - a completion whose queue pair has no mailbox (its session is gone, or never
//!   got that far) gives its slot back at once;
//! - a mailbox that closes (the session destroyed its queue pair, or its handshake
//!   failed) gives back what it holds, and refuses what comes later, which the
//!   reaper then gives back;
//! - a new queue pair gets its mailbox only after the queue was reaped to the end:
//!   the completions of a destroyed queue pair whose number the device hands out
//!   again are all on the queue by then (destruction waits for the device), so
//!   none reaches the new session's peer-facing code.

use super::SharedRecv;
use crate::conn::{recv_slot, Conn};
use parking_lot::{Mutex, MutexGuard};
use rdma_safe::WorkCompletion;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// The completions routed to one session, until its driver takes them.
pub(crate) struct Mailbox {
    inner: Mutex<Inner>,
    /// Whether `inner.wcs` holds anything, for a look without the lock.
    has_mail: AtomicBool,
    /// The peer had more receives waiting here than its credits: one was refused
    /// (its slot given back), and the session must close.
    over: AtomicBool,
}

struct Inner {
    /// At most `credits`: an honest peer has no more messages unhandled, and a
    /// peer that ignores its credits holds no more slots here (even before its
    /// session exists, while the handshake waits for its ready byte).
    wcs: VecDeque<WorkCompletion>,
    credits: usize,
    /// The session, once it exists; until then completions wait here.
    conn: Weak<Conn>,
    /// The queue pair is gone: nothing more is taken.
    closed: bool,
}

impl Mailbox {
    fn new(credits: u32) -> Mailbox {
        Mailbox {
            inner: Mutex::new(Inner {
                wcs: VecDeque::with_capacity(credits as usize),
                credits: credits as usize,
                conn: Weak::new(),
                closed: false,
            }),
            has_mail: AtomicBool::new(false),
            over: AtomicBool::new(false),
        }
    }

    /// True once a receive beyond the peer's credits was refused.
    pub(crate) fn over_credits(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }

    /// The session whose completions these are; the reaper drains it from now on.
    pub(crate) fn attach(&self, conn: &Arc<Conn>) {
        self.inner.lock().conn = Arc::downgrade(conn);
    }

    /// True while completions wait (without the lock).
    pub(crate) fn has_mail(&self) -> bool {
        self.has_mail.load(Ordering::SeqCst)
    }

    /// Moves waiting completions into `out`, oldest first; how many.
    pub(crate) fn take_into(&self, out: &mut [WorkCompletion]) -> usize {
        if out.is_empty() || !self.has_mail() {
            return 0;
        }
        let mut inner = self.inner.lock();
        let n = out.len().min(inner.wcs.len());
        for (dst, wc) in out.iter_mut().zip(inner.wcs.drain(..n)) {
            *dst = wc;
        }
        self.has_mail
            .store(!inner.wcs.is_empty(), Ordering::Release);
        n
    }

    /// Takes `wc` for the session: its session to drain (if it exists yet), or
    /// `Err` if the mailbox is closed or holds the peer's credits' worth (the
    /// caller gives the slot back; the session then closes).
    fn push(&self, wc: WorkCompletion) -> Result<Option<Arc<Conn>>, WorkCompletion> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(wc);
        }
        if inner.wcs.len() >= inner.credits {
            self.over.store(true, Ordering::Release);
            return Err(wc);
        }
        inner.wcs.push_back(wc);
        self.has_mail.store(true, Ordering::SeqCst);
        // Before the reaper tries the session's drain lock: a holder that lets go
        // after that try sees the mail (the fence in `Conn::try_drain`).
        fence(Ordering::SeqCst);
        Ok(inner.conn.upgrade())
    }
}

/// Batches of completions one [`SharedRecv::reap`] takes at most.
const REAP_BATCHES: usize = 4;

/// The reaper's scratch space, under the reap lock.
pub(super) struct Reaping {
    wcs: [WorkCompletion; 32],
    /// Sessions that got mail in this reap, drained after it with the lock let go
    /// ([`SharedRecv::drain_touched`]).
    touched: Vec<Arc<Conn>>,
}

impl Reaping {
    pub(super) fn new() -> Reaping {
        Reaping {
            wcs: [WorkCompletion::default(); 32],
            touched: Vec::with_capacity(32),
        }
    }
}

/// The queue pairs on the shared queue, by number.
pub(super) type Routes = HashMap<u32, Arc<Mailbox>>;

impl SharedRecv {
    /// A mailbox for the new queue pair `qpn`, which has not received anything yet.
    /// The queue is reaped to the end first, under the reap lock (waiting for it):
    /// a completion of an older queue pair with the same number goes to that one's
    /// mailbox or back to the pool, never to this one.
    /// It must be closed ([`SharedRecv::close`]) once the queue pair is destroyed.
    pub(crate) fn open(
        &self,
        qpn: u32,
        credits: u32,
        drain: &mut dyn FnMut(&Arc<Conn>),
    ) -> Arc<Mailbox> {
        let mut reaping = self.reaping.lock();
        // Enough batches for a full queue: all that was on it when this began.
        let batches = self.cq.capacity() as usize / reaping.wcs.len() + 1;
        let _ = self.reap_locked(&mut reaping, false, batches);
        self.drain_touched(reaping, drain);
        let mailbox = Arc::new(Mailbox::new(credits));
        self.routes.lock().insert(qpn, mailbox.clone());
        mailbox
    }

    /// Queue pair `qpn` is destroyed: its mailbox closes, giving back the slots of
    /// what it holds; what the reaper finds for it later goes back too.
    pub(crate) fn close(&self, qpn: u32, mailbox: &Arc<Mailbox>) {
        {
            let mut routes = self.routes.lock();
            if routes.get(&qpn).is_some_and(|m| Arc::ptr_eq(m, mailbox)) {
                routes.remove(&qpn);
            }
        }
        let mut inner = mailbox.inner.lock();
        inner.closed = true;
        for wc in inner.wcs.drain(..) {
            self.unwanted(&wc);
        }
        mailbox.has_mail.store(false, Ordering::Release);
    }

    /// Reaps the shared CQ unless another thread is at it (`None` then): routes each
    /// completion to its session's mailbox, drains the sessions that got mail with
    /// `drain`, and with `arm` arms the queue's notification once it is empty. True
    /// if it found anything.
    /// At most [`REAP_BATCHES`] batches: a waiting `recv` that reaps for all is
    /// not held up for long by a busy queue (nor does it arm it then).
    ///
    /// A caller that wants the queue armed but finds another thread reaping leaves
    /// that to it: the holder arms before it lets go, or (after letting go) finds
    /// the wish and tries again; a queue still busy after its batches stays wished
    /// for, and the poller looks again soon ([`SharedRecv::armed`]).
    pub(crate) fn reap(&self, arm: bool, drain: &mut dyn FnMut(&Arc<Conn>)) -> Option<bool> {
        if arm {
            self.want_arm.store(true, Ordering::SeqCst);
        }
        let mut found = None;
        loop {
            let Some(mut reaping) = self.reaping.try_lock() else {
                return found;
            };
            let arm = self.want_arm.swap(false, Ordering::SeqCst);
            let (got, armed) = self.reap_locked(&mut reaping, arm, REAP_BATCHES);
            if arm && !armed {
                self.want_arm.store(true, Ordering::SeqCst);
            }
            self.drain_touched(reaping, drain);
            found = Some(found == Some(true) || got);
            fence(Ordering::SeqCst);
            if !self.want_arm.load(Ordering::SeqCst) || (arm && !armed) {
                return found;
            }
        }
    }

    /// True if the queue's notification is armed: a completion will wake the
    /// poller. Else it must look again soon.
    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) && !self.want_arm.load(Ordering::Acquire)
    }

    /// The poller read the shared CQ's event: the next arm must really arm it.
    pub(crate) fn event_read(&self) {
        self.armed.store(false, Ordering::Release);
    }

    /// [`SharedRecv::reap`] with the reap lock held, for at most `batches`
    /// batches: whether it found anything, and whether the queue is left armed
    /// (when `arm` asked for it).
    fn reap_locked(&self, reaping: &mut Reaping, arm: bool, batches: usize) -> (bool, bool) {
        let mut found = false;
        let mut armed = false;
        for _ in 0..batches {
            let n = match self.cq.poll(&mut reaping.wcs) {
                Ok(done) => done.len(),
                // A failed poll means the device failed; the sessions find out on
                // their own queues.
                Err(_) => return (found, true),
            };
            if n == 0 {
                // Armed since its last event: nothing arrived since that arm.
                if !arm || armed || self.armed.load(Ordering::Acquire) {
                    return (found, true);
                }
                // Completions after the arm raise an event; those before it are
                // polled once more. Marked first: the poller clears the mark when
                // it reads the event, which comes only after the arm.
                self.armed.store(true, Ordering::Release);
                if self.cq.req_notify(false).is_err() {
                    self.armed.store(false, Ordering::Release);
                    return (found, false);
                }
                armed = true;
                continue;
            }
            found = true;
            self.route(reaping, n);
        }
        (found, !arm)
    }

    /// Drains the sessions the last reap routed mail to, with the reap lock
    /// (`reaping`) let go first: a session's drain can take long (a READ target
    /// registered where the pool's cache misses, which a peer can make happen), and
    /// meanwhile other threads reap the queue for the other sessions.
    fn drain_touched(
        &self,
        mut reaping: MutexGuard<'_, Reaping>,
        drain: &mut dyn FnMut(&Arc<Conn>),
    ) {
        // Taken out while draining: should `drain` panic, the sessions are let go
        // of on the way out, not kept inside the pool they hold.
        let mut touched = std::mem::take(&mut reaping.touched);
        drop(reaping);
        for conn in touched.drain(..) {
            drain(&conn);
        }
        // The vector's room goes back for the next reap (no allocation in steady
        // use), unless another thread reaps now; then it is dropped.
        if let Some(mut reaping) = self.reaping.try_lock() {
            // Not over sessions routed to by a reap whose drains never ran (its
            // thread unwound between the two).
            if reaping.touched.is_empty() && reaping.touched.capacity() < touched.capacity() {
                reaping.touched = touched;
            }
        }
    }

    /// Routes the first `n` completions of the scratch space.
    fn route(&self, reaping: &mut Reaping, n: usize) {
        let routes = self.routes.lock();
        for wc in &reaping.wcs[..n] {
            let pushed = match routes.get(&wc.qp_num()) {
                Some(mailbox) => mailbox.push(*wc),
                None => Err(*wc),
            };
            match pushed {
                Ok(Some(conn)) => {
                    if !reaping.touched.iter().any(|c| Arc::ptr_eq(c, &conn)) {
                        reaping.touched.push(conn);
                    }
                }
                // Its session is not there yet: it takes its mail when it is.
                Ok(None) => {}
                Err(wc) => self.unwanted(&wc),
            }
        }
    }

    /// A completion nobody will handle: its slot goes back to the queue.
    fn unwanted(&self, wc: &WorkCompletion) {
        if let Some(index) = recv_slot(wc.wr_id()) {
            // A failure names a slot the pool does not hold: nothing to give back.
            let _ = self.give_back(index);
        }
    }
}

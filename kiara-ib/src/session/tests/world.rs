//! The simulated RC wire: two sides, each a session core and what its driver
//! holds, and the operations the properties interleave.

use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// What the driver of one side saw and holds.
pub(super) struct Side {
    pub(super) s: Session,
    pub(super) posted: Vec<bool>,
    /// SENDs on the wire to the peer: sender's slot, type, header.
    pub(super) wire: VecDeque<(u32, Kind, Control)>,
    /// Our SENDs the peer received, whose completions may be reported.
    pub(super) send_done: VecDeque<u32>,
    /// Our READs posted: id, peer's address, key, length.
    pub(super) reads: VecDeque<(u64, u64, u32, u32)>,
    pub(super) invalidations: VecDeque<u64>,
    /// Our messages' windows: (address, length, valid).
    pub(super) windows: HashMap<u64, (u64, u64, bool)>,
    /// Sent and not refused: id, and whether it was eager.
    pub(super) sent: Vec<u64>,
    pub(super) sent_len: HashMap<u64, u64>,
    pub(super) delivered: Vec<u64>,
    pub(super) untaken: usize,
    pub(super) finished: HashMap<u64, Result<(), CloseReason>>,
    pub(super) released: HashSet<u64>,
    pub(super) discarded: HashSet<u64>,
    pub(super) reading: HashMap<u64, u64>,
    pub(super) destroyed: bool,
    pub(super) closed: Option<CloseReason>,
    pub(super) last_bind: Option<u64>,
    pub(super) now: Instant,
    /// The peer's acknowledgements invalidate our windows (SEND_WITH_INV, as
    /// kiara-ib's do); else each needs our LOCAL_INV.
    pub(super) remote_inv: bool,
    /// The next READ target cannot be registered (the memlock limit): the driver
    /// tells the core ([`Session::no_read_target`]).
    pub(super) no_memory: bool,
    /// The next READ target is not in the pool's cache: the driver has it
    /// registered later ([`Session::awaiting_target`]).
    pub(super) slow_target: bool,
    /// READ targets being registered, oldest first.
    pub(super) registering: VecDeque<u64>,
    /// The next window cannot be bound (the memlock limit): its descriptor goes
    /// as a CREDIT that withdraws it ([`Session::bind_failed`]).
    pub(super) no_bind: bool,
    /// The message whose bind failed, until its descriptor's `Post`.
    pub(super) unbound: Option<u64>,
}

impl Side {
    pub(super) fn new(t0: Instant, remote_inv: bool) -> Side {
        Side {
            s: Session::new(params(), t0),
            posted: vec![true; CREDITS as usize],
            wire: VecDeque::new(),
            send_done: VecDeque::new(),
            reads: VecDeque::new(),
            invalidations: VecDeque::new(),
            windows: HashMap::new(),
            sent: Vec::new(),
            sent_len: HashMap::new(),
            delivered: Vec::new(),
            untaken: 0,
            finished: HashMap::new(),
            released: HashSet::new(),
            discarded: HashSet::new(),
            reading: HashMap::new(),
            destroyed: false,
            closed: None,
            last_bind: None,
            now: t0,
            remote_inv,
            no_memory: false,
            slow_target: false,
            registering: VecDeque::new(),
            no_bind: false,
            unbound: None,
        }
    }

    /// Carries out every action the core asked for.
    pub(super) fn drain(&mut self) {
        while let Some(a) = self.s.next_action() {
            match a {
                Action::Bind(id) if std::mem::take(&mut self.no_bind) => {
                    assert!(!self.destroyed, "bind after the QP is gone");
                    self.unbound = Some(id);
                }
                Action::Bind(id) => {
                    assert!(!self.destroyed, "bind after the QP is gone");
                    let len = self.sent_len[&id];
                    assert!(
                        self.windows.insert(id, (id << 32, len, true)).is_none(),
                        "bound twice"
                    );
                    self.last_bind = Some(id);
                }
                Action::Post { slot, kind, header } => self.post(slot, kind, header),
                Action::StartRead { id, .. } if std::mem::take(&mut self.no_memory) => {
                    assert!(!self.reading.contains_key(&id), "read started twice");
                    self.s.no_read_target(id);
                }
                Action::StartRead { id, len } if std::mem::take(&mut self.slow_target) => {
                    assert!(self.reading.insert(id, len).is_none(), "read started twice");
                    self.registering.push_back(id);
                    self.s.awaiting_target(id);
                }
                Action::StartRead { id, len } => {
                    assert!(self.reading.insert(id, len).is_none(), "read started twice");
                }
                Action::Read {
                    id,
                    offset,
                    len,
                    addr,
                    rkey,
                } => {
                    assert!(self.reading.contains_key(&id), "read into no target");
                    assert!(
                        !self.registering.contains(&id),
                        "read into a target still being registered"
                    );
                    assert!(offset + u64::from(len) <= self.reading[&id]);
                    self.reads.push_back((id, addr, rkey, len));
                }
                Action::Repost(slot) => {
                    assert!(!self.posted[slot as usize], "slot {slot} posted twice");
                    self.posted[slot as usize] = true;
                }
                Action::Deliver(id) => {
                    assert!(self.closed.is_none(), "delivery after close");
                    assert!(self.reading.remove(&id).is_some() || !self.delivered.contains(&id));
                    self.delivered.push(id);
                    self.untaken += 1;
                }
                Action::Invalidate(id) => {
                    let w = self
                        .windows
                        .get_mut(&id)
                        .expect("invalidate a bound window");
                    assert!(w.2, "invalidated twice");
                    w.2 = false;
                    self.invalidations.push_back(id);
                }
                Action::Finished { id, result } => {
                    assert!(
                        self.finished.insert(id, result).is_none(),
                        "message {id} finished twice"
                    );
                }
                Action::Release(id) => {
                    let live = self.windows.get(&id).is_some_and(|w| w.2);
                    assert!(
                        !live || self.destroyed,
                        "released {id} while the peer may read it"
                    );
                    assert!(self.released.insert(id), "released {id} twice");
                }
                Action::Discard(id) => {
                    assert!(self.destroyed, "discard before the QP is gone");
                    assert!(self.discarded.insert(id), "discarded {id} twice");
                    self.reading.remove(&id);
                }
                Action::DestroyQp => self.destroyed = true,
                Action::Closed(r) => self.closed = Some(r),
            }
        }
    }

    /// Puts a control message on the wire, as the driver posts it: a DATA with
    /// its window's address and key, or, when its bind failed, the withdrawal.
    fn post(&mut self, slot: u32, kind: Kind, mut header: Control) {
        assert!(!self.destroyed, "post after the QP is gone");
        if kind == Kind::Data && self.unbound == Some(header.msg_id) {
            // What `Conn::post_control` does with it.
            self.unbound = None;
            let credit = crate::session::withdrawal(&header);
            self.wire.push_back((slot, Kind::Credit, credit));
            self.s.bind_failed(header.msg_id, "no memory".into());
            return;
        }
        if kind == Kind::Data {
            assert_eq!(
                self.last_bind.take(),
                Some(header.msg_id),
                "DATA follows its bind"
            );
            let (addr, len, _) = self.windows[&header.msg_id];
            assert_eq!(len, header.len);
            header.addr = addr;
            header.rkey = header.msg_id as u32 ^ 0x5a5a;
        }
        assert_eq!(header.kind, Some(kind));
        self.wire.push_back((slot, kind, header));
    }

    pub(super) fn check(&self) {
        let s = &self.s;
        if s.closed.is_none() {
            assert_eq!(s.send_credits + s.spent, CREDITS, "credits conserved");
            assert!(s.granted <= CREDITS, "{} credits granted", s.granted);
            assert!(s.out_messages <= params().max_out_messages);
            assert!(s.in_bytes <= params().max_in_bytes);
            assert!(s.reads_in_flight <= params().reads_in_flight);
            let live = self.windows.values().filter(|w| w.2).count() as u32;
            assert!(live <= params().windows, "{live} windows readable at once");
        }
        assert_eq!(self.closed.as_ref(), s.closed());
        // A transport budget of the side's own (as `params` gives each) holds
        // exactly the bytes of its read messages queued or in flight.
        if Arc::strong_count(&s.p.all_out) == 1 {
            assert_eq!(
                s.p.all_out.used(),
                s.out_bytes,
                "transport budget = out_bytes"
            );
        }
        if Arc::strong_count(&s.p.all_in) == 1 {
            assert_eq!(s.p.all_in.used(), s.in_bytes, "transport budget = in_bytes");
        }
        if s.closed.is_some() {
            assert_eq!(s.out_bytes, 0, "a close gives every byte back");
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum Lie {
    RepeatedId,
    IdFarAhead,
    AckOfNothing,
    TooManyCredits,
    EagerTooManyCredits,
    Bye,
    InvalidatingCredit,
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    Send {
        a: bool,
        eager: bool,
        len: u16,
    },
    Arrive(bool),
    SendDone(bool),
    ReadDone(bool),
    Invalidated(bool),
    Take(bool),
    Repost(bool),
    Tick(bool, u8),
    Close(bool),
    Lie(bool, Lie),
    /// The side's next READ target cannot be registered.
    NoMemory(bool),
    /// The side's next window cannot be bound.
    NoBind(bool),
    /// The side's next READ target is registered later.
    SlowTarget(bool),
    /// The oldest READ target being registered is ready (`true`), or could not be
    /// registered (`false`).
    Registered(bool, bool),
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), any::<bool>(), 1..6000u16).prop_map(|(a, eager, len)| Op::Send { a, eager, len }),
        6 => any::<bool>().prop_map(Op::Arrive),
        3 => any::<bool>().prop_map(Op::SendDone),
        3 => any::<bool>().prop_map(Op::ReadDone),
        2 => any::<bool>().prop_map(Op::Invalidated),
        3 => any::<bool>().prop_map(Op::Take),
        2 => any::<bool>().prop_map(Op::Repost),
        1 => (any::<bool>(), 0..8u8).prop_map(|(a, s)| Op::Tick(a, s)),
        1 => any::<bool>().prop_map(Op::NoMemory),
        1 => any::<bool>().prop_map(Op::NoBind),
        2 => any::<bool>().prop_map(Op::SlowTarget),
        2 => (any::<bool>(), prop::bool::weighted(0.8)).prop_map(|(a, ok)| Op::Registered(a, ok)),
    ]
}

pub(super) fn hostile_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => op(),
        1 => any::<bool>().prop_map(Op::Close),
        1 => (any::<bool>(), prop_oneof![
            Just(Lie::RepeatedId), Just(Lie::IdFarAhead), Just(Lie::AckOfNothing),
            Just(Lie::TooManyCredits), Just(Lie::EagerTooManyCredits), Just(Lie::Bye),
            Just(Lie::InvalidatingCredit)
        ]).prop_map(|(a, l)| Op::Lie(a, l)),
    ]
}

/// The control message of `lie`, to a session that has received up to `upto` and
/// spent `spent` credits.
pub(super) fn lie_message(lie: &Lie, upto: u64, spent: u32) -> (Kind, Control) {
    match lie {
        Lie::RepeatedId => (
            Kind::Eager,
            Control {
                msg_id: upto,
                len: 1,
                ..Default::default()
            },
        ),
        Lie::IdFarAhead => (
            Kind::Eager,
            Control {
                msg_id: upto + 1000,
                len: 1,
                ..Default::default()
            },
        ),
        Lie::AckOfNothing => (
            Kind::Ack,
            Control {
                msg_id: 1 << 40,
                ..Default::default()
            },
        ),
        Lie::TooManyCredits => (
            Kind::Credit,
            Control {
                credits: spent + 1,
                ..Default::default()
            },
        ),
        // The next message, in order, but returning a credit never spent.
        Lie::EagerTooManyCredits => (
            Kind::Eager,
            Control {
                msg_id: upto + 1,
                len: 1,
                credits: spent + 1,
                ..Default::default()
            },
        ),
        Lie::Bye => (Kind::Bye, Control::default()),
        Lie::InvalidatingCredit => (Kind::Credit, Control::default()),
    }
}

pub(super) struct World {
    pub(super) a: Side,
    pub(super) b: Side,
}

impl World {
    pub(super) fn new() -> World {
        World::with(true, true)
    }

    /// Whether acknowledgements arriving at `a` and at `b` invalidate the window.
    pub(super) fn with(a_inv: bool, b_inv: bool) -> World {
        let t0 = Instant::now();
        World {
            a: Side::new(t0, a_inv),
            b: Side::new(t0, b_inv),
        }
    }

    /// [`World::with`], where `a` connected and greets (its CREDIT is on the wire)
    /// and `b` accepted and awaits the greeting for `within`.
    pub(super) fn greeted(a_inv: bool, b_inv: bool, within: Duration) -> World {
        let mut w = World::with(a_inv, b_inv);
        w.a.s.greet();
        w.b.s.await_greeting(within);
        w.a.drain();
        w
    }

    pub(super) fn sides(&mut self, a: bool) -> (&mut Side, &mut Side) {
        if a {
            (&mut self.a, &mut self.b)
        } else {
            (&mut self.b, &mut self.a)
        }
    }

    /// Applies one step, then carries out what the sessions asked for and checks
    /// their invariants; returns whether anything happened. (A step that finds
    /// nothing to do calls no session, so the drain after it has nothing to carry out.)
    pub(super) fn step(&mut self, op: &Op) -> bool {
        let did = self.apply(op);
        self.a.drain();
        self.b.drain();
        self.a.check();
        self.b.check();
        self.check_granted();
        did
    }

    /// While both sides are open, what each grants is exactly what the other may
    /// still send: its credits, its SENDs on the wire, and the credits on their
    /// way back to it. So an honest peer never trips the receiver's count.
    pub(super) fn check_granted(&self) {
        for (me, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            if me.closed.is_some() || peer.closed.is_some() {
                continue;
            }
            let returning: u32 = peer.wire.iter().map(|(_, _, h)| h.credits).sum();
            assert_eq!(
                peer.s.granted,
                me.s.send_credits + me.wire.len() as u32 + returning,
                "credits granted against credits held"
            );
        }
    }

    /// Applies one step to the sessions; returns whether anything happened.
    pub(super) fn apply(&mut self, op: &Op) -> bool {
        match op {
            Op::Send { a, eager, len } => self.send(*a, *eager, *len),
            Op::Arrive(a) => self.arrive(*a),
            Op::SendDone(a) => {
                let (me, _) = self.sides(*a);
                let Some(slot) = me.send_done.pop_front() else {
                    return false;
                };
                me.s.on_send_done(slot);
                true
            }
            Op::ReadDone(a) => self.read_done(*a),
            Op::Invalidated(a) => {
                let (me, _) = self.sides(*a);
                let Some(id) = me.invalidations.pop_front() else {
                    return false;
                };
                me.s.on_invalidated(id);
                true
            }
            Op::Take(a) => {
                let (me, _) = self.sides(*a);
                if me.untaken == 0 {
                    return false;
                }
                me.untaken -= 1;
                me.s.taken();
                true
            }
            Op::Repost(a) => {
                let (me, _) = self.sides(*a);
                let waiting = me.s.reposts_waiting();
                me.s.repost_deferred();
                waiting
            }
            Op::Tick(a, secs) => {
                let (me, _) = self.sides(*a);
                me.now += Duration::from_secs(u64::from(*secs));
                me.s.tick(me.now);
                false
            }
            Op::Close(a) => {
                let (me, _) = self.sides(*a);
                me.s.close(CloseReason::Disconnected);
                true
            }
            Op::Lie(a, lie) => self.lie(*a, lie),
            Op::NoMemory(a) => {
                let (me, _) = self.sides(*a);
                me.no_memory = true;
                false
            }
            Op::NoBind(a) => {
                let (me, _) = self.sides(*a);
                me.no_bind = true;
                false
            }
            Op::SlowTarget(a) => {
                let (me, _) = self.sides(*a);
                me.slow_target = true;
                false
            }
            Op::Registered(a, ok) => {
                let (me, _) = self.sides(*a);
                let Some(id) = me.registering.pop_front() else {
                    return false;
                };
                if *ok {
                    me.s.target_ready(id);
                } else {
                    me.reading.remove(&id);
                    me.s.no_read_target(id);
                }
                true
            }
        }
    }

    /// Side `a` sends a message of `len` bytes, eager or not. An eager one of odd
    /// length takes the fast path when it may ([`Session::send_eager_now`]); every
    /// eager one checks that path against `send` in the same state.
    pub(super) fn send(&mut self, a: bool, eager: bool, len: u16) -> bool {
        let (me, _) = self.sides(a);
        if eager {
            if let Some((id, slot, header)) = fast_path_as_send(&me.s, u64::from(len)) {
                if len % 2 == 1 {
                    assert_eq!(
                        me.s.send_eager_now(u64::from(len)),
                        Some((id, slot, header))
                    );
                    me.sent.push(id);
                    me.sent_len.insert(id, u64::from(len));
                    // What `drain` does with the Post it stands for.
                    me.wire.push_back((slot, Kind::Eager, header));
                    return true;
                }
            }
        }
        match me.s.send(eager, u64::from(len), pinned(len)) {
            Ok(id) => {
                me.sent.push(id);
                me.sent_len.insert(id, u64::from(len));
                true
            }
            Err(Refused::Full | Refused::TransportFull) => false,
            Err(Refused::Closed(_)) => {
                assert!(me.closed.is_some());
                false
            }
        }
    }

    /// The peer's next SEND arrives at side `a`, in the lowest posted slot.
    pub(super) fn arrive(&mut self, a: bool) -> bool {
        let (me, peer) = self.sides(a);
        let Some((from_slot, kind, header)) = peer.wire.pop_front() else {
            return false;
        };
        if me.destroyed {
            return true; // lost with the QP; the peer's SEND never completes
        }
        let slot = me
            .posted
            .iter()
            .position(|p| *p)
            .expect("a SEND arrived with no receive posted (RNR)");
        me.posted[slot] = false;
        peer.send_done.push_back(from_slot);
        let invalidated = kind == Kind::Ack && me.remote_inv;
        if kind == Kind::Ack {
            let id = header.msg_id;
            assert_eq!(
                header.rkey,
                id as u32 ^ 0x5a5a,
                "ACK names message {id}'s key"
            );
            let w = me.windows.get_mut(&id).expect("ACK of a bound message");
            if invalidated {
                assert!(w.2, "ACK of message {id}, whose window is gone");
                w.2 = false;
            }
        }
        // Odd ids of eager messages take the fast path when they may; every
        // arrival checks that path against `on_control` in the same state.
        if let Some(id) = fast_path_as_arrival(&me.s, slot as u32, kind, &header, invalidated) {
            if id % 2 == 1 {
                assert_eq!(me.s.on_eager_now(slot as u32, &header), Some(id));
                // What `drain` does with the `Deliver` it stands for.
                assert!(me.closed.is_none(), "delivery after close");
                assert!(!me.delivered.contains(&id), "delivered twice");
                me.delivered.push(id);
                me.untaken += 1;
                return true;
            }
        }
        me.s.on_control(slot as u32, kind, &header, invalidated);
        true
    }

    /// Side `a`'s oldest READ completes; it must have read what the peer granted.
    pub(super) fn read_done(&mut self, a: bool) -> bool {
        let (me, peer) = self.sides(a);
        let Some((id, addr, rkey, len)) = me.reads.pop_front() else {
            return false;
        };
        if me.destroyed {
            return true;
        }
        // The peer's window must grant exactly this: bound, valid, in range.
        let (wid, w) = peer
            .windows
            .iter()
            .find(|(wid, _)| **wid as u32 ^ 0x5a5a == rkey)
            .map(|(k, v)| (*k, *v))
            .expect("a READ with a key the peer never granted");
        assert!(
            w.2 || peer.destroyed,
            "READ of message {wid} after its window was invalidated"
        );
        assert!(
            addr >= w.0 && addr + u64::from(len) <= w.0 + w.1,
            "READ outside the window"
        );
        me.s.on_read_done(id);
        true
    }

    /// A hostile peer's control message arrives at side `a`: the session must close,
    /// with a protocol error (or as disconnected, for an early goodbye).
    pub(super) fn lie(&mut self, a: bool, lie: &Lie) -> bool {
        let (me, _) = self.sides(a);
        let Some(slot) = me.posted.iter().position(|p| *p) else {
            return false;
        };
        if me.s.closed().is_some() {
            return false;
        }
        me.posted[slot] = false;
        // A peer holding no credit may send nothing at all, not even a goodbye.
        let over = me.s.granted == 0;
        let (kind, h) = lie_message(lie, me.s.received_upto, me.s.spent);
        let invalidated = matches!(lie, Lie::InvalidatingCredit);
        assert_eq!(
            fast_path_as_arrival(&me.s, slot as u32, kind, &h, invalidated),
            None,
            "the fast path takes no lie"
        );
        me.s.on_control(slot as u32, kind, &h, invalidated);
        me.drain();
        match me.closed.as_ref().expect("a lie closes the session") {
            reason if over => assert_eq!(reason, &over_credits()),
            CloseReason::Protocol(_) => assert!(!matches!(lie, Lie::Bye)),
            CloseReason::PeerDisconnected => assert!(matches!(lie, Lie::Bye)),
            other => panic!("unexpected reason {other:?}"),
        }
        true
    }

    /// Runs every possible step until nothing moves.
    pub(super) fn quiesce(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            for a in [true, false] {
                for op in [
                    Op::Arrive(a),
                    Op::SendDone(a),
                    Op::ReadDone(a),
                    Op::Invalidated(a),
                    Op::Take(a),
                    Op::Repost(a),
                    Op::Registered(a, true),
                ] {
                    while self.step(&op) {
                        moved = true;
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("no quiescence");
    }

    /// The end state of a world whose sides stayed open.
    pub(super) fn check_done(&self) {
        for (me, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            assert!(me.closed.is_none());
            // A read message the peer could not hold (its budget was full, or no
            // memory could be registered for it) is refused with ACK_BUSY, and one
            // whose window could not be bound is withdrawn: the sender is told, and
            // those are the only ones not delivered.
            let busy = Err(CloseReason::PeerRefused(ACK_BUSY));
            let unsent = |id: &u64| {
                matches!(
                    me.finished.get(id),
                    Some(Err(CloseReason::NotRegistered(_)))
                )
            };
            let expected: Vec<u64> = me
                .sent
                .iter()
                .copied()
                .filter(|id| me.finished.get(id) != Some(&busy) && !unsent(id))
                .collect();
            assert_eq!(
                peer.delivered, expected,
                "every message delivered once, in order"
            );
            for id in &me.sent {
                if me.s.eager_done() >= *id && !me.windows.contains_key(id) {
                    continue; // eager, done
                }
                let result = me.finished.get(id).expect("every read message finished");
                assert!(
                    result.is_ok() || result == &busy || unsent(id),
                    "message {id}: {result:?}"
                );
                assert!(me.released.contains(id), "message {id} released");
            }
            assert!(me.s.idle(), "nothing left in flight");
            assert!(
                me.posted.iter().all(|p| *p),
                "every receive slot posted again"
            );
        }
    }

    /// The end state whatever happened: nothing released twice (checked as it went),
    /// a closed side released or discarded everything, and delivered nothing after.
    pub(super) fn check_closed(&self) {
        for me in [&self.a, &self.b] {
            if me.closed.is_none() {
                continue;
            }
            assert!(me.destroyed);
            for id in me.windows.keys() {
                assert!(
                    me.released.contains(id),
                    "message {id} of a closed side released"
                );
            }
            assert!(
                me.reading.is_empty(),
                "READ targets of a closed side discarded"
            );
        }
    }
}

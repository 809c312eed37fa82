//! Two session cores talking through a simulated RC wire, driven by random
//! interleavings (proptest): sends of both kinds from both sides, arrivals, SEND,
//! READ and invalidation completions, the application taking messages, deferred
//! reposts, time, closes, and hostile control messages. After every step and at the
//! end the properties of the module documentation are checked.

use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const CREDITS: u32 = 8;
const SLOTS: u32 = 6;

fn params() -> Params {
    Params {
        credits: CREDITS,
        peer_credits: CREDITS,
        send_slots: SLOTS,
        read_chunk: 1000,
        reads_in_flight: 3,
        max_out_messages: 12,
        max_out_bytes: 20_000,
        max_in_bytes: 13_000,
        // A session of its own: its floor within the reserve, the rest shared.
        all_in: Arc::new(SharedBudget::with_reserve(1 << 40, 4_096)),
        in_floor: 4_096,
        all_out: Arc::new(SharedBudget::new(u64::MAX)),
        ack_timeout: Duration::from_secs(5),
        windows: 3,
    }
}

/// What the driver of one side saw and holds.
struct Side {
    s: Session,
    posted: Vec<bool>,
    /// SENDs on the wire to the peer: sender's slot, type, header.
    wire: VecDeque<(u32, Kind, Control)>,
    /// Our SENDs the peer received, whose completions may be reported.
    send_done: VecDeque<u32>,
    /// Our READs posted: id, peer's address, key, length.
    reads: VecDeque<(u64, u64, u32, u32)>,
    invalidations: VecDeque<u64>,
    /// Our messages' windows: (address, length, valid).
    windows: HashMap<u64, (u64, u64, bool)>,
    /// Sent and not refused: id, and whether it was eager.
    sent: Vec<u64>,
    sent_len: HashMap<u64, u64>,
    delivered: Vec<u64>,
    untaken: usize,
    finished: HashMap<u64, Result<(), CloseReason>>,
    released: HashSet<u64>,
    discarded: HashSet<u64>,
    reading: HashMap<u64, u64>,
    destroyed: bool,
    closed: Option<CloseReason>,
    last_bind: Option<u64>,
    now: Instant,
    /// The peer's acknowledgements invalidate our windows (SEND_WITH_INV, as
    /// kiara-ib's do); else each needs our LOCAL_INV.
    remote_inv: bool,
}

impl Side {
    fn new(t0: Instant, remote_inv: bool) -> Side {
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
        }
    }

    /// Carries out every action the core asked for.
    fn drain(&mut self) {
        while let Some(a) = self.s.next_action() {
            match a {
                Action::Bind(id) => {
                    assert!(!self.destroyed, "bind after the QP is gone");
                    let len = self.sent_len[&id];
                    assert!(
                        self.windows.insert(id, (id << 32, len, true)).is_none(),
                        "bound twice"
                    );
                    self.last_bind = Some(id);
                }
                Action::Post {
                    slot,
                    kind,
                    mut header,
                } => {
                    assert!(!self.destroyed, "post after the QP is gone");
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

    fn check(&self) {
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
enum Lie {
    RepeatedId,
    IdFarAhead,
    AckOfNothing,
    TooManyCredits,
    EagerTooManyCredits,
    Bye,
    InvalidatingCredit,
}

#[derive(Clone, Debug)]
enum Op {
    Send { a: bool, eager: bool, len: u16 },
    Arrive(bool),
    SendDone(bool),
    ReadDone(bool),
    Invalidated(bool),
    Take(bool),
    Repost(bool),
    Tick(bool, u8),
    Close(bool),
    Lie(bool, Lie),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), any::<bool>(), 1..6000u16).prop_map(|(a, eager, len)| Op::Send { a, eager, len }),
        6 => any::<bool>().prop_map(Op::Arrive),
        3 => any::<bool>().prop_map(Op::SendDone),
        3 => any::<bool>().prop_map(Op::ReadDone),
        2 => any::<bool>().prop_map(Op::Invalidated),
        3 => any::<bool>().prop_map(Op::Take),
        2 => any::<bool>().prop_map(Op::Repost),
        1 => (any::<bool>(), 0..8u8).prop_map(|(a, s)| Op::Tick(a, s)),
    ]
}

fn hostile_op() -> impl Strategy<Value = Op> {
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
fn lie_message(lie: &Lie, upto: u64, spent: u32) -> (Kind, Control) {
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

struct World {
    a: Side,
    b: Side,
}

impl World {
    fn new() -> World {
        World::with(true, true)
    }

    /// Whether acknowledgements arriving at `a` and at `b` invalidate the window.
    fn with(a_inv: bool, b_inv: bool) -> World {
        let t0 = Instant::now();
        World {
            a: Side::new(t0, a_inv),
            b: Side::new(t0, b_inv),
        }
    }

    /// [`World::with`], where `a` connected and greets (its CREDIT is on the wire)
    /// and `b` accepted and awaits the greeting for `within`.
    fn greeted(a_inv: bool, b_inv: bool, within: Duration) -> World {
        let mut w = World::with(a_inv, b_inv);
        w.a.s.greet();
        w.b.s.await_greeting(within);
        w.a.drain();
        w
    }

    fn sides(&mut self, a: bool) -> (&mut Side, &mut Side) {
        if a {
            (&mut self.a, &mut self.b)
        } else {
            (&mut self.b, &mut self.a)
        }
    }

    /// Applies one step, then carries out what the sessions asked for and checks
    /// their invariants; returns whether anything happened. (A step that finds
    /// nothing to do calls no session, so the drain after it has nothing to carry out.)
    fn step(&mut self, op: &Op) -> bool {
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
    fn check_granted(&self) {
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
    fn apply(&mut self, op: &Op) -> bool {
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
        }
    }

    /// Side `a` sends a message of `len` bytes, eager or not. An eager one of odd
    /// length takes the fast path when it may ([`Session::send_eager_now`]); every
    /// eager one checks that path against `send` in the same state.
    fn send(&mut self, a: bool, eager: bool, len: u16) -> bool {
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
    fn arrive(&mut self, a: bool) -> bool {
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
    fn read_done(&mut self, a: bool) -> bool {
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
    fn lie(&mut self, a: bool, lie: &Lie) -> bool {
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
    fn quiesce(&mut self) {
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
    fn check_done(&self) {
        for (me, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            assert!(me.closed.is_none());
            // A read message the peer could not hold (its budget was full) is refused
            // with ACK_BUSY: the sender is told, and it is the only kind not delivered.
            let busy = Err(CloseReason::PeerRefused(ACK_BUSY));
            let expected: Vec<u64> = me
                .sent
                .iter()
                .copied()
                .filter(|id| me.finished.get(id) != Some(&busy))
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
                    result.is_ok() || result == &busy,
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
    fn check_closed(&self) {
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

/// Checks [`Session::send_eager_now`] in `s`'s state against `send`, on copies:
/// when it takes the message, `send` gives the same id and queues exactly the
/// `Post` it returned, and both leave the same state behind; when it declines, it
/// changed nothing. Returns what it returned.
fn fast_path_as_send(s: &Session, len: u64) -> Option<(u64, u32, Control)> {
    let mut fast = s.clone();
    let got = fast.send_eager_now(len);
    let Some((id, slot, header)) = got else {
        assert_eq!(
            format!("{fast:?}"),
            format!("{s:?}"),
            "a declined fast path changed the session"
        );
        return None;
    };
    let mut model = s.clone();
    assert_eq!(model.send(true, len, 0), Ok(id), "the fast path's id");
    let post = Action::Post {
        slot,
        kind: Kind::Eager,
        header,
    };
    assert_eq!(model.next_action(), Some(post), "send's action");
    assert_eq!(
        model.next_action(),
        None,
        "send queued more than the one Post"
    );
    assert_eq!(
        format!("{fast:?}"),
        format!("{model:?}"),
        "the state after either path"
    );
    got
}

/// Checks [`Session::on_eager_now`] in `s`'s state against `on_control`, on
/// copies, for a control message arriving in `slot` (the driver offers the fast
/// path only eager messages without an invalidation): when it takes the message,
/// `on_control` queues its `Deliver` first and then exactly what the fast path
/// queued, and both leave the same state behind; when it declines, it changed
/// nothing. Returns what it returned.
fn fast_path_as_arrival(
    s: &Session,
    slot: u32,
    kind: Kind,
    h: &Control,
    invalidated: bool,
) -> Option<u64> {
    if kind != Kind::Eager || invalidated {
        return None;
    }
    let mut fast = s.clone();
    let got = fast.on_eager_now(slot, h);
    let Some(id) = got else {
        assert_eq!(
            format!("{fast:?}"),
            format!("{s:?}"),
            "a declined fast path changed the session"
        );
        return None;
    };
    assert_eq!(id, h.msg_id, "the fast path's id");
    let mut model = s.clone();
    model.on_control(slot, kind, h, invalidated);
    assert_eq!(
        model.next_action(),
        Some(Action::Deliver(id)),
        "delivered first"
    );
    assert_eq!(
        format!("{fast:?}"),
        format!("{model:?}"),
        "the state and the actions after either path"
    );
    got
}

/// The DATA descriptor of message `id` (`len` bytes) arrives at `s`, in receive
/// slot `id - 1`.
fn data_arrives(s: &mut Session, id: u64, len: u64) {
    let h = Control {
        kind: Some(Kind::Data),
        msg_id: id,
        len,
        addr: id << 32,
        rkey: id as u32,
        ..Default::default()
    };
    s.on_control(id as u32 - 1, Kind::Data, &h, false);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Honest peers: whatever the interleaving, everything is delivered, in order,
    /// once, no SEND ever meets an empty receive queue, and nothing is left over.
    #[test]
    fn honest_peers_deliver_everything_in_order(
        ops in prop::collection::vec(op(), 1..300),
        inv in any::<(bool, bool)>(),
    ) {
        let mut w = World::greeted(inv.0, inv.1, Duration::from_secs(3600));
        for op in &ops {
            if let Op::Tick(..) = op { continue; } // no timeouts between honest peers
            w.step(op);
        }
        w.quiesce();
        w.check_done();
    }

    /// Lies, closes and timeouts: never a panic, a delivery after close or a buffer
    /// released twice or early; a lying side is closed with the reason.
    #[test]
    fn lies_and_closes_lose_nothing_twice(
        ops in prop::collection::vec(hostile_op(), 1..300),
        inv in any::<(bool, bool)>(),
    ) {
        // A deadline the ticks may pass before the greeting arrives, or not.
        let mut w = World::greeted(inv.0, inv.1, Duration::from_secs(20));
        for op in &ops {
            w.step(op);
        }
        w.quiesce();
        w.check_closed();
    }
}

#[test]
fn an_accepted_peer_that_never_greets_is_closed_after_the_timeout() {
    let within = Duration::from_secs(10);
    let mut w = World::new();
    w.b.s.await_greeting(within);
    assert_eq!(w.b.s.next_deadline(), Some(w.b.now + within));
    w.b.now += within - Duration::from_millis(1);
    w.b.s.tick(w.b.now);
    w.b.drain();
    assert!(w.b.closed.is_none());
    w.b.now += Duration::from_millis(1);
    w.b.s.tick(w.b.now);
    w.b.drain();
    assert_eq!(w.b.closed, Some(CloseReason::Silent { after: within }));
    assert!(w.b.destroyed);
}

#[test]
fn the_greeting_is_a_credit_and_any_message_ends_the_wait() {
    for eager_first in [false, true] {
        let within = Duration::from_secs(10);
        let mut w = World::new();
        w.b.s.await_greeting(within);
        if eager_first {
            // A peer that sends a message before (or instead of) its greeting.
            assert!(w.send(true, true, 10));
        } else {
            w.a.s.greet();
            assert!(!w.a.s.greeted(), "greeted before the SEND completed");
        }
        w.a.drain();
        let (_, kind, h) = *w.a.wire.front().expect("the greeting is on the wire");
        let expected = if eager_first {
            Kind::Eager
        } else {
            Kind::Credit
        };
        assert_eq!((kind, h.credits), (expected, 0));
        assert!(w.arrive(false));
        w.b.drain();
        w.check_granted();
        assert_eq!(w.b.s.next_deadline(), None);
        assert!(w.step(&Op::SendDone(true)));
        assert!(w.a.s.greeted(), "the greeting's SEND completed");
        w.b.now += 2 * within;
        w.b.s.tick(w.b.now);
        w.b.drain();
        assert!(w.b.closed.is_none(), "{:?}", w.b.closed);
    }
}

#[test]
fn a_peer_that_never_acks_is_closed_after_the_timeout() {
    let mut w = World::new();
    let id = w.a.s.send(false, 5000, 5000).unwrap();
    w.a.sent.push(id);
    w.a.sent_len.insert(id, 5000);
    w.a.drain();
    assert_eq!(w.a.s.next_deadline(), Some(w.a.now + params().ack_timeout));
    // The driver's next sweep, a second later: the core's clock said the
    // descriptor went out at the last tick, so it is timed from this one.
    w.a.now += Duration::from_secs(1);
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert_eq!(w.a.s.next_deadline(), Some(w.a.now + params().ack_timeout));
    w.a.now += Duration::from_secs(4);
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert!(w.a.closed.is_none());
    w.a.now += Duration::from_secs(1);
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert_eq!(
        w.a.closed,
        Some(CloseReason::AckTimeout {
            id,
            after: params().ack_timeout
        })
    );
    assert_eq!(
        w.a.finished.get(&id),
        Some(&Err(w.a.closed.clone().unwrap()))
    );
    assert!(w.a.released.contains(&id) && w.a.destroyed);
}

#[test]
fn send_pushes_back_at_the_caps() {
    let mut s = Session::new(params(), Instant::now());
    assert!(s.send(false, 15_000, 15_000).is_ok());
    assert_eq!(s.send(false, 6_000, 6_000), Err(Refused::Full), "bytes cap");
    for _ in 0..11 {
        assert!(s.send(true, 10, 0).is_ok());
    }
    assert_eq!(s.send(true, 10, 0), Err(Refused::Full), "message cap");
    s.close(CloseReason::Disconnected);
    assert_eq!(
        s.send(true, 1, 0),
        Err(Refused::Closed(CloseReason::Disconnected))
    );
}

#[test]
fn a_message_over_the_receive_budget_is_refused_with_busy() {
    let mut w = World::new();
    for len in [5000u16, 5000] {
        let id = w.a.s.send(false, u64::from(len), u64::from(len)).unwrap();
        w.a.sent.push(id);
        w.a.sent_len.insert(id, u64::from(len));
    }
    w.a.drain();
    // Both descriptors arrive before B's application takes anything: the second
    // would hold 10,000 bytes > 9,000.
    w.step(&Op::Arrive(false));
    w.step(&Op::Arrive(false));
    w.quiesce();
    assert_eq!(w.a.finished.get(&1), Some(&Ok(())));
    assert_eq!(
        w.a.finished.get(&2),
        Some(&Err(CloseReason::PeerRefused(ACK_BUSY)))
    );
    assert_eq!(w.b.delivered, vec![1]);
    assert!(w.a.released.contains(&2));
}

#[test]
fn the_fast_path_takes_an_eager_message_only_when_nothing_is_ahead_of_it() {
    let mut s = Session::new(params(), Instant::now());
    assert!(fast_path_as_send(&s, 10).is_some(), "a quiet session");
    // A read message's Bind and Post are not carried out yet: an eager message
    // must go behind them.
    s.send(false, 100, 100).unwrap();
    assert_eq!(fast_path_as_send(&s, 10), None, "actions waiting");
    while s.next_action().is_some() {}
    // The credits run down to the reserve: the next eager message waits in the
    // queue, and one after it must not pass it.
    let mut taken = 0;
    while s.send_eager_now(10).is_some() {
        taken += 1;
    }
    assert_eq!(taken, CREDITS - 1 - DATA_RESERVE, "credits kept in reserve");
    s.send(true, 10, 0).unwrap();
    assert_eq!(
        fast_path_as_send(&s, 10),
        None,
        "a message queued for credits"
    );
    s.close(CloseReason::Disconnected);
    assert_eq!(fast_path_as_send(&s, 10), None, "a closed session");
}

#[test]
fn the_fast_arrival_declines_a_slot_not_posted_and_changes_nothing() {
    let mut s = Session::new(params(), Instant::now());
    let h = Control {
        kind: Some(Kind::Eager),
        msg_id: 1,
        len: 1,
        ..Default::default()
    };
    for slot in [CREDITS, CREDITS + 7, u32::MAX] {
        assert_eq!(fast_path_as_arrival(&s, slot, Kind::Eager, &h, false), None);
    }
    assert_eq!(s.on_eager_now(0, &h), Some(1), "slot 0 is posted");
    assert_eq!(s.next_action(), None, "nothing else to do");
    let again = Control { msg_id: 2, ..h };
    assert_eq!(
        fast_path_as_arrival(&s, 0, Kind::Eager, &again, false),
        None,
        "slot 0 is no longer posted"
    );
    s.on_control(0, Kind::Eager, &again, false);
    assert!(matches!(s.closed(), Some(CloseReason::Protocol(_))));
}

/// The peer's eager message `id` arrives in slot 0, which the driver then reposts
/// at once (as after a delivery, before the application takes the message).
fn eager_arrives_and_slot_returns(s: &mut Session, id: u64) {
    let h = Control {
        kind: Some(Kind::Eager),
        msg_id: id,
        len: 1,
        ..Default::default()
    };
    s.on_control(0, Kind::Eager, &h, false);
    s.repost_deferred();
}

#[test]
fn a_peer_past_its_credits_is_cut_off_though_slots_are_posted() {
    let mut s = Session::new(params(), Instant::now());
    // The application takes nothing, so no credit goes back: the peer may send
    // exactly CREDITS messages, although its slot is posted again each time.
    for id in 1..=u64::from(CREDITS) {
        eager_arrives_and_slot_returns(&mut s, id);
        assert_eq!(s.closed(), None, "message {id} is within the credits");
    }
    eager_arrives_and_slot_returns(&mut s, u64::from(CREDITS) + 1);
    assert_eq!(s.closed(), Some(&over_credits()));
    let delivered = std::iter::from_fn(|| s.next_action())
        .filter(|a| matches!(a, Action::Deliver(_)))
        .count();
    assert_eq!(
        delivered, CREDITS as usize,
        "nothing past the credits delivered"
    );
}

#[test]
fn a_credit_taken_and_returned_lets_the_peer_send_one_more() {
    let mut s = Session::new(params(), Instant::now());
    for id in 1..=u64::from(CREDITS) {
        eager_arrives_and_slot_returns(&mut s, id);
    }
    // The application takes two: their credits go back in a CREDIT.
    s.taken();
    s.taken();
    let returned: u32 = std::iter::from_fn(|| s.next_action())
        .filter_map(|a| match a {
            Action::Post {
                kind: Kind::Credit,
                header,
                ..
            } => Some(header.credits),
            _ => None,
        })
        .sum();
    assert_eq!(returned, 2);
    for id in u64::from(CREDITS) + 1..=u64::from(CREDITS) + 2 {
        eager_arrives_and_slot_returns(&mut s, id);
        assert_eq!(s.closed(), None, "message {id} uses a returned credit");
    }
    eager_arrives_and_slot_returns(&mut s, u64::from(CREDITS) + 3);
    assert_eq!(s.closed(), Some(&over_credits()));
}

#[test]
fn seen_vouches_only_for_eager_messages_posted() {
    let mut s = Session::new(
        Params {
            peer_credits: DATA_RESERVE + 1,
            ..params()
        },
        Instant::now(),
    );
    // One eager message goes out; the credits then sit at the reserve, so the
    // next five wait in the queue.
    for _ in 0..6 {
        s.send(true, 10, 0).unwrap();
    }
    while s.next_action().is_some() {}
    assert_eq!(s.pending.len(), 5);
    // A CREDIT that returns nothing but claims to have seen all six.
    let h = Control {
        kind: Some(Kind::Credit),
        seen: 6,
        ..Default::default()
    };
    s.on_control(0, Kind::Credit, &h, false);
    assert_eq!(s.closed(), None);
    assert_eq!(s.eager_done(), 1, "only the posted message is done");
    assert_eq!(
        s.out_messages, 5,
        "the queued ones still count against the cap"
    );
}

#[test]
fn the_acks_of_reads_in_flight_together_go_as_one() {
    let mut w = World::new();
    for _ in 0..3 {
        let id = w.a.s.send(false, 900, 900).unwrap();
        w.a.sent.push(id);
        w.a.sent_len.insert(id, 900);
    }
    w.a.drain();
    for _ in 0..3 {
        assert!(w.step(&Op::Arrive(false)), "a descriptor arrives at b");
    }
    assert_eq!(w.b.reads.len(), 3, "three READs in flight");
    let acks = |w: &World| {
        w.b.wire
            .iter()
            .filter(|(_, kind, _)| *kind == Kind::Ack)
            .map(|(_, _, h)| h.msg_id)
            .collect::<Vec<_>>()
    };
    // Messages 1 and 2 are delivered while the next one's READ is still in flight:
    // their ACKs wait for it.
    for delivered in 1..=2u64 {
        assert!(w.step(&Op::ReadDone(false)));
        assert_eq!(w.b.delivered.last(), Some(&delivered));
        assert_eq!(acks(&w), Vec::<u64>::new(), "ACK of {delivered} held");
    }
    assert!(w.step(&Op::ReadDone(false)));
    assert_eq!(acks(&w), vec![3], "one ACK, of the last, for all three");
    w.quiesce();
    for id in 1..=3 {
        assert_eq!(w.a.finished.get(&id), Some(&Ok(())), "message {id}");
        assert!(w.a.released.contains(&id), "message {id} released");
    }
    w.check_done();
}

#[test]
fn a_delivered_ack_stands_for_every_earlier_message_in_flight() {
    let mut s = Session::new(params(), Instant::now());
    for _ in 0..3 {
        s.send(false, 900, 900).unwrap();
    }
    while s.next_action().is_some() {}
    let ack = |id: u64| Control {
        kind: Some(Kind::Ack),
        msg_id: id,
        rkey: id as u32 ^ 0x5a5a,
        ..Default::default()
    };
    s.on_control(0, Kind::Ack, &ack(2), false);
    let actions: Vec<Action> = std::iter::from_fn(|| s.next_action()).collect();
    assert_eq!(
        actions,
        vec![
            Action::Invalidate(1),
            Action::Invalidate(2),
            Action::Repost(0)
        ],
        "message 1 is acknowledged with 2"
    );
    // Message 1 is no longer in flight: an ACK naming it is a lie.
    s.on_control(1, Kind::Ack, &ack(1), false);
    assert!(
        matches!(s.closed(), Some(CloseReason::Protocol(why)) if why.contains("message 1, which is not in flight")),
        "{:?}",
        s.closed()
    );
}

#[test]
fn an_ack_does_not_wait_for_a_large_message() {
    let p = Params {
        max_in_bytes: 1 << 30,
        read_chunk: 1 << 20,
        ..params()
    };
    let mut s = Session::new(p, Instant::now());
    let len = ACK_HOLD_BYTES + 1;
    for id in 1..=2u64 {
        data_arrives(&mut s, id, len);
    }
    while s.next_action().is_some() {}
    s.on_read_done(1);
    let acked: Vec<u64> = std::iter::from_fn(|| s.next_action())
        .filter_map(|a| match a {
            Action::Post {
                kind: Kind::Ack,
                header,
                ..
            } => Some(header.msg_id),
            _ => None,
        })
        .collect();
    assert_eq!(acked, vec![1], "message 2's READ is too long to wait for");
}

#[test]
fn held_acks_go_out_before_a_goodbye() {
    let mut s = Session::new(params(), Instant::now());
    for id in 1..=2u64 {
        data_arrives(&mut s, id, 900);
    }
    while s.next_action().is_some() {}
    s.on_read_done(1);
    let posts = |s: &mut Session| {
        std::iter::from_fn(|| s.next_action())
            .filter_map(|a| match a {
                Action::Post { kind, header, .. } => Some((kind, header.msg_id)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        posts(&mut s),
        vec![],
        "message 1's ACK waits for message 2's"
    );
    s.bye();
    assert_eq!(
        posts(&mut s),
        vec![(Kind::Ack, 1), (Kind::Bye, 0)],
        "the held ACK leaves before the goodbye"
    );
}

/// Params whose sessions charge the peers' read messages to `budget`, each with a
/// floor of `in_floor` bytes and no cap of its own that matters (1 MiB READs).
fn budgeted(budget: &Arc<SharedBudget>, in_floor: u64) -> Params {
    Params {
        max_in_bytes: 1 << 30,
        read_chunk: 1 << 20,
        all_in: budget.clone(),
        in_floor,
        ..params()
    }
}

/// The transport's budget for all sessions refuses a message the session's own
/// budget would take (with ACK_BUSY, charging nothing), and every byte a session
/// charged comes back: when the application takes the message, and at the close
/// for what it still held. A message is charged the buffer it pins: its length
/// rounded up to a power of two, at least 4 KiB.
#[test]
fn the_transport_budget_refuses_with_busy_and_gets_every_byte_back() {
    let budget = Arc::new(SharedBudget::new(24_576));
    assert!(budget.try_charge(8_192), "another session's bytes");
    let p = budgeted(&budget, 0);
    let mut s = Session::new(p, Instant::now());
    data_arrives(&mut s, 1, 5_000);
    assert_eq!(budget.used(), 16_384, "5,000 bytes pin a buffer of 8 KiB");
    data_arrives(&mut s, 2, 9_000);
    let busy = busy_ids(&mut s);
    assert_eq!(busy, vec![2], "message 2 (16 KiB pinned) refused as busy");
    assert_eq!(budget.used(), 16_384, "the refused message charged nothing");
    s.on_read_done(1);
    while s.next_action().is_some() {}
    s.taken();
    assert_eq!(budget.used(), 8_192, "the taken message's bytes came back");
    data_arrives(&mut s, 3, 1);
    assert_eq!(budget.used(), 12_288, "one byte pins 4 KiB");
    s.close(CloseReason::Shutdown);
    assert_eq!(
        budget.used(),
        8_192,
        "the close gave back what the session held"
    );
    s.taken();
    assert_eq!(budget.used(), 8_192, "nothing is given back twice");
}

/// A close gives back the bytes of messages being read at once, but a message
/// delivered and not yet taken keeps its charge until the application takes it
/// (its buffer is pinned until then), or the session is let go.
#[test]
fn a_closed_session_keeps_the_charge_of_what_waits_to_be_taken() {
    let budget = Arc::new(SharedBudget::new(1 << 30));
    let p = budgeted(&budget, 0);
    let mut s = Session::new(p.clone(), Instant::now());
    data_arrives(&mut s, 1, 8_192);
    s.on_read_done(1);
    data_arrives(&mut s, 2, 4_096);
    assert_eq!(budget.used(), 12_288);
    s.close(CloseReason::PeerDisconnected);
    assert_eq!(
        budget.used(),
        8_192,
        "message 2's READ was dropped, message 1 waits"
    );
    s.taken();
    assert_eq!(budget.used(), 0, "taken after the close");
    let mut s = Session::new(p, Instant::now());
    data_arrives(&mut s, 1, 8_192);
    s.on_read_done(1);
    s.close(CloseReason::PeerDisconnected);
    s.release_held();
    assert_eq!(budget.used(), 0, "let go with the message untaken");
}

/// The peer's message whose READs do not finish within `ack_timeout` of the
/// first tick after it arrived closes the session, naming it; one whose READ
/// finishes in time does not.
#[test]
fn a_message_that_cannot_be_read_in_time_closes_the_session() {
    let p = Params {
        read_chunk: 1 << 20,
        ..params()
    };
    let t0 = Instant::now();
    let mut s = Session::new(p.clone(), t0);
    data_arrives(&mut s, 1, 900);
    assert_eq!(s.next_deadline(), None, "not timed before a tick");
    s.tick(t0);
    assert_eq!(s.next_deadline(), Some(t0 + p.ack_timeout));
    s.tick(t0 + p.ack_timeout - Duration::from_millis(1));
    assert_eq!(s.closed(), None);
    s.tick(t0 + p.ack_timeout);
    assert_eq!(
        s.closed(),
        Some(&CloseReason::ReadTimeout {
            id: 1,
            after: p.ack_timeout
        })
    );
    let mut s = Session::new(p.clone(), t0);
    data_arrives(&mut s, 1, 900);
    s.tick(t0);
    s.on_read_done(1);
    s.tick(t0 + 2 * p.ack_timeout);
    assert_eq!(s.closed(), None, "a message read in time");
}

/// The transport's budget for our read messages of all sessions: a send beyond it
/// is refused as `TransportFull` (charging nothing) though the session has room;
/// each message's bytes come back when its window is gone, the rest at the close
/// or when the session is let go; a message larger than the whole budget goes
/// alone.
#[test]
fn the_transport_budget_for_sending_is_shared_and_given_back() {
    let budget = Arc::new(SharedBudget::new(5_000));
    assert!(budget.try_charge(3_000), "another session's bytes");
    let p = Params {
        all_out: budget.clone(),
        ..params()
    };
    let mut w = World::new();
    w.a.s = Session::new(p.clone(), Instant::now());
    assert_eq!(w.a.s.send(false, 4_000, 4_000), Err(Refused::TransportFull));
    assert_eq!(budget.used(), 3_000, "a refused send charged nothing");
    let id =
        w.a.s
            .send(false, 2_000, 2_000)
            .expect("fits beside the other's");
    w.a.sent.push(id);
    w.a.sent_len.insert(id, 2_000);
    assert_eq!(
        w.a.s.send(true, 100, 0).map(|_| ()),
        Ok(()),
        "eager: not charged"
    );
    assert_eq!(budget.used(), 5_000);
    w.a.drain();
    w.quiesce();
    assert_eq!(
        w.a.finished.get(&id),
        Some(&Ok(())),
        "read and acknowledged"
    );
    assert_eq!(budget.used(), 3_000, "its bytes came back");
    budget.release(3_000);
    let mut s = Session::new(p.clone(), Instant::now());
    s.send(false, 9_000, 9_000)
        .expect("larger than the budget, alone");
    assert_eq!(s.send(false, 1, 1), Err(Refused::TransportFull));
    s.close(CloseReason::Shutdown);
    assert_eq!(budget.used(), 0, "the close gave it back");
    let mut s = Session::new(p, Instant::now());
    s.send(false, 700, 700).unwrap();
    s.release_held();
    assert_eq!(budget.used(), 0, "a session let go gives it back");
}

/// A read message is charged what its buffer pins, not its length: 1-byte
/// messages copied into 4 KiB pool buffers fill the transport's budget after
/// two, and their acknowledgement gives back exactly what was charged.
#[test]
fn our_read_messages_are_charged_what_they_pin() {
    let budget = Arc::new(SharedBudget::new(8_192));
    let p = Params {
        all_out: budget.clone(),
        ..params()
    };
    let mut w = World::new();
    w.a.s = Session::new(p, Instant::now());
    for _ in 0..2 {
        let id = w.a.s.send(false, 1, 4_096).expect("two buffers fit");
        w.a.sent.push(id);
        w.a.sent_len.insert(id, 1);
    }
    assert_eq!(budget.used(), 8_192, "charged their buffers");
    assert_eq!(w.a.s.send(false, 1, 4_096), Err(Refused::TransportFull));
    w.a.drain();
    w.quiesce();
    assert_eq!(w.a.finished.len(), 2, "both read and acknowledged");
    assert_eq!(budget.used(), 0, "their buffers came back");
}

/// What the model's read messages are charged: a buffer twice their length for
/// every third length (a pool copy), else their length (the caller's region).
fn pinned(len: u16) -> u64 {
    if len % 3 == 0 {
        2 * u64::from(len)
    } else {
        u64::from(len)
    }
}

/// The ids the session refused as busy since the last look at its actions.
fn busy_ids(s: &mut Session) -> Vec<u64> {
    std::iter::from_fn(|| s.next_action())
        .filter_map(|a| match a {
            Action::Post {
                kind: Kind::Ack,
                header,
                ..
            } if header.len == ACK_BUSY => Some(header.msg_id),
            _ => None,
        })
        .collect()
}

/// A session whose peer holds the whole shared part of the transport's budget
/// does not keep another session from its floor: the floors are a reserve apart.
/// The bytes that come back go where they were charged.
#[test]
fn a_session_keeps_its_floor_when_another_holds_the_shared_budget() {
    // Two sessions' floors of 4 KiB in the reserve, 12 KiB shared.
    let budget = Arc::new(SharedBudget::with_reserve(12_288, 8_192));
    let p = budgeted(&budget, 4_096);
    let (mut a, mut b) = (
        Session::new(p.clone(), Instant::now()),
        Session::new(p, Instant::now()),
    );
    for id in 1..=4 {
        data_arrives(&mut a, id, 4_096);
    }
    data_arrives(&mut a, 5, 4_096);
    assert_eq!(
        busy_ids(&mut a),
        vec![5],
        "a: its floor and all that is shared"
    );
    assert_eq!(budget.used(), 16_384);
    data_arrives(&mut b, 1, 4_096);
    data_arrives(&mut b, 2, 4_096);
    assert_eq!(
        busy_ids(&mut b),
        vec![2],
        "b: its floor, nothing shared left"
    );
    assert_eq!(budget.used(), 20_480);
    // a's peer's first message is read and taken: shared bytes come back (a is
    // above its floor), and b's next message fits.
    a.on_read_done(1);
    while a.next_action().is_some() {}
    a.taken();
    assert_eq!(budget.used(), 16_384);
    data_arrives(&mut b, 3, 4_096);
    assert_eq!(
        busy_ids(&mut b),
        Vec::<u64>::new(),
        "b got the shared bytes a gave back"
    );
    // Closing gives back everything each held, to where it came from.
    a.release_held();
    b.release_held();
    assert_eq!(budget.used(), 0);
    assert!(
        budget.try_charge_parts(12_288, 8_192),
        "all of both parts free again"
    );
}

/// A closed session's held bytes leave the floors' reserve, which is sized for the
/// live sessions: peers that close sessions holding their floors (the application
/// slow to take) cannot keep a new session from its own.
#[test]
fn a_closed_session_gives_its_floor_to_the_live_ones() {
    let budget = Arc::new(SharedBudget::with_reserve(4_096, 4_096));
    let p = budgeted(&budget, 4_096);
    let mut a = Session::new(p.clone(), Instant::now());
    data_arrives(&mut a, 1, 4_096);
    a.on_read_done(1);
    while a.next_action().is_some() {}
    a.close(CloseReason::PeerDisconnected);
    assert_eq!(budget.used(), 4_096, "held until taken");
    let mut b = Session::new(p, Instant::now());
    data_arrives(&mut b, 1, 4_096);
    assert_eq!(busy_ids(&mut b), Vec::<u64>::new(), "b's floor is free");
    a.taken();
    assert_eq!(
        budget.used(),
        4_096,
        "a's bytes came back from the shared part"
    );
    b.release_held();
    assert_eq!(budget.used(), 0);
    assert!(
        budget.try_charge_parts(4_096, 4_096),
        "both parts whole again"
    );
}

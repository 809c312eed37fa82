//! Named cases of the byte budgets: the transport's, shared by the sessions,
//! each session's floor, and what a close gives back.

use super::*;

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

/// The ids the session refused as busy since the last look at its actions.
fn busy_ids(s: &mut Session) -> Vec<u64> {
    let actions: Vec<Action> = std::iter::from_fn(|| s.next_action()).collect();
    busy_in(&actions)
}

/// The ids `actions` refuse as busy.
fn busy_in(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
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

/// A message whose READ target cannot be registered (the memlock limit) is
/// refused as busy, as one over the budgets is: none of its READs is posted, its
/// charge goes back, and the message behind it is read and delivered.
#[test]
fn a_message_with_no_read_target_is_refused_as_busy_and_the_next_goes_on() {
    let budget = Arc::new(SharedBudget::new(1 << 30));
    let mut s = Session::new(budgeted(&budget, 0), Instant::now());
    data_arrives(&mut s, 1, 3 << 20);
    data_arrives(&mut s, 2, 900);
    assert_eq!(budget.used(), (4 << 20) + 4_096);
    assert_eq!(
        s.next_action(),
        Some(Action::StartRead {
            id: 1,
            len: 3 << 20
        })
    );
    s.no_read_target(1);
    let actions: Vec<Action> = std::iter::from_fn(|| s.next_action()).collect();
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Read { id: 1, .. })),
        "no READ into the missing target: {actions:?}"
    );
    assert!(
        actions.contains(&Action::StartRead { id: 2, len: 900 }),
        "{actions:?}"
    );
    assert_eq!(busy_in(&actions), vec![1], "message 1 refused as busy");
    assert_eq!(budget.used(), 4_096, "its charge came back");
    s.on_read_done(2);
    let delivered: Vec<Action> = std::iter::from_fn(|| s.next_action()).collect();
    assert!(delivered.contains(&Action::Deliver(2)), "{delivered:?}");
    assert_eq!(s.closed(), None);
}

/// A read message whose window cannot be bound (the memlock limit) is withdrawn
/// alone: its descriptor's slot goes as a CREDIT naming its id, the peer counts
/// that id as come and delivers the next message, the sender's budgets and
/// window come back, and the message fails with why.
#[test]
fn a_message_whose_window_cannot_be_bound_is_withdrawn_alone() {
    let mut w = World::new();
    let first = w.a.s.send(false, 5_000, 8_192).unwrap();
    w.a.no_bind = true;
    w.a.drain();
    let second = w.a.s.send(false, 900, 4_096).unwrap();
    w.a.sent.push(second);
    w.a.sent_len.insert(second, 900);
    w.a.drain();
    assert_eq!(
        w.a.finished.get(&first),
        Some(&Err(CloseReason::NotRegistered("no memory".into())))
    );
    assert!(w.a.released.contains(&first), "its buffer released");
    assert_eq!(w.a.s.out_bytes, 4_096, "only the second is charged");
    let (_, kind, h) = w.a.wire.front().copied().unwrap();
    assert_eq!((kind, h.msg_id), (Kind::Credit, first), "the withdrawal");
    w.quiesce();
    assert_eq!(w.b.delivered, vec![second], "the next message delivered");
    assert_eq!(w.b.s.received_upto, second);
    assert!(w.a.closed.is_none() && w.b.closed.is_none());
    assert_eq!(w.a.finished.get(&second), Some(&Ok(())));
}

/// More consecutive withdrawals than the receiver's credits: each names its id,
/// which the receiver counts, so the next message is no jump ahead and is
/// delivered (as gaps, they would close the session past the credits).
#[test]
fn more_withdrawals_in_a_row_than_credits_leave_no_gap() {
    let mut w = World::new();
    let mut withdrawn = Vec::new();
    for _ in 0..=CREDITS {
        withdrawn.push(w.a.s.send(false, 5_000, 8_192).unwrap());
        w.a.no_bind = true;
        w.a.drain();
        w.quiesce();
    }
    let next = w.a.s.send(false, 900, 4_096).unwrap();
    w.a.sent_len.insert(next, 900);
    w.a.drain();
    w.quiesce();
    assert!(
        w.a.closed.is_none() && w.b.closed.is_none(),
        "{:?}",
        w.b.closed
    );
    assert_eq!(w.b.delivered, vec![next]);
    assert_eq!(w.b.s.received_upto, next);
    for id in withdrawn {
        assert_eq!(
            w.a.finished.get(&id),
            Some(&Err(CloseReason::NotRegistered("no memory".into())))
        );
    }
}

/// A peer that acknowledges a message whose descriptor never went out (it
/// guessed the id while the bind was held back) and whose bind then fails: the
/// message is still released and its sender told, and the session closes,
/// naming the peer's lie.
#[test]
fn an_ack_of_a_message_withdrawn_unannounced_closes_but_finishes_it() {
    let mut s = Session::new(params(), Instant::now());
    let id = s.send(false, 5_000, 8_192).unwrap();
    while s.next_action().is_some() {}
    let ack = Control {
        kind: Some(Kind::Ack),
        msg_id: id,
        len: ACK_DELIVERED,
        ..Default::default()
    };
    s.on_control(0, Kind::Ack, &ack, false);
    while s.next_action().is_some() {}
    s.bind_failed(id, "no memory".into());
    let actions: Vec<Action> = std::iter::from_fn(|| s.next_action()).collect();
    assert!(actions.contains(&Action::Release(id)), "{actions:?}");
    assert!(
        actions.contains(&Action::Finished {
            id,
            result: Err(CloseReason::NotRegistered("no memory".into()))
        }),
        "{actions:?}"
    );
    assert!(
        matches!(s.closed(), Some(CloseReason::Protocol(why)) if why.contains("withdrawn")),
        "{:?}",
        s.closed()
    );
}

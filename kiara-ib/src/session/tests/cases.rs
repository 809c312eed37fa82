//! Named cases: the greeting, timeouts, caps, the fast paths, credits and
//! acknowledgements.

use super::*;

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

/// A SEND of ours that the peer never takes (it granted credits and posts no
/// receives: the device retries it for ever) closes the session `ack_timeout`
/// after it went out, whatever completed meanwhile: a peer that takes one SEND
/// now and then cannot keep the others waiting for longer. None is timed once
/// every slot is free.
#[test]
fn a_send_the_peer_never_takes_closes_the_session_after_the_timeout() {
    let timeout = params().ack_timeout;
    let mut w = World::new();
    let second = Duration::from_secs(1);
    w.a.s.send(true, 10, 0).unwrap();
    w.a.drain();
    assert_eq!(w.a.s.next_deadline(), Some(w.a.now + timeout));
    // The next sweep times it from its own clock; the second goes out after it.
    w.a.now += second;
    w.a.s.tick(w.a.now);
    let first = w.a.now;
    assert_eq!(w.a.s.next_deadline(), Some(first + timeout));
    w.a.s.send(true, 10, 0).unwrap();
    w.a.drain();
    w.a.now += second;
    w.a.s.tick(w.a.now);
    let posted = w.a.now;
    // The first completes (SENDs complete in order); the second never does, and
    // a third goes out.
    w.a.now += 2 * second;
    w.a.s.tick(w.a.now);
    let (slot, _, _) = w.a.wire.pop_front().unwrap();
    w.a.s.on_send_done(slot);
    w.a.s.send(true, 10, 0).unwrap();
    w.a.drain();
    assert_eq!(
        w.a.s.next_deadline(),
        Some(posted + timeout),
        "the second's"
    );
    w.a.now = first + timeout;
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert!(w.a.closed.is_none(), "the first's time went with it");
    w.a.now = posted + timeout - Duration::from_millis(1);
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert!(w.a.closed.is_none(), "not before the whole timeout");
    w.a.now = posted + timeout;
    w.a.s.tick(w.a.now);
    w.a.drain();
    assert_eq!(
        w.a.closed,
        Some(CloseReason::SendTimeout { after: timeout }),
        "the completion of the first did not give the second more time"
    );
    // Once every SEND completed, nothing is timed.
    let mut w = World::new();
    w.a.s.send(true, 10, 0).unwrap();
    w.a.drain();
    let (slot, _, _) = w.a.wire.pop_front().unwrap();
    w.a.s.on_send_done(slot);
    assert_eq!(w.a.s.next_deadline(), None);
    w.a.s.tick(w.a.now + 10 * timeout);
    assert_eq!(w.a.s.closed(), None);
}

#[test]
fn a_close_drops_the_device_work_queued_before_it() {
    let mut w = World::new();
    let first = w.a.s.send(true, 10, 10).unwrap();
    let second = w.a.s.send(true, 10, 10).unwrap();
    // The driver takes the first EAGER's post, which fails: it closes the session
    // with the second's post still queued.
    let posted = w.a.s.next_action();
    assert!(
        matches!(posted, Some(Action::Post { kind: Kind::Eager, header, .. }) if header.msg_id == first),
        "{posted:?}"
    );
    w.a.s.close(CloseReason::Local("the post failed".into()));
    let rest: Vec<Action> = std::iter::from_fn(|| w.a.s.next_action()).collect();
    assert!(
        !rest.iter().any(Action::uses_the_device),
        "message {second}'s post or other device work survived the close: {rest:?}"
    );
    assert!(
        rest.iter().any(|a| matches!(a, Action::DestroyQp)),
        "{rest:?}"
    );
}

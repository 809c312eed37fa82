//! Two session cores talking through a simulated RC wire, driven by random
//! interleavings (proptest): sends of both kinds from both sides, arrivals, SEND,
//! READ and invalidation completions, the application taking messages, deferred
//! reposts, time, closes, and hostile control messages. After every step and at the
//! end the properties of the module documentation are checked.

use super::*;

mod budgets;
mod cases;
mod properties;
mod world;

use world::*;

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

/// What the model's read messages are charged: a buffer twice their length for
/// every third length (a pool copy), else their length (the caller's region).
fn pinned(len: u16) -> u64 {
    if len % 3 == 0 {
        2 * u64::from(len)
    } else {
        u64::from(len)
    }
}

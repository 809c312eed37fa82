//! (e): malformed, truncated, oversize and out-of-order control messages and
//! hellos, stray bytes and invalidations.

use super::*;

/// A control message, as bytes.
pub(super) fn control(kind: Kind, h: Control, meta: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; CONTROL_HEADER_LEN];
    Control {
        meta_len: meta.len() as u8,
        ..h
    }
    .write_header(kind, &mut v);
    v.extend_from_slice(meta);
    v.extend_from_slice(payload);
    v
}

/// Builds a control message's bytes for a session that has done its prelude.
type Build = Box<dyn Fn(&mut RawPeer) -> Vec<u8>>;

/// A broken control message and what the server must say about it.
pub(super) struct Malformed {
    pub(super) name: &'static str,
    pub(super) bytes: Build,
    /// Takes bait (and acknowledges it) first, so that ACKs have something to name.
    pub(super) acked_bait_first: bool,
    pub(super) reason: &'static str,
}

/// A malformed message case.
pub(super) fn case(
    name: &'static str,
    reason: &'static str,
    bytes: impl Fn(&mut RawPeer) -> Vec<u8> + 'static,
) -> Malformed {
    Malformed {
        name,
        bytes: Box::new(bytes),
        acked_bait_first: false,
        reason,
    }
}

/// (e) Malformed, truncated, oversize and out-of-order control messages (and broken
/// hellos, and bytes on the bootstrap connection) close the session with the named
/// reason, while the good clients go on being served.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_e_malformed_control_messages_close_the_session_with_a_reason() {
    let cases = malformed_cases();
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        for (i, c) in cases.iter().enumerate() {
            malformed_closes_the_session(server, dev, i, c);
        }
        stray_byte_closes_the_session(server, dev);
        broken_hellos_are_refused(server, dev);
        stray_invalidations_close_the_session(server, dev);
    });
}

/// Invalidations other than an ACK's of its own message's key: an ACK of one bait
/// that invalidates another bait's window, a CREDIT that invalidates a window, and
/// an ACK with a key that is no window of the session (which fails at the server's
/// queue pair). Each closes the session with the reason, and the server's sends of
/// the baits fail rather than finish: their buffers are never handed back while the
/// attacker might still reach them. Before protocol version 3 the server answered
/// the first two with a LOCAL_INV of the window the attacker had invalidated, a
/// second invalidation, which panics an rxe (Linux 6.1) kernel.
fn stray_invalidations_close_the_session(server: &Server, dev: &Arc<Device>) {
    type Attack = fn(&mut RawPeer, &Descriptor, &Descriptor) -> ibv_wc_status;
    let attacks: [(&str, Attack, &str); 3] = [
        (
            "an ACK invalidating another message's window",
            |p, a, b| {
                let h = Control {
                    msg_id: a.msg_id,
                    rkey: a.rkey,
                    ..Control::default()
                };
                let op = SendOp::SendWithInvalidate(b.rkey);
                p.send_control_as(Kind::Ack, h, &[], &[], op)
            },
            "not that message's window",
        ),
        (
            "a CREDIT invalidating a window",
            |p, a, _| {
                let op = SendOp::SendWithInvalidate(a.rkey);
                p.send_control_as(Kind::Credit, Control::default(), &[], &[], op)
            },
            "its Credit about message 0 invalidated key",
        ),
        (
            "an ACK invalidating a key that is no window",
            |p, a, _| {
                // Another index: no window of the device has it.
                let op = SendOp::SendWithInvalidate(a.rkey ^ 0x00ff_ff00);
                p.send_control_as(
                    Kind::Ack,
                    Control {
                        msg_id: a.msg_id,
                        ..Control::default()
                    },
                    &[],
                    &[],
                    op,
                )
            },
            "remote invalid request error",
        ),
    ];
    for (i, (name, attack, reason)) in attacks.into_iter().enumerate() {
        let mut peer = RawPeer::connect(dev, server.addr);
        let tags = (600 + 2 * i as u64, 601 + 2 * i as u64);
        let a = peer.request_bait(Mode::Pooled, 10_000, tags.0);
        let b = peer.request_bait(Mode::Pooled, 10_000, tags.1);
        let status = attack(&mut peer, &a, &b);
        eprintln!("{name}: the attacker's SEND completed with {status:?}");
        let line = server.closed(peer.me(), reason);
        assert!(line.contains(" closed: "), "{name}: {line}");
        eprintln!("{name}: server log: {line}");
        for tag in [tags.0, tags.1] {
            let handle = server.give(tag).expect("the bait reply was sent");
            assert!(
                handle.wait(Some(STEP)).is_err(),
                "{name}: the send of bait {tag} finished as delivered"
            );
        }
        assert!(peer.closed_by_server(), "{name}: connection left open");
    }
}

/// An eager message announcing `len` bytes and carrying `payload`, with the credits
/// the attacker owes.
pub(super) fn eager(p: &mut RawPeer, id: u64, len: u64, payload: usize) -> Vec<u8> {
    let h = Control {
        msg_id: id,
        len,
        credits: std::mem::take(&mut p.owed),
        ..Control::default()
    };
    control(Kind::Eager, h, &[], &vec![7u8; payload])
}

/// Every malformed control message of (e).
fn malformed_cases() -> Vec<Malformed> {
    let mut cases = vec![
        case("empty", "truncated: 0 of 40", |_| Vec::new()),
        case("header cut short", "truncated: 39 of 40", |_| {
            control(Kind::Credit, Control::default(), &[], &[])[..39].to_vec()
        }),
        case("unknown type", "unknown control message type 0", |_| {
            let mut m = control(Kind::Credit, Control::default(), &[], &[]);
            m[0] = 0;
            m
        }),
        case(
            "metadata too long",
            "metadata of 65 bytes exceeds 64",
            |p| {
                let h = Control {
                    msg_id: p.take_id(),
                    len: 1,
                    ..Control::default()
                };
                control(Kind::Eager, h, &[1; 65], &[2])
            },
        ),
        case("metadata cut short", "5 of 10 metadata bytes", |_| {
            let mut m = control(Kind::Credit, Control::default(), &[], &[]);
            m[1] = 10;
            m.extend_from_slice(&[0; 5]);
            m
        }),
        case(
            "eager over the threshold",
            "exceeds the eager threshold",
            |p| {
                let id = p.take_id();
                eager(p, id, 4097, 4097)
            },
        ),
        case(
            "eager shorter than announced",
            "announces 100 bytes but carries 50",
            |p| {
                let id = p.take_id();
                eager(p, id, 100, 50)
            },
        ),
        case("oversize SEND", "RDMA failed", |p| {
            let id = p.take_id();
            eager(p, id, 8192, 8192)
        }),
    ];
    cases.extend(descriptor_cases());
    cases.extend(ack_and_id_cases());
    cases
}

/// Data descriptors that are empty, too long, wrapping, followed by bytes, or lying.
fn descriptor_cases() -> Vec<Malformed> {
    vec![
        case("empty descriptor", "data descriptor of 0 bytes", |p| {
            let h = Control {
                msg_id: p.take_id(),
                addr: 0x1000,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case("descriptor over the limit", "exceeds the limit", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 1 << 40,
                addr: 0x1000,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case("descriptor wrapping around", "wraps around", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 4096,
                addr: u64::MAX - 100,
                rkey: 1,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
        case(
            "bytes after a descriptor",
            "stray bytes after a data descriptor",
            |p| {
                let h = Control {
                    msg_id: p.take_id(),
                    len: 8192,
                    addr: 0x1000,
                    rkey: 1,
                    ..Control::default()
                };
                control(Kind::Data, h, &[], &[1, 2, 3])
            },
        ),
        case("lying descriptor key", "RDMA failed", |p| {
            let h = Control {
                msg_id: p.take_id(),
                len: 8192,
                addr: 0x10_0000,
                rkey: 0xdead,
                ..Control::default()
            };
            control(Kind::Data, h, &[], &[])
        }),
    ]
}

/// Stray bytes, credits never spent, ids out of order, ACKs of nothing.
fn ack_and_id_cases() -> Vec<Malformed> {
    let mut cases = vec![
        case(
            "bytes after an ACK",
            "Ack message carries 1 unexpected bytes",
            |_| control(Kind::Ack, Control::default(), &[], &[9]),
        ),
        case(
            "metadata on a BYE",
            "Bye message carries 3 unexpected bytes",
            |_| control(Kind::Bye, Control::default(), &[1, 2, 3], &[]),
        ),
        case(
            "credits never spent",
            "returned 1000000 credits but owed",
            |_| {
                let h = Control {
                    credits: 1_000_000,
                    ..Control::default()
                };
                control(Kind::Credit, h, &[], &[])
            },
        ),
        case("id jumping ahead", "message id 1000 jumps ahead", |p| {
            eager(p, 1000, 1, 1)
        }),
        case("id zero", "message id 0 repeats or goes backwards", |p| {
            eager(p, 0, 1, 1)
        }),
        case(
            "ACK of a message never sent",
            "acknowledgement of message 77",
            |_| {
                let h = Control {
                    msg_id: 77,
                    ..Control::default()
                };
                control(Kind::Ack, h, &[], &[])
            },
        ),
    ];
    let mut twice = case(
        "the same ACK twice",
        "which is not in flight",
        |p: &mut RawPeer| {
            let h = Control {
                msg_id: p.last_acked,
                credits: std::mem::take(&mut p.owed),
                ..Control::default()
            };
            control(Kind::Ack, h, &[], &[])
        },
    );
    twice.acked_bait_first = true;
    cases.push(twice);
    let mut repeat = case(
        "an id used before",
        "repeats or goes backwards (last 1)",
        |p: &mut RawPeer| eager(p, 1, 1, 1),
    );
    repeat.acked_bait_first = true;
    cases.push(repeat);

    cases
}

/// Case `i` (`c`): a fresh attacker sends it; the server closes the session with the
/// case's reason and the connection.
fn malformed_closes_the_session(server: &Server, dev: &Arc<Device>, i: usize, c: &Malformed) {
    let mut peer = RawPeer::connect(dev, server.addr);
    if c.acked_bait_first {
        let tag = 400 + i as u64;
        let d = peer.request_bait(Mode::Pooled, 10_000, tag);
        peer.ack(d.msg_id);
        server.wait_bait_done(tag);
    }
    let bytes = (c.bytes)(&mut peer);
    // The oversize SEND fails at the attacker too (the server's receive cannot hold
    // it); every other one is delivered.
    let status = peer.send_raw(&bytes);
    if c.name != "oversize SEND" {
        assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS, "{}: SEND", c.name);
    }
    let line = server.closed(peer.me(), c.reason);
    assert!(line.contains(" closed: "), "{}: {line}", c.name);
    assert!(peer.closed_by_server(), "{}: connection left open", c.name);
    eprintln!("{}: server log: {line}", c.name);
}

/// A byte on the bootstrap connection after the handshake closes the session.
fn stray_byte_closes_the_session(server: &Server, dev: &Arc<Device>) {
    let mut peer = RawPeer::connect(dev, server.addr);
    peer.tcp.write_all(b"X").unwrap();
    server.closed(peer.me(), "unexpected bytes on the bootstrap connection");
    assert!(peer.closed_by_server(), "stray byte: connection left open");
}

/// Broken hellos: refused before any session exists. The reason must name the field
/// (its wording is the protocol code's).
fn broken_hellos_are_refused(server: &Server, dev: &Arc<Device>) {
    // the field (its wording is the protocol code's).
    type Tweak = fn(&mut [u8]);
    let hellos: [(&str, Tweak, &str); 3] = [
        ("no credits", |h| h[36..40].fill(0), "credits"),
        (
            "tiny slots",
            |h| h[40..44].copy_from_slice(&50u32.to_be_bytes()),
            "slot",
        ),
        ("unknown flags", |h| h[19] |= 0x80, "flags"),
    ];
    for (name, tweak, field) in hellos {
        let me = match RawPeer::try_connect(dev, server.addr, tweak) {
            Ok(_) => panic!("{name}: the hello was accepted"),
            Err(me) => me,
        };
        let refused = format!("connection from {me} refused");
        let line = server
            .log
            .wait_for(&format!("refusing the hello of {me} ({name})"), |l| {
                l.contains(&refused)
            });
        assert!(
            line.contains(field),
            "{name}: the reason does not name the {field}: {line}"
        );
        eprintln!("{name}: server log: {line}");
    }
}

//! (h): the same kinds of attack on a server whose sessions share one receive
//! queue: no slot of it is lost.

use super::malformed::{case, control, eager};
use super::*;

/// (h) A server whose sessions share one small receive queue (8 slots, fewer than
/// one session's credits) loses no slot to an attacker: SENDs longer than a slot
/// (by many packets, or by one byte in one packet) and an eager message over the
/// threshold the server announced for its shared slots each close the attacker's
/// session with a reason, 18 times in all; a client that fills every slot during
/// the handshake and then fails it gets nothing kept; a client whose MTU is smaller
/// than the server's is refused at the hello. The good clients (whose bursts overrun the
/// queue, so the device makes them retry) are served intact throughout and after,
/// which they could not be had the attacks taken 8 slots, and the transport holds
/// none of them back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_a_shared_receive_queue_loses_no_slot_to_an_attacker() {
    const SLOTS: u32 = 8;
    let config = Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    };
    with_victims(config, Plant::Keep, |server, dev| {
        // At rxe's 1,024-byte MTU a shared slot holds 1,023 bytes: 919 of payload.
        let cases = [
            case("many packets", "RDMA failed", |p| {
                let id = p.take_id();
                eager(p, id, 8192, 8192)
            }),
            case("one byte over a slot", "RDMA failed", |p| {
                let id = p.take_id();
                eager(p, id, 984, 984)
            }),
            case(
                "eager over the shared threshold",
                "exceeds the eager threshold 919",
                |p| {
                    let id = p.take_id();
                    eager(p, id, 920, 920)
                },
            ),
        ];
        // The failing SENDs run more times than there are slots: had any of them
        // kept its slot, the queue would run dry and the good clients, and the late
        // one `with_victims` starts afterwards, would wait for ever (and time out).
        let runs = cases.iter().cycle().take(2 * SLOTS as usize + 2);
        for (i, c) in runs.enumerate() {
            let mut peer = RawPeer::connect(dev, server.addr);
            let bytes = (c.bytes)(&mut peer);
            let status = peer.send_raw(&bytes);
            let fits = bytes.len() <= 1023;
            assert_eq!(status == ibv_wc_status::IBV_WC_SUCCESS, fits, "{}", c.name);
            let line = server.closed(peer.me(), c.reason);
            assert!(peer.closed_by_server(), "{i} {}: left open", c.name);
            eprintln!("{}: server log: {line}", c.name);
        }
        // A client that tries to fill the slots before the handshake is over, then
        // spoils its ready byte: the server's queue pair cannot receive before that
        // byte, so the SEND fails and takes no slot, and the session never starts.
        let credit = control(Kind::Credit, Control::default(), &[], &[]);
        let failed = RawPeer::handshake(
            dev,
            server.addr,
            |_| {},
            |p| {
                let status = p.send_raw(&credit);
                assert_ne!(
                    status,
                    ibv_wc_status::IBV_WC_SUCCESS,
                    "a SEND before the ready byte reached the server"
                );
                p.tcp.write_all(b"X").unwrap();
            },
        );
        // The server reads our ready byte before it writes its own, so neither
        // side finishes.
        let me = match &failed {
            Ok(peer) => peer.me(),
            Err(me) => *me,
        };
        let line = server
            .log
            .wait_for(&format!("refusing {me} (bad ready byte)"), |l| {
                l.contains(&me.to_string()) && l.contains("ready byte")
            });
        eprintln!("bad ready byte: server log: {line}");
        drop(failed);
        // A smaller MTU than the server's (1,024 bytes, code 3): refused.
        let me = match RawPeer::try_connect(dev, server.addr, |h| h[18] = 2) {
            Ok(_) => panic!("a client with a 512-byte MTU was accepted"),
            Err(me) => me,
        };
        let line = server
            .log
            .wait_for(&format!("refusing {me} (small MTU)"), |l| {
                l.contains(&me.to_string()) && l.contains("MTU")
            });
        eprintln!("small MTU: server log: {line}");
        let deadline = Instant::now() + STEP;
        loop {
            let q = server.transport.shared_receives().unwrap();
            if q.posted == SLOTS {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {SLOTS} shared slots came back",
                q.posted
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// (h, bursts) On a server whose sessions share a receive queue of 128 slots, an
/// attacker sends 100 control messages back to back, ignoring its credits, with a
/// malformed one in the middle: its session closes (at the malformed one, or at
/// the first beyond its credits) while the messages behind it arrive, so their completions are polled after the close or are
/// still on the CQ when the queue pair is destroyed. Every SEND the attacker saw
/// succeed consumed a shared slot, so the server must count exactly as many
/// receives handed back (`SharedReceives::received`), four bursts in a row, and
/// hold no slot back.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_bursts_over_the_credits_lose_no_shared_slot() {
    const SLOTS: u32 = 128;
    let server = Server::start(Config {
        shared_receive_slots: SLOTS,
        ..Config::default()
    });
    let dev = Device::open();
    let mut sent = 0;
    for round in 0..4 {
        let mut peer = RawPeer::connect(&dev, server.addr);
        let burst: Vec<Vec<u8>> = (0..100)
            .map(|i| match i {
                40 => control(Kind::Credit, Control::default(), &[], &[9]),
                _ => control(Kind::Credit, Control::default(), &[], &[]),
            })
            .collect();
        let delivered = peer.send_burst(&burst);
        let line = server.closed(peer.me(), "the peer broke the protocol");
        eprintln!("burst {round}: {delivered} of 100 delivered; server log: {line}");
        // What closed the session arrived: the first SEND beyond the credits (the
        // greeting took one), or the malformed 41st, whichever the server saw first.
        let closer = match line.contains("more control messages than its credits") {
            true => Config::default().credits as usize,
            false => 41,
        };
        assert!(
            delivered >= closer,
            "burst {round}: only {delivered} SENDs arrived"
        );
        // The burst, and the greeting before it.
        sent += delivered as u64 + 1;
    }
    every_receive_back(&server, sent, SLOTS);
    // And the queue still serves.
    GoodClients::start(server.addr, 2).finish();
    server.finish();
}

/// (h) on a shared receive queue: a peer that sends before its ready byte lands
/// nothing, since the server's queue pair cannot receive until that byte. (When
/// the server moved to RTR before reading it, each such half-open handshake held
/// up to `credits` slots, with no session to cut it off: a few of them could take
/// every slot.) Its SEND fails, the shared queue counts no receive and keeps every
/// slot posted, and once the peer sends its ready byte the session starts as any
/// other.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_h_a_half_open_handshake_holds_no_slot() {
    const SLOTS: u32 = 64;
    const CREDITS: u32 = 8;
    let server = Server::start(Config {
        shared_receive_slots: SLOTS,
        credits: CREDITS,
        ..Config::default()
    });
    let dev = Device::open();
    let credit = control(Kind::Credit, Control::default(), &[], &[]);
    let peer = RawPeer::handshake(
        &dev,
        server.addr,
        |_| {},
        |p| {
            let status = p.send_raw(&credit);
            assert_ne!(
                status,
                ibv_wc_status::IBV_WC_SUCCESS,
                "a SEND before the ready byte reached the server"
            );
            eprintln!(
                "a SEND before the ready byte: {}",
                rdma_safe::cq::status_text(status)
            );
            let q = server.transport.shared_receives().unwrap();
            assert_eq!(q.received, 0, "receives counted during the handshake");
            assert_eq!(q.posted, SLOTS, "slots held during the handshake");
        },
    )
    .expect("the handshake completes");
    // The session started; the peer's queue pair failed, so it leaves.
    let deadline = Instant::now() + STEP;
    while server.transport.sessions().is_empty() {
        assert!(Instant::now() < deadline, "the session never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(peer);
    every_receive_back(&server, 0, SLOTS);
    GoodClients::start(server.addr, 2).finish();
    server.finish();
}

/// Waits until `server`'s shared queue has counted `sent` receives (each of which
/// gave its slot back) and all its `slots` are posted again.
fn every_receive_back(server: &Server, sent: u64, slots: u32) {
    let deadline = Instant::now() + STEP;
    loop {
        let q = server.transport.shared_receives().unwrap();
        if q.received == sent && q.posted == slots {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} SENDs succeeded, but {} receives came back ({} of {slots} slots posted)",
            q.received,
            q.posted
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

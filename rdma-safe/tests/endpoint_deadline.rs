//! Host tests (plain TCP on 127.0.0.1, no RDMA device): an endpoint exchange has one
//! deadline in all, whatever the peer does. Each test runs the exchange on the side
//! that accepts, as a server would, against a peer written as an attacker would.

use rdma_safe::endpoint::{exchange, Endpoint, BODY_LEN, HEADER_LEN};
use rdma_safe::{sys, Gid, RemoteSlice};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the exchange allows in all.
const ALLOWED: Duration = Duration::from_secs(1);
/// Generous room for a loaded machine: the exchange must end before `ALLOWED + SLACK`,
/// well before a dripping peer would have finished its message (5.6 s).
const SLACK: Duration = Duration::from_secs(3);
/// The dripping peer's pace.
const DRIP: Duration = Duration::from_millis(100);

fn ours() -> Endpoint {
    Endpoint {
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        lid: 0,
        gid: Some(Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])),
        mtu: sys::ibv_mtu::IBV_MTU_1024,
        region: Some(RemoteSlice {
            addr: 0x7f00_0000_1000,
            len: 4096,
            rkey: 0xdead_beef,
        }),
    }
}

fn theirs() -> Endpoint {
    Endpoint {
        qpn: 0x65_4321,
        region: None,
        ..ours()
    }
}

/// Starts `peer` on a thread with a connection to a fresh listener, accepts it and
/// runs the exchange on the accepting side; returns its outcome, how long it took,
/// and the peer's thread.
fn exchange_with(
    peer: impl FnOnce(TcpStream) + Send + 'static,
) -> (rdma_safe::Result<Endpoint>, Duration, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || peer(TcpStream::connect(addr).unwrap()));
    let (mut stream, _) = listener.accept().unwrap();
    let start = Instant::now();
    let outcome = exchange(&mut stream, &ours(), ALLOWED);
    (outcome, start.elapsed(), thread)
}

/// Reads the endpoint the exchanging side sends first (bounded, so a broken test
/// cannot hang here) and checks it.
fn read_ours(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = [0u8; HEADER_LEN + BODY_LEN];
    s.read_exact(&mut bytes).unwrap();
    assert_eq!(Endpoint::decode(&bytes).unwrap(), ours());
}

/// Asserts that the exchange failed as too slow, and in time.
fn assert_too_slow(outcome: rdma_safe::Result<Endpoint>, took: Duration, progress: &str) {
    let err = outcome
        .expect_err("a too slow peer must fail the exchange")
        .to_string();
    assert!(err.contains("the peer was too slow"), "{err}");
    assert!(err.contains(&format!("{ALLOWED:?} allowed")), "{err}");
    assert!(err.contains(progress), "{err}");
    assert!(
        took < ALLOWED + SLACK,
        "the exchange took {took:?}, allowed {ALLOWED:?}"
    );
}

#[test]
fn a_peer_dripping_one_byte_at_a_time_is_cut_off_at_the_deadline() {
    let (outcome, took, peer) = exchange_with(|mut s| {
        read_ours(&mut s);
        for byte in theirs().encode() {
            // Once the other side gave up, writes fail: stop there.
            if s.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(DRIP);
        }
    });
    // About 10 bytes arrive in a second: the header, and part of the body.
    assert_too_slow(outcome, took, "body bytes had moved");
    peer.join().unwrap();
}

#[test]
fn a_peer_that_connects_and_says_nothing_is_cut_off_at_the_deadline() {
    let (release, hold) = mpsc::channel::<()>();
    let (outcome, took, peer) = exchange_with(move |mut s| {
        read_ours(&mut s);
        // Hold the connection open, silent, until the test is done.
        let _ = hold.recv_timeout(Duration::from_secs(30));
    });
    assert_too_slow(outcome, took, "0 of 8 header bytes");
    release.send(()).unwrap();
    peer.join().unwrap();
}

#[test]
fn a_peer_that_sends_a_truncated_message_and_closes_is_an_error_at_once() {
    let (outcome, took, peer) = exchange_with(|mut s| {
        read_ours(&mut s);
        s.write_all(&theirs().encode()[..20]).unwrap();
    });
    let err = outcome.expect_err("a truncated message").to_string();
    assert!(
        err.contains("the peer closed the connection after 12 of 48 body bytes"),
        "{err}"
    );
    assert!(took < ALLOWED + SLACK, "took {took:?}");
    peer.join().unwrap();
}

#[test]
fn a_well_behaved_peer_in_pieces_within_the_deadline_succeeds() {
    let (outcome, _, peer) = exchange_with(|mut s| {
        read_ours(&mut s);
        // Three pieces with pauses that add up to well under the deadline.
        let bytes = theirs().encode();
        for piece in [&bytes[..5], &bytes[5..30], &bytes[30..]] {
            s.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert_eq!(outcome.unwrap(), theirs());
    peer.join().unwrap();
}

#[test]
fn both_sides_exchanging_at_once_succeed() {
    let (outcome, _, peer) = exchange_with(|mut s| {
        let got = exchange(&mut s, &theirs(), ALLOWED).unwrap();
        assert_eq!(got, ours());
    });
    assert_eq!(outcome.unwrap(), theirs());
    peer.join().unwrap();
}

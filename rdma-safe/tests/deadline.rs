//! Host tests (plain TCP on 127.0.0.1, no RDMA device): an exchange bounded by one
//! [`Deadline`] ends within it, whatever the peer does. Each test runs the exchange on
//! the side that accepts, as a server would, against a peer written as an attacker
//! would. The exchange is a stand-in for a program's own: it writes its message, then
//! reads the peer's in two parts (an 8-byte header and a 48-byte body).

use rdma_safe::{Deadline, Result};
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
/// The message's parts.
const HEADER_LEN: usize = 8;
const BODY_LEN: usize = 48;
const MESSAGE_LEN: usize = HEADER_LEN + BODY_LEN;

/// The message of the side under test.
fn ours() -> [u8; MESSAGE_LEN] {
    std::array::from_fn(|i| i as u8)
}

/// The peer's message.
fn theirs() -> [u8; MESSAGE_LEN] {
    std::array::from_fn(|i| 0xff - i as u8)
}

/// Writes `mine` and reads the peer's message, all within `allowed`.
fn exchange(stream: &mut TcpStream, mine: &[u8], allowed: Duration) -> Result<Vec<u8>> {
    let deadline = Deadline::after(allowed, "test exchange");
    assert_eq!(deadline.allowed(), allowed);
    deadline.write_all(stream, mine, "message")?;
    let mut got = vec![0u8; MESSAGE_LEN];
    let (header, body) = got.split_at_mut(HEADER_LEN);
    deadline.read_exact(stream, header, "header")?;
    deadline.read_exact(stream, body, "body")?;
    Ok(got)
}

/// Starts `peer` on a thread with a connection to a fresh listener, accepts it and
/// runs the exchange on the accepting side; returns its outcome, how long it took,
/// and the peer's thread.
fn exchange_with(
    peer: impl FnOnce(TcpStream) + Send + 'static,
) -> (Result<Vec<u8>>, Duration, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || peer(TcpStream::connect(addr).unwrap()));
    let (mut stream, _) = listener.accept().unwrap();
    let start = Instant::now();
    let outcome = exchange(&mut stream, &ours(), ALLOWED);
    (outcome, start.elapsed(), thread)
}

/// Reads the message the exchanging side sends first (bounded, so that a broken test
/// cannot hang here) and checks it.
fn read_ours(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = [0u8; MESSAGE_LEN];
    s.read_exact(&mut bytes).unwrap();
    assert_eq!(bytes, ours());
}

/// Asserts that the exchange failed as too slow, and in time.
fn assert_too_slow(outcome: Result<Vec<u8>>, took: Duration, progress: &str) {
    let err = outcome
        .expect_err("a too slow peer must fail the exchange")
        .to_string();
    assert!(
        err.contains("test exchange: the peer was too slow"),
        "{err}"
    );
    assert!(err.contains(&format!("{ALLOWED:?} allowed")), "{err}");
    assert!(err.contains(progress), "{err}");
    assert!(!err.contains("  "), "a run of spaces in the message: {err}");
    assert!(
        took < ALLOWED + SLACK,
        "the exchange took {took:?}, allowed {ALLOWED:?}"
    );
}

#[test]
fn a_peer_dripping_one_byte_at_a_time_is_cut_off_at_the_deadline() {
    let (outcome, took, peer) = exchange_with(|mut s| {
        read_ours(&mut s);
        for byte in theirs() {
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
        s.write_all(&theirs()[..20]).unwrap();
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
        let bytes = theirs();
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

#[test]
fn time_is_left_until_the_deadline_and_none_after() {
    let deadline = Deadline::after(Duration::from_millis(200), "test exchange");
    let left = deadline.remaining().expect("time left at the start");
    assert!(left <= Duration::from_millis(200), "{left:?}");
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(deadline.remaining(), None);
}

#[test]
fn a_deadline_too_far_for_the_clock_means_no_deadline() {
    let never = Deadline::after(Duration::MAX, "test exchange");
    assert_eq!(never.allowed(), Duration::MAX);
    let left = never.remaining().expect("time left");
    assert!(
        left > Duration::from_secs(99 * 365 * 24 * 60 * 60),
        "{left:?}"
    );
    // An exchange under it works as any other.
    let (outcome, _, peer) = exchange_with(|mut s| {
        let got = exchange(&mut s, &theirs(), Duration::MAX).unwrap();
        assert_eq!(got, ours());
    });
    assert_eq!(outcome.unwrap(), theirs());
    peer.join().unwrap();
}

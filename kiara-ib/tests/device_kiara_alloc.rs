//! kiara-ib's steady path allocates no memory and registers none per message:
//! a counting global allocator (every allocation of this test process, on every
//! thread: the poller's, the callback runners', the test's) and the pools'
//! registration counters, read around 1,000 request/reply round trips after a
//! warm-up. The test itself allocates nothing per message: the server's callback
//! sends the message it got back, and the client sends each echo out again (or,
//! for small messages, the same slice of bytes each time). At most
//! [`ONE_TIME`] allocations that happen once per thread, not per message, may fall
//! in a measured stretch; each one counted is traced and printed.
//! Run in the Soft-RoCE guest by `cargo xtask test`.

#[path = "support/mod.rs"]
mod support;

use kiara_ib::{Config, Linger, Message, Session, Transport};
use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use support::server_ip;

/// The system allocator, counting allocations and reallocations.
struct Counting;

/// Allocations and reallocations so far, all threads.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// While set, the first few allocations keep where they came from ([`WHERE`]).
static TRACING: AtomicBool = AtomicBool::new(false);

/// Backtraces of the allocations made while [`TRACING`], at most [`TRACED`].
static WHERE: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());

/// How many allocations [`WHERE`] keeps.
const TRACED: usize = 4;

/// Allocations seen while [`TRACING`].
static TRACED_SO_FAR: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread is capturing a backtrace: its own allocations are not counted.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Counts an allocation, and while [`TRACING`] keeps the first few's backtraces.
/// Allocations made by the capture itself are neither counted nor traced.
fn count() {
    if CAPTURING.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if TRACING.load(Ordering::Relaxed) && TRACED_SO_FAR.fetch_add(1, Ordering::Relaxed) < TRACED {
        CAPTURING.with(|c| c.set(true));
        let trace = Backtrace::force_capture();
        if let Ok(mut w) = WHERE.lock() {
            w.push(trace);
        }
        CAPTURING.with(|c| c.set(false));
    }
}

/// What `work` returns, and the allocations made meanwhile (all threads), the
/// first few of them traced ([`traced`]).
fn counted<T>(work: impl FnOnce() -> T) -> (T, u64) {
    if let Ok(mut w) = WHERE.lock() {
        w.clear();
    }
    TRACED_SO_FAR.store(0, Ordering::SeqCst);
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    TRACING.store(true, Ordering::SeqCst);
    let out = work();
    TRACING.store(false, Ordering::SeqCst);
    (out, ALLOCATIONS.load(Ordering::SeqCst) - before)
}

/// [`counted`] over a steady stretch of messages, `work`. When it allocated more
/// than [`ONE_TIME`] times, where they came from is printed, and the stretch runs
/// once more and counts instead: a stall of the guest can make the server start a
/// stand-in callback runner, a thread started once (a callback seen running past
/// kiara-ib's `runners::STALL`), where an allocation per message counts a thousand
/// both times.
fn counted_steady(mut work: impl FnMut()) -> u64 {
    let ((), first) = counted(&mut work);
    if first <= ONE_TIME {
        return first;
    }
    eprintln!(
        "the stretch allocated {first} times, first at:\n{}\nso it runs once more",
        traced()
    );
    counted(work).1
}

/// The backtraces [`count`] kept, for a failure message.
fn traced() -> String {
    let w = WHERE
        .lock()
        .map(|w| w.iter().map(|t| format!("{t}\n")).collect());
    w.unwrap_or_default()
}

// SAFETY: every method forwards to `System` with the caller's arguments, so
// `System`'s guarantees are ours. Counting allocates nothing but a traced
// backtrace, whose own allocations re-enter here and are forwarded untraced
// (`CAPTURING`).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` (every allocation here does), with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as in `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `rounds` round trips of `msg` (sent, echoed, sent again); returns the last echo.
fn round_trips(client: &Transport, session: &Session, mut msg: Message, rounds: usize) -> Message {
    let len = msg.len();
    for i in 0..rounds {
        client.send(session, msg, Linger::Block).unwrap();
        msg = client
            .recv(session, Linger::Timeout(Duration::from_secs(30)))
            .unwrap()
            .unwrap_or_else(|| panic!("no echo {i} within 30 s"));
        assert_eq!(msg.len(), len, "echo {i}");
        assert!(msg.bytes().iter().all(|&b| b == 0x5a), "echo {i} intact");
    }
    msg
}

/// An echo server, and a client connected to it.
fn echo_pair() -> (Transport, Transport, Session) {
    let server = Transport::new(Config::default());
    server
        .register_callback(|msg, session, transport| {
            // The message goes back as it came: no copy, no allocation here.
            transport.send(session, msg, Linger::NoWait).unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let session = client.connect(addr).unwrap();
    (server, client, session)
}

/// Allocations and registrations (client, server) over `measured` round trips of
/// `len` bytes, after `warm` round trips.
fn steady_cost(len: usize, warm: usize, measured: usize) -> (u64, (u64, u64)) {
    let (server, client, session) = echo_pair();
    let msg = round_trips(&client, &session, Message::new(vec![0x5a; len]), warm);
    let regs = (client.registrations(), server.registrations());
    let mut msg = Some(msg);
    let allocations = counted_steady(|| {
        let m = msg.take().expect("kept between the stretches");
        msg = Some(round_trips(&client, &session, m, measured));
    });
    let grown = (
        client.registrations() - regs.0,
        server.registrations() - regs.1,
    );
    drop(msg);
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
    (allocations, grown)
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn eager_round_trips_allocate_and_register_nothing() {
    let (allocations, registered) = steady_cost(64, 200, 1000);
    check_one_time(allocations, "1,000 round trips of 64 B");
    assert_eq!(registered, (0, 0), "and registered (client, server)");
}

/// Allocations that happen once, not per message, which a measured stretch may
/// still meet, such as `parking_lot` growing its table of waiting threads when a
/// thread waits on a lock or condition for the first time (a thread that spun
/// through the warm-up and now waits, on a busy machine). An allocation per
/// message would count a thousand.
const ONE_TIME: u64 = 2;

/// Fails unless `allocations` over `what` are at most [`ONE_TIME`]; prints where
/// any of them came from either way (CI's log then names them).
fn check_one_time(allocations: u64, what: &str) {
    if allocations == 0 {
        return;
    }
    let report = format!(
        "{what} allocated {allocations} times, first at:\n{}",
        traced()
    );
    eprintln!("{report}");
    assert!(allocations <= ONE_TIME, "{report}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn small_messages_sent_from_a_slice_allocate_nothing() {
    // The plain way to send a few bytes, `send(session, &bytes[..], ..)`: a message
    // of at most 128 bytes keeps them in a recycled array, and so does a small eager
    // message received (the echo), so neither side allocates or takes a pool buffer.
    let (server, client, session) = echo_pair();
    let payload: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37)).collect();
    let trip = |i: usize| {
        client.send(&session, &payload[..], Linger::Block).unwrap();
        let echo = client
            .recv(&session, Linger::Timeout(Duration::from_secs(30)))
            .unwrap()
            .unwrap_or_else(|| panic!("no echo {i} within 30 s"));
        assert_eq!(echo.bytes(), &payload[..], "echo {i} intact");
    };
    (0..200).for_each(trip);
    let regs = (client.registrations(), server.registrations());
    let allocations = counted_steady(|| (0..1000).for_each(trip));
    let registered = (
        client.registrations() - regs.0,
        server.registrations() - regs.1,
    );
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
    check_one_time(allocations, "1,000 round trips of 100 B sent from a slice");
    assert_eq!(registered, (0, 0), "and registered (client, server)");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_message_round_trips_register_nothing() {
    // Read messages (64 KiB, fetched with RDMA READ through a window): the pool's
    // buffers and views and the senders' completion records are reused. How many
    // buffers a side needs at once is timing (whether an invalidation finishes
    // before the next message needs a buffer), so a side may still add a buffer
    // and its view after the warm-up, but not one per message; each such addition
    // may allocate its handles (the region's `Arc`, a free-list slot), nothing else.
    let (allocations, registered) = steady_cost(64 << 10, 50, 300);
    assert!(
        registered.0 <= 2 && registered.1 <= 4,
        "300 read messages registered {registered:?} (client, server)"
    );
    let added = registered.0 + registered.1;
    assert!(
        allocations <= PER_REGISTRATION * added,
        "300 round trips of 64 KiB allocated {allocations} times \
         ({added} registrations after the warm-up)"
    );
}

/// Allocations one registration after the warm-up may cost: the region's `Arc` and
/// a free-list slot, with room for one more.
const PER_REGISTRATION: u64 = 3;

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn zero_copy_messages_register_each_range_once() {
    // Messages sent from the user's own regions (`Message::from_region`): each
    // window binds to a view over exactly its bytes, which the region keeps, so a
    // range sent again registers nothing. Four regions of 64 KiB, two ranges each
    // (the whole region and its first half), sent round after round.
    let server = Transport::new(Config::default());
    let (tx, rx) = std::sync::mpsc::channel();
    server
        .register_callback(move |msg, _, _| tx.send(msg.bytes().to_vec()).unwrap())
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    let client = Transport::new(Config::default());
    let session = client.connect(addr).unwrap();
    let regions: Vec<_> = (0..4u8)
        .map(|k| {
            let mut mr = client.register(64 << 10).unwrap();
            mr.as_mut_slice().unwrap().fill(k);
            std::sync::Arc::new(mr)
        })
        .collect();
    let ranges = [0..64 << 10, 0..32 << 10];
    let send_round = |round: usize| {
        for (k, region) in regions.iter().enumerate() {
            for range in &ranges {
                let msg = Message::from_region(region.clone(), range.clone()).unwrap();
                client.send(&session, msg, Linger::Block).unwrap();
                let got = rx
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|_| panic!("round {round}: region {k} not delivered"));
                assert_eq!(got.len(), range.len(), "round {round}, region {k}");
                assert!(
                    got.iter().all(|&b| b == k as u8),
                    "round {round}, region {k}"
                );
            }
        }
    };
    let before_first = client.registrations();
    send_round(0);
    let first = client.registrations() - before_first;
    assert_eq!(first, 8, "the first round registers one view per range");
    for round in 1..40 {
        send_round(round);
    }
    let later = client.registrations() - before_first - first;
    assert_eq!(
        later, 0,
        "39 more rounds (312 messages) registered {later} times"
    );
    client.disconnect(session).unwrap();
    server.unbind().unwrap();
}

//! Device tests of the safe posting layer: buffers come back only through their
//! completions, misuse is refused with the buffer returned, and the steady-state
//! post/poll path allocates nothing (a counting allocator proves it over 10,000
//! operations), and one device region serves many overlapping requests. Run in the
//! Soft-RoCE guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::lease::{DeviceRegion, Lease, LeasedQp, SendFlags, SendOp};
use rdma_safe::{Access, CompletionQueue, MemoryRegion, QpConfig, WcFlags, WorkCompletion};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts the allocations of the current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const thread-local that
// never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

/// Polls until `n` completions were handed to their QPs; returns the buffers.
fn reap(
    f: &common::Fixture,
    qps: &mut [&mut LeasedQp],
    n: usize,
    wcs: &mut [WorkCompletion],
    out: &mut Vec<(u64, Lease)>,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while seen < n {
        for wc in f.cq.poll_completions(wcs).unwrap() {
            wc.result().unwrap();
            let qp = qps
                .iter_mut()
                .find(|q| q.qp().qp_num() == wc.qp_num())
                .unwrap();
            out.extend(qp.complete(wc).unwrap());
            seen += 1;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for completions"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn steady_state_post_and_poll_allocate_nothing() {
    // The counter sees this thread's allocations (else the test would prove nothing).
    let before = allocations();
    drop(std::hint::black_box(vec![0u8; 16]));
    assert_eq!(allocations(), before + 1);

    let f = fixture();
    let (a, b) = f.pair();
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    let mut src = MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap();
    src.write_at(0, &[0x3c; 4096]).unwrap();
    let src = Arc::new(src);
    let mut sink = Some(MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap());
    let mut read_buf = Some(MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap());
    let sink_addr = sink.as_ref().unwrap().addr();
    let remote = src.remote(0..4096).unwrap();
    let mut wcs = [WorkCompletion::default(); 16];
    // Capacity reserved up front: the test's own bookkeeping must not allocate either.
    let mut back: Vec<(u64, Lease)> = Vec::with_capacity(64);

    const ROUNDS: u64 = 3_400; // 3 operations per round: > 10,000 operations
    let mut counted_from = 0;
    for round in 0..ROUNDS {
        if round == 10 {
            // Warm-up done (lazy initialisation in the libraries); count from here.
            counted_from = allocations();
        }
        // SEND (shared source) into a posted receive, then READ into an owned buffer.
        b.post_recv(round, sink.take().unwrap(), 0..4096).unwrap();
        a.post_send(
            round,
            SendOp::Send,
            Lease::Shared(src.clone()),
            0..4096,
            true,
        )
        .unwrap();
        let rb = read_buf.take().unwrap();
        a.post_send(round, SendOp::Read(remote), Lease::Owned(rb), 0..4096, true)
            .unwrap();
        back.clear();
        reap(&f, &mut [&mut a, &mut b], 3, &mut wcs, &mut back);
        for (id, lease) in back.drain(..) {
            assert_eq!(id, round);
            match lease {
                Lease::Owned(mr) if mr.addr() == sink_addr => sink = Some(mr),
                Lease::Owned(mr) => read_buf = Some(mr),
                Lease::Shared(_) => {}
            }
        }
        assert!(
            sink.is_some() && read_buf.is_some(),
            "round {round}: a buffer is missing"
        );
    }
    let counted = allocations() - counted_from;
    assert_eq!(
        counted,
        0,
        "{counted} allocations in {} operations",
        (ROUNDS - 10) * 3
    );
    assert_eq!(sink.unwrap().to_vec(), src.to_vec());
    assert_eq!(read_buf.unwrap().to_vec(), src.to_vec());
    assert_eq!(Arc::strong_count(&src), 1, "every shared lease came back");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn misuse_is_refused_and_the_buffer_comes_back() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_send_wr = 4;
    let (a, _b) = f.pair_with(&config);
    let mut a = LeasedQp::new(a).unwrap();
    let target = MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap();
    let remote = target.remote(0..64).unwrap();
    let shared = Arc::new(MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap());

    // A READ must not write into a buffer others may be reading.
    let err = a
        .post_send(
            1,
            SendOp::Read(remote),
            Lease::Shared(shared.clone()),
            0..64,
            true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("exclusively"), "{err}");
    assert!(matches!(err.lease, Some(Lease::Shared(_))));
    drop(err);

    // A range outside the region.
    let err = a
        .post_send(
            2,
            SendOp::Write(remote),
            Lease::Shared(shared.clone()),
            0..65,
            true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("outside the region"), "{err}");
    drop(err);

    // Four unsignaled WRITEs fill the queue; the last free slot was signaled anyway.
    for i in 0..4 {
        a.post_send(
            10 + i,
            SendOp::Write(remote),
            Lease::Shared(shared.clone()),
            0..64,
            false,
        )
        .unwrap();
    }
    let err = a
        .post_send(
            20,
            SendOp::Write(remote),
            Lease::Shared(shared.clone()),
            0..64,
            true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("send queue is full"), "{err}");
    drop(err);
    assert_eq!(a.outstanding_sends(), 4);

    // One completion (the forced-signaled fourth) releases all four, oldest first.
    let mut wcs = [WorkCompletion::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(20);
    let ids: Vec<u64> = loop {
        if let Some(wc) = f.cq.poll_completions(&mut wcs).unwrap().next() {
            wc.result().unwrap();
            break a.complete(wc).unwrap().map(|(id, _)| id).collect();
        }
        assert!(Instant::now() < deadline);
    };
    assert_eq!(ids, [10, 11, 12, 13]);
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(Arc::strong_count(&shared), 1);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn dropping_with_outstanding_receives_releases_after_the_qp() {
    let f = fixture();
    let (a, _b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    for i in 0..8 {
        let mr = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
        a.post_recv(i, mr, 0..4096).unwrap();
    }
    assert_eq!(a.outstanding_recvs(), 8);
    // The QP is destroyed first, then the eight regions deregistered and freed.
    drop(a);
    // The device is still fine: a new pair works.
    let (c, _d) = f.pair();
    assert!(c.query_state().is_ok());
}

/// Hands every completion to its queue pair until `n` were seen; returns the
/// caller's `wr_id` each one reported, in order.
fn reap_ids(f: &common::Fixture, qps: &mut [&mut LeasedQp], n: usize) -> Vec<u64> {
    let mut wcs = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ids = Vec::new();
    while ids.len() < n {
        for wc in f.cq.poll_completions(&mut wcs).unwrap() {
            wc.result().unwrap();
            let qp = qps
                .iter_mut()
                .find(|q| q.qp().qp_num() == wc.qp_num())
                .unwrap();
            ids.push(qp.complete(wc).unwrap().wr_id());
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for completions"
        );
    }
    ids
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn one_device_region_serves_overlapping_receives_and_sends() {
    let f = fixture();
    let (a, b) = f.pair();
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    let new_region = || MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let (a_buf, b_buf) = (
        DeviceRegion::new(new_region()),
        DeviceRegion::new(new_region()),
    );
    // Eight receives on the same bytes of B's one buffer, as ibv_rc_pingpong posts them.
    for i in 0..8 {
        b.post_recv_device(100 + i, &b_buf, 0..4096).unwrap();
    }
    assert_eq!(b_buf.holders(), 9);

    // Three messages from A land on top of each other; the last one stays.
    for round in 0..3u8 {
        let mut src = new_region();
        src.as_mut_slice().unwrap().fill(0x40 + round);
        a.post_send(round.into(), SendOp::Send, Lease::Owned(src), 0..4096, true)
            .unwrap();
    }
    let mut ids = reap_ids(&f, &mut [&mut a, &mut b], 6);
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 100, 101, 102]);
    assert_eq!(b.outstanding_recvs(), 5);

    // B answers from the same buffer (inline when small enough) into A's one buffer.
    a.post_recv_device(7, &a_buf, 0..4096).unwrap();
    let flags = SendFlags {
        inline: b.qp().caps().max_inline_data >= 16,
        ..SendFlags::SIGNALED
    };
    b.post_send_device(8, SendOp::Send, &b_buf, 0..16, flags)
        .unwrap();
    let mut ids = reap_ids(&f, &mut [&mut a, &mut b], 2);
    ids.sort_unstable();
    assert_eq!(ids, [7, 8]);

    // A's buffer is free again: nothing holds it.
    let a_region = a_buf.into_region().expect("every request on it completed");
    let mut want = vec![0u8; 4096];
    want[..16].fill(0x42);
    assert_eq!(a_region.to_vec(), want, "B sent what it last received");
    // B's is still held by five receives, until its queue pair is gone.
    let b_buf = b_buf
        .into_region()
        .expect_err("five receives still hold it");
    assert_eq!(b_buf.holders(), 6);
    drop(b);
    let b_region = b_buf.into_region().expect("the queue pair is destroyed");
    assert_eq!(b_region.to_vec(), vec![0x42; 4096]);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn device_region_posts_are_refused_like_leases() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_send_wr = 2;
    let (a, _b) = f.pair_with(&config);
    let mut a = LeasedQp::new(a).unwrap();
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    let err = a.post_recv_device(1, &buf, 0..65).unwrap_err();
    assert!(err.to_string().contains("outside the region"), "{err}");
    let target = MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap();
    let remote = target.remote(0..64).unwrap();
    // A READ into a device region is allowed: the program cannot see the bytes.
    let cap = a.qp().caps().max_send_wr as usize;
    for i in 0..cap {
        a.post_send_device(
            i as u64,
            SendOp::Read(remote),
            &buf,
            0..64,
            SendFlags::default(),
        )
        .unwrap();
    }
    let err = a
        .post_send_device(9, SendOp::Write(remote), &buf, 0..64, SendFlags::SIGNALED)
        .unwrap_err();
    assert!(err.to_string().contains("send queue is full"), "{err}");
    assert_eq!(buf.holders(), 1 + cap, "a refused post holds nothing");
    // The last free slot was signaled anyway: one completion releases them all.
    let ids = reap_ids(&f, &mut [&mut a], 1);
    assert_eq!(ids, [cap as u64 - 1]);
    assert_eq!(buf.holders(), 1);
    assert_eq!(a.outstanding_sends(), 0);
}

/// Ends the process if the test that holds it is still running after `secs`: a
/// deadlock then fails the test instead of holding the run until its timeout.
/// Dropped (the test ended, passed or panicked), it stands down.
struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn watchdog(secs: u64, what: &'static str) -> Watchdog {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        if !seen.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("{what}: still running after {secs} s, a deadlock");
            std::process::abort();
        }
    });
    Watchdog(done)
}

/// An extended completion queue of 64 entries that reports byte lengths.
fn ex_queue(f: &common::Fixture) -> Arc<CompletionQueue> {
    CompletionQueue::new_ex(&f.ctx, 64, None, WcFlags::BYTE_LEN).unwrap()
}

/// Two connected leased RC queue pairs whose completions go to `cq`.
fn leased_pair(f: &common::Fixture, cq: &Arc<CompletionQueue>) -> (LeasedQp, LeasedQp) {
    let (a, b) = f.pair_with(&QpConfig::rc(cq));
    (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap())
}

/// A 32-byte SEND from `from` into a receive posted on `to` (ids `id` and
/// `id + 1`): two completions on their queue.
fn send_one(from: &mut LeasedQp, to: &mut LeasedQp, buf: &DeviceRegion, id: u64) {
    to.post_recv_device(id, buf, 0..64).unwrap();
    from.post_send_device(id + 1, SendOp::Send, buf, 0..32, SendFlags::SIGNALED)
        .unwrap();
}

/// Inside a `poll_ex` callback the provider holds the queue's lock: polling,
/// `poll_completions`, `poll_ex` or resizing that queue from the callback is
/// refused, also from a callback of another queue nested in it (each would wait
/// for itself for ever).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_poll_ex_callback_does_not_poll_or_resize_its_own_queue() {
    let _watch = watchdog(60, "poll_ex callback");
    let f = fixture();
    let (cq, inner) = (ex_queue(&f), ex_queue(&f));
    let (mut a, mut b) = leased_pair(&f, &cq);
    let (mut c, mut d) = leased_pair(&f, &inner);
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    send_one(&mut a, &mut b, &buf, 1);
    send_one(&mut c, &mut d, &buf, 3);
    let refusals = |q: &CompletionQueue| {
        let mut wcs = [WorkCompletion::default(); 4];
        [
            q.poll(&mut wcs).map(|d| d.len()).unwrap_err().to_string(),
            q.poll_completions(&mut wcs)
                .map(|c| c.count())
                .unwrap_err()
                .to_string(),
            q.resize(128).unwrap_err().to_string(),
            q.poll_ex(1, |_| {}).unwrap_err().to_string(),
        ]
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut outer_seen, mut inner_seen) = (0, 0);
    let mut said = Vec::new();
    while outer_seen < 2 || inner_seen < 2 {
        cq.poll_ex(4, |wc| {
            said.extend(refusals(&cq));
            assert!(a.complete_ex(wc).is_ok() || b.complete_ex(wc).is_ok());
            outer_seen += 1;
            // A callback of another queue inside this one: both are refused.
            while inner_seen < 2 && Instant::now() < deadline {
                inner
                    .poll_ex(4, |wc| {
                        said.extend(refusals(&cq));
                        said.extend(refusals(&inner));
                        assert!(c.complete_ex(wc).is_ok() || d.complete_ex(wc).is_ok());
                        inner_seen += 1;
                    })
                    .unwrap();
            }
        })
        .unwrap();
        assert!(Instant::now() < deadline, "timed out");
    }
    assert_eq!(said.len(), 2 * 4 + 2 * 8);
    for e in &said {
        assert!(e.contains("inside its own poll_ex callback"), "{e}");
    }
    // Outside the callbacks, all of it works again.
    let mut wcs = [WorkCompletion::default(); 4];
    assert!(cq.poll(&mut wcs).is_ok() && inner.poll(&mut wcs).is_ok());
}

/// Callbacks nest only into queues created later: a callback of the later queue
/// may not poll, resize or `poll_ex` the earlier one, nor reset a queue pair of it
/// (on mlx5 a reset takes its queues' locks). Were that allowed, one thread in a
/// callback of the earlier queue touching the later one, and another doing the
/// reverse, would each hold the lock the other waits for. A reset of a queue
/// pair of the callback's own queue is refused too; nothing refused changes the
/// queue pair, and a queue pair of a later queue resets from an earlier one's
/// callback.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn poll_ex_callbacks_nest_only_into_later_queues() {
    use rdma_safe::sys::ibv_qp_state;
    let _watch = watchdog(60, "nested poll_ex callbacks");
    let f = fixture();
    let (first, later) = (ex_queue(&f), ex_queue(&f));
    let (mut a, mut b) = leased_pair(&f, &first);
    let (mut c, mut d) = leased_pair(&f, &later);
    // Idle queue pairs of each queue, to reset.
    let (of_first, _peer1) = f.pair_with(&QpConfig::rc(&first));
    let (of_later, _peer2) = f.pair_with(&QpConfig::rc(&later));
    let (mut of_first, mut of_later) = (Some(of_first), Some(of_later));
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    send_one(&mut a, &mut b, &buf, 1);
    send_one(&mut c, &mut d, &buf, 3);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut in_later, mut in_first, mut nested) = (0, 0, 0);
    let mut said = Vec::new();
    // A callback of the later queue touching the first: all refused.
    while in_later < 2 {
        later
            .poll_ex(4, |wc| {
                let mut wcs = [WorkCompletion::default(); 4];
                said.push(first.poll(&mut wcs).map(|d| d.len()).unwrap_err());
                said.push(
                    first
                        .poll_completions(&mut wcs)
                        .map(|c| c.count())
                        .unwrap_err(),
                );
                said.push(first.resize(128).unwrap_err());
                said.push(first.poll_ex(1, |_| {}).unwrap_err());
                let refused = of_first.take().unwrap().reset().unwrap_err();
                said.push(refused.error);
                of_first = Some(refused.qp);
                assert!(c.complete_ex(wc).is_ok() || d.complete_ex(wc).is_ok());
                in_later += 1;
            })
            .unwrap();
        assert!(Instant::now() < deadline, "timed out");
    }
    assert_eq!(said.len(), 2 * 5);
    for e in &said {
        assert!(e.to_string().contains("of a queue created after it"), "{e}");
    }
    let qp = of_first.take().unwrap();
    assert_eq!(
        qp.query_state().unwrap(),
        ibv_qp_state::IBV_QPS_RTS,
        "a refusal changed it"
    );
    // A callback of the first queue: its own queue pair's reset is refused, and
    // the later queue may be polled and a queue pair of it reset.
    let mut own = Some(qp);
    let mut reset_later = None;

    send_one(&mut c, &mut d, &buf, 5);
    while in_first < 2 || nested < 2 {
        first
            .poll_ex(4, |wc| {
                let refused = own.take().unwrap().reset().unwrap_err();
                assert!(
                    refused
                        .error
                        .to_string()
                        .contains("inside its own poll_ex callback"),
                    "{}",
                    refused.error
                );
                own = Some(refused.qp);
                if let Some(qp) = of_later.take() {
                    reset_later = Some(qp.reset().expect("a later queue's queue pair"));
                }
                assert!(a.complete_ex(wc).is_ok() || b.complete_ex(wc).is_ok());
                in_first += 1;
                while nested < 2 && Instant::now() < deadline {
                    later
                        .poll_ex(4, |wc| {
                            assert!(c.complete_ex(wc).is_ok() || d.complete_ex(wc).is_ok());
                            nested += 1;
                        })
                        .unwrap();
                }
            })
            .unwrap();
        assert!(Instant::now() < deadline, "timed out");
    }
    let qp = reset_later.expect("no reset ran");
    assert_eq!(qp.query_state().unwrap(), ibv_qp_state::IBV_QPS_RESET);
    // Outside the callbacks the refused reset runs.
    let own = own
        .take()
        .unwrap()
        .reset()
        .expect("reset outside the callbacks");
    assert_eq!(own.query_state().unwrap(), ibv_qp_state::IBV_QPS_RESET);
}

/// A queue pair whose send and receive queues differ is destroyed with no
/// `poll_ex` callback of either running (mlx5 cleans both queues holding both
/// their locks, in its own order, which could cross a callback of one polling
/// the other): its drop waits for a callback of its send queue on another thread
/// to return. Dropped inside a callback of one of its queues, it does not wait
/// for itself.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_queue_pair_of_two_queues_is_destroyed_outside_their_callbacks() {
    let _watch = watchdog(60, "destroy of a queue pair of two queues");
    let f = fixture();
    let (send, recv) = (ex_queue(&f), ex_queue(&f));
    let mut two = QpConfig::rc(&send);
    two.recv_cq = recv.clone();
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    // A callback of either queue (the lower id and the higher) on another thread.
    for cq in [&send, &recv] {
        let (doomed, _peer) = f.pair_with(&two);
        drop_during_a_callback(&f, cq, &buf, doomed);
    }
    // A plain send queue (no callbacks) and an extended receive queue.
    let mut mixed = QpConfig::rc(&f.cq);
    mixed.recv_cq = recv.clone();
    let (doomed, _peer) = f.pair_with(&mixed);
    drop_during_a_callback(&f, &recv, &buf, doomed);
    // Inside a callback of either of its queues, a drop destroys at once. Not
    // on mlx5, whose destroy takes the lock that callback holds (poll_ex's doc).
    if !f.ctx.query_device().unwrap().is_soft_roce() {
        return;
    }
    for cq in [&send, &recv] {
        let (mut c, mut d) = leased_pair(&f, cq);
        send_one(&mut c, &mut d, &buf, 3);
        let (qp, _peer) = f.pair_with(&two);
        let mut qp = Some(qp);
        let deadline = Instant::now() + Duration::from_secs(20);
        while qp.is_some() {
            cq.poll_ex(1, |wc| {
                assert!(c.complete_ex(wc).is_ok() || d.complete_ex(wc).is_ok());
                drop(qp.take());
            })
            .unwrap();
            assert!(Instant::now() < deadline, "timed out");
        }
        drain(cq, &mut c, &mut d);
    }
}

/// Drops `doomed` while a callback of `cq` runs on another thread, and checks
/// that the drop returned only after the callback did.
fn drop_during_a_callback(
    f: &common::Fixture,
    cq: &Arc<CompletionQueue>,
    buf: &DeviceRegion,
    doomed: rdma_safe::QueuePair<rdma_safe::qp::Rts>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut a, mut b) = leased_pair(f, cq);
    send_one(&mut a, &mut b, buf, 1);
    let done = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut seen = 0;
            while seen == 0 && Instant::now() < deadline {
                seen += cq
                    .poll_ex(1, |wc| {
                        assert!(a.complete_ex(wc).is_ok() || b.complete_ex(wc).is_ok());
                        tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(500));
                        done.store(true, Ordering::SeqCst);
                    })
                    .unwrap();
            }
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("no completion reached the callback");
        drop(doomed);
        assert!(
            done.load(Ordering::SeqCst),
            "the queue pair was destroyed while a callback of one of its queues ran"
        );
    });
    drain(cq, &mut a, &mut b);
}

/// Polls `cq` until the pair `a`, `b` has nothing outstanding.
fn drain(cq: &CompletionQueue, a: &mut LeasedQp, b: &mut LeasedQp) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.outstanding_sends() + b.outstanding_recvs() > 0 {
        cq.poll_ex(4, |wc| {
            assert!(a.complete_ex(wc).is_ok() || b.complete_ex(wc).is_ok());
        })
        .unwrap();
        assert!(Instant::now() < deadline, "timed out");
    }
}

/// A post from a `poll_ex` callback waits for the polls under way on its queue to
/// number what they took; a thread in `poll_completions` on the same queue is
/// blocked on the provider's lock, which the callback holds. So that poll must not
/// count as under way before it has the queue: before, the two waited for each
/// other for ever. Here the other thread is made to be inside `poll_completions`
/// whenever the callback posts.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_post_from_a_poll_ex_callback_does_not_wait_for_a_blocked_poller() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _watch = watchdog(60, "post from a poll_ex callback");
    let f = fixture();
    let cq = CompletionQueue::new_ex(&f.ctx, 64, None, WcFlags::BYTE_LEN).unwrap();
    let (a, b) = f.pair_with(&QpConfig::rc(&cq));
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    let (stop, polling) = (AtomicBool::new(false), AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    /// Stops the other thread however the test ends.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    std::thread::scope(|s| {
        let _stop = Stop(&stop);
        s.spawn(|| {
            let mut wcs = [WorkCompletion::default(); 4];
            while !stop.load(Ordering::SeqCst) {
                polling.store(true, Ordering::SeqCst);
                for c in cq.poll_completions(&mut wcs).unwrap() {
                    tx.send(c).unwrap();
                }
                polling.store(false, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let again = |a: &mut LeasedQp, b: &mut LeasedQp, send: bool| {
            if send {
                let flags = SendFlags::SIGNALED;
                a.post_send_device(2, SendOp::Send, &buf, 0..32, flags)
                    .unwrap();
            } else {
                b.post_recv_device(1, &buf, 0..64).unwrap();
            }
        };
        again(&mut a, &mut b, false);
        again(&mut a, &mut b, true);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut from_callback = 0;
        while from_callback < 10 {
            cq.poll_ex(4, |wc| {
                // Post only once the other thread is in its poll, and has had time
                // to reach the queue's lock.
                while !polling.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(5));
                let send = a.complete_ex(wc).is_ok();
                assert!(send || b.complete_ex(wc).is_ok(), "nobody's completion");
                again(&mut a, &mut b, send);
                from_callback += 1;
            })
            .unwrap();
            for c in rx.try_iter() {
                let send = c.qp_num() == a.qp().qp_num();
                let owner = if send { &mut a } else { &mut b };
                assert!(owner.complete(c).is_ok());
                again(&mut a, &mut b, send);
            }
            assert!(
                Instant::now() < deadline,
                "{from_callback} posts from the callback"
            );
        }
    });
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn extended_queue_completions_release_once() {
    let f = fixture();
    let cq = CompletionQueue::new_ex(&f.ctx, 16, None, WcFlags::BYTE_LEN).unwrap();
    let (a, b) = f.pair_with(&QpConfig::rc(&cq));
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    // A queue pair of another queue: it refuses these completions for that alone.
    let (c, _d) = f.pair();
    let mut c = LeasedQp::new(c).unwrap();
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    b.post_recv_device(5, &buf, 0..64).unwrap();
    a.post_send_device(6, SendOp::Send, &buf, 0..32, SendFlags::SIGNALED)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        cq.poll_ex(4, |wc| {
            assert!(wc.is_ok());
            let err = c.complete_ex(wc).unwrap_err().to_string();
            assert!(err.contains("another queue"), "{err}");
            // The tag names its LeasedQp: the other one refuses it.
            let by_a = a.complete_ex(wc).map(|released| released.wr_id());
            let (mine, owner, other) = match by_a {
                Ok(id) => (id, &mut a, &mut b),
                Err(_) => {
                    let id = b.complete_ex(wc).map(|released| released.wr_id());
                    (id.unwrap(), &mut b, &mut a)
                }
            };
            assert!(other.complete_ex(wc).is_err(), "not the other's");
            let err = owner.complete_ex(wc).unwrap_err();
            assert!(err.to_string().contains("not outstanding"), "{err}");
            if mine == 5 {
                assert_eq!(wc.byte_len(), Some(32), "the receive's length");
            }
            seen.push(mine);
        })
        .unwrap();
        assert!(Instant::now() < deadline, "timed out");
    }
    seen.sort_unstable();
    assert_eq!(seen, [5, 6]);
    assert_eq!(buf.holders(), 1, "both requests released their holds");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn empty_range_posts_without_a_scatter_gather_entry() {
    let f = fixture();
    let (a, b) = f.pair();
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    let sink = MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap();
    let remote = sink.remote(0..0).unwrap();
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    b.post_recv_device(1, &buf, 0..0).unwrap();
    let src = MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap();
    let op = SendOp::WriteWithImm(remote, 0xfeed);
    a.post_send(2, op, Lease::Owned(src), 0..0, true).unwrap();
    let mut wcs = [WorkCompletion::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while seen < 2 {
        for wc in f.cq.poll_completions(&mut wcs).unwrap() {
            wc.result().unwrap();
            if wc.qp_num() == b.qp().qp_num() {
                assert_eq!((wc.byte_len(), wc.imm_data()), (0, Some(0xfeed)));
                assert_eq!(b.complete(wc).unwrap().wr_id(), 1);
            } else {
                let back: Vec<u64> = a.complete(wc).unwrap().map(|(id, _)| id).collect();
                assert_eq!(back, [2], "the empty source comes back");
            }
            seen += 1;
        }
        assert!(Instant::now() < deadline, "timed out");
    }
    assert_eq!(sink.to_vec(), vec![0; 64], "nothing was written");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn completions_left_by_dropped_leased_queue_pairs_release_nothing_later() {
    let f = fixture();
    // No queue pair numbers in these completions: only the tags tell owners apart.
    let cq = CompletionQueue::new_ex(&f.ctx, 16, None, WcFlags::NONE).unwrap();
    let buf = DeviceRegion::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    let (a, b) = f.pair_with(&QpConfig::rc(&cq));
    let (mut a, mut b) = (LeasedQp::new(a).unwrap(), LeasedQp::new(b).unwrap());
    b.post_recv_device(1, &buf, 0..64).unwrap();
    a.post_send_device(2, SendOp::Send, &buf, 0..32, SendFlags::SIGNALED)
        .unwrap();
    // Dropped with both requests done but their completions not polled: they stay
    // in the queue (the queue pairs are destroyed, their leases released).
    std::thread::sleep(Duration::from_millis(200));
    drop((a, b));
    assert_eq!(buf.holders(), 1, "dropping released the holds");
    // Two new LeasedQps on the queue post into the same slots and generations.
    let (c, d) = f.pair_with(&QpConfig::rc(&cq));
    let (mut c, mut d) = (LeasedQp::new(c).unwrap(), LeasedQp::new(d).unwrap());
    d.post_recv_device(3, &buf, 0..64).unwrap();
    c.post_send_device(4, SendOp::Send, &buf, 0..32, SendFlags::SIGNALED)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut stale, mut fresh) = (0, Vec::new());
    while stale + fresh.len() < 4 {
        cq.poll_ex(4, |wc| {
            let by_c = c.complete_ex(wc).map(|r| r.wr_id());
            let by_d = d.complete_ex(wc).map(|r| r.wr_id());
            match (by_c, by_d) {
                (Err(ec), Err(ed)) => {
                    for e in [ec, ed] {
                        let e = e.to_string();
                        assert!(e.contains("not posted by this LeasedQp"), "{e}");
                    }
                    stale += 1;
                }
                (Ok(id), Err(_)) | (Err(_), Ok(id)) => fresh.push(id),
                (Ok(_), Ok(_)) => panic!("one completion released two queue pairs' requests"),
            }
        })
        .unwrap();
        assert!(
            Instant::now() < deadline,
            "timed out: {stale} stale, {fresh:?}"
        );
    }
    fresh.sort_unstable();
    assert_eq!((stale, fresh), (2, vec![3, 4]));
    assert_eq!(c.outstanding_sends() + d.outstanding_recvs(), 0);
    assert_eq!(buf.holders(), 1);
}

//! Device tests of the safe posting layer: buffers come back only through their
//! completions, misuse is refused with the buffer returned, and the steady-state
//! post/poll path allocates nothing (a counting allocator proves it over 10,000
//! operations). Run in the Soft-RoCE guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::lease::{Lease, LeasedQp, SendOp};
use rdma_safe::{Access, MemoryRegion, QpConfig, WorkCompletion};
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
    assert!(matches!(err.lease, Lease::Shared(_)));
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

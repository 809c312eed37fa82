//! Device tests of the soundness rules of `docs/safety.md` that the runtime (not the
//! type system) enforces, written as an attacker would: completions handed to the
//! wrong owner, a UD queue pair or one with a shared receive queue wrapped in a
//! `LeasedQp`, slices over memory a peer can write, a region dropped while a window
//! still grants access to it. Run in the Soft-RoCE guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::lease::{Lease, LeasedQp, SendFlags, SendOp};
use rdma_safe::qp::{QpType, Rts};
use rdma_safe::{
    sys, Access, CompletionQueue, InitAttr, MemoryRegion, MemoryWindow, MwType, ProtectionDomain,
    QpConfig, QueuePair, RemoteSlice, RtrAttr, RtsAttr, SendWr, SharedReceiveQueue, WorkCompletion,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls `cq` until one completion arrives.
fn one(cq: &CompletionQueue) -> rdma_safe::Completion {
    let mut scratch = [WorkCompletion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = cq.poll_completions(&mut scratch).unwrap().next() {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for a completion"
        );
    }
}

/// A WRITE of 4096 bytes of `fill` to `addr` under `rkey` (a peer's, through a
/// window), waited for; it must succeed.
fn write_filled(f: &common::Fixture, qp: &mut LeasedQp, addr: u64, rkey: u32, fill: u8) {
    let mut src = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
    src.as_mut_slice().unwrap().fill(fill);
    let remote = RemoteSlice {
        addr,
        len: 4096,
        rkey,
    };
    qp.post_send(1, SendOp::Write(remote), Lease::Owned(src), 0..4096, true)
        .unwrap();
    let done = one(&f.cq);
    done.result().unwrap();
    drop(qp.complete(done).unwrap());
}

/// A WRITE of 64 bytes of a fresh shared region to `remote`.
fn write(f: &common::Fixture, qp: &mut LeasedQp, wr_id: u64, remote: RemoteSlice) {
    let src = Arc::new(MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap());
    qp.post_send(
        wr_id,
        SendOp::Write(remote),
        Lease::Shared(src),
        0..64,
        true,
    )
    .unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_completion_is_released_only_by_its_own_queue_pair() {
    let f = fixture();
    let target = MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap();
    let remote = target.remote(0..64).unwrap();
    // `a` and `c` share the fixture's CQ; `d` has a CQ of its own.
    let (a, _b) = f.pair();
    let (c, _e) = f.pair();
    let own_cq = CompletionQueue::new(&f.ctx, 16).unwrap();
    let (d, _g) = f.pair_of(&QpConfig::rc(&own_cq), &QpConfig::rc(&f.cq));
    let (mut a, mut c, mut d) = (
        LeasedQp::new(a).unwrap(),
        LeasedQp::new(c).unwrap(),
        LeasedQp::new(d).unwrap(),
    );

    // C's completion handed to A (same CQ, another QP number): refused, handed back.
    write(&f, &mut c, 7, remote);
    let wrong = a.complete(one(&f.cq)).unwrap_err();
    assert!(
        wrong.error.to_string().contains("handed to QP"),
        "{}",
        wrong.error
    );
    assert_eq!(a.outstanding_sends(), 0);
    // D's own CQ is another queue: a completion polled from the fixture's is not its.
    let elsewhere = d.complete(wrong.completion).unwrap_err();
    assert!(
        elsewhere
            .error
            .to_string()
            .contains("polled from completion queue"),
        "{}",
        elsewhere.error
    );
    // Its owner takes it.
    let ids: Vec<u64> = c
        .complete(elsewhere.completion)
        .unwrap()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, [7]);
    assert_eq!(c.outstanding_sends(), 0);

    // D's completion comes from D's CQ and releases D's buffer, once.
    write(&f, &mut d, 9, remote);
    assert_eq!(d.outstanding_sends(), 1);
    let done: Vec<u64> = d
        .complete(one(&own_cq))
        .unwrap()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(done, [9]);
    assert_eq!(d.outstanding_sends(), 0);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_raw_post_on_a_leased_queue_pair_releases_nothing() {
    let f = fixture();
    let (a, _b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    let target = MemoryRegion::new(&f.pd, 64, Access::ALL_REMOTE).unwrap();
    let remote = target.remote(0..64).unwrap();
    write(&f, &mut a, 1, remote); // outstanding until its own completion
    let first = one(&f.cq);
    // A raw WRITE whose id copies the leased request's: it names slot and tag, but a
    // request that completed already is not outstanding.
    let raw = MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap();
    let mut sge = [raw.local(0..64).unwrap()];
    let mut wr = SendWr::rdma_write(first.wr_id(), &mut sge, remote).signaled();
    let released: Vec<u64> = a.complete(first).unwrap().map(|(id, _)| id).collect();
    assert_eq!(released, [1]);
    // SAFETY: `raw` outlives the completion polled right below. (Its id breaks the
    // raw posts' contract on purpose: bit 63 is reserved for LeasedQp.)
    unsafe { a.qp().post_send(&mut wr) }.unwrap();
    let replayed = a.complete(one(&f.cq)).unwrap_err();
    assert!(
        replayed.error.to_string().contains("not outstanding"),
        "{}",
        replayed.error
    );
    // An id without the LeasedQp bit is refused as not its own.
    let mut sge = [raw.local(0..64).unwrap()];
    let mut wr = SendWr::rdma_write(5, &mut sge, remote).signaled();
    // SAFETY: as above; this id honours the contract.
    unsafe { a.qp().post_send(&mut wr) }.unwrap();
    let foreign = a.complete(one(&f.cq)).unwrap_err();
    assert!(
        foreign
            .error
            .to_string()
            .contains("not posted by this LeasedQp"),
        "{}",
        foreign.error
    );
}

/// A queue pair of `config` brought to RTS as UD.
fn ud_rts(f: &common::Fixture, config: &QpConfig) -> QueuePair<Rts> {
    let init = InitAttr {
        qkey: 0x1111,
        ..Default::default()
    };
    QueuePair::new(&f.pd, config)
        .unwrap()
        .to_init(&init)
        .unwrap()
        .to_rtr(&RtrAttr::new(
            Default::default(),
            sys::ibv_mtu::IBV_MTU_1024,
        ))
        .unwrap()
        .to_rts(&RtsAttr::new(1))
        .unwrap()
}

/// A window bind on a UD queue pair is refused before the provider sees it: mlx5
/// would read the bind's address handle (it has none) and crash the process.
/// Soft-RoCE refuses it itself (`EINVAL`), so here the error must be rdma-safe's.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_window_is_not_bound_on_a_ud_queue_pair() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.qp_type = QpType::Ud;
    let ud = ud_rts(&f, &config);
    let mr = Arc::new(MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap());
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type1).unwrap();
    let e = mw
        .bind(&ud, &mr, 0..4096, Access::REMOTE_READ, 1)
        .unwrap_err();
    assert!(
        matches!(e, rdma_safe::Error::InvalidArgument(_)) && e.to_string().contains("UD"),
        "{e}"
    );
    // Nothing was posted: no completion comes.
    std::thread::sleep(Duration::from_millis(100));
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(f.cq.poll(&mut wcs).unwrap().len(), 0);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn ud_and_shared_receive_queue_pairs_are_refused_with_the_queue_pair_back() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.qp_type = QpType::Ud;
    let ud = ud_rts(&f, &config);
    let qpn = ud.qp_num();
    let refused = LeasedQp::new(ud).unwrap_err();
    assert!(
        refused
            .error
            .to_string()
            .contains("UD SEND needs an address handle"),
        "{}",
        refused.error
    );
    assert_eq!(refused.qp.qp_num(), qpn, "the queue pair comes back");
    assert!(refused.qp.query_state().is_ok(), "and still works");

    let srq = SharedReceiveQueue::new(&f.pd, 16, 1).unwrap();
    let mut config = QpConfig::rc(&f.cq);
    config.srq = Some(srq);
    let (with_srq, _b) = f.pair_of(&config, &QpConfig::rc(&f.cq));
    let refused = LeasedQp::new(with_srq).unwrap_err();
    assert!(
        refused.error.to_string().contains("shared receive queue"),
        "{}",
        refused.error
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn remotely_writable_memory_is_never_a_slice() {
    let f = fixture();
    let (a, _b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    for access in [
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        Access::LOCAL_WRITE | Access::MW_BIND,
    ] {
        let mut mr = MemoryRegion::new(&f.pd, 4096, access).unwrap();
        assert!(mr.remotely_writable());
        let err = mr.as_slice().unwrap_err().to_string();
        assert!(err.contains("read_at"), "{err}");
        let err = mr.as_mut_slice().unwrap_err().to_string();
        assert!(err.contains("write_at"), "{err}");
    }
    // A region only the peer reads is a plain slice.
    let mut local =
        MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    local.as_mut_slice().unwrap().fill(0x6d);

    // A loopback WRITE from safe code lands in a remotely writable region; the
    // volatile copies see it, and nothing else ever aliased those bytes.
    let target = MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap();
    let src = Arc::new(local);
    a.post_send(
        1,
        SendOp::Write(target.remote(0..4096).unwrap()),
        Lease::Shared(src),
        0..4096,
        true,
    )
    .unwrap();
    let done = one(&f.cq);
    done.result().unwrap();
    assert_eq!(a.complete(done).unwrap().count(), 1);
    let mut got = vec![0; 4096];
    target.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x6d));
    assert_eq!(target.to_vec(), got);
    let err = target.read_at(4000, &mut got).unwrap_err().to_string();
    assert!(err.contains("outside the region"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_window_keeps_its_region_alive_for_the_peer() {
    let f = fixture();
    let (a, b) = f.pair();
    let target =
        Arc::new(MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap());
    let weak = Arc::downgrade(&target);
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type2).unwrap();
    let (bind, rkey) = SendWr::bind_mw(
        1,
        &mut mw,
        &target,
        0..4096,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    )
    .unwrap();
    let mut bind = bind.signaled();
    // SAFETY: no local buffer is involved; the window holds the region.
    unsafe { b.post_send(&mut bind) }.unwrap();
    f.completions(1)[0].result().unwrap();
    let addr = target.addr();
    drop(target); // the owner lets go; the window still grants access
    assert!(weak.upgrade().is_some(), "the window keeps the region");

    // The peer writes through the window: into live, registered memory.
    let mut a = LeasedQp::new(a).unwrap();
    write_filled(&f, &mut a, addr, rkey, 0x42);
    let region = mw.region().expect("the window's region");
    assert!(region.to_vec().iter().all(|&x| x == 0x42));
    drop(region);
    // Windows first (rxe stalls destroying a QP a bound type 2 window refers to);
    // then the region goes with its last holder.
    drop(mw);
    assert!(weak.upgrade().is_none(), "released with the window");
    drop((a, b));
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_window_holds_every_region_it_may_still_be_bound_to() {
    let f = fixture();
    let (a, b) = f.pair();
    let rights = Access::LOCAL_WRITE | Access::MW_BIND;
    let first = Arc::new(MemoryRegion::new(&f.pd, 4096, rights).unwrap());
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type1).unwrap();
    // Bit 63 of a work request id is LeasedQp's: a bind's completion carrying it
    // could pass for a leased request's and free its buffer early.
    let err = mw
        .bind(&b, &first, 0..4096, Access::REMOTE_WRITE, 1 << 63 | 7)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bit 63"), "{err}");
    let rkey = mw
        .bind(&b, &first, 0..4096, Access::REMOTE_WRITE, 1)
        .unwrap();
    f.completions(1)[0].result().unwrap();
    // A bind to a region of another protection domain is refused before the
    // provider sees it (rdma-safe's own check), and the first binding stays valid: the window must still hold its region, or
    // its owner could take it back and lend its bytes as a slice.
    let other_pd = ProtectionDomain::new(&f.ctx).unwrap();
    let other = Arc::new(MemoryRegion::new(&other_pd, 4096, rights).unwrap());
    let err = mw
        .bind(&b, &other, 0..4096, Access::REMOTE_WRITE, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ibv_bind_mw"), "{err}");
    let first = Arc::try_unwrap(first).expect_err("the window lets go of its first region");
    // Rightly so: the peer still writes through the first bind's key.
    let mut a = LeasedQp::new(a).unwrap();
    write_filled(&f, &mut a, first.addr(), rkey, 0x5a);
    assert!(
        first.to_vec().iter().all(|&x| x == 0x5a),
        "the peer's write landed"
    );
    // Deallocated, the window lets go of both.
    drop(mw);
    assert_eq!(
        Arc::strong_count(&first),
        1,
        "the first region is the owner's again"
    );
    assert_eq!(Arc::strong_count(&other), 1, "so is the other");
    drop((a, b));
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_read_view_lends_no_bytes() {
    let f = fixture();
    let mut region = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    region.set_window_rights(Access::REMOTE_READ);
    // SAFETY: no window is bound to the view, and it is dropped before the region.
    let view = unsafe { region.read_view(0..64) }.unwrap().view;
    // The region lends its bytes mutably while the view exists...
    region.as_mut_slice().unwrap().fill(0x11);
    // ...so the view must lend none of the same bytes, not even to read.
    let err = view.as_slice().unwrap_err().to_string();
    assert!(err.contains("read view"), "{err}");
    let mut out = [0u8; 8];
    let err = view.read_at(0, &mut out).unwrap_err().to_string();
    assert!(err.contains("read view"), "{err}");
    assert_eq!(out, [0u8; 8], "nothing was read");
    drop(view);
    assert!(region.as_slice().unwrap().iter().all(|&x| x == 0x11));
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_region_that_fails_to_deregister_is_leaked_not_freed() {
    let f = fixture();
    let (a, b) = f.pair();
    // A type 1 window bound with the raw verb, so that the region's drop meets a
    // bound window: rxe then refuses ibv_dereg_mr.
    let region = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let old_addr = region.addr();
    let mw = MemoryWindow::new(&f.pd, MwType::Type1).unwrap();
    let mut bind = sys::ibv_mw_bind {
        wr_id: 1,
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        bind_info: sys::ibv_mw_bind_info {
            mr: region.as_raw(),
            addr: old_addr,
            length: 4096,
            mw_access_flags: (Access::REMOTE_WRITE | Access::LOCAL_WRITE).bits(),
        },
    };
    // SAFETY: QP, window and region are alive; the bind outlives the region on
    // purpose, which is what this test is about.
    let ret = unsafe { sys::ibv_bind_mw(b.as_raw(), mw.as_raw(), &mut bind) };
    assert_eq!(ret, 0, "ibv_bind_mw");
    f.completions(1)[0].result().unwrap();
    // SAFETY: the window is alive; the raw bind updated the provider's key (the
    // window's own `rkey()` tracks binds made through its methods).
    let rkey = unsafe { (*mw.as_raw()).rkey };
    drop(region); // ibv_dereg_mr fails: the memory must stay allocated

    // The allocator hands out the same-sized, same-aligned block next; if the region
    // had been freed it would likely be the old one, and the peer's WRITE below
    // would land in it.
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a non-zero layout; freed below.
    let fresh = unsafe { std::alloc::alloc_zeroed(layout) };
    let mut a = LeasedQp::new(a).unwrap();
    write_filled(&f, &mut a, old_addr, rkey, 0x99);
    // SAFETY: `fresh` holds 4096 initialised bytes.
    let seen = unsafe { std::slice::from_raw_parts(fresh, 4096) }.to_vec();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(fresh, layout) };
    assert_ne!(
        fresh as u64, old_addr,
        "the leaked block was not handed out again"
    );
    assert!(
        seen.iter().all(|&x| x == 0),
        "the peer's write reached reused memory"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_only_windows_keep_a_region_a_plain_slice() {
    let f = fixture();
    let (a, b) = f.pair();
    let mut mr = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    assert!(
        mr.remotely_writable(),
        "windows may grant writes by default"
    );
    mr.set_window_rights(Access::REMOTE_READ);
    assert!(!mr.remotely_writable());
    mr.as_mut_slice().unwrap().fill(0x3e);
    let mr = Arc::new(mr);
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type2).unwrap();
    let err = SendWr::bind_mw(1, &mut mw, &mr, 0..4096, Access::REMOTE_WRITE)
        .err()
        .expect("a write window is refused")
        .to_string();
    assert!(err.contains("may grant at most"), "{err}");
    let (bind, rkey) = SendWr::bind_mw(1, &mut mw, &mr, 0..4096, Access::REMOTE_READ).unwrap();
    let mut bind = bind.signaled();
    // SAFETY: no local buffer is involved; the window holds the region.
    unsafe { b.post_send(&mut bind) }.unwrap();
    f.completions(1)[0].result().unwrap();
    // The peer reads through the window while we hold a slice: reads never race.
    let held = mr.as_slice().unwrap();
    let mut a = LeasedQp::new(a).unwrap();
    let sink = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let remote = RemoteSlice {
        addr: mr.addr(),
        len: 4096,
        rkey,
    };
    a.post_send(1, SendOp::Read(remote), Lease::Owned(sink), 0..4096, true)
        .unwrap();
    let done = one(&f.cq);
    done.result().unwrap();
    let (_, sink) = a.complete(done).unwrap().next().unwrap();
    assert_eq!(sink.region().as_slice().unwrap(), held);
    drop(mw);
    drop((a, b));
}

/// Posts a signaled READ of `len` bytes at `remote` into a fresh region; returns the
/// completion and the bytes.
fn read_remote(
    f: &common::Fixture,
    qp: &mut LeasedQp,
    remote: RemoteSlice,
) -> (WorkCompletion, Vec<u8>) {
    let sink = MemoryRegion::new(&f.pd, remote.len as usize, Access::LOCAL_WRITE).unwrap();
    let len = remote.len as usize;
    qp.post_send(1, SendOp::Read(remote), Lease::Owned(sink), 0..len, true)
        .unwrap();
    let done = one(&f.cq);
    let wc = done.work_completion();
    let (_, sink) = qp.complete(done).unwrap().next().unwrap();
    (wc, sink.region().to_vec())
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_window_rebound_after_invalidation_has_a_new_key_and_the_old_one_is_dead() {
    let f = fixture();
    let (a, b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    let mut mr = MemoryRegion::new(&f.pd, 8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    mr.set_window_rights(Access::REMOTE_READ);
    mr.as_mut_slice().unwrap()[..4096].fill(0x11);
    mr.as_mut_slice().unwrap()[4096..].fill(0x22);
    let mr = Arc::new(mr);
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type2).unwrap();
    let bind = |mw: &mut MemoryWindow, range: std::ops::Range<usize>| -> u32 {
        let (wr, rkey) = SendWr::bind_mw(7, mw, &mr, range, Access::REMOTE_READ).unwrap();
        let mut wr = wr.signaled();
        // SAFETY: no local buffer is involved; the window holds the region.
        unsafe { b.post_send(&mut wr) }.unwrap();
        f.completions(1)[0].result().unwrap();
        rkey
    };
    let first = bind(&mut mw, 0..4096);
    assert_eq!(mw.rkey(), first);
    let at = |rkey, offset: usize| RemoteSlice {
        addr: mr.addr() + offset as u64,
        len: 4096,
        rkey,
    };
    let (wc, got) = read_remote(&f, &mut a, at(first, 0));
    wc.result().unwrap();
    assert!(got.iter().all(|&x| x == 0x11));

    // Invalidate with the key the window tracks, then bind the same window again.
    let mut inv = SendWr::local_invalidate(8, mw.rkey()).signaled();
    // SAFETY: no buffer is involved.
    unsafe { b.post_send(&mut inv) }.unwrap();
    f.completions(1)[0].result().unwrap();
    let second = bind(&mut mw, 4096..8192);
    assert_ne!(second, first, "a new key for the new binding");
    let (wc, got) = read_remote(&f, &mut a, at(second, 4096));
    wc.result().unwrap();
    assert!(got.iter().all(|&x| x == 0x22));

    // The first binding's key is dead: the peer's READ fails with an access error.
    let (wc, _) = read_remote(&f, &mut a, at(first, 0));
    assert_eq!(
        wc.status(),
        sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        "{wc:?}"
    );
    drop(mw);
}

/// A second context on the same device: objects of it are another context's.
fn other_context() -> Arc<rdma_safe::Context> {
    rdma_safe::Selection::from_env(None, 1, None)
        .open()
        .expect("the device, opened again")
        .ctx
}

/// The error of `r`, which must be refused with `words` in its message.
fn refused<T>(r: rdma_safe::Result<T>, words: &[&str]) {
    let Err(e) = r else {
        panic!("accepted; expected an error saying {words:?}")
    };
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "{text:?} should say {w:?}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn queues_of_another_device_context_are_refused() {
    let f = fixture();
    let ctx2 = other_context();
    assert_ne!(ctx2.as_raw(), f.ctx.as_raw());
    let cq2 = CompletionQueue::new(&ctx2, 16).unwrap();
    refused(
        QueuePair::new(&f.pd, &QpConfig::rc(&cq2)),
        &[
            "ibv_create_qp",
            "send completion queue",
            "another device context",
        ],
    );
    let mut config = QpConfig::rc(&f.cq);
    config.recv_cq = cq2.clone();
    refused(
        QueuePair::new(&f.pd, &config),
        &["receive completion queue", "another device context"],
    );
    let pd2 = ProtectionDomain::new(&ctx2).unwrap();
    let mut config = QpConfig::rc(&f.cq);
    config.srq = Some(SharedReceiveQueue::new(&pd2, 16, 1).unwrap());
    refused(
        QueuePair::new(&f.pd, &config),
        &["shared receive queue", "another device context"],
    );
    let channel2 = rdma_safe::CompletionChannel::new(&ctx2).unwrap();
    refused(
        CompletionQueue::with_channel(&f.ctx, 16, &channel2, 0),
        &[
            "ibv_create_cq",
            "completion channel",
            "another device context",
        ],
    );
    refused(
        CompletionQueue::new_ex(&f.ctx, 16, Some(&channel2), rdma_safe::WcFlags::NONE),
        &["ibv_create_cq_ex", "completion channel"],
    );
    // The same objects of one context are taken.
    let cq = CompletionQueue::with_channel(&ctx2, 16, &channel2, 0).unwrap();
    QueuePair::new(&pd2, &QpConfig::rc(&cq)).expect("one context throughout");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_window_binds_only_within_its_protection_domain() {
    let f = fixture();
    let (_a, b) = f.pair();
    let pd2 = ProtectionDomain::new(&f.ctx).unwrap();
    let access = Access::LOCAL_WRITE | Access::MW_BIND;
    let mr = Arc::new(MemoryRegion::new(&f.pd, 4096, access).unwrap());
    let mr2 = Arc::new(MemoryRegion::new(&pd2, 4096, access).unwrap());
    // A type 1 window of pd2: the queue pair (of f.pd) is another domain's.
    let mut mw2 = MemoryWindow::new(&pd2, MwType::Type1).unwrap();
    refused(
        mw2.bind(&b, &mr2, 0..4096, Access::REMOTE_READ, 1),
        &["ibv_bind_mw", "queue pair", "another protection domain"],
    );
    refused(
        mw2.bind(&b, &mr, 0..4096, Access::REMOTE_READ, 1),
        &["ibv_bind_mw", "region", "another protection domain"],
    );
    assert!(mw2.region().is_none(), "a refused bind holds no region");
    // A type 2 window's BIND_MW request, built for a region of another domain.
    let mut mw2 = MemoryWindow::new(&pd2, MwType::Type2).unwrap();
    refused(
        SendWr::bind_mw(1, &mut mw2, &mr, 0..4096, Access::REMOTE_READ),
        &["BIND_MW", "region", "another protection domain"],
    );
    // Within one domain the bind goes through.
    let mut mw = MemoryWindow::new(&f.pd, MwType::Type1).unwrap();
    let rkey = mw.bind(&b, &mr, 0..4096, Access::REMOTE_READ, 2).unwrap();
    assert_eq!(rkey, mw.rkey());
    f.completions(1)[0].result().unwrap();
}

/// The region of a lease handed back with an error.
fn owned(e: rdma_safe::lease::PostError) -> (MemoryRegion, String) {
    match e.lease {
        Some(Lease::Owned(mr)) => (mr, e.error.to_string()),
        Some(Lease::Shared(_)) => panic!("an exclusive lease came back shared"),
        None => panic!("a refused post kept its lease: {}", e.error),
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn inline_reads_and_atomics_are_refused_so_no_reply_can_be_aimed() {
    // Soft-RoCE keeps an inline request's bytes where the scatter list would be, and
    // for a READ or an atomic it writes the reply to that list: an attacker's bytes
    // naming another region would aim the reply at memory lent out as a slice.
    let f = fixture();
    let mut src = MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    src.as_mut_slice().unwrap().fill(0x77);
    let victim = MemoryRegion::new(&f.pd, 64, Access::LOCAL_WRITE).unwrap();
    let lent = victim.as_slice().unwrap();
    let mut evil = MemoryRegion::new(&f.pd, 16, Access::LOCAL_WRITE).unwrap();
    let forged = evil.as_mut_slice().unwrap();
    forged[..8].copy_from_slice(&victim.addr().to_le_bytes());
    forged[8..12].copy_from_slice(&16u32.to_le_bytes());
    forged[12..].copy_from_slice(&victim.lkey().to_le_bytes());
    let (a, _b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    let inline = SendFlags {
        signaled: true,
        inline: true,
        fenced: false,
    };
    let remote = src.remote(0..16).unwrap();
    let remote8 = src.remote(0..8).unwrap();
    let ops = [
        (SendOp::Read(remote), 0..16),
        (
            SendOp::CompareAndSwap {
                remote: remote8,
                compare: 0,
                swap: 1,
            },
            0..8,
        ),
        (
            SendOp::FetchAndAdd {
                remote: remote8,
                add: 1,
            },
            0..8,
        ),
    ];
    for (op, range) in ops {
        let e = a
            .post_send_with(1, op, Lease::Owned(evil), range, inline)
            .unwrap_err();
        let why;
        (evil, why) = owned(e);
        assert!(
            why.contains("inline") && why.contains("SENDs and WRITEs only"),
            "{op:?}: {why}"
        );
        assert_eq!(a.outstanding_sends(), 0, "{op:?} was posted");
    }
    // An atomic's local buffer is 8 bytes exactly, checked here, not by each device.
    let short = SendOp::FetchAndAdd {
        remote: remote8,
        add: 1,
    };
    let e = a
        .post_send(2, short, Lease::Owned(evil), 0..4, true)
        .unwrap_err();
    let why;
    (evil, why) = owned(e);
    assert!(why.contains("8 bytes"), "{why}");
    // Nothing went to the device: no completion comes, the lent bytes are as they were.
    std::thread::sleep(Duration::from_millis(200));
    let mut scratch = [WorkCompletion::default(); 4];
    assert_eq!(f.cq.poll_completions(&mut scratch).unwrap().len(), 0);
    assert!(lent.iter().all(|&b| b == 0), "the lent region was written");
    // The control: the same READ, not inline, lands in its own buffer.
    a.post_send(3, SendOp::Read(remote), Lease::Owned(evil), 0..16, true)
        .map_err(|e| e.error)
        .unwrap();
    let back: Vec<_> = a.complete(one(&f.cq)).unwrap().collect();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].1.region().to_vec()[..16], [0x77; 16]);
    assert!(lent.iter().all(|&b| b == 0));
}

/// Marks the child process of the provider-lock test.
const SINGLE_THREADED_CHILD: &str = "RDMA_SAFE_SINGLE_THREADED_CHILD";

/// With `MLX5_SINGLE_THREADED=1` in its environment, the mlx5 provider takes no
/// lock on the queues of a device it opens, while rdma-safe's objects are `Send`
/// and `Sync` on the strength of those locks: such a process gets no device, by
/// either way in (verbs or the CM), and a process that sets it after opening one
/// gets no new queue (mlx5 keeps the variable in a global from its next open on),
/// each with an error saying why.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_process_that_switches_off_provider_locks_gets_no_device() {
    match std::env::var(SINGLE_THREADED_CHILD).as_deref() {
        Ok("late") => {
            // A device opened first, the variable set after: no queue.
            let ctx = rdma_safe::Context::open(None).unwrap();
            let pd = rdma_safe::ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            std::env::set_var("MLX5_SINGLE_THREADED", "1");
            let late_cq = CompletionQueue::new(&ctx, 16).unwrap_err();
            println!("CQ: {late_cq}");
            let qp = QueuePair::new(&pd, &QpConfig::rc(&cq)).unwrap_err();
            println!("QP: {qp}");
            return;
        }
        Ok(_) => {
            let verbs = rdma_safe::Context::open(None).unwrap_err();
            println!("VERBS: {verbs}");
            let cm = rdma_safe::cm::EventChannel::new().unwrap_err();
            println!("CM: {cm}");
            return;
        }
        Err(_) => {}
    }
    let child = |mode: &str, value: Option<&str>| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "a_process_that_switches_off_provider_locks_gets_no_device",
            "--include-ignored",
            "--nocapture",
        ])
        .env(SINGLE_THREADED_CHILD, mode)
        .env_remove("MLX5_SINGLE_THREADED");
        if let Some(value) = value {
            cmd.env("MLX5_SINGLE_THREADED", value);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        (out.status.success(), stdout + &stderr)
    };
    let (ok, stdout) = child("early", Some("1"));
    assert!(ok, "the child failed: {stdout}");
    let (late_ok, late) = child("late", None);
    assert!(late_ok, "the child failed: {late}");
    for (out, way) in [
        (&stdout, "VERBS: "),
        (&stdout, "CM: "),
        (&late, "CQ: "),
        (&late, "QP: "),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(way))
            .unwrap_or_else(|| panic!("no {way:?} line in: {out}"));
        assert!(line.contains("refused: MLX5_SINGLE_THREADED=1"), "{line}");
    }
    // Any other value keeps mlx5's locks: the device opens (the child's
    // `unwrap_err` then fails, and says what it got).
    let (ok, stdout) = child("early", Some("0"));
    assert!(
        !ok,
        "a device was refused with MLX5_SINGLE_THREADED=0: {stdout}"
    );
    assert!(
        stdout.contains("called `Result::unwrap_err()` on an `Ok` value"),
        "{stdout}"
    );
}

/// Runs test `name` again in a child process with `mode` set in its environment
/// (the test then does the child's part), and returns what the child printed;
/// fails if the child failed.
fn child_run(name: &str, mode: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--include-ignored", "--nocapture"])
        .env(mode, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {text}");
    text
}

/// The child's mode for the doorbell test.
const DOORBELL_CHILD: &str = "RDMA_SAFE_DOORBELL_CHILD";

/// A post whose provider queued the request and then failed to ring the doorbell
/// keeps its buffer: Soft-RoCE writes the request into the queue, then rings with
/// a `write(2)` to the device file, which the kernel refuses (`EACCES`) once the
/// process's credentials changed since the file was opened (here: a new session
/// keyring). The request still runs when the device's queue moves on (here: after
/// a large WRITE before it, which the device was still sending), and its READ
/// writes into the buffer: a buffer handed back with the error would have been
/// written under the program's feet. In a child process, whose credentials change.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_post_whose_doorbell_failed_keeps_its_buffer_until_the_request_ran() {
    if std::env::var(DOORBELL_CHILD).is_ok() {
        return doorbell_child();
    }
    let text = child_run(
        "a_post_whose_doorbell_failed_keeps_its_buffer_until_the_request_ran",
        DOORBELL_CHILD,
    );
    for line in [
        "POST: ibv_post_send failed, and its work request may have been queued",
        "LEASE: kept",
        "READ: ran into the kept buffer",
    ] {
        assert!(text.contains(line), "no {line:?} in: {text}");
    }
}

fn doorbell_child() {
    const BIG: usize = 32 << 20;
    let f = fixture();
    let (a, b) = f.pair();
    let mut a = LeasedQp::new(a).unwrap();
    let target = MemoryRegion::new(&f.pd, BIG, Access::ALL_REMOTE).unwrap();
    let mut src = MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap();
    src.write_at(0, &[0x5a; 4096]).unwrap();
    let big = MemoryRegion::new(&f.pd, BIG, Access::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let (to_target, from_src) = (target.remote(0..BIG).unwrap(), src.remote(0..4096).unwrap());
    // The WRITE keeps the device's queue busy for a while (about a second here).
    let write = SendOp::Write(to_target);
    a.post_send(1, write, Lease::Owned(big), 0..BIG, true)
        .unwrap();
    // SAFETY: KEYCTL_JOIN_SESSION_KEYRING with no name gives the process a new
    // anonymous session keyring (new credentials); it touches no memory of ours.
    let ret = unsafe { libc::syscall(libc::SYS_keyctl, 1, std::ptr::null::<u8>()) };
    assert!(ret >= 0, "keyctl: {}", std::io::Error::last_os_error());
    let read = SendOp::Read(from_src);
    let e = a
        .post_send(2, read, Lease::Owned(dst), 0..4096, true)
        .expect_err("the doorbell rang with new credentials");
    println!("POST: {}", e.error);
    assert!(e.error.is_queued(), "{}", e.error);
    assert!(e.lease.is_none(), "the buffer came back with the error");
    println!("LEASE: kept");
    // Both requests complete, in order; the READ's buffer comes back with its bytes.
    let mut wcs = [WorkCompletion::default(); 4];
    let mut back = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while back.len() < 2 {
        for wc in f.cq.poll_completions(&mut wcs).unwrap() {
            wc.result().unwrap();
            back.extend(a.complete(wc).unwrap());
        }
        assert!(Instant::now() < deadline, "got {} completions", back.len());
    }
    let ids: Vec<u64> = back.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [1, 2]);
    let Some((_, Lease::Owned(dst))) = back.pop() else {
        panic!("the READ's buffer did not come back owned");
    };
    assert_eq!(dst.to_vec(), vec![0x5a; 4096]);
    println!("READ: ran into the kept buffer");
    drop((a, b));
}

/// The child's mode for the resize test.
const RESIZE_CHILD: &str = "RDMA_SAFE_RESIZE_CHILD";

/// A failed resize on Soft-RoCE leaves the queue unpolled, not a crash: rdma-core
/// 44's provider unmaps the old ring before it maps the new one, and when the map
/// fails (here: an address-space limit just above what the process has) its ring
/// pointer is null, which its poll would read. In a child process, whose limit
/// changes (and which would die of the crash).
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_queue_whose_resize_failed_on_soft_roce_is_not_polled() {
    if std::env::var(RESIZE_CHILD).is_ok() {
        return resize_child();
    }
    let text = child_run(
        "a_queue_whose_resize_failed_on_soft_roce_is_not_polled",
        RESIZE_CHILD,
    );
    for line in [
        "RESIZE: ibv_resize_cq failed",
        "POLL: refused: the completion queue cannot be polled",
    ] {
        assert!(text.contains(line), "no {line:?} in: {text}");
    }
}

fn resize_child() {
    let f = fixture();
    let soft_roce = f.ctx.query_device().unwrap().is_soft_roce();
    let cq = CompletionQueue::new(&f.ctx, 16).unwrap();
    // The address space the process has, and a limit of one MiB more: the new ring
    // (32,767 entries, megabytes) cannot be mapped.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize");
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid rlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut old) }, 0);
    let tight = libc::rlimit {
        rlim_cur: (vm_kib + 1024) * 1024,
        rlim_max: old.rlim_max,
    };
    // SAFETY: valid rlimit values; the soft limit stays under the hard one.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &tight) }, 0);
    let resized = cq.resize(32_767);
    // SAFETY: as above; back to the limit the process had.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &old) }, 0);
    let e = resized.expect_err("the resize fit under the limit");
    println!("RESIZE: {e}");
    // The kernel resized the queue (the provider's copy of its size moved) and
    // the new ring's map failed: the path that leaves no ring, not a refusal.
    assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
    // SAFETY: the queue is alive and no other thread resizes it.
    let cqe = unsafe { (*cq.as_raw()).cqe };
    assert!(cqe >= 32_767, "the kernel kept {cqe} entries");
    let mut wcs = [WorkCompletion::default(); 4];
    match cq.poll(&mut wcs) {
        Err(e) => println!("POLL: {e}"),
        Ok(got) => println!("POLL: polled {} (Soft-RoCE: {soft_roce})", got.len()),
    }
    assert!(soft_roce, "this test expects Soft-RoCE's provider");
}

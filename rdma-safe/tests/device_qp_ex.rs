//! Device tests of the extended send interface (`ibv_wr_*`): every operation a
//! queue pair is made for moves its bytes, an inline payload is copied when it is
//! posted, and an operation it was not made for posts nothing. Run in the
//! Soft-RoCE guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::lease::{Lease, LeasedQp, SendOp};
use rdma_safe::{Access, Error, MemoryRegion, QpConfig, RecvWr, SendOps, SendWr};
use std::time::{Duration, Instant};

fn region(f: &common::Fixture, len: usize, seed: u8) -> MemoryRegion {
    let mut mr = MemoryRegion::new(&f.pd, len, Access::ALL_REMOTE).expect("ibv_reg_mr");
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect();
    mr.write_at(0, &bytes).unwrap();
    mr
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_chain_of_every_operation_posts_through_ibv_wr() {
    let f = fixture();
    let ops = SendOps::SEND_WITH_IMM
        | SendOps::RDMA_WRITE
        | SendOps::RDMA_READ
        | SendOps::ATOMIC_FETCH_AND_ADD;
    let (a, b) = f.pair_ex(&QpConfig::rc(&f.cq), ops);
    assert_eq!(a.send_ops(), ops);
    let src = region(&f, 4096, 1);
    let mut peer = region(&f, 3 * 4096, 2);
    peer.write_at(2 * 4096, &41u64.to_ne_bytes()).unwrap();
    let local = region(&f, 4096, 3);
    let mut r = [peer.local(0..4096).unwrap()];
    let mut recv = RecvWr::new(10, &mut r);
    // SAFETY: `peer` outlives the completions polled below.
    unsafe { b.post_recv(&mut recv) }.unwrap();

    let mut s1 = [src.local(0..4096).unwrap()];
    let mut s2 = [src.local(0..4096).unwrap()];
    let mut s3 = [local.local(0..4096).unwrap()];
    let mut s4 = [local.local(0..8).unwrap()];
    let mut send = SendWr::send_with_imm(1, &mut s1, 0xfeed_f00d).signaled();
    let mut write = SendWr::rdma_write(2, &mut s2, peer.remote(4096..8192).unwrap()).signaled();
    let mut read = SendWr::rdma_read(3, &mut s3, peer.remote(0..4096).unwrap()).signaled();
    let counter = peer.remote(8192..8200).unwrap();
    let mut add = SendWr::fetch_and_add(4, &mut s4, counter, 1).signaled();
    read.chain(&mut add);
    write.chain(&mut read);
    send.chain(&mut write);
    // SAFETY: every region outlives the completions polled below.
    unsafe { a.post_send_ex(&mut send) }.unwrap();

    let wcs = f.completions(5);
    let ids: Vec<u64> = wcs.iter().map(|wc| wc.wr_id()).collect();
    for wc in &wcs {
        wc.result().unwrap();
    }
    let recv = wcs.iter().find(|wc| wc.wr_id() == 10).unwrap();
    assert_eq!(recv.imm_data(), Some(0xfeed_f00d), "{ids:?}");
    let sends: Vec<u64> = ids.iter().copied().filter(|&id| id != 10).collect();
    assert_eq!(sends, [1, 2, 3, 4], "in posting order");
    let src_bytes = src.to_vec();
    let peer_bytes = peer.to_vec();
    assert_eq!(&peer_bytes[..4096], &src_bytes[..], "SEND");
    assert_eq!(&peer_bytes[4096..8192], &src_bytes[..], "WRITE");
    // The READ ran after the SEND landed: it fetched the SEND's bytes back. The
    // fetch-and-add then overwrote the first 8 bytes with the counter's old value.
    let local_bytes = local.to_vec();
    assert_eq!(&local_bytes[8..4096], &src_bytes[8..], "READ");
    assert_eq!(u64::from_ne_bytes(local_bytes[..8].try_into().unwrap()), 41);
    let counter = u64::from_ne_bytes(peer_bytes[8192..8200].try_into().unwrap());
    assert_eq!(counter, 42, "FETCH_AND_ADD");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn an_inline_send_is_copied_when_posted() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_inline_data = 64;
    config.max_send_sge = 2;
    let (a, b) = f.pair_ex(&config, SendOps::SEND);
    let mut src = region(&f, 64, 5);
    let sent = src.to_vec();
    let dst = region(&f, 64, 0);
    let mut r = [dst.local(0..64).unwrap()];
    let mut recv = RecvWr::new(10, &mut r);
    // SAFETY: `dst` outlives the completion polled below.
    unsafe { b.post_recv(&mut recv) }.unwrap();
    // Two pieces: Soft-RoCE's own inline list (rdma-core < 64) would send none.
    let mut s = [src.local(0..24).unwrap(), src.local(24..64).unwrap()];
    let mut send = SendWr::send(1, &mut s).signaled().inline();
    // SAFETY: inline: the bytes are copied by the post; `src` lives on anyway.
    unsafe { a.post_send_ex(&mut send) }.unwrap();
    // Overwritten before the completion: the copy went out.
    src.write_at(0, &[0u8; 64]).unwrap();
    let wcs = f.completions(2);
    for wc in &wcs {
        wc.result().unwrap();
    }
    assert_eq!(dst.to_vec(), sent);
    let recv = wcs.iter().find(|wc| wc.wr_id() == 10).unwrap();
    assert_eq!(recv.byte_len(), 64);
    // One piece too.
    let mut r = [dst.local(0..64).unwrap()];
    let mut recv = RecvWr::new(11, &mut r);
    // SAFETY: as above.
    unsafe { b.post_recv(&mut recv) }.unwrap();
    src.write_at(0, &[0x5a; 64]).unwrap();
    let mut s = [src.local(0..64).unwrap()];
    let mut send = SendWr::send(2, &mut s).signaled().inline();
    // SAFETY: as above.
    unsafe { a.post_send_ex(&mut send) }.unwrap();
    src.write_at(0, &[0u8; 64]).unwrap();
    for wc in f.completions(2) {
        wc.result().unwrap();
    }
    assert_eq!(dst.to_vec(), [0x5a; 64]);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn an_operation_the_queue_pair_was_not_made_for_posts_nothing() {
    let f = fixture();
    let (a, b) = f.pair_ex(&QpConfig::rc(&f.cq), SendOps::SEND);
    let src = region(&f, 4096, 1);
    let dst = region(&f, 8192, 0);
    let mut r = [dst.local(0..4096).unwrap()];
    let mut recv = RecvWr::new(10, &mut r);
    // SAFETY: `dst` outlives the completions polled below.
    unsafe { b.post_recv(&mut recv) }.unwrap();

    // A SEND chained to a WRITE the queue pair was not made for: neither goes.
    let mut s1 = [src.local(0..4096).unwrap()];
    let mut s2 = [src.local(0..4096).unwrap()];
    let mut send = SendWr::send(1, &mut s1).signaled();
    let mut write = SendWr::rdma_write(2, &mut s2, dst.remote(4096..8192).unwrap()).signaled();
    send.chain(&mut write);
    // SAFETY: `src` outlives any completion.
    let err = unsafe { a.post_send_ex(&mut send) }.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("IBV_WR_RDMA_WRITE"), "{err}");
    let mut wcs = [rdma_safe::WorkCompletion::default(); 4];
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let got = f.cq.poll(&mut wcs).unwrap();
        assert!(
            got.is_empty(),
            "a refused chain completed: {:?}",
            got[0].wr_id()
        );
    }
    // The queue is intact: the SEND alone goes, and its completion is the first.
    let mut s3 = [src.local(0..4096).unwrap()];
    let mut send = SendWr::send(3, &mut s3).signaled();
    // SAFETY: as above.
    unsafe { a.post_send_ex(&mut send) }.unwrap();
    let wcs = f.completions(2);
    let mut ids: Vec<u64> = wcs.iter().map(|wc| wc.wr_id()).collect();
    ids.sort();
    assert_eq!(ids, [3, 10]);
    assert_eq!(&dst.to_vec()[..4096], &src.to_vec()[..]);

    // A queue pair made without new_ex has no extended interface.
    let (plain, _peer) = f.pair();
    let mut s4 = [src.local(0..64).unwrap()];
    let mut send = SendWr::send(4, &mut s4);
    // SAFETY: nothing is posted (refused), `src` lives on.
    let err = unsafe { plain.post_send_ex(&mut send) }.unwrap_err();
    assert!(err.to_string().contains("new_ex"), "{err}");
    assert_eq!(plain.send_ops(), SendOps::NONE);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_leased_queue_pair_made_with_new_ex_posts_and_releases() {
    let f = fixture();
    let (a, b) = f.pair_ex(&QpConfig::rc(&f.cq), SendOps::RDMA_WRITE | SendOps::SEND);
    let mut conn = LeasedQp::new(a).map_err(|e| e.error).unwrap();
    let target = region(&f, 4096, 0);
    let src = region(&f, 4096, 9);
    let sent = src.to_vec();
    conn.post_send(
        1,
        SendOp::Write(target.remote(0..4096).unwrap()),
        Lease::Owned(src),
        0..4096,
        true,
    )
    .map_err(|e| e.error)
    .unwrap();
    let mut scratch = [rdma_safe::WorkCompletion::default(); 4];
    let until = Instant::now() + Duration::from_secs(20);
    let mut back = Vec::new();
    while back.is_empty() && Instant::now() < until {
        for c in f.cq.poll_completions(&mut scratch).unwrap() {
            back.extend(conn.complete(c).unwrap());
        }
    }
    assert_eq!(back.len(), 1, "the lease came back");
    assert_eq!(back[0].1.region().to_vec(), sent);
    assert_eq!(target.to_vec(), sent);
    drop(b);
}

/// What a provider would only record inside the batch (and Soft-RoCE could not
/// then tell from a queued batch), or gets wrong, is refused before it: too long
/// an inline payload (the lease comes back), an inline READ, more SGEs than the
/// queue pair takes, and on Soft-RoCE SGEs of unequal lengths; SGEs of equal
/// lengths go, with every byte.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn sizes_a_provider_would_only_record_are_refused_before_the_batch() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_inline_data = 64;
    config.max_send_sge = 2;
    let ops = SendOps::SEND | SendOps::RDMA_READ;
    let (a, b) = f.pair_ex(&config, ops);
    let inline_max = a.caps().max_inline_data as usize;
    let src = region(&f, 4096, 1);
    let dst = region(&f, 4096, 0);
    let refused = |wr: &mut SendWr, what: &str| {
        // SAFETY: refused before anything is posted; the regions live on.
        let err = unsafe { a.post_send_ex(wr) }.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{what}: {err}");
        err.to_string()
    };
    let mut s = [src.local(0..inline_max + 1).unwrap()];
    let why = refused(&mut SendWr::send(1, &mut s).inline(), "long inline");
    assert!(why.contains("max_inline_data"), "{why}");
    let mut s = [src.local(0..8).unwrap()];
    let remote = dst.remote(0..8).unwrap();
    let why = refused(
        &mut SendWr::rdma_read(2, &mut s, remote).inline(),
        "inline READ",
    );
    assert!(why.contains("SENDs and WRITEs only"), "{why}");
    // One SGE more than the device granted (it may round the 2 asked up).
    let sges = a.caps().max_send_sge as usize + 1;
    let mut s: Vec<_> = (0..sges)
        .map(|i| src.local(i * 8..i * 8 + 8).unwrap())
        .collect();
    let why = refused(&mut SendWr::send(3, &mut s), "too many SGEs");
    assert!(why.contains("max_send_sge"), "{why}");
    if f.ctx.query_device().unwrap().is_soft_roce() {
        let mut s = [src.local(0..8).unwrap(), src.local(8..108).unwrap()];
        let why = refused(&mut SendWr::send(4, &mut s), "unequal SGEs");
        assert!(why.contains("unequal lengths"), "{why}");
    }

    // Equal lengths go through ibv_wr_set_sge_list whole.
    let mut r = [dst.local(0..4096).unwrap()];
    let mut recv = RecvWr::new(10, &mut r);
    // SAFETY: `dst` outlives the completions polled below.
    unsafe { b.post_recv(&mut recv) }.unwrap();
    let mut s = [src.local(0..100).unwrap(), src.local(1000..1100).unwrap()];
    let mut send = SendWr::send(5, &mut s).signaled();
    // SAFETY: `src` outlives the completion polled below.
    unsafe { a.post_send_ex(&mut send) }.unwrap();
    let wcs = f.completions(2);
    for wc in &wcs {
        wc.result().unwrap();
    }
    let recv = wcs.iter().find(|wc| wc.wr_id() == 10).unwrap();
    assert_eq!(recv.byte_len(), 200);
    let (sb, db) = (src.to_vec(), dst.to_vec());
    assert_eq!(&db[..100], &sb[..100]);
    assert_eq!(&db[100..200], &sb[1000..1100]);

    // Through a LeasedQp: too long an inline SEND gives the lease back.
    let mut conn = LeasedQp::new(a).map_err(|e| e.error).unwrap();
    let flags = rdma_safe::SendFlags {
        signaled: true,
        inline: true,
        ..Default::default()
    };
    let err = conn
        .post_send_with(6, SendOp::Send, Lease::Owned(src), 0..inline_max + 1, flags)
        .unwrap_err();
    // Refused by post_send_ex's check (ibv_post_send would have failed with the
    // provider's EINVAL): the lease went the extended way, and came back.
    assert!(
        matches!(err.error, Error::InvalidArgument(_)),
        "{}",
        err.error
    );
    assert!(err.lease.is_some(), "the lease came back: {}", err.error);
}

//! Device tests of the typed queue pairs: bring two RC QPs to RTS, move bytes with
//! SEND, RDMA WRITE and RDMA READ, provoke a remote access error with a wrong rkey,
//! observe the QP in the error state, reset it and use it again.
//!
//! Run in the Soft-RoCE guest by `cargo xtask test`; they fail without a device.

use rdma_safe::qp::{Reset, Rts};
use rdma_safe::sys;
use rdma_safe::{
    Access, Error, InitAttr, MemoryRegion, QpConfig, QueuePair, RemoteEndpoint, RtrAttr,
    WorkCompletion,
};

mod common;
use common::{fixture, Fixture};

const LEN: usize = 8192;

/// Posts one signaled RDMA operation from `qp` and returns its completion.
fn rdma(
    f: &Fixture,
    qp: &QueuePair<Rts>,
    opcode: sys::ibv_wr_opcode,
    local: &MemoryRegion,
    remote_addr: u64,
    rkey: u32,
) -> WorkCompletion {
    let mut sge = local.local(0..LEN).unwrap().to_sge();
    let mut wr = sys::ibv_send_wr {
        wr_id: 7,
        sg_list: &mut sge,
        num_sge: 1,
        opcode,
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    // SAFETY: the region outlives the completion, which is polled before returning.
    unsafe { qp.post_send_raw(&mut wr) }.expect("ibv_post_send");
    f.completions(1)[0]
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_write_and_read_move_verified_bytes() {
    let f = fixture();
    let (a, b) = f.pair();
    let mut src = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let dst = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    src.write_at(0, &bytes).unwrap();

    // SEND into a posted receive.
    let mut rsge = dst.local(0..LEN).unwrap().to_sge();
    let mut rwr = sys::ibv_recv_wr {
        wr_id: 1,
        sg_list: &mut rsge,
        num_sge: 1,
        ..Default::default()
    };
    // SAFETY: `dst` outlives the completion polled below.
    unsafe { b.post_recv_raw(&mut rwr) }.unwrap();
    let wcs = {
        let mut ssge = src.local(0..LEN).unwrap().to_sge();
        let mut swr = sys::ibv_send_wr {
            wr_id: 2,
            sg_list: &mut ssge,
            num_sge: 1,
            opcode: sys::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        // SAFETY: `src` outlives the completion polled below.
        unsafe { a.post_send_raw(&mut swr) }.unwrap();
        f.completions(2)
    };
    assert!(wcs.iter().all(|wc| wc.is_ok()), "{wcs:?}");
    let recv = wcs.iter().find(|wc| wc.wr_id() == 1).unwrap();
    assert_eq!(recv.byte_len() as usize, LEN);
    assert_eq!(recv.qp_num(), b.qp_num());
    assert_eq!(dst.to_vec(), src.to_vec());

    // RDMA WRITE of new bytes, then RDMA READ them back into a third region.
    let bytes: Vec<u8> = src.to_vec().iter().map(|b| b.wrapping_add(101)).collect();
    src.write_at(0, &bytes).unwrap();
    let remote = dst.remote(0..LEN).unwrap();
    let wc = rdma(
        &f,
        &a,
        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        &src,
        remote.addr,
        remote.rkey,
    );
    assert!(wc.is_ok(), "{wc:?}");
    assert_eq!(wc.opcode(), sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(dst.to_vec(), src.to_vec());

    let back = MemoryRegion::new(&f.pd, LEN, Access::LOCAL_WRITE).unwrap();
    let wc = rdma(
        &f,
        &a,
        sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
        &back,
        remote.addr,
        remote.rkey,
    );
    assert!(wc.is_ok(), "{wc:?}");
    assert_eq!(wc.opcode(), sys::ibv_wc_opcode::IBV_WC_RDMA_READ);
    assert_eq!(back.to_vec(), src.to_vec());
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn wrong_rkey_is_a_remote_access_error_and_the_qp_recovers() {
    let f = fixture();
    let (a, b) = f.pair();
    let b_endpoint_qpn = b.qp_num();
    let local = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let target = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let remote = target.remote(0..LEN).unwrap();

    let wc = rdma(
        &f,
        &a,
        sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
        &local,
        remote.addr,
        remote.rkey ^ 0x5a5a_0000,
    );
    assert_eq!(wc.status(), sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    let err = wc.result().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Completion { .. }));
    assert!(text.contains("remote access error"), "{text}");
    assert!(
        text.contains("rkey"),
        "the hint should name the rkey: {text}"
    );

    // The requester moved to the error state; the type still says Rts, the device
    // tells the truth.
    assert_eq!(a.query_state().unwrap(), sys::ibv_qp_state::IBV_QPS_ERR);

    // Reset both sides and bring them up again with fresh PSNs.
    let a: QueuePair<Reset> = a.reset().expect("reset A");
    let b: QueuePair<Reset> = b.reset().expect("reset B");
    assert_eq!(a.query_state().unwrap(), sys::ibv_qp_state::IBV_QPS_RESET);
    assert_eq!(b.qp_num(), b_endpoint_qpn, "reset keeps the QP number");
    let a = a.to_init(&InitAttr::default()).unwrap();
    let b = b.to_init(&InitAttr::default()).unwrap();
    let (ea, eb) = (f.endpoint(&a, 300), f.endpoint(&b, 400));
    let a = f.connect(a, eb, 300);
    let _b = f.connect(b, ea, 400);
    assert_eq!(a.query_state().unwrap(), sys::ibv_qp_state::IBV_QPS_RTS);

    let mut src = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    src.write_at(0, &[0xab; LEN]).unwrap();
    let wc = rdma(
        &f,
        &a,
        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        &src,
        remote.addr,
        remote.rkey,
    );
    assert!(wc.is_ok(), "after the reset: {wc:?}");
    assert!(target.to_vec().iter().all(|&b| b == 0xab));
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_failed_transition_hands_the_queue_pair_back() {
    let f = fixture();
    let qp = QueuePair::new(&f.pd, &QpConfig::rc(&f.cq))
        .unwrap()
        .to_init(&InitAttr::default())
        .unwrap();
    let qpn = qp.qp_num();
    // A GID index far beyond the table: the device refuses the address vector.
    let mut rtr = RtrAttr::new(
        RemoteEndpoint {
            qpn,
            psn: 0,
            lid: 0,
            gid: Some(f.ctx.query_gid(1, f.gid_index).unwrap()),
        },
        sys::ibv_mtu::IBV_MTU_1024,
    );
    rtr.sgid_index = 250;
    let failed = qp.to_rtr(&rtr).expect_err("GID index 250 cannot be valid");
    let text = failed.to_string();
    assert!(
        text.starts_with("ibv_modify_qp(INIT->RTR) failed"),
        "{text}"
    );
    assert!(
        text.contains("GID index 250"),
        "the hint names the GID index: {text}"
    );
    // The queue pair came back unchanged, still in INIT, and can go on.
    let qp = failed.qp;
    assert_eq!(qp.qp_num(), qpn);
    assert_eq!(qp.query_state().unwrap(), sys::ibv_qp_state::IBV_QPS_INIT);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn children_keep_parents_alive_in_any_drop_order() {
    let f = fixture();
    let (a, b) = f.pair();
    let mr = MemoryRegion::new(&f.pd, LEN, Access::LOCAL_WRITE).unwrap();
    let Fixture { ctx, pd, cq, .. } = f;
    // Parents first: each child still holds what it needs.
    drop(ctx);
    drop(pd);
    drop(cq);
    assert_eq!(mr.to_vec().len(), LEN);
    assert!(a.query_state().is_ok());
    drop(a);
    drop(mr);
    assert!(b.query_state().is_ok());
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn uc_queue_pairs_write_and_query_reports_the_connection() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.qp_type = rdma_safe::qp::QpType::Uc;
    let (a, b) = f.pair_with(&config);
    let mut src = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    src.write_at(0, &[0x42; LEN]).unwrap();
    let dst = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let remote = dst.remote(0..LEN).unwrap();
    let wc = rdma(
        &f,
        &a,
        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        &src,
        remote.addr,
        remote.rkey,
    );
    assert!(wc.is_ok(), "{wc:?}");
    // UC has no acknowledgement: wait until the bytes are there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dst.to_vec()[LEN - 1] != 0x42 {
        assert!(
            std::time::Instant::now() < deadline,
            "UC write never landed"
        );
        std::thread::yield_now();
    }
    assert_eq!(dst.to_vec(), src.to_vec());

    let (attr, init) = a.query().unwrap();
    assert_eq!(attr.qp_state, sys::ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(attr.dest_qp_num, b.qp_num());
    // The send PSN started at 100 and advanced by one per packet of the WRITE.
    let mtu = 128usize << attr.path_mtu.0;
    assert_eq!(attr.sq_psn as usize, 100 + LEN.div_ceil(mtu));
    assert_eq!(init.qp_type, sys::ibv_qp_type::IBV_QPT_UC);
    assert!(init.cap.max_send_wr >= 128);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn a_peer_that_never_answers_is_retry_exceeded_with_a_gid_hint() {
    let f = fixture();
    let qp = QueuePair::new(&f.pd, &QpConfig::rc(&f.cq))
        .unwrap()
        .to_init(&InitAttr::default())
        .unwrap();
    let me = f.endpoint(&qp, 5);
    // A QP number nobody owns: every packet is dropped, nothing is acknowledged.
    let ghost = RemoteEndpoint { qpn: 0xfff0, ..me };
    let mut rtr = RtrAttr::new(ghost, sys::ibv_mtu::IBV_MTU_1024);
    rtr.sgid_index = f.gid_index as u8;
    let mut rts = rdma_safe::RtsAttr::new(5);
    rts.timeout = 8; // ~1 ms per try
    rts.retry_cnt = 1;
    let qp = qp.to_rtr(&rtr).unwrap().to_rts(&rts).unwrap();
    let src = MemoryRegion::new(&f.pd, LEN, Access::ALL_REMOTE).unwrap();
    let wc = rdma(
        &f,
        &qp,
        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        &src,
        src.addr(),
        src.rkey(),
    );
    assert_eq!(wc.status(), sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
    let text = wc.result().unwrap_err().to_string();
    assert!(text.contains("transport retry counter exceeded"), "{text}");
    assert!(
        text.contains("GID index"),
        "the hint names the GID index: {text}"
    );
}

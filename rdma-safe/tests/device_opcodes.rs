//! Device tests: every opcode moves or changes bytes, and the request flags do what
//! they say. Run in the Soft-RoCE guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::sys;
use rdma_safe::{Access, LocalSlice, MemoryRegion, QpConfig, RecvWr, SendWr};

fn region(f: &common::Fixture, len: usize) -> MemoryRegion {
    MemoryRegion::new(&f.pd, len, Access::ALL_REMOTE).expect("ibv_reg_mr")
}

fn pattern(mr: &mut MemoryRegion, seed: u8) {
    let bytes: Vec<u8> = (0..mr.len())
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    mr.write_at(0, &bytes).unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn send_and_write_with_immediate_deliver_data_and_imm() {
    let f = fixture();
    let (a, b) = f.pair();
    let mut src = region(&f, 4096);
    pattern(&mut src, 1);
    let dst = region(&f, 8192);

    // Two receives: one for the SEND's bytes, one consumed by the WRITE_WITH_IMM.
    let mut r1 = [dst.local(0..4096).unwrap()];
    let mut r2 = [dst.local(4096..4096).unwrap()];
    let mut rwr2 = RecvWr::new(11, &mut r2[..0]);
    let mut rwr1 = RecvWr::new(10, &mut r1);
    rwr1.chain(&mut rwr2);
    // SAFETY: `dst` outlives the completions polled below.
    unsafe { b.post_recv(&mut rwr1) }.unwrap();

    let mut s1 = [src.local(0..4096).unwrap()];
    let mut s2 = [src.local(0..4096).unwrap()];
    let mut send = SendWr::send_with_imm(1, &mut s1, 0xdead_beef).signaled();
    let mut write =
        SendWr::rdma_write_with_imm(2, &mut s2, dst.remote(4096..8192).unwrap(), 0x1234_5678)
            .signaled();
    send.chain(&mut write);
    // SAFETY: `src` outlives the completions polled below.
    unsafe { a.post_send(&mut send) }.unwrap();

    let wcs = f.completions(4);
    for wc in &wcs {
        wc.result().unwrap();
    }
    let recv1 = wcs.iter().find(|wc| wc.wr_id() == 10).unwrap();
    assert_eq!(recv1.opcode(), sys::ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!(recv1.imm_data(), Some(0xdead_beef));
    assert_eq!(recv1.byte_len(), 4096);
    let recv2 = wcs.iter().find(|wc| wc.wr_id() == 11).unwrap();
    assert_eq!(
        recv2.opcode(),
        sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    );
    assert_eq!(recv2.imm_data(), Some(0x1234_5678));
    assert_eq!(&dst.to_vec()[..4096], src.to_vec());
    assert_eq!(&dst.to_vec()[4096..], src.to_vec());
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn atomics_return_the_old_value_and_change_the_remote_one() {
    let f = fixture();
    let (a, _b) = f.pair();
    let mut target = region(&f, 64);
    target.write_at(8, &100u64.to_ne_bytes()).unwrap();
    let result = region(&f, 64);
    let remote = target.remote(8..16).unwrap();

    let mut res = [result.local(0..8).unwrap()];
    let mut faa = SendWr::fetch_and_add(1, &mut res, remote, 23).signaled();
    // SAFETY: both regions outlive the completion.
    unsafe { a.post_send(&mut faa) }.unwrap();
    let wc = f.completions(1)[0];
    wc.result().unwrap();
    assert_eq!(wc.opcode(), sys::ibv_wc_opcode::IBV_WC_FETCH_ADD);
    let old = u64::from_ne_bytes(result.to_vec()[0..8].try_into().unwrap());
    assert_eq!(old, 100);
    assert_eq!(target.to_vec()[8..16], 123u64.to_ne_bytes());

    // A compare that fails leaves the value; one that matches swaps it.
    for (compare, expect_after) in [(5u64, 123u64), (123, 777)] {
        let mut res = [result.local(8..16).unwrap()];
        let mut cas = SendWr::compare_and_swap(2, &mut res, remote, compare, 777).signaled();
        // SAFETY: both regions outlive the completion.
        unsafe { a.post_send(&mut cas) }.unwrap();
        let wc = f.completions(1)[0];
        wc.result().unwrap();
        assert_eq!(wc.opcode(), sys::ibv_wc_opcode::IBV_WC_COMP_SWAP);
        let old = u64::from_ne_bytes(result.to_vec()[8..16].try_into().unwrap());
        assert_eq!(old, 123, "CAS returns the value before the operation");
        assert_eq!(target.to_vec()[8..16], expect_after.to_ne_bytes());
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn scatter_gather_lists_gather_and_scatter() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_send_sge = 3;
    config.max_recv_sge = 2;
    let (a, b) = f.pair_with(&config);
    let mut src = region(&f, 3000);
    pattern(&mut src, 7);
    let dst = region(&f, 4096);

    // Receive into two pieces: 1000 bytes at 0, 2000 bytes at 2048.
    let mut rsg = [dst.local(0..1000).unwrap(), dst.local(2048..4048).unwrap()];
    let mut rwr = RecvWr::new(5, &mut rsg);
    // SAFETY: `dst` outlives the completions.
    unsafe { b.post_recv(&mut rwr) }.unwrap();
    // Send three pieces of src, out of order: 2000..3000, 0..1000, 1000..2000.
    let mut ssg = [
        src.local(2000..3000).unwrap(),
        src.local(0..1000).unwrap(),
        src.local(1000..2000).unwrap(),
    ];
    let mut wr = SendWr::send(6, &mut ssg).signaled();
    // SAFETY: `src` outlives the completions.
    unsafe { a.post_send(&mut wr) }.unwrap();
    for wc in f.completions(2) {
        wc.result().unwrap();
    }
    let s = src.to_vec();
    let expected: Vec<u8> = [&s[2000..3000], &s[0..1000], &s[1000..2000]].concat();
    let d = dst.to_vec();
    let got: Vec<u8> = [&d[0..1000], &d[2048..4048]].concat();
    assert_eq!(got, expected);
    assert!(d[1000..2048].iter().all(|&b| b == 0), "a gap was written");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn inline_data_is_copied_at_post_time() {
    let f = fixture();
    let mut config = QpConfig::rc(&f.cq);
    config.max_inline_data = 64;
    let (a, b) = f.pair_with(&config);
    let dst = region(&f, 64);
    let mut rsg = [dst.local(0..64).unwrap()];
    let mut rwr = RecvWr::new(1, &mut rsg);
    // SAFETY: `dst` outlives the completion.
    unsafe { b.post_recv(&mut rwr) }.unwrap();

    // An unregistered stack buffer: inline sends need no lkey.
    let mut payload = *b"inline payload: no registration needed, copied at post!!";
    // SAFETY: inline data is copied during the post, while `payload` is alive.
    let mut sg =
        [unsafe { LocalSlice::from_raw_parts(payload.as_ptr() as u64, payload.len() as u32, 0) }];
    let mut wr = SendWr::send(2, &mut sg).inline().signaled();
    // SAFETY: inline data is copied during the call.
    unsafe { a.post_send(&mut wr) }.unwrap();
    let sent = payload;
    payload.fill(b'X'); // Changing it after the post must not matter.
    for wc in f.completions(2) {
        wc.result().unwrap();
    }
    assert_eq!(&dst.to_vec()[..sent.len()], &sent[..]);
    assert_eq!(payload[0], b'X');
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn unsignaled_requests_complete_silently_and_sq_sig_all_signals_all() {
    let f = fixture();
    let (a, _b) = f.pair();
    let src = region(&f, 4096);
    let dst = region(&f, 4096);
    for i in 0..10u64 {
        let mut sg = [src.local(0..256).unwrap()];
        let remote = dst.remote(0..256).unwrap();
        let wr = SendWr::rdma_write(i, &mut sg, remote);
        let mut wr = if i == 9 { wr.signaled() } else { wr };
        // SAFETY: the regions outlive the completion of the last, signaled request.
        unsafe { a.post_send(&mut wr) }.unwrap();
    }
    let wcs = f.completions(1);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id(), 9, "only the signaled request completes");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut more = [rdma_safe::WorkCompletion::default(); 4];
    assert!(
        f.cq.poll(&mut more).unwrap().is_empty(),
        "unexpected completions"
    );

    // With sq_sig_all every request completes, flags or not.
    let mut config = QpConfig::rc(&f.cq);
    config.sq_sig_all = true;
    let (c, _d) = f.pair_with(&config);
    for i in 0..3u64 {
        let mut sg = [src.local(0..256).unwrap()];
        let mut wr = SendWr::rdma_write(100 + i, &mut sg, dst.remote(0..256).unwrap());
        // SAFETY: the regions outlive the completions.
        unsafe { c.post_send(&mut wr) }.unwrap();
    }
    let ids: Vec<u64> = f.completions(3).iter().map(|wc| wc.wr_id()).collect();
    assert_eq!(ids, [100, 101, 102]);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn fenced_send_sees_the_data_of_an_earlier_read() {
    let f = fixture();
    let (a, b) = f.pair();
    let mut remote_src = region(&f, 1024);
    pattern(&mut remote_src, 42);
    let local = region(&f, 1024);
    let sink = region(&f, 1024);
    let mut rsg = [sink.local(0..1024).unwrap()];
    let mut rwr = RecvWr::new(1, &mut rsg);
    // SAFETY: `sink` outlives the completion.
    unsafe { b.post_recv(&mut rwr) }.unwrap();

    // READ into `local`, then a fenced SEND of `local`: the fence makes the SEND wait
    // for the READ, so the peer receives the bytes that were read.
    let mut read_sg = [local.local(0..1024).unwrap()];
    let mut send_sg = [local.local(0..1024).unwrap()];
    let mut read = SendWr::rdma_read(2, &mut read_sg, remote_src.remote(0..1024).unwrap());
    let mut send = SendWr::send(3, &mut send_sg).fenced().signaled();
    read.chain(&mut send);
    // SAFETY: all regions outlive the completions.
    unsafe { a.post_send(&mut read) }.unwrap();
    for wc in f.completions(2) {
        wc.result().unwrap();
    }
    assert_eq!(sink.to_vec(), remote_src.to_vec());
}

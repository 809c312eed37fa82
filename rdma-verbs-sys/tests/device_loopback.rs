//! Device test through the raw bindings only: two RC queue pairs on one device are
//! brought to RTS and move bytes with a SEND and an RDMA READ.
//!
//! Runs in the Soft-RoCE guest (`cargo xtask test`) or on a machine with a device
//! (`cargo test -p rdma-verbs-sys -- --ignored`). `RDMA_DEVICE` names the device (default:
//! the first) and `RDMA_GID_INDEX` the GID (default 0; 1 on the guest's rxe0).
//! Without a device the test fails: it never passes by skipping.

use rdma_verbs_sys::*;
use std::ffi::CStr;
use std::ptr;

const LEN: usize = 4096;
const PORT: u8 = 1;

/// Panics with the verb and errno when a verb returned non-zero.
fn check(ret: i32, verb: &str) {
    if ret != 0 {
        let errno = if ret > 0 {
            std::io::Error::from_raw_os_error(ret)
        } else {
            std::io::Error::last_os_error()
        };
        panic!("{verb} failed: {errno}");
    }
}

fn nonnull<T>(p: *mut T, verb: &str) -> *mut T {
    assert!(
        !p.is_null(),
        "{verb} failed: {}",
        std::io::Error::last_os_error()
    );
    p
}

/// Opens `RDMA_DEVICE` or the first device; fails the test if there is none.
fn open_device() -> *mut ibv_context {
    let wanted = std::env::var("RDMA_DEVICE").ok();
    let mut count = 0;
    // SAFETY: valid out-pointer; the list is freed before returning.
    let list = unsafe { ibv_get_device_list(&mut count) };
    assert!(
        !list.is_null() && count > 0,
        "no RDMA device found: this is a device test, run it with `cargo xtask test` \
         (Soft-RoCE guest) or on a machine with an RDMA device"
    );
    let mut ctx = ptr::null_mut();
    for i in 0..count as usize {
        // SAFETY: the list holds `count` device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a valid device; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        if wanted
            .as_deref()
            .is_none_or(|w| name.to_bytes() == w.as_bytes())
        {
            // SAFETY: `dev` is a valid device of the list, which is still alive.
            ctx = nonnull(unsafe { ibv_open_device(dev) }, "ibv_open_device");
            break;
        }
    }
    // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { ibv_free_device_list(list) };
    assert!(!ctx.is_null(), "device {wanted:?} not found");
    ctx
}

fn gid_index() -> i32 {
    std::env::var("RDMA_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Side {
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    buf: Vec<u8>,
}

fn create_side(pd: *mut ibv_pd, cq: *mut ibv_cq, fill: u8) -> Side {
    let mut buf = vec![fill; LEN];
    let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
    // SAFETY: `buf` outlives the MR (deregistered before the Vec is dropped).
    let mr = nonnull(
        unsafe { ibv_reg_mr(pd, buf.as_mut_ptr().cast(), LEN, access_bits(access)) },
        "ibv_reg_mr",
    );
    let mut init = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        qp_type: ibv_qp_type::IBV_QPT_RC,
        cap: ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..Default::default()
    };
    // SAFETY: pd and cq are valid; `init` is a valid attribute struct.
    let qp = nonnull(unsafe { ibv_create_qp(pd, &mut init) }, "ibv_create_qp");
    Side { qp, mr, buf }
}

fn to_init(qp: *mut ibv_qp) {
    let mut attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: PORT,
        qp_access_flags: (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0,
        ..Default::default()
    };
    let mask = ibv_qp_attr_mask::IBV_QP_STATE
        | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
        | ibv_qp_attr_mask::IBV_QP_PORT
        | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
    // SAFETY: qp is valid, attr is initialised for the fields in the mask.
    check(
        unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as i32) },
        "ibv_modify_qp(INIT)",
    );
}

fn to_rtr(qp: *mut ibv_qp, port: &ibv_port_attr, gid: ibv_gid, dest_qpn: u32) {
    let mut attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTR,
        path_mtu: port.active_mtu,
        dest_qp_num: dest_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ibv_ah_attr {
            dlid: port.lid,
            port_num: PORT,
            is_global: 1,
            grh: ibv_global_route {
                dgid: gid,
                sgid_index: gid_index() as u8,
                hop_limit: 1,
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let mask = ibv_qp_attr_mask::IBV_QP_STATE
        | ibv_qp_attr_mask::IBV_QP_AV
        | ibv_qp_attr_mask::IBV_QP_PATH_MTU
        | ibv_qp_attr_mask::IBV_QP_DEST_QPN
        | ibv_qp_attr_mask::IBV_QP_RQ_PSN
        | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
        | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
    // SAFETY: qp is valid, attr is initialised for the fields in the mask.
    check(
        unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as i32) },
        "ibv_modify_qp(RTR)",
    );
}

fn to_rts(qp: *mut ibv_qp) {
    let mut attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let mask = ibv_qp_attr_mask::IBV_QP_STATE
        | ibv_qp_attr_mask::IBV_QP_TIMEOUT
        | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
        | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
        | ibv_qp_attr_mask::IBV_QP_SQ_PSN
        | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
    // SAFETY: qp is valid, attr is initialised for the fields in the mask.
    check(
        unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as i32) },
        "ibv_modify_qp(RTS)",
    );
}

/// Polls until `n` completions arrived (or 10 s passed) and checks they succeeded.
fn wait_completions(cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < n {
        let mut wc = ibv_wc::default();
        // SAFETY: cq is valid; `wc` has room for one completion.
        let polled = unsafe { ibv_poll_cq(cq, 1, &mut wc) };
        assert!(polled >= 0, "ibv_poll_cq failed");
        if polled == 1 {
            // SAFETY: ibv_wc_status_str returns a static string.
            let text = unsafe { CStr::from_ptr(ibv_wc_status_str(wc.status)) };
            assert_eq!(
                wc.status,
                ibv_wc_status::IBV_WC_SUCCESS,
                "completion {} failed: {}",
                wc.wr_id,
                text.to_string_lossy()
            );
            got.push(wc);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for completions"
        );
    }
    got
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn two_rc_queue_pairs_send_and_rdma_read() {
    let ctx = open_device();
    let mut port = ibv_port_attr::default();
    let mut gid = ibv_gid::default();
    // SAFETY: ctx is open; the out-pointers are valid.
    unsafe {
        check(___ibv_query_port(ctx, PORT, &mut port), "ibv_query_port");
        assert_eq!(
            port.state,
            ibv_port_state::IBV_PORT_ACTIVE,
            "port {PORT} not active"
        );
        check(
            ibv_query_gid(ctx, PORT, gid_index(), &mut gid),
            "ibv_query_gid",
        );
    }
    // SAFETY: ctx is open.
    let pd = nonnull(unsafe { ibv_alloc_pd(ctx) }, "ibv_alloc_pd");
    let cq = nonnull(
        // SAFETY: ctx is open; no channel, vector 0.
        unsafe { ibv_create_cq(ctx, 32, ptr::null_mut(), ptr::null_mut(), 0) },
        "ibv_create_cq",
    );
    let mut a = create_side(pd, cq, 0);
    let mut b = create_side(pd, cq, 0);
    for (i, byte) in a.buf.iter_mut().enumerate() {
        *byte = (i * 7 + 3) as u8;
    }
    for (i, byte) in b.buf[LEN / 2..].iter_mut().enumerate() {
        *byte = (i * 13 + 1) as u8;
    }
    for (me, peer) in [(&a, &b), (&b, &a)] {
        to_init(me.qp);
        // SAFETY: the peer's QP is valid until it is destroyed at the end.
        to_rtr(me.qp, &port, gid, unsafe { (*peer.qp).qp_num });
        to_rts(me.qp);
    }
    send_first_half(&mut a, &mut b, cq);
    read_second_half(&mut a, &b, cq);
    // SAFETY: the QPs are valid until destroyed below.
    let (qpn_a, qpn_b) = unsafe { ((*a.qp).qp_num, (*b.qp).qp_num) };
    println!(
        "moved {} bytes by SEND and {} by RDMA READ between QP {} and QP {}",
        LEN / 2,
        LEN / 2,
        qpn_a,
        qpn_b
    );
    // SAFETY: every object was created above and is destroyed once, children first;
    // no request is outstanding.
    unsafe {
        for side in [&a, &b] {
            check(ibv_destroy_qp(side.qp), "ibv_destroy_qp");
            check(ibv_dereg_mr(side.mr), "ibv_dereg_mr");
        }
        check(ibv_destroy_cq(cq), "ibv_destroy_cq");
        check(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
        check(ibv_close_device(ctx), "ibv_close_device");
    }
}

/// B receives into the first half of its buffer; A sends the first half of its own.
fn send_first_half(a: &mut Side, b: &mut Side, cq: *mut ibv_cq) {
    let expected_send = a.buf[..LEN / 2].to_vec();
    // SAFETY: the QPs, MRs and CQ are valid; the SGEs point into the registered
    // buffers, which are neither moved nor touched until the completions are polled.
    unsafe {
        let mut rsge = ibv_sge {
            addr: b.buf.as_mut_ptr() as u64,
            length: (LEN / 2) as u32,
            lkey: (*b.mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 1,
            sg_list: &mut rsge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad_r = ptr::null_mut();
        check(ibv_post_recv(b.qp, &mut rwr, &mut bad_r), "ibv_post_recv");

        let mut ssge = ibv_sge {
            addr: a.buf.as_mut_ptr() as u64,
            length: (LEN / 2) as u32,
            lkey: (*a.mr).lkey,
        };
        let mut swr = ibv_send_wr {
            wr_id: 2,
            sg_list: &mut ssge,
            num_sge: 1,
            opcode: ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        let mut bad_s = ptr::null_mut();
        check(
            ibv_post_send(a.qp, &mut swr, &mut bad_s),
            "ibv_post_send(SEND)",
        );
    }
    let wcs = wait_completions(cq, 2);
    let recv = wcs
        .iter()
        .find(|wc| wc.wr_id == 1)
        .expect("receive completion");
    assert_eq!(recv.opcode, ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!(recv.byte_len as usize, LEN / 2);
    assert_eq!(
        &b.buf[..LEN / 2],
        &expected_send[..],
        "SEND payload differs"
    );
}

/// A reads the second half of B's buffer into the second half of its own.
fn read_second_half(a: &mut Side, b: &Side, cq: *mut ibv_cq) {
    let expected_read = b.buf[LEN / 2..].to_vec();
    // SAFETY: as in `send_first_half`: valid objects, registered buffers left alone
    // until the completion is polled.
    unsafe {
        let mut read_sge = ibv_sge {
            addr: a.buf.as_mut_ptr().add(LEN / 2) as u64,
            length: (LEN / 2) as u32,
            lkey: (*a.mr).lkey,
        };
        let mut read_wr = ibv_send_wr {
            wr_id: 3,
            sg_list: &mut read_sge,
            num_sge: 1,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        read_wr.wr.rdma.remote_addr = b.buf.as_ptr().add(LEN / 2) as u64;
        read_wr.wr.rdma.rkey = (*b.mr).rkey;
        let mut bad_s = ptr::null_mut();
        check(
            ibv_post_send(a.qp, &mut read_wr, &mut bad_s),
            "ibv_post_send(RDMA_READ)",
        );
    }
    let wcs = wait_completions(cq, 1);
    assert_eq!(wcs[0].opcode, ibv_wc_opcode::IBV_WC_RDMA_READ);
    assert_eq!(
        &a.buf[LEN / 2..],
        &expected_read[..],
        "RDMA READ data differs"
    );
}

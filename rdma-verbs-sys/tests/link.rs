//! Host tests: every wrapped `static inline` verb links, and bindgen's layouts agree
//! with the C compiler's.

use rdma_verbs_sys::*;

/// The inline verbs a C program uses most; each must be among the wrapped symbols.
const REQUIRED: &[&str] = &[
    "ibv_post_send",
    "ibv_post_recv",
    "ibv_post_srq_recv",
    "ibv_poll_cq",
    "ibv_req_notify_cq",
    "ibv_bind_mw",
    "ibv_wr_start",
    "ibv_wr_complete",
    "ibv_wr_rdma_read",
    "ibv_wr_set_sge",
    "ibv_start_poll",
    "ibv_next_poll",
    "ibv_end_poll",
    "___ibv_query_port",
    "rdma_post_send",
    "rdma_post_recv",
    "rdma_post_read",
    "rdma_post_write",
    "rdma_get_send_comp",
    "rdma_get_recv_comp",
    "rdma_reg_msgs",
];

#[test]
fn every_wrapped_static_fn_links() {
    let fns = wrapped_static_fns();
    assert!(
        fns.len() >= 100,
        "expected over 100 wrapped inline functions, got {}",
        fns.len()
    );
    for (name, addr) in &fns {
        assert!(!addr.is_null(), "{name} has no address");
    }
    for want in REQUIRED {
        assert!(
            fns.iter().any(|(name, _)| name == want),
            "{want} is not wrapped"
        );
    }
}

#[test]
fn wrappers_run_the_inline_code() {
    // `rdma_seterrno` is inline in rdma_verbs.h: a non-zero value becomes errno and -1.
    // SAFETY: the function only writes errno.
    let ret = unsafe { rdma_seterrno(libc::EAGAIN) };
    assert_eq!(ret, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EAGAIN)
    );
    // SAFETY: zero leaves errno alone and returns zero.
    assert_eq!(unsafe { rdma_seterrno(0) }, 0);

    // `ibv_cq_ex_to_cq` is a cast in C; it must not move the pointer.
    let fake = 0x1000 as *mut ibv_cq_ex;
    // SAFETY: the wrapper only casts the pointer; nothing is dereferenced.
    let cq = unsafe { ibv_cq_ex_to_cq(fake) };
    assert_eq!(cq as usize, 0x1000);
}

#[test]
fn layouts_match_the_c_compiler() {
    let layouts = layout::layouts();
    assert!(
        layouts.len() > 50,
        "layout table too small: {}",
        layouts.len()
    );
    let wrong: Vec<_> = layouts.iter().filter(|(_, rust, c)| rust != c).collect();
    assert!(wrong.is_empty(), "Rust and C disagree: {wrong:?}");
}

#[test]
fn device_list_call_works_without_a_device() {
    let mut count = -1;
    // SAFETY: `count` is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut count) };
    if list.is_null() {
        // libibverbs returns NULL with errno set when it cannot look for devices.
        assert!(std::io::Error::last_os_error().raw_os_error().is_some());
    } else {
        assert!(count >= 0);
        // SAFETY: `list` came from `ibv_get_device_list`.
        unsafe { ibv_free_device_list(list) };
    }
}

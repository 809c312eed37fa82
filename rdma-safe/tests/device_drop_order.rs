//! Device test: every verbs object may be dropped in any order (children keep their
//! parents alive), checked for all orders of two groups of six objects, then the same
//! run again under valgrind: no invalid access, no definite leak.
//! Run in the Soft-RoCE guest by `cargo xtask test`.

use rdma_safe::qp::QpType;
use rdma_safe::{
    Access, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Context, InitAttr,
    MemoryRegion, MemoryWindow, MwType, ProtectionDomain, QpConfig, QueuePair, SharedReceiveQueue,
};
use std::any::Any;
use std::process::Command;
use std::sync::Arc;

/// Marks the valgrind child.
const CHILD: &str = "RDMA_SAFE_DROP_ORDER_CHILD";

fn open() -> Arc<Context> {
    rdma_safe::Selection::from_env(None, 1, None)
        .open()
        .expect("no usable RDMA device: run this device test with `cargo xtask test`")
        .ctx
}

fn gid_index(ctx: &Context) -> u32 {
    rdma_safe::Selection::from_env(None, 1, None)
        .gid_index
        .unwrap_or_else(|| ctx.default_gid_index(1).unwrap())
}

/// Group A: context, PD, completion channel, CQ on it, memory region, QP.
fn group_a() -> Vec<Box<dyn Any>> {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let channel = CompletionChannel::new(&ctx).unwrap();
    let cq = CompletionQueue::with_channel(&ctx, 8, &channel, 0).unwrap();
    let mr = MemoryRegion::new(&pd, 4096, Access::ALL_REMOTE).unwrap();
    let qp = QueuePair::new(&pd, &QpConfig::rc(&cq))
        .unwrap()
        .to_init(&InitAttr::default())
        .unwrap();
    vec![
        Box::new(ctx),
        Box::new(pd),
        Box::new(channel),
        Box::new(cq),
        Box::new(mr),
        Box::new(qp),
    ]
}

/// Group B: context, PD, SRQ, address handle, memory window, UD QP on the SRQ.
fn group_b() -> Vec<Box<dyn Any>> {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 8, 1).unwrap();
    let gid = ctx.query_gid(1, gid_index(&ctx)).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::global(gid, gid_index(&ctx) as u8)).unwrap();
    let mw = MemoryWindow::new(&pd, MwType::Type2).unwrap();
    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let mut config = QpConfig::rc(&cq);
    config.qp_type = QpType::Ud;
    config.srq = Some(srq.clone());
    let qp = QueuePair::new(&pd, &config).unwrap();
    drop(cq); // the QP holds it
    vec![
        Box::new(ctx),
        Box::new(pd),
        Box::new(srq),
        Box::new(ah),
        Box::new(mw),
        Box::new(qp),
    ]
}

/// Calls `f` with every permutation of `0..n` (Heap's algorithm).
fn permutations(n: usize, f: &mut dyn FnMut(&[usize])) {
    let mut p: Vec<usize> = (0..n).collect();
    let mut c = vec![0; n];
    f(&p);
    let mut i = 0;
    while i < n {
        if c[i] < i {
            if i % 2 == 0 {
                p.swap(0, i);
            } else {
                p.swap(c[i], i);
            }
            f(&p);
            c[i] += 1;
            i = 0;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
}

/// Builds each group once per order and drops the objects in that order.
fn every_order() -> usize {
    let mut runs = 0;
    for build in [group_a as fn() -> Vec<Box<dyn Any>>, group_b] {
        permutations(6, &mut |order| {
            let mut objects: Vec<Option<Box<dyn Any>>> = build().into_iter().map(Some).collect();
            for &i in order {
                drop(objects[i].take());
            }
            runs += 1;
        });
    }
    runs
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn every_drop_order_is_clean_even_under_valgrind() {
    if std::env::var_os(CHILD).is_some() {
        println!("DROP-ORDERS: {}", every_order());
        return;
    }
    assert_eq!(every_order(), 2 * 720);

    let exe = std::env::current_exe().unwrap();
    let out = Command::new("valgrind")
        .args([
            "--vgdb=no",
            concat!(
                "--suppressions=",
                env!("CARGO_MANIFEST_DIR"),
                "/tests/valgrind.supp"
            ),
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite",
        ])
        .arg(&exe)
        .args([
            "--exact",
            "every_drop_order_is_clean_even_under_valgrind",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("valgrind must be installed (Debian package valgrind)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "valgrind found errors ({}):\n{stderr}",
        out.status
    );
    assert!(stdout.contains("DROP-ORDERS: 1440"), "{stdout}");
    assert!(stderr.contains("ERROR SUMMARY: 0 errors"), "{stderr}");
    assert!(
        stderr.contains("definitely lost: 0 bytes") || stderr.contains("no leaks are possible"),
        "{stderr}"
    );
}

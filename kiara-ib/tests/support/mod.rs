//! What several of kiara-ib's device test binaries share: where the server
//! listens, a valid hello, the test's device opened as a raw peer opens it, and
//! the rate-limited log's summary lines read back. Each binary includes this
//! module (`#[path]`) and uses part of it.

#![allow(dead_code)]

use kiara_ib::protocol::{Hello, HELLO_BODY_LEN, HELLO_HEADER_LEN};
use rdma_safe::qp::Init;
use rdma_safe::{CompletionQueue, Context, Gid, InitAttr, ProtectionDomain, QpConfig, QueuePair};
use std::sync::Arc;

/// The address servers listen on: `RDMA_IP`, else the guest's.
pub fn server_ip() -> String {
    std::env::var("RDMA_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// A valid hello (the QPN needs no queue pair behind it: nobody gets that far).
pub fn some_hello() -> [u8; HELLO_HEADER_LEN + HELLO_BODY_LEN] {
    Hello {
        qpn: 0x1234,
        psn: 7,
        lid: 0,
        mtu: 3,
        gid: Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        credits: 8,
        slot_size: 4200,
        max_message: 1 << 20,
        eager_threshold: 4096,
    }
    .encode()
}

/// The test's device for a raw peer: `RDMA_DEVICE` (else the first), its GID
/// index `RDMA_GID_INDEX` (else port 1's default), that GID, and a protection
/// domain, as one process would have them.
pub struct Device {
    /// The device context.
    pub ctx: Arc<Context>,
    /// A protection domain on it.
    pub pd: Arc<ProtectionDomain>,
    /// Port 1's GID at `gid_index`.
    pub gid: Gid,
    /// The GID index in use.
    pub gid_index: u32,
}

impl Device {
    /// Opens the test's device (panics if it cannot: a device test needs it).
    pub fn open() -> Arc<Device> {
        let ctx = Context::open(std::env::var("RDMA_DEVICE").ok().as_deref()).unwrap();
        let gid_index = std::env::var("RDMA_GID_INDEX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.default_gid_index(1).unwrap());
        let gid = ctx.query_gid(1, gid_index).unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        Arc::new(Device {
            ctx,
            pd,
            gid,
            gid_index,
        })
    }

    /// A new completion queue (16 deep) and an RC queue pair on it, in INIT.
    pub fn rc_qp_in_init(&self) -> (Arc<CompletionQueue>, QueuePair<Init>) {
        let cq = CompletionQueue::new(&self.ctx, 16).unwrap();
        let qp = QueuePair::new(&self.pd, &QpConfig::rc(&cq))
            .unwrap()
            .to_init(&InitAttr::default())
            .unwrap();
        (cq, qp)
    }
}

/// How a summary line of session lines not logged one by one ends (at the
/// default `Config::log_lines_per_second`).
pub const SESSION_SUMMARY_END: &str =
    " more lines about sessions within a second, not logged one by one (at most 20 lines \
     a second: Config::log_lines_per_second)";

/// The lines not logged one by one, as the summary lines of `log` ending in `end`
/// count them ("N more ... within a second, ...").
pub fn held_in_summaries(log: &[String], end: &str) -> usize {
    log.iter()
        .filter_map(|l| l.strip_suffix(end))
        .map(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum()
}

/// Fails a device run built without kiara-ib's `fault-injection` feature, in place
/// of the fault tests it compiled out: such a run must not pass as if they had run.
pub fn fault_tests_missing() -> ! {
    panic!(
        "built without kiara-ib's fault-injection feature, so its fault tests are \
         missing: kiara-ib's dev-dependency on itself turns it on"
    )
}

//! Shared setup of the device tests: a device, a PD, a CQ, and connected RC pairs.
#![allow(dead_code)]

use rdma_safe::qp::{Init, Rts};
use rdma_safe::{
    CompletionQueue, Context, InitAttr, ProtectionDomain, QpConfig, QueuePair, RemoteEndpoint,
    RtrAttr, RtsAttr, WorkCompletion,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One device, a PD and a CQ.
pub struct Fixture {
    pub ctx: Arc<Context>,
    pub pd: Arc<ProtectionDomain>,
    pub cq: Arc<CompletionQueue>,
    pub gid_index: u32,
}

/// Opens `RDMA_DEVICE` (or the first device); panics with advice when there is none.
pub fn fixture() -> Fixture {
    let sel = rdma_safe::Selection::from_env(None, 1, None).open().expect(
        "no usable RDMA device: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    );
    let gid_index = sel.gid_index().unwrap_or(0);
    let ctx = sel.ctx;
    let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");
    let cq = CompletionQueue::new(&ctx, 64).expect("ibv_create_cq");
    Fixture {
        ctx,
        pd,
        cq,
        gid_index,
    }
}

impl Fixture {
    pub fn endpoint(&self, qp: &QueuePair<Init>, psn: u32) -> RemoteEndpoint {
        let port = self.ctx.query_port(1).expect("query port");
        RemoteEndpoint {
            qpn: qp.qp_num(),
            psn,
            lid: port.lid(),
            gid: Some(self.ctx.query_gid(1, self.gid_index).expect("query gid")),
        }
    }

    pub fn connect(&self, qp: QueuePair<Init>, peer: RemoteEndpoint, psn: u32) -> QueuePair<Rts> {
        let mtu = self.ctx.query_port(1).expect("query port").active_mtu();
        let mut rtr = RtrAttr::new(peer, mtu);
        rtr.sgid_index = self.gid_index as u8;
        qp.to_rtr(&rtr)
            .expect("INIT -> RTR")
            .to_rts(&RtsAttr::new(psn))
            .expect("RTR -> RTS")
    }

    /// Two RC QPs connected to each other.
    pub fn pair(&self) -> (QueuePair<Rts>, QueuePair<Rts>) {
        self.pair_with(&QpConfig::rc(&self.cq))
    }

    /// Two QPs of `config` connected to each other.
    pub fn pair_with(&self, config: &QpConfig) -> (QueuePair<Rts>, QueuePair<Rts>) {
        self.pair_of(config, config)
    }

    /// A QP of `a` connected to a QP of `b` (say, one with its own receive CQ).
    pub fn pair_of(&self, a: &QpConfig, b: &QpConfig) -> (QueuePair<Rts>, QueuePair<Rts>) {
        let new = |config| {
            QueuePair::new(&self.pd, config)
                .expect("ibv_create_qp")
                .to_init(&InitAttr::default())
                .expect("RESET -> INIT")
        };
        let (a, b) = (new(a), new(b));
        let (ea, eb) = (self.endpoint(&a, 100), self.endpoint(&b, 200));
        (self.connect(a, eb, 100), self.connect(b, ea, 200))
    }

    /// Two RC QPs of `config` made for the extended interface's `ops`, connected.
    pub fn pair_ex(
        &self,
        config: &QpConfig,
        ops: rdma_safe::SendOps,
    ) -> (QueuePair<Rts>, QueuePair<Rts>) {
        let new = || {
            QueuePair::new_ex(&self.pd, config, ops)
                .expect("ibv_create_qp_ex")
                .to_init(&InitAttr::default())
                .expect("RESET -> INIT")
        };
        let (a, b) = (new(), new());
        let (ea, eb) = (self.endpoint(&a, 100), self.endpoint(&b, 200));
        (self.connect(a, eb, 100), self.connect(b, ea, 200))
    }

    /// Waits for `n` completions, successful or not.
    pub fn completions(&self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut buf = [WorkCompletion::default(); 8];
        let deadline = Instant::now() + Duration::from_secs(20);
        while out.len() < n {
            out.extend_from_slice(self.cq.poll(&mut buf).expect("ibv_poll_cq"));
            assert!(
                Instant::now() < deadline,
                "timed out waiting for completions"
            );
        }
        out
    }
}

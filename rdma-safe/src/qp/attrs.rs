//! What a queue pair is made and moved with: its transport service, its
//! configuration at creation, the peer it connects to, and the attributes of
//! each transition.

use crate::access::Access;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use rdma_verbs_sys as sys;
use std::ptr;
use std::sync::Arc;

/// The transport service of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    pub(crate) fn raw(self) -> sys::ibv_qp_type {
        match self {
            QpType::Rc => sys::ibv_qp_type::IBV_QPT_RC,
            QpType::Uc => sys::ibv_qp_type::IBV_QPT_UC,
            QpType::Ud => sys::ibv_qp_type::IBV_QPT_UD,
        }
    }
}

/// What to create: type, completion queues, queue sizes.
#[derive(Clone, Debug)]
pub struct QpConfig {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Completion queue of the send queue.
    pub send_cq: Arc<CompletionQueue>,
    /// Completion queue of the receive queue.
    pub recv_cq: Arc<CompletionQueue>,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Bytes that may be sent inline.
    pub max_inline_data: u32,
    /// Signal every send, whatever its flags.
    pub sq_sig_all: bool,
    /// Take receives from this shared receive queue instead of the QP's own.
    pub srq: Option<Arc<SharedReceiveQueue>>,
}

impl QpConfig {
    /// The creation attributes as `ibv_qp_init_attr`.
    pub(crate) fn to_raw(&self) -> sys::ibv_qp_init_attr {
        sys::ibv_qp_init_attr {
            send_cq: self.send_cq.as_raw(),
            recv_cq: self.recv_cq.as_raw(),
            qp_type: self.qp_type.raw(),
            sq_sig_all: self.sq_sig_all as i32,
            srq: self.srq.as_ref().map_or(ptr::null_mut(), |s| s.as_raw()),
            cap: sys::ibv_qp_cap {
                max_send_wr: self.max_send_wr,
                max_recv_wr: self.max_recv_wr,
                max_send_sge: self.max_send_sge,
                max_recv_sge: self.max_recv_sge,
                max_inline_data: self.max_inline_data,
            },
            ..Default::default()
        }
    }

    /// Refuses completion queues or a shared receive queue of another device
    /// context than `pd`'s: `verb` would hand them to the PD's driver, which takes
    /// them for its own objects (memory corruption in the C library when the
    /// drivers differ, the wrong kernel objects when the contexts do).
    pub(crate) fn check_context(&self, pd: &ProtectionDomain, verb: &str) -> Result<()> {
        let ctx = pd.context().as_raw();
        let foreign = if self.send_cq.context().as_raw() != ctx {
            "send completion queue"
        } else if self.recv_cq.context().as_raw() != ctx {
            "receive completion queue"
        } else if self
            .srq
            .as_ref()
            .is_some_and(|s| s.pd().context().as_raw() != ctx)
        {
            "shared receive queue"
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument(
            format!(
                "{verb}: the {foreign} belongs to another device context than the \
                 protection domain; create it from the PD's context \
                 (ProtectionDomain::context)"
            )
            .into(),
        ))
    }

    /// An RC queue pair on `cq` for both queues, with perftest-like depths (128 sends,
    /// 128 receives, 1 SGE each, no inline data).
    pub fn rc(cq: &Arc<CompletionQueue>) -> Self {
        QpConfig {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
            srq: None,
        }
    }
}

/// How a peer's queue pair is reached: what the out-of-band exchange carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteEndpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number it sends (our receive PSN).
    pub psn: u32,
    /// LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID: required on RoCE, optional on InfiniBand (then a GRH is used).
    pub gid: Option<Gid>,
}

/// A random 24-bit packet sequence number, to start a queue pair's send queue
/// from (`RtsAttr::sq_psn`, and the peer's `RtrAttr::rq_psn`), as the C tools do
/// with `lrand48() & 0xffffff`: from the kernel's random source, or, should that
/// fail, from the process id and the clock.
pub fn random_psn() -> u32 {
    let mut x = [0u8; 4];
    // SAFETY: `x` is a valid, writable 4-byte buffer for getrandom to fill.
    let n = unsafe { libc::getrandom(x.as_mut_ptr().cast(), x.len(), 0) };
    let v = if n == 4 {
        u32::from_ne_bytes(x)
    } else {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(0x9e37_79b9) ^ nanos
    };
    v & 0xff_ffff
}

/// Attributes of RESET -> INIT.
#[derive(Clone, Copy, Debug)]
pub struct InitAttr {
    /// Port number, from 1.
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// What the peer may do to our memory through this QP (default: everything; each
    /// memory region still limits access to itself).
    pub access: Access,
    /// Q_Key (UD only).
    pub qkey: u32,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            pkey_index: 0,
            access: Access::ALL_REMOTE,
            qkey: 0x1111_1111,
        }
    }
}

/// Attributes of INIT -> RTR (defaults as perftest and `ibv_rc_pingpong`).
#[derive(Clone, Copy, Debug)]
pub struct RtrAttr {
    /// The peer.
    pub remote: RemoteEndpoint,
    /// Path MTU (both sides must agree; use the smaller active MTU).
    pub mtu: sys::ibv_mtu,
    /// Our port.
    pub port: u8,
    /// Our GID index for the GRH (RoCE: the entry matching the peer's GID type).
    pub sgid_index: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// RDMA READs/atomics the peer may have in flight against us.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

impl RtrAttr {
    /// Attributes to connect to `remote` with perftest's defaults.
    pub fn new(remote: RemoteEndpoint, mtu: sys::ibv_mtu) -> Self {
        RtrAttr {
            remote,
            mtu,
            port: 1,
            sgid_index: 0,
            hop_limit: 0xff,
            traffic_class: 0,
            sl: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        }
    }
}

/// Attributes of RTR -> RTS (defaults as perftest: timeout 14, retry 7, RNR retry 7).
#[derive(Clone, Copy, Debug)]
pub struct RtsAttr {
    /// Our first send PSN (what the peer gave as `RemoteEndpoint::psn` of ours).
    pub psn: u32,
    /// Local ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RDMA READs/atomics we may have in flight.
    pub max_rd_atomic: u8,
}

impl RtsAttr {
    /// perftest's defaults with send PSN `psn`.
    pub fn new(psn: u32) -> Self {
        RtsAttr {
            psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

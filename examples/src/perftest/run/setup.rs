//! Setup: the device and the figures taken from it, the out-of-band connection and
//! its first exchanges (versions, system data, MTU), then the memory, the completion
//! queues and the queue pairs (in INIT, or connected by the RDMA CM with `-R`).

use super::AnyResult;
use crate::perftest::connect::{Comm, CommError, SETUP_TIMEOUT};
use crate::perftest::inline::{max_inline, Family, NOT_RECOGNIZED};
use crate::perftest::params::{Params, Verb};
use crate::perftest::protocol::{self, KeyData};
use crate::perftest::rdma_cm::{self, CmQps};
use crate::perftest::report::RESULT_LINE;
use rdma_safe::cm::CmId;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, InitAttr, MemoryRegion, Mtu,
    PortAttr, ProtectionDomain, QpConfig, QueuePair, Selection,
};
use std::sync::Arc;
use std::time::Duration;

/// The device a run uses and what the run takes from it.
pub(super) struct Device {
    /// The open device.
    pub ctx: Arc<Context>,
    /// The port's attributes.
    pub port: PortAttr,
    /// The GID index in use (`None`: no GID, e.g. `-x` with a negative index).
    pub gid_index: Option<u32>,
    /// The GID in use.
    pub gid: Option<Gid>,
    /// Outstanding RDMA READs per QP (1 for the other verbs).
    pub out_reads: u32,
    /// Bytes sent inline at most, as perftest settles it for this device.
    pub inline_size: u32,
    /// The MTU asked for with `-m`, in bytes (`None`, or 0: the active one).
    pub asked_mtu: Option<u32>,
    /// The port's active MTU code.
    pub active_mtu: u32,
}

impl Device {
    /// Opens the device, port and GID of `-d`, `-i` and `-x` (or the environment).
    pub fn open(p: &Params) -> AnyResult<Device> {
        let args = &p.args;
        let chosen = args.gid_index.and_then(|x| u32::try_from(x).ok());
        let sel = Selection::from_env(args.ib_dev.clone(), args.ib_port, chosen).open()?;
        // `-x` with a negative index: no GID, even on Ethernet.
        let gid_pair = if args.gid_index.is_some_and(|x| x < 0) {
            None
        } else {
            sel.gid
        };
        let family = sel.ctx.query_device().map_or(Family::Unknown, |a| {
            Family::of(a.raw().vendor_id, a.raw().vendor_part_id)
        });
        let (inline_size, disabled) = max_inline(p, family);
        if disabled {
            println!("{RESULT_LINE}");
            eprintln!("{NOT_RECOGNIZED}");
        }
        let out_reads = out_reads(p, &sel.ctx)?;
        Ok(Device {
            ctx: sel.ctx,
            port: sel.port,
            gid_index: gid_pair.map(|(i, _)| i),
            gid: gid_pair.map(|(_, g)| g),
            out_reads,
            inline_size,
            asked_mtu: args.mtu,
            active_mtu: sel.port.active_mtu().0,
        })
    }
}

/// The MTU code (`ibv_mtu`) of `-m`, as perftest's `set_mtu` settles it against
/// the port's `active` one: none asked (or 0), the active one; one above it, the
/// active one with perftest's two lines on stdout; not an MTU, the active one with
/// its three warnings (perftest prints the codes, not the bytes, in both). Called
/// where perftest calls it, once connected, just before the MTUs are exchanged.
fn chosen_mtu(asked: Option<u32>, active: u32) -> u32 {
    let Some(bytes) = asked.filter(|&b| b != 0) else {
        return active;
    };
    let code = match Mtu::from_bytes(bytes) {
        Some(mtu) => mtu.code(),
        None => {
            eprintln!(" Invalid MTU - {bytes} ");
            eprintln!(" Please choose mtu from {{256,512,1024,2048,4096}}");
            eprintln!(" Will run with the port active mtu - {active}");
            active
        }
    };
    if code > active {
        println!("Requested mtu is higher than active mtu ");
        println!("Changing to active mtu - {active}");
        return active;
    }
    code
}

/// Outstanding reads for READ tests: `-o` within the device's limit (with perftest's
/// warning when above it), else the limit (perftest's `ctx_set_out_reads`); 1 for
/// the other verbs.
fn out_reads(p: &Params, ctx: &Context) -> AnyResult<u32> {
    if p.verb != Verb::Read {
        return Ok(1);
    }
    let max = ctx.query_device()?.raw().max_qp_rd_atom.clamp(1, 255) as u32;
    Ok(match p.args.outs {
        Some(o) if o > 0 && o <= max => o,
        Some(o) if o > max => {
            println!("{RESULT_LINE}");
            eprintln!(" Number of outstanding reads is above max = {max}");
            eprintln!(" Changing to that max value");
            max
        }
        _ => max,
    })
}

/// The out-of-band connection: the client connects to the server named on the
/// command line, the server waits for it. `-R` and `-z` carry the exchanges over an
/// RDMA CM connection (`use_rdma_cm`), the others over TCP.
pub(super) fn connect(p: &Params) -> AnyResult<Comm> {
    let args = &p.args;
    let link_cm = p.rdma_cm_link();
    let comm = if let Some(host) = &args.servername {
        if link_cm {
            Comm::connect_cm(host, args.port, Duration::from_secs(5))?
        } else {
            Comm::connect(host, args.port, Duration::from_secs(5))?
        }
    } else {
        if p.full() {
            println!();
            println!("************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
        }
        if link_cm {
            Comm::accept_cm(args.port)?
        } else {
            Comm::accept(args.port)?
        }
    };
    Ok(comm)
}

/// The exchanges before the queue pairs: versions, system data (the larger cycle
/// buffer and cache line win) and the MTU (the smaller wins). Returns the cycle
/// buffer and the MTU code.
pub(super) fn preliminaries(comm: &mut Comm, dev: &Device) -> AnyResult<(u32, u32)> {
    comm.set_gid_index(dev.gid_index.map_or(-1, |i| i as i32));
    comm.versions()?;
    let page = rdma_safe::host::page_size() as u32;
    let line = rdma_safe::host::cache_line_size() as u32;
    let theirs = comm.xchg_u32(page)?;
    let cycle_buffer = protocol::check_cycle_buffer(theirs)?.max(page);
    let _cache_line = comm.xchg_u32(line)?.max(line);
    let mtu = comm.mtu(chosen_mtu(dev.asked_mtu, dev.active_mtu))?;
    Ok((cycle_buffer, mtu))
}

/// Bytes per QP slot: the largest message or the cycle buffer, in whole cache lines.
pub(super) fn slot_size(p: &Params, cycle_buffer: u32) -> u64 {
    let max_size = p.sizes().into_iter().max().unwrap_or(p.size);
    max_size.max(cycle_buffer as u64).div_ceil(64) * 64
}

/// The queue pairs between their creation and the key exchange: in INIT (to be
/// connected with the peer's keys) or already connected by the CM.
pub(super) enum Pending {
    Init(Vec<QueuePair<Init>>),
    Connected(Vec<QueuePair<Rts>>),
}

impl Pending {
    /// The QP numbers, in order.
    pub fn qp_nums(&self) -> Vec<u32> {
        match self {
            Pending::Init(q) => q.iter().map(|q| q.qp_num()).collect(),
            Pending::Connected(q) => q.iter().map(|q| q.qp_num()).collect(),
        }
    }
}

/// The data path's memory and completion queues, and the QPs' configuration.
pub(super) struct Resources {
    pub pd: Arc<ProtectionDomain>,
    pub mr: MemoryRegion,
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    /// With `-e`: the channel both queues report to.
    pub channel: Option<Arc<CompletionChannel>>,
    pub config: QpConfig,
}

impl Resources {
    /// `ctx_init`: one region of two `slot`s per QP (send, then receive/target), the
    /// CQs and the QP sizes.
    fn new(ctx: &Arc<Context>, p: &Params, nq: usize, slot: u64) -> rdma_safe::Result<Self> {
        let pd = ProtectionDomain::new(ctx)?;
        let relaxed = if p.relaxed_ordering() {
            Access::RELAXED_ORDERING.bits()
        } else {
            0
        };
        let mr = MemoryRegion::new(
            &pd,
            (2 * nq as u64 * slot) as usize,
            Access::from_bits(
                Access::LOCAL_WRITE.bits()
                    | Access::REMOTE_WRITE.bits()
                    | Access::REMOTE_READ.bits()
                    | relaxed,
            ),
        )?;
        let num_qps = nq as u32;
        let too_deep = || {
            rdma_safe::Error::InvalidArgument(
                "the queue depths times the queue pairs (-t, -r, -q) exceed 2^32".into(),
            )
        };
        let channel = match p.args.events {
            true => Some(CompletionChannel::new(ctx)?),
            false => None,
        };
        let cq = |depth: u32| match &channel {
            Some(ch) => CompletionQueue::with_channel(ctx, depth, ch, 0),
            None => CompletionQueue::new(ctx, depth),
        };
        let send_depth = p.tx_depth.checked_mul(num_qps).ok_or_else(too_deep)?;
        let send_cq = cq(send_depth.max(1).saturating_add(1))?;
        let recv_depth = if p.verb == Verb::Send {
            p.rx_depth.checked_mul(num_qps).ok_or_else(too_deep)?
        } else {
            1
        };
        let recv_cq = cq(recv_depth.max(1).saturating_add(1))?;
        let mut config = QpConfig::rc(&send_cq);
        config.recv_cq = recv_cq.clone();
        config.max_send_wr = p.tx_depth.max(p.post_list);
        config.max_recv_wr = if p.verb == Verb::Send { p.rx_depth } else { 1 };
        config.max_inline_data = p.inline_size;
        Ok(Resources {
            pd,
            mr,
            send_cq,
            recv_cq,
            channel,
            config,
        })
    }
}

/// Resources and queue pairs: on our device context, or with `-R` on the context of
/// the CM ids (the CM creates the QPs and connects them).
pub(super) fn queue_pairs(
    p: &Params,
    dev: &Device,
    comm: &mut Comm,
    slot: u64,
) -> AnyResult<(Resources, Pending, Option<CmQps>)> {
    let nq = p.num_qps as usize;
    if p.args.rdma_cm {
        return cm_queue_pairs(p, dev, comm, nq, slot);
    }
    let res = Resources::new(&dev.ctx, p, nq, slot)?;
    let init = InitAttr {
        port: p.args.ib_port,
        ..Default::default()
    };
    let mut inits: Vec<QueuePair<Init>> = Vec::with_capacity(nq);
    for _ in 0..nq {
        inits.push(QueuePair::new(&res.pd, &res.config)?.to_init(&init)?);
    }
    Ok((res, Pending::Init(inits), None))
}

/// `-R` (`create_rdma_cm_connection`): a handshake, the CM connections (whose first
/// CM id gives the device the resources are made on), a handshake.
fn cm_queue_pairs(
    p: &Params,
    dev: &Device,
    comm: &mut Comm,
    nq: usize,
    slot: u64,
) -> AnyResult<(Resources, Pending, Option<CmQps>)> {
    let param = rdma_cm::qp_param((p.verb == Verb::Read).then_some(dev.out_reads));
    let sync = KeyData::default();
    let mut res: Option<Resources> = None;
    let mut make = |id: &CmId| -> Result<QueuePair<Init>, CommError> {
        let r =
            match &mut res {
                Some(r) => r,
                None => {
                    let ctx = id
                        .context()
                        .map_err(|e| CommError::Cm("the CM id has no device".into(), e))?;
                    res.insert(Resources::new(&ctx, p, nq, slot).map_err(|e| {
                        CommError::Cm("Failed to initialize RDMA contexts.".into(), e)
                    })?)
                }
            };
        id.create_qp(&r.pd, &r.config)
            .map_err(|e| CommError::Cm("Failed to create QP.".into(), e))
    };
    let (cm_qps, qps) = match &p.args.servername {
        Some(host) => {
            comm.handshake(&sync)?;
            let timeout = Duration::from_secs(10);
            rdma_cm::connect_qps(host, p.args.port, nq, &param, timeout, &mut make)?
        }
        None => {
            let listener = rdma_cm::QpListener::new(p.args.port, p.num_qps)?;
            comm.handshake(&sync)?;
            listener.accept(nq, &param, SETUP_TIMEOUT, &mut make)?
        }
    };
    comm.handshake(&sync)?;
    let res = res.ok_or("no RDMA CM connection was made")?;
    Ok((res, Pending::Connected(qps), Some(cm_qps)))
}

#[cfg(test)]
mod tests {
    use super::chosen_mtu;

    #[test]
    fn mtu_is_settled_against_the_active_one_as_perftest_does() {
        // Codes: 256 B is 1 ... 4096 B is 5; the port's active MTU here is 1024 (3).
        assert_eq!(chosen_mtu(None, 3), 3);
        assert_eq!(chosen_mtu(Some(0), 3), 3, "0 is not asking");
        assert_eq!(chosen_mtu(Some(512), 3), 2);
        assert_eq!(chosen_mtu(Some(1024), 3), 3);
        assert_eq!(chosen_mtu(Some(4096), 3), 3, "above the active one");
        assert_eq!(chosen_mtu(Some(1000), 3), 3, "not an MTU");
    }
}

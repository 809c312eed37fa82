//! The exchange: this side's keys, the test's description, the key exchanges in
//! each tool's order, the connection of the queue pairs with the peer's keys, and
//! the addresses printed as perftest prints them.

use super::setup::{Device, Pending};
use super::AnyResult;
use crate::perftest::connect::Comm;
use crate::perftest::json::{JsonOut, Link};
use crate::perftest::params::{Params, TestKind, Verb};
use crate::perftest::protocol::KeyData;
use crate::perftest::report;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::{Gid, MemoryRegion, Mtu, QueuePair, RemoteEndpoint, RtrAttr, RtsAttr};

/// This side's keys, one per QP: its queue pair, a random PSN, and the receive slot
/// of the region that the peer accesses.
pub(super) fn local_keys(
    dev: &Device,
    pending: &Pending,
    mr: &MemoryRegion,
    slot: u64,
) -> Vec<KeyData> {
    let qp_nums = pending.qp_nums();
    let nq = qp_nums.len();
    qp_nums
        .into_iter()
        .enumerate()
        .map(|(i, qpn)| KeyData {
            lid: dev.port.lid(),
            out_reads: dev.out_reads,
            qpn,
            psn: rdma_safe::random_psn(),
            rkey: mr.rkey(),
            vaddr: mr.addr() + (nq + i) as u64 * slot,
            gid: dev.gid.map(|g| g.0),
            srqn: 0,
        })
        .collect()
}

/// Prints the test's description block (not with `--output`); returns the
/// `--out_json` file, which describes the test too.
pub(super) fn print_test_info(p: &Params, dev: &Device, mtu: u32) -> Option<JsonOut> {
    let name = dev.ctx.name();
    let link = Link {
        dev: &name,
        mtu_bytes: Mtu::from_code(mtu.clamp(1, 5)).map_or(4096, Mtu::bytes),
        ethernet: dev.port.is_ethernet(),
        gid_index: dev.gid_index,
        out_reads: dev.out_reads,
    };
    if p.full() {
        let mut info =
            report::test_info(p, link.dev, link.mtu_bytes, link.ethernet, link.gid_index);
        // The inline/outstanding-reads line sits before "rdma_cm QPs".
        if let Some(pos) = info.find(" rdma_cm QPs") {
            info.insert_str(
                pos,
                &(report::inline_or_reads_line(p, dev.out_reads) + "\n"),
            );
        }
        println!("{info}");
    }
    JsonOut::new(p, &link)
}

/// The key exchanges and the connection, in each tool's order; prints the local and
/// remote addresses (not with `--output`). Returns the connected queue pairs and the peer's keys.
pub(super) fn connect(
    p: &Params,
    dev: &Device,
    comm: &mut Comm,
    pending: Pending,
    keys: &[KeyData],
    mtu: u32,
) -> AnyResult<(Vec<QueuePair<Rts>>, Vec<KeyData>)> {
    let lat_rdma = p.kind == TestKind::Lat && p.verb != Verb::Send;
    if lat_rdma {
        comm.handshake(&keys[0])?;
    }
    let mut rem = Vec::with_capacity(keys.len());
    for k in keys {
        rem.push(comm.handshake(k)?);
    }
    let qps = match pending {
        Pending::Connected(qps) => qps,
        Pending::Init(inits) => connect_qps(p, dev, inits, keys, &rem, mtu)?,
    };
    if p.verb == Verb::Send {
        comm.handshake(&keys[0])?;
    }
    // perftest prints the addresses with the comm struct's verb, SEND with -R or -z.
    let addr_verb = if p.rdma_cm_link() { Verb::Send } else { p.verb };
    for k in keys.iter().filter(|_| p.full()) {
        println!("{}", report::address_lines("local", k, addr_verb));
    }
    for k in keys {
        let r = comm.handshake(k)?;
        if p.full() {
            println!("{}", report::address_lines("remote", &r, addr_verb));
        }
    }
    if p.verb != Verb::Send {
        comm.handshake(&keys[0])?;
    }
    Ok((qps, rem))
}

/// Brings each QP from INIT to RTS with the peer's keys (`ctx_connect`).
fn connect_qps(
    p: &Params,
    dev: &Device,
    inits: Vec<QueuePair<Init>>,
    keys: &[KeyData],
    rem: &[KeyData],
    mtu: u32,
) -> AnyResult<Vec<QueuePair<Rts>>> {
    if let (Some(a), Some(b)) = (keys[0].gid, rem[0].gid) {
        if Gid(a).is_ipv4_mapped() != Gid(b).is_ipv4_mapped() {
            return Err("\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.".into());
        }
    }
    let mut qps = Vec::with_capacity(inits.len());
    for (i, qp) in inits.into_iter().enumerate() {
        let rtr = rtr_attr(p, dev, &rem[i], mtu);
        let mut rts = RtsAttr::new(keys[i].psn);
        rts.timeout = p.args.qp_timeout;
        rts.max_rd_atomic = if p.verb == Verb::Read {
            rem[i].out_reads.clamp(1, 255) as u8
        } else {
            1
        };
        let qp = qp
            .to_rtr(&rtr)
            .map_err(|e| format!("Failed to modify QP {} to RTR: {}", keys[i].qpn, e.error))?;
        let qp = qp
            .to_rts(&rts)
            .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
        qps.push(qp);
    }
    Ok(qps)
}

/// The RTR attributes for the peer of key `r`: a GRH with hop limit 0xFF iff a GID
/// is used, this side's outstanding reads as the responder's.
fn rtr_attr(p: &Params, dev: &Device, r: &KeyData, mtu: u32) -> RtrAttr {
    let mut rtr = RtrAttr::new(
        RemoteEndpoint {
            qpn: r.qpn,
            psn: r.psn,
            lid: r.lid,
            gid: if dev.gid_index.is_some() {
                r.gid.map(Gid)
            } else {
                None
            },
        },
        Mtu::from_code(mtu).unwrap_or(Mtu::B4096).into(),
    );
    rtr.port = p.args.ib_port;
    rtr.sgid_index = dev.gid_index.unwrap_or(0) as u8;
    rtr.hop_limit = 0xff;
    rtr.sl = p.args.sl;
    rtr.max_dest_rd_atomic = dev.out_reads as u8;
    rtr.min_rnr_timer = 12;
    rtr
}

//! The "RDMA read and write with IB verbs" sample (The Geek in the Corner, 02):
//! both sides exchange `MSG_MR` messages laid out as a raw `struct ibv_mr`, then each
//! RDMA-READs or RDMA-WRITEs 1024 bytes of the peer's region and sends `MSG_DONE`
//! (fenced after a READ); when both DONEs are in, each prints `remote buffer: ...`
//! and disconnects. Completions are handled by a poller thread, as in the C program.

use super::leased::{post_recv, Lent, Side};
use super::Conn;
use rdma_safe::cm::EventKind;
use rdma_safe::qp::Init;
use rdma_safe::sys;
use rdma_safe::{Access, Error, LeasedQp, MemoryRegion, RemoteSlice, Result, SendFlags, SendOp};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Size of the message: `u32 type`, padding, a raw `struct ibv_mr` (48 bytes).
pub const MSG_LEN: usize = 56;
/// `MSG_MR`: the message carries the sender's region.
pub const MSG_MR: u32 = 0;
/// `MSG_DONE`: the sender's RDMA operation completed.
pub const MSG_DONE: u32 = 1;
/// Size of the regions the peers access.
pub const RDMA_BUFFER_SIZE: usize = 1024;
/// Offset of `ibv_mr.addr` in the message.
pub const ADDR_OFFSET: usize = 8 + 16;
/// Offset of `ibv_mr.rkey` in the message.
pub const RKEY_OFFSET: usize = 8 + 40;

/// Which operation each side performs on the peer's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// RDMA READ the peer's message into our local region.
    Read,
    /// RDMA WRITE our message into the peer's region.
    Write,
}

impl Mode {
    /// `read` or `write`, as on the command line.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "read" => Some(Mode::Read),
            "write" => Some(Mode::Write),
            _ => None,
        }
    }
}

/// Encodes a message: `type` and, for `MSG_MR`, `mr` laid out as the C program's raw
/// copy of its `struct ibv_mr` (context, pd, addr, length, handle, lkey, rkey). The
/// peer reads only `addr` and `rkey`; the two pointers are this process's, and the
/// kernel handle, which names the region only here, is sent as 0.
pub fn encode(buf: &mut [u8], kind: u32, mr: Option<&MemoryRegion>) {
    buf[..MSG_LEN].fill(0);
    buf[0..4].copy_from_slice(&kind.to_ne_bytes());
    if let Some(mr) = mr {
        let at = |field: usize| 8 + field;
        let mut put = |field: usize, bytes: &[u8]| {
            buf[at(field)..at(field) + bytes.len()].copy_from_slice(bytes)
        };
        put(
            MR_CONTEXT,
            &(mr.pd().context().as_raw() as u64).to_ne_bytes(),
        );
        put(MR_PD, &(mr.pd().as_raw() as u64).to_ne_bytes());
        put(MR_ADDR, &mr.addr().to_ne_bytes());
        put(MR_LENGTH, &(mr.len() as u64).to_ne_bytes());
        put(MR_LKEY, &mr.lkey().to_ne_bytes());
        put(MR_RKEY, &mr.rkey().to_ne_bytes());
    }
}

/// Offsets of the fields of `struct ibv_mr` (checked against the bindings below).
const MR_CONTEXT: usize = 0;
const MR_PD: usize = 8;
const MR_ADDR: usize = 16;
const MR_LENGTH: usize = 24;
const MR_LKEY: usize = 36;
const MR_RKEY: usize = 40;

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(sys::ibv_mr, context) == MR_CONTEXT);
    assert!(offset_of!(sys::ibv_mr, pd) == MR_PD);
    assert!(offset_of!(sys::ibv_mr, addr) == MR_ADDR);
    assert!(offset_of!(sys::ibv_mr, length) == MR_LENGTH);
    assert!(offset_of!(sys::ibv_mr, lkey) == MR_LKEY);
    assert!(offset_of!(sys::ibv_mr, rkey) == MR_RKEY);
    assert!(ADDR_OFFSET == 8 + MR_ADDR && RKEY_OFFSET == 8 + MR_RKEY);
    assert!(std::mem::size_of::<sys::ibv_mr>() + 8 == MSG_LEN);
};

/// Decodes a received message: its type and, for `MSG_MR`, the region's address and
/// rkey. A message of another length or type is a protocol error.
pub fn decode(buf: &[u8], byte_len: u32) -> Result<(u32, u64, u32)> {
    let b: &[u8; MSG_LEN] = buf
        .get(..MSG_LEN)
        .and_then(|b| b.try_into().ok())
        .filter(|_| byte_len as usize == MSG_LEN)
        .ok_or_else(|| {
            Error::Protocol(
                format!("received a message of {byte_len} bytes, expected {MSG_LEN}").into(),
            )
        })?;
    let word = |at: usize| [b[at], b[at + 1], b[at + 2], b[at + 3]];
    let kind = u32::from_ne_bytes(word(0));
    if kind != MSG_MR && kind != MSG_DONE {
        return Err(Error::Protocol(
            format!("received a message of unknown type {kind} (0 MSG_MR or 1 MSG_DONE)").into(),
        ));
    }
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&b[ADDR_OFFSET..ADDR_OFFSET + 8]);
    Ok((
        kind,
        u64::from_ne_bytes(addr),
        u32::from_ne_bytes(word(RKEY_OFFSET)),
    ))
}

/// The `wr_id`s of the requests, one per buffer they lend: the message buffers and
/// the local region (READ target, WRITE source).
const RECV: u64 = 1;
const SEND: u64 = 2;
const LOCAL: u64 = 3;

/// The regions of one connection: the message buffers and the local region, lent to
/// the requests, and the region the peer reads from or writes into.
pub struct Regions {
    bufs: Lent,
    /// What the peer reads from / writes into.
    remote: MemoryRegion,
}

impl Regions {
    /// Registers the four regions and writes `text` where the peer will find it.
    pub fn new(conn: &Conn, mode: Mode, text: &str) -> Result<Regions> {
        let mut local = MemoryRegion::new(&conn.pd, RDMA_BUFFER_SIZE, Access::LOCAL_WRITE)?;
        let mut remote = MemoryRegion::new(
            &conn.pd,
            RDMA_BUFFER_SIZE,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )?;
        let ours = match mode {
            Mode::Write => &mut local,
            Mode::Read => &mut remote,
        };
        let n = text.len().min(RDMA_BUFFER_SIZE - 1);
        ours.write_at(0, &text.as_bytes()[..n])?; // may be remotely writable
        let mut bufs = Lent::default();
        bufs.add(
            SEND,
            "send",
            MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
        );
        bufs.add(
            RECV,
            "receive",
            MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
        );
        bufs.add(LOCAL, "local", local);
        Ok(Regions { bufs, remote })
    }
}

/// What the peer left for us.
fn peer_text(side: &mut Side, remote: &MemoryRegion, mode: Mode) -> Result<String> {
    let b = match mode {
        Mode::Write => remote.to_vec(), // the peer may write it: a volatile copy
        Mode::Read => side.bufs.get(LOCAL)?.to_vec(),
    };
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    Ok(String::from_utf8_lossy(&b[..end]).into_owned())
}

/// Sets up a connection's QP (10 sends, 10 receives) with one posted receive.
pub fn prepare(conn: &Conn, mode: Mode, text: &str) -> Result<(LeasedQp<Init>, Regions)> {
    let qp = conn.create_qp(10, 10)?;
    let mut qp = LeasedQp::before_rts(qp).map_err(|e| e.error)?;
    let mut regions = Regions::new(conn, mode, text)?;
    post_recv(&mut qp, &mut regions.bufs, RECV, MSG_LEN)?;
    Ok((qp, regions))
}

/// Runs the exchange on a connected QP in a poller thread, which sends the first
/// `MSG_MR` if `active` (the client); the caller waits for the CM events.
pub fn start(
    conn: Arc<Conn>,
    qp: LeasedQp<Init>,
    regions: Regions,
    mode: Mode,
    active: bool,
    timeout: Duration,
) -> Result<JoinHandle<Result<()>>> {
    let qp = qp.established().map_err(|e| e.error)?;
    Ok(std::thread::spawn(move || {
        let Regions { bufs, remote } = regions;
        let mut side = Side {
            conn: &conn,
            qp,
            bufs,
        };
        if active {
            send_message(&mut side, &remote, MSG_MR, false)?;
        }
        poll_loop(&mut side, &remote, mode, active, timeout)
    }))
}

/// SENDs a message; the send buffer is back by now: a message is sent only after
/// the completion of the one before it.
fn send_message(side: &mut Side, remote: &MemoryRegion, kind: u32, fenced: bool) -> Result<()> {
    let send = side.bufs.get(SEND)?;
    encode(
        send.as_mut_slice()?,
        kind,
        (kind == MSG_MR).then_some(remote),
    );
    let flags = SendFlags {
        fenced,
        ..SendFlags::SIGNALED
    };
    side.post(SEND, SendOp::Send, MSG_LEN, flags)
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum SendState {
    Init,
    MrSent,
    RdmaSent,
    DoneSent,
}

/// `mr_posted`: our `MSG_MR` is out already (the active side's), though its
/// completion may come after the peer's `MSG_MR` (a lost acknowledgement delays it).
fn poll_loop(
    side: &mut Side,
    remote: &MemoryRegion,
    mode: Mode,
    mut mr_posted: bool,
    timeout: Duration,
) -> Result<()> {
    let mut send_state = SendState::Init;
    let mut recv_mr = false;
    let mut recv_done = false;
    let mut peer: Option<(u64, u32)> = None;
    let mut posted_rdma = false;
    loop {
        let wc = side.next(timeout, "the peer's next message")?;
        let op = wc.opcode();
        if op != sys::ibv_wc_opcode::IBV_WC_RECV && !super::is_own_send(op) {
            // A WRITE with immediate, say: it used up the receive, as C's `opcode &
            // IBV_WC_RECV` would read it, but it is no message of this protocol.
            let want = sys::ibv_wc_opcode::IBV_WC_RECV;
            return Err(super::unexpected_completion(
                &wc,
                want,
                "the peer's next message",
            ));
        }
        if op == sys::ibv_wc_opcode::IBV_WC_RECV {
            let (kind, addr, rkey) = decode(side.bufs.get(RECV)?.as_slice()?, wc.byte_len())?;
            if kind == MSG_MR {
                if recv_mr {
                    return Err(Error::Protocol("a second MSG_MR".into()));
                }
                recv_mr = true;
                peer = Some((addr, rkey));
                side.post_recv(RECV, MSG_LEN)?;
                if !mr_posted {
                    send_message(side, remote, MSG_MR, false)?;
                    mr_posted = true;
                }
            } else {
                if !recv_mr {
                    return Err(Error::Protocol("MSG_DONE before MSG_MR".into()));
                }
                recv_done = true;
            }
        } else {
            send_state = match send_state {
                SendState::Init => SendState::MrSent,
                SendState::MrSent => SendState::RdmaSent,
                _ => SendState::DoneSent,
            };
            println!("send completed successfully.");
        }
        if send_state == SendState::MrSent && recv_mr && !posted_rdma {
            let (addr, rkey) = peer.unwrap_or_default();
            post_rdma(side, mode, addr, rkey)?;
            posted_rdma = true;
            // A READ must finish before the peer may look at its region: fence.
            send_message(side, remote, MSG_DONE, mode == Mode::Read)?;
        } else if send_state == SendState::DoneSent && recv_done {
            println!("remote buffer: {}", peer_text(side, remote, mode)?);
            side.conn.id.disconnect()?;
            return Ok(());
        }
    }
}

/// The RDMA READ into, or WRITE from, the local region, lent until its completion.
fn post_rdma(side: &mut Side, mode: Mode, addr: u64, rkey: u32) -> Result<()> {
    let remote = RemoteSlice {
        addr,
        len: RDMA_BUFFER_SIZE as u64,
        rkey,
    };
    let op = match mode {
        Mode::Write => {
            println!("received MSG_MR. writing message to remote memory...");
            SendOp::Write(remote)
        }
        Mode::Read => {
            println!("received MSG_MR. reading message from remote memory...");
            SendOp::Read(remote)
        }
    };
    side.post(LOCAL, op, RDMA_BUFFER_SIZE, SendFlags::SIGNALED)
}

/// Waits for the end of a connection: the poller's result, then (after its
/// disconnect) the `Disconnected` event, printing `line` for it.
pub fn finish(
    conn: &Conn,
    poller: JoinHandle<Result<()>>,
    line: &str,
    timeout: Duration,
) -> Result<()> {
    let result = poller
        .join()
        .unwrap_or_else(|_| Err(Error::Protocol("the poller thread panicked".into())));
    if let Err(e) = result {
        if super::is_disconnect(&e) {
            println!("{line}");
        }
        let _ = conn.id.disconnect();
        return Err(e);
    }
    if conn.peer_disconnected() {
        println!("{line}");
        return Ok(());
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match conn.events.get_event(Some(left))? {
            Some(ev) if ev.kind() == EventKind::Disconnected => {
                println!("{line}");
                return Ok(());
            }
            Some(_) => continue,
            None => return Err(super::timed_out("the disconnect", timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A message as the C program lays it out: type, padding, `struct ibv_mr`.
    fn message(kind: u32, addr: u64, rkey: u32) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        m[0..4].copy_from_slice(&kind.to_ne_bytes());
        m[ADDR_OFFSET..ADDR_OFFSET + 8].copy_from_slice(&addr.to_ne_bytes());
        m[RKEY_OFFSET..RKEY_OFFSET + 4].copy_from_slice(&rkey.to_ne_bytes());
        m
    }

    #[test]
    fn fields_sit_where_struct_ibv_mr_has_them() {
        assert_eq!(std::mem::size_of::<sys::ibv_mr>() + 8, MSG_LEN);
        let m = message(MSG_MR, 0x7f00_0000_1000, 0x1234);
        assert_eq!(decode(&m, 56).unwrap(), (MSG_MR, 0x7f00_0000_1000, 0x1234));
        assert!(decode(&message(2, 0, 0), 56)
            .unwrap_err()
            .to_string()
            .contains("unknown type 2"));
        assert!(decode(&m, 55).unwrap_err().to_string().contains("55 bytes"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..80), len in any::<u32>()) {
            if let Err(e) = decode(&buf, len) {
                let e = e.to_string();
                prop_assert!(e.contains("bytes, expected") || e.contains("unknown type"), "{}", e);
            }
        }

        #[test]
        fn round_trip_and_truncations_fail(done in any::<bool>(), addr in any::<u64>(), rkey in any::<u32>()) {
            let kind = if done { MSG_DONE } else { MSG_MR };
            let m = message(kind, addr, rkey);
            prop_assert_eq!(decode(&m, MSG_LEN as u32).ok(), Some((kind, addr, rkey)));
            for cut in 0..MSG_LEN {
                prop_assert!(decode(&m[..cut], cut as u32).is_err());
                prop_assert!(decode(&m[..cut], MSG_LEN as u32).is_err());
            }
        }
    }
}

//! The "RDMA read and write with IB verbs" sample (The Geek in the Corner, 02):
//! both sides exchange `MSG_MR` messages carrying a raw `struct ibv_mr`, then each
//! RDMA-READs or RDMA-WRITEs 1024 bytes of the peer's region and sends `MSG_DONE`
//! (fenced after a READ); when both DONEs are in, each prints `remote buffer: ...`
//! and disconnects. Completions are handled by a poller thread, as in the C program.

use super::Conn;
use rdma_safe::cm::{self, EventKind};
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys;
use rdma_safe::{Access, Error, MemoryRegion, QueuePair, RecvWr, Result, SendWr};
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

/// Encodes a message: `type` and the raw `ibv_mr` of `mr` (as the C program copies it).
pub fn encode(buf: &mut [u8], kind: u32, mr: Option<&MemoryRegion>) {
    buf[..MSG_LEN].fill(0);
    buf[0..4].copy_from_slice(&kind.to_ne_bytes());
    if let Some(mr) = mr {
        // SAFETY: the region is alive; `struct ibv_mr` is plain data of 48 bytes.
        let raw: sys::ibv_mr = unsafe { *mr.as_raw() };
        // SAFETY: reading the bytes of a plain C struct.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw as *const sys::ibv_mr).cast::<u8>(),
                std::mem::size_of::<sys::ibv_mr>(),
            )
        };
        buf[8..8 + bytes.len()].copy_from_slice(bytes);
    }
}

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

/// The regions of one connection.
pub struct Regions {
    send: MemoryRegion,
    recv: MemoryRegion,
    /// READ target / WRITE source.
    local: MemoryRegion,
    /// What the peer reads from / writes into.
    remote: MemoryRegion,
}

impl Regions {
    /// Registers the four regions and writes `text` where the peer will find it.
    pub fn new(conn: &Conn, mode: Mode, text: &str) -> Result<Regions> {
        let mut r = Regions {
            send: MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
            recv: MemoryRegion::new(&conn.pd, MSG_LEN, Access::LOCAL_WRITE)?,
            local: MemoryRegion::new(&conn.pd, RDMA_BUFFER_SIZE, Access::LOCAL_WRITE)?,
            remote: MemoryRegion::new(
                &conn.pd,
                RDMA_BUFFER_SIZE,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )?,
        };
        let ours = match mode {
            Mode::Write => &mut r.local,
            Mode::Read => &mut r.remote,
        };
        let n = text.len().min(RDMA_BUFFER_SIZE - 1);
        ours.write_at(0, &text.as_bytes()[..n])?; // may be remotely writable
        Ok(r)
    }

    /// Posts the receive of the next message.
    pub fn post_recv<S: rdma_safe::qp::CanRecv>(&self, qp: &QueuePair<S>) -> Result<()> {
        let mut sge = [self.recv.local(0..MSG_LEN)?];
        let mut wr = RecvWr::new(1, &mut sge);
        // SAFETY: the region lives as long as the connection; it is read only after
        // the receive's completion.
        unsafe { qp.post_recv(&mut wr) }
    }

    /// What the peer left for us.
    fn peer_text(&self, mode: Mode) -> String {
        let region = match mode {
            Mode::Write => &self.remote,
            Mode::Read => &self.local,
        };
        let b = region.to_vec(); // the peer may write it: a volatile copy
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
}

/// Sets up a connection's QP (10 sends, 10 receives) with one posted receive.
pub fn prepare(conn: &Conn, mode: Mode, text: &str) -> Result<(QueuePair<Init>, Regions)> {
    let qp = conn.create_qp(10, 10)?;
    let regions = Regions::new(conn, mode, text)?;
    regions.post_recv(&qp)?;
    Ok((qp, regions))
}

/// Runs the exchange on a connected QP in a poller thread; the caller waits for the
/// CM events. `active`: the client, which sends its `MSG_MR` first.
pub fn start(
    conn: Arc<Conn>,
    qp: QueuePair<Init>,
    mut regions: Regions,
    mode: Mode,
    active: bool,
    timeout: Duration,
) -> Result<JoinHandle<Result<()>>> {
    let qp = cm::established(qp)?;
    if active {
        send_message(&qp, &mut regions, MSG_MR, false)?;
    }
    Ok(std::thread::spawn(move || {
        poll_loop(&conn, &qp, &mut regions, mode, active, timeout)
    }))
}

fn send_message(qp: &QueuePair<Rts>, regions: &mut Regions, kind: u32, fenced: bool) -> Result<()> {
    let Regions { send, remote, .. } = regions;
    encode(
        send.as_mut_slice()?,
        kind,
        (kind == MSG_MR).then_some(&*remote),
    );
    let mut sge = [send.local(0..MSG_LEN)?];
    let mut wr = SendWr::send(2, &mut sge).signaled();
    if fenced {
        wr = wr.fenced();
    }
    // SAFETY: `send` is rewritten only for the next message, posted after this one
    // completed (MR first, DONE after the RDMA operation's completion or fence).
    unsafe { qp.post_send(&mut wr) }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum SendState {
    Init,
    MrSent,
    RdmaSent,
    DoneSent,
}

fn poll_loop(
    conn: &Conn,
    qp: &QueuePair<Rts>,
    regions: &mut Regions,
    mode: Mode,
    _active: bool,
    timeout: Duration,
) -> Result<()> {
    let mut send_state = SendState::Init;
    let mut recv_mr = false;
    let mut recv_done = false;
    let mut peer: Option<(u64, u32)> = None;
    let mut posted_rdma = false;
    loop {
        let wc = conn.completion(timeout, "the peer's next message")?;
        if wc.opcode() == sys::ibv_wc_opcode::IBV_WC_RECV {
            let (kind, addr, rkey) = decode(regions.recv.as_slice()?, wc.byte_len())?;
            if kind == MSG_MR {
                if recv_mr {
                    return Err(Error::Protocol("a second MSG_MR".into()));
                }
                recv_mr = true;
                peer = Some((addr, rkey));
                regions.post_recv(qp)?;
                if send_state == SendState::Init {
                    send_message(qp, regions, MSG_MR, false)?;
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
            let remote = rdma_safe::RemoteSlice {
                addr,
                len: RDMA_BUFFER_SIZE as u64,
                rkey,
            };
            let mut sge = [regions.local.local(0..RDMA_BUFFER_SIZE)?];
            let mut wr = match mode {
                Mode::Write => {
                    println!("received MSG_MR. writing message to remote memory...");
                    SendWr::rdma_write(3, &mut sge, remote)
                }
                Mode::Read => {
                    println!("received MSG_MR. reading message from remote memory...");
                    SendWr::rdma_read(3, &mut sge, remote)
                }
            }
            .signaled();
            // SAFETY: `local` is not touched until this request completed (the
            // DONE after it is fenced for a READ; the text is printed at the end).
            unsafe { qp.post_send(&mut wr) }?;
            posted_rdma = true;
            // A READ must finish before the peer may look at its region: fence.
            send_message(qp, regions, MSG_DONE, mode == Mode::Read)?;
        } else if send_state == SendState::DoneSent && recv_done {
            println!("remote buffer: {}", regions.peer_text(mode));
            conn.id.disconnect()?;
            return Ok(());
        }
    }
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

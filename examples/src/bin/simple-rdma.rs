//! `simple-rdma`: the simpleIBverbs program, ported. Client and server exchange
//! LID/QPN/PSN/rkey/address over TCP (the 45-byte message; with the GID appended on
//! RoCE, see `examples::perftest::legacy`), connect RC queue pairs, and the server
//! RDMA-WRITEs `Saluton Teewurst. UiUi` into the client's buffer; the client waits
//! until the text appears and prints it.
//!
//! ```text
//! simple-rdma [-p port] [-d dev] [-i ib-port] [-g gid-idx] [-s size] [host]
//! ```
//! Both sides write their message first, then read the peer's. After connecting, a
//! second identical exchange (as in `ib_rdma_bw`) makes sure the client's QP is ready
//! before the server writes. The client keeps its QP until the server hangs up:
//! the text can arrive before the client's acknowledgement of it does, and on a
//! lossy wire the server's retry needs a QP to answer it.

use clap::Parser;
use examples::perftest::legacy::{read_dest_within, LegacyDest};
use examples::perftest::report::c_alt_hex;
use rdma_safe::qp::Rts;
use rdma_safe::Deadline;
use rdma_safe::{
    Access, CompletionQueue, Gid, InitAttr, Lease, LeasedQp, MemoryRegion, ProtectionDomain,
    QpConfig, QueuePair, RemoteEndpoint, RemoteSlice, RtrAttr, RtsAttr, SendOp, WorkCompletion,
};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The text the server writes.
const MESSAGE: &[u8] = b"Saluton Teewurst. UiUi";

/// Command line.
#[derive(Parser, Debug)]
#[command(name = "simple-rdma", about = "the simpleIBverbs RDMA WRITE example")]
struct Args {
    /// listen on/connect to port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// use IB device (default: RDMA_DEVICE, else the first device found)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// use port of IB device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (default on Ethernet: RDMA_GID_INDEX, else the RoCE v2 IPv4 GID)
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// buffer size (the region is twice this; the peer writes into the second half)
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: usize,
    /// server to connect to (none: be the server, the writer)
    servername: Option<String>,
}

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("simple-rdma: {e}");
        std::process::exit(1);
    }
}

/// Both sides write their message, then read the peer's, all within one deadline.
fn exchange(sock: &mut TcpStream, mine: &LegacyDest) -> AnyResult<LegacyDest> {
    let deadline = Deadline::after(EXCHANGE_TIMEOUT, "the address exchange");
    deadline.write_all(sock, &mine.encode(), "address")?;
    read_dest_within(sock, &deadline)
}

/// How long the whole address exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

fn run(args: &Args) -> AnyResult<()> {
    if args.size < MESSAGE.len() + 1 {
        return Err(format!("size must be at least {}", MESSAGE.len() + 1).into());
    }
    let sel =
        rdma_safe::Selection::from_env(args.ib_dev.clone(), args.ib_port, args.gid_idx).open()?;
    let (gid_index, gid) = (sel.gid_index(), sel.gid.map(|(_, g)| g));
    let (ctx, port) = (sel.ctx, sel.port);
    let size = args.size;
    let pd = ProtectionDomain::new(&ctx)?;
    let mr = MemoryRegion::new(
        &pd,
        2 * size,
        Access::from_bits(Access::LOCAL_WRITE.bits() | Access::REMOTE_WRITE.bits()),
    )?;
    let cq = CompletionQueue::new(&ctx, 4)?;
    let qp = QueuePair::new(&pd, &QpConfig::rc(&cq))?.to_init(&InitAttr {
        port: args.ib_port,
        ..Default::default()
    })?;
    let me = LegacyDest {
        lid: port.lid(),
        qpn: qp.qp_num(),
        psn: rdma_safe::random_psn(),
        rkey: mr.rkey(),
        vaddr: mr.addr() + size as u64,
        gid: gid.map(|g| g.0),
    };
    let mut sock = match &args.servername {
        Some(host) => examples::tcp::connect(host, args.port, Duration::from_secs(5))?,
        None => examples::tcp::accept(args.port)?,
    };
    sock.set_read_timeout(Some(Duration::from_secs(60)))?;
    let rem = exchange(&mut sock, &me)?;
    print_addresses(&me, &rem);
    let mut rtr = RtrAttr::new(
        RemoteEndpoint {
            qpn: rem.qpn,
            psn: rem.psn,
            lid: rem.lid,
            gid: rem.gid.filter(|_| gid_index.is_some()).map(Gid),
        },
        port.active_mtu(),
    );
    rtr.port = args.ib_port;
    rtr.sgid_index = gid_index.unwrap_or(0) as u8;
    let qp = qp
        .to_rtr(&rtr)
        .map_err(|e| format!("Failed to modify QP to RTR: {}", e.error))?
        .to_rts(&RtsAttr::new(me.psn))
        .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
    exchange(&mut sock, &me)?;
    match args.servername {
        None => write_text(qp, mr, &rem),
        Some(_) => {
            wait_for_text(&mr, size)?;
            wait_for_hangup(&mut sock);
            drop(qp);
            Ok(())
        }
    }
}

/// How long the client waits for the server to hang up once the text is there.
const HANGUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The client, the text printed: waits until the server closes the connection,
/// which it does once its WRITE completed, that is once the client's queue pair
/// acknowledged it. A server that says nothing for [`HANGUP_TIMEOUT`] is left with
/// a line on stderr: the text arrived, which is what the program is for.
fn wait_for_hangup(sock: &mut TcpStream) {
    use std::io::Read;
    let deadline = Instant::now() + HANGUP_TIMEOUT;
    let mut scratch = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || sock.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match sock.read(&mut scratch) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            // Reset or otherwise gone: the server is done either way.
            Err(_) => return,
        }
    }
    eprintln!(
        "simple-rdma: the server did not hang up within {} s",
        HANGUP_TIMEOUT.as_secs()
    );
}

/// `local address: ...` and `remote address: ...`.
fn print_addresses(me: &LegacyDest, rem: &LegacyDest) {
    for (side, d) in [("local ", me), ("remote", rem)] {
        println!(
            "{side} address: LID {} QPN {} PSN {} RKey {} VAddr {}{}",
            c_alt_hex(d.lid as u64, 4),
            c_alt_hex(d.qpn as u64, 6),
            c_alt_hex(d.psn as u64, 6),
            c_alt_hex(d.rkey as u64, 8),
            c_alt_hex(d.vaddr, 16),
            d.gid
                .map(|g| format!(" GID {}", std::net::Ipv6Addr::from(g)))
                .unwrap_or_default()
        );
    }
}

/// The server: RDMA-WRITEs the text (with its NUL) into the client's buffer and waits
/// for the write's completion, which gives the region back.
fn write_text(qp: QueuePair<Rts>, mut mr: MemoryRegion, rem: &LegacyDest) -> AnyResult<()> {
    mr.write_at(0, MESSAGE)?; // remotely writable: a volatile copy
    let cq = qp.send_cq().clone();
    let mut conn = LeasedQp::new(qp).map_err(|e| e.error)?;
    let len = MESSAGE.len() + 1;
    let remote = RemoteSlice {
        addr: rem.vaddr,
        len: len as u64,
        rkey: rem.rkey,
    };
    conn.post_send(1, SendOp::Write(remote), Lease::Owned(mr), 0..len, true)
        .map_err(|e| e.error)?;
    let mut wcs = [WorkCompletion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(wc) = cq.poll_completions(&mut wcs)?.next() {
            wc.result()?;
            conn.complete(wc)?;
            break;
        }
        if Instant::now() > deadline {
            return Err("the RDMA WRITE did not complete within 30 s".into());
        }
    }
    println!(
        "wrote {} bytes: {}",
        MESSAGE.len(),
        String::from_utf8_lossy(MESSAGE)
    );
    Ok(())
}

/// The client: waits until the text appears in the second half of its buffer (read
/// with volatile copies: the peer writes it by RDMA) and prints it.
fn wait_for_text(mr: &MemoryRegion, size: usize) -> AnyResult<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = [0u8; MESSAGE.len()];
    loop {
        mr.read_at(size, &mut got)?;
        if got == MESSAGE {
            break;
        }
        if Instant::now() > deadline {
            return Err("the server's text did not arrive within 30 s".into());
        }
        std::hint::spin_loop();
    }
    println!("{}", String::from_utf8_lossy(&got));
    Ok(())
}

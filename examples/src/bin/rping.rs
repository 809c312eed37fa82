//! `rping`: the RDMA CM ping-pong of rdmacm-utils, interoperable with the C `rping`.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```
//!
//! Per ping the client SENDs a 16-byte descriptor `{be64 addr, be32 rkey, be32 size}`
//! of its source buffer; the server RDMA-READs it, SENDs a go-ahead; the client SENDs
//! the descriptor of its sink buffer; the server RDMA-WRITEs the data back and SENDs a
//! go-ahead. `-v` prints `ping data: ...` (client) and `server ping data: ...`
//! (server). `-P` serves clients each on its own thread, up to 64 at once (C's has
//! no bound); a request beyond, or one whose resources cannot be made (descriptors
//! or threads run out), is refused alone and the others go on. Every wait
//! has a timeout (`--timeout`, default 30 s), except a server's waits for clients,
//! as C's: a `-P` server waits for the next one without limit, and a server for
//! its first one too unless `--timeout` is given.

use clap::Parser;
use examples::cm::desc::{Info, INFO_LEN};
use examples::cm::leased::{post_recv, Lent, Side};
use examples::cm::workers::Workers;
use examples::cm::{exit_status, is_disconnect, socket_addr, Conn};
use rdma_safe::cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::sys::ibv_wc_opcode as Op;
use rdma_safe::{Access, Error, LeasedQp, MemoryRegion, RemoteSlice, Result, SendFlags, SendOp};
use std::net::SocketAddr;
use std::time::Duration;

/// Smallest `-S`: room for "rdma-ping-2147483647: " and a NUL, as C's
/// `RPING_MIN_BUFSIZE` comes out in Debian's rping 44 (which checks and prints 23).
const MIN_SIZE: usize = 23;
/// Largest `-S` + 1.
const MAX_SIZE: usize = 64 * 1024;
/// Send queue depth (C rping's RPING_SQ_DEPTH).
const SQ_DEPTH: u32 = 16;
/// Clients `-P` serves at once; more are refused (C's has no bound: a client that
/// opened connections and left them idle made it run out of descriptors).
const MAX_CLIENTS: usize = 64;

/// Command line (the C program's options). As C's getopt with `opterr` off, an
/// option it does not know (`-h`, `-t`) prints the usage and exits 22; numbers
/// are read with `atoi`, and of `-s` and `-c` the last one given counts.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "rping",
    disable_help_flag = true,
    // C's getopt takes a flag given twice (`-vv`, `-d -d`).
    args_override_self = true
)]
struct Args {
    /// server side
    #[arg(short = 's', overrides_with = "client")]
    server: bool,
    /// client side
    #[arg(short = 'c', overrides_with = "server")]
    client: bool,
    /// address (server: to bind, default any; client: of the server)
    #[arg(short = 'a', allow_hyphen_values = true)]
    addr: Option<String>,
    /// source address to bind to (client)
    #[arg(short = 'I', allow_hyphen_values = true)]
    source: Option<String>,
    /// port (C's `htobe16(atoi(..))`: the low 16 bits)
    #[arg(short = 'p', default_value = "7174", value_parser = atoi_arg, allow_hyphen_values = true)]
    port_arg: i32,
    /// ping count times (0: forever)
    #[arg(short = 'C', default_value = "0", value_parser = atoi_arg, allow_hyphen_values = true)]
    count_arg: i32,
    /// ping data size
    #[arg(short = 'S', default_value = "64", value_parser = atoi_arg, allow_hyphen_values = true)]
    size_arg: i32,
    /// display ping data to stdout
    #[arg(short = 'v')]
    verbose: bool,
    /// validate ping data
    #[arg(short = 'V')]
    validate: bool,
    /// debug printfs
    #[arg(short = 'd')]
    debug: bool,
    /// persistent server mode allowing multiple connections
    #[arg(short = 'P')]
    persistent: bool,
    /// use self-created, self-modified QP (accepted: the queue pair is the CM's
    /// either way, and the ping the same)
    #[arg(short = 'q')]
    self_create_qp: bool,
    /// seconds any single wait may take before giving up (default 30); a server
    /// waits for its first client without limit unless this is given, as C's does
    /// (a -P server for the next one always)
    #[arg(long = "timeout")]
    timeout: Option<u64>,
    /// Words that are not options: C's getopt leaves them, and rping ignores them.
    #[arg(hide = true)]
    _operands: Vec<String>,
    /// `-p`, checked.
    #[arg(skip)]
    port: u16,
    /// `-C`, checked.
    #[arg(skip)]
    count: u32,
    /// `-S`, checked.
    #[arg(skip)]
    size: usize,
}

/// A number as C's `atoi` reads it (never refused).
fn atoi_arg(s: &str) -> std::result::Result<i32, std::convert::Infallible> {
    Ok(examples::c_args::atoi(s))
}

/// C rping's usage, on standard output.
fn usage() {
    println!("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]");
    println!("rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]");
    println!("\t-c\t\tclient side");
    println!("\t-I\t\tSource address to bind to for client.");
    println!("\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0");
    println!("\t-v\t\tdisplay ping data to stdout");
    println!("\t-V\t\tvalidate ping data");
    println!("\t-d\t\tdebug printfs");
    println!("\t-S size \tping data size");
    println!("\t-C count\tping count times");
    println!("\t-a addr\t\taddress");
    println!("\t-p port\t\tport");
    println!("\t-P\t\tpersistent server mode allowing multiple connections");
    println!("\t-q\t\tuse self-created, self-modified QP");
}

/// C's status for a command line it refuses (EINVAL).
const EINVAL: i32 = 22;

/// The command line, checked as C checks it: the usage and 22 for an option it
/// does not know or neither of `-s` and `-c`; C's message and 22 for a size or
/// count out of range.
fn parse() -> Args {
    let Ok(mut args) = Args::try_parse() else {
        usage();
        std::process::exit(EINVAL);
    };
    let mut refused = false;
    if args.size_arg < MIN_SIZE as i32 || args.size_arg > MAX_SIZE as i32 - 1 {
        eprintln!(
            "Invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
            args.size_arg
        );
        refused = true;
    }
    if args.count_arg < 0 {
        eprintln!("Invalid count {}", args.count_arg);
        refused = true;
    }
    if refused {
        std::process::exit(EINVAL);
    }
    if !args.server && !args.client {
        usage();
        std::process::exit(EINVAL);
    }
    args.size = args.size_arg as usize;
    args.count = args.count_arg as u32;
    args.port = args.port_arg as u16;
    args
}

impl Args {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout.unwrap_or(30).max(1))
    }

    fn debug(&self, text: impl FnOnce() -> String) {
        if self.debug {
            println!("{}", text());
        }
    }
}

fn main() {
    let args = parse();
    let result = if args.server {
        run_server(&args)
    } else {
        run_client(&args)
    };
    // C's rping returns -1 from most failures.
    if let Err(e) = result {
        exit_status("rping", &e, 255);
    }
}

/// The `wr_id`s of the requests, one per buffer they lend: receive and send of the
/// 16-byte messages, the RDMA buffer (READ and WRITE), and the client's source.
const RECV: u64 = 1;
const SEND: u64 = 2;
const RDMA: u64 = 3;
const START: u64 = 4;

/// The buffers of one side.
fn buffers(conn: &Conn, size: usize, client: bool) -> Result<Lent> {
    let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mut bufs = Lent::default();
    bufs.add(
        RECV,
        "receive",
        MemoryRegion::new(&conn.pd, INFO_LEN, Access::LOCAL_WRITE)?,
    );
    bufs.add(
        SEND,
        "send",
        MemoryRegion::new(&conn.pd, INFO_LEN, Access::LOCAL_WRITE)?,
    );
    bufs.add(RDMA, "RDMA", MemoryRegion::new(&conn.pd, size, remote)?);
    if client {
        bufs.add(START, "source", MemoryRegion::new(&conn.pd, size, remote)?);
    }
    Ok(bufs)
}

/// SENDs the send buffer (signaled; its completion is collected by a later wait),
/// once the previous SEND gave it back, after `fill` wrote into it.
fn send(side: &mut Side, t: Duration, fill: Option<Info>) -> Result<()> {
    side.reclaim(SEND, Op::IBV_WC_SEND, t)?;
    if let Some(info) = fill {
        side.bufs.get(SEND)?.as_mut_slice()?[..INFO_LEN].copy_from_slice(&info.encode());
    }
    side.post(SEND, SendOp::Send, INFO_LEN, SendFlags::SIGNALED)
}

/// The text of a NUL-terminated buffer.
fn c_str(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

// ---------------------------------------------------------------------- client

fn run_client(args: &Args) -> Result<()> {
    let host = args
        .addr
        .as_deref()
        .ok_or_else(|| Error::InvalidArgument("the client needs -a <server address>".into()))?;
    let dst = socket_addr(host, args.port)?;
    let src = match &args.source {
        Some(s) => Some(socket_addr(s, 0)?),
        None => None,
    };
    let events = EventChannel::new()?;
    let id = CmId::new(&events, PortSpace::Tcp)?;
    id.resolve(src, dst, Duration::from_millis(2000))?;
    args.debug(|| "rdma_resolve_addr - rdma_resolve_route successful".into());
    let conn = Conn::new(id, events, SQ_DEPTH * 2)?;
    let mut qp = LeasedQp::before_rts(conn.create_qp(SQ_DEPTH, 2)?).map_err(|e| e.error)?;
    let mut bufs = buffers(&conn, args.size, true)?;
    post_recv(&mut qp, &mut bufs, RECV, INFO_LEN)?;
    conn.id.connect(&ConnParam::default())?;
    drop(conn.wait_established(args.timeout(), "rdma_connect")?);
    let qp = qp.established().map_err(|e| e.error)?;
    args.debug(|| "rdma_connect successful".into());

    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    let result = ping_loop(args, &mut side);
    match result {
        Err(e) if is_disconnect(&e) => {
            eprintln!("client DISCONNECT EVENT...");
            Ok(())
        }
        Err(e) => {
            conn.close(Duration::from_secs(2));
            Err(e)
        }
        Ok(()) => {
            conn.close(Duration::from_secs(2));
            Ok(())
        }
    }
}

fn ping_loop(args: &Args, side: &mut Side) -> Result<()> {
    let t = args.timeout();
    let size = args.size;
    let mut start: u8 = 65;
    let mut ping: u32 = 0;
    while args.count == 0 || ping < args.count {
        let src = side.bufs.get(START)?;
        // The source is remotely readable and writable: fill a copy, then write it in.
        let mut data = vec![0; src.len()];
        fill_ping(&mut data, ping, start);
        src.write_at(0, &data)?;
        start = if start >= 122 { 65 } else { start + 1 };
        let (addr, rkey) = (src.addr(), src.rkey());
        send(
            side,
            t,
            Some(Info {
                addr,
                rkey,
                size: size as u32,
            }),
        )?;
        // Wait for the server's go-ahead: it has read our source buffer.
        let wc = side.wait(
            Op::IBV_WC_RECV,
            t,
            "the server's go-ahead after its RDMA READ",
        )?;
        check_len(wc.byte_len())?;
        side.post_recv(RECV, INFO_LEN)?;

        let sink = side.bufs.get(RDMA)?;
        let (addr, rkey) = (sink.addr(), sink.rkey());
        send(
            side,
            t,
            Some(Info {
                addr,
                rkey,
                size: size as u32,
            }),
        )?;
        let wc = side.wait(
            Op::IBV_WC_RECV,
            t,
            "the server's go-ahead after its RDMA WRITE",
        )?;
        check_len(wc.byte_len())?;
        side.post_recv(RECV, INFO_LEN)?;

        let src = side.bufs.get(START)?.to_vec();
        let got = side.bufs.get(RDMA)?.to_vec();
        if args.validate && src != got {
            return Err(Error::Protocol("data mismatch!".into()));
        }
        if args.verbose {
            println!("ping data: {}", c_str(&got));
        }
        ping += 1;
    }
    Ok(())
}

/// `rdma-ping-N: ` followed by rotating characters from `start` ('A'..'z'), NUL last.
fn fill_ping(buf: &mut [u8], ping: u32, start: u8) {
    let head = format!("rdma-ping-{ping}: ");
    let n = head.len().min(buf.len());
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = start;
    for b in &mut buf[n..] {
        *b = c;
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
}

fn check_len(byte_len: u32) -> Result<()> {
    if byte_len as usize != INFO_LEN {
        return Err(Error::Protocol(
            format!("Received bogus data, size {byte_len} (a go-ahead is {INFO_LEN} bytes)").into(),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------- server

fn run_server(args: &Args) -> Result<()> {
    let bind: SocketAddr = match &args.addr {
        Some(a) => socket_addr(a, args.port)?,
        None => SocketAddr::from(([0, 0, 0, 0], args.port)),
    };
    let events = EventChannel::new()?;
    let listener = CmId::new(&events, PortSpace::Tcp)?;
    listener.bind_addr(bind)?;
    listener.listen(3)?;
    args.debug(|| format!("rdma_listen on {bind}"));
    if args.persistent {
        let workers = Workers::new("rping", MAX_CLIENTS);
        loop {
            let req = match events.get_event(None)? {
                Some(ev) if ev.kind() == EventKind::ConnectRequest => ev,
                Some(ev) => {
                    args.debug(|| format!("listener event {} ignored", ev.name()));
                    continue;
                }
                None => continue,
            };
            let id = req.id().clone();
            drop(req);
            // Each connection reports to its own channel, served by its own thread;
            // one that cannot be is refused, and the others go on.
            let args = args.clone();
            workers.serve(id, move |id, own| {
                if let Err(e) = serve(&args, id, own) {
                    eprintln!("rping: connection failed: {e}");
                }
            });
        }
    }
    // As C's server, it waits for its client as long as it takes, unless told.
    let first_client = args.timeout.map(|_| args.timeout());
    let req = loop {
        match events.get_event(first_client)? {
            Some(ev) if ev.kind() == EventKind::ConnectRequest => break ev,
            Some(_) => continue,
            None if first_client.is_none() => continue,
            None => {
                return Err(examples::cm::timed_out(
                    "a client to connect",
                    args.timeout(),
                ))
            }
        }
    };
    let id = req.id().clone();
    drop(req);
    let own = EventChannel::new()?;
    id.migrate(&own)?;
    serve(args, id, own)
}

/// Serves one connection until the client disconnects.
fn serve(args: &Args, id: CmId, events: std::sync::Arc<EventChannel>) -> Result<()> {
    let conn = Conn::new(id, events, SQ_DEPTH * 2)?;
    let mut qp = LeasedQp::before_rts(conn.create_qp(SQ_DEPTH, 2)?).map_err(|e| e.error)?;
    let mut bufs = buffers(&conn, args.size, false)?;
    post_recv(&mut qp, &mut bufs, RECV, INFO_LEN)?;
    conn.id.accept(&ConnParam::default())?;
    drop(conn.wait_established(args.timeout(), "rdma_accept")?);
    let qp = qp.established().map_err(|e| e.error)?;
    args.debug(|| "accepted client connection".into());
    let mut side = Side {
        conn: &conn,
        qp,
        bufs,
    };
    match pong_loop(args, &mut side) {
        Err(e) if is_disconnect(&e) => {
            eprintln!("server DISCONNECT EVENT...");
            let _ = conn.id.disconnect();
            Ok(())
        }
        Err(e) => {
            conn.close(Duration::from_secs(2));
            Err(e)
        }
        Ok(()) => Ok(()),
    }
}

fn pong_loop(args: &Args, side: &mut Side) -> Result<()> {
    // The client may think between pings: only the connection's own timeouts apply
    // while waiting for the next descriptor (a disconnect ends the loop).
    let idle = Duration::from_secs(24 * 3600);
    let t = args.timeout();
    loop {
        let wc = side.wait(Op::IBV_WC_RECV, idle, "the client's source descriptor")?;
        let recv = side.bufs.get(RECV)?;
        let Info {
            addr,
            rkey,
            size: len,
        } = Info::decode(recv.as_slice()?, wc.byte_len())?;
        side.post_recv(RECV, INFO_LEN)?;
        args.debug(|| format!("Received rkey {rkey:x} addr {addr:x} len {len} from peer"));
        let ours = side.bufs.get(RDMA)?.len();
        if len as usize > ours {
            return Err(Error::Protocol(
                format!("the client's buffer is {len} bytes, ours {ours} (use the same -S)").into(),
            ));
        }
        let remote = RemoteSlice {
            addr,
            len: len as u64,
            rkey,
        };
        side.post(
            RDMA,
            SendOp::Read(remote),
            len as usize,
            SendFlags::SIGNALED,
        )?;
        side.wait(Op::IBV_WC_RDMA_READ, t, "the RDMA READ of the ping data")?;
        let data = side.bufs.get(RDMA)?.to_vec();
        if args.verbose {
            println!("server ping data: {}", c_str(&data));
        }
        send(side, t, None)?; // the go-ahead: 16 bytes the C server never writes

        let wc = side.wait(Op::IBV_WC_RECV, t, "the client's sink descriptor")?;
        let recv = side.bufs.get(RECV)?;
        let Info {
            addr,
            rkey,
            size: len,
        } = Info::decode(recv.as_slice()?, wc.byte_len())?;
        side.post_recv(RECV, INFO_LEN)?;
        let n = (c_str(&data).len() + 1).min(len as usize).min(data.len());
        let remote = RemoteSlice {
            addr,
            len: n as u64,
            rkey,
        };
        side.post(RDMA, SendOp::Write(remote), n, SendFlags::SIGNALED)?;
        side.wait(Op::IBV_WC_RDMA_WRITE, t, "the RDMA WRITE of the pong data")?;
        send(side, t, None)?; // the go-ahead: 16 bytes the C server never writes
    }
}

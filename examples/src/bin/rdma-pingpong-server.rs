//! `rdma-pingpong-server [-s addr] [-p port]` (rdma_server's command line; also
//! `rdma-pingpong-server [port] [-a addr]`): the `rdma_verbs.h` endpoint flow of
//! rdmacm's `rdma_server` (the ibverbs_practice sample), for many rounds:
//! `rdma_getaddrinfo` (passive), `rdma_create_ep`, `rdma_listen`, `rdma_get_request`,
//! `rdma_reg_msgs`, the receive posted before the peer sends, `rdma_accept`, then per
//! round a 16-byte receive answered by a 16-byte SEND (`ping N` comes back as
//! `pong N`), until the client disconnects. Works with rdmacm's C `rdma_client`
//! too (one round). Prints `rdma-pingpong-server: start` and
//! `rdma-pingpong-server: <N> rounds, end 0`.

use clap::Parser;
use examples::cm::exit_with;
use rdma_safe::cm::ep::{AddrInfo, Endpoint, EpConfig};
use rdma_safe::cm::ConnParam;
use rdma_safe::{Error, MemoryRegion, Result};
use std::time::Duration;

/// Message size, as rdma_server/rdma_client.
const MSG: usize = 16;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rdma-pingpong-server",
    about = "RDMA CM endpoint-API ping-pong server"
)]
struct Args {
    /// port to listen on (older form of -p)
    #[arg(value_name = "PORT", conflicts_with = "port_opt")]
    port: Option<String>,
    /// port to listen on (default 7471, as rdma_server)
    #[arg(short = 'p', long = "port")]
    port_opt: Option<String>,
    /// address to bind (default: any), as rdma_server's -s
    #[arg(short = 'a', short_alias = 's', long = "addr")]
    addr: Option<String>,
    /// print every message
    #[arg(short = 'v')]
    verbose: bool,
    /// seconds to wait for a client, and for each message
    #[arg(long = "timeout", default_value_t = 60)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    println!("rdma-pingpong-server: start");
    match run(&args) {
        Ok(rounds) => println!("rdma-pingpong-server: {rounds} rounds, end 0"),
        Err(e) => exit_with("rdma-pingpong-server", &e),
    }
}

fn run(args: &Args) -> Result<u64> {
    let t = Duration::from_secs(args.timeout.max(1));
    let port = args
        .port_opt
        .as_deref()
        .or(args.port.as_deref())
        .unwrap_or("7471");
    let info = AddrInfo::new(args.addr.as_deref(), port, true)?;
    let config = EpConfig {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_inline_data: MSG as u32,
        sq_sig_all: true,
    };
    let listen = Endpoint::create(&info, &config)?;
    listen.listen(0)?;
    let mut ep = listen.get_request(t)?;
    let recv = ep.reg_msgs(MSG)?;
    let mut send = ep.reg_msgs(MSG)?;
    let result = serve(args, t, &mut ep, &recv, &mut send);
    // The endpoint, and its queue pair, go before the regions: a receive into
    // `recv` is still posted when the client leaves or a round fails.
    drop(ep);
    result
}

/// Accepts and answers every ping until the client leaves; `recv` and `send`
/// outlive `ep`. Returns the rounds.
fn serve(
    args: &Args,
    t: Duration,
    ep: &mut Endpoint,
    recv: &MemoryRegion,
    send: &mut MemoryRegion,
) -> Result<u64> {
    // Raw on purpose: this port shows the rdma_verbs.h endpoint calls (the endpoint
    // owns its QP, so LeasedQp cannot). SAFETY: `recv` outlives `ep` (see `run`), so
    // the receive; it is read only after its completion.
    unsafe { ep.post_recv(1, recv, 0..MSG)? };
    ep.accept(&ConnParam::default(), t)?;
    let mut rounds = 0u64;
    loop {
        let wc = match ep.get_recv_comp(t) {
            Ok(wc) => wc,
            // The client disconnected (or the posted receive was flushed by it).
            Err(e) if e.errno() == Some(libc::ECONNRESET) => break,
            Err(Error::Completion {
                status: rdma_safe::sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
                ..
            }) => break,
            Err(e) => return Err(e),
        };
        if wc.byte_len() as usize != MSG {
            let _ = ep.disconnect();
            return Err(Error::Protocol(
                format!("received {} bytes, expected {MSG}", wc.byte_len()).into(),
            ));
        }
        let mut msg = [0u8; MSG];
        msg.copy_from_slice(recv.as_slice()?);
        if args.verbose {
            println!("received: {}", text(&msg));
        }
        if msg.starts_with(b"ping") {
            msg[..4].copy_from_slice(b"pong");
        }
        send.as_mut_slice()?.copy_from_slice(&msg);
        // The next receive goes up before the reply lets the client send again.
        // Raw on purpose (rdma_post_recv, see above). SAFETY: as above; the previous
        // receive completed.
        unsafe { ep.post_recv(1, recv, 0..MSG)? };
        // Raw on purpose (rdma_post_send, see above). SAFETY: `send` is untouched until
        // the completion polled just below.
        unsafe { ep.post_send(2, send, 0..MSG, true)? };
        ep.get_send_comp(t)?;
        rounds += 1;
    }
    let _ = ep.disconnect();
    Ok(rounds)
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

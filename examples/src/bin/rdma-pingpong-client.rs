//! `rdma-pingpong-client <ip> [port] [-n rounds]`: the `rdma_verbs.h` endpoint flow of
//! rdmacm's `rdma_client` (the ibverbs_practice sample), for many rounds:
//! `rdma_getaddrinfo`, `rdma_create_ep` (address and route resolved, QP created),
//! `rdma_reg_msgs`, the receive posted before the server can answer, `rdma_connect`,
//! then per round a 16-byte SEND of `ping N` and the server's reply, `pong N`
//! (checked unless `--any-reply`, for rdmacm's C `rdma_server`, which answers with
//! its own bytes). Prints `rdma-pingpong-client: start` and
//! `rdma-pingpong-client: <N> rounds, end 0`.

use clap::Parser;
use examples::cm::exit_with;
use rdma_safe::cm::ep::{AddrInfo, Endpoint, EpConfig};
use rdma_safe::cm::ConnParam;
use rdma_safe::{Error, Result};
use std::time::Duration;

/// Message size, as rdma_server/rdma_client.
const MSG: usize = 16;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rdma-pingpong-client",
    about = "RDMA CM endpoint-API ping-pong client"
)]
struct Args {
    /// server address
    ip: String,
    /// server port
    #[arg(default_value = "7471")]
    port: String,
    /// rounds
    #[arg(short = 'n', default_value_t = 100)]
    rounds: u64,
    /// accept any 16-byte reply (the C rdma_server does not echo)
    #[arg(long = "any-reply")]
    any_reply: bool,
    /// print every reply
    #[arg(short = 'v')]
    verbose: bool,
    /// seconds any wait may take
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    println!("rdma-pingpong-client: start");
    match run(&args) {
        Ok(()) => println!("rdma-pingpong-client: {} rounds, end 0", args.rounds),
        Err(e) => exit_with("rdma-pingpong-client", &e),
    }
}

fn run(args: &Args) -> Result<()> {
    let t = Duration::from_secs(args.timeout.max(1));
    let info = AddrInfo::new(Some(&args.ip), &args.port, false)?;
    let config = EpConfig {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_inline_data: MSG as u32,
        sq_sig_all: true,
    };
    let mut ep = Endpoint::create(&info, &config)?;
    let recv = ep.reg_msgs(MSG)?;
    let mut send = ep.reg_msgs(MSG)?;
    // SAFETY: `recv` outlives the receive; it is read only after its completion.
    unsafe { ep.post_recv(1, &recv, 0..MSG)? };
    ep.connect(&ConnParam::default(), t)?;
    for round in 0..args.rounds {
        if round > 0 {
            // SAFETY: as above; the previous receive completed.
            unsafe { ep.post_recv(1, &recv, 0..MSG)? };
        }
        let mut msg = [0u8; MSG];
        let ping = format!("ping {round}");
        msg[..ping.len().min(MSG - 1)].copy_from_slice(&ping.as_bytes()[..ping.len().min(MSG - 1)]);
        send.as_mut_slice()?.copy_from_slice(&msg);
        // SAFETY: `send` is untouched until the completion polled just below.
        unsafe { ep.post_send(2, &send, 0..MSG, true)? };
        ep.get_send_comp(t)?;
        let wc = ep.get_recv_comp(t)?;
        if wc.byte_len() as usize != MSG {
            let _ = ep.disconnect();
            return Err(Error::Protocol(
                format!("received {} bytes, expected {MSG}", wc.byte_len()).into(),
            ));
        }
        let reply = text(recv.as_slice()?);
        if args.verbose {
            println!("reply {round}: {reply}");
        }
        if !args.any_reply && reply != format!("pong {round}") {
            let _ = ep.disconnect();
            return Err(Error::Protocol(
                format!("round {round}: expected `pong {round}`, got `{reply}`").into(),
            ));
        }
    }
    ep.disconnect()?;
    Ok(())
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

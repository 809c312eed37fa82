//! `rdma-pingpong-client [-s server] [-p port]`: rdmacm's `rdma_client` (the
//! `rdma_verbs.h` endpoint flow), ported, with its command line and, by default, its
//! exchange: `rdma_getaddrinfo`, `rdma_create_ep` (address and route resolved, QP
//! created), `rdma_reg_msgs`, the receive posted before the server can answer,
//! `rdma_connect`, one 16-byte SEND and the server's 16-byte reply, whatever it holds
//! (the C `rdma_server` answers with 16 bytes of its own), then `rdma_disconnect`.
//! The server defaults to 127.0.0.1 and the port to 7471, as `rdma_client`'s.
//!
//! The message sent is `ping N` (the C client's is 16 zero bytes; its server reads
//! neither). Beyond `rdma_client`: `-n` rounds, `--expect-pong` to require the
//! reply `pong N` (what `rdma-pingpong-server` answers), `-v` to print every reply.
//! The older form `rdma-pingpong-client <ip> [port]` still works. Prints
//! `rdma-pingpong-client: start` and `rdma-pingpong-client: <N> rounds, end 0`.

use clap::Parser;
use examples::cm::exit_with;
use rdma_safe::cm::ep::{AddrInfo, Endpoint, EpConfig};
use rdma_safe::cm::ConnParam;
use rdma_safe::{Error, MemoryRegion, Result};
use std::time::Duration;

/// Message size, as rdma_server/rdma_client.
const MSG: usize = 16;

/// Command line: `rdma_client`'s (`-s`, `-p`) and this port's additions.
#[derive(Parser, Debug)]
#[command(
    name = "rdma-pingpong-client",
    about = "RDMA CM endpoint-API ping-pong client (rdmacm's rdma_client)"
)]
struct Args {
    /// server address (default 127.0.0.1, as rdma_client)
    #[arg(short = 's', long = "server", conflicts_with = "ip")]
    server: Option<String>,
    /// server port (default 7471, as rdma_client)
    #[arg(short = 'p', long = "port", conflicts_with = "port_arg")]
    port: Option<String>,
    /// server address (older form of -s)
    #[arg(value_name = "IP")]
    ip: Option<String>,
    /// server port (older form of -p)
    #[arg(value_name = "PORT")]
    port_arg: Option<String>,
    /// rounds (rdma_client makes one)
    #[arg(short = 'n', default_value_t = 1)]
    rounds: u64,
    /// require the reply `pong N` to `ping N` (rdma-pingpong-server's answer)
    #[arg(long = "expect-pong")]
    expect_pong: bool,
    /// accept any 16-byte reply, as rdma_client does (the default; kept for older
    /// command lines)
    #[arg(long = "any-reply", conflicts_with = "expect_pong")]
    any_reply: bool,
    /// print every reply
    #[arg(short = 'v')]
    verbose: bool,
    /// seconds any wait may take
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

impl Args {
    /// The server: `-s`, else the positional address, else rdma_client's default.
    fn server(&self) -> &str {
        self.server
            .as_deref()
            .or(self.ip.as_deref())
            .unwrap_or("127.0.0.1")
    }

    /// The port: `-p`, else the positional port, else rdma_client's default.
    fn port(&self) -> &str {
        self.port
            .as_deref()
            .or(self.port_arg.as_deref())
            .unwrap_or("7471")
    }
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
    let info = AddrInfo::new(Some(args.server()), args.port(), false)?;
    let config = EpConfig {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_inline_data: MSG as u32,
        sq_sig_all: true,
    };
    let mut ep = Endpoint::create(&info, &config)?;
    let mut recv = ep.reg_msgs(MSG)?;
    let mut send = ep.reg_msgs(MSG)?;
    let result = exchange(args, t, &mut ep, &mut recv, &mut send);
    // The endpoint, and its queue pair, go before the regions: after a round that
    // failed, a receive into `recv` is still posted.
    drop(ep);
    result
}

/// Connects and runs the rounds; `recv` and `send` outlive `ep`.
fn exchange(
    args: &Args,
    t: Duration,
    ep: &mut Endpoint,
    recv: &mut MemoryRegion,
    send: &mut MemoryRegion,
) -> Result<()> {
    // What a reply overwrites is marked first, so that a reply of zeros (C's
    // rdma_server sends its buffer as it was allocated) shows it arrived.
    recv.as_mut_slice()?.fill(b'#');
    // Raw on purpose: this port shows the rdma_verbs.h endpoint calls (the endpoint
    // owns its QP, so LeasedQp cannot). SAFETY: `recv` outlives `ep` (see `run`), so
    // the receive; it is read only after its completion.
    unsafe { ep.post_recv(1, recv, 0..MSG)? };
    ep.connect(&ConnParam::default(), t)?;
    for round in 0..args.rounds {
        if round > 0 {
            // The previous receive completed: nothing writes `recv` until the next.
            recv.as_mut_slice()?.fill(b'#');
            // Raw on purpose (rdma_post_recv, see above). SAFETY: as above; the previous
            // receive completed.
            unsafe { ep.post_recv(1, recv, 0..MSG)? };
        }
        let mut msg = [0u8; MSG];
        let ping = format!("ping {round}");
        msg[..ping.len().min(MSG - 1)].copy_from_slice(&ping.as_bytes()[..ping.len().min(MSG - 1)]);
        send.as_mut_slice()?.copy_from_slice(&msg);
        // Raw on purpose (rdma_post_send, see above). SAFETY: `send` is untouched until
        // the completion polled just below.
        unsafe { ep.post_send(2, send, 0..MSG, true)? };
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
        if args.expect_pong && reply != format!("pong {round}") {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("rdma-pingpong-client").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn rdma_clients_command_line() {
        let a = parse(&["-s", "198.18.0.1", "-p", "7000"]);
        assert_eq!((a.server(), a.port()), ("198.18.0.1", "7000"));
        assert_eq!(a.rounds, 1, "one exchange, as rdma_client");
        assert!(!a.expect_pong, "any reply, as rdma_client");
        let a = parse(&[]);
        assert_eq!((a.server(), a.port()), ("127.0.0.1", "7471"));
        let a = parse(&["-s", "10.0.0.1"]);
        assert_eq!(a.port(), "7471");
    }

    #[test]
    fn older_command_lines_still_work() {
        let a = parse(&["198.18.0.1", "7000", "-n", "300", "-v", "--expect-pong"]);
        assert_eq!(
            (a.server(), a.port(), a.rounds),
            ("198.18.0.1", "7000", 300)
        );
        assert!(a.expect_pong && a.verbose);
        let a = parse(&["198.18.0.1", "7000", "-n", "1", "--any-reply"]);
        assert!(!a.expect_pong);
        assert!(
            Args::try_parse_from(["x", "-s", "a", "b"]).is_err(),
            "two servers"
        );
        assert!(Args::try_parse_from(["x", "--any-reply", "--expect-pong"]).is_err());
    }
}

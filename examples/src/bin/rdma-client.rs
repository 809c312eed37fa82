//! `rdma-client read|write <addr> <port>`: the active side of the "RDMA read and write
//! with IB verbs" sample. Prints `address resolved.`, `route resolved.`, a
//! `send completed successfully.` per completed send, `received MSG_MR. reading
//! message from remote memory...` (or `writing ...`), `remote buffer: <the server's
//! text>` and `disconnected.`. Exits with status 1 and a message on any failure.

use examples::cm::rw::{self, Mode};
use examples::cm::{exit_with, socket_addr, Conn};
use rdma_safe::cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::Result;
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match (
        args.first().and_then(|m| Mode::parse(m)),
        args.get(1),
        args.get(2),
    ) {
        (Some(mode), Some(host), Some(port)) if args.len() == 3 => {
            port.parse::<u16>().ok().map(|p| (mode, host.clone(), p))
        }
        _ => None,
    };
    let Some((mode, host, port)) = parsed else {
        eprintln!("usage: rdma-client <read|write> <server-address> <server-port>");
        std::process::exit(1)
    };
    if let Err(e) = run(mode, &host, port) {
        exit_with("rdma-client", &e);
    }
}

fn run(mode: Mode, host: &str, port: u16) -> Result<()> {
    let dst = socket_addr(host, port)?;
    let events = EventChannel::new()?;
    let id = CmId::new(&events, PortSpace::Tcp)?;
    let timeout = Duration::from_millis(500);
    id.resolve_addr(None, dst, timeout)?;
    drop(events.expect(EventKind::AddrResolved, "rdma_resolve_addr", TIMEOUT)?);
    println!("address resolved.");
    let conn = Arc::new(Conn::new(id, events, 10)?);
    let text = format!(
        "message from active/client side with pid {}",
        std::process::id()
    );
    let (qp, regions) = rw::prepare(&conn, mode, &text)?;
    conn.id.resolve_route(timeout)?;
    drop(
        conn.events
            .expect(EventKind::RouteResolved, "rdma_resolve_route", TIMEOUT)?,
    );
    println!("route resolved.");
    conn.id.connect(&ConnParam {
        rnr_retry_count: 7,
        ..Default::default()
    })?;
    drop(conn.wait_established(TIMEOUT, "rdma_connect")?);
    let poller = rw::start(conn.clone(), qp, regions, mode, true, TIMEOUT)?;
    rw::finish(&conn, poller, "disconnected.", TIMEOUT)
}

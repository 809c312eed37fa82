//! `rdma-server read|write [port]`: the passive side of the "RDMA read and write with
//! IB verbs" sample. Prints `listening on port P.`, then for every client
//! `received connection request.`, the exchange (see `examples::cm::rw`) and
//! `peer disconnected.`; each connection runs on its own thread and channel. The
//! optional port (default: any free port) is an addition to the C program, and so
//! is the bound: at most 64 clients at once, and a request that cannot be served
//! (descriptors or threads run out) is refused alone, where C's server exits.

use examples::cm::rw::{self, Mode};
use examples::cm::workers::Workers;
use examples::cm::{exit_with, Conn};
use rdma_safe::cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::Result;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);
/// Clients served at once; more are refused (see `examples::cm::workers`).
const MAX_CLIENTS: usize = 64;

fn usage() -> ! {
    eprintln!("usage: rdma-server <read|write> [port]");
    std::process::exit(1)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first().and_then(|m| Mode::parse(m)) else {
        usage()
    };
    let port = match args.get(1).map(|p| p.parse::<u16>()) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(_)) => usage(),
    };
    if let Err(e) = serve(mode, port) {
        exit_with("rdma-server", &e);
    }
}

fn serve(mode: Mode, port: u16) -> Result<()> {
    let events = EventChannel::new()?;
    let listener = CmId::new(&events, PortSpace::Tcp)?;
    listener.bind_addr(SocketAddr::from(([0, 0, 0, 0], port)))?;
    listener.listen(10)?;
    let port = listener.local_addr().map_or(port, |a| a.port());
    println!("listening on port {port}.");
    let workers = Workers::new("rdma-server", MAX_CLIENTS);
    loop {
        let Some(req) = events.get_event(None)? else {
            continue;
        };
        if req.kind() != EventKind::ConnectRequest {
            continue;
        }
        println!("received connection request.");
        let id = req.id().clone();
        drop(req);
        workers.serve(id, move |id, own| {
            if let Err(e) = connection(id, own, mode) {
                eprintln!("rdma-server: {e}");
            }
        });
    }
}

fn connection(id: CmId, events: Arc<EventChannel>, mode: Mode) -> Result<()> {
    let conn = Arc::new(Conn::new(id, events, 10)?);
    let text = format!(
        "message from passive/server side with pid {}",
        std::process::id()
    );
    let (qp, regions) = rw::prepare(&conn, mode, &text)?;
    conn.id.accept(&ConnParam {
        rnr_retry_count: 7,
        ..Default::default()
    })?;
    drop(conn.wait_established(TIMEOUT, "rdma_accept")?);
    let poller = rw::start(conn.clone(), qp, regions, mode, false, TIMEOUT)?;
    rw::finish(&conn, poller, "peer disconnected.", TIMEOUT)
}

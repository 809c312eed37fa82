//! Device tests of the RDMA CM layer: connect/accept with private data both ways,
//! SENDs through the QPs the CM connected, reject with private data, a port nobody
//! listens on, an unreachable address, disconnect, migration to another channel,
//! event timeouts and drop orders.
//!
//! Run in the Soft-RoCE guest by `cargo xtask test`; they fail without a device.

use rdma_safe::cm::{self, CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::qp::{Init, Rts};
use rdma_safe::{
    Access, CompletionQueue, MemoryRegion, ProtectionDomain, QpConfig, QueuePair, RecvWr, SendWr,
    WorkCompletion,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const LEN: usize = 4096;

/// The address rxe sits on (RDMA_IP); fails the test when the guest did not set it.
fn ip() -> String {
    std::env::var("RDMA_IP").expect(
        "RDMA_IP is not set: run this device test with `cargo xtask test` (Soft-RoCE guest)",
    )
}

/// A port for this test: distinct per call and per process.
fn addr() -> SocketAddr {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 20000) as u16;
    let port = base + NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}:{port}", ip()).parse().unwrap()
}

struct Side {
    id: CmId,
    channel: Arc<EventChannel>,
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    mr: MemoryRegion,
}

impl Side {
    fn new(id: CmId, channel: Arc<EventChannel>) -> Side {
        let ctx = id.context().expect("id bound to a device");
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 16).unwrap();
        let mr = MemoryRegion::new(&pd, LEN, Access::LOCAL_WRITE).unwrap();
        Side {
            id,
            channel,
            pd,
            cq,
            mr,
        }
    }

    fn qp(&self) -> QueuePair<Init> {
        self.id
            .create_qp(&self.pd, &QpConfig::rc(&self.cq))
            .unwrap()
    }

    fn completion(&self) -> WorkCompletion {
        let deadline = Instant::now() + T;
        let mut wcs = [WorkCompletion::default(); 1];
        loop {
            if let Some(wc) = self.cq.poll(&mut wcs).unwrap().first() {
                return *wc;
            }
            assert!(Instant::now() < deadline, "no completion within {T:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn listen() -> (CmId, Arc<EventChannel>, SocketAddr) {
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let a = addr();
    id.bind_addr(a).unwrap();
    id.listen(4).unwrap();
    assert_eq!(id.local_addr(), Some(a));
    (id, channel, a)
}

fn resolved_client(to: SocketAddr) -> Side {
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve(None, to, Duration::from_secs(2)).unwrap();
    Side::new(id, channel)
}

/// Accepts the connection of `server`'s id with a queue pair of its own, then waits
/// until both sides saw `Established`; returns the server's queue pair.
fn accept_until_established(server: &Side, client: &Side) -> QueuePair<Init> {
    let qp = server.qp();
    server.id.accept(&ConnParam::default()).unwrap();
    // The active side's librdmacm sends the RTU while it handles its event, so the
    // passive side's `Established` comes only after the client fetched its own.
    client
        .channel
        .expect(EventKind::Established, "rdma_connect", T)
        .unwrap();
    server
        .channel
        .expect(EventKind::Established, "rdma_accept", T)
        .unwrap();
    qp
}

fn post_recv(side: &Side, qp: &QueuePair<Init>) {
    let mut sge = [side.mr.local(0..LEN).unwrap()];
    let mut wr = RecvWr::new(1, &mut sge);
    // SAFETY: the region lives in `side` until the completion is polled in the test.
    unsafe { qp.post_recv(&mut wr) }.unwrap();
}

fn send(side: &mut Side, qp: &QueuePair<Rts>, fill: u8) {
    side.mr.write_at(0, &vec![fill; side.mr.len()]).unwrap();
    let mut sge = [side.mr.local(0..LEN).unwrap()];
    let mut wr = SendWr::send(2, &mut sge).signaled();
    // SAFETY: the region is not touched until the completion is polled just below.
    unsafe { qp.post_send(&mut wr) }.unwrap();
    let wc = side.completion();
    wc.result().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn connect_accept_private_data_send_both_ways_disconnect() {
    let (listener, lchannel, a) = listen();
    let mut client = resolved_client(a);
    let cqp = client.qp();
    post_recv(&client, &cqp);
    client
        .id
        .connect(&ConnParam {
            private_data: b"hello from the client".to_vec(),
            ..Default::default()
        })
        .unwrap();

    let req = lchannel
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    assert!(req.private_data().starts_with(b"hello from the client"));
    assert_eq!(req.listener().unwrap().as_raw(), listener.as_raw());
    assert_eq!(req.conn_param().initiator_depth, 1);
    let mut server = Side::new(req.id().clone(), lchannel.clone());
    assert_eq!(server.id.peer_addr().unwrap().ip(), a.ip());
    drop(req); // acknowledged; the id lives on in `server`
    let sqp = server.qp();
    post_recv(&server, &sqp);
    server
        .id
        .accept(&ConnParam {
            private_data: b"welcome".to_vec(),
            ..Default::default()
        })
        .unwrap();

    let est = client
        .channel
        .expect(EventKind::Established, "rdma_connect", T)
        .unwrap();
    assert!(
        est.private_data().starts_with(b"welcome"),
        "{:?}",
        est.private_data()
    );
    drop(est);
    lchannel
        .expect(EventKind::Established, "rdma_accept", T)
        .unwrap();

    let cqp = cm::established(cqp).expect("client QP in RTS");
    let sqp = cm::established(sqp).expect("server QP in RTS");

    send(&mut client, &cqp, 0xc1);
    let wc = server.completion();
    wc.result().unwrap();
    assert_eq!(wc.byte_len() as usize, LEN);
    assert!(server.mr.to_vec().iter().all(|&b| b == 0xc1));

    send(&mut server, &sqp, 0x5e);
    let wc = client.completion();
    wc.result().unwrap();
    assert!(client.mr.to_vec().iter().all(|&b| b == 0x5e));

    client.id.disconnect().unwrap();
    let ev = lchannel
        .expect(EventKind::Disconnected, "rdma_disconnect", T)
        .unwrap();
    assert_eq!(ev.id().as_raw(), server.id.as_raw());
    // The IB CM answers the peer's DREQ when this side disconnects too; only then
    // does the client see its own `Disconnected` (else after the DREQ timeout).
    server.id.disconnect().unwrap();
    client
        .channel
        .expect(EventKind::Disconnected, "rdma_disconnect", T)
        .unwrap();
    // Drop in an awkward order: the id handles before their QPs and the event.
    drop(server.id);
    drop(client.id);
    drop(listener);
    drop(sqp);
    drop(ev);
    drop(cqp);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn reject_carries_private_data_and_a_clear_error() {
    let (_listener, lchannel, a) = listen();
    let client = resolved_client(a);
    let _qp = client.qp();
    client.id.connect(&ConnParam::default()).unwrap();
    let req = lchannel
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    req.id().reject(b"server busy").unwrap();
    drop(req);

    let ev = client
        .channel
        .get_event(Some(T))
        .unwrap()
        .expect("an event");
    assert_eq!(ev.kind(), EventKind::Rejected);
    assert_eq!(ev.status(), 28, "consumer reject");
    assert!(ev.private_data().starts_with(b"server busy"));
    let text = ev.to_error("rdma_connect").to_string();
    assert!(text.contains("rejected by the peer application"), "{text}");
    assert!(text.contains("private data"), "{text}");
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn nobody_listening_is_a_clear_error() {
    let client = resolved_client(addr());
    let _qp = client.qp();
    client.id.connect(&ConnParam::default()).unwrap();
    let started = Instant::now();
    let err = client
        .channel
        .expect(EventKind::Established, "rdma_connect", T)
        .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("rdma_connect failed"), "{text}");
    assert!(
        text.contains("nobody listens") || text.contains("did not answer"),
        "{text}"
    );
    assert!(started.elapsed() < T);
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn unreachable_address_fails_within_the_timeout() {
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let started = Instant::now();
    // TEST-NET-2: no interface of the guest routes there.
    let err = id
        .resolve(
            None,
            "198.51.100.7:7174".parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("rdma_resolve_addr failed"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(
        id.context().is_err(),
        "no device without a resolved address"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn migrate_to_another_channel_and_event_timeouts() {
    let (listener, lchannel, a) = listen();
    // Nothing pending: a short wait returns None on time.
    let started = Instant::now();
    assert!(lchannel
        .get_event(Some(Duration::from_millis(50)))
        .unwrap()
        .is_none());
    assert!(started.elapsed() < Duration::from_secs(2));

    let client = resolved_client(a);
    let cqp = client.qp();
    client.id.connect(&ConnParam::default()).unwrap();

    // The listener's fd becomes readable (what epoll/mio would see).
    use std::os::fd::AsRawFd;
    let ready = rdma_safe::poll_readable([lchannel.as_raw_fd()], Some(Duration::from_secs(10)));
    assert_eq!(ready.unwrap(), [true], "listener fd readable");

    let req = lchannel
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    let conn = req.id().clone();
    // Migration waits for unacknowledged events in C: here it refuses instead.
    // librdmacm counts a connect request against its listener, so the listener
    // may not move while the request is held; the new id may (nothing of its own
    // is unacknowledged).
    let own = EventChannel::new().unwrap();
    let err = listener.migrate(&own).unwrap_err().to_string();
    assert!(err.contains("drop the events"), "{err}");
    conn.migrate(&own).unwrap();
    drop(req);
    assert_eq!(conn.channel().unwrap().as_raw(), own.as_raw());

    let server = Side::new(conn, own.clone());
    let sqp = accept_until_established(&server, &client);
    let _sqp = cm::established(sqp).unwrap();
    let _cqp = cm::established(cqp).unwrap();
    // The listener's channel saw nothing of the migrated connection.
    assert!(lchannel
        .get_event(Some(Duration::from_millis(100)))
        .unwrap()
        .is_none());
    server.id.disconnect().unwrap();
    client
        .channel
        .expect(EventKind::Disconnected, "rdma_disconnect", T)
        .unwrap();
    client.id.disconnect().unwrap();
    own.expect(EventKind::Disconnected, "rdma_disconnect", T)
        .unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn qp_before_connect_is_init_and_not_rts() {
    let (_listener, _lchannel, a) = listen();
    let client = resolved_client(a);
    let qp = client.qp();
    assert_eq!(
        qp.query_state().unwrap(),
        rdma_safe::sys::ibv_qp_state::IBV_QPS_INIT
    );
    // Not connected: `established` refuses and hands the QP back.
    let back = cm::established(qp).unwrap_err();
    assert!(back.error.to_string().contains("not connected"));
    // A second QP on the same id is refused.
    assert!(client
        .id
        .create_qp(&client.pd, &QpConfig::rc(&client.cq))
        .is_err());
    drop(client.id);
    drop(back.qp); // the QP outlived its id handle: destroyed first, then the id
}

/// Threads share ids (`CmId` is `Send` and `Sync`): one reads an id's addresses
/// while another resolves it, and a queue pair drops on one thread while another
/// disconnects its id. librdmacm writes those fields and uses `id->qp` with no
/// lock of its own; the id's calls and its channel's event processing exclude
/// each other, so a reader sees the address before or after the resolution,
/// never half of it, and nothing uses a destroyed queue pair. A race is rarely
/// caught in the act (a torn address, a crash); what this test surely catches is
/// a deadlock of the locks with the event processing, the resolution and the
/// connection.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn ids_shared_between_threads_see_whole_fields_and_live_queue_pairs() {
    let (_listener, lchannel, a) = listen();
    for round in 0..10 {
        let channel = EventChannel::new().unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let reader = {
            let id = id.clone();
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let peer = id.peer_addr();
                    assert!(peer.is_none() || peer == Some(a), "torn: {peer:?}");
                    let _ = (id.local_addr(), id.port_num(), id.context().is_ok());
                }
            })
        };
        id.resolve(None, a, Duration::from_secs(2)).unwrap();
        reader.join().expect("the reader saw whole addresses");
        assert_eq!(id.peer_addr(), Some(a), "round {round}");

        let client = Side::new(id, channel);
        let cqp = client.qp();
        client.id.connect(&ConnParam::default()).unwrap();
        let req = lchannel
            .expect(EventKind::ConnectRequest, "rdma_listen", T)
            .unwrap();
        let server = Side::new(req.id().clone(), lchannel.clone());
        drop(req);
        let sqp = accept_until_established(&server, &client);
        // The client's queue pair goes on another thread while its id disconnects.
        let dropper = std::thread::spawn(move || drop(cqp));
        client.id.disconnect().unwrap();
        dropper.join().unwrap();
        lchannel
            .expect(EventKind::Disconnected, "rdma_disconnect", T)
            .unwrap();
        server.id.disconnect().unwrap();
        client
            .channel
            .expect(EventKind::Disconnected, "rdma_disconnect", T)
            .unwrap();
        drop(sqp);
    }
}

/// The error of a connect or accept refused for want of a device.
fn refused_for_no_device(verb: &str, result: rdma_safe::Result<()>) {
    let err = result.expect_err("an id without a device must be refused");
    let text = err.to_string();
    assert!(
        text.contains(verb) && text.contains("no device yet"),
        "{verb}: {text}"
    );
}

/// librdmacm's connect and accept read the id's device with no check, so an id
/// that has none (fresh, resolving, a wildcard listener, a passive wildcard
/// endpoint) used to crash the process in C. Each is refused with a named cause,
/// and the same client id connects once its address and route are resolved.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn connect_or_accept_on_an_id_without_a_device_is_refused() {
    let channel = EventChannel::new().unwrap();
    let fresh = CmId::new(&channel, PortSpace::Tcp).unwrap();
    refused_for_no_device("rdma_connect", fresh.connect(&ConnParam::default()));
    refused_for_no_device("rdma_accept", fresh.accept(&ConnParam::default()));

    // A wildcard listener has no device: accepting on it (not on a request's id).
    let wild = CmId::new(&channel, PortSpace::Tcp).unwrap();
    wild.bind_addr(format!("0.0.0.0:{}", addr().port()).parse().unwrap())
        .unwrap();
    wild.listen(4).unwrap();
    refused_for_no_device("rdma_accept", wild.accept(&ConnParam::default()));

    // Resolving, its event not yet taken: still no device.
    let (listener, listen_channel, to) = listen();
    fresh
        .resolve_addr(None, to, Duration::from_secs(2))
        .unwrap();
    refused_for_no_device("rdma_connect", fresh.connect(&ConnParam::default()));
    channel
        .expect(EventKind::AddrResolved, "rdma_resolve_addr", T)
        .unwrap();
    fresh.resolve_route(Duration::from_secs(2)).unwrap();
    channel
        .expect(EventKind::RouteResolved, "rdma_resolve_route", T)
        .unwrap();
    let client = Side::new(fresh, channel);
    let _client_qp = client.qp();
    client.id.connect(&ConnParam::default()).unwrap();
    let req = listen_channel
        .expect(EventKind::ConnectRequest, "rdma_listen", T)
        .unwrap();
    // The listener itself still has no request to accept; the request's id does.
    assert_eq!(req.listener().unwrap().as_raw(), listener.as_raw());
    let server = Side::new(req.id().clone(), listen_channel.clone());
    drop(req);
    let _server_qp = accept_until_established(&server, &client);

    // A passive endpoint on every address: its accept is refused the same way.
    let info = cm::ep::AddrInfo::new(None, &addr().port().to_string(), true).unwrap();
    let mut ep = cm::ep::Endpoint::create(&info, &cm::ep::EpConfig::default()).unwrap();
    refused_for_no_device(
        "rdma_accept",
        ep.accept(&ConnParam::default(), Duration::from_secs(1)),
    );
}

/// An `Endpoint` post of an empty range is refused before it reaches the device:
/// a zero length in a scatter/gather entry means 2 GiB to some devices (mlx4's
/// receives), which would let the device write past the range the caller lent.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn an_endpoint_post_of_an_empty_range_is_refused() {
    let a = addr();
    let info = cm::ep::AddrInfo::new(Some(&ip()), &a.port().to_string(), false).unwrap();
    let ep = cm::ep::Endpoint::create(&info, &cm::ep::EpConfig::default()).unwrap();
    let mr = ep.reg_msgs(16).unwrap();
    // SAFETY: refused before anything is posted; the endpoint goes before `mr`.
    let err = unsafe { ep.post_recv(1, &mr, 4..4) }.unwrap_err();
    assert!(
        matches!(err, rdma_safe::Error::InvalidArgument(_)) && err.to_string().contains("is empty"),
        "{err}"
    );
    // One byte is a receive like any other.
    // SAFETY: `mr` outlives the endpoint, dropped first below.
    unsafe { ep.post_recv(2, &mr, 4..5) }.unwrap();
    drop(ep);
    drop(mr);
}

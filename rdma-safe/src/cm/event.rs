//! CM events, typed, acknowledged exactly once when dropped.

use super::id::CmId;
use crate::error::Error;
use rdma_verbs_sys as sys;
use std::ffi::CStr;
use std::ptr::NonNull;

/// What an event reports (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `rdma_resolve_addr` finished: the id is bound to a local device.
    AddrResolved,
    /// `rdma_resolve_addr` failed (status: a negative errno).
    AddrError,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// `rdma_resolve_route` failed.
    RouteError,
    /// A peer asks to connect; the event carries a new id for the connection.
    ConnectRequest,
    /// Reply to a connect on an id without a QP (the application establishes).
    ConnectResponse,
    /// The connection could not be set up.
    ConnectError,
    /// The peer could not be reached.
    Unreachable,
    /// The peer (or its CM, when nobody listens) refused the connection; the status
    /// is the transport's reject reason.
    Rejected,
    /// The connection is up: the QP is ready to send.
    Established,
    /// The peer disconnected, or the connection broke.
    Disconnected,
    /// The device of the id went away: destroy everything on it.
    DeviceRemoval,
    /// A multicast join finished.
    MulticastJoin,
    /// A multicast join failed.
    MulticastError,
    /// The local address changed (e.g. a bonding failover).
    AddrChange,
    /// The QP of a closed connection may be reused.
    TimewaitExit,
    /// A value this crate does not know (a newer librdmacm or kernel), with its number.
    Other(u32),
}

impl EventKind {
    /// The kind of a raw event type; a value these headers do not list (a newer
    /// librdmacm or kernel) is [`EventKind::Other`] with its number.
    pub fn from_raw(raw: sys::rdma_cm_event_type) -> Self {
        use sys::rdma_cm_event_type as T;
        match raw {
            T::RDMA_CM_EVENT_ADDR_RESOLVED => EventKind::AddrResolved,
            T::RDMA_CM_EVENT_ADDR_ERROR => EventKind::AddrError,
            T::RDMA_CM_EVENT_ROUTE_RESOLVED => EventKind::RouteResolved,
            T::RDMA_CM_EVENT_ROUTE_ERROR => EventKind::RouteError,
            T::RDMA_CM_EVENT_CONNECT_REQUEST => EventKind::ConnectRequest,
            T::RDMA_CM_EVENT_CONNECT_RESPONSE => EventKind::ConnectResponse,
            T::RDMA_CM_EVENT_CONNECT_ERROR => EventKind::ConnectError,
            T::RDMA_CM_EVENT_UNREACHABLE => EventKind::Unreachable,
            T::RDMA_CM_EVENT_REJECTED => EventKind::Rejected,
            T::RDMA_CM_EVENT_ESTABLISHED => EventKind::Established,
            T::RDMA_CM_EVENT_DISCONNECTED => EventKind::Disconnected,
            T::RDMA_CM_EVENT_DEVICE_REMOVAL => EventKind::DeviceRemoval,
            T::RDMA_CM_EVENT_MULTICAST_JOIN => EventKind::MulticastJoin,
            T::RDMA_CM_EVENT_MULTICAST_ERROR => EventKind::MulticastError,
            T::RDMA_CM_EVENT_ADDR_CHANGE => EventKind::AddrChange,
            T::RDMA_CM_EVENT_TIMEWAIT_EXIT => EventKind::TimewaitExit,
            other => EventKind::Other(other.0),
        }
    }
}

/// `rdma_event_str` of `event`, followed by the number when the headers do not list it
/// (librdmacm then says only `UNKNOWN EVENT`).
pub(crate) fn event_name(event: sys::rdma_cm_event_type) -> String {
    // SAFETY: returns a static NUL-terminated string for any value.
    let text = unsafe { CStr::from_ptr(sys::rdma_event_str(event)) }.to_string_lossy();
    match event.name() {
        Some(_) => text.into_owned(),
        None => format!("{text} (event type {})", event.0),
    }
}

/// The IB CM reject reason of a `Rejected` event: a few well-known values named.
pub fn reject_reason_text(reason: i32) -> &'static str {
    match reason {
        1 => "no QP available at the peer",
        2 => "no EEC available at the peer",
        3 => "no resources at the peer",
        4 => "the peer timed out",
        5 => "unsupported request",
        6 => "invalid communication id",
        7 => "invalid communication instance",
        8 => "nobody listens on that port (invalid service id)",
        9 => "invalid transport type",
        10 => "stale connection",
        22 => "invalid QP type",
        28 => "rejected by the peer application",
        _ => "see the IB CM reject reasons",
    }
}

/// One event from an [`super::EventChannel`]. Dropping it acknowledges it
/// (`rdma_ack_cm_event`), exactly once; until then its id cannot be destroyed (the
/// event holds it), which is what `rdma_destroy_id` requires.
pub struct CmEvent {
    raw: NonNull<sys::rdma_cm_event>,
    kind: EventKind,
    id: CmId,
    listener: Option<CmId>,
}

// SAFETY: the event is plain data owned by this value until acknowledged; librdmacm
// allows acknowledging from any thread.
unsafe impl Send for CmEvent {}
// SAFETY: only read through `&self`.
unsafe impl Sync for CmEvent {}

impl CmEvent {
    /// # Safety
    /// `raw` is an unacknowledged event whose id is `id` (and listener `listener`).
    pub(crate) unsafe fn new(
        raw: NonNull<sys::rdma_cm_event>,
        kind: EventKind,
        id: CmId,
        listener: Option<CmId>,
    ) -> Self {
        listener.as_ref().unwrap_or(&id).inner().event_taken();
        CmEvent {
            raw,
            kind,
            id,
            listener,
        }
    }

    /// The id librdmacm counts this event against (the one `rdma_migrate_id` and
    /// `rdma_destroy_id` wait on): a connect request's listener, else the event's id.
    fn counted(&self) -> &CmId {
        self.listener.as_ref().unwrap_or(&self.id)
    }

    fn raw(&self) -> &sys::rdma_cm_event {
        // SAFETY: valid until acknowledged in drop.
        unsafe { self.raw.as_ref() }
    }

    /// What happened.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The event's status: 0, a negative errno (address/route/connect errors), or the
    /// reject reason of a `Rejected` event.
    pub fn status(&self) -> i32 {
        self.raw().status
    }

    /// The id the event is about; for a `ConnectRequest`, the new id of the incoming
    /// connection (accept or reject it; dropping every handle destroys it).
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The listening id a `ConnectRequest` arrived on.
    pub fn listener(&self) -> Option<&CmId> {
        self.listener.as_ref()
    }

    /// The private data the peer sent with a connect request, accept or reject
    /// (connected port spaces; empty for other events). The transport may pad it
    /// (IB CM: to 56 bytes in requests, 196 in replies, 148 in rejects).
    pub fn private_data(&self) -> &[u8] {
        let raw = self.raw();
        let with_data = matches!(
            self.kind,
            EventKind::ConnectRequest
                | EventKind::ConnectResponse
                | EventKind::Established
                | EventKind::Rejected
        );
        if !with_data {
            return &[];
        }
        // SAFETY: on these events of connected port spaces the union holds `conn`.
        let conn = unsafe { raw.param.conn };
        if conn.private_data.is_null() || conn.private_data_len == 0 {
            return &[];
        }
        // SAFETY: librdmacm keeps the private data until the event is acknowledged,
        // which happens only when `self` drops.
        unsafe {
            std::slice::from_raw_parts(
                conn.private_data.cast::<u8>(),
                conn.private_data_len as usize,
            )
        }
    }

    /// The connection parameters of a `ConnectRequest` or `Established` event
    /// (responder resources, initiator depth, retry counts, peer QP number).
    pub fn conn_param(&self) -> sys::rdma_conn_param {
        // SAFETY: `conn` is plain data; for other events its values are meaningless
        // but still initialised bytes.
        unsafe { self.raw().param.conn }
    }

    /// librdmacm's name for the event (`rdma_event_str`), e.g. `RDMA_CM_EVENT_ESTABLISHED`;
    /// with the number for a type these headers do not list.
    pub fn name(&self) -> String {
        event_name(self.raw().event)
    }

    /// This unexpected event as an error of `verb`, with the cause spelled out.
    pub fn to_error(&self, verb: &'static str) -> Error {
        let status = self.status();
        let errno = if status < 0 { -status } else { libc::EIO };
        match self.kind {
            EventKind::Rejected => Error::verb(verb, libc::ECONNREFUSED).with_hint(format!(
                "connection rejected: {} (reason {status}){}",
                reject_reason_text(status),
                if self.private_data().iter().any(|&b| b != 0) {
                    " with private data from the peer"
                } else {
                    ""
                }
            )),
            EventKind::AddrError => Error::verb(verb, errno).with_hint(
                "address resolution failed: no RDMA device has a route to that address \
                 (is it on an interface with an RDMA device, e.g. rxe on dummy0?)",
            ),
            EventKind::RouteError => Error::verb(verb, errno)
                .with_hint("route resolution failed: the peer is not reachable over RDMA"),
            EventKind::Unreachable | EventKind::ConnectError => Error::verb(
                verb,
                if status < 0 {
                    errno
                } else {
                    libc::EHOSTUNREACH
                },
            )
            .with_hint(format!(
                "{}: the peer did not answer the connect",
                self.name()
            )),
            EventKind::Disconnected => {
                Error::verb(verb, libc::ECONNRESET).with_hint("the peer disconnected")
            }
            EventKind::DeviceRemoval => {
                Error::verb(verb, libc::ENODEV).with_hint("the RDMA device was removed")
            }
            _ => Error::verb(verb, errno).with_hint(format!(
                "unexpected CM event {} (status {status})",
                self.name()
            )),
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: fetched by `rdma_get_cm_event`, acknowledged only here. The ids
        // (fields) are dropped after this, so no `rdma_destroy_id` waits for us.
        unsafe { sys::rdma_ack_cm_event(self.raw.as_ptr()) };
        self.counted().inner().event_acked();
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_cm_event_type_is_other_with_its_number() {
        // An event as a librdmacm newer than these headers could fill it.
        let raw = sys::rdma_cm_event {
            // What C may write there: a number no enum of these headers lists.
            event: sys::rdma_cm_event_type(0x7777),
            ..Default::default()
        };
        assert_eq!(EventKind::from_raw(raw.event), EventKind::Other(0x7777));
        let name = event_name(raw.event);
        assert!(name.contains("30583"), "{name}");
    }

    #[test]
    fn listed_cm_event_types_keep_their_kind_and_name() {
        let raw = sys::rdma_cm_event {
            event: sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            ..Default::default()
        };
        assert_eq!(EventKind::from_raw(raw.event), EventKind::Established);
        assert_eq!(event_name(raw.event), "RDMA_CM_EVENT_ESTABLISHED");
    }
}

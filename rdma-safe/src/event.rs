//! Asynchronous events of a device (`ibv_get_async_event`): a QP that went to the
//! error state, a port that went down, a CQ overrun, ...

use crate::channel::{set_nonblocking, wait_readable, Deadline};
use crate::context::Context;
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::time::Duration;

/// What an asynchronous event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventElement {
    /// A queue pair, by number.
    Qp(u32),
    /// A completion queue (its raw address, to compare with `as_raw`).
    Cq(usize),
    /// A shared receive queue (its raw address).
    Srq(usize),
    /// A port, by number.
    Port(u8),
    /// The device itself.
    Device,
}

/// One asynchronous event, already acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event type: any number the device reports; one these headers do not list
    /// (a newer kernel or driver) shows as `ibv_event_type(<number>)`.
    pub kind: sys::ibv_event_type,
    /// What it concerns.
    pub element: EventElement,
    /// `ibv_event_type_str` of the type, with the number for an unlisted one.
    pub text: String,
}

impl Context {
    /// The descriptor that becomes readable when an asynchronous event is pending.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open.
        unsafe { (*self.as_raw()).async_fd }
    }

    /// Waits up to `timeout` (forever if `None`) for the next asynchronous event and
    /// acknowledges it. `Ok(None)` when the time passed without one.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        set_nonblocking(self.async_fd())?;
        let mut deadline = Deadline::after(timeout);
        loop {
            if !wait_readable(self.async_fd(), &mut deadline)? {
                return Ok(None);
            }
            let mut ev = sys::ibv_async_event::default();
            // SAFETY: the context is open; `ev` is a valid out-pointer.
            if unsafe { sys::ibv_get_async_event(self.as_raw(), &mut ev) } != 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                    continue;
                }
                return Err(Error::last("ibv_get_async_event"));
            }
            let event = describe(&ev);
            // SAFETY: `ev` came from ibv_get_async_event and is acknowledged once,
            // after everything needed was copied out of it.
            unsafe { sys::ibv_ack_async_event(&mut ev) };
            return Ok(Some(event));
        }
    }
}

fn describe(ev: &sys::ibv_async_event) -> AsyncEvent {
    use sys::ibv_event_type as E;
    let kind = ev.event_type;
    // SAFETY: the union member matching the event type is the valid one, and the
    // object it points to lives until the event is acknowledged.
    let element = unsafe {
        match kind {
            E::IBV_EVENT_QP_FATAL
            | E::IBV_EVENT_QP_REQ_ERR
            | E::IBV_EVENT_QP_ACCESS_ERR
            | E::IBV_EVENT_COMM_EST
            | E::IBV_EVENT_SQ_DRAINED
            | E::IBV_EVENT_PATH_MIG
            | E::IBV_EVENT_PATH_MIG_ERR
            | E::IBV_EVENT_QP_LAST_WQE_REACHED => EventElement::Qp((*ev.element.qp).qp_num),
            E::IBV_EVENT_CQ_ERR => EventElement::Cq(ev.element.cq as usize),
            E::IBV_EVENT_SRQ_ERR | E::IBV_EVENT_SRQ_LIMIT_REACHED => {
                EventElement::Srq(ev.element.srq as usize)
            }
            E::IBV_EVENT_PORT_ACTIVE
            | E::IBV_EVENT_PORT_ERR
            | E::IBV_EVENT_LID_CHANGE
            | E::IBV_EVENT_PKEY_CHANGE
            | E::IBV_EVENT_SM_CHANGE
            | E::IBV_EVENT_CLIENT_REREGISTER
            | E::IBV_EVENT_GID_CHANGE => EventElement::Port(ev.element.port_num as u8),
            _ => EventElement::Device,
        }
    };
    // SAFETY: ibv_event_type_str returns a static string for any value.
    let text = unsafe { CStr::from_ptr(sys::ibv_event_type_str(kind)) }.to_string_lossy();
    // libibverbs says only "unknown" for a type it does not list: add the number.
    let text = match kind.name() {
        Some(_) => text.into_owned(),
        None => format!("{text} (event type {})", kind.0),
    };
    AsyncEvent {
        kind,
        element,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_async_event_type_is_reported_with_its_number() {
        // An event type newer than these headers, as ibv_get_async_event would fill it.
        let mut ev = sys::ibv_async_event {
            // What C may write there: a number no enum of these headers lists.
            event_type: sys::ibv_event_type(0x7777),
            ..Default::default()
        };
        // A non-null element that must not be read for an unknown type.
        ev.element.qp = std::ptr::NonNull::dangling().as_ptr();
        let event = describe(&ev);
        assert_eq!(event.kind.0, 0x7777);
        assert_eq!(event.kind.name(), None);
        assert_eq!(event.element, EventElement::Device);
        assert!(event.text.contains("30583"), "{}", event.text);
        assert!(format!("{event:?}").contains("ibv_event_type(30583)"));
    }

    #[test]
    fn listed_async_event_keeps_its_name_and_element() {
        let mut ev = sys::ibv_async_event {
            event_type: sys::ibv_event_type::IBV_EVENT_PORT_ERR,
            ..Default::default()
        };
        ev.element.port_num = 1;
        let event = describe(&ev);
        assert_eq!(event.element, EventElement::Port(1));
        assert_eq!(event.text, "port error");
        assert_eq!(format!("{:?}", event.kind), "IBV_EVENT_PORT_ERR");
    }
}

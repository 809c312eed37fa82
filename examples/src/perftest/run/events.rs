//! perftest's `-e`: the data paths sleep on a completion channel instead of
//! spinning. One channel serves both queues; a wait reads one event and re-arms
//! the queue it was for (`ctx_notify_events`), and the data path then polls.
//! Every queue is armed before its first poll, and each wait re-arms before the
//! poll that follows it, so no completion can arrive unannounced.

use super::{AnyResult, STALL};
use rdma_safe::{CompletionChannel, CompletionQueue};
use std::sync::Arc;

/// The channel and the queues whose events it carries.
pub(super) struct Events {
    channel: Arc<CompletionChannel>,
    cqs: [Arc<CompletionQueue>; 2],
}

impl Events {
    /// Events of `send_cq` and `recv_cq`, both created on `channel`.
    pub(super) fn new(
        channel: Arc<CompletionChannel>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
    ) -> Events {
        Events {
            channel,
            cqs: [send_cq.clone(), recv_cq.clone()],
        }
    }

    /// Arms the queues a test waits on before its run: the send queue, and for
    /// SEND the receive queue too (as perftest arms them).
    pub(super) fn arm(&self, both: bool) -> AnyResult<()> {
        let n = if both { 2 } else { 1 };
        for cq in &self.cqs[..n] {
            cq.req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
        }
        Ok(())
    }

    /// Sleeps until a completion event arrives, then re-arms its queue; fails
    /// after `STALL` without one.
    pub(super) fn wait(&self, what: &str) -> AnyResult<()> {
        let Some(raw) = self.channel.get_event(Some(STALL))? else {
            return Err(format!("no {what} completion event for {} s", STALL.as_secs()).into());
        };
        for cq in self.cqs.iter().filter(|cq| cq.as_raw() == raw) {
            cq.req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
        }
        Ok(())
    }
}

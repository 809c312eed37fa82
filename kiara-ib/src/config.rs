//! The transport's configuration.

use std::net::SocketAddr;
use std::time::Duration;

/// Everything that can be tuned. `Config::default()` suits most uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where `bind` listens (its argument overrides this).
    pub listen: SocketAddr,
    /// RDMA device name (`None`: the first device). The library never reads the
    /// environment; a program may fill this from `RDMA_DEVICE` with
    /// `rdma_safe::Selection::from_env`.
    pub device: Option<String>,
    /// Port of the device.
    pub port: u8,
    /// GID index (`None`: the first RoCE v2 IPv4 GID on Ethernet, else 0; a program
    /// may fill it from `RDMA_GID_INDEX`, as for `device`).
    pub gid_index: Option<u32>,
    /// Receive slots posted per session: the peer's send credits.
    pub credits: u32,
    /// Control messages that may be in flight per session.
    pub send_slots: u32,
    /// Largest message accepted and sent.
    pub max_message: u64,
    /// Messages up to this size travel inside the SEND (eager); larger ones are read.
    pub eager_threshold: u32,
    /// Largest single RDMA READ; larger messages are read in several.
    pub read_chunk: u32,
    /// Bytes of registered buffers kept for reuse, all size classes together (the
    /// registration cache; at most 256 buffers a class). Messages larger than it
    /// register their buffer each time.
    pub pool_keep_bytes: usize,
    /// Bootstrap (TCP connect and hello) and drain timeout; also how long, after
    /// the handshake, an accepted client has to greet over RDMA and a connecting
    /// one waits for its greeting to be acknowledged (`CloseReason::Silent`), so a
    /// `connect` to a server that does not answer takes up to about three times it.
    /// At most [`MAX_DURATION`] (a day).
    pub timeout: Duration,
    /// Our messages queued or in flight per session, at most: `send` waits for room
    /// (or fails with `Error::Full` when it may not wait).
    pub max_outstanding: u32,
    /// Bytes of our read messages (larger than `eager_threshold`) queued or in flight
    /// per session, at most (one message larger than this may go alone).
    pub max_outstanding_bytes: u64,
    /// The same bytes of all the transport's sessions together, at most: `send`
    /// waits for room (or fails with `Error::Full`) beyond, whichever session it is
    /// on. So peers that stop returning credits (say, by never taking what they
    /// were sent) make the transport hold about this much for them, however many
    /// sessions they open. One message larger than this may go alone: it waits
    /// until nothing else is charged, which other sessions' steady sends can put
    /// off.
    pub max_outstanding_bytes_total: u64,
    /// Bytes of the peer's read messages this side holds per session (being read, or
    /// delivered and not yet taken by the application), at most: a message beyond is
    /// refused (the sender's `send` fails with `Error::Refused(2)`), nothing more is
    /// pinned.
    pub max_receiving_bytes: u64,
    /// The same bytes of all the transport's sessions together, at most: a message
    /// beyond is refused the same way, whichever session it arrives on. So however
    /// many sessions peers open, the transport pins about this much for their
    /// messages (each message counts as its buffer: its length rounded up to a
    /// power of two, at least 4 KiB). Half of it is kept as a floor for each
    /// session (that half split over `max_sessions`): sessions whose peers hold
    /// the other half cannot keep another session from its floor. A session's floor
    /// first holds what its eager messages may pin (`credits` pool buffers of the
    /// eager size, for the messages it holds: delivered and not yet taken, or behind
    /// a read message), so the peers' messages of both kinds pin at most this much.
    /// `max_message` must fit what one session may hold, and the eager messages
    /// their floor (`validate` says so otherwise).
    pub max_receiving_bytes_total: u64,
    /// How long a peer may take to acknowledge a read message: a peer that keeps a
    /// message (and the window onto it) longer is disconnected. Also how long one of
    /// the peer's read messages may take to be read, from the first sweep after its
    /// descriptor arrived (READs queued behind earlier ones included): a peer that
    /// stops answering them (while its host keeps the connection up) is
    /// disconnected too, and what its message held goes back to the budgets. And
    /// how long each control message of ours may take to complete: a peer that
    /// grants credits and posts no receives for them (the device retries such a
    /// SEND for ever) is disconnected (`CloseReason::SendTimeout`).
    /// At most [`MAX_DURATION`] (a day).
    pub ack_timeout: Duration,
    /// How long a thread waiting in `recv` or `SendHandle::wait` polls the completion
    /// queue itself before sleeping (lower latency, at the price of a busy core), and
    /// how long an idle callback runner (with a callback registered) polls every
    /// session's queue between messages; at most one runner fewer than the cores
    /// spins at once per transport. A session whose waits (either kind) take longer
    /// than a quarter of this on average polls only a sixteenth of it: a core spinning
    /// through long waits takes time from the work it waits for. Raise it where a
    /// round trip takes a quarter of it or more (a slow or emulated link): over
    /// a wire with 1 ms round trips, 20 ms halved KIARA's round trip against the
    /// default (docs/performance.md). The same holds for one bulk stream whose
    /// messages take a quarter of it or more: its sender sleeps between the
    /// acknowledgements and is woken through the poller; in the emulated guest,
    /// 64 KiB one way ran 9-13% faster at 50 ms on both sides. Keep it low where
    /// several threads stream per core: four such clients on two cores moved a
    /// third less at 50 ms. Zero: never poll, always sleep.
    /// At most [`MAX_DURATION`] (a day).
    pub busy_poll: Duration,
    /// Live sessions of the transport (accepted and connected), at most: `bind`
    /// refuses a client beyond (it closes the connection at once and logs
    /// "refused: max_sessions (N) reached"), `connect` fails with `Error::Usage`.
    /// Handshakes in progress count as sessions, so the cap is never exceeded.
    pub max_sessions: usize,
    /// Handshakes `bind` runs at once, at most (each on its own thread, holding a
    /// socket and, once the client's hello is in, a queue pair and its buffers): a
    /// client beyond is refused at once (the connection is closed and "refused: N
    /// handshakes in progress" logged), except that it takes the place of the
    /// oldest connection that has sent no hello within a quarter of `timeout`,
    /// which is closed (unless as many handshakes given up this way are still
    /// ending; `max_sessions` may leave fewer places). A handshake lasts until the
    /// client is ready or `timeout`
    /// passes, so this bounds the threads and pinned memory clients that never
    /// finish can hold.
    pub max_handshakes: usize,
    /// Lines logged a second, at most, of each kind: connections `bind` refuses or
    /// whose handshake fails, and lines about sessions (closes, callbacks that
    /// panicked); one line each, with the reason. Beyond, within the same second,
    /// they are only counted, and one line then says how many were not logged ("N
    /// more connections refused within a second", "N more lines about sessions
    /// ..."). So a flood of connections is not a flood of lines for the logger
    /// (`Transport::with_logger`). Zero: every line.
    pub log_lines_per_second: u32,
    /// Sessions and handshakes `bind` holds at once for clients of one IP address,
    /// at most: a client beyond is refused at once (the connection is closed and
    /// "refused: N sessions and handshakes from ADDRESS" logged), so that one host
    /// cannot take every place of `max_sessions` and `max_handshakes` (set it
    /// below both; sessions this transport connected to that address count too).
    /// Addresses are compared whole, IPv4-mapped IPv6 ones as IPv4, so an IPv6
    /// host with a prefix of its own can use many. Zero (the default): no cap,
    /// since clients behind one NAT share an address.
    pub max_sessions_per_address: usize,
    /// How long a peer's host may stay silent (crashed, powered off, cut off)
    /// before its sessions close with `CloseReason::PeerGone`: the session's
    /// bootstrap TCP connection carries keepalive probes timed from it. RC alone
    /// never finds such a host (rxe retransmits for ever at retry count 7, and an
    /// idle session has nothing to retransmit). A peer whose process ends is
    /// noticed at once whatever this says. Zero: no probes.
    /// At most [`MAX_DURATION`] (a day).
    pub peer_timeout: Duration,
    /// Post a message's window bind only once every earlier request on the
    /// session's send queue has completed (what is posted after it waits behind
    /// it). `None`: on for Soft-RoCE, off otherwise. Soft-RoCE executes a bind a
    /// second time when it retransmits a request posted before it, which fails the
    /// queue pair on any wire that loses a packet (`sq_gate.rs` tells the story);
    /// the wait costs about one round trip per read message while sends are in
    /// flight.
    pub serialize_binds: Option<bool>,
    /// Acknowledge a peer's read message with a SEND_WITH_INV of its key, which
    /// takes the peer's window back in its own responder (remote invalidation, as
    /// NFS over RDMA does) and saves the peer a LOCAL_INV. `None`: off for
    /// Soft-RoCE, on otherwise. Off, the acknowledgement is a plain SEND and the
    /// peer invalidates the window itself. On Soft-RoCE (Linux 6.1) it made
    /// 64 KiB one-way streams about 7% slower, with retransmissions the plain
    /// SEND does not cause (docs/performance-history.md). Whichever is chosen, this side
    /// accepts both kinds of acknowledgement from its peers.
    pub invalidating_acks: Option<bool>,
    /// Confirm, after each RDMA READ of a peer's message completes, that the
    /// session's queue pair is still alive (one `ibv_query_qp`) before the READ
    /// counts; a dead one closes the session and the message is never delivered.
    /// `None`: on for Soft-RoCE, off otherwise. Soft-RoCE (Linux 6.1) can report a
    /// READ that a retransmission interrupted as successful, with part of its bytes
    /// never written, and then fail the queue pair (the kernel warns in
    /// `rxe_completer`; docs/faults.md): without the check the half-read message
    /// would reach the application. The check runs right after the completion, so
    /// a kernel that had not yet failed the queue pair then would slip through.
    pub confirm_reads: Option<bool>,
    /// The queue pairs' local ACK timeout, as verbs code it: a request unanswered
    /// for 4.096 µs x 2^`rc_timeout` is retransmitted (1 to 31; 14, about 67 ms,
    /// as perftest). Verbs read 0 as "never": one lost packet would stall the
    /// session, so it is refused.
    pub rc_timeout: u8,
    /// Retransmissions of an unanswered request before it fails with
    /// `IBV_WC_RETRY_EXC_ERR` and the session closes (0 to 7; 7, as perftest).
    pub rc_retries: u8,
    /// Receive slots of one shared receive queue that every session `bind` accepts
    /// receives its control messages into; 0 (the default): each session posts
    /// `credits` slots of its own. With many sessions this saves most of their
    /// pinned receive memory: peers keep their `credits`, but the slots behind them
    /// are shared, and when more messages arrive at once than the queue holds the
    /// device makes the senders retry (RNR), which costs time, not messages. A slot
    /// is one byte shorter than the port's MTU if `slot_size` is longer, and the
    /// eager threshold such sessions announce shrinks to match (larger messages go
    /// by RDMA READ); a client whose MTU is below the server's is refused. Sessions
    /// `connect` opens always have their own slots. On Soft-RoCE (Linux 6.1) a
    /// client that lies about its MTU can make a slot go missing each time it
    /// connects, so give a shared queue to trusted clients there. The receives
    /// complete on one completion queue of this many entries (plus a few) that the
    /// sessions share, routed to each by its queue pair: a peer that ignores its
    /// credits can take every slot before it is cut off, and none of their
    /// completions may be lost. At most [`MAX_SHARED_RECEIVE_SLOTS`].
    pub shared_receive_slots: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 18515)),
            device: None,
            port: 1,
            gid_index: None,
            credits: 32,
            send_slots: 32,
            max_message: 16 << 20,
            eager_threshold: 4096,
            read_chunk: 1 << 20,
            pool_keep_bytes: 64 << 20,
            timeout: Duration::from_secs(10),
            max_outstanding: 256,
            max_outstanding_bytes: 64 << 20,
            max_outstanding_bytes_total: 1 << 30,
            max_receiving_bytes: 64 << 20,
            max_receiving_bytes_total: 1 << 30,
            ack_timeout: Duration::from_secs(120),
            busy_poll: Duration::from_millis(2),
            max_sessions: 256,
            max_handshakes: 16,
            log_lines_per_second: 20,
            max_sessions_per_address: 0,
            peer_timeout: Duration::from_secs(30),
            serialize_binds: None,
            invalidating_acks: None,
            confirm_reads: None,
            rc_timeout: 14,
            rc_retries: 7,
            shared_receive_slots: 0,
        }
    }
}

impl Config {
    /// Bytes of the peers' messages each session may hold whatever the others hold
    /// (`max_receiving_bytes_total`): what its eager messages may pin
    /// ([`Config::eager_holding`]), the rest for its read messages.
    pub(crate) fn receiving_floor(&self) -> u64 {
        let sessions = (self.max_sessions as u64).max(1);
        (self.max_receiving_bytes_total / 2 / sessions).min(self.max_receiving_bytes)
    }

    /// The most the peers' eager messages that one session holds may pin: at most
    /// `credits` of them wait (delivered and not yet taken, or behind one of the
    /// peer's read messages), each larger than a spare array copied into a pool
    /// buffer. It is set aside in the session's floor, so that the peers' messages
    /// of every kind pin at most `max_receiving_bytes_total` together.
    pub(crate) fn eager_holding(&self) -> u64 {
        if self.eager_threshold as usize <= crate::spare::SPARE_LEN {
            return 0;
        }
        let buffer = crate::pool::buffer_len(u64::from(self.eager_threshold));
        u64::from(self.credits).saturating_mul(buffer)
    }

    /// The part of a session's floor for the peers' read messages: the floor less
    /// what its eager messages may hold.
    pub(crate) fn reading_floor(&self) -> u64 {
        self.receiving_floor().saturating_sub(self.eager_holding())
    }

    /// That a session's floor holds what its eager messages may pin, and that a
    /// message of `max_message` bytes fits what a session may hold of the peers'
    /// read messages when nobody else holds any: it is counted as its buffer, and
    /// one that could never fit would be refused as busy for ever.
    fn check_receiving(&self) -> Result<(), String> {
        let (eager, floor) = (self.eager_holding(), self.receiving_floor());
        if eager > floor {
            return Err(format!(
                "credits ({}) eager messages of up to {} bytes, held in pool buffers, may \
                 pin {eager} bytes a session, more than its share of the receiving budget \
                 ({floor}: half of max_receiving_bytes_total over max_sessions, at most \
                 max_receiving_bytes); raise max_receiving_bytes_total, or lower credits, \
                 eager_threshold or max_sessions",
                self.credits, self.eager_threshold
            ));
        }
        let (shared, _) = self.receiving_split();
        let most = self
            .max_receiving_bytes
            .min(shared.saturating_add(self.reading_floor()));
        let buffer = crate::pool::buffer_len(self.max_message);
        if buffer > most {
            return Err(format!(
                "max_message ({}) is held in a buffer of {buffer} bytes, more than a \
                 session may hold of the peers' messages ({most}: max_receiving_bytes, \
                 or half of max_receiving_bytes_total plus a session's floor); lower \
                 max_message or raise those",
                self.max_message
            ));
        }
        Ok(())
    }

    /// `max_receiving_bytes_total` split: the bytes all sessions share, and the
    /// reserve for the floors.
    pub(crate) fn receiving_split(&self) -> (u64, u64) {
        let reserve = self
            .receiving_floor()
            .saturating_mul((self.max_sessions as u64).max(1));
        (self.max_receiving_bytes_total - reserve, reserve)
    }
}

/// The most slots a shared receive queue may have (`Config::shared_receive_slots`).
pub const MAX_SHARED_RECEIVE_SLOTS: u32 = 1 << 14;

/// The longest `timeout`, `ack_timeout`, `busy_poll` and `peer_timeout` may be:
/// a day. Deadlines are instants that far ahead; `Duration::MAX`, a natural way
/// to write "never", would overflow them (and panic the poller).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

impl Config {
    /// Checks the values that must hold for the protocol to work.
    pub fn validate(&self) -> Result<(), String> {
        use crate::protocol::{MAX_CREDITS, MAX_MESSAGE, MAX_SLOT_SIZE, MIN_CREDITS};
        // What the hello carries must be within what every peer accepts.
        if !(MIN_CREDITS..=MAX_CREDITS).contains(&self.credits) {
            return Err(format!(
                "credits must be {MIN_CREDITS}..={MAX_CREDITS} (got {})",
                self.credits
            ));
        }
        if self.max_message > MAX_MESSAGE {
            return Err(format!(
                "max_message must be at most {MAX_MESSAGE} bytes (got {})",
                self.max_message
            ));
        }
        if self.slot_size() > MAX_SLOT_SIZE {
            return Err(format!(
                "eager_threshold must be at most {} bytes (got {}): a receive slot holds \
                 at most {MAX_SLOT_SIZE}",
                MAX_SLOT_SIZE - crate::protocol::SLOT_OVERHEAD,
                self.eager_threshold
            ));
        }
        if self.max_sessions == 0 || self.max_handshakes == 0 {
            return Err("max_sessions and max_handshakes must not be 0".into());
        }
        if self.send_slots < 2 {
            return Err(format!(
                "send_slots must be at least 2 (got {})",
                self.send_slots
            ));
        }
        if self.read_chunk == 0 || self.max_message == 0 {
            return Err("read_chunk and max_message must not be 0".into());
        }
        if u64::from(self.eager_threshold) > self.max_message {
            return Err("eager_threshold must not exceed max_message".into());
        }
        if self.shared_receive_slots > MAX_SHARED_RECEIVE_SLOTS {
            return Err(format!(
                "shared_receive_slots must be at most {MAX_SHARED_RECEIVE_SLOTS} (got {})",
                self.shared_receive_slots
            ));
        }
        if !(1..=31).contains(&self.rc_timeout) || self.rc_retries > 7 {
            return Err(format!(
                "rc_timeout must be 1..=31 (0 would never retransmit) and rc_retries \
                 0..=7 (got {} and {})",
                self.rc_timeout, self.rc_retries
            ));
        }
        self.check_receiving()?;
        self.check_durations()?;
        if self.max_outstanding == 0
            || self.max_outstanding_bytes_total == 0
            || self.max_receiving_bytes == 0
            || self.max_receiving_bytes_total == 0
            || self.ack_timeout.is_zero()
        {
            return Err(
                "max_outstanding, max_outstanding_bytes_total, max_receiving_bytes, \
                 max_receiving_bytes_total and ack_timeout must not be 0"
                    .into(),
            );
        }
        Ok(())
    }

    /// Every duration within [`MAX_DURATION`].
    fn check_durations(&self) -> Result<(), String> {
        let durations = [
            ("timeout", self.timeout),
            ("ack_timeout", self.ack_timeout),
            ("busy_poll", self.busy_poll),
            ("peer_timeout", self.peer_timeout),
        ];
        match durations.iter().find(|(_, d)| *d > MAX_DURATION) {
            Some((name, d)) => Err(format!(
                "{name} must be at most a day ({} s; got {d:?}): deadlines that far \
                 ahead would overflow the clock",
                MAX_DURATION.as_secs()
            )),
            None => Ok(()),
        }
    }

    /// Bytes per control slot: header, metadata and the largest eager payload.
    pub fn slot_size(&self) -> usize {
        crate::protocol::CONTROL_HEADER_LEN
            + crate::protocol::MAX_META_LEN
            + self.eager_threshold as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn durations_longer_than_a_day_are_refused() {
        use std::time::Duration;
        let day = super::MAX_DURATION;
        let at = |d: Duration| Config {
            timeout: d,
            ack_timeout: d,
            busy_poll: d,
            peer_timeout: d,
            ..Config::default()
        };
        assert_eq!(at(day).validate(), Ok(()));
        for name in ["timeout", "ack_timeout", "busy_poll", "peer_timeout"] {
            let mut c = Config::default();
            let field = match name {
                "timeout" => &mut c.timeout,
                "ack_timeout" => &mut c.ack_timeout,
                "busy_poll" => &mut c.busy_poll,
                _ => &mut c.peer_timeout,
            };
            *field = Duration::MAX;
            let why = c.validate().unwrap_err();
            assert!(
                why.starts_with(name) && why.contains("at most a day"),
                "{why}"
            );
        }
    }

    #[test]
    fn the_rc_timeout_and_retries_are_checked() {
        assert_eq!(Config::default().validate(), Ok(()));
        let never = Config {
            rc_timeout: 0,
            ..Config::default()
        };
        let why = never.validate().unwrap_err();
        assert!(why.contains("0 would never retransmit"), "{why}");
        for (rc_timeout, rc_retries) in [(32, 7), (14, 8)] {
            let bad = Config {
                rc_timeout,
                rc_retries,
                ..Config::default()
            };
            assert!(
                bad.validate().is_err(),
                "{rc_timeout} and {rc_retries} accepted"
            );
        }
    }

    #[test]
    fn eager_messages_a_session_may_hold_come_out_of_its_floor() {
        let d = Config::default();
        // 32 credits of 4 KiB eager messages, out of a floor of 2 MiB.
        assert_eq!(d.eager_holding(), 32 * 4096);
        assert_eq!(d.reading_floor(), (2 << 20) - 32 * 4096);
        // Floors (eager and read) and the shared half make exactly the total.
        let (shared, reserve) = d.receiving_split();
        let sessions = d.max_sessions as u64;
        assert_eq!(reserve, sessions * (d.reading_floor() + d.eager_holding()));
        assert_eq!(shared + reserve, d.max_receiving_bytes_total);
        // Small eager messages stay in spare arrays: nothing set aside.
        let small = Config {
            eager_threshold: 128,
            ..d.clone()
        };
        assert_eq!(small.eager_holding(), 0);
        assert_eq!(small.reading_floor(), small.receiving_floor());
        // 256 credits of 64 KiB pin 16 MiB a session: more than a 2 MiB floor.
        let big = Config {
            credits: 256,
            eager_threshold: 64 << 10,
            ..d.clone()
        };
        let why = big.validate().unwrap_err();
        assert!(
            why.contains("may pin 16777216 bytes") && why.contains("(2097152"),
            "{why}"
        );
        let roomy = Config {
            max_receiving_bytes_total: 16 << 30,
            ..big
        };
        assert_eq!(roomy.validate(), Ok(()), "32 MiB floors hold them");
    }

    #[test]
    fn a_largest_message_must_fit_what_a_session_may_hold() {
        let mib = 1 << 20;
        // 8 MiB for 4 sessions: floors of 1 MiB (896 KiB of it for read messages),
        // 4 MiB shared, 4.875 MiB of read messages at most.
        let small = Config {
            max_receiving_bytes_total: 8 * mib,
            max_sessions: 4,
            ..Config::default()
        };
        assert_eq!(small.receiving_floor(), mib);
        assert_eq!(small.receiving_split(), (4 * mib, 4 * mib));
        let why = small.validate().unwrap_err();
        assert!(why.contains("max_message (16777216)"), "{why}");
        let fits = |max_message| {
            Config {
                max_message,
                ..small.clone()
            }
            .validate()
        };
        assert_eq!(fits(4 * mib), Ok(()), "a 4 MiB buffer fits 4.875 MiB");
        assert!(fits(4 * mib + 1).is_err(), "its 8 MiB buffer does not");
        // 40 MB is held in 64 MiB: more than 60 MB a session, within 70 MB.
        let capped = |max_receiving_bytes| Config {
            max_receiving_bytes,
            max_message: 40_000_000,
            ..Config::default()
        };
        let why = capped(60_000_000).validate().unwrap_err();
        assert!(why.contains("buffer of 67108864"), "{why}");
        assert_eq!(capped(70_000_000).validate(), Ok(()));
    }
}

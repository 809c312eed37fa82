//! Completion queues (`ibv_create_cq`) and the completions polled from them.

use crate::channel::{CompletionChannel, ACK_BATCH};
use crate::context::Context;
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::ffi::CStr;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// A completion queue; destroyed after every queue pair that uses it.
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    /// The extended CQ of [`CompletionQueue::new_ex`], with the fields it reports.
    ex: Option<(NonNull<sys::ibv_cq_ex>, WcFlags)>,
    ctx: Arc<Context>,
    channel: Option<Arc<CompletionChannel>>,
    /// Channel events read but not yet acknowledged.
    unacked: AtomicU32,
    /// This process's number for the queue, never reused (see [`crate::completion`]).
    id: u64,
    /// Completions handed out by [`Self::poll_completions`] so far: each is stamped
    /// with its number in this count, so that one kept for long can be told from a
    /// later one with the same work request id (see [`crate::lease`]).
    pub(crate) numbering: crate::completion::Numbering,
    /// The actual number of entries, as the driver last set it (read under
    /// `resizing`: `ibv_resize_cq` writes the C field, which another thread's
    /// [`Self::capacity`] must not read meanwhile).
    capacity: AtomicU32,
    /// Held (written) across `ibv_resize_cq` and the read of its result; on
    /// Soft-RoCE a poll that found a resize under way waits on it (read).
    resizing: RwLock<()>,
    /// On Soft-RoCE, the polls in flight and the resize under way: rxe's provider
    /// leaves its ring unmapped, outside its own lock, while a failed resize
    /// returns, so no poll may run meanwhile.
    gate: PollGate,
    /// Held by [`Self::poll_ex`] for its whole run and by
    /// [`Self::poll_completions`] before it marks its poll under way: a thread
    /// posting from a `poll_ex` callback (the provider's queue lock held) may wait
    /// for polls under way to end (`Numbering::settled`), and one blocked on the
    /// provider's lock inside such a poll would never end. Also held across the
    /// destroy of a queue pair of two queues ([`hold_for_destroy`]).
    pub(crate) polling: Mutex<()>,
    /// Owner tags handed to [`crate::LeasedQp`]s on this queue so far (see
    /// [`Self::next_owner`]).
    owners: AtomicU64,
    /// The device is Soft-RoCE, whose completion flags [`Self::poll`] corrects
    /// (see [`soft_roce_wc_flags`]).
    soft_roce: bool,
    /// The device may be Soft-RoCE (it is, or its query failed): the guards its
    /// provider needs (the ring's lock, `broken`, queued binds) fail closed.
    maybe_soft_roce: bool,
    /// A resize failed on Soft-RoCE, whose provider may be left without a ring
    /// (rdma-core 44 sets it to null when mapping the new one fails): polls are
    /// refused, as the provider's would read through the null pointer.
    broken: AtomicBool,
}

/// The polls in flight on a Soft-RoCE queue and the mark of a resize: two atomic
/// operations a poll (a read lock took about three times the code).
#[derive(Default)]
pub(crate) struct PollGate(AtomicU32);

/// `PollGate`'s mark of a resize under way.
const RESIZING: u32 = 1 << 31;

impl PollGate {
    /// Counts a poll in flight, or `None` when a resize is under way (nothing
    /// counted: wait for it and try again).
    #[inline]
    fn enter(&self) -> Option<Ring<'_>> {
        let before = self.0.fetch_add(1, Ordering::Acquire);
        let ring = Ring(&self.0);
        (before & RESIZING == 0).then_some(ring)
    }

    /// Marks a resize under way and waits for the polls in flight to end; the
    /// mark goes with the guard (on every path out of the resize). One resize
    /// at a time (the caller holds `resizing`).
    fn quiesce(&self) -> Quiet<'_> {
        self.0.fetch_or(RESIZING, Ordering::Acquire);
        let quiet = Quiet(&self.0);
        while self.0.load(Ordering::Acquire) & !RESIZING != 0 {
            std::thread::yield_now();
        }
        quiet
    }
}

/// A poll in flight on a Soft-RoCE queue: counted until dropped.
struct Ring<'a>(&'a AtomicU32);

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A resize under way on a Soft-RoCE queue: marked until dropped.
struct Quiet<'a>(&'a AtomicU32);

impl Drop for Quiet<'_> {
    fn drop(&mut self) {
        self.0.fetch_and(!RESIZING, Ordering::Release);
    }
}

/// The refusal of `what` from inside the queue's own `poll_ex` callback.
#[cold]
fn inside_callback(what: &str) -> Error {
    Error::InvalidArgument(
        format!(
            "{what} on a completion queue from inside its own poll_ex callback, which \
             holds the queue's lock: return from the callback first"
        )
        .into(),
    )
}

/// The refusal of `what` on a queue created before the queue whose `poll_ex`
/// callback this thread is in.
#[cold]
fn out_of_order(what: &str) -> Error {
    Error::InvalidArgument(
        format!(
            "{what} on a completion queue from inside a poll_ex callback of a queue \
             created after it: callbacks nest only into queues created later, so that \
             two threads can never hold the queues' locks in opposite orders; return \
             from the callback first"
        )
        .into(),
    )
}

/// Why a queue whose resize failed on Soft-RoCE polls no more.
const BROKEN: &str = "the completion queue cannot be polled: its resize failed on \
     Soft-RoCE, whose provider may be left without a ring (it drops the old one before \
     it maps the new one); create a new queue";

/// The next [`CompletionQueue`] id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How deep `poll_ex` callbacks of different queues may nest on one thread.
const NESTING: usize = 4;

thread_local! {
    /// The queues whose [`CompletionQueue::poll_ex`] callbacks this thread is in,
    /// innermost last (their ids; 0: no more). The provider holds each queue's lock
    /// meanwhile, so polling or resizing one of them from a callback would wait for
    /// itself for ever.
    static IN_POLL_EX: std::cell::Cell<[u64; NESTING]> = const {
        std::cell::Cell::new([0; NESTING])
    };
}

/// This thread is in a `poll_ex` callback (at nesting depth `.0`) until dropped.
struct Inside(usize);

impl Inside {
    /// Enters a callback of queue `id`; refused beyond [`NESTING`] queues.
    fn enter(id: u64) -> Result<Inside> {
        let mut ids = IN_POLL_EX.with(|q| q.get());
        let Some(depth) = ids.iter().position(|&q| q == 0) else {
            return Err(Error::InvalidArgument(
                format!("poll_ex callbacks nested more than {NESTING} deep").into(),
            ));
        };
        ids[depth] = id;
        IN_POLL_EX.with(|q| q.set(ids));
        Ok(Inside(depth))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut ids = IN_POLL_EX.with(|q| q.get());
        ids[self.0] = 0;
        IN_POLL_EX.with(|q| q.set(ids));
    }
}

/// The `polling` locks of a queue pair's two completion queues that are
/// extended (those with `poll_ex` callbacks), lower id first, held across its
/// destroy; none when the queues are one, or when this thread is in a `poll_ex`
/// callback of either or of a later queue (whose lock it may hold itself).
///
/// mlx5 cleans a destroyed queue pair's completions out of both its queues with
/// both their locks held, taken in its own order (the device's queue numbers). A
/// `poll_ex` callback of one of them that polls the other (allowed, when the
/// other is later) holds the locks in the crate's order, perhaps the reverse, and
/// the two would wait for each other. Every callback of a queue runs under its
/// `polling` lock, so with those taken no callback of either runs meanwhile, and
/// the locks are taken in the crate's order like every other nesting.
pub(crate) fn hold_for_destroy<'a>(
    send: &'a CompletionQueue,
    recv: &'a CompletionQueue,
) -> [Option<std::sync::MutexGuard<'a, ()>>; 2] {
    let (low, high) = if send.id <= recv.id {
        (send, recv)
    } else {
        (recv, send)
    };
    let ids = IN_POLL_EX.with(|q| q.get());
    if low.id == high.id || ids.iter().any(|&q| q >= low.id) {
        return [None, None];
    }
    // In order, lower id first; a plain queue has no callbacks to keep out.
    [low, high].map(|q| {
        q.ex.is_some()
            .then(|| q.polling.lock().unwrap_or_else(|e| e.into_inner()))
    })
}

/// Refuses a completion channel of another device context than `ctx`'s: its
/// events would name queues of another context.
fn check_channel(
    ctx: &Context,
    channel: Option<&Arc<CompletionChannel>>,
    verb: &str,
) -> Result<()> {
    match channel {
        Some(c) if c.context().as_raw() != ctx.as_raw() => Err(Error::InvalidArgument(
            format!(
                "{verb}: the completion channel belongs to another device context; \
                 create it from the queue's context"
            )
            .into(),
        )),
        _ => Ok(()),
    }
}

/// A fresh queue id.
fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

// SAFETY: libibverbs CQs may be polled from any thread (providers lock internally).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a completion queue with room for at least `depth` completions.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<Self>> {
        Self::create(ctx, depth, None, 0)
    }

    /// Creates a completion queue whose events go to `channel`, on completion vector
    /// `vector` (0 .. the context's `num_comp_vectors`).
    pub fn with_channel(
        ctx: &Arc<Context>,
        depth: u32,
        channel: &Arc<CompletionChannel>,
        vector: i32,
    ) -> Result<Arc<Self>> {
        Self::create(ctx, depth, Some(channel.clone()), vector)
    }

    fn create(
        ctx: &Arc<Context>,
        depth: u32,
        channel: Option<Arc<CompletionChannel>>,
        vector: i32,
    ) -> Result<Arc<Self>> {
        crate::context::check_provider_locks()?;
        let depth = i32::try_from(depth)
            .map_err(|_| Error::InvalidArgument("CQ depth too large".into()))?;
        check_channel(ctx, channel.as_ref(), "ibv_create_cq")?;
        let raw_channel = channel.as_ref().map_or(ptr::null_mut(), |c| c.as_raw());
        // SAFETY: the context (and channel, if any) are alive; no user context.
        let raw = unsafe {
            sys::ibv_create_cq(ctx.as_raw(), depth, ptr::null_mut(), raw_channel, vector)
        };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::last("ibv_create_cq")
                .with_hint("is the depth above the device's max_cqe, or the vector too high?")
        })?;
        // SAFETY: just created, alive, and of `ctx`.
        Ok(unsafe { Self::wrap(raw, None, ctx, channel) })
    }

    /// Creates an extended completion queue (`ibv_create_cq_ex`) whose completions
    /// also report the fields of `wc_flags` (read them with [`Self::poll_ex`]), with
    /// room for at least `depth` completions and events on `channel` if given. The
    /// queue serves queue pairs and [`Self::poll`] like any other.
    pub fn new_ex(
        ctx: &Arc<Context>,
        depth: u32,
        channel: Option<&Arc<CompletionChannel>>,
        wc_flags: WcFlags,
    ) -> Result<Arc<Self>> {
        crate::context::check_provider_locks()?;
        check_channel(ctx, channel, "ibv_create_cq_ex")?;
        let mut attr = sys::ibv_cq_init_attr_ex {
            cqe: depth,
            channel: channel.map_or(ptr::null_mut(), |c| c.as_raw()),
            wc_flags: wc_flags.0,
            ..Default::default()
        };
        // SAFETY: the context (and channel, if any) are alive; `attr` is initialised.
        let ex = unsafe { sys::ibv_create_cq_ex(ctx.as_raw(), &mut attr) };
        let ex = NonNull::new(ex).ok_or_else(|| {
            let e = Error::last("ibv_create_cq_ex");
            match e.errno() {
                Some(libc::EOPNOTSUPP) => e.with_hint(format!(
                    "the device cannot report some of the requested completion fields \
                     ({wc_flags:?}); completion timestamps need a non-zero \
                     completion_timestamp_mask in ibv_query_device_ex"
                )),
                _ => e.with_hint("is the depth above the device's max_cqe?"),
            }
        })?;
        // SAFETY: `ex` was just created; the conversion only offsets the pointer.
        let raw = NonNull::new(unsafe { sys::ibv_cq_ex_to_cq(ex.as_ptr()) })
            .ok_or_else(|| Error::verb("ibv_cq_ex_to_cq", libc::EINVAL))?;
        // SAFETY: just created (as `ex`), alive, and of `ctx`.
        Ok(unsafe { Self::wrap(raw, Some((ex, wc_flags)), ctx, channel.cloned()) })
    }

    /// Takes ownership of a queue just created on `ctx`.
    ///
    /// # Safety
    /// `raw` (and `ex`'s queue, the same one) is a live CQ of `ctx`, owned by
    /// nothing else, with events to `channel` if given.
    unsafe fn wrap(
        raw: NonNull<sys::ibv_cq>,
        ex: Option<(NonNull<sys::ibv_cq_ex>, WcFlags)>,
        ctx: &Arc<Context>,
        channel: Option<Arc<CompletionChannel>>,
    ) -> Arc<Self> {
        // SAFETY: alive (see above), and no other thread has it yet.
        let capacity = unsafe { (*raw.as_ptr()).cqe } as u32;
        let soft_roce = is_soft_roce(ctx);
        Arc::new(CompletionQueue {
            raw,
            ex,
            ctx: ctx.clone(),
            channel,
            unacked: AtomicU32::new(0),
            id: next_id(),
            numbering: Default::default(),
            capacity: AtomicU32::new(capacity),
            resizing: RwLock::new(()),
            gate: PollGate::default(),
            polling: Mutex::new(()),
            owners: AtomicU64::new(0),
            soft_roce: soft_roce == Some(true),
            maybe_soft_roce: soft_roce != Some(false),
            broken: AtomicBool::new(false),
        })
    }

    /// Polls up to `max` completions of an extended queue, handing each to `f` while
    /// it is current; returns how many there were. No allocation.
    ///
    /// Each completion is taken with its own `ibv_start_poll`/`ibv_end_poll` pair,
    /// never with `ibv_next_poll`: rdma-core 44's rxe provider overruns its consumer
    /// index and unlocks twice when `ibv_end_poll` follows an `ibv_next_poll` that
    /// found nothing (fixed in rdma-core 55 and 61), which the man page requires.
    ///
    /// `f` runs with the provider's lock on this queue held, so nothing in it may
    /// wait for that lock or form a cycle of such locks with another thread:
    /// - polling or resizing this queue from it is refused ([`Error::InvalidArgument`]);
    /// - so is polling or resizing a queue created before this one: callbacks nest
    ///   only into queues created later, so two threads never take two queues'
    ///   locks in opposite orders;
    /// - so is resetting a queue pair of either kind of queue
    ///   ([`QueuePair::reset`](crate::QueuePair::reset)), which on mlx5 cleans its
    ///   queues under their locks.
    ///
    /// A queue pair whose send and receive queues differ is destroyed with both
    /// queues' `poll_ex` callbacks kept out (mlx5 cleans the two queues holding
    /// both their locks, in an order of its own): its drop waits for a callback
    /// of either that runs on another thread, so such a callback must not wait
    /// for a thread that drops one.
    ///
    /// Still hangs, as the checks cannot refuse them:
    /// - dropping a queue pair of this queue (or of a queue created before it) in
    ///   `f`, on mlx5: its destroy cleans the queues the same way. Putting the
    ///   destroy off would not do, as the drop promises the device has stopped
    ///   before the queue pair's buffers are let go. Move such a queue pair out
    ///   and drop it after `poll_ex` returns;
    /// - creating a queue pair in `f` while another thread destroys one of this
    ///   queue, on mlx5 devices of CQE version 0 (a provider lock both take);
    /// - the checks follow the thread: one started from `f` and joined there is
    ///   not seen to be inside it, and may poll this queue and wait for ever.
    pub fn poll_ex(&self, max: usize, mut f: impl FnMut(&ExCompletion<'_>)) -> Result<usize> {
        let Some((ex, flags)) = self.ex else {
            return Err(Error::InvalidArgument(
                "poll_ex needs a queue made by CompletionQueue::new_ex".into(),
            ));
        };
        /// Ends the poll however it is left (a panic in `f` included): the provider
        /// holds a lock between start and end.
        struct End(NonNull<sys::ibv_cq_ex>);
        impl Drop for End {
            fn drop(&mut self) {
                // SAFETY: a poll started successfully on this live CQ and not ended.
                unsafe { sys::ibv_end_poll(self.0.as_ptr()) };
            }
        }
        self.check_outside_callback("poll_ex")?;
        let _polling = self.polling.lock().unwrap_or_else(|e| e.into_inner());
        let _ring = self.ring()?;
        let _inside = Inside::enter(self.id)?;
        let mut n = 0;
        while n < max {
            let mut attr = sys::ibv_poll_cq_attr::default();
            // SAFETY: the extended CQ is alive; `attr` is initialised.
            match unsafe { sys::ibv_start_poll(ex.as_ptr(), &mut attr) } {
                0 => {}
                libc::ENOENT => break,
                e => return Err(Error::verb("ibv_start_poll", e)),
            }
            let _end = End(ex);
            f(&ExCompletion {
                cq: ex,
                flags,
                _poll: std::marker::PhantomData,
            });
            n += 1;
        }
        Ok(n)
    }

    /// The completion channel, if the CQ has one.
    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.channel.as_ref()
    }

    /// Counts one event read for this CQ and acknowledges a full batch.
    pub(crate) fn count_event(&self) {
        let n = self.unacked.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= ACK_BATCH
            && self
                .unacked
                .compare_exchange(n, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // SAFETY: the CQ is alive and `n` events were read and not acknowledged.
            unsafe { sys::ibv_ack_cq_events(self.raw.as_ptr(), n) };
        }
    }

    /// Resizes the queue to at least `depth` entries (`ibv_resize_cq`). On
    /// Soft-RoCE a resize that fails after the kernel resized the queue leaves it
    /// without a ring, so every later poll of it is refused ([`Error::Refused`]):
    /// make a new queue.
    pub fn resize(&self, depth: u32) -> Result<()> {
        let depth = i32::try_from(depth)
            .map_err(|_| Error::InvalidArgument("CQ depth too large".into()))?;
        self.check_outside_callback("resize")?;
        let _resizing = self.resizing.write().unwrap_or_else(|e| e.into_inner());
        // Declared after `_resizing`, so dropped before it: the mark is lifted
        // while the lock is still held, and a poll that backed off blocks on the
        // lock rather than spinning on the mark.
        let _quiet = self.maybe_soft_roce.then(|| self.gate.quiesce());
        // SAFETY: the CQ is alive; only `ibv_resize_cq` writes the field, and every
        // call of it holds `resizing`, as this read does.
        let before = unsafe { (*self.raw.as_ptr()).cqe };
        // SAFETY: the CQ is alive.
        let ret = unsafe { sys::ibv_resize_cq(self.raw.as_ptr(), depth) };
        let result = crate::error::check("ibv_resize_cq", ret);
        // SAFETY: as above.
        let cqe = unsafe { (*self.raw.as_ptr()).cqe };
        // A failure after the kernel resized the queue (the new ring's map) leaves
        // no ring, and the provider's copy of the size moved then; a refusal by the
        // kernel leaves both as they were. When the new size rounds to the old one
        // (rxe sizes rings to a power of two, less one) the two cannot be told
        // apart: broken too.
        let rounded = (depth as u64 + 1).next_power_of_two() - 1;
        let resized = cqe != before || rounded == before as u64;
        if result.is_err() && self.maybe_soft_roce && resized {
            self.broken.store(true, Ordering::Release);
        }
        result?;
        self.capacity.store(cqe as u32, Ordering::Release);
        Ok(())
    }

    /// Polls up to `out.len()` completions into the caller's slice (no allocation) and
    /// returns the filled part. On Soft-RoCE the flags are corrected first (see
    /// [`soft_roce_wc_flags`]), so that [`WorkCompletion::invalidated_rkey`] reads
    /// the same on every device.
    #[inline]
    pub fn poll<'a>(&self, out: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        self.check_outside_callback("poll")?;
        self.poll_outside_callback(out)
    }

    /// [`Self::poll`] for a caller that checked it is outside this queue's
    /// `poll_ex` callbacks already ([`Self::check_outside_callback`]).
    #[inline]
    pub(crate) fn poll_outside_callback<'a>(
        &self,
        out: &'a mut [WorkCompletion],
    ) -> Result<&'a mut [WorkCompletion]> {
        let _ring = self.ring()?;
        let max = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: `WorkCompletion` is `repr(transparent)` over `ibv_wc`; `out` has room
        // for `max` of them; the CQ is alive.
        let n =
            unsafe { sys::inline::ibv_poll_cq(self.raw.as_ptr(), max, out.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(Error::verb("ibv_poll_cq", libc::EIO)
                .with_hint("the completion queue overran or the device failed"));
        }
        let done = &mut out[..n as usize];
        if self.soft_roce {
            for wc in done.iter_mut() {
                wc.0.wc_flags = soft_roce_wc_flags(wc.0.wc_flags);
            }
        }
        Ok(done)
    }

    /// Refuses `what` from inside this queue's own [`Self::poll_ex`] callback,
    /// where the provider holds the queue's lock (it would wait for ever), and
    /// from inside a callback of a queue created after this one (the order that
    /// keeps two threads from waiting for each other).
    #[inline]
    pub(crate) fn check_outside_callback(&self, what: &str) -> Result<()> {
        // The stack fills from its first place: empty there, empty (the usual case).
        let ids = IN_POLL_EX.with(|q| q.get());
        if ids[0] != 0 {
            return self.check_nesting(&ids, what);
        }
        Ok(())
    }

    /// [`Self::check_outside_callback`] inside callbacks of the queues `ids`.
    #[cold]
    fn check_nesting(&self, ids: &[u64; NESTING], what: &str) -> Result<()> {
        if ids.contains(&self.id) {
            return Err(inside_callback(what));
        }
        // Ids grow with creation, and the callbacks held nest in that order.
        if ids.iter().any(|&q| q > self.id) {
            return Err(out_of_order(what));
        }
        Ok(())
    }

    /// The provider's ring, for a poll: on Soft-RoCE counted in flight, so that a
    /// resize (which leaves it unmapped for a moment when it fails) waits for the
    /// poll, and a poll that finds a resize under way waits for it; refused once
    /// a failed resize left none ([`BROKEN`]). Elsewhere nothing to hold.
    #[inline]
    fn ring(&self) -> Result<Option<Ring<'_>>> {
        if !self.maybe_soft_roce {
            return Ok(None);
        }
        loop {
            if let Some(ring) = self.gate.enter() {
                if self.broken.load(Ordering::Acquire) {
                    return Err(Error::Refused(BROKEN.into()));
                }
                return Ok(Some(ring));
            }
            // A resize is under way: wait for it, and try again.
            self.wait_for_resize();
        }
    }

    /// Waits for a resize under way, which holds `resizing` until it lifted its
    /// mark.
    #[cold]
    fn wait_for_resize(&self) {
        drop(self.resizing.read().unwrap_or_else(|e| e.into_inner()));
    }

    /// The queue's device may be Soft-RoCE (it is, or the query failed).
    pub(crate) fn maybe_soft_roce(&self) -> bool {
        self.maybe_soft_roce
    }

    /// The actual number of entries.
    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Acquire)
    }

    /// A tag for the next [`crate::LeasedQp`] whose requests complete on this
    /// queue, never handed out before on it (`None` after 2^22 of them): a
    /// completion left on the queue by a dropped `LeasedQp` then names no later
    /// one.
    pub(crate) fn next_owner(&self) -> Option<u64> {
        crate::lease::take_owner(&self.owners)
    }

    /// This process's number for the queue: distinct for every queue ever created,
    /// so a [`crate::completion::Completion`] names its queue unambiguously.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `ibv_cq`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    /// The extended CQ, for queues made by [`Self::new_ex`].
    pub(crate) fn ex_raw(&self) -> Option<*mut sys::ibv_cq_ex> {
        self.ex.map(|(ex, _)| ex.as_ptr())
    }

    /// Completions handed out so far, once no poll has completions it has not
    /// numbered yet (see [`crate::completion::Numbering::settled`]).
    pub(crate) fn handed(&self) -> u64 {
        self.numbering.settled()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let unacked = *self.unacked.get_mut();
        if unacked > 0 {
            // SAFETY: events read for this CQ must be acknowledged before destroying it.
            unsafe { sys::ibv_ack_cq_events(self.raw.as_ptr(), unacked) };
        }
        // SAFETY: every QP using this CQ holds an Arc to it, so none is left.
        let ret = unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_destroy_cq failed");
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The extra fields an extended completion queue reports
/// (`enum ibv_create_cq_wc_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WcFlags(pub u64);

impl WcFlags {
    /// No extra field.
    pub const NONE: WcFlags = WcFlags(0);
    /// The byte count of receives (`IBV_WC_EX_WITH_BYTE_LEN`).
    pub const BYTE_LEN: WcFlags =
        WcFlags(sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0 as u64);
    /// The number of the local QP (`IBV_WC_EX_WITH_QP_NUM`).
    pub const QP_NUM: WcFlags =
        WcFlags(sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM.0 as u64);
    /// The device's timestamp of the completion, in its clock's cycles
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
    pub const COMPLETION_TIMESTAMP: WcFlags =
        WcFlags(sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64);

    /// Both sets of fields.
    pub const fn union(self, other: WcFlags) -> WcFlags {
        WcFlags(self.0 | other.0)
    }

    /// True when every field of `other` is in `self`.
    pub const fn contains(self, other: WcFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// The current completion of a [`CompletionQueue::poll_ex`]: valid only inside its
/// callback (the provider's cursor moves on afterwards).
pub struct ExCompletion<'a> {
    cq: NonNull<sys::ibv_cq_ex>,
    flags: WcFlags,
    _poll: std::marker::PhantomData<&'a ()>,
}

impl ExCompletion<'_> {
    /// The extended queue being polled.
    pub(crate) fn cq_ex(&self) -> *mut sys::ibv_cq_ex {
        self.cq.as_ptr()
    }

    /// The id given to the work request.
    pub fn wr_id(&self) -> u64 {
        // SAFETY: a poll is in progress and this completion is current. The field
        // is read in place: other threads may update the struct's event counters.
        unsafe { (*self.cq.as_ptr()).wr_id }
    }

    /// The status.
    pub fn status(&self) -> sys::ibv_wc_status {
        // SAFETY: as above.
        unsafe { (*self.cq.as_ptr()).status }
    }

    /// True when the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status() == sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The opcode (`ibv_wc_read_opcode`).
    pub fn opcode(&self) -> sys::ibv_wc_opcode {
        // SAFETY: as above.
        unsafe { sys::ibv_wc_read_opcode(self.cq.as_ptr()) }
    }

    /// The byte count, if the queue was made with [`WcFlags::BYTE_LEN`].
    pub fn byte_len(&self) -> Option<u32> {
        self.flags.contains(WcFlags::BYTE_LEN).then(|| {
            // SAFETY: as above; the field was requested at creation.
            unsafe { sys::ibv_wc_read_byte_len(self.cq.as_ptr()) }
        })
    }

    /// The local QP number, if the queue was made with [`WcFlags::QP_NUM`].
    pub fn qp_num(&self) -> Option<u32> {
        self.flags.contains(WcFlags::QP_NUM).then(|| {
            // SAFETY: as above; the field was requested at creation.
            unsafe { sys::ibv_wc_read_qp_num(self.cq.as_ptr()) }
        })
    }

    /// The completion's timestamp in device clock cycles, if the queue was made with
    /// [`WcFlags::COMPLETION_TIMESTAMP`] (`ibv_wc_read_completion_ts`).
    pub fn completion_ts(&self) -> Option<u64> {
        self.flags.contains(WcFlags::COMPLETION_TIMESTAMP).then(|| {
            // SAFETY: as above; the field was requested at creation.
            unsafe { sys::ibv_wc_read_completion_ts(self.cq.as_ptr()) }
        })
    }
}

/// Whether `ctx` is Soft-RoCE (a device whose attributes cannot be read is taken
/// for hardware: its flags are left alone).
fn is_soft_roce(ctx: &Context) -> Option<bool> {
    ctx.query_device().ok().map(|a| a.is_soft_roce())
}

/// Soft-RoCE's completion flags in verbs' numbering. rxe (Linux 6.1, rdma-core 44)
/// hands user space the kernel's `ib_wc_flags`, which number a received
/// SEND_WITH_INV's invalidation `1 << 2` (`IB_WC_WITH_INVALIDATE`); verbs numbers
/// it `IBV_WC_WITH_INV` (`1 << 3`), and `1 << 2` is `IBV_WC_IP_CSUM_OK` there, a
/// flag rxe never means (it checks no IP checksums for the user). So `1 << 2`
/// becomes `IBV_WC_WITH_INV`; every other bit stays (`GRH` and `WITH_IMM` have
/// the same numbers in both).
pub fn soft_roce_wc_flags(flags: u32) -> u32 {
    let kernel_with_inv = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    if flags & kernel_with_inv == 0 {
        return flags;
    }
    (flags & !kernel_with_inv) | sys::ibv_wc_flags::IBV_WC_WITH_INV.0
}

/// One completion (`ibv_wc`).
#[repr(transparent)]
#[derive(Clone, Copy, Default)]
pub struct WorkCompletion(pub sys::ibv_wc);

impl WorkCompletion {
    /// The id given to the work request.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// The status: any number the provider wrote; one these headers do not list
    /// (a newer driver) has no `name()` and shows as `ibv_wc_status(<number>)`.
    pub fn status(&self) -> sys::ibv_wc_status {
        self.0.status
    }

    /// True when the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.0.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// What completed (valid only on success; an error completion may carry any
    /// number here, shown as `ibv_wc_opcode(<number>)` when the headers do not list it).
    pub fn opcode(&self) -> sys::ibv_wc_opcode {
        self.0.opcode
    }

    /// Bytes received (receives) or read.
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data in host order, if the completion carries one.
    pub fn imm_data(&self) -> Option<u32> {
        let has = self.0.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        // SAFETY: the union holds immediate data when the flag says so.
        has.then(|| u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
    }

    /// The key a received SEND_WITH_INV invalidated (`IBV_WC_WITH_INV`), if the
    /// completion carries one: that window or region is invalid by the time the
    /// completion is polled.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        if self.0.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 == 0 {
            return None;
        }
        // SAFETY: the union holds the invalidated key when the flag says so (and
        // both of its fields are plain `u32`s).
        Some(unsafe { self.0.__bindgen_anon_1.invalidated_rkey })
    }

    /// The local queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// `Ok(self)` on success, else the status as an error with its text and a hint.
    pub fn result(&self) -> Result<&Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(completion_error(self))
        }
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.0.wr_id)
            .field("status", &self.0.status)
            .field("opcode", &self.0.opcode)
            .field("byte_len", &self.0.byte_len)
            .field("qp_num", &self.0.qp_num)
            .finish()
    }
}

/// The text libibverbs gives a completion status.
pub fn status_text(status: sys::ibv_wc_status) -> String {
    // SAFETY: `ibv_wc_status_str` returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

fn completion_error(wc: &WorkCompletion) -> Error {
    use sys::ibv_wc_status as S;
    let hint = match wc.0.status {
        S::IBV_WC_RETRY_EXC_ERR => Some(
            "the peer stopped acknowledging: on a connection that worked, the peer's host, \
             process or link went away (or stayed unreachable longer than the retry budget); \
             on a new one, check the remote QPN/LID/GID and, on RoCE, the GID index \
             (RDMA_GID_INDEX, perftest -x) on both sides",
        ),
        S::IBV_WC_RNR_RETRY_EXC_ERR => Some("the peer had no receive posted (post receives first)"),
        S::IBV_WC_REM_ACCESS_ERR => {
            Some("wrong rkey, an address outside the peer's region, or access flags missing")
        }
        S::IBV_WC_REM_INV_REQ_ERR => Some(
            "the peer's QP refused the request: its access flags lack the operation \
             (REMOTE_READ/WRITE/ATOMIC), its max_dest_rd_atomic is 0, or the message is \
             too long for the receive",
        ),
        S::IBV_WC_LOC_PROT_ERR => Some("wrong lkey, or a buffer outside its memory region"),
        S::IBV_WC_LOC_LEN_ERR => Some("the receive buffer is smaller than the message"),
        S::IBV_WC_WR_FLUSH_ERR => {
            Some("the queue pair went to the error state; this request was flushed")
        }
        _ => None,
    };
    Error::Completion {
        status: wc.0.status,
        text: status_text(wc.0.status),
        wr_id: wc.0.wr_id,
        vendor_err: wc.0.vendor_err,
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completion as a provider newer than these headers could write it: status and
    /// opcode are numbers no `ibv_wc_*` enum lists.
    fn unlisted_completion() -> WorkCompletion {
        WorkCompletion(sys::ibv_wc {
            wr_id: 9,
            // What C may write there: numbers no enum of these headers lists.
            status: sys::ibv_wc_status(0x7777),
            opcode: sys::ibv_wc_opcode(0x7777),
            qp_num: 17,
            ..Default::default()
        })
    }

    #[test]
    fn unlisted_status_and_opcode_are_reported_with_their_number() {
        let wc = unlisted_completion();
        assert!(!wc.is_ok());
        assert_eq!(wc.status().0, 0x7777);
        assert_eq!(wc.status().name(), None);
        assert_eq!(wc.opcode().0, 0x7777);
        assert_eq!(wc.opcode().name(), None);
        let debug = format!("{wc:?}");
        assert!(debug.contains("status: ibv_wc_status(30583)"), "{debug}");
        assert!(debug.contains("opcode: ibv_wc_opcode(30583)"), "{debug}");
    }

    #[test]
    fn soft_roce_flags_say_with_inv_where_rxe_wrote_the_kernel_s_bit() {
        let inv = sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
        let grh = sys::ibv_wc_flags::IBV_WC_GRH.0;
        let imm = sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        // What rxe wrote for a received SEND_WITH_INV in the guest: GRH | 1 << 2.
        assert_eq!(soft_roce_wc_flags(0x5), grh | inv);
        assert_eq!(soft_roce_wc_flags(grh), grh, "a plain SEND");
        assert_eq!(soft_roce_wc_flags(grh | imm), grh | imm, "an immediate");
        assert_eq!(soft_roce_wc_flags(grh | inv), grh | inv, "a fixed provider");
    }

    #[test]
    fn invalidated_key_and_immediate_data_follow_their_flags() {
        let mut raw = sys::ibv_wc::default();
        raw.__bindgen_anon_1.invalidated_rkey = 0x1234_5678;
        assert_eq!(WorkCompletion(raw).invalidated_rkey(), None, "no flag");
        raw.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
        let wc = WorkCompletion(raw);
        assert_eq!(wc.invalidated_rkey(), Some(0x1234_5678), "host order");
        assert_eq!(wc.imm_data(), None, "an invalidation is no immediate");
    }

    #[test]
    fn unlisted_status_is_an_error_naming_the_number() {
        let wc = unlisted_completion();
        let err = wc.result().unwrap_err();
        match &err {
            Error::Completion {
                status,
                wr_id,
                hint,
                ..
            } => {
                assert_eq!(status.0, 0x7777);
                assert_eq!(*wr_id, 9);
                assert_eq!(*hint, None);
            }
            other => panic!("expected a completion error, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("work request 9"), "{text}");
        assert!(text.contains("ibv_wc_status(30583)"), "{text}");
    }

    #[test]
    fn listed_status_keeps_its_name_and_hint() {
        let mut wc = unlisted_completion();
        wc.0.status = sys::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR;
        let text = wc.result().unwrap_err().to_string();
        assert!(text.contains("IBV_WC_RNR_RETRY_EXC_ERR"), "{text}");
        assert!(text.contains("post receives first"), "{text}");
    }

    #[test]
    fn retry_exceeded_names_a_vanished_peer_before_addressing() {
        let mut wc = unlisted_completion();
        wc.0.status = sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
        let text = wc.result().unwrap_err().to_string();
        let gone = text.find("went away").expect(&text);
        let addressing = text.find("remote QPN").expect(&text);
        assert!(gone < addressing, "{text}");
    }

    /// Polls and resizes through the gate never overlap: four threads enter and
    /// leave while a fifth quiesces again and again, each side checking the
    /// other is out (a poll that finds a resize under way backs off).
    #[test]
    fn no_poll_runs_while_a_resize_does() {
        use super::PollGate;
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
        let gate = PollGate::default();
        let (resizing, polling) = (AtomicBool::new(false), AtomicU32::new(0));
        let done = AtomicBool::new(false);
        let (entered, refused) = (AtomicU32::new(0), AtomicU32::new(0));
        /// Stops the pollers however the resizer's loop ends (a failed assert
        /// too: the scope joins them before it passes the panic on).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let start = std::time::Instant::now();
        // The pollers stop after twelve seconds whatever happens: a gate that let
        // polls in during a resize could starve the resizer's wait for ever.
        let limit = std::time::Duration::from_secs(12);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    while !done.load(SeqCst) && start.elapsed() < limit {
                        match gate.enter() {
                            Some(_ring) => {
                                polling.fetch_add(1, SeqCst);
                                assert!(!resizing.load(SeqCst), "a poll ran in a resize");
                                for _ in 0..200 {
                                    std::hint::spin_loop();
                                }
                                polling.fetch_sub(1, SeqCst);
                                entered.fetch_add(1, SeqCst);
                            }
                            None => {
                                refused.fetch_add(1, SeqCst);
                                std::thread::yield_now();
                            }
                        }
                    }
                });
            }
            let _stop = Stop(&done);
            // Until both sides ran often and a poll backed off from a resize (the
            // pollers may start late), for at most ten seconds.
            let mut resizes = 0;
            while (resizes < 2000 || entered.load(SeqCst) < 2000 || refused.load(SeqCst) == 0)
                && start.elapsed() < std::time::Duration::from_secs(10)
            {
                let _quiet = gate.quiesce();
                resizing.store(true, SeqCst);
                assert_eq!(polling.load(SeqCst), 0, "a resize ran under a poll");
                for _ in 0..200 {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
                resizing.store(false, SeqCst);
                resizes += 1;
            }
        });
        assert!(entered.load(SeqCst) >= 2000, "the polls did not run");
        assert!(refused.load(SeqCst) > 0, "no poll met a resize");
        // Nothing left counted or marked.
        assert!(gate.enter().is_some());
    }
}

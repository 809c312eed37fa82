//! Small byte arrays, recycled: where a message keeps up to [`SPARE_LEN`] bytes of
//! its own (a small message's payload, any message's metadata). They live outside
//! the `Message`, so that a message is a few words: moving it, through the
//! completion's handling, the inbox and `recv`, copies those words and not 200
//! bytes (on an emulated CPU a move of 200 bytes costs as much as a hundred
//! instructions, docs/performance-history.md).
//!
//! An array comes from the calling thread's own list, else from a list all threads
//! share, else from the allocator. It goes back to the shared list while that holds
//! fewer than [`SHARED_LOW`], else to the thread's own (and when that is full, to
//! the shared list again). The shared list starts with [`SHARED_FIRST`] arrays, more
//! than it is topped up to, so that a thread that takes from it and gives back what
//! it took does not keep it just below [`SHARED_LOW`], taking its lock twice a
//! message. So a thread that makes more messages than it lets go (the poller, whose
//! messages the application drops) finds arrays in the shared list, a thread that
//! makes and drops its own (a `recv` loop, a callback runner) uses its own list
//! without a lock, and a steady exchange allocates nothing once the first few
//! messages went by. Both lists are bounded and sized once.

use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes an array holds.
pub(crate) const SPARE_LEN: usize = 128;

// The length is kept in a `u8`.
const _: () = assert!(SPARE_LEN <= u8::MAX as usize);

type Array = Box<[u8; SPARE_LEN]>;

/// Arrays a thread keeps at most; more go to the shared list.
const PER_THREAD: usize = 64;

/// Arrays the shared list keeps at most; more are freed.
const SHARED: usize = 1024;

/// Arrays go back to the shared list first while it holds fewer than this: the
/// reserve from which threads that make more than they drop (the pollers of a
/// client and a server in one process, say) take while the application's drops
/// are still on their way. The price is a lock per array a dropping thread gives
/// back while the list is low: tens of nanoseconds in the guest, against a round
/// trip of 67 µs.
const SHARED_LOW: usize = 16;

/// Arrays the shared list is made with, on its first use: above [`SHARED_LOW`], so
/// that the first threads to take from it, and give back, fill their own lists.
/// (Made empty, it never reached `SHARED_LOW` with one message in flight: every
/// array of a `recv` loop or a runner went through its lock, 8 atomic operations a
/// round trip on the server, by the code rows.)
const SHARED_FIRST: usize = 2 * SHARED_LOW;

thread_local! {
    static MINE: RefCell<Vec<Array>> = const { RefCell::new(Vec::new()) };
}

static SHARED_LIST: Mutex<Vec<Array>> = Mutex::new(Vec::new());

/// `SHARED_LIST`'s length, read without its lock.
static SHARED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Up to [`SPARE_LEN`] bytes in a recycled array.
pub(crate) struct Spare {
    /// Present until the drop hands it back.
    array: Option<Array>,
    len: u8,
}

impl Spare {
    /// No bytes, and no array.
    pub(crate) const EMPTY: Spare = Spare {
        array: None,
        len: 0,
    };

    /// `bytes` copied into an array, if they fit (no array for none).
    pub(crate) fn copy_of(bytes: &[u8]) -> Option<Spare> {
        let len = u8::try_from(bytes.len())
            .ok()
            .filter(|&n| usize::from(n) <= SPARE_LEN)?;
        if len == 0 {
            return Some(Spare::EMPTY);
        }
        let mut array = take();
        array[..bytes.len()].copy_from_slice(bytes);
        Some(Spare {
            array: Some(array),
            len,
        })
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.array
            .as_deref()
            .map_or(&[], |a| &a[..usize::from(self.len)])
    }
}

impl Drop for Spare {
    #[inline]
    fn drop(&mut self) {
        if let Some(array) = self.array.take() {
            give_back(array);
        }
    }
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spare({} bytes)", self.len)
    }
}

/// An array: the thread's own, else one of the shared list, else a new one.
fn take() -> Array {
    let mine = MINE
        .try_with(|mine| {
            let mut mine = mine.try_borrow_mut().ok()?;
            // Sized on first use: the list never grows later.
            if mine.capacity() == 0 {
                mine.reserve_exact(PER_THREAD);
            }
            mine.pop()
        })
        .ok()
        .flatten();
    mine.or_else(|| {
        let mut shared = SHARED_LIST.lock();
        if shared.capacity() == 0 {
            shared.reserve_exact(SHARED);
            shared.extend((0..SHARED_FIRST).map(|_| new_array()));
        }
        let array = shared.pop();
        SHARED_LEN.store(shared.len(), Ordering::Relaxed);
        array
    })
    .unwrap_or_else(new_array)
}

/// A new array, from the allocator.
fn new_array() -> Array {
    #[cfg(test)]
    tests::MADE_HERE.with(|n| n.set(n.get() + 1));
    Box::new([0; SPARE_LEN])
}

/// `array` back: to the shared list while that runs low, else to the thread's
/// list, else (that is full) to the shared list, else freed.
fn give_back(array: Array) {
    let mut array = Some(array);
    if SHARED_LEN.load(Ordering::Relaxed) >= SHARED_LOW {
        let _ = MINE.try_with(|mine| {
            let Ok(mut mine) = mine.try_borrow_mut() else {
                return;
            };
            if mine.capacity() == 0 {
                mine.reserve_exact(PER_THREAD);
            }
            if mine.len() < PER_THREAD {
                mine.extend(array.take());
            }
        });
    }
    if let Some(array) = array {
        let mut shared = SHARED_LIST.lock();
        if shared.capacity() == 0 {
            shared.reserve_exact(SHARED);
        }
        if shared.len() < SHARED {
            shared.push(array);
        }
        SHARED_LEN.store(shared.len(), Ordering::Relaxed);
        // Beyond both bounds, `array` (if not pushed) is freed here.
    }
}

#[cfg(test)]
mod tests {
    use super::{Spare, PER_THREAD, SHARED, SHARED_LIST, SPARE_LEN};

    #[test]
    fn bytes_come_back_intact_up_to_the_array_and_longer_ones_are_refused() {
        let data: Vec<u8> = (0..=SPARE_LEN as u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 64, SPARE_LEN - 1, SPARE_LEN] {
            let spare = Spare::copy_of(&data[..len]).expect("fits");
            assert_eq!(spare.bytes(), &data[..len]);
        }
        assert!(Spare::copy_of(&data).is_none(), "one byte too many");
    }

    #[test]
    fn a_recycled_array_shows_only_its_new_bytes() {
        drop(Spare::copy_of(&[0xee; SPARE_LEN]).expect("fits"));
        let again = Spare::copy_of(b"abc").expect("fits");
        assert_eq!(again.bytes(), b"abc");
    }

    thread_local! {
        /// Arrays this thread allocated.
        pub(super) static MADE_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn one_thread_making_and_another_dropping_allocates_only_at_first() {
        // Messages made on one thread and let go on another, as the poller and an
        // application do: 5,000 arrays pass, a hundred at a time.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Spare>>(0);
        let dropper = std::thread::spawn(move || {
            for batch in rx {
                drop(batch);
            }
            super::MINE.with(|m| m.borrow().len())
        });
        let maker = std::thread::spawn(move || {
            for round in 0..50u8 {
                let batch: Vec<Spare> = (0..100u8)
                    .map(|i| Spare::copy_of(&[round, i]).expect("fits"))
                    .collect();
                let intact = batch.iter().enumerate();
                assert!(intact
                    .into_iter()
                    .all(|(i, s)| s.bytes() == [round, i as u8]));
                tx.send(batch).expect("dropper alive");
            }
            let batches = MADE_HERE.with(|n| n.get());
            // Then one at a time, while the dropper's own list has room.
            for i in 0..1000u32 {
                let one = Spare::copy_of(&i.to_le_bytes()).expect("fits");
                tx.send(vec![one]).expect("dropper alive");
            }
            (batches, MADE_HERE.with(|n| n.get()) - batches)
        });
        let (made, singles) = maker.join().expect("no panic");
        let kept_there = dropper.join().expect("no panic");
        // The first batch is new; after it the dropper's arrays come back through
        // the shared list (other tests may take a few of them meanwhile).
        assert!(made < 300, "{made} arrays allocated for 5,000 messages");
        assert!(
            singles == 0,
            "{singles} arrays allocated for 1,000 single messages"
        );
        assert!(kept_there <= PER_THREAD, "{kept_there} kept by one thread");
        assert!(SHARED_LIST.lock().len() <= SHARED);
    }
}

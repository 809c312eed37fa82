//! A transport's budgets shared by all its sessions' cores: for the peers' read
//! messages it holds (`Config::max_receiving_bytes_total`) and for its own read
//! messages queued or in flight (`Config::max_outstanding_bytes_total`). Pure
//! counting: atomics, no I/O, no clock, so the cores stay testable on their own.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes charged by all sessions against a limit, and (for the peers' read
/// messages) a reserve: bytes each session may hold whatever the others hold, up
/// to its floor, counted apart so that sessions that take the whole shared limit
/// cannot keep another from its floor.
#[derive(Debug)]
pub(crate) struct SharedBudget {
    used: AtomicU64,
    limit: u64,
    /// Bytes charged to the reserve (each session's up to its floor).
    reserved: AtomicU64,
    reserve: u64,
}

impl SharedBudget {
    /// An empty budget of `limit` bytes, with no reserve.
    pub(crate) fn new(limit: u64) -> SharedBudget {
        SharedBudget::with_reserve(limit, 0)
    }

    /// An empty budget of `limit` shared bytes and a reserve of `reserve` more.
    pub(crate) fn with_reserve(limit: u64, reserve: u64) -> SharedBudget {
        SharedBudget {
            used: AtomicU64::new(0),
            limit,
            reserved: AtomicU64::new(0),
            reserve,
        }
    }

    /// Charges `bytes` if they fit under the limit; false (nothing charged) if not.
    #[cfg(test)]
    pub(crate) fn try_charge(&self, bytes: u64) -> bool {
        Self::add(&self.used, bytes, self.limit)
    }

    /// Charges `shared` bytes to the limit and `own` to the reserve if both fit;
    /// false (nothing charged) if either does not.
    pub(crate) fn try_charge_parts(&self, shared: u64, own: u64) -> bool {
        if !Self::add(&self.reserved, own, self.reserve) {
            return false;
        }
        if !Self::add(&self.used, shared, self.limit) {
            Self::sub(&self.reserved, own);
            return false;
        }
        true
    }

    /// Adds `bytes` to `counter` if it stays within `limit`.
    fn add(counter: &AtomicU64, bytes: u64, limit: u64) -> bool {
        bytes == 0
            || counter
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(bytes).filter(|&n| n <= limit)
                })
                .is_ok()
    }

    /// Takes `bytes` added before off `counter`.
    fn sub(counter: &AtomicU64, bytes: u64) {
        if bytes > 0 {
            let before = counter.fetch_sub(bytes, Ordering::AcqRel);
            debug_assert!(before >= bytes, "released {bytes} of {before} charged");
        }
    }

    /// Charges `bytes` if they fit under the limit, or if nothing is charged (a
    /// message larger than the whole budget goes alone); false (nothing charged)
    /// if not.
    pub(crate) fn try_charge_or_alone(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let next = used.saturating_add(bytes);
                (used == 0 || next <= self.limit).then_some(next)
            })
            .is_ok()
    }

    /// Gives back `bytes` charged before to the limit.
    pub(crate) fn release(&self, bytes: u64) {
        Self::sub(&self.used, bytes);
    }

    /// Moves `bytes` charged to the reserve to the limit's count (where they may
    /// exceed it until given back: the total stays what it was).
    pub(crate) fn move_to_shared(&self, bytes: u64) {
        if bytes > 0 {
            Self::sub(&self.reserved, bytes);
            self.used.fetch_add(bytes, Ordering::AcqRel);
        }
    }

    /// Gives back `shared` and `own` bytes charged before by `try_charge_parts`.
    pub(crate) fn release_parts(&self, shared: u64, own: u64) {
        Self::sub(&self.used, shared);
        Self::sub(&self.reserved, own);
    }

    /// Bytes charged now, to the limit and the reserve.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire) + self.reserved.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::SharedBudget;

    #[test]
    fn charges_fit_the_limit_and_come_back() {
        let b = SharedBudget::new(100);
        assert!(b.try_charge(60));
        assert!(!b.try_charge(41), "over the limit");
        assert_eq!(b.used(), 60, "a refused charge takes nothing");
        assert!(b.try_charge(40));
        assert!(!b.try_charge(1));
        b.release(60);
        assert!(!b.try_charge(u64::MAX), "no overflow");
        assert!(b.try_charge(60));
        assert_eq!(b.used(), 100);
    }

    #[test]
    fn parts_charge_the_limit_and_the_reserve_or_nothing() {
        let b = SharedBudget::with_reserve(100, 10);
        assert!(b.try_charge_parts(100, 4));
        assert!(!b.try_charge_parts(1, 0), "the limit is full");
        assert!(b.try_charge_parts(0, 6), "the reserve is apart from it");
        assert!(!b.try_charge_parts(0, 1), "the reserve is full");
        assert_eq!(b.used(), 110);
        b.release_parts(50, 0);
        assert!(
            !b.try_charge_parts(10, 1),
            "no room in the reserve: nothing charged"
        );
        assert_eq!(b.used(), 60);
        b.release_parts(50, 10);
        assert_eq!(b.used(), 0);
        assert!(!b.try_charge_parts(u64::MAX, 0), "no overflow");
        assert!(b.try_charge_parts(100, 10));
        b.move_to_shared(10);
        assert_eq!(b.used(), 110, "the total stays");
        assert!(b.try_charge_parts(0, 10), "the reserve is free again");
        assert!(!b.try_charge_parts(1, 0), "the limit's count is over it");
        b.release_parts(110, 10);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_charge_larger_than_the_budget_goes_alone() {
        let b = SharedBudget::new(100);
        assert!(b.try_charge_or_alone(500), "alone");
        assert!(!b.try_charge_or_alone(1), "not beside it");
        b.release(500);
        assert!(b.try_charge_or_alone(60));
        assert!(!b.try_charge_or_alone(41), "over the limit with another");
        assert!(b.try_charge_or_alone(40));
        assert_eq!(b.used(), 100);
    }
}

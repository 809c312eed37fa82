//! A transport's budgets shared by all its sessions' cores: for the peers' read
//! messages it holds (`Config::max_receiving_bytes_total`) and for its own read
//! messages queued or in flight (`Config::max_outstanding_bytes_total`). Pure
//! counting: one atomic, no I/O, no clock, so the cores stay testable on their own.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the peers' read messages all sessions hold (being read, or delivered
/// and not yet taken), against a limit.
#[derive(Debug)]
pub(crate) struct SharedBudget {
    used: AtomicU64,
    limit: u64,
}

impl SharedBudget {
    /// An empty budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> SharedBudget {
        SharedBudget {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Charges `bytes` if they fit under the limit; false (nothing charged) if not.
    pub(crate) fn try_charge(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
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

    /// Gives back `bytes` charged before.
    pub(crate) fn release(&self, bytes: u64) {
        if bytes > 0 {
            let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
            debug_assert!(before >= bytes, "released {bytes} of {before} charged");
        }
    }

    /// Bytes charged now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
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

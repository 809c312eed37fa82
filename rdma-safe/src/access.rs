//! Typed access flags of memory regions, windows and queue pairs (`IBV_ACCESS_*`).

use rdma_verbs_sys as sys;
use std::ops::{BitOr, BitOrAssign};

/// A set of `IBV_ACCESS_*` flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No access beyond local reads.
    pub const NONE: Access = Access(0);
    /// The local side may write (needed for receives and READ targets).
    pub const LOCAL_WRITE: Access = Access(sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// A peer may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// A peer may RDMA READ.
    pub const REMOTE_READ: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// A peer may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Memory windows may be bound to the region.
    pub const MW_BIND: Access = Access(sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0);
    /// On-demand paging.
    pub const ON_DEMAND: Access = Access(sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0);
    /// Relaxed ordering of PCI writes.
    pub const RELAXED_ORDERING: Access =
        Access(sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0);
    /// Local write and every remote access: what most RDMA programs register with.
    pub const ALL_REMOTE: Access = Access(
        Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0,
    );

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Flags from raw bits.
    pub fn from_bits(bits: u32) -> Access {
        Access(bits)
    }

    /// True when every flag of `other` is set.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: &[(Access, &str)] = &[
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
            (Access::MW_BIND, "MW_BIND"),
            (Access::ON_DEMAND, "ON_DEMAND"),
            (Access::RELAXED_ORDERING, "RELAXED_ORDERING"),
        ];
        let names: Vec<&str> = NAMES
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name)
            .collect();
        write!(f, "Access({})", names.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_combine_and_print() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
        assert!(a.contains(Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_WRITE));
        assert_eq!(format!("{a:?}"), "Access(LOCAL_WRITE | REMOTE_READ)");
        assert!(Access::ALL_REMOTE.contains(a));
    }
}

//! The path MTU as a type: `ibv_mtu`'s codes 1 to 5 (256 to 4096 bytes), with the
//! conversions the wire formats and tools need (code, bytes, the raw enum).

use rdma_verbs_sys as sys;

/// A path MTU (`ibv_mtu`).
///
/// ```
/// use rdma_safe::Mtu;
/// assert_eq!(Mtu::from_bytes(1024), Some(Mtu::B1024));
/// assert_eq!(Mtu::B1024.code(), 3);
/// assert_eq!(Mtu::from_code(9), None);
/// let raw: rdma_safe::sys::ibv_mtu = Mtu::B4096.into();
/// assert_eq!(Mtu::from_sys(raw), Some(Mtu::B4096));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (code 1).
    B256 = 1,
    /// 512 bytes (code 2).
    B512 = 2,
    /// 1024 bytes (code 3).
    B1024 = 3,
    /// 2048 bytes (code 4).
    B2048 = 4,
    /// 4096 bytes (code 5).
    B4096 = 5,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [Mtu::B256, Mtu::B512, Mtu::B1024, Mtu::B2048, Mtu::B4096];

    /// The MTU of an `ibv_mtu` code (1 = 256 .. 5 = 4096), as wire formats carry it.
    pub fn from_code(code: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.code() == code)
    }

    /// The MTU of this many bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The MTU a raw `ibv_mtu` names; `None` for a value outside 1..=5.
    pub fn from_sys(raw: sys::ibv_mtu) -> Option<Mtu> {
        Mtu::from_code(raw.0)
    }

    /// Its `ibv_mtu` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Its size in bytes.
    pub fn bytes(self) -> u32 {
        128 << self.code()
    }
}

impl From<Mtu> for sys::ibv_mtu {
    fn from(m: Mtu) -> sys::ibv_mtu {
        sys::ibv_mtu(m.code())
    }
}

impl std::fmt::Display for Mtu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_bytes_and_the_raw_enum_agree() {
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_code(m.code()), Some(m));
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
            assert_eq!(Mtu::from_sys(m.into()), Some(m));
        }
        assert_eq!(sys::ibv_mtu::from(Mtu::B2048), sys::ibv_mtu::IBV_MTU_2048);
        assert_eq!(Mtu::B256.bytes(), 256);
        assert_eq!(Mtu::B4096.to_string(), "4096");
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
        assert_eq!(Mtu::from_bytes(1500), None);
    }
}

//! Global identifiers (GIDs): the 128-bit addresses of RoCE and routed InfiniBand.

use rdma_verbs_sys as sys;
use std::fmt;
use std::net::Ipv6Addr;

/// A 16-byte GID, in network order as on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// True when every byte is zero (an unused table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// True for `::ffff:a.b.c.d`, the RoCE v2 form of an IPv4 address.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10..12] == [0xff, 0xff]
    }

    /// The interface id (last 8 bytes) is zero: `ibv_rc_pingpong` then sends no GRH.
    pub fn interface_id_is_zero(&self) -> bool {
        self.0[8..] == [0; 8]
    }

    /// The GID as the bindings' union.
    pub fn to_raw(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

/// `fe80:0000:0000:0000:5054:00ff:fe12:3456`, as `ibv_devinfo -v` prints GIDs.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}

/// The protocol a GID entry is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// Native InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1,
    /// RoCE v2 (UDP/IP; routable).
    RoceV2,
    /// A value this crate does not know.
    Other(u32),
}

impl GidType {
    fn from_raw(raw: sys::ibv_gid_type) -> Self {
        match raw {
            sys::IBV_GID_TYPE_IB => GidType::Ib,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            other => GidType::Other(other),
        }
    }
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table (what `sgid_index` and perftest's `-x` take).
    pub index: u32,
    /// The port, from 1.
    pub port: u32,
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// The network interface it belongs to (RoCE), or 0.
    pub ifindex: u32,
}

impl GidEntry {
    pub(crate) fn from_raw(raw: &sys::ibv_gid_entry) -> Self {
        GidEntry {
            // SAFETY: every bit pattern of the union is a valid `raw` array.
            gid: Gid(unsafe { raw.gid.raw }),
            index: raw.gid_index,
            port: raw.port_num,
            gid_type: GidType::from_raw(raw.gid_type),
            ifindex: raw.ndev_ifindex,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_ibv_devinfo() {
        let gid = Gid::from("::ffff:198.18.0.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:c612:0001");
        assert!(gid.is_ipv4_mapped());
        assert!(!gid.interface_id_is_zero());
        assert!(Gid::default().is_zero());
    }
}

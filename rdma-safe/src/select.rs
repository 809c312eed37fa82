//! Which device, port and GID to use, in one place: what a program was told (its
//! flags), else the environment (`RDMA_DEVICE`, `RDMA_GID_INDEX`), else the first
//! device and, on Ethernet, the first RoCE v2 IPv4 GID.
//!
//! A program reads the environment ([`Selection::from_env`]); a library takes
//! the values from its own configuration and builds a [`Selection`] directly.

use crate::context::{Context, PortAttr};
use crate::error::Result;
use crate::gid::Gid;
use std::sync::Arc;

/// Environment variable naming the device.
pub const DEVICE_ENV: &str = "RDMA_DEVICE";
/// Environment variable naming the GID index.
pub const GID_INDEX_ENV: &str = "RDMA_GID_INDEX";

/// A choice of device, port and GID index; `None` leaves it to [`Selection::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// Device name (`None`: the first device).
    pub device: Option<String>,
    /// Port number (1 on most devices).
    pub port: u8,
    /// GID index (`None`: on Ethernet the first RoCE v2 IPv4 GID, on InfiniBand
    /// none: addressing by LID).
    pub gid_index: Option<u32>,
}

/// What [`Selection::open`] found.
pub struct Selected {
    /// The open device.
    pub ctx: Arc<Context>,
    /// The port's attributes.
    pub port: PortAttr,
    /// The port number.
    pub port_num: u8,
    /// The GID index to use, and its GID (`None` on InfiniBand without one chosen).
    pub gid: Option<(u32, Gid)>,
}

impl Selection {
    /// `device` and `gid_index` as given, each falling back on its environment
    /// variable ([`DEVICE_ENV`], [`GID_INDEX_ENV`]; an unparsable index counts as
    /// unset). For programs: a library must not read the environment.
    pub fn from_env(device: Option<String>, port: u8, gid_index: Option<u32>) -> Selection {
        Selection {
            device: device.or_else(|| std::env::var(DEVICE_ENV).ok()),
            port,
            gid_index: gid_index.or_else(|| std::env::var(GID_INDEX_ENV).ok()?.parse().ok()),
        }
    }

    /// Opens the device and queries the port; picks the GID: the chosen index, else
    /// on Ethernet [`Context::default_gid_index`], else none.
    pub fn open(&self) -> Result<Selected> {
        let ctx = Context::open(self.device.as_deref())?;
        let port = ctx.query_port(self.port)?;
        let index = match self.gid_index {
            Some(i) => Some(i),
            None if port.is_ethernet() => Some(ctx.default_gid_index(self.port)?),
            None => None,
        };
        let gid = index
            .map(|i| ctx.query_gid(self.port, i).map(|g| (i, g)))
            .transpose()?;
        Ok(Selected {
            ctx,
            port,
            port_num: self.port,
            gid,
        })
    }
}

impl Selected {
    /// The GID index, if one is used.
    pub fn gid_index(&self) -> Option<u32> {
        self.gid.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_environment() {
        // The variables may be set by whoever runs the tests: a given value wins.
        let s = Selection::from_env(Some("mlx5_0".into()), 2, Some(3));
        assert_eq!(
            s,
            Selection {
                device: Some("mlx5_0".into()),
                port: 2,
                gid_index: Some(3)
            }
        );
    }
}

//! What the KIARA programs share: the flags that choose the RDMA device.

use kiara_ib::Config;

/// `-d/--device`, `--ib-port` and `-x/--gid-index`, each falling back on
/// `RDMA_DEVICE` and `RDMA_GID_INDEX` as the other ports do (the library itself
/// never reads the environment). Flatten it into a program's arguments:
///
/// ```
/// use clap::Parser;
///
/// #[derive(Parser)]
/// struct Args {
///     #[command(flatten)]
///     device: examples::kiara::DeviceArgs,
/// }
///
/// let args = Args::parse_from(["prog", "-d", "rxe0", "-x", "1"]);
/// let config = args.device.config();
/// assert_eq!(config.device.as_deref(), Some("rxe0"));
/// assert_eq!(config.gid_index, Some(1));
/// ```
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// RDMA device (default: RDMA_DEVICE or the first).
    #[arg(short = 'd', long)]
    pub device: Option<String>,
    /// Port of the device.
    #[arg(long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// GID index (default: RDMA_GID_INDEX or the first RoCE v2 IPv4 GID).
    #[arg(short = 'x', long)]
    pub gid_index: Option<u32>,
    /// The queue pairs' local ACK timeout code, 4.096 us x 2^N (perftest's `-u`,
    /// `Config::rc_timeout`).
    #[arg(short = 'u', long, default_value_t = 14)]
    pub qp_timeout: u8,
    /// Confirm the queue pair alive after every RDMA READ before the message
    /// counts (`Config::confirm_reads`; default: on for Soft-RoCE only).
    #[arg(long)]
    pub confirm_reads: Option<bool>,
}

impl DeviceArgs {
    /// The default configuration with this device, port and GID index.
    pub fn config(&self) -> Config {
        let sel = rdma_safe::Selection::from_env(self.device.clone(), self.ib_port, self.gid_index);
        Config {
            device: sel.device,
            port: sel.port,
            gid_index: sel.gid_index,
            rc_timeout: self.qp_timeout,
            confirm_reads: self.confirm_reads,
            ..Config::default()
        }
    }
}

//! `ibv_devinfo`: prints the attributes of the RDMA devices, as rdma-core's tool does.
//!
//! ```text
//! ibv_devinfo [-d <dev>] [-i <port>] [-l] [-v]
//! ```
//! The output has the same lines, names and tab layout as the C program, so scripts
//! that read one read the other.

use clap::Parser;
use rdma_safe::sys;
use rdma_safe::{Context, DeviceList, GidType, Result};
use std::process::ExitCode;

/// Command line of rdma-core's `ibv_devinfo`. Like C's getopt, it has no `-h`:
/// an option it does not know prints the usage and exits 255.
#[derive(Parser, Debug)]
#[command(name = "ibv_devinfo", disable_help_flag = true, infer_long_args = true)]
struct Args {
    /// The device to show (default: all).
    #[arg(short = 'd', long = "ib-dev", allow_hyphen_values = true)]
    ib_dev: Option<String>,
    /// The port to show (default: all), read as C's `strtol(.., 0)` does.
    #[arg(short = 'i', long = "ib-port", allow_hyphen_values = true)]
    ib_port: Option<String>,
    /// print only the IB devices names
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// print all the attributes of the IB device(s)
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// Words that are not options: C's getopt leaves them, and the program
    /// ignores them.
    #[arg(hide = true)]
    _operands: Vec<String>,
}

/// The name the program was started by, which C's messages use (`argv[0]`).
fn argv0() -> String {
    std::env::args()
        .next()
        .unwrap_or_else(|| "ibv_devinfo".into())
}

/// C's usage text, which it prints on standard output.
fn usage() {
    println!("Usage: {}             print the ca attributes", argv0());
    println!();
    println!("Options:");
    println!("  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)");
    println!("  -i, --ib-port=<port>   use port <port> of IB device (default all ports)");
    println!("  -l, --list             print only the IB devices names");
    println!("  -v, --verbose          print all the attributes of the IB device(s)");
}

/// C's exit statuses: 255 for a bad option or no device (its `return -1`), 1 for a
/// port number that is not positive, and otherwise the per-device codes
/// (`print_device`) of every device shown, OR-ed together.
fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "{}",
                examples::c_args::getopt_message(
                    &argv0(),
                    &e,
                    std::env::args().next_back().as_deref()
                )
            );
            usage();
            return ExitCode::from(255);
        }
    };
    // C keeps the number in an int and hands it on as a uint8_t: 256 means all
    // ports again, as it does there.
    let port = match args
        .ib_port
        .as_deref()
        .map(|s| examples::c_args::strtol(s) as i32)
    {
        Some(n) if n <= 0 => {
            usage();
            return ExitCode::from(1);
        }
        Some(n) => n as u8,
        None => 0,
    };
    match run(&args, port) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("Failed to get IB devices list: {err}");
            ExitCode::from(255)
        }
    }
}

/// Prints what the command line asks for; the exit status as C computes it.
fn run(args: &Args, port: u8) -> Result<u8> {
    let list = DeviceList::new()?;
    if args.list {
        let n = list.len();
        println!("{n} HCA{} found:", if n != 1 { "s" } else { "" });
        for dev in list.iter() {
            println!("\t{}", dev.name());
        }
        println!();
        return Ok(0);
    }
    let devices: Vec<_> = match &args.ib_dev {
        Some(name) => match list.find(Some(name)) {
            Ok(dev) => vec![dev],
            Err(_) => {
                eprintln!("IB device '{name}' wasn't found");
                return Ok(255);
            }
        },
        None if list.is_empty() => {
            eprintln!("No IB devices found");
            return Ok(255);
        }
        None => list.iter().collect(),
    };
    // As C does, a device that fails does not stop the others.
    let mut status = 0;
    for dev in devices {
        status |= match dev.open() {
            Ok(ctx) => print_device(&ctx, args.verbose, port),
            Err(_) => {
                eprintln!("Failed to open device");
                1
            }
        };
    }
    Ok(status)
}

fn guid(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

fn transport_name(t: sys::ibv_transport_type) -> &'static str {
    use sys::ibv_transport_type as T;
    match t {
        T::IBV_TRANSPORT_IB => "InfiniBand",
        T::IBV_TRANSPORT_IWARP => "iWARP",
        T::IBV_TRANSPORT_USNIC => "usNIC",
        T::IBV_TRANSPORT_USNIC_UDP => "usNIC UDP",
        T::IBV_TRANSPORT_UNSPECIFIED => "unspecified",
        _ => "invalid transport",
    }
}

fn mtu_name(m: sys::ibv_mtu) -> String {
    rdma_safe::Mtu::from_sys(m).map_or_else(|| "invalid MTU".to_string(), |m| m.to_string())
}

fn port_state_name(s: sys::ibv_port_state) -> &'static str {
    use sys::ibv_port_state as T;
    match s {
        T::IBV_PORT_DOWN => "PORT_DOWN",
        T::IBV_PORT_INIT => "PORT_INIT",
        T::IBV_PORT_ARMED => "PORT_ARMED",
        T::IBV_PORT_ACTIVE => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn link_layer_name(l: u8) -> &'static str {
    match l as u32 {
        sys::IBV_LINK_LAYER_UNSPECIFIED | sys::IBV_LINK_LAYER_INFINIBAND => "InfiniBand",
        sys::IBV_LINK_LAYER_ETHERNET => "Ethernet",
        _ => "Unknown",
    }
}

fn atomic_name(a: sys::ibv_atomic_cap) -> &'static str {
    match a {
        sys::IBV_ATOMIC_NONE => "ATOMIC_NONE",
        sys::IBV_ATOMIC_HCA => "ATOMIC_HCA",
        sys::IBV_ATOMIC_GLOB => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

fn width_name(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

fn speed_name(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

fn vl_name(v: u8) -> &'static str {
    match v {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

/// Names of the `IBV_DEVICE_*` capability bits, in the order the C tool prints them.
const CAP_FLAGS: &[(u32, &str)] = &[
    (1 << 0, "RESIZE_MAX_WR"),
    (1 << 1, "BAD_PKEY_CNTR"),
    (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"),
    (1 << 4, "AUTO_PATH_MIG"),
    (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"),
    (1 << 7, "CURR_QP_STATE_MOD"),
    (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"),
    (1 << 10, "PORT_ACTIVE_EVENT"),
    (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 13, "SRQ_RESIZE"),
    (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 18, "UD_IP_CSUM"),
    (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"),
    (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
    (1 << 25, "RC_IP_CSUM"),
    (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"),
];

fn print_cap_flags(flags: u32) {
    let mut known = 0;
    for &(bit, name) in CAP_FLAGS {
        known |= bit;
        if flags & bit != 0 {
            println!("\t\t\t\t\t{name}");
        }
    }
    if flags & !known != 0 {
        println!("\t\t\t\t\tUnknown flags: 0x{:X}", flags & !known);
    }
}

fn print_odp_transport(caps: u32) {
    const NAMES: &[(u32, &str)] = &[
        (1 << 0, "SUPPORT_SEND"),
        (1 << 1, "SUPPORT_RECV"),
        (1 << 2, "SUPPORT_WRITE"),
        (1 << 3, "SUPPORT_READ"),
        (1 << 4, "SUPPORT_ATOMIC"),
        (1 << 5, "SUPPORT_SRQ"),
    ];
    if caps == 0 {
        println!("\t\t\t\t\tNO SUPPORT");
        return;
    }
    for &(bit, name) in NAMES {
        if caps & bit != 0 {
            println!("\t\t\t\t\t{name}");
        }
    }
    if caps & !0x3f != 0 {
        println!("\t\t\t\t\tUnknown flags: 0x{:X}", caps & !0x3f);
    }
}

/// One device's lines; C's status for it: 0, 2 when the device cannot be
/// queried, 4 for a port it does not have (`port`, 0 for all), a port query's
/// errno, 255 when its GIDs cannot be read.
fn print_device(ctx: &Context, verbose: bool, port: u8) -> u8 {
    let Ok(attr) = ctx.query_device() else {
        eprintln!("Failed to query device props");
        return 2;
    };
    let a = attr.raw();
    if port > a.phys_port_cnt {
        eprintln!("Invalid port requested for device");
        // C: "rc = 3 is taken by failure to clean up".
        return 4;
    }
    let transport = ctx.transport();
    print_device_summary(ctx, &attr);
    if verbose {
        print_verbose_device(&attr);
        let vectors = ctx.num_comp_vectors();
        println!("\tnum_comp_vectors:\t\t{vectors}");
    }
    for p in 1..=a.phys_port_cnt {
        if port != 0 && p != port {
            continue;
        }
        let attr = match ctx.query_port(p) {
            Ok(attr) => attr.0,
            Err(e) => {
                eprintln!("Failed to query port {p} props");
                return e.errno().map_or(1, |n| n as u8);
            }
        };
        print_port(p, &attr);
        if verbose {
            let Ok(gids) = ctx.gid_table() else {
                eprintln!("Failed to query gid to port {p}");
                return 255;
            };
            print_verbose_port(p, &attr, transport, &gids);
        }
        println!();
    }
    0
}

/// The device's lines of the short listing: name, transport, firmware, GUIDs, ids.
fn print_device_summary(ctx: &Context, attr: &rdma_safe::DeviceAttr) {
    let a = attr.raw();
    let transport = ctx.transport();
    println!("hca_id:\t{}", ctx.name());
    println!(
        "\ttransport:\t\t\t{} ({})",
        transport_name(transport),
        transport.0
    );
    let fw = attr.fw_ver();
    if !fw.is_empty() {
        println!("\tfw_ver:\t\t\t\t{fw}");
    }
    println!("\tnode_guid:\t\t\t{}", guid(attr.node_guid()));
    println!("\tsys_image_guid:\t\t\t{}", guid(attr.sys_image_guid()));
    println!("\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    println!("\thw_ver:\t\t\t\t0x{:X}", a.hw_ver);
    let board = format!("/sys/class/infiniband/{}/board_id", ctx.name());
    if let Ok(text) = std::fs::read_to_string(board) {
        let text = text.trim_end_matches('\n');
        if !text.is_empty() {
            println!("\tboard_id:\t\t\t{text}");
        }
    }
    println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
}

/// A port's lines of the short listing.
fn print_port(port: u8, p: &sys::ibv_port_attr) {
    println!("\t\tport:\t{port}");
    println!(
        "\t\t\tstate:\t\t\t{} ({})",
        port_state_name(p.state),
        p.state.0
    );
    println!(
        "\t\t\tmax_mtu:\t\t{} ({})",
        mtu_name(p.max_mtu),
        p.max_mtu.0
    );
    println!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        mtu_name(p.active_mtu),
        p.active_mtu.0
    );
    println!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    println!("\t\t\tport_lid:\t\t{}", p.lid);
    println!("\t\t\tport_lmc:\t\t0x{:02x}", p.lmc);
    println!("\t\t\tlink_layer:\t\t{}", link_layer_name(p.link_layer));
}

/// A port's further lines with `-v`, its GID table last.
fn print_verbose_port(
    port: u8,
    p: &sys::ibv_port_attr,
    transport: sys::ibv_transport_type,
    gids: &[rdma_safe::GidEntry],
) {
    println!("\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
    println!("\t\t\tport_cap_flags:\t\t0x{:08x}", p.port_cap_flags);
    println!("\t\t\tport_cap_flags2:\t0x{:04x}", p.port_cap_flags2);
    println!(
        "\t\t\tmax_vl_num:\t\t{} ({})",
        vl_name(p.max_vl_num),
        p.max_vl_num
    );
    println!("\t\t\tbad_pkey_cntr:\t\t0x{:x}", p.bad_pkey_cntr);
    println!("\t\t\tqkey_viol_cntr:\t\t0x{:x}", p.qkey_viol_cntr);
    println!("\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
    println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
    println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
    println!("\t\t\tsubnet_timeout:\t\t{}", p.subnet_timeout);
    println!("\t\t\tinit_type_reply:\t{}", p.init_type_reply);
    println!(
        "\t\t\tactive_width:\t\t{}X ({})",
        width_name(p.active_width),
        p.active_width
    );
    println!(
        "\t\t\tactive_speed:\t\t{} ({})",
        speed_name(p.active_speed),
        p.active_speed
    );
    if transport == sys::ibv_transport_type::IBV_TRANSPORT_IB {
        println!(
            "\t\t\tphys_state:\t\t{} ({})",
            phys_state_name(p.phys_state),
            p.phys_state
        );
    }
    let ethernet = p.link_layer as u32 == sys::IBV_LINK_LAYER_ETHERNET;
    for entry in gids.iter().filter(|e| e.port == port as u32) {
        print_gid(entry, ethernet);
    }
}

/// One GID line as rdma-core 44 prints it: RoCE v2 entries as an IPv6 address,
/// others in hex; on Ethernet the type follows.
fn print_gid(entry: &rdma_safe::GidEntry, ethernet: bool) {
    let index = entry.index;
    match entry.gid_type {
        GidType::RoceV2 => {
            let addr = std::net::Ipv6Addr::from(entry.gid);
            println!("\t\t\tGID[{index:>3}]:\t\t{addr}, RoCE v2");
        }
        _ => {
            let suffix = if ethernet { ", RoCE v1" } else { "" };
            println!("\t\t\tGID[{index:>3}]:\t\t{}{suffix}", entry.gid);
        }
    }
}

fn phys_state_name(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

/// The device's further lines with `-v`, in rdma-core 44's order.
fn print_verbose_device(attr: &rdma_safe::DeviceAttr) {
    print_device_limits(attr.raw());
    print_odp_caps(&attr.0);
    print_offload_caps(&attr.0);
    print_rss_and_later_caps(&attr.0);
}

/// The limits of `ibv_query_device`.
fn print_device_limits(a: &sys::ibv_device_attr) {
    println!("\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
    println!("\tpage_size_cap:\t\t\t0x{:x}", a.page_size_cap);
    println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    println!("\tdevice_cap_flags:\t\t0x{:08x}", a.device_cap_flags);
    print_cap_flags(a.device_cap_flags);
    println!("\tmax_sge:\t\t\t{}", a.max_sge);
    println!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
    println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
    println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
    println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    println!("\tmax_ee_rd_atom:\t\t\t{}", a.max_ee_rd_atom);
    println!("\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    println!("\tmax_ee_init_rd_atom:\t\t{}", a.max_ee_init_rd_atom);
    println!(
        "\tatomic_cap:\t\t\t{} ({})",
        atomic_name(a.atomic_cap),
        a.atomic_cap
    );
    println!("\tmax_ee:\t\t\t\t{}", a.max_ee);
    println!("\tmax_rdd:\t\t\t{}", a.max_rdd);
    println!("\tmax_mw:\t\t\t\t{}", a.max_mw);
    println!("\tmax_raw_ipv6_qp:\t\t{}", a.max_raw_ipv6_qp);
    println!("\tmax_raw_ethy_qp:\t\t{}", a.max_raw_ethy_qp);
    println!("\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
    println!("\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
    println!(
        "\tmax_total_mcast_qp_attach:\t{}",
        a.max_total_mcast_qp_attach
    );
    println!("\tmax_ah:\t\t\t\t{}", a.max_ah);
    println!("\tmax_fmr:\t\t\t{}", a.max_fmr);
    if a.max_fmr != 0 {
        println!("\tmax_map_per_fmr:\t\t{}", a.max_map_per_fmr);
    }
    println!("\tmax_srq:\t\t\t{}", a.max_srq);
    if a.max_srq != 0 {
        println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    }
    println!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
    println!("\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
}

/// On-demand paging: general, then per transport.
fn print_odp_caps(ex: &sys::ibv_device_attr_ex) {
    println!("\tgeneral_odp_caps:");
    if ex.odp_caps.general_caps & 1 != 0 {
        println!("\t\t\t\t\tODP_SUPPORT");
    }
    if ex.odp_caps.general_caps & 2 != 0 {
        println!("\t\t\t\t\tODP_SUPPORT_IMPLICIT");
    }
    let per = &ex.odp_caps.per_transport_caps;
    for (name, caps) in [
        ("rc", per.rc_odp_caps),
        ("uc", per.uc_odp_caps),
        ("ud", per.ud_odp_caps),
        ("xrc", ex.xrc_odp_caps),
    ] {
        println!("\t{name}_odp_caps:");
        print_odp_transport(caps);
    }
}

/// Timestamps, clock, raw packet and extended flags, TSO.
fn print_offload_caps(ex: &sys::ibv_device_attr_ex) {
    if ex.completion_timestamp_mask != 0 {
        println!(
            "\tcompletion timestamp_mask:\t\t\t0x{:016x}",
            ex.completion_timestamp_mask
        );
    } else {
        println!("\tcompletion_timestamp_mask not supported");
    }
    if ex.hca_core_clock != 0 {
        println!("\thca_core_clock:\t\t\t{}kHZ", ex.hca_core_clock);
    } else {
        println!("\tcore clock not supported");
    }
    if ex.raw_packet_caps != 0 {
        println!("\traw packet caps:");
        for (bit, name) in [
            (1, "C-VLAN stripping offload"),
            (2, "Scatter FCS offload"),
            (4, "IP csum offload"),
            (8, "Delay drop"),
        ] {
            if ex.raw_packet_caps & bit != 0 {
                println!("\t\t\t\t\t{name}");
            }
        }
    }
    println!("\tdevice_cap_flags_ex:\t\t0x{:X}", ex.device_cap_flags_ex);
    let flags_ex = ex.device_cap_flags_ex & 0xffff_ffff_0000_0000;
    for (bit, name) in [
        (1u64 << 32, "RAW_SCATTER_FCS"),
        (1 << 36, "PCI_WRITE_END_PADDING"),
    ] {
        if flags_ex & bit != 0 {
            println!("\t\t\t\t\t{name}");
        }
    }
    println!("\ttso_caps:");
    println!("\t\tmax_tso:\t\t\t{}", ex.tso_caps.max_tso);
    if ex.tso_caps.max_tso != 0 {
        print_supported_qpts("\t\t", ex.tso_caps.supported_qpts);
    }
}

/// RSS, work queues, packet pacing, tag matching, CQ moderation, device memory.
fn print_rss_and_later_caps(ex: &sys::ibv_device_attr_ex) {
    let rss = &ex.rss_caps;
    println!("\trss_caps:");
    println!(
        "\t\tmax_rwq_indirection_tables:\t\t\t{}",
        rss.max_rwq_indirection_tables
    );
    println!(
        "\t\tmax_rwq_indirection_table_size:\t\t\t{}",
        rss.max_rwq_indirection_table_size
    );
    println!("\t\trx_hash_function:\t\t\t\t0x{:x}", rss.rx_hash_function);
    println!(
        "\t\trx_hash_fields_mask:\t\t\t\t0x{:X}",
        rss.rx_hash_fields_mask
    );
    if rss.supported_qpts != 0 {
        print_supported_qpts("\t\t", rss.supported_qpts);
    }
    println!("\tmax_wq_type_rq:\t\t\t{}", ex.max_wq_type_rq);
    let pacing = &ex.packet_pacing_caps;
    println!("\tpacket_pacing_caps:");
    println!("\t\tqp_rate_limit_min:\t{}kbps", pacing.qp_rate_limit_min);
    println!("\t\tqp_rate_limit_max:\t{}kbps", pacing.qp_rate_limit_max);
    if pacing.qp_rate_limit_max != 0 {
        print_supported_qpts("\t\t", pacing.supported_qpts);
    }
    let tm = &ex.tm_caps;
    if tm.max_num_tags != 0 {
        println!("\tmax_rndv_hdr_size:\t\t{}", tm.max_rndv_hdr_size);
        println!("\tmax_num_tags:\t\t\t{}", tm.max_num_tags);
        println!("\tmax_ops:\t\t\t{}", tm.max_ops);
        println!("\tmax_sge:\t\t\t{}", tm.max_sge);
        println!("\tflags:");
        if tm.flags & 1 != 0 {
            println!("\t\t\t\t\tIBV_TM_CAP_RC");
        }
    } else {
        println!("\ttag matching not supported");
    }
    let cq_mod = &ex.cq_mod_caps;
    if cq_mod.max_cq_count != 0 && cq_mod.max_cq_period != 0 {
        println!("\n\tcq moderation caps:");
        println!("\t\tmax_cq_count:\t{}", cq_mod.max_cq_count);
        println!("\t\tmax_cq_period:\t{} us\n", cq_mod.max_cq_period);
    }
    if ex.max_dm_size != 0 {
        println!(
            "\tmaximum available device memory:\t{}Bytes\n",
            ex.max_dm_size
        );
    }
}

/// The `supported_qp:` list of the TSO, RSS and packet pacing capabilities.
fn print_supported_qpts(indent: &str, qpts: u32) {
    let raw_packet = 1 << sys::ibv_qp_type::IBV_QPT_RAW_PACKET.0;
    let ud = 1 << sys::ibv_qp_type::IBV_QPT_UD.0;
    println!("{indent}supported_qp:");
    if qpts & raw_packet != 0 {
        println!("\t\t\t\t\tSUPPORT_RAW_PACKET");
    }
    if qpts & ud != 0 {
        println!("\t\t\t\t\tSUPPORT_UD");
    }
    if qpts & !(raw_packet | ud) != 0 {
        println!("\t\t\t\t\tUnknown flags: 0x{:X}", qpts & !(raw_packet | ud));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of rdma-core 44's `ibv_devinfo` (Debian's), which scripts read.
    #[test]
    fn speeds_and_transports_are_named_as_rdma_core_44_names_them() {
        assert_eq!(speed_name(64), "50.0 Gbps");
        assert_eq!(speed_name(128), "100.0 Gbps");
        assert_eq!(speed_name(3), "invalid speed");
        let unspecified = sys::ibv_transport_type::IBV_TRANSPORT_UNSPECIFIED;
        assert_eq!(transport_name(unspecified), "unspecified");
        assert_eq!(
            transport_name(sys::ibv_transport_type::IBV_TRANSPORT_IB),
            "InfiniBand"
        );
    }
}

//! How much perftest sends inline (`ctx_set_max_inline`), which depends on
//! whether it recognizes the device (`ib_dev_name`): pure code.
//!
//! On a device perftest does not know (Soft-RoCE and siw among them) it sends
//! nothing inline, and says so when it was asked to (`-I`, or a READ test); on one
//! it knows, a latency test sends up to 220 bytes (WRITE) or 236 (SEND) inline
//! unless `-I` says otherwise, and a bandwidth test nothing.

use super::params::{Params, TestKind, Verb};

/// perftest's warning on stderr when it turns inline data off (after a dashed
/// line on stdout).
pub const NOT_RECOGNIZED: &str = "Device not recognized to implement inline feature. Disabling it";

/// The largest `-I` perftest accepts (`MAX_INLINE`).
pub const MAX_INLINE: u32 = 912;

/// A device as `ib_dev_name` sees it, as far as inline data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Not in perftest's table: no inline data.
    Unknown,
    /// A device perftest knows, with the default inline sizes.
    Known,
    /// Broadcom NetXtreme: 96 bytes inline in latency tests.
    NetXtreme,
    /// Amazon EFA: 32 bytes.
    Efa,
    /// QLogic FastLinQ (E4): 128 bytes.
    QlogicE4,
}

impl Family {
    /// The family of a device by its vendor and part numbers (`ibv_device_attr`).
    pub fn of(vendor_id: u32, vendor_part_id: u32) -> Family {
        match (vendor_id, vendor_part_id) {
            // Chelsio.
            (5157, part) if matches!(part >> 12, 4 | 5 | 6 | 10 | 11) => Family::Known,
            (5157, _) => Family::Unknown,
            (0x8086, _) => Family::Known,
            (_, 5684 | 5700 | 5716 | 5718 | 5734) => Family::QlogicE4,
            (_, 61344 | 61345) => Family::Efa,
            (
                _,
                5638
                | 5652
                | 5824
                | 5825
                | 5827
                | 5839
                | 5846..=5849
                | 5855
                | 5858
                | 5859
                | 5861
                | 5867
                | 5869
                | 5871..=5873
                | 5968
                | 55296
                | 55298
                | 55300,
            ) => Family::NetXtreme,
            // ConnectX 1-7, Connect-IB, BlueField 1-3, Emulex Skyhawk, QLogic AH/AHP.
            (
                _,
                4099
                | 4100
                | 4103
                | 4104
                | 4113
                | 4115..=4127
                | 4129
                | 41682
                | 41683
                | 41686
                | 41692
                | 26418
                | 26428
                | 26438
                | 26448
                | 26458
                | 26468
                | 26478
                | 25408
                | 25418
                | 25428
                | 25448
                | 1824
                | 32880..=32883
                | 32912
                | 33136
                | 33168,
            ) => Family::Known,
            _ => Family::Unknown,
        }
    }
}

/// The inline size of a run on a device of `family`, and whether perftest warns
/// that it turned inline data off ([`NOT_RECOGNIZED`]).
pub fn max_inline(p: &Params, family: Family) -> (u32, bool) {
    let asked = match p.verb {
        // perftest's force_dependencies: READ never inlines, whatever -I says.
        Verb::Read => Some(0),
        _ => p.args.inline_size,
    };
    if family == Family::Unknown {
        return (0, asked.is_some());
    }
    if let Some(size) = asked {
        return (size, false);
    }
    let size = match (p.kind, p.verb, family) {
        (TestKind::Bw, _, _) => 0,
        (_, _, Family::NetXtreme) => 96,
        (_, _, Family::Efa) => 32,
        (_, _, Family::QlogicE4) => 128,
        (_, Verb::Write, _) => 220,
        (_, Verb::Send, _) => 236,
        (_, Verb::Read, _) => 0,
    };
    (size, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perftest::params::Args;
    use clap::Parser;

    fn params(verb: Verb, kind: TestKind, v: &[&str]) -> Params {
        let args = Args::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap();
        Params::new(verb, kind, args).unwrap()
    }

    #[test]
    fn families_follow_ib_dev_name() {
        // Soft-RoCE reports vendor 0xffffff, part 0; siw the same kind of numbers.
        assert_eq!(Family::of(0xff_ffff, 0), Family::Unknown);
        assert_eq!(Family::of(0x02c9, 4123), Family::Known); // ConnectX-6
        assert_eq!(Family::of(0x02c9, 4128), Family::Unknown); // not in the table
        assert_eq!(Family::of(0x02c9, 41692), Family::Known); // BlueField-3
        assert_eq!(Family::of(5157, 0x5401), Family::Known); // Chelsio T5
        assert_eq!(Family::of(5157, 0x7401), Family::Unknown);
        assert_eq!(Family::of(0x8086, 0), Family::Known);
        assert_eq!(Family::of(0x14e4, 5848), Family::NetXtreme);
        assert_eq!(Family::of(0x1d0f, 61345), Family::Efa);
        assert_eq!(Family::of(0x1077, 5718), Family::QlogicE4);
    }

    #[test]
    fn inline_sizes_follow_ctx_set_max_inline() {
        let lat = |verb, v: &[&str], f| max_inline(&params(verb, TestKind::Lat, v), f);
        let bw = |verb, v: &[&str], f| max_inline(&params(verb, TestKind::Bw, v), f);
        // Unknown device: nothing inline; a warning when inline was asked for.
        assert_eq!(lat(Verb::Send, &[], Family::Unknown), (0, false));
        assert_eq!(lat(Verb::Send, &["-I", "64"], Family::Unknown), (0, true));
        assert_eq!(bw(Verb::Read, &[], Family::Unknown), (0, true));
        assert_eq!(lat(Verb::Read, &[], Family::Unknown), (0, true));
        // Known device: latency defaults, -I as given, READ never.
        assert_eq!(lat(Verb::Write, &[], Family::Known), (220, false));
        assert_eq!(lat(Verb::Send, &[], Family::Known), (236, false));
        assert_eq!(lat(Verb::Send, &[], Family::NetXtreme), (96, false));
        assert_eq!(lat(Verb::Write, &[], Family::Efa), (32, false));
        assert_eq!(lat(Verb::Read, &[], Family::QlogicE4), (0, false));
        assert_eq!(bw(Verb::Write, &[], Family::Known), (0, false));
        assert_eq!(bw(Verb::Send, &["-I", "100"], Family::Known), (100, false));
        assert_eq!(bw(Verb::Read, &[], Family::Known), (0, false));
        // (-I on READ is refused before this, as perftest refuses it.)
    }
}

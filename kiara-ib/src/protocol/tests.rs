//! The wire format's tests: round trips, and every fault named, never a panic.

use super::*;

fn hello() -> Hello {
    Hello {
        qpn: 0x11,
        psn: 0x12_3456,
        lid: 0,
        mtu: 3,
        gid: Some([9; 16]),
        credits: 32,
        slot_size: 4096 + 104,
        max_message: 8 << 20,
        eager_threshold: 4096,
    }
}

const LIMITS: Limits = Limits {
    max_message: 1 << 20,
    eager_threshold: 64,
};

#[test]
fn hello_round_trip_and_every_truncation() {
    let bytes = hello().encode();
    let len = Hello::decode_header(bytes[..8].try_into().unwrap()).unwrap();
    assert_eq!(Hello::decode_body(&bytes[8..8 + len]).unwrap(), hello());
    for n in 0..HELLO_BODY_LEN {
        assert!(Hello::decode_body(&bytes[8..8 + n]).is_err());
    }
}

#[test]
fn seen_widens_to_the_nearest_id_sent() {
    assert_eq!(widen_seen(0, 0), 0);
    assert_eq!(widen_seen(7, 9), 7);
    assert_eq!(widen_seen(9, 9), 9);
    // Across a 2^32 boundary: the low bits of an id sent before it.
    let last = (1u64 << 32) + 5;
    assert_eq!(widen_seen(0xffff_fff0, last), 0xffff_fff0);
    assert_eq!(widen_seen(3, last), (1 << 32) + 3);
    // An id never sent cannot be named: it falls back below.
    assert_eq!(widen_seen(20, 10), 0);
}

#[test]
fn hello_faults_are_named() {
    let good = hello().encode();
    let cases: &[(usize, &[u8], &str)] = &[
        (0, b"ZMQ!", "not a KIARA peer"),
        (4, &[0, 1], "version mismatch: the peer speaks version 1"),
        (6, &[0, 3], "hello body of 3 bytes"),
        (8, &[1, 0, 0, 0], "QPN"),
        (18, &[7], "MTU code 7"),
        (19, &[2], "hello flags 0x02: unknown bits"),
        (
            36,
            &[0, 0, 0, 1],
            "hello credits 1 out of range: at least 8",
        ),
        (36, &[0, 0, 0x10, 1], "at most 4096"),
        (
            40,
            &[0, 0, 0, 8],
            "hello slot size 8 bytes out of range 104..=",
        ),
        (40, &[0, 0x10, 0, 1], "hello slot size 1048577 bytes"),
        (
            40,
            &[0, 0, 0x10, 0x67],
            "eager threshold 4096 bytes exceeds what",
        ),
        (44, &[0; 8], "hello largest message 0 bytes out of range"),
        (44, &[0, 0, 0, 0, 0x40, 0, 0, 1], "1..=1073741824"),
        (
            44,
            &[0, 0, 0, 0, 0, 0, 0x0f, 0xff],
            "exceeds its largest message",
        ),
    ];
    for (at, patch, expect) in cases {
        let mut b = good;
        b[*at..*at + patch.len()].copy_from_slice(patch);
        let e = Hello::decode_header(b[..8].try_into().unwrap())
            .and_then(|_| Hello::decode_body(&b[8..]))
            .unwrap_err();
        assert!(e.0.contains(expect), "patch at {at}: {e}");
    }
}

fn message(kind: Kind, h: Control, meta: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; CONTROL_HEADER_LEN];
    Control {
        meta_len: meta.len() as u8,
        ..h
    }
    .write_header(kind, &mut v);
    v.extend_from_slice(meta);
    v.extend_from_slice(payload);
    v
}

#[test]
fn control_round_trips() {
    let h = Control {
        credits: 5,
        msg_id: 77,
        len: 3,
        ..Default::default()
    };
    let bytes = message(Kind::Eager, h, b"meta", b"abc");
    let d = Control::decode(&bytes, &LIMITS).unwrap();
    assert_eq!(d.kind, Kind::Eager);
    assert_eq!((d.meta, d.payload), (&b"meta"[..], &b"abc"[..]));
    assert_eq!((d.header.credits, d.header.msg_id), (5, 77));

    let h = Control {
        msg_id: 1,
        len: 1000,
        addr: 0x1000,
        rkey: 0xabcd,
        ..Default::default()
    };
    let bytes = message(Kind::Data, h, b"", b"");
    let d = Control::decode(&bytes, &LIMITS).unwrap();
    assert_eq!(
        (d.header.addr, d.header.len, d.header.rkey),
        (0x1000, 1000, 0xabcd)
    );
    let ack = message(Kind::Ack, Control::default(), b"", b"");
    assert_eq!(Control::decode(&ack, &LIMITS).unwrap().kind, Kind::Ack);
}

#[test]
fn control_faults_are_named_never_panics() {
    let data = |len: u64, addr: u64| {
        message(
            Kind::Data,
            Control {
                len,
                addr,
                ..Default::default()
            },
            b"",
            b"",
        )
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1; 10], "truncated"),
        (
            {
                let mut m = data(10, 0);
                m[0] = 9;
                m
            },
            "unknown control message type 9",
        ),
        (data(2 << 20, 0), "exceeds the limit"),
        (data(0, 0), "0 bytes"),
        (data(16, u64::MAX - 3), "wraps around"),
        (
            {
                let mut m = data(10, 0);
                m.push(1);
                m
            },
            "stray bytes",
        ),
        (
            {
                let mut m = data(10, 0);
                m[1] = 200;
                m
            },
            "metadata of 200 bytes",
        ),
        (
            {
                let mut m = data(10, 0);
                m[1] = 8;
                m
            },
            "metadata bytes",
        ),
        (
            message(
                Kind::Eager,
                Control {
                    len: 100,
                    ..Default::default()
                },
                b"",
                &[0; 100],
            ),
            "eager threshold",
        ),
        (
            message(
                Kind::Eager,
                Control {
                    len: 5,
                    ..Default::default()
                },
                b"",
                b"abc",
            ),
            "announces 5 bytes but carries 3",
        ),
        (
            message(Kind::Ack, Control::default(), b"", b"x"),
            "unexpected bytes",
        ),
    ];
    for (bytes, expect) in cases {
        let e = Control::decode(&bytes, &LIMITS).unwrap_err();
        assert!(e.0.contains(expect), "{expect}: {e}");
    }
    // Random garbage of every length decodes to an error or a message, never a panic.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for len in 0..300 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = Control::decode(&bytes, &LIMITS);
    }
}

mod props {
    //! Property tests of the decoders: whatever a peer sends, decoding returns a
    //! value or an error that names what is wrong, never a panic; what the encoder
    //! writes decodes to itself.
    use super::super::*;
    use super::message;
    use proptest::prelude::*;

    /// Words every hello rejection contains one of: the field it names.
    const HELLO_REASONS: &[&str] = &[
        "not a KIARA peer",
        "protocol version mismatch",
        "hello body of",
        "hello truncated",
        "hello flags",
        "hello QPN",
        "hello PSN",
        "hello MTU code",
        "hello credits",
        "hello largest message",
        "hello slot size",
        "hello eager threshold",
    ];

    /// Words every control message rejection contains one of.
    const CONTROL_REASONS: &[&str] = &[
        "control message truncated",
        "unknown control message type",
        "metadata of",
        "eager message of",
        "eager message announces",
        "data descriptor of 0 bytes",
        "exceeds the limit",
        "wraps around",
        "stray bytes after a data descriptor",
        "unexpected bytes",
    ];

    fn named(e: &ProtocolError, reasons: &[&str]) -> bool {
        reasons.iter().any(|r| e.0.contains(r))
    }

    /// Decodes a whole hello (header, then body) as `read_hello` does.
    fn decode_hello(bytes: &[u8]) -> Result<Hello, ProtocolError> {
        let Some(header) = bytes.get(..HELLO_HEADER_LEN) else {
            return err(format!("hello truncated: {} header bytes", bytes.len()));
        };
        let len = Hello::decode_header(header.try_into().expect("8 bytes"))?;
        let body = &bytes[HELLO_HEADER_LEN..];
        Hello::decode_body(&body[..len.min(body.len())])
    }

    prop_compose! {
        /// A hello within every bound.
        fn valid_hello()(
            qpn in 0..=0xff_ffffu32,
            psn in 0..=0xff_ffffu32,
            lid in any::<u16>(),
            mtu in 1..=5u8,
            gid in proptest::option::of(any::<[u8; 16]>()),
            credits in MIN_CREDITS..=MAX_CREDITS,
            max_message in 1..=MAX_MESSAGE,
            slot_size in SLOT_OVERHEAD as u32..=MAX_SLOT_SIZE as u32,
            eager_pick in any::<u32>(),
        ) -> Hello {
            let room = u64::from(slot_size) - SLOT_OVERHEAD as u64;
            let eager_max = room.min(max_message);
            let eager_threshold = (u64::from(eager_pick) % (eager_max + 1)) as u32;
            Hello {
                qpn, psn, lid, mtu, gid, credits, slot_size, max_message,
                eager_threshold,
            }
        }
    }

    fn limits() -> impl Strategy<Value = Limits> {
        (1..=MAX_MESSAGE, 0..=4096u32).prop_map(|(max_message, eager_threshold)| Limits {
            max_message,
            eager_threshold,
        })
    }

    prop_compose! {
        /// A control message that `limits` accepts, with its parts.
        fn valid_control(limits: Limits)(
            kind in prop_oneof![
                Just(Kind::Data), Just(Kind::Eager), Just(Kind::Ack),
                Just(Kind::Credit), Just(Kind::Bye),
            ],
            credits in any::<u32>(),
            msg_id in any::<u64>(),
            pick in any::<u64>(),
            addr_pick in any::<u64>(),
            rkey in any::<u32>(),
            seen in any::<u32>(),
            meta in proptest::collection::vec(any::<u8>(), 0..=MAX_META_LEN),
            payload_seed in any::<u8>(),
        ) -> (Kind, Control, Vec<u8>, Vec<u8>) {
            let mut h = Control { credits, msg_id, rkey, seen, ..Default::default() };
            let mut payload = Vec::new();
            let mut meta = meta;
            match kind {
                Kind::Data => {
                    h.len = 1 + pick % limits.max_message;
                    h.addr = addr_pick % (u64::MAX - h.len + 1);
                }
                Kind::Eager => {
                    h.len = pick % (u64::from(limits.eager_threshold) + 1);
                    payload = (0..h.len).map(|i| payload_seed ^ i as u8).collect();
                }
                Kind::Ack | Kind::Credit | Kind::Bye => {
                    h.len = pick;
                    h.addr = addr_pick;
                    meta.clear();
                }
            }
            h.kind = Some(kind);
            h.meta_len = meta.len() as u8;
            (kind, h, meta, payload)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_bytes_decode_to_a_hello_or_a_named_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            real_magic in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if real_magic && bytes.len() >= 8 {
                // Past the magic and version, so the body checks are reached.
                bytes[..6].copy_from_slice(b"KIAR\x00\x02");
            }
            if let Err(e) = decode_hello(&bytes) {
                prop_assert!(named(&e, HELLO_REASONS), "unnamed rejection: {e}");
            }
        }

        #[test]
        fn valid_hellos_round_trip_and_every_truncation_is_named(h in valid_hello()) {
            let bytes = h.encode();
            prop_assert_eq!(decode_hello(&bytes)?, h);
            // A longer body from a later version: its tail is ignored.
            let mut longer = bytes.to_vec();
            longer[6..8].copy_from_slice(&(HELLO_BODY_LEN as u16 + 9).to_be_bytes());
            longer.extend_from_slice(&[0xa5; 9]);
            prop_assert_eq!(decode_hello(&longer)?, h);
            for n in 0..bytes.len() {
                let e = decode_hello(&bytes[..n]).expect_err("a truncated hello");
                prop_assert!(named(&e, HELLO_REASONS), "cut at {}: {}", n, e);
            }
        }

        #[test]
        fn a_hello_field_out_of_bounds_is_refused_by_name(
            h in valid_hello(),
            field in 0..6usize,
            big in any::<u64>(),
        ) {
            let mut bad = h;
            let expect = match field {
                0 => { bad.credits = MAX_CREDITS + 1 + (big as u32 % 1000); "hello credits" }
                1 => { bad.credits = big as u32 % MIN_CREDITS; "hello credits" }
                2 => {
                    bad.max_message = MAX_MESSAGE + 1 + big % (u64::MAX - MAX_MESSAGE);
                    "hello largest message"
                }
                3 => {
                    bad.slot_size = MAX_SLOT_SIZE as u32 + 1 + (big as u32 % 1000);
                    "hello slot size"
                }
                4 => { bad.mtu = 6 + (big as u8 % 250); "hello MTU code" }
                _ => {
                    bad.eager_threshold = bad.slot_size - SLOT_OVERHEAD as u32 + 1;
                    "hello eager threshold"
                }
            };
            let e = decode_hello(&bad.encode()).expect_err("out of bounds");
            prop_assert!(e.0.contains(expect), "{expect}: {e}");
        }

        #[test]
        fn any_bytes_decode_to_a_control_message_or_a_named_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            kind in 0..8u8,
            limits in limits(),
        ) {
            let mut bytes = bytes;
            if let Some(b) = bytes.first_mut() {
                *b = kind;
            }
            if let Err(e) = Control::decode(&bytes, &limits) {
                prop_assert!(named(&e, CONTROL_REASONS), "unnamed rejection: {e}");
            }
        }

        #[test]
        fn valid_control_messages_round_trip_and_truncations_are_named(
            (limits, (kind, h, meta, payload)) in limits()
                .prop_flat_map(|l| (Just(l), valid_control(l))),
        ) {
            let bytes = message(kind, h, &meta, &payload);
            let d = Control::decode(&bytes, &limits)?;
            prop_assert_eq!(d.kind, kind);
            prop_assert_eq!(d.header, h);
            prop_assert_eq!(d.meta, &meta[..]);
            prop_assert_eq!(d.payload, &payload[..]);
            for n in 0..bytes.len() {
                match Control::decode(&bytes[..n], &limits) {
                    Err(e) => prop_assert!(named(&e, CONTROL_REASONS), "cut at {}: {}", n, e),
                    // A cut message is always short of a part it announced.
                    Ok(d) => prop_assert!(false, "cut at {} decoded: {:?}", n, d),
                }
            }
        }
    }
}

//! Byte-level pieces of the text messages the C tools exchange (`"%04x:%06x:..."`).
//!
//! Everything here works on the raw bytes a peer sent, never on `&str` slices of
//! them: a byte that is not ASCII can neither panic a parser (a `&str` sliced inside a
//! multi-byte character does) nor slip through. Errors are plain text naming the field
//! and what was wrong with it; each protocol module wraps them in its own error type.

/// The bytes before the first NUL (all of them without one), as C's string
/// functions see a buffer.
pub fn c_str(raw: &[u8]) -> &[u8] {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    &raw[..end]
}

/// `bytes` for an error message: quoted, non-printable bytes escaped (`\xff`), at
/// most 64 bytes shown.
pub fn show(bytes: &[u8]) -> String {
    const MAX: usize = 64;
    let shown = &bytes[..bytes.len().min(MAX)];
    let more = if bytes.len() > MAX { "..." } else { "" };
    format!("\"{}{more}\"", shown.escape_ascii())
}

/// Parses `field` as hexadecimal digits only (no sign, prefix or spaces), at most
/// `max`. The error names the field (`name`) and the problem: empty, the first byte
/// that is not a hex digit, or too large.
pub fn hex_field(name: &str, field: &[u8], max: u64) -> Result<u64, String> {
    if field.is_empty() {
        return Err(format!("{name} is empty"));
    }
    let mut value: u64 = 0;
    for (i, &b) in field.iter().enumerate() {
        let digit = hex_digit(b).ok_or_else(|| {
            format!(
                "{name} {} has {} at offset {i}, not a hex digit",
                show(field),
                show(&[b])
            )
        })?;
        value = value
            .checked_mul(16)
            .and_then(|v| v.checked_add(u64::from(digit)))
            .filter(|&v| v <= max)
            .ok_or_else(|| format!("{name} {} is larger than {max:#x}", show(field)))?;
    }
    Ok(value)
}

/// Parses a GID written as exactly 32 hex digits (the 16 bytes in order).
pub fn hex_gid(name: &str, field: &[u8]) -> Result<[u8; 16], String> {
    if field.len() != 32 {
        return Err(format!(
            "{name} {} has {} bytes, expected 32 hex digits",
            show(field),
            field.len()
        ));
    }
    let mut gid = [0u8; 16];
    for (i, (byte, pair)) in gid.iter_mut().zip(field.chunks_exact(2)).enumerate() {
        *byte = hex_field(&format!("{name} byte {i}"), pair, 0xff)? as u8;
    }
    Ok(gid)
}

/// The value of one ASCII hex digit.
fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits `text` at every `:` (as `str::split` would, but on bytes).
pub fn colon_fields(text: &[u8]) -> Vec<&[u8]> {
    text.split(|&b| b == b':').collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hex_fields_name_the_problem() {
        assert_eq!(hex_field("QPN", b"00abCD", 0xff_ffff), Ok(0xabcd));
        assert!(hex_field("QPN", b"", 9)
            .unwrap_err()
            .contains("QPN is empty"));
        let e = hex_field("LID", "0é".as_bytes(), 0xffff).unwrap_err();
        assert!(
            e.contains("LID") && e.contains("\\xc3") && e.contains("offset 1"),
            "{e}"
        );
        let e = hex_field("PSN", b"1000000", 0xff_ffff).unwrap_err();
        assert!(
            e.contains("PSN") && e.contains("larger than 0xffffff"),
            "{e}"
        );
        assert!(hex_field("x", b"+1", 9).is_err(), "no sign");
        assert!(
            hex_field("x", b"ffffffffffffffffff", u64::MAX).is_err(),
            "overflow"
        );
    }

    #[test]
    fn gids_are_32_hex_digits() {
        let g = hex_gid("GID", b"00000000000000000000ffffc6120001").unwrap();
        assert_eq!(g[12..], [198, 18, 0, 1]);
        // A two-byte character where the first hex pair starts: no panic, an error.
        let mut bad = b"00000000000000000000ffffc6120001".to_vec();
        bad[1..3].copy_from_slice("é".as_bytes());
        bad.truncate(32);
        let e = hex_gid("GID", &bad).unwrap_err();
        assert!(e.contains("GID byte 0"), "{e}");
        assert!(hex_gid("GID", b"00").unwrap_err().contains("2 bytes"));
    }

    proptest! {
        #[test]
        fn hex_field_never_panics_and_matches_std(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let ours = hex_field("f", &bytes, u64::MAX);
            let all_hex = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_hexdigit);
            if all_hex {
                let text = std::str::from_utf8(&bytes).unwrap();
                prop_assert_eq!(ours.ok(), u64::from_str_radix(text, 16).ok());
            } else {
                prop_assert!(ours.unwrap_err().starts_with("f "));
            }
        }

        #[test]
        fn hex_gid_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Err(e) = hex_gid("GID", &bytes) {
                prop_assert!(e.starts_with("GID"));
            }
        }

        #[test]
        fn show_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let s = show(&bytes);
            prop_assert!(s.is_ascii());
        }
    }
}

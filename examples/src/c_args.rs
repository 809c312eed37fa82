//! Command-line numbers read as the C tools read them, so that a script's
//! arguments mean the same to a port.

/// C's `strtol(s, NULL, 0)`: leading blanks and a sign, then `0x` for hex, a
/// leading `0` for octal, else decimal, up to the first character that is not a
/// digit of the base ("1abc" is 1, "abc" is 0), saturating as C does.
///
/// ```
/// use examples::c_args::strtol;
/// assert_eq!(strtol("0x1f"), 31);
/// assert_eq!(strtol(" -010"), -8);
/// assert_eq!(strtol("12abc"), 12);
/// assert_eq!(strtol("abc"), 0);
/// ```
pub fn strtol(s: &str) -> i64 {
    strtol_base(s, 0)
}

/// C's `atoi`: `strtol(s, NULL, 10)` as an `int` ("0x10" is 0, "-3" is -3).
pub fn atoi(s: &str) -> i32 {
    strtol_base(s, 10) as i32
}

/// `strtol(s, NULL, base)` for a base of 0 (chosen by the prefix) or 10.
fn strtol_base(s: &str, base: u32) -> i64 {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let hex_digits = |t: &str| t.as_bytes().first().is_some_and(u8::is_ascii_hexdigit);
    let (radix, digits) = match s.as_bytes() {
        _ if base != 0 => (base, s),
        [b'0', b'x' | b'X', ..] if hex_digits(&s[2..]) => (16, &s[2..]),
        [b'0', ..] => (8, s),
        _ => (10, s),
    };
    let mut value: i64 = 0;
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else { break };
        value = value.saturating_mul(i64::from(radix));
        value = if negative {
            value.saturating_sub(i64::from(d))
        } else {
            value.saturating_add(i64::from(d))
        };
    }
    value
}

/// What glibc's `getopt_long` prints on standard error for the command line
/// clap refused with `e`, for tools that leave its messages on (`opterr`):
/// "PROG: invalid option -- 'h'", "PROG: unrecognized option '--foo'",
/// "PROG: option requires an argument -- 'd'". `last` is the command line's
/// last argument: getopt takes whatever follows an option as its value, so an
/// option lacks one only there, and it says which form was typed.
pub fn getopt_message(prog: &str, e: &clap::Error, last: Option<&str>) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    match e.kind() {
        ErrorKind::UnknownArgument if arg.starts_with("--") => {
            format!("{prog}: unrecognized option '{arg}'")
        }
        ErrorKind::UnknownArgument => {
            let c = arg.trim_start_matches('-').chars().next().unwrap_or('?');
            format!("{prog}: invalid option -- '{c}'")
        }
        ErrorKind::InvalidValue | ErrorKind::NoEquals => match last {
            Some(short) if !short.starts_with("--") => {
                let c = short.chars().last().unwrap_or('?');
                format!("{prog}: option requires an argument -- '{c}'")
            }
            // clap names the option by its long form ("--ib-dev <IB_DEV>").
            _ => format!(
                "{prog}: option '{}' requires an argument",
                arg.split(' ').next().unwrap_or_default()
            ),
        },
        _ => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            format!("{prog}: {}", first.trim_start_matches("error: "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{atoi, getopt_message, strtol};
    use clap::Parser;

    #[derive(Parser, Debug)]
    #[command(disable_help_flag = true, infer_long_args = true)]
    struct Args {
        #[arg(short = 'd', long = "ib-dev", allow_hyphen_values = true)]
        dev: Option<String>,
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
    }

    fn refused(args: &[&str]) -> String {
        let e = Args::try_parse_from(std::iter::once("p").chain(args.iter().copied()))
            .expect_err("refused");
        getopt_message("p", &e, args.last().copied())
    }

    #[test]
    fn refusals_read_as_getopts() {
        assert_eq!(refused(&["-h"]), "p: invalid option -- 'h'");
        assert_eq!(refused(&["--help"]), "p: unrecognized option '--help'");
        assert_eq!(refused(&["-d"]), "p: option requires an argument -- 'd'");
        assert_eq!(refused(&["-vd"]), "p: option requires an argument -- 'd'");
        assert_eq!(
            refused(&["--ib-d"]),
            "p: option '--ib-dev' requires an argument"
        );
    }

    #[test]
    fn options_parse_as_getopts() {
        // A value that looks like an option is still the value; long names may
        // be cut short while they stay unambiguous.
        let args = Args::try_parse_from(["p", "--ib", "-v", "--verb"]).unwrap();
        assert_eq!(args.dev.as_deref(), Some("-v"));
        assert!(args.verbose);
    }

    #[test]
    fn reads_numbers_as_c_does() {
        assert_eq!(strtol("1"), 1);
        assert_eq!(strtol("0"), 0);
        assert_eq!(strtol("0x"), 0);
        assert_eq!(strtol("0xg"), 0);
        assert_eq!(strtol("019"), 1);
        assert_eq!(strtol("+7"), 7);
        assert_eq!(strtol(""), 0);
        assert_eq!(strtol("-"), 0);
        assert_eq!(strtol("99999999999999999999"), i64::MAX);
        assert_eq!(strtol("-99999999999999999999"), i64::MIN);
        assert_eq!(atoi("0x10"), 0);
        assert_eq!(atoi("010"), 10);
        assert_eq!(atoi("-3x"), -3);
        assert_eq!(atoi("70000"), 70000);
    }
}

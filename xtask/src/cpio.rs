//! A writer for `newc` cpio archives, the format the Linux kernel unpacks as an initramfs.
//!
//! Each entry is a 110-byte ASCII header (`070701` then 13 fields of 8 hex
//! digits: ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
//! rdevmajor, rdevminor, namesize, check), the NUL-terminated name padded to
//! a multiple of 4 bytes (counting the header), then the data padded to 4.
//! The archive ends with an entry named `TRAILER!!!`.

/// File type bits of `mode` for a regular file.
pub const S_IFREG: u32 = 0o100_000;
/// File type bits of `mode` for a directory.
pub const S_IFDIR: u32 = 0o040_000;
/// File type bits of `mode` for a character device.
pub const S_IFCHR: u32 = 0o020_000;

/// The magic string that opens every `newc` header.
pub const MAGIC: &[u8; 6] = b"070701";
/// The name of the entry that ends an archive.
pub const TRAILER: &str = "TRAILER!!!";

/// Builds a `newc` archive in memory. All entries get uid 0, gid 0 and
/// mtime 0, so the same inputs always give the same bytes.
#[derive(Debug, Default)]
pub struct CpioWriter {
    buf: Vec<u8>,
    next_ino: u32,
}

impl CpioWriter {
    /// An empty archive.
    pub fn new() -> Self {
        CpioWriter {
            buf: Vec::new(),
            next_ino: 1,
        }
    }

    /// Adds a directory (`name` without a leading `/`, e.g. `lib/modules`).
    pub fn dir(&mut self, name: &str, perm: u32) {
        self.entry(name, S_IFDIR | perm, 2, (0, 0), &[]);
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, S_IFREG | perm, 1, (0, 0), data);
    }

    /// Adds a character device node with the given major and minor numbers.
    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | perm, 1, (major, minor), &[]);
    }

    /// Writes the trailer and returns the archive's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.header(TRAILER, 0, 0, 1, 0, (0, 0));
        self.buf
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        let name = name.trim_start_matches('/');
        assert!(
            !name.is_empty() && !name.contains('\0'),
            "bad cpio entry name {name:?}"
        );
        let ino = self.next_ino;
        self.next_ino += 1;
        let size = u32::try_from(data.len()).expect("cpio entry larger than 4 GiB");
        self.header(name, ino, mode, nlink, size, rdev);
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn header(&mut self, name: &str, ino: u32, mode: u32, nlink: u32, size: u32, rdev: (u32, u32)) {
        let namesize = u32::try_from(name.len() + 1).expect("cpio name too long");
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.buf.extend_from_slice(MAGIC);
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }
}

/// Reading archives back, to check what the writer produced.
#[cfg(test)]
pub mod reader {
    use super::{MAGIC, TRAILER};

    /// The size of a `newc` header in bytes.
    pub const HEADER_LEN: usize = 110;

    /// One entry read back from an archive (used by the tests and for checks).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        /// The entry's name.
        pub name: String,
        /// The 13 header fields, in header order.
        pub fields: [u32; 13],
        /// The entry's data.
        pub data: Vec<u8>,
    }

    impl Entry {
        /// The `mode` field (type and permission bits).
        pub fn mode(&self) -> u32 {
            self.fields[1]
        }
    }

    /// Reads a `newc` archive back into its entries, including the trailer,
    /// checking magic, field syntax and padding. Returns `None` if malformed.
    pub fn parse(bytes: &[u8]) -> Option<Vec<Entry>> {
        let mut entries = Vec::new();
        let mut pos = 0;
        loop {
            let header = bytes.get(pos..pos + HEADER_LEN)?;
            if &header[..6] != MAGIC {
                return None;
            }
            let mut fields = [0u32; 13];
            for (i, f) in fields.iter_mut().enumerate() {
                let hex = std::str::from_utf8(&header[6 + 8 * i..14 + 8 * i]).ok()?;
                *f = u32::from_str_radix(hex, 16).ok()?;
            }
            let namesize = fields[11] as usize;
            let name_bytes = bytes.get(pos + HEADER_LEN..pos + HEADER_LEN + namesize)?;
            let (last, name) = name_bytes.split_last()?;
            if *last != 0 {
                return None;
            }
            let name = String::from_utf8(name.to_vec()).ok()?;
            pos = align4(pos + HEADER_LEN + namesize);
            let size = fields[6] as usize;
            let data = bytes.get(pos..pos + size)?.to_vec();
            pos = align4(pos + size);
            let done = name == TRAILER;
            entries.push(Entry { name, fields, data });
            if done {
                return (pos == bytes.len()).then_some(entries);
            }
        }
    }

    fn align4(n: usize) -> usize {
        (n + 3) & !3
    }
}

#[cfg(test)]
mod tests {
    use super::reader::{parse, HEADER_LEN};
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = CpioWriter::new();
        w.dir("bin", 0o755);
        w.file("/init", 0o755, b"#!/bin/sh\n");
        w.file("bin/x", 0o644, b"12345");
        w.char_dev("dev/console", 0o600, 5, 1);
        let bytes = w.finish();
        assert_eq!(bytes.len() % 4, 0);
        let e = parse(&bytes).expect("well-formed");
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["bin", "init", "bin/x", "dev/console", TRAILER]);
        assert_eq!(e[0].mode(), S_IFDIR | 0o755);
        assert_eq!(e[0].fields[4], 2); // nlink
        assert_eq!(e[1].mode(), S_IFREG | 0o755);
        assert_eq!(e[1].data, b"#!/bin/sh\n");
        assert_eq!(e[2].fields[6], 5); // filesize
        assert_eq!(e[3].mode(), S_IFCHR | 0o600);
        assert_eq!((e[3].fields[9], e[3].fields[10]), (5, 1));
        // Distinct inode numbers, and deterministic output.
        assert_ne!(e[1].fields[0], e[2].fields[0]);
        let mut again = CpioWriter::new();
        again.dir("bin", 0o755);
        again.file("/init", 0o755, b"#!/bin/sh\n");
        again.file("bin/x", 0o644, b"12345");
        again.char_dev("dev/console", 0o600, 5, 1);
        assert_eq!(again.finish(), bytes);
    }

    #[test]
    fn header_layout_and_padding() {
        let mut w = CpioWriter::new();
        w.file("abc", 0o644, b"hello");
        let bytes = w.finish();
        let expected_header = concat!(
            "070701", "00000001", "000081a4", "00000000", "00000000", "00000001", "00000000",
            "00000005", "00000000", "00000000", "00000000", "00000000", "00000004", "00000000"
        );
        assert_eq!(&bytes[..HEADER_LEN], expected_header.as_bytes());
        // 110 + "abc\0" = 114, padded to 116; then "hello" padded to 8.
        assert_eq!(&bytes[110..116], b"abc\0\0\0");
        assert_eq!(&bytes[116..124], b"hello\0\0\0");
        assert_eq!(&bytes[124..130], MAGIC);
        // The trailer: 110 + 11 = 121, padded to 124.
        assert_eq!(bytes.len(), 124 + 124);
        assert_eq!(&bytes[124 + 110..124 + 121], b"TRAILER!!!\0");
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(parse(b"").is_none());
        assert!(parse(&[b'0'; 200]).is_none());
        let mut bytes = CpioWriter::new().finish();
        bytes.push(0);
        assert!(parse(&bytes).is_none(), "trailing bytes");
    }
}

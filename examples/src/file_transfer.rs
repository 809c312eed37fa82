//! The wire format and the file handling of `rdma-file-transfer`, a port of The Geek
//! in the Corner's `rdma-file-transfer` sample (03_file-transfer), as pure code.
//!
//! * **Messages** (SENDs of 24 bytes, host order, C's `struct message`): `i32 id` at
//!   0 (`MSG_MR` = 1, `MSG_READY` = 2, `MSG_DONE` = 3), for `MSG_MR` the buffer's
//!   `u64 addr` at 8 and `u32 rkey` at 16. See [`Msg`].
//! * **The file name**: the client RDMA-writes the name *with its terminating NUL*
//!   and puts `strlen(name) + 1` in the immediate (`write_remote(id, strlen(name) + 1)`
//!   after `strcpy`); the C server copies that many bytes (at most 256) and overwrites
//!   the last one with a NUL. See [`encode_name`] and [`decode_name`].
//! * **The stored file**: only a plain file name is accepted (no `/`, not `.` or `..`,
//!   no NUL, control or bidirectional formatting characters, at most 255 bytes). It is
//!   written to a hidden file in the output directory and takes its name only once
//!   whole: never through a symbolic link and, unless asked to, never over an
//!   existing file; a transfer that fails leaves nothing. See [`create_output`].

use rdma_safe::{Error, Result};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::wire::show;

/// Size of the buffer the server registers for the peer's writes.
pub const BUFFER_SIZE: usize = 10 * 1024 * 1024;
/// Size of a message (`sizeof(struct message)`).
pub const MSG_LEN: usize = 24;
/// Longest file name (Linux's `NAME_MAX`); on the wire one more byte, the NUL, which
/// is also the C server's `MAX_FILE_NAME` (256).
pub const MAX_NAME: usize = 255;

/// `MSG_MR`.
const MSG_MR: i32 = 1;
/// `MSG_READY`.
const MSG_READY: i32 = 2;
/// `MSG_DONE`.
const MSG_DONE: i32 = 3;

fn protocol(text: String) -> Error {
    Error::Protocol(text.into())
}

/// A message of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The server's buffer: where the client writes the name and every chunk.
    Mr {
        /// Its address.
        addr: u64,
        /// Its rkey.
        rkey: u32,
    },
    /// One credit: the buffer may be written again.
    Ready,
    /// The file was stored.
    Done,
}

impl Msg {
    /// The 24 bytes of C's `struct message` (padding and unused fields zero).
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut out = [0u8; MSG_LEN];
        let id = match self {
            Msg::Mr { addr, rkey } => {
                out[8..16].copy_from_slice(&addr.to_ne_bytes());
                out[16..20].copy_from_slice(&rkey.to_ne_bytes());
                MSG_MR
            }
            Msg::Ready => MSG_READY,
            Msg::Done => MSG_DONE,
        };
        out[0..4].copy_from_slice(&id.to_ne_bytes());
        out
    }

    /// Parses the bytes a SEND delivered (exactly what arrived: `byte_len` of them).
    /// A message of another size or an unknown id is an error naming it.
    pub fn decode(bytes: &[u8]) -> Result<Msg> {
        let b: &[u8; MSG_LEN] = bytes.try_into().map_err(|_| {
            protocol(format!(
                "received a message of {} bytes, expected {MSG_LEN} (struct message)",
                bytes.len()
            ))
        })?;
        let word = |at: usize| [b[at], b[at + 1], b[at + 2], b[at + 3]];
        match i32::from_ne_bytes(word(0)) {
            MSG_MR => {
                let mut addr = [0u8; 8];
                addr.copy_from_slice(&b[8..16]);
                Ok(Msg::Mr {
                    addr: u64::from_ne_bytes(addr),
                    rkey: u32::from_ne_bytes(word(16)),
                })
            }
            MSG_READY => Ok(Msg::Ready),
            MSG_DONE => Ok(Msg::Done),
            id => Err(protocol(format!(
                "received a message with unknown id {id} (expected 1 MSG_MR, 2 MSG_READY \
                 or 3 MSG_DONE)"
            ))),
        }
    }

    /// The C name of the message, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Mr { .. } => "MSG_MR",
            Msg::Ready => "MSG_READY",
            Msg::Done => "MSG_DONE",
        }
    }
}

/// Checks that `name` is a plain file name that may be created in a directory: not
/// empty, at most [`MAX_NAME`] bytes, no `/` (never a path), not `.` or `..`, no NUL
/// and no control character (the name is printed). The error says what is wrong.
pub fn check_name(name: &[u8]) -> Result<()> {
    let bad = |why: String| Err(protocol(format!("file name {}: {why}", show(name))));
    if name.is_empty() {
        return bad("empty".into());
    }
    if name.len() > MAX_NAME {
        return bad(format!(
            "{} bytes, longer than NAME_MAX ({MAX_NAME})",
            name.len()
        ));
    }
    if name == b"." || name == b".." {
        return bad("not a file name (a directory reference)".into());
    }
    if let Some(i) = name.iter().position(|&b| b == b'/') {
        return bad(format!(
            "contains '/' at offset {i}: only a plain name is accepted, never a path"
        ));
    }
    if let Some(i) = name.iter().position(|&b| b == 0) {
        return bad(format!("contains a NUL byte at offset {i}"));
    }
    if let Some(i) = name.iter().position(|&b| b < 0x20 || b == 0x7f) {
        return bad(format!(
            "contains the control character {:#04x} at offset {i}",
            name[i]
        ));
    }
    // Printed in the `received` line: no C1 control (a terminal escape) and no
    // bidirectional formatting (a name that reads as another).
    let text = String::from_utf8_lossy(name);
    if let Some(c) = text.chars().find(|&c| c.is_control() || is_bidi_format(c)) {
        return bad(format!("contains the character U+{:04X}", c as u32));
    }
    Ok(())
}

/// Unicode's bidirectional formatting characters (embeddings, overrides,
/// isolates and marks), which reorder how a name is shown.
fn is_bidi_format(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// What the client writes for `name`: its bytes and a NUL. The immediate of the write
/// is the returned length (`strlen(name) + 1`), as the C client sends it.
pub fn encode_name(name: &[u8]) -> Result<Vec<u8>> {
    check_name(name)?;
    let mut out = Vec::with_capacity(name.len() + 1);
    out.extend_from_slice(name);
    out.push(0);
    Ok(out)
}

/// Parses the name message: `bytes` are the ones the write's immediate counts (name
/// and NUL). The last byte must be the NUL; the name before it must pass
/// [`check_name`].
pub fn decode_name(bytes: &[u8]) -> Result<&OsStr> {
    let Some((&last, name)) = bytes.split_last() else {
        return Err(protocol(
            "the file name message is empty (its immediate is 0)".into(),
        ));
    };
    if bytes.len() > MAX_NAME + 1 {
        return Err(protocol(format!(
            "the file name message is {} bytes, more than a {MAX_NAME}-byte name and its NUL",
            bytes.len()
        )));
    }
    if last != 0 {
        return Err(protocol(format!(
            "the file name message {} does not end with a NUL: the immediate must count \
             the name's terminating NUL (strlen + 1)",
            show(bytes)
        )));
    }
    check_name(name)?;
    Ok(OsStr::from_bytes(name))
}

/// Checks the name message's framing against its completion: the immediate (`imm`)
/// counts the bytes written (`byte_len`), name and NUL, at most `MAX_NAME + 1`. Returns
/// how many bytes to read from the buffer.
pub fn name_len(imm: Option<u32>, byte_len: u32) -> Result<usize> {
    let imm = imm.ok_or_else(|| protocol("the file name write carried no immediate".into()))?;
    if imm != byte_len {
        return Err(protocol(format!(
            "the file name write has immediate {imm} but wrote {byte_len} bytes: they must \
             be equal (strlen(name) + 1)"
        )));
    }
    if imm == 0 || imm as usize > MAX_NAME + 1 {
        return Err(protocol(format!(
            "the file name write has immediate {imm}: a name and its NUL take 2 to {} bytes",
            MAX_NAME + 1
        )));
    }
    Ok(imm as usize)
}

/// Checks a chunk's framing: the immediate is its length, which is what was written,
/// and it fits the buffer. Returns the length (0 ends the file).
pub fn chunk_len(imm: Option<u32>, byte_len: u32) -> Result<usize> {
    let imm = imm.ok_or_else(|| protocol("a chunk's write carried no immediate".into()))?;
    if imm != byte_len || imm as usize > BUFFER_SIZE {
        return Err(protocol(format!(
            "a chunk with immediate {imm} wrote {byte_len} bytes: the immediate must be the \
             length written, at most {BUFFER_SIZE}"
        )));
    }
    Ok(imm as usize)
}

/// A received file being written. Its bytes go to a hidden file of its own in the
/// output directory, and only [`Output::commit`], once the whole file is there,
/// gives it its name. Dropped before that (the transfer failed: the client died,
/// sent a malformed chunk, the disk filled), the hidden file is removed: a failed
/// transfer never leaves a partial file under the name, nor replaces a file that
/// `--overwrite` would have.
#[derive(Debug)]
pub struct Output {
    file: File,
    part: PathBuf,
    path: PathBuf,
    overwrite: bool,
    done: bool,
}

/// Makes the output for `name` (checked with [`check_name`]) in `dir`, refusing
/// at once what [`Output::commit`] would refuse: an existing file unless
/// `overwrite`, a symbolic link (never followed nor replaced), anything but a
/// regular file. The bytes go to a new hidden file (mode 0644 less the umask,
/// opened as `O_CREAT | O_EXCL | O_NOFOLLOW`) until the commit.
pub fn create_output(dir: &Path, name: &OsStr, overwrite: bool) -> Result<Output> {
    check_name(name.as_bytes())?;
    let path = dir.join(name);
    check_target(&path, overwrite)?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let part = dir.join(format!(
        ".rdma-file-transfer.{}.{n}.part",
        std::process::id()
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&part)
        .map_err(|e| Error::io(format!("create {}", part.display()), e))?;
    Ok(Output {
        file,
        part,
        path,
        overwrite,
        done: false,
    })
}

/// Whether a received file may take `path`: free, or with `overwrite` a regular
/// file (never a symbolic link, a directory, a FIFO or a device).
fn check_target(path: &Path, overwrite: bool) -> Result<()> {
    let refuse = |why: &str, kind| {
        Error::io(
            format!("refusing to store {}: {why}", path.display()),
            std::io::Error::from(kind),
        )
    };
    let meta = match path.symlink_metadata() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("stat {}", path.display()), e)),
        Ok(meta) => meta,
    };
    use std::io::ErrorKind::{AlreadyExists, InvalidInput};
    if meta.file_type().is_symlink() {
        Err(refuse(
            "it is a symbolic link, which is never followed (remove it first)",
            InvalidInput,
        ))
    } else if !overwrite {
        Err(refuse(
            "the file exists (pass --overwrite to replace it)",
            AlreadyExists,
        ))
    } else if !meta.is_file() {
        Err(refuse("it is not a regular file", InvalidInput))
    } else {
        Ok(())
    }
}

impl Output {
    /// The file to write the received bytes to.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The whole file arrived: it is synced to disk and given its name (checked
    /// again, as with [`create_output`]; without `overwrite` a file that appeared
    /// meanwhile is kept, and this fails). With `overwrite` the old file is
    /// replaced by the new one (a new inode: the old one's mode, owner and other
    /// links stay with it). Returns the file's path; once the file has its name
    /// this succeeds, and what could not be tidied after (the directory's sync,
    /// the hidden name left on filesystems without `renameat2`) is said on stderr.
    pub fn commit(mut self) -> Result<PathBuf> {
        let io = |what: &str, e| Error::io(format!("{what} {}", self.path.display()), e);
        self.file.sync_all().map_err(|e| io("sync", e))?;
        check_target(&self.path, self.overwrite)?;
        if self.overwrite {
            // Atomic: the old file stays whole until the new one replaces it.
            std::fs::rename(&self.part, &self.path).map_err(|e| io("rename to", e))?;
        } else {
            rename_no_replace(&self.part, &self.path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Error::io(
                        format!(
                            "refusing to store {}: the file exists (pass --overwrite to \
                             replace it)",
                            self.path.display()
                        ),
                        e,
                    )
                } else {
                    io("rename to", e)
                }
            })?;
        }
        self.done = true;
        if self.part.exists() {
            if let Err(e) = std::fs::remove_file(&self.part) {
                eprintln!(
                    "note: {} is stored; its hidden part stays: {e}",
                    self.path.display()
                );
            }
        }
        // The new name is durable too.
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            eprintln!(
                "note: {} is stored; syncing its directory failed: {e}",
                self.path.display()
            );
        }
        Ok(self.path.clone())
    }
}

/// Moves `from` to `to` unless `to` exists, atomically: `renameat2` with
/// `RENAME_NOREPLACE`, or where the filesystem lacks it a hard link (which fails
/// if `to` exists; `from` is then left for the caller to remove).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let ret = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => std::fs::hard_link(from, to),
        _ => Err(e),
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    #[test]
    fn messages_are_cs_struct_message() {
        let m = Msg::Mr {
            addr: 0x7f00_1234_5000,
            rkey: 0x1234,
        };
        let raw = m.encode();
        assert_eq!(raw[0..4], 1i32.to_ne_bytes());
        assert_eq!(raw[4..8], [0; 4], "padding");
        assert_eq!(raw[8..16], 0x7f00_1234_5000u64.to_ne_bytes());
        assert_eq!(raw[16..20], 0x1234u32.to_ne_bytes());
        assert_eq!(Msg::decode(&raw).unwrap(), m);
        assert_eq!(Msg::Ready.encode()[0..4], 2i32.to_ne_bytes());
        assert_eq!(Msg::Done.encode()[0..4], 3i32.to_ne_bytes());
        let e = Msg::decode(&[0; 24]).unwrap_err().to_string();
        assert!(e.contains("unknown id 0"), "{e}");
        let e = Msg::decode(&[2; 23]).unwrap_err().to_string();
        assert!(e.contains("23 bytes"), "{e}");
    }

    #[test]
    fn name_message_is_c_framed() {
        // The C client: strcpy(buffer, name); write_remote(id, strlen(name) + 1).
        let raw = encode_name(b"big.bin").unwrap();
        assert_eq!(raw, b"big.bin\0");
        assert_eq!(raw.len(), 8, "the immediate: strlen + 1");
        // What the C server keeps: the immediate's bytes with the last one set to NUL.
        let mut c_server = raw.clone();
        *c_server.last_mut().unwrap() = 0;
        assert_eq!(
            std::ffi::CStr::from_bytes_until_nul(&c_server)
                .unwrap()
                .to_bytes(),
            b"big.bin",
            "a C server stores the whole name"
        );
        // A C client's name message is accepted as is.
        assert_eq!(decode_name(b"big.bin\0").unwrap(), "big.bin");
        assert_eq!(name_len(Some(8), 8).unwrap(), 8);
    }

    #[test]
    fn bad_name_messages_are_refused_with_the_cause() {
        let e = |b: &[u8]| decode_name(b).unwrap_err().to_string();
        assert!(e(b"").contains("empty"));
        assert!(e(b"big.bin").contains("does not end with a NUL"));
        assert!(e(b"\0").contains("empty"));
        assert!(e(b"a/b\0").contains("'/'"));
        assert!(e(b"/etc/passwd\0").contains("never a path"));
        assert!(e(b"..\0").contains("not a file name"));
        assert!(e(b".\0").contains("not a file name"));
        assert!(e(b"a\0b\0").contains("NUL byte at offset 1"));
        assert!(e(b"a\x1b[2Jb\0").contains("control character 0x1b"));
        assert!(e(&[b'x'; 257]).contains("257 bytes"));
        let mut long = vec![b'x'; 256];
        long.push(0);
        assert!(e(&long).contains("257 bytes"));
        long.truncate(255);
        long.push(0);
        assert!(decode_name(&long).is_ok(), "NAME_MAX is allowed");
        assert!(name_len(Some(0), 0)
            .unwrap_err()
            .to_string()
            .contains("immediate 0"));
        assert!(name_len(Some(8), 7)
            .unwrap_err()
            .to_string()
            .contains("wrote 7"));
        assert!(name_len(None, 7).is_err());
        assert!(chunk_len(Some(5), 4).is_err());
        assert!(chunk_len(Some(BUFFER_SIZE as u32 + 1), BUFFER_SIZE as u32 + 1).is_err());
        assert_eq!(chunk_len(Some(0), 0).unwrap(), 0);
    }

    /// A fresh directory under the target's temporary directory.
    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ft-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_existing_file_is_kept_unless_overwrite() {
        let dir = temp_dir("exists");
        std::fs::write(dir.join("big.bin"), b"precious").unwrap();
        let e = create_output(&dir, OsStr::new("big.bin"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exists") && e.contains("--overwrite"), "{e}");
        assert_eq!(std::fs::read(dir.join("big.bin")).unwrap(), b"precious");
        let mut out = create_output(&dir, OsStr::new("big.bin"), true).unwrap();
        out.file().write_all(b"new").unwrap();
        // Until the commit the old file is whole.
        assert_eq!(std::fs::read(dir.join("big.bin")).unwrap(), b"precious");
        let path = out.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        // A new name is created, mode 0644.
        let mut out = create_output(&dir, OsStr::new("fresh"), false).unwrap();
        out.file().write_all(b"x").unwrap();
        let path = out.commit().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o133, 0, "mode 0644 (less the umask), got {mode:o}");
        assert_eq!(names(&dir), ["big.bin", "fresh"], "no hidden part is left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_transfer_leaves_nothing_and_replaces_nothing() {
        let dir = temp_dir("failed");
        std::fs::write(dir.join("kept.bin"), b"precious").unwrap();
        for (name, overwrite) in [("kept.bin", true), ("new.bin", false)] {
            let mut out = create_output(&dir, OsStr::new(name), overwrite).unwrap();
            out.file().write_all(b"half of it").unwrap();
            // The transfer fails here: the output is dropped uncommitted.
            drop(out);
        }
        assert_eq!(std::fs::read(dir.join("kept.bin")).unwrap(), b"precious");
        assert_eq!(names(&dir), ["kept.bin"], "a partial file was left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_made_during_the_transfer_is_not_replaced() {
        let dir = temp_dir("race");
        let mut out = create_output(&dir, OsStr::new("late.bin"), false).unwrap();
        out.file().write_all(b"received").unwrap();
        std::fs::write(dir.join("late.bin"), b"made meanwhile").unwrap();
        let e = out.commit().unwrap_err().to_string();
        assert!(e.contains("exists") && e.contains("--overwrite"), "{e}");
        assert_eq!(
            std::fs::read(dir.join("late.bin")).unwrap(),
            b"made meanwhile"
        );
        assert_eq!(names(&dir), ["late.bin"], "a partial file was left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_symlink_is_never_followed() {
        let dir = temp_dir("symlink");
        let target = dir.join("target");
        std::fs::write(&target, b"precious").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
        for overwrite in [false, true] {
            for name in ["link", "dangling"] {
                let e = create_output(&dir, OsStr::new(name), overwrite)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("symbolic link"), "{name} {overwrite}: {e}");
            }
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(
            !dir.join("nowhere").exists(),
            "the dangling link was followed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_regular_files_and_plain_names() {
        let dir = temp_dir("special");
        std::fs::create_dir(dir.join("sub")).unwrap();
        let e = create_output(&dir, OsStr::new("sub"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sub") && e.contains("not a regular file"), "{e}");
        for name in [
            "../escape",
            "..",
            ".",
            "",
            "a/b",
            "esc\u{9b}[2J",
            "gpj.\u{202e}exe",
            "a\u{2066}b",
        ] {
            assert!(
                create_output(&dir, OsStr::new(name), true).is_err(),
                "{name:?}"
            );
        }
        assert!(!dir.parent().unwrap().join("escape").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest! {
        #[test]
        fn arbitrary_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Err(e) = Msg::decode(&bytes) {
                let e = e.to_string();
                prop_assert!(e.contains("bytes") || e.contains("unknown id"), "{}", e);
            }
        }

        #[test]
        fn messages_round_trip_and_truncations_fail(addr in any::<u64>(), rkey in any::<u32>(), which in 0..3u8) {
            let m = match which { 0 => Msg::Mr { addr, rkey }, 1 => Msg::Ready, _ => Msg::Done };
            let raw = m.encode();
            prop_assert_eq!(Msg::decode(&raw).ok(), Some(m));
            for cut in 0..raw.len() {
                prop_assert!(Msg::decode(&raw[..cut]).unwrap_err().to_string().contains("bytes"));
            }
        }

        #[test]
        fn arbitrary_name_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            match decode_name(&bytes) {
                Ok(name) => {
                    // Accepted names are plain names: no path, no NUL, no control bytes.
                    let n = name.as_bytes();
                    prop_assert!(!n.is_empty() && n.len() <= MAX_NAME);
                    prop_assert!(n.iter().all(|&b| b != b'/' && b >= 0x20 && b != 0x7f));
                    prop_assert!(n != b"." && n != b"..");
                }
                Err(e) => prop_assert!(e.to_string().contains("file name"), "{}", e),
            }
        }

        #[test]
        fn names_round_trip_and_truncations_fail(name in "[a-zA-Z0-9._ -]{1,255}") {
            prop_assume!(name != "." && name != "..");
            let raw = encode_name(name.as_bytes()).unwrap();
            prop_assert_eq!(decode_name(&raw).unwrap().as_bytes(), name.as_bytes());
            prop_assert_eq!(name_len(Some(raw.len() as u32), raw.len() as u32).unwrap(), raw.len());
            // Every truncation loses the terminating NUL.
            for cut in 0..raw.len() {
                prop_assert!(decode_name(&raw[..cut]).is_err(), "cut at {}", cut);
            }
        }

        #[test]
        fn framing_checks_never_panic(imm in proptest::option::of(any::<u32>()), len in any::<u32>()) {
            let _ = name_len(imm, len);
            if let Ok(n) = chunk_len(imm, len) {
                prop_assert!(n <= BUFFER_SIZE && Some(n as u32) == imm && n as u32 == len);
            }
        }
    }
}

//! Small whole-file records the broker must not lose or half-write: the topic registry,
//! the leader epoch, group positions. Each is replaced atomically (write a temporary file,
//! fsync it, rename it over the old one, fsync the directory) and carries a CRC footer so
//! a damaged file is refused instead of parsed.
//!
//! Both functions block on fsync: call `write_atomic` from a worker thread, never from the
//! reactor. Only one writer per path at a time (they share the temporary file name).
//! Depends on std, crc32fast and the storage seam.
//!
//! # File layout (big-endian)
//!
//! ```text
//! offset  width  field               meaning
//! ------  -----  ------------------  ------------------------------------------------
//! 0       n      payload             the caller's bytes, opaque here
//! n       4      payload_len u32     n; catches a file cut short at a payload boundary
//! n+4     4      crc u32             crc32 (crc32fast) of payload and payload_len
//! ```

use std::io;
use std::path::{Path, PathBuf};

use super::storage::{Open, Storage};

/// Bytes after the payload.
pub const META_FOOTER_BYTES: usize = 8;
/// Largest payload: the footer's length field is a u32.
pub const META_PAYLOAD_BYTES_MAX: usize = u32::MAX as usize;
/// Appended to the target's file name for the temporary file.
pub const META_TMP_SUFFIX: &str = ".tmp";

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(META_TMP_SUFFIX);
    path.with_file_name(name)
}

fn footer(payload: &[u8]) -> [u8; META_FOOTER_BYTES] {
    let len = (payload.len() as u32).to_be_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(payload);
    h.update(&len);
    let mut f = [0u8; META_FOOTER_BYTES];
    f[..4].copy_from_slice(&len);
    f[4..].copy_from_slice(&h.finalize().to_be_bytes());
    f
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replaces `path` with `bytes` so that after a crash the file holds either the old or
/// the new contents, whole.
pub fn write_atomic(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() > META_PAYLOAD_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "meta payload over 4 GiB",
        ));
    }
    let tmp = tmp_path(path);
    storage.write(&tmp, &with_footer(bytes))?;
    // Without this the rename can reach the disk before the data: after a crash the
    // name would point to an empty or partial file.
    storage.open(&tmp, Open::ReadWrite)?.sync_data()?;
    storage.rename(&tmp, path)?;
    storage.sync_dir(parent_dir(path))
}

/// The whole file [`write_atomic`] writes for `bytes`: them and the footer.
pub fn with_footer(bytes: &[u8]) -> Vec<u8> {
    let mut whole = Vec::with_capacity(bytes.len() + META_FOOTER_BYTES);
    whole.extend_from_slice(bytes);
    whole.extend_from_slice(&footer(bytes));
    whole
}

/// Reads a file written by [`write_atomic`]. `Ok(None)` if it does not exist;
/// `InvalidData` if it is short or its CRC does not match.
pub fn read_checked(storage: &dyn Storage, path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = match storage.read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    if bytes.len() < META_FOOTER_BYTES {
        return Err(bad(format!(
            "{} bytes, shorter than the footer",
            bytes.len()
        )));
    }
    let n = bytes.len() - META_FOOTER_BYTES;
    let stored: [u8; META_FOOTER_BYTES] = bytes[n..].try_into().expect("footer width");
    if footer(&bytes[..n]) != stored {
        return Err(bad("footer length or crc mismatch".to_string()));
    }
    bytes.truncate(n);
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::super::storage::FsStorage;
    use super::*;
    use std::fs;

    const FS: FsStorage = FsStorage;

    #[test]
    fn round_trip_replace_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.meta");
        assert_eq!(read_checked(&FS, &path).unwrap(), None);
        write_atomic(&FS, &path, b"first").unwrap();
        assert_eq!(
            read_checked(&FS, &path).unwrap().as_deref(),
            Some(&b"first"[..])
        );
        write_atomic(&FS, &path, b"").unwrap();
        assert_eq!(read_checked(&FS, &path).unwrap().as_deref(), Some(&b""[..]));
        write_atomic(&FS, &path, b"second, longer").unwrap();
        assert_eq!(
            read_checked(&FS, &path).unwrap().as_deref(),
            Some(&b"second, longer"[..])
        );
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn every_flip_and_truncation_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epoch");
        write_atomic(&FS, &path, b"leader epoch 7").unwrap();
        let good = fs::read(&path).unwrap();
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            fs::write(&path, &bad).unwrap();
            let e = read_checked(&FS, &path).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "flip at {at}");
        }
        for cut in 0..good.len() {
            fs::write(&path, &good[..cut]).unwrap();
            assert!(read_checked(&FS, &path).is_err(), "cut at {cut}");
        }
    }
}

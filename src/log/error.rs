//! The storage layer's own error type. It carries paths and byte positions, never topics,
//! ops or protocol codes: `broker/` maps it to wire error codes at its boundary (NoSpace ->
//! STORAGE_FULL), so the log never learns what a PUB is.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum StorageError {
    /// An I/O call failed. `position` is the byte offset in `path` when there is one.
    Io {
        path: PathBuf,
        position: Option<u64>,
        source: io::Error,
    },
    /// The file system is full (ENOSPC). Split from `Io` because the broker answers it with
    /// a retryable STORAGE_FULL instead of treating the partition as broken.
    NoSpace { path: PathBuf },
    /// Bytes on disk are not what the log wrote (CRC, length, sequence or index mismatch).
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// An earlier fdatasync (or an undo after a failed write) failed. The page cache may
    /// have dropped dirty pages, so retrying the sync could report success for lost data:
    /// the partition refuses writes until the process restarts and recovery re-reads disk.
    Poisoned { path: PathBuf, reason: String },
    /// The record is over a `RECORD_*_BYTES_MAX` limit; nothing was buffered.
    RecordTooLarge {
        key_bytes: usize,
        value_bytes: usize,
    },
    /// `LogConfig` is out of range.
    InvalidConfig { reason: String },
}

impl StorageError {
    /// The error as an `io::Error` of the same kind (ENOSPC stays ENOSPC), for callers
    /// that report I/O results uniformly.
    pub fn into_io(self) -> io::Error {
        match self {
            StorageError::Io { source, .. } => source,
            StorageError::NoSpace { .. } => io::Error::from_raw_os_error(ENOSPC),
            other => io::Error::other(other.to_string()),
        }
    }

    /// True when the caller should answer "storage full" and may retry later.
    pub fn is_no_space(&self) -> bool {
        matches!(self, StorageError::NoSpace { .. })
    }

    /// Builds `NoSpace` for ENOSPC and `Io` for everything else.
    pub(crate) fn from_io(path: impl Into<PathBuf>, position: Option<u64>, e: io::Error) -> Self {
        if is_no_space_io(&e) {
            StorageError::NoSpace { path: path.into() }
        } else {
            StorageError::Io {
                path: path.into(),
                position,
                source: e,
            }
        }
    }
}

/// errno of a full file system.
const ENOSPC: i32 = 28;

/// ENOSPC. EDQUOT is left as `Io`: its ErrorKind is newer than the toolchain we target.
pub fn is_no_space_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Io {
                path,
                position: Some(p),
                source,
            } => {
                write!(f, "I/O error on {} at byte {p}: {source}", path.display())
            }
            StorageError::Io {
                path,
                position: None,
                source,
            } => {
                write!(f, "I/O error on {}: {source}", path.display())
            }
            StorageError::NoSpace { path } => {
                write!(f, "no space left on device writing {}", path.display())
            }
            StorageError::Corrupt {
                path,
                position,
                reason,
            } => {
                write!(
                    f,
                    "corrupt data in {} at byte {position}: {reason}",
                    path.display()
                )
            }
            StorageError::Poisoned { path, reason } => write!(
                f,
                "previous I/O error; restart required (partition {}: {reason})",
                path.display()
            ),
            StorageError::RecordTooLarge {
                key_bytes,
                value_bytes,
            } => write!(
                f,
                "record too large: key {key_bytes} bytes, value {value_bytes} bytes"
            ),
            StorageError::InvalidConfig { reason } => write!(f, "invalid log config: {reason}"),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

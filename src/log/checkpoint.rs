//! The recovery point: where the active segment was last known durable, so that start-up
//! can tell a torn write from damage to acknowledged records.
//!
//! After a power cut, everything past the last completed fdatasync may come back torn,
//! stale or zeroed, in any order (the kernel writes pages back as it likes). Everything
//! before it came back as it was written, unless the disk itself damaged it. Recovery
//! therefore truncates at the first bad record only past the recovery point; before it, a
//! bad record is bit rot: it is kept in place and reported when read, and the records
//! after it stay (`recovery.rs`).
//!
//! Depends on std and the storage seam.
//!
//! # File `recovery-point` in the partition directory
//!
//! ```text
//! offset  width  field                 meaning
//! ------  -----  --------------------  -----------------------------------------------
//! 0       4      magic "MMRP"
//! 4       8      segment_first u64     the segment it is about (its first sequence)
//! 12      8      records u64           its first `records` records are durable, and so
//!                                      are their index entries
//! 20      8      end_position u64      the byte just past them
//! 28      4      crc u32 BE            crc32 (crc32fast) of bytes 0..28
//! ```
//!
//! Overwritten in place and fdatasynced by a segment sync job (a checkpoint's, with the
//! node journal: `journal.rs`) once the job has synced the segment files and the index,
//! with the position where the log ended when the job was taken; only a job taken while
//! no other one ran moves it. A torn overwrite fails the crc: recovery then trusts
//! nothing of the last segment and scans it whole, strictly, as if there were no point.

use super::storage::{FileRef, Storage};
use std::io;
use std::path::Path;

/// The recovery point's file name in a partition directory.
pub const RECOVERY_POINT_FILE: &str = "recovery-point";

const MAGIC: [u8; 4] = *b"MMRP";
/// Encoded size.
pub const RECOVERY_POINT_BYTES: usize = 32;

/// The first `records` records of segment `segment_first`, ending at `end_position`,
/// and their index entries were durable when this was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPoint {
    pub segment_first: u64,
    pub records: u64,
    pub end_position: u64,
}

impl RecoveryPoint {
    pub fn encode(&self) -> [u8; RECOVERY_POINT_BYTES] {
        let mut b = [0u8; RECOVERY_POINT_BYTES];
        b[..4].copy_from_slice(&MAGIC);
        b[4..12].copy_from_slice(&self.segment_first.to_be_bytes());
        b[12..20].copy_from_slice(&self.records.to_be_bytes());
        b[20..28].copy_from_slice(&self.end_position.to_be_bytes());
        let crc = crc32fast::hash(&b[..28]);
        b[28..].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// `None` for anything but a whole, crc-checked point.
    pub fn decode(bytes: &[u8]) -> Option<RecoveryPoint> {
        let b: &[u8; RECOVERY_POINT_BYTES] = bytes.get(..RECOVERY_POINT_BYTES)?.try_into().ok()?;
        let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let crc = u32::from_be_bytes(b[28..].try_into().expect("4 bytes"));
        (b[..4] == MAGIC && crc32fast::hash(&b[..28]) == crc).then(|| RecoveryPoint {
            segment_first: u64_at(4),
            records: u64_at(12),
            end_position: u64_at(20),
        })
    }
}

/// The recovery point of the partition in `dir`; `None` when there is none or it is torn
/// (both mean: trust nothing of the last segment).
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> Option<RecoveryPoint> {
    let path = dir.join(RECOVERY_POINT_FILE);
    match storage.read(&path) {
        Ok(bytes) => {
            let point = RecoveryPoint::decode(&bytes);
            if point.is_none() && !bytes.is_empty() {
                log::warn!("{}: torn or damaged; ignored", path.display());
            }
            point
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            log::warn!("{}: {e}; ignored", path.display());
            None
        }
    }
}

/// Moving the recovery point, as the last step of a sync job: the index entries it names
/// are made durable first, then the point.
#[derive(Debug)]
pub struct PointWrite {
    pub index: FileRef,
    pub file: FileRef,
    pub point: RecoveryPoint,
}

impl PointWrite {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        self.index.sync_data()?;
        self.file.write_at(0, &self.point.encode())?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_round_trips_and_any_damage_makes_it_none() {
        let p = RecoveryPoint {
            segment_first: 958,
            records: 12,
            end_position: 4096,
        };
        let bytes = p.encode();
        assert_eq!(RecoveryPoint::decode(&bytes), Some(p));
        for i in 0..RECOVERY_POINT_BYTES {
            let mut bad = bytes;
            bad[i] ^= 0x01;
            assert_eq!(RecoveryPoint::decode(&bad), None, "byte {i}");
        }
        assert_eq!(RecoveryPoint::decode(&bytes[..31]), None);
    }
}

//! What a raft entry's data means (`docs/REPLICATION.md` §3.2, §4): the leader's
//! proposals, encoded once and applied by every node in index order. Empty data is the
//! no-op a new leader appends; otherwise the first byte is the kind.
//!
//! ```text
//! (big-endian)
//! BATCH     kind u8 = 1, leader_wall_ms u64,
//!           parts u32, each: topic_id u16, partition u16, first_sequence u64, count u32,
//!                            records_len u32, records (exactly as in a segment),
//!           positions u32, each: topic_id u16, partition u16, committed u64,
//!                                group_len u16, group
//! REGISTRY  kind u8 = 2, op u8 (1 DECLARE, 2 DELETE), pair u16, partition_count u16,
//!           name_len u16, name
//! FLOOR     kind u8 = 3, floor u64: every node held every entry up to `floor` when the
//!           leader proposed it, so each may forget what lies below (§5.4)
//! ADMIN     kind u8 = 4, op u8 (1 PURGE, 2 GROUP_DELETE, 3 GROUP_RESET, 4 GROUP_EXPIRE),
//!           topic_id u16,
//!           topic_len u16, topic (as the operator named it, source or `.dlq` twin),
//!           group_len u16, group (empty for PURGE),
//!           targets u16, each: partition u16, sequence u64
//!           (PURGE: the records below `sequence` go; GROUP_RESET: the next delivery;
//!           GROUP_DELETE: the tombstone's marks, the `.dlq` twin's next sequence per
//!           partition, none from a leader before marks were carried; GROUP_EXPIRE:
//!           none), resolved by the leader when it proposed it
//! ```
//!
//! Pure code: no I/O, no raft types.

use std::fmt;

const ENTRY_BATCH: u8 = 1;
const ENTRY_REGISTRY: u8 = 2;
const ENTRY_FLOOR: u8 = 3;
const ENTRY_ADMIN: u8 = 4;
const OP_DECLARE: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_PURGE: u8 = 1;
const OP_GROUP_DELETE: u8 = 2;
const OP_GROUP_RESET: u8 = 3;
const OP_GROUP_EXPIRE: u8 = 4;

/// One committed (or proposed) entry's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryData {
    /// A new leader's empty entry: nothing to apply.
    Noop,
    Batch(Batch),
    Registry(RegistryChange),
    /// The lowest match index of every voter, as the leader knew it: no node will need
    /// an entry at or below it again, so journals may be compacted up to it.
    Floor(u64),
    Admin(AdminChange),
}

/// A reactor pass's records of every partition and the group positions it moved (§4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    /// The leader's wall clock: `--producer-ttl` runs on it on every node.
    pub leader_wall_ms: u64,
    pub parts: Vec<BatchPart>,
    pub positions: Vec<PositionChange>,
}

/// One partition's run of records, as a segment holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPart {
    pub topic_id: u16,
    pub partition: u16,
    pub first_sequence: u64,
    pub count: u32,
    pub records: Vec<u8>,
}

impl BatchPart {
    /// The sequence of its last record (`first_sequence` when it holds none).
    pub fn last_sequence(&self) -> u64 {
        self.first_sequence + u64::from(self.count.max(1)) - 1
    }
}

/// A group's committed position on one partition; apply keeps the higher one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionChange {
    pub topic_id: u16,
    pub partition: u16,
    pub committed: u64,
    pub group: Vec<u8>,
}

/// A registry mutation with the pair id the leader chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryChange {
    Declare {
        pair: u16,
        partition_count: u16,
        name: Vec<u8>,
    },
    Delete {
        pair: u16,
        name: Vec<u8>,
    },
}

/// An operator change (`broker::manage`) with the numbers every node applies: the
/// leader resolved them when it proposed it, so no node reads its own log for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminChange {
    /// Per partition: the records below this sequence go.
    Purge {
        topic_id: u16,
        topic: Vec<u8>,
        below: Vec<(u16, u64)>,
    },
    /// Per `.dlq` twin partition: the tombstone's mark (`broker::positions`). Resolved
    /// at proposal because a restart applies the entry again over a twin that may already
    /// hold the dead letters of a group re-created after it. Empty in an entry from a
    /// release before marks were carried: the node reads its own twin at apply.
    GroupDelete {
        topic_id: u16,
        topic: Vec<u8>,
        group: Vec<u8>,
        marks: Vec<(u16, u64)>,
    },
    /// Per partition: the group's next delivery.
    GroupReset {
        topic_id: u16,
        topic: Vec<u8>,
        group: Vec<u8>,
        targets: Vec<(u16, u64)>,
    },
    /// The leader removed the group after `--group-ttl` without members: every node
    /// forgets its positions, as a single node does (no tombstone).
    GroupExpire {
        topic_id: u16,
        topic: Vec<u8>,
        group: Vec<u8>,
    },
}

/// Entry data that does not decode: a bug or an entry from a newer version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryError(pub &'static str);

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft entry data: {}", self.0)
    }
}

impl std::error::Error for EntryError {}

impl EntryData {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            EntryData::Noop => {}
            EntryData::Batch(b) => encode_batch(b, &mut out),
            EntryData::Registry(r) => encode_registry(r, &mut out),
            EntryData::Floor(floor) => {
                out.push(ENTRY_FLOOR);
                out.extend_from_slice(&floor.to_be_bytes());
            }
            EntryData::Admin(a) => encode_admin(a, &mut out),
        }
        out
    }

    pub fn decode(data: &[u8]) -> Result<EntryData, EntryError> {
        let Some((&kind, rest)) = data.split_first() else {
            return Ok(EntryData::Noop);
        };
        let mut r = Reader { data: rest };
        let entry = match kind {
            ENTRY_BATCH => EntryData::Batch(decode_batch(&mut r)?),
            ENTRY_REGISTRY => EntryData::Registry(decode_registry(&mut r)?),
            ENTRY_FLOOR => EntryData::Floor(r.u64()?),
            ENTRY_ADMIN => EntryData::Admin(decode_admin(&mut r)?),
            _ => return Err(EntryError("unknown kind")),
        };
        if !r.data.is_empty() {
            return Err(EntryError("bytes after the entry"));
        }
        Ok(entry)
    }
}

/// Bytes of a BATCH part's and a position's fixed fields.
const BATCH_HEADER_BYTES: usize = 1 + 8 + 4 + 4;
const PART_FIXED_BYTES: usize = 2 + 2 + 8 + 4 + 4;
const POSITION_FIXED_BYTES: usize = 2 + 2 + 8 + 2;

fn encode_batch(b: &Batch, out: &mut Vec<u8>) {
    // One allocation: a pass's records may be megabytes, grown by doubling otherwise.
    let parts: usize = b
        .parts
        .iter()
        .map(|p| PART_FIXED_BYTES + p.records.len())
        .sum();
    let positions: usize = (b.positions.iter())
        .map(|p| POSITION_FIXED_BYTES + p.group.len())
        .sum();
    out.reserve(BATCH_HEADER_BYTES + parts + positions);
    out.push(ENTRY_BATCH);
    out.extend_from_slice(&b.leader_wall_ms.to_be_bytes());
    out.extend_from_slice(&(b.parts.len() as u32).to_be_bytes());
    for p in &b.parts {
        out.extend_from_slice(&p.topic_id.to_be_bytes());
        out.extend_from_slice(&p.partition.to_be_bytes());
        out.extend_from_slice(&p.first_sequence.to_be_bytes());
        out.extend_from_slice(&p.count.to_be_bytes());
        out.extend_from_slice(&(p.records.len() as u32).to_be_bytes());
        out.extend_from_slice(&p.records);
    }
    out.extend_from_slice(&(b.positions.len() as u32).to_be_bytes());
    for p in &b.positions {
        out.extend_from_slice(&p.topic_id.to_be_bytes());
        out.extend_from_slice(&p.partition.to_be_bytes());
        out.extend_from_slice(&p.committed.to_be_bytes());
        out.extend_from_slice(&(p.group.len() as u16).to_be_bytes());
        out.extend_from_slice(&p.group);
    }
}

fn encode_registry(r: &RegistryChange, out: &mut Vec<u8>) {
    out.push(ENTRY_REGISTRY);
    let (op, pair, count, name) = match r {
        RegistryChange::Declare {
            pair,
            partition_count,
            name,
        } => (OP_DECLARE, pair, *partition_count, name),
        RegistryChange::Delete { pair, name } => (OP_DELETE, pair, 0, name),
    };
    out.push(op);
    out.extend_from_slice(&pair.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
}

fn encode_admin(a: &AdminChange, out: &mut Vec<u8>) {
    let (op, topic_id, topic, group, targets) = match a {
        AdminChange::Purge {
            topic_id,
            topic,
            below,
        } => (OP_PURGE, topic_id, topic, &[][..], &below[..]),
        AdminChange::GroupDelete {
            topic_id,
            topic,
            group,
            marks,
        } => (OP_GROUP_DELETE, topic_id, topic, &group[..], &marks[..]),
        AdminChange::GroupReset {
            topic_id,
            topic,
            group,
            targets,
        } => (OP_GROUP_RESET, topic_id, topic, &group[..], &targets[..]),
        AdminChange::GroupExpire {
            topic_id,
            topic,
            group,
        } => (OP_GROUP_EXPIRE, topic_id, topic, &group[..], &[][..]),
    };
    out.push(ENTRY_ADMIN);
    out.push(op);
    out.extend_from_slice(&topic_id.to_be_bytes());
    out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&(group.len() as u16).to_be_bytes());
    out.extend_from_slice(group);
    out.extend_from_slice(&(targets.len() as u16).to_be_bytes());
    for (partition, sequence) in targets {
        out.extend_from_slice(&partition.to_be_bytes());
        out.extend_from_slice(&sequence.to_be_bytes());
    }
}

/// Big-endian fields off the front of a byte string (also INSTALL's, `install.rs`).
pub(super) struct Reader<'a> {
    pub(super) data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn bytes(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        if self.data.len() < n {
            return Err(EntryError("truncated"));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], EntryError> {
        Ok(self.bytes(N)?.try_into().expect("N bytes"))
    }
    pub(super) fn u8(&mut self) -> Result<u8, EntryError> {
        Ok(self.bytes(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, EntryError> {
        self.array().map(u16::from_be_bytes)
    }
    pub(super) fn u32(&mut self) -> Result<u32, EntryError> {
        self.array().map(u32::from_be_bytes)
    }
    pub(super) fn u64(&mut self) -> Result<u64, EntryError> {
        self.array().map(u64::from_be_bytes)
    }
}

fn decode_batch(r: &mut Reader<'_>) -> Result<Batch, EntryError> {
    let leader_wall_ms = r.u64()?;
    let mut parts = Vec::new();
    // Counts come from the data: no capacity is reserved from them.
    for _ in 0..r.u32()? {
        let (topic_id, partition) = (r.u16()?, r.u16()?);
        let (first_sequence, count) = (r.u64()?, r.u32()?);
        let len = r.u32()? as usize;
        parts.push(BatchPart {
            topic_id,
            partition,
            first_sequence,
            count,
            records: r.bytes(len)?.to_vec(),
        });
    }
    let mut positions = Vec::new();
    for _ in 0..r.u32()? {
        let (topic_id, partition, committed) = (r.u16()?, r.u16()?, r.u64()?);
        let len = r.u16()? as usize;
        positions.push(PositionChange {
            topic_id,
            partition,
            committed,
            group: r.bytes(len)?.to_vec(),
        });
    }
    Ok(Batch {
        leader_wall_ms,
        parts,
        positions,
    })
}

fn decode_registry(r: &mut Reader<'_>) -> Result<RegistryChange, EntryError> {
    let (op, pair, partition_count) = (r.u8()?, r.u16()?, r.u16()?);
    let len = r.u16()? as usize;
    let name = r.bytes(len)?.to_vec();
    match op {
        OP_DECLARE => Ok(RegistryChange::Declare {
            pair,
            partition_count,
            name,
        }),
        OP_DELETE => Ok(RegistryChange::Delete { pair, name }),
        _ => Err(EntryError("unknown registry op")),
    }
}

fn decode_admin(r: &mut Reader<'_>) -> Result<AdminChange, EntryError> {
    let (op, topic_id) = (r.u8()?, r.u16()?);
    let len = r.u16()? as usize;
    let topic = r.bytes(len)?.to_vec();
    let len = r.u16()? as usize;
    let group = r.bytes(len)?.to_vec();
    let mut targets = Vec::new();
    for _ in 0..r.u16()? {
        targets.push((r.u16()?, r.u64()?));
    }
    match op {
        OP_PURGE if group.is_empty() => Ok(AdminChange::Purge {
            topic_id,
            topic,
            below: targets,
        }),
        OP_GROUP_DELETE => Ok(AdminChange::GroupDelete {
            topic_id,
            topic,
            group,
            marks: targets,
        }),
        OP_GROUP_RESET => Ok(AdminChange::GroupReset {
            topic_id,
            topic,
            group,
            targets,
        }),
        OP_GROUP_EXPIRE if targets.is_empty() => Ok(AdminChange::GroupExpire {
            topic_id,
            topic,
            group,
        }),
        OP_PURGE | OP_GROUP_EXPIRE => Err(EntryError("admin fields its op does not take")),
        _ => Err(EntryError("unknown admin op")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> EntryData {
        EntryData::Batch(Batch {
            leader_wall_ms: 1_764_600_000_123,
            parts: vec![
                BatchPart {
                    topic_id: 2,
                    partition: 0,
                    first_sequence: 41,
                    count: 3,
                    records: vec![7; 300],
                },
                BatchPart {
                    topic_id: 0x8002,
                    partition: 5,
                    first_sequence: 1,
                    count: 1,
                    records: b"dead letter".to_vec(),
                },
            ],
            positions: vec![PositionChange {
                topic_id: 2,
                partition: 0,
                committed: 40,
                group: b"billing".to_vec(),
            }],
        })
    }

    fn registry() -> [EntryData; 2] {
        [
            EntryData::Registry(RegistryChange::Declare {
                pair: 3,
                partition_count: 16,
                name: b"orders".to_vec(),
            }),
            EntryData::Registry(RegistryChange::Delete {
                pair: 3,
                name: b"orders".to_vec(),
            }),
        ]
    }

    fn admin() -> [EntryData; 4] {
        [
            EntryData::Admin(AdminChange::Purge {
                topic_id: 2,
                topic: b"orders".to_vec(),
                below: vec![(0, 41), (1, 1)],
            }),
            EntryData::Admin(AdminChange::GroupDelete {
                topic_id: 0x8002,
                topic: b"orders.dlq".to_vec(),
                group: b"billing".to_vec(),
                marks: vec![(0, 9), (1, 1)],
            }),
            EntryData::Admin(AdminChange::GroupReset {
                topic_id: 2,
                topic: b"orders".to_vec(),
                group: b"billing".to_vec(),
                targets: vec![(3, 1 << 40)],
            }),
            EntryData::Admin(AdminChange::GroupExpire {
                topic_id: 2,
                topic: b"orders".to_vec(),
                group: b"billing".to_vec(),
            }),
        ]
    }

    #[test]
    fn every_kind_round_trips_and_the_empty_entry_is_the_noop() {
        let [declare, delete] = registry();
        let [purge, group_delete, reset, expire] = admin();
        let floor = EntryData::Floor(1 << 40);
        for e in [
            batch(),
            declare,
            delete,
            EntryData::Batch(Batch::default()),
            floor,
            purge,
            group_delete,
            reset,
            expire,
        ] {
            let bytes = e.encode();
            assert_eq!(EntryData::decode(&bytes), Ok(e));
        }
        let b = batch().encode();
        assert_eq!(
            b.capacity(),
            b.len(),
            "a BATCH is encoded in one allocation"
        );
        assert!(EntryData::Noop.encode().is_empty());
        assert_eq!(EntryData::decode(&[]), Ok(EntryData::Noop));
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let [declare, _] = registry();
        let mut want = vec![ENTRY_REGISTRY, OP_DECLARE, 0, 3, 0, 16, 0, 6];
        want.extend_from_slice(b"orders");
        assert_eq!(declare.encode(), want);
        let b = batch().encode();
        assert_eq!(b[0], ENTRY_BATCH);
        assert_eq!(&b[9..13], &2u32.to_be_bytes(), "parts after the wall clock");
        assert_eq!(&b[13..15], &2u16.to_be_bytes(), "topic id first");
        let floor = EntryData::Floor(0x0102).encode();
        assert_eq!(floor, [ENTRY_FLOOR, 0, 0, 0, 0, 0, 0, 1, 2]);
        let [purge, _, reset, expire] = admin();
        let mut want = vec![ENTRY_ADMIN, OP_PURGE, 0, 2, 0, 6];
        want.extend_from_slice(b"orders");
        want.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 41]);
        want.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(purge.encode(), want);
        let mut want = vec![ENTRY_ADMIN, OP_GROUP_RESET, 0, 2, 0, 6];
        want.extend_from_slice(b"orders");
        want.extend_from_slice(&[0, 7]);
        want.extend_from_slice(b"billing");
        want.extend_from_slice(&[0, 1, 0, 3, 0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(reset.encode(), want);
        let mut want = vec![ENTRY_ADMIN, OP_GROUP_EXPIRE, 0, 2, 0, 6];
        want.extend_from_slice(b"orders");
        want.extend_from_slice(&[0, 7]);
        want.extend_from_slice(b"billing");
        want.extend_from_slice(&[0, 0]);
        assert_eq!(expire.encode(), want);
    }

    #[test]
    fn every_cut_short_or_padded_entry_is_refused() {
        let [declare, _] = registry();
        let [purge, group_delete, reset, expire] = admin();
        for e in [
            batch(),
            declare,
            EntryData::Floor(7),
            purge,
            group_delete,
            reset,
            expire,
        ] {
            let bytes = e.encode();
            for len in 1..bytes.len() {
                assert!(EntryData::decode(&bytes[..len]).is_err(), "cut at {len}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(
                EntryData::decode(&long),
                Err(EntryError("bytes after the entry"))
            );
        }
        assert_eq!(EntryData::decode(&[9]), Err(EntryError("unknown kind")));
        let [purge, group_delete, _, _] = admin();
        let mut bytes = purge.encode();
        bytes[1] = 9;
        let unknown = Err(EntryError("unknown admin op"));
        assert_eq!(EntryData::decode(&bytes), unknown);
        // A purge naming a group is not what a purge takes.
        let mut bytes = group_delete.encode();
        bytes[1] = OP_PURGE;
        let refused = Err(EntryError("admin fields its op does not take"));
        assert_eq!(EntryData::decode(&bytes), refused);
        // Nor does an expiry take targets.
        let mut bytes = group_delete.encode();
        bytes[1] = OP_GROUP_EXPIRE;
        assert_eq!(EntryData::decode(&bytes), refused);
    }

    #[test]
    fn a_group_delete_carries_its_marks_and_one_from_an_older_leader_none() {
        let [_, group_delete, _, _] = admin();
        let mut want = vec![ENTRY_ADMIN, OP_GROUP_DELETE, 0x80, 2, 0, 10];
        want.extend_from_slice(b"orders.dlq");
        want.extend_from_slice(&[0, 7]);
        want.extend_from_slice(b"billing");
        want.extend_from_slice(&[0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        want.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(group_delete.encode(), want);
        // What a release before marks wrote: no targets.
        let mut older = vec![ENTRY_ADMIN, OP_GROUP_DELETE, 0, 2, 0, 6];
        older.extend_from_slice(b"orders");
        older.extend_from_slice(&[0, 1, b'g', 0, 0]);
        let EntryData::Admin(AdminChange::GroupDelete { marks, group, .. }) =
            EntryData::decode(&older).unwrap()
        else {
            panic!("not a group delete")
        };
        assert_eq!((marks, group), (vec![], b"g".to_vec()));
    }
}

//! Idempotent producers of one partition (`man/mortarmq.7`, PUB): each producer's last
//! producer_seqs and the sequences they were given, the duplicate check, and the snapshot
//! file that spares start-up a scan of the whole log.
//!
//! A partition remembers at most `--max-producers` producers: a new one
//! past that evicts the one idle longest, which is then a producer the partition does
//! not know, exactly as after `--producer-ttl`. Without the cap anyone could make the
//! broker keep an entry (up to a 1,024-sequence window, 16 KiB) per producer_id it
//! invents, for a week.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::wire::limits::DEDUP_WINDOW_SEQS;

/// What the idempotence check says about a PUB (`man/mortarmq.7`, PUB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotence {
    /// Append it.
    Fresh,
    /// Seen: answer with the original record's sequence.
    Duplicate { sequence: u64 },
    /// Older than the window, or skipping ahead: 0x0012 with this text.
    OutOfOrder { expected: u64, too_old: bool },
}

/// One producer's recent history on one partition.
#[derive(Debug, Default)]
pub struct Producer {
    pub last_seq: u64,
    /// (producer_seq, sequence) of its latest records, oldest first, at most
    /// DEDUP_WINDOW_SEQS of them.
    window: VecDeque<(u64, u64)>,
    pub last_active_ms: u64,
}

#[derive(Default)]
pub struct Producers {
    by_id: HashMap<u64, Producer>,
    /// (last_active_ms, producer_id) of every producer: the least recently active first,
    /// for eviction and expiry without a scan.
    by_age: BTreeSet<(u64, u64)>,
}

/// The producer-state snapshot file in each partition directory. Start-up loads it and
/// scans only the records after the sequence it covers, so start-up time does not grow
/// with the log. Written every [`PRODUCER_SNAPSHOT_INTERVAL_MS`] when it changed, and at
/// clean shutdown:
///
/// ```text
/// mortar-producers 1
/// covered <sequence>
/// p <producer_id> <last_active_wall_ms> <first_producer_seq> <sequence> <sequence> ...
/// ```
///
/// (the window's producer_seqs are contiguous from `first_producer_seq`).
pub const PRODUCERS_FILE: &str = "producers";
/// How often changed producer snapshots are rewritten.
pub const PRODUCER_SNAPSHOT_INTERVAL_MS: u64 = 60_000;
const PRODUCERS_MAGIC: &str = "mortar-producers 1";

impl Producers {
    /// The snapshot text; `covered` is the last sequence the state includes.
    pub fn encode(&self, covered: u64, mono_ms: u64, wall_ms: u64) -> Vec<u8> {
        use std::fmt::Write;
        let mut out = format!("{PRODUCERS_MAGIC}\ncovered {covered}\n");
        let mut ids: Vec<_> = self.by_id.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let p = &self.by_id[&id];
            let Some(&(first, _)) = p.window.front() else {
                continue;
            };
            let wall = wall_ms.saturating_sub(mono_ms.saturating_sub(p.last_active_ms));
            let _ = write!(out, "p {id} {wall} {first}");
            for &(_, sequence) in &p.window {
                let _ = write!(out, " {sequence}");
            }
            out.push('\n');
        }
        out.into_bytes()
    }

    /// Loads a snapshot, dropping producers idle past `ttl_ms` and keeping at most
    /// `max_producers`; returns the covered sequence.
    pub fn decode(
        bytes: &[u8],
        (mono_ms, wall_ms): (u64, u64),
        ttl_ms: u64,
        max_producers: usize,
    ) -> Result<(Producers, u64), String> {
        let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(PRODUCERS_MAGIC) {
            return Err("unknown header".into());
        }
        let covered = lines
            .next()
            .and_then(|l| l.strip_prefix("covered "))
            .and_then(|n| n.parse().ok())
            .ok_or("no covered line")?;
        let mut entries = Vec::new();
        for line in lines {
            let nums: Vec<u64> = line
                .strip_prefix("p ")
                .ok_or_else(|| format!("bad line: {line}"))?
                .split(' ')
                .map(|n| n.parse().map_err(|_| format!("bad line: {line}")))
                .collect::<Result<_, _>>()?;
            let [id, wall, first, sequences @ ..] = nums.as_slice() else {
                return Err(format!("bad line: {line}"));
            };
            if wall_ms.saturating_sub(*wall) <= ttl_ms {
                entries.push((*wall, *id, *first, sequences.to_vec()));
            }
        }
        // Oldest activity first, so that past the cap the most recent are kept.
        entries.sort_unstable();
        let mut producers = Producers::default();
        for (wall, id, first, sequences) in entries {
            // A stamp ahead of `wall_ms` stays ahead: a cluster node whose log's clock
            // starts behind its snapshot (every record purged) must not age a producer
            // from the clock's reading instead of its record's stamp.
            let active_mono = match wall.checked_sub(wall_ms) {
                Some(ahead) => mono_ms.saturating_add(ahead),
                None => mono_ms.saturating_sub(wall_ms - wall),
            };
            for (i, &sequence) in sequences.iter().enumerate() {
                producers.record(id, first + i as u64, sequence, active_mono, max_producers);
            }
        }
        Ok((producers, covered))
    }

    pub fn check(&self, producer_id: u64, producer_seq: u64) -> Idempotence {
        let Some(p) = self.by_id.get(&producer_id) else {
            return Idempotence::Fresh;
        };
        if producer_seq == p.last_seq + 1 {
            return Idempotence::Fresh;
        }
        if producer_seq > p.last_seq {
            return Idempotence::OutOfOrder {
                expected: p.last_seq + 1,
                too_old: false,
            };
        }
        let oldest_remembered = p.window.front().map_or(p.last_seq, |&(s, _)| s);
        if p.last_seq - producer_seq < DEDUP_WINDOW_SEQS && producer_seq >= oldest_remembered {
            // The window is contiguous in producer_seq, so the offset finds the entry.
            let (seen, sequence) = p.window[(producer_seq - oldest_remembered) as usize];
            debug_assert_eq!(seen, producer_seq);
            return Idempotence::Duplicate { sequence };
        }
        Idempotence::OutOfOrder {
            expected: p.last_seq + 1,
            too_old: true,
        }
    }

    /// Remembers that `producer_id` got `sequence` for `producer_seq`. A producer the
    /// partition does not know, with `max_producers` known already, evicts the one idle
    /// longest; returns how many were evicted (0 or 1).
    pub fn record(
        &mut self,
        producer_id: u64,
        producer_seq: u64,
        sequence: u64,
        now_ms: u64,
        max_producers: usize,
    ) -> usize {
        let mut evicted = 0;
        if !self.by_id.contains_key(&producer_id) {
            while self.by_id.len() >= max_producers.max(1) {
                let Some((_, oldest)) = self.by_age.pop_first() else {
                    break;
                };
                self.by_id.remove(&oldest);
                evicted += 1;
            }
        }
        let p = self.by_id.entry(producer_id).or_default();
        if p.window.back().is_some_and(|&(s, _)| s + 1 != producer_seq) {
            // A producer restarting at a new seq (after expiry) starts a new window.
            p.window.clear();
        }
        p.last_seq = producer_seq;
        p.window.push_back((producer_seq, sequence));
        if p.window.len() as u64 > DEDUP_WINDOW_SEQS {
            p.window.pop_front();
        }
        self.by_age.remove(&(p.last_active_ms, producer_id));
        p.last_active_ms = now_ms;
        self.by_age.insert((now_ms, producer_id));
        evicted
    }

    /// Forgets records above `written` (a flush that failed never happened).
    pub fn roll_back_above(&mut self, written: u64) {
        let by_age = &mut self.by_age;
        self.by_id.retain(|&id, p| {
            while p.window.back().is_some_and(|&(_, seq)| seq > written) {
                p.window.pop_back();
            }
            match p.window.back() {
                Some(&(s, _)) => {
                    p.last_seq = s;
                    true
                }
                None => {
                    by_age.remove(&(p.last_active_ms, id));
                    false
                }
            }
        });
    }

    /// Drops producers idle for longer than `ttl_ms` (`--producer-ttl`), oldest first:
    /// the cost is what expires, not how many there are.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> usize {
        let mut expired = 0;
        while let Some(&(active_ms, id)) = self.by_age.first() {
            if now_ms.saturating_sub(active_ms) <= ttl_ms {
                break;
            }
            self.by_age.pop_first();
            self.by_id.remove(&id);
            expired += 1;
        }
        expired
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// At most `max_producers`, each with one age entry (cheap enough for every pass).
    pub fn check_len(&self, max_producers: usize) {
        assert!(
            self.by_id.len() <= max_producers.max(1),
            "over the producer cap"
        );
        assert_eq!(
            self.by_age.len(),
            self.by_id.len(),
            "one age entry per producer"
        );
    }

    /// The age index lists every producer once, at its last activity.
    pub fn check_invariants(&self) {
        self.check_len(usize::MAX);
        for &(active_ms, id) in &self.by_age {
            let p = self.by_id.get(&id).expect("aged producer is known");
            assert_eq!(
                p.last_active_ms, active_ms,
                "age entry at its last activity"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cap no test reaches.
    const MANY: usize = usize::MAX;

    #[test]
    fn producer_seq_must_be_last_plus_one() {
        let mut p = Producers::default();
        assert_eq!(p.check(9, 5), Idempotence::Fresh);
        p.record(9, 5, 100, 0, MANY);
        assert_eq!(p.check(9, 6), Idempotence::Fresh);
        assert_eq!(p.check(9, 5), Idempotence::Duplicate { sequence: 100 });
        assert_eq!(
            p.check(9, 8),
            Idempotence::OutOfOrder {
                expected: 6,
                too_old: false
            }
        );
    }

    #[test]
    fn duplicates_are_found_within_the_window_only() {
        let mut p = Producers::default();
        for s in 1..=2000u64 {
            p.record(1, s, s + 10, 0, MANY);
        }
        assert_eq!(p.check(1, 2000), Idempotence::Duplicate { sequence: 2010 });
        assert_eq!(
            p.check(1, 2000 - 1023),
            Idempotence::Duplicate { sequence: 987 }
        );
        assert_eq!(
            p.check(1, 2000 - 1024),
            Idempotence::OutOfOrder {
                expected: 2001,
                too_old: true
            }
        );
    }

    #[test]
    fn snapshots_round_trip_and_drop_expired_producers() {
        let mut p = Producers::default();
        for s in 1..=5 {
            p.record(7, s + 10, s, 1_000, MANY);
        }
        p.record(8, 1, 6, 0, MANY);
        // At mono 1_000 / wall 50_000: producer 7 active just now, producer 8 1 s ago.
        let bytes = p.encode(6, 1_000, 50_000);
        let (back, covered) = Producers::decode(&bytes, (0, 50_000), 500, MANY).unwrap();
        assert_eq!(covered, 6);
        assert_eq!(back.check(7, 13), Idempotence::Duplicate { sequence: 3 });
        assert_eq!(back.check(7, 16), Idempotence::Fresh);
        assert_eq!(back.check(8, 1), Idempotence::Fresh, "expired by the ttl");
        assert!(Producers::decode(b"junk", (0, 0), 1, MANY).is_err());
    }

    #[test]
    fn roll_back_forgets_unwritten_records_and_ttl_expires() {
        let mut p = Producers::default();
        p.record(1, 1, 1, 0, MANY);
        p.record(1, 2, 2, 0, MANY);
        p.record(2, 1, 3, 50, MANY);
        p.roll_back_above(2);
        p.check_invariants();
        assert_eq!(p.check(1, 3), Idempotence::Fresh);
        assert_eq!(
            p.check(2, 1),
            Idempotence::Fresh,
            "producer 2 forgotten entirely"
        );
        assert_eq!(p.expire(1_000, 500), 1);
        assert!(p.is_empty());
        p.check_invariants();
    }

    #[test]
    fn past_the_cap_the_producer_idle_longest_is_evicted() {
        let mut p = Producers::default();
        // Producers 1..=3 at times 10, 20, 30; producer 1 publishes again at 40.
        for id in 1..=3u64 {
            assert_eq!(p.record(id, 1, id, id * 10, 3), 0);
        }
        p.record(1, 2, 4, 40, 3);
        // A fourth evicts producer 2, idle longest, not 1.
        assert_eq!(p.record(4, 1, 5, 50, 3), 1);
        p.check_invariants();
        assert_eq!(p.len(), 3);
        assert_eq!(p.check(1, 2), Idempotence::Duplicate { sequence: 4 });
        // An evicted producer is unknown: its resend is fresh (appended again), as after
        // --producer-ttl, and it evicts the next one idle longest (3).
        assert_eq!(p.check(2, 1), Idempotence::Fresh);
        assert_eq!(p.record(2, 1, 6, 60, 3), 1);
        assert_eq!(p.check(3, 1), Idempotence::Fresh);
        // A known producer never evicts anyone.
        assert_eq!(p.record(4, 2, 7, 70, 3), 0);
        p.check_invariants();
    }

    #[test]
    fn a_snapshot_larger_than_the_cap_keeps_the_most_recent_producers() {
        let mut p = Producers::default();
        for id in 1..=10u64 {
            p.record(id, 1, id, id, MANY);
        }
        let bytes = p.encode(10, 10, 10);
        let (back, _) = Producers::decode(&bytes, (10, 10), 1_000, 4).unwrap();
        back.check_invariants();
        assert_eq!(back.len(), 4);
        assert_eq!(back.check(10, 1), Idempotence::Duplicate { sequence: 10 });
        assert_eq!(back.check(6, 1), Idempotence::Fresh);
    }

    #[test]
    fn a_snapshot_read_on_a_clock_behind_its_stamps_keeps_each_producers_activity() {
        // A cluster node whose log's clock starts at 0 (every record purged) reads a
        // snapshot stamped at 5,000: the producer is active at 5,000, not at 0, so the
        // clock reaching 5,500 with a TTL of 1,000 does not expire it.
        let mut p = Producers::default();
        p.record(7, 1, 1, 5_000, MANY);
        let bytes = p.encode(1, 5_000, 5_000);
        let (mut back, _) = Producers::decode(&bytes, (0, 0), 1_000, MANY).unwrap();
        assert_eq!(
            back.expire(5_500, 1_000),
            0,
            "aged from the clock, not the stamp"
        );
        assert_eq!(back.expire(6_001, 1_000), 1);
    }
}

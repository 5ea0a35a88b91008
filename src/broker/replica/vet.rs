//! What a raft message from a peer must be before [`Replica::step`](super::machine) hands
//! it to raft (`docs/REPLICATION.md` §12, the threat model). Raft trusts its peers: a
//! message that names entries it cannot place, a snapshot below what it committed or an
//! acknowledgement of entries it never had makes it `fatal!` (a panic, and release
//! builds abort), wipe the node into an install, or count a dead follower toward a
//! commit. Even an authenticated peer may be buggy or stale, so every message passes
//! [`vet`] first; what fails is dropped (raft tolerates loss), counted and logged by the
//! reactor at most once a second per [`Lie`].
//!
//! Pure: a message and a [`View`] of this node's raft state in, a verdict out.
//!
//! Depends on what `broker::replica` may.

use std::collections::BTreeMap;

use raft::eraftpb::{EntryType, Message, MessageType};

use super::install::SnapshotData;

/// A term more than this far above this node's is a lie (or a bug): no cluster holds a
/// billion elections while one node is away, and raft's `term + 1` must never overflow.
pub const TERM_STEP_MAX: u64 = 1 << 30;

/// Why a peer's message was dropped: the label of `mortar_peer_refused_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lie {
    /// Not from another voter, or not to this node.
    Sender,
    /// A kind only raft's own node makes (MsgHup, MsgPropose, ...), or one this cluster
    /// never sends (leadership transfer, read index).
    Kind,
    /// Term 0, or a term far past this node's ([`TERM_STEP_MAX`]).
    Term,
    /// An append, heartbeat or snapshot of this node's term from a node that is not its
    /// leader (two leaders in one term cannot be).
    Leader,
    /// Entries not contiguous from `index + 1`, terms that go down or pass the
    /// message's, or a configuration change (membership is static).
    Entries,
    /// An append whose entries would replace committed ones.
    Conflict,
    /// A snapshot not above this node's commit index, of another membership, or whose
    /// data does not name a manifest of its index and term.
    Snapshot,
    /// An append response acknowledging entries past this node's log.
    Ack,
    /// A heartbeat response whose lease stamp is later than now.
    Lease,
}

impl Lie {
    pub const ALL: [Lie; 9] = [
        Lie::Sender,
        Lie::Kind,
        Lie::Term,
        Lie::Leader,
        Lie::Entries,
        Lie::Conflict,
        Lie::Snapshot,
        Lie::Ack,
        Lie::Lease,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            Lie::Sender => "raft_sender",
            Lie::Kind => "raft_kind",
            Lie::Term => "raft_term",
            Lie::Leader => "raft_not_leader",
            Lie::Entries => "raft_entries",
            Lie::Conflict => "raft_conflict",
            Lie::Snapshot => "raft_snapshot",
            Lie::Ack => "raft_ack",
            Lie::Lease => "raft_lease",
        }
    }
}

/// What [`vet`] says of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Step,
    /// A snapshot fit to install but from a node this one does not know yet as the
    /// leader of the message's term: it waits until that leader's first heartbeat or
    /// append (a restarted follower may get a snapshot first, `Replica::step`).
    Hold,
    Drop(Lie, String),
}

/// This node's raft state, as [`vet`] reads it.
pub struct View<'a> {
    pub me: u64,
    pub voters: &'a BTreeMap<u64, String>,
    pub term: u64,
    /// 0: none known.
    pub leader_id: u64,
    pub is_leader: bool,
    pub committed: u64,
    pub last_index: u64,
    /// The term of the committed entry (`None` if raft cannot say).
    pub committed_term: Option<u64>,
    /// The pass's time, on the clock lease stamps are written with.
    pub now_ms: u64,
}

/// Whether `msg` may reach raft. See the module doc and [`Lie`].
pub fn vet(msg: &Message, v: &View<'_>) -> Verdict {
    match check(msg, v) {
        Ok(()) if is_snapshot(msg) && !(msg.term == v.term && msg.from == v.leader_id) => {
            Verdict::Hold
        }
        Ok(()) => Verdict::Step,
        Err((lie, why)) => Verdict::Drop(lie, why),
    }
}

fn is_snapshot(msg: &Message) -> bool {
    msg.get_msg_type() == MessageType::MsgSnapshot
}

type Checked = Result<(), (Lie, String)>;

fn check(msg: &Message, v: &View<'_>) -> Checked {
    let kind = msg.get_msg_type();
    if msg.from == v.me || !v.voters.contains_key(&msg.from) || msg.to != v.me {
        return lie(
            Lie::Sender,
            format!("{kind:?} from {} to {}", msg.from, msg.to),
        );
    }
    use MessageType::*;
    let from_leader = matches!(kind, MsgAppend | MsgHeartbeat | MsgSnapshot);
    let peer_kind = from_leader
        || matches!(
            kind,
            MsgAppendResponse
                | MsgHeartbeatResponse
                | MsgRequestVote
                | MsgRequestVoteResponse
                | MsgRequestPreVote
                | MsgRequestPreVoteResponse
        );
    if !peer_kind {
        return lie(Lie::Kind, format!("{kind:?} from {}", msg.from));
    }
    if msg.term == 0 || msg.term > v.term.saturating_add(TERM_STEP_MAX) {
        let why = format!("{kind:?} of term {} (this node: {})", msg.term, v.term);
        return lie(Lie::Term, why);
    }
    let other_leader =
        msg.term == v.term && (v.is_leader || (v.leader_id != 0 && v.leader_id != msg.from));
    if from_leader && other_leader {
        let leader = if v.is_leader { v.me } else { v.leader_id };
        let why = format!(
            "{kind:?} of term {} from {}, led by {leader}",
            msg.term, msg.from
        );
        return lie(Lie::Leader, why);
    }
    if msg.term < v.term {
        return Ok(()); // raft answers what is stale so that its sender catches up
    }
    match kind {
        MsgAppend => check_append(msg, v),
        MsgSnapshot => check_snapshot(msg, v),
        MsgAppendResponse => check_ack(msg, v),
        MsgHeartbeatResponse => check_lease(msg, v),
        _ => Ok(()),
    }
}

fn lie(lie: Lie, why: String) -> Checked {
    Err((lie, why))
}

/// Raft (0.7) appends what follows `index` once `log_term` matches there; entries that
/// are not contiguous, or a divergence at or below the commit index, panic in
/// `maybe_append`, and a `log_term` below the committed entry's sends its rejection
/// search below the log's start (`term(..) must be valid`).
fn check_append(msg: &Message, v: &View<'_>) -> Checked {
    if msg.log_term > msg.term {
        let why = format!("log term {} past the message's {}", msg.log_term, msg.term);
        return lie(Lie::Entries, why);
    }
    let mut term = msg.log_term;
    for (i, e) in msg.entries.iter().enumerate() {
        let at = msg.index.checked_add(1 + i as u64);
        if at != Some(e.index) || e.term < term || e.term > msg.term {
            let why = format!(
                "entry {} of term {} at place {} after index {} of term {}",
                e.index, e.term, i, msg.index, msg.log_term
            );
            return lie(Lie::Entries, why);
        }
        if e.get_entry_type() != EntryType::EntryNormal {
            return lie(
                Lie::Entries,
                format!("a configuration change at {}", e.index),
            );
        }
        term = e.term;
    }
    if msg.index < v.committed {
        return Ok(()); // raft drops such an append itself, answering its commit index
    }
    let conflicts = match v.committed_term {
        Some(t) if msg.index == v.committed => msg.log_term != t,
        Some(t) => msg.log_term < t,
        None => false,
    };
    if conflicts {
        let why = format!(
            "append after index {} of term {}, committed {} of term {:?}",
            msg.index, msg.log_term, v.committed, v.committed_term
        );
        return lie(Lie::Conflict, why);
    }
    Ok(())
}

/// A snapshot replaces this node's state (the broker restarts into an install): only one
/// above what it committed, of this cluster's voters, naming a manifest of its own index.
fn check_snapshot(msg: &Message, v: &View<'_>) -> Checked {
    let snap = msg.get_snapshot();
    let meta = snap.get_metadata();
    if meta.index <= v.committed || meta.term > msg.term || meta.term == 0 {
        let why = format!(
            "snapshot at index {} of term {}, committed {}",
            meta.index, meta.term, v.committed
        );
        return lie(Lie::Snapshot, why);
    }
    let cs = meta.get_conf_state();
    let mut voters = cs.get_voters().to_vec();
    voters.sort_unstable();
    let ours: Vec<u64> = v.voters.keys().copied().collect();
    let joint = !cs.get_voters_outgoing().is_empty()
        || !cs.get_learners().is_empty()
        || !cs.get_learners_next().is_empty();
    if voters != ours || joint {
        return lie(Lie::Snapshot, format!("snapshot of voters {voters:?}"));
    }
    let named = SnapshotData::decode(&snap.data)
        .map_err(|e| (Lie::Snapshot, format!("snapshot data: {e}")))?;
    if named.index() != meta.index || named.term() != meta.term {
        let why = format!(
            "snapshot at {} of term {} naming a manifest at {} of term {}",
            meta.index,
            meta.term,
            named.index(),
            named.term()
        );
        return lie(Lie::Snapshot, why);
    }
    Ok(())
}

/// A leader counts an acknowledged index toward commits: one past its log would let it
/// commit entries no follower holds.
fn check_ack(msg: &Message, v: &View<'_>) -> Checked {
    if !v.is_leader || msg.term != v.term {
        return Ok(());
    }
    if msg.index > v.last_index || msg.reject_hint > v.last_index {
        let why = format!(
            "acknowledges index {} (hint {}), log ends at {}",
            msg.index, msg.reject_hint, v.last_index
        );
        return lie(Lie::Ack, why);
    }
    Ok(())
}

/// The lease runs from the send time a heartbeat response echoes: one from the future
/// would keep a deposed leader's lease valid.
/// Only a stamp of the term this node leads counts toward its lease (an older one may be
/// a previous process's, on a clock that started elsewhere).
fn check_lease(msg: &Message, v: &View<'_>) -> Checked {
    match super::machine::read_lease_stamp(&msg.context) {
        Some((term, sent_ms)) if v.is_leader && term == v.term && sent_ms > v.now_ms => lie(
            Lie::Lease,
            format!("lease stamp {sent_ms} ms, now {} ms", v.now_ms),
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, Snapshot};

    fn voters() -> BTreeMap<u64, String> {
        (1..=3).map(|n| (n, format!("127.0.0.1:{n}"))).collect()
    }

    /// Node 2, a follower of node 1 in term 5, committed 10 (of term 4), log to 12.
    fn follower(voters: &BTreeMap<u64, String>) -> View<'_> {
        View {
            me: 2,
            voters,
            term: 5,
            leader_id: 1,
            is_leader: false,
            committed: 10,
            last_index: 12,
            committed_term: Some(4),
            now_ms: 1_000,
        }
    }

    fn message(kind: MessageType, from: u64, term: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(kind);
        (m.from, m.to, m.term) = (from, 2, term);
        m
    }

    fn append(index: u64, log_term: u64, entries: &[(u64, u64)]) -> Message {
        let mut m = message(MessageType::MsgAppend, 1, 5);
        (m.index, m.log_term) = (index, log_term);
        for &(index, term) in entries {
            let mut e = Entry::default();
            (e.index, e.term) = (index, term);
            m.entries.push(e);
        }
        m
    }

    fn dropped(msg: &Message, v: &View<'_>) -> Option<Lie> {
        match vet(msg, v) {
            Verdict::Drop(lie, _) => Some(lie),
            _ => None,
        }
    }

    #[test]
    fn a_leaders_contiguous_append_steps_and_a_gap_or_a_term_going_down_does_not() {
        let voters = voters();
        let v = follower(&voters);
        assert_eq!(vet(&append(12, 5, &[(13, 5), (14, 5)]), &v), Verdict::Step);
        assert_eq!(vet(&append(10, 4, &[(11, 4)]), &v), Verdict::Step);
        let gap = append(12, 5, &[(13, 5), (15, 5)]);
        assert_eq!(dropped(&gap, &v), Some(Lie::Entries));
        let down = append(12, 5, &[(13, 5), (14, 4)]);
        assert_eq!(dropped(&down, &v), Some(Lie::Entries));
        let ahead = append(12, 5, &[(13, 6)]);
        assert_eq!(
            dropped(&ahead, &v),
            Some(Lie::Entries),
            "past the message's term"
        );
        let overflow = append(u64::MAX, 5, &[(0, 5)]);
        assert_eq!(dropped(&overflow, &v), Some(Lie::Entries));
        let mut change = append(12, 5, &[(13, 5)]);
        change.entries[0].set_entry_type(EntryType::EntryConfChange);
        assert_eq!(dropped(&change, &v), Some(Lie::Entries));
    }

    /// The forged append of issue 42 (entry 1 after committed 17 made raft abort) and
    /// its kin: nothing that would replace a committed entry reaches raft.
    #[test]
    fn an_append_that_conflicts_with_committed_entries_is_dropped() {
        let voters = voters();
        let v = follower(&voters);
        assert_eq!(dropped(&append(10, 1, &[(1, 1)]), &v), Some(Lie::Entries));
        assert_eq!(dropped(&append(10, 3, &[(11, 5)]), &v), Some(Lie::Conflict));
        assert_eq!(dropped(&append(11, 3, &[]), &v), Some(Lie::Conflict));
        // Below the commit index raft answers with it and appends nothing.
        assert_eq!(vet(&append(3, 2, &[(4, 2)]), &v), Verdict::Step);
    }

    #[test]
    fn only_the_leader_of_this_term_appends_and_only_voters_speak() {
        let voters = voters();
        let v = follower(&voters);
        let mut from3 = append(12, 5, &[(13, 5)]);
        from3.from = 3;
        assert_eq!(dropped(&from3, &v), Some(Lie::Leader));
        from3.term = 6;
        from3.entries.clear();
        assert_eq!(vet(&from3, &v), Verdict::Step, "a new term's leader");
        let mut stranger = append(12, 5, &[]);
        stranger.from = 9;
        assert_eq!(dropped(&stranger, &v), Some(Lie::Sender));
        let mut misdirected = append(12, 5, &[]);
        misdirected.to = 3;
        assert_eq!(dropped(&misdirected, &v), Some(Lie::Sender));
        let local = message(MessageType::MsgPropose, 1, 0);
        assert_eq!(dropped(&local, &v), Some(Lie::Kind));
        let transfer = message(MessageType::MsgTimeoutNow, 1, 5);
        assert_eq!(dropped(&transfer, &v), Some(Lie::Kind));
        let far = message(MessageType::MsgHeartbeat, 1, 5 + TERM_STEP_MAX + 1);
        assert_eq!(dropped(&far, &v), Some(Lie::Term));
        let zero = message(MessageType::MsgHeartbeat, 1, 0);
        assert_eq!(dropped(&zero, &v), Some(Lie::Term));
    }

    fn snapshot(from: u64, term: u64, index: u64, voters: &[u64]) -> Message {
        let mut m = message(MessageType::MsgSnapshot, from, term);
        let mut s = Snapshot::default();
        s.mut_metadata().index = index;
        s.mut_metadata().term = term;
        s.mut_metadata().mut_conf_state().voters = voters.to_vec();
        s.data = SnapshotData::naming(b"manifest", index, term)
            .encode()
            .into();
        m.set_snapshot(s);
        m
    }

    /// The forged snapshot of issue 42: term 1000, index 1,000,000, no manifest.
    #[test]
    fn a_snapshot_installs_only_from_this_terms_leader_above_the_commit_index() {
        let voters = voters();
        let v = follower(&voters);
        assert_eq!(vet(&snapshot(1, 5, 11, &[1, 2, 3]), &v), Verdict::Step);
        let forged = snapshot(3, 1000, 1_000_000, &[1, 2, 3]);
        assert_eq!(vet(&forged, &v), Verdict::Hold, "waits to be the leader's");
        let mut empty = snapshot(1, 5, 11, &[1, 2, 3]);
        empty.mut_snapshot().data = Vec::new().into();
        assert_eq!(dropped(&empty, &v), Some(Lie::Snapshot));
        let below = snapshot(1, 5, 10, &[1, 2, 3]);
        assert_eq!(dropped(&below, &v), Some(Lie::Snapshot));
        let others = snapshot(1, 5, 11, &[1, 2]);
        assert_eq!(dropped(&others, &v), Some(Lie::Snapshot));
        let mut misnamed = snapshot(1, 5, 11, &[1, 2, 3]);
        misnamed.mut_snapshot().data = SnapshotData::naming(b"m", 12, 5).encode().into();
        assert_eq!(dropped(&misnamed, &v), Some(Lie::Snapshot));
    }

    #[test]
    fn a_leader_takes_no_acknowledgement_past_its_log_nor_a_lease_from_the_future() {
        let voters = voters();
        let v = View {
            me: 1,
            leader_id: 1,
            is_leader: true,
            ..follower(&voters)
        };
        let mut ack = message(MessageType::MsgAppendResponse, 2, 5);
        ack.to = 1;
        ack.index = 12;
        assert_eq!(vet(&ack, &v), Verdict::Step);
        ack.index = 1 << 40;
        assert_eq!(dropped(&ack, &v), Some(Lie::Ack));
        let mut beat = message(MessageType::MsgHeartbeatResponse, 2, 5);
        beat.to = 1;
        beat.context = super::super::machine::lease_stamp(5, 1_000).into();
        assert_eq!(vet(&beat, &v), Verdict::Step);
        beat.context = super::super::machine::lease_stamp(5, u64::MAX).into();
        assert_eq!(dropped(&beat, &v), Some(Lie::Lease));
        let mut append = append(12, 5, &[]);
        (append.from, append.to) = (2, 1);
        assert_eq!(
            dropped(&append, &v),
            Some(Lie::Leader),
            "this node leads the term"
        );
    }
}

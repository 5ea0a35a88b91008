//! A deterministic in-process harness for [`Replica`]: three nodes, each over its own
//! `SimDisk`, a network of per-node inboxes the test drives (hold, drop, deliver), and
//! persist jobs completed by the test when it says so. §9.3's seeded simulator with
//! faults and the checker grows from here.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use raft::eraftpb::{Message, MessageType};

use super::entry::{Batch, BatchPart, EntryData, RegistryChange};
use super::machine::{test_address, test_config};
use super::machine::{Effect, PersistJob, Replica, ReplicaConfig, Replicated, Waiter};
use crate::broker::ConnRef;
use crate::log::simdisk::SimDisk;
use crate::log::Storage;
use crate::wire::ErrorCode;

const NODES: u64 = 3;
const JOURNAL_FILE_BYTES: u64 = 64 * 1024;
const ELECTION_TICKS: usize = 10;
const REPLICATION_TIMEOUT_MS: u64 = 5_000;
/// Rounds (a tick, then messages until quiet) a test may take to reach its condition.
const ROUNDS_MAX: usize = 500;
/// Deliveries within one round before the harness calls the network busy forever.
const DELIVERIES_PER_ROUND_MAX: usize = 10_000;
const TOPIC: u16 = 2;

type Answer = (Waiter, Result<Replicated, ErrorCode>);

struct Node {
    disk: SimDisk,
    replica: Replica,
    inbox: VecDeque<Message>,
    /// Persist jobs not completed yet (all of them, at once, unless `hold_persist`).
    jobs: VecDeque<PersistJob>,
    hold_persist: bool,
    /// Takes no ticks and reads no messages; its inbox fills.
    paused: bool,
    /// Its messages are lost.
    mute: bool,
    /// Partitioned away: its messages and those sent to it are lost.
    isolated: bool,
    sent: Vec<Message>,
    applied: Vec<(u64, u64, EntryData)>,
    answers: Vec<Answer>,
}

struct Cluster {
    nodes: Vec<Node>,
    now_ms: u64,
}

fn open_node(id: u64, disk: SimDisk) -> Node {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let config = ReplicaConfig {
        election_ticks: ELECTION_TICKS,
        journal_file_bytes: JOURNAL_FILE_BYTES,
        replication_timeout_ms: REPLICATION_TIMEOUT_MS,
        ..test_config(id, NODES)
    };
    let (replica, _) = Replica::open(&storage, Path::new("/data"), config, 0).unwrap();
    Node {
        disk,
        replica,
        inbox: VecDeque::new(),
        jobs: VecDeque::new(),
        hold_persist: false,
        paused: false,
        mute: false,
        isolated: false,
        sent: Vec::new(),
        applied: Vec::new(),
        answers: Vec::new(),
    }
}

impl Cluster {
    fn new() -> Cluster {
        let nodes = (1..=NODES)
            .map(|id| open_node(id, SimDisk::seeded(id)))
            .collect();
        Cluster { nodes, now_ms: 0 }
    }

    /// Node `i` reads its inbox, ends its pass and routes what came out; unless it holds
    /// them, its persist jobs complete and it passes again.
    fn pass(&mut self, i: usize) {
        if self.nodes[i].paused {
            return;
        }
        while let Some(m) = self.nodes[i].inbox.pop_front() {
            // A stale or unknown message is the peer's problem, as over TCP; but an
            // honest node's is never taken for a lie (`replica::vet`).
            let stepped = self.nodes[i].replica.step(m);
            if let Err(e @ super::machine::ReplicaError::Refused { .. }) = stepped {
                panic!("node {i} refused an honest peer's message: {e}");
            }
        }
        loop {
            let effects = self.nodes[i].replica.poll(self.now_ms).unwrap();
            for e in effects {
                self.route(i, e);
            }
            if self.nodes[i].hold_persist || self.nodes[i].jobs.is_empty() {
                return;
            }
            self.complete_jobs(i);
        }
    }

    fn complete_jobs(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        while let Some(job) = node.jobs.pop_front() {
            let result = job.run();
            node.replica.persist_done(&job, result).unwrap();
        }
    }

    fn route(&mut self, from: usize, effect: Effect) {
        let node = &mut self.nodes[from];
        match effect {
            Effect::Send(m) => {
                node.sent.push(m.clone());
                let lost = node.mute || node.isolated;
                let to = &mut self.nodes[m.to as usize - 1];
                if !lost && !to.isolated {
                    to.inbox.push_back(m);
                }
            }
            Effect::Persist(job) => node.jobs.push_back(job),
            Effect::Apply { index, term, entry } => node.applied.push((index, term, entry)),
            Effect::Answer { waiter, result } => node.answers.push((waiter, result)),
            Effect::Install { .. } => unreachable!("this harness never compacts"),
        }
    }

    /// Delivers until every running node's inbox is empty.
    fn deliver(&mut self) {
        for _ in 0..DELIVERIES_PER_ROUND_MAX {
            for i in 0..self.nodes.len() {
                self.pass(i);
            }
            if self.nodes.iter().all(|n| n.paused || n.inbox.is_empty()) {
                return;
            }
        }
        panic!("the network never quietens");
    }

    /// Ticks (50 ms each) and delivers until `done`, at most `ROUNDS_MAX` times.
    fn run_until(&mut self, what: &str, done: impl Fn(&Cluster) -> bool) {
        for _ in 0..ROUNDS_MAX {
            self.now_ms += 50;
            for n in self.nodes.iter_mut().filter(|n| !n.paused) {
                n.replica.tick();
            }
            self.deliver();
            if done(self) {
                return;
            }
        }
        panic!("never: {what}");
    }

    fn leader(&self) -> Option<usize> {
        let running = |n: &&Node| !n.paused && n.replica.is_leader();
        self.nodes.iter().position(|n| running(&n))
    }

    /// A leader whose term's no-op every running node applied.
    fn settled_leader(&mut self) -> usize {
        self.run_until("a settled leader", |c| {
            c.leader().is_some_and(|l| {
                let commit = c.nodes[l].replica.commit_index();
                let running = c.nodes.iter().filter(|n| !n.paused);
                running.into_iter().all(|n| n.replica.applied() == commit)
            })
        });
        self.leader().unwrap()
    }
}

fn waiter(slot: u64) -> Waiter {
    Waiter {
        conn: ConnRef { id: 1, serial: 1 },
        slot,
        part: Some((TOPIC, 0)),
    }
}

/// Proposal `n`: mostly a BATCH of one record at sequence `n + 1`, every fourth a DECLARE.
fn proposal(n: u64) -> EntryData {
    if n % 4 == 3 {
        return EntryData::Registry(RegistryChange::Declare {
            pair: n as u16,
            partition_count: 1,
            name: format!("t{n}").into_bytes(),
        });
    }
    EntryData::Batch(Batch {
        leader_wall_ms: 1_000 + n,
        parts: vec![BatchPart {
            topic_id: TOPIC,
            partition: 0,
            first_sequence: n + 1,
            count: 1,
            records: vec![n as u8; 64],
        }],
        positions: Vec::new(),
    })
}

fn refusal_of(c: &Cluster, i: usize) -> (ErrorCode, String) {
    let r = c.nodes[i].replica.admit(c.now_ms).unwrap_err();
    (r.code, r.text)
}

#[test]
fn a_leader_is_elected_and_every_node_applies_the_same_entries_in_the_same_order() {
    let mut c = Cluster::new();
    assert_eq!(refusal_of(&c, 0).0, ErrorCode::LeaderUnknown);
    let l = c.settled_leader();
    let leader_id = c.nodes[l].replica.id();
    assert_eq!(c.nodes[l].replica.admit(c.now_ms), Ok(()));
    for f in (0..c.nodes.len()).filter(|&f| f != l) {
        let text = format!("leader {leader_id} {}", test_address(leader_id));
        assert_eq!(refusal_of(&c, f), (ErrorCode::NotLeader, text));
    }
    let wanted: Vec<EntryData> = (0..12).map(proposal).collect();
    for (n, e) in wanted.iter().enumerate() {
        let now = c.now_ms;
        c.nodes[l]
            .replica
            .propose(e, vec![waiter(n as u64)], now)
            .unwrap();
        if n % 5 == 0 {
            c.deliver(); // entries commit across several passes
        }
    }
    c.run_until("every node applied 12", |c| {
        c.nodes.iter().all(|n| n.applied.len() == 12)
    });
    let term = c.nodes[l].replica.term();
    for n in &c.nodes {
        assert_eq!(
            n.applied, c.nodes[l].applied,
            "same indexes and terms everywhere"
        );
        let entries: Vec<&EntryData> = n.applied.iter().map(|a| &a.2).collect();
        assert_eq!(
            entries,
            wanted.iter().collect::<Vec<_>>(),
            "in proposal order"
        );
    }
    let answers = &c.nodes[l].answers;
    assert_eq!(answers.len(), 12);
    let mut last_index = 0;
    for (slot, (w, result)) in answers.iter().enumerate() {
        assert_eq!(w.slot, slot as u64, "answered in order");
        let ok = result.unwrap();
        assert_eq!(ok.leader_epoch, term);
        assert!(ok.index > last_index);
        last_index = ok.index;
        // The highest BATCH sequence committed up to this entry, on this partition.
        let seq = (0..=slot as u64).filter(|n| n % 4 != 3).max().unwrap() + 1;
        assert_eq!(ok.commit_seq, seq, "slot {slot}");
    }
}

#[test]
fn a_follower_acknowledges_an_append_only_after_its_persist_job_completed() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let followers: Vec<usize> = (0..c.nodes.len()).filter(|&f| f != l).collect();
    for &f in &followers {
        c.nodes[f].hold_persist = true;
        c.nodes[f].sent.clear();
    }
    let now = c.now_ms;
    let index = c.nodes[l]
        .replica
        .propose(&proposal(0), vec![waiter(0)], now)
        .unwrap();
    // A few heartbeats' worth of rounds, fewer than check-quorum's election timeout.
    for _ in 0..ELECTION_TICKS / 2 {
        c.now_ms += 50;
        c.nodes[l].replica.tick();
        c.deliver();
    }
    let acks = |n: &Node| {
        let append_ack = |m: &&Message| m.get_msg_type() == MessageType::MsgAppendResponse;
        n.sent.iter().filter(append_ack).count()
    };
    for &f in &followers {
        assert!(
            !c.nodes[f].jobs.is_empty(),
            "the append waits for its fsync"
        );
        assert_eq!(
            acks(&c.nodes[f]),
            0,
            "node {f} acknowledged before its fsync"
        );
    }
    assert!(
        c.nodes[l].replica.commit_index() < index,
        "committed unfsynced"
    );
    assert!(c.nodes[l].answers.is_empty());
    // One follower's fsync completes: with the leader's own, a majority.
    let f = followers[0];
    c.complete_jobs(f);
    c.deliver();
    assert!(acks(&c.nodes[f]) > 0);
    assert!(c.nodes[l].replica.commit_index() >= index);
    let (_, result) = c.nodes[l].answers[0];
    assert_eq!(result.unwrap().index, index);
}

#[test]
fn appends_that_arrive_while_a_follower_fsyncs_wait_for_one_sync_that_covers_them_all() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let f = (0..c.nodes.len()).find(|&f| f != l).unwrap();
    c.nodes[f].hold_persist = true;
    c.nodes[f].sent.clear();
    let mut last = 0;
    for n in 0..3 {
        let now = c.now_ms;
        last = c.nodes[l]
            .replica
            .propose(&proposal(n), vec![waiter(n)], now)
            .unwrap();
        c.deliver(); // one append, one Ready on the follower, each time
    }
    let acked = |n: &Node| {
        let append_ack = |m: &&Message| m.get_msg_type() == MessageType::MsgAppendResponse;
        n.sent.iter().filter(append_ack).map(|m| m.index).max()
    };
    assert_eq!(
        c.nodes[f].jobs.len(),
        1,
        "the later appends wait for the sync in flight (RAFT_SYNCS_IN_FLIGHT_MAX)"
    );
    assert_eq!(acked(&c.nodes[f]), None, "acknowledged before its fsync");
    c.complete_jobs(f);
    c.deliver();
    assert_eq!(c.nodes[f].jobs.len(), 1, "one sync for all that waited");
    assert!(
        acked(&c.nodes[f]).is_some_and(|i| i < last),
        "only the first synced"
    );
    c.complete_jobs(f);
    c.deliver();
    assert_eq!(acked(&c.nodes[f]), Some(last));
    assert!(c.nodes[f].jobs.is_empty());
}

#[test]
fn a_new_leader_truncates_the_old_leaders_entries_whose_waiters_get_log_truncated() {
    let mut c = Cluster::new();
    let old = c.settled_leader();
    let old_term = c.nodes[old].replica.term();
    // The leader appends three entries no follower hears of, then stops (SIGSTOP).
    c.nodes[old].mute = true;
    let now = c.now_ms;
    for n in 0..3 {
        c.nodes[old]
            .replica
            .propose(&proposal(n), vec![waiter(n)], now)
            .unwrap();
    }
    c.pass(old);
    assert!(c.nodes[old].answers.is_empty());
    c.nodes[old].paused = true;
    let new = c.settled_leader();
    let new_id = c.nodes[new].replica.id();
    assert!(c.nodes[new].replica.term() > old_term);
    let now = c.now_ms;
    c.nodes[new]
        .replica
        .propose(&proposal(4), vec![waiter(9)], now)
        .unwrap();
    c.run_until("the new leader's entry applied", |c| {
        c.nodes[new].applied.len() == 1
    });
    // SIGCONT: the old leader reads what queued up while it was stopped.
    c.nodes[old].paused = false;
    c.nodes[old].mute = false;
    c.deliver();
    let answers = &c.nodes[old].answers;
    assert_eq!(answers.len(), 3, "{answers:?}");
    for (n, (w, result)) in answers.iter().enumerate() {
        assert_eq!((w.slot, *result), (n as u64, Err(ErrorCode::LogTruncated)));
    }
    let text = format!("leader {new_id} {}", test_address(new_id));
    assert_eq!(refusal_of(&c, old), (ErrorCode::NotLeader, text));
    c.run_until("every node applied the new leader's entry", |c| {
        c.nodes.iter().all(|n| n.applied == c.nodes[new].applied)
    });
    assert_eq!(
        c.nodes[old].applied[0].2,
        proposal(4),
        "nothing of the lost entries"
    );
}

#[test]
fn a_node_without_a_leader_answers_leader_unknown_then_election_timeout() {
    let c = Cluster::new();
    let gate = |now_ms| c.nodes[0].replica.admit(now_ms).unwrap_err().code;
    assert_eq!(gate(REPLICATION_TIMEOUT_MS - 1), ErrorCode::LeaderUnknown);
    assert_eq!(gate(REPLICATION_TIMEOUT_MS), ErrorCode::ElectionTimeout);
}

#[test]
fn a_leader_cut_off_steps_down_and_fails_its_waiters_with_not_enough_replicas_after_append() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    c.nodes[l].isolated = true;
    let now = c.now_ms;
    c.nodes[l]
        .replica
        .propose(&proposal(0), vec![waiter(0)], now)
        .unwrap();
    // Check-quorum: one election timeout without hearing from a majority.
    c.run_until("the cut-off leader steps down", |c| {
        !c.nodes[l].replica.is_leader()
    });
    let answers = &c.nodes[l].answers;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].1, Err(ErrorCode::NotEnoughReplicasAfterAppend));
    assert_eq!(refusal_of(&c, l).0, ErrorCode::LeaderUnknown);
}

#[test]
fn proposals_past_the_uncommitted_bytes_answer_backpressure() {
    use super::machine::UNCOMMITTED_BYTES_MAX;
    const ENTRY_BYTES: usize = 1024 * 1024;
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let big = EntryData::Batch(Batch {
        leader_wall_ms: 0,
        parts: vec![BatchPart {
            topic_id: TOPIC,
            partition: 0,
            first_sequence: 1,
            count: 1,
            records: vec![0; ENTRY_BYTES],
        }],
        positions: Vec::new(),
    });
    let now = c.now_ms;
    let mut accepted = 0u64;
    let refusal = loop {
        match c.nodes[l].replica.propose(&big, Vec::new(), now) {
            Ok(_) => accepted += 1,
            Err(r) => break r,
        }
        assert!(
            accepted <= UNCOMMITTED_BYTES_MAX / ENTRY_BYTES as u64,
            "never refused"
        );
    };
    assert_eq!(refusal.code, ErrorCode::Backpressure);
    assert_eq!(accepted, UNCOMMITTED_BYTES_MAX / ENTRY_BYTES as u64 - 1);
}

#[test]
fn a_follower_that_loses_power_comes_back_with_what_it_acknowledged_and_applies_it_again() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    for n in 0..5 {
        let now = c.now_ms;
        c.nodes[l]
            .replica
            .propose(&proposal(n), vec![waiter(n)], now)
            .unwrap();
    }
    c.run_until("5 applied everywhere", |c| {
        c.nodes.iter().all(|n| n.applied.len() == 5)
    });
    let f = (l + 1) % c.nodes.len();
    let acknowledged = c.nodes[f].replica.commit_index();
    // Three more reach the follower, whose fsync never completes: they are not its to keep.
    c.nodes[f].hold_persist = true;
    for n in 5..8 {
        let now = c.now_ms;
        c.nodes[l]
            .replica
            .propose(&proposal(n), vec![waiter(n)], now)
            .unwrap();
    }
    c.deliver();
    assert!(!c.nodes[f].jobs.is_empty());
    let disk = c.nodes[f].disk.clone();
    disk.power_cut();
    c.nodes[f] = open_node(f as u64 + 1, disk);
    let last = c.nodes[f].replica.last_index();
    assert!(last >= acknowledged, "lost {last} < {acknowledged}");
    c.run_until("the follower caught up", |c| {
        c.nodes[f].applied.len() == 8 && c.nodes[l].applied.len() == 8
    });
    assert_eq!(
        c.nodes[f].applied, c.nodes[l].applied,
        "the same log, applied again"
    );
}

#[test]
fn a_waiter_past_the_replication_timeout_gets_replication_timeout_and_its_entry_still_commits() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    for f in (0..c.nodes.len()).filter(|&f| f != l) {
        c.nodes[f].hold_persist = true;
    }
    let since = c.now_ms;
    let index = c.nodes[l]
        .replica
        .propose(&proposal(0), vec![waiter(0)], since)
        .unwrap();
    c.deliver();
    c.now_ms = since + REPLICATION_TIMEOUT_MS - 1;
    c.pass(l);
    assert!(c.nodes[l].answers.is_empty(), "too early");
    c.now_ms += 1;
    c.pass(l);
    assert_eq!(
        c.nodes[l].answers,
        vec![(waiter(0), Err(ErrorCode::ReplicationTimeout))]
    );
    // Still leader: the entry stays, commits once the followers' fsyncs complete, and
    // nobody is answered twice.
    for f in (0..c.nodes.len()).filter(|&f| f != l) {
        c.nodes[f].hold_persist = false;
        c.complete_jobs(f);
    }
    c.deliver();
    c.run_until("the entry applied everywhere", |c| {
        c.nodes.iter().all(|n| n.applied.len() == 1)
    });
    assert_eq!(c.nodes[l].applied[0].0, index);
    assert_eq!(c.nodes[l].answers.len(), 1);
}

#[test]
fn a_leader_that_has_not_heard_from_a_majority_answers_not_enough_replicas_before_it_steps_down() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    assert_eq!(c.nodes[l].replica.check_replicas(), Ok(()));
    c.nodes[l].isolated = true;
    let mut ticks = 0;
    let refusal = loop {
        assert!(
            c.nodes[l].replica.is_leader(),
            "stepped down before refusing"
        );
        if let Err(r) = c.nodes[l].replica.check_replicas() {
            break r;
        }
        c.nodes[l].replica.tick();
        c.pass(l);
        ticks += 1;
    };
    assert_eq!(refusal.code, ErrorCode::NotEnoughReplicas);
    assert_eq!(refusal.text, "1 of 3 nodes reachable");
    assert_eq!(
        ticks, ELECTION_TICKS,
        "one election timeout after the last message"
    );
}

#[test]
fn a_leader_whose_followers_were_silent_past_the_lease_holds_a_committed_waiters_ok() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let followers: Vec<usize> = (0..c.nodes.len()).filter(|&f| f != l).collect();
    assert!(c.nodes[l].replica.lease_valid(c.now_ms));
    // Heartbeats go out, their answers are lost: past the lease (400 ms), short of
    // check-quorum's election timeout (500 ms), so still leader.
    for &f in &followers {
        c.nodes[f].mute = true;
    }
    for _ in 0..ELECTION_TICKS - 1 {
        c.now_ms += 50;
        c.nodes[l].replica.tick();
        c.deliver();
    }
    assert!(c.nodes[l].replica.is_leader());
    assert!(!c.nodes[l].replica.lease_valid(c.now_ms));
    // The followers are heard again, but only their append responses: no tick, so no
    // heartbeat, and the entry commits with the lease still out.
    for &f in &followers {
        c.nodes[f].mute = false;
    }
    let now = c.now_ms;
    let index = c.nodes[l]
        .replica
        .propose(&proposal(0), vec![waiter(0)], now)
        .unwrap();
    c.deliver();
    assert!(c.nodes[l].replica.commit_index() >= index);
    assert_eq!(c.nodes[l].applied.len(), 1, "committed and applied");
    assert!(c.nodes[l].answers.is_empty(), "OK sent without a lease");
    // One heartbeat round answered: the lease is back and the OK goes out.
    c.run_until("the OK", |c| !c.nodes[l].answers.is_empty());
    assert!(c.nodes[l].replica.lease_valid(c.now_ms));
    let (w, result) = c.nodes[l].answers[0];
    assert_eq!((w.slot, result.unwrap().index), (0, index));
}

#[test]
fn a_restarted_follower_grants_no_vote_within_its_first_election_timeout() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let f = (l + 1) % c.nodes.len();
    let other = (l + 2) % c.nodes.len();
    // The follower answered the leader's heartbeats (a promise), then restarts at once.
    let disk = c.nodes[f].disk.clone();
    disk.power_cut();
    c.nodes[f] = open_node(f as u64 + 1, disk);
    let ask = |c: &Cluster| {
        let r = &c.nodes[other].replica;
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgRequestVote);
        (m.from, m.to) = (r.id(), f as u64 + 1);
        (m.term, m.log_term, m.index) = (r.term() + 1, r.term(), r.last_index());
        m
    };
    let granted = |n: &Node| {
        let vote = |m: &&Message| m.get_msg_type() == MessageType::MsgRequestVoteResponse;
        n.sent.iter().filter(vote).any(|m| !m.reject)
    };
    for _ in 0..ELECTION_TICKS {
        let m = ask(&c);
        c.nodes[f].replica.step(m).unwrap();
        c.pass(f);
        c.nodes[f].inbox.clear();
        assert!(!granted(&c.nodes[f]), "voted within the promise");
        c.nodes[f].replica.tick();
    }
    // An election timeout later the promise has run out.
    let m = ask(&c);
    c.nodes[f].replica.step(m).unwrap();
    c.pass(f);
    assert!(granted(&c.nodes[f]), "never votes");
}

/// Issue 42's forgeries, as a peer's messages reach `Replica::step`: node `other`'s
/// name on a snapshot far in the future and an append that conflicts with committed
/// entries. Each is refused or held; raft neither panics nor installs.
#[test]
fn forged_snapshots_appends_and_acknowledgements_are_refused_not_stepped() {
    use super::vet::Lie;
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let (f, other) = ((l + 1) % 3, (l + 2) % 3);
    for n in 0..4 {
        let now = c.now_ms;
        c.nodes[l]
            .replica
            .propose(&proposal(n), vec![waiter(n)], now)
            .unwrap();
        c.deliver();
    }
    let committed = c.nodes[f].replica.commit_index();
    assert!(committed >= 4);
    let id = |i: usize| i as u64 + 1;
    let forged = |kind, from, to, term| {
        let mut m = Message::default();
        m.set_msg_type(kind);
        (m.from, m.to, m.term) = (id(from), id(to), term);
        m
    };
    let mut snap = forged(MessageType::MsgSnapshot, other, f, 1000);
    let meta = snap.mut_snapshot().mut_metadata();
    (meta.index, meta.term) = (1_000_000, 1000);
    meta.mut_conf_state().voters = vec![1, 2, 3];
    // The 40 bytes of issue 42 name no manifest: refused. One that does waits for a
    // leader of term 1000, which this node never hears from.
    let refused = c.nodes[f].replica.step(snap.clone());
    assert!(
        matches!(
            refused,
            Err(super::machine::ReplicaError::Refused {
                lie: Lie::Snapshot,
                ..
            })
        ),
        "{refused:?}"
    );
    let data = super::install::SnapshotData::naming(b"m", 1_000_000, 1000);
    snap.mut_snapshot().data = data.encode().into();
    let held = c.nodes[f].replica.step(snap);
    assert!(
        held.is_ok(),
        "held for a leader of term 1000 it never hears: {held:?}"
    );
    let mut conflict = forged(MessageType::MsgAppend, l, f, c.nodes[l].replica.term());
    (conflict.index, conflict.log_term) = (committed, c.nodes[l].replica.term());
    let mut entry = raft::eraftpb::Entry::default();
    (entry.index, entry.term) = (1, 1);
    conflict.entries.push(entry);
    let refused = c.nodes[f].replica.step(conflict);
    assert!(
        matches!(
            refused,
            Err(super::machine::ReplicaError::Refused {
                lie: Lie::Entries,
                ..
            })
        ),
        "{refused:?}"
    );
    c.run_until("a few rounds", |c| c.now_ms >= 2_000);
    assert_eq!(c.leader(), Some(l), "the forgeries cost no election");
    assert!(
        c.nodes[f].replica.commit_index() >= committed,
        "nothing installed"
    );
}

/// Issue 42's third row: with both followers killed, acknowledgements "from" them (an
/// index past the log, a lease stamp from the future) every round. The leader neither
/// commits nor answers alone.
#[test]
fn forged_acknowledgements_do_not_let_a_leader_commit_alone() {
    let mut c = Cluster::new();
    let l = c.settled_leader();
    let (f, other) = ((l + 1) % 3, (l + 2) % 3);
    let forged = |kind, from: usize, term| {
        let mut m = Message::default();
        m.set_msg_type(kind);
        (m.from, m.to, m.term) = (from as u64 + 1, l as u64 + 1, term);
        m
    };
    c.nodes[f].isolated = true;
    c.nodes[other].isolated = true;
    let now = c.now_ms;
    let index = c.nodes[l]
        .replica
        .propose(&proposal(9), vec![waiter(9)], now)
        .unwrap();
    for _ in 0..ELECTION_TICKS / 2 {
        c.now_ms += 50;
        c.nodes[l].replica.tick();
        for from in [f, other] {
            let term = c.nodes[l].replica.term();
            let mut ack = forged(MessageType::MsgAppendResponse, from, term);
            ack.index = 1 << 40;
            let mut beat = forged(MessageType::MsgHeartbeatResponse, from, term);
            beat.context = super::machine::lease_stamp(term, u64::MAX).into();
            for m in [ack, beat] {
                let refused = c.nodes[l].replica.step(m);
                assert!(matches!(
                    refused,
                    Err(super::machine::ReplicaError::Refused { .. })
                ));
            }
        }
        c.deliver();
    }
    assert!(c.nodes[l].replica.commit_index() < index, "committed alone");
    assert!(
        c.nodes[l].answers.iter().all(|(w, _)| w.slot != 9),
        "answered alone"
    );
}

//! Waiting on another process: a condition polled until it holds or a limit passes.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Between two looks: short beside every limit, and long enough that the waiting test
/// does not take a core from the broker it waits on (CI machines have two).
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `ready` until it holds; panics naming `what` once `limit` has passed.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(POLL_INTERVAL);
    }
}

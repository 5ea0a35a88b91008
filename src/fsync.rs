//! The fsync worker pool: durable I/O off the reactor thread.
//!
//! The reactor never calls fsync. It hands a job (an fdatasync of a partition's
//! segments, or an atomic metadata write) to one of `--fsync-threads` workers; the
//! worker runs it and sends a [`Completion`] back on a channel, then calls the wake
//! callback (the reactor passes a `mio::Waker`; this room does not depend on mio).
//! Jobs are data (after Redis's `bio.c`): the caller's own enum, implementing [`Job`],
//! that comes back whole in its completion, so nothing is looked up by id.
//! Group commit is the caller's business: the broker keeps few syncs in flight per
//! partition, so every PUB that arrives while one runs is covered by the next.
//!
//! Depends on nothing else in the crate.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Work for a worker: self-contained (it owns its files and bytes) and returned whole in
/// its [`Completion`].
pub trait Job: Send + 'static {
    fn run(&mut self) -> io::Result<()>;
}

/// One finished job, given back with its result.
#[derive(Debug)]
pub struct Completion<J> {
    pub job: J,
    pub result: io::Result<()>,
    /// Wall time the job took on the worker (fsync latency).
    pub elapsed: Duration,
}

pub struct FsyncPool<J: Job> {
    jobs: Sender<Option<J>>,
    done: Receiver<Completion<J>>,
    workers: Vec<JoinHandle<()>>,
}

/// A cloneable handle that submits jobs to the pool (held by the broker).
pub struct Submitter<J>(Sender<Option<J>>);

impl<J> Clone for Submitter<J> {
    fn clone(&self) -> Self {
        Submitter(self.0.clone())
    }
}

impl<J: Job> Submitter<J> {
    pub fn submit(&self, job: J) {
        // Send fails only once the pool has shut down; the job's waiters are then
        // answered by the final synchronous sync at shutdown.
        if self.0.send(Some(job)).is_err() {
            log::error!("fsync pool is shut down; a job was dropped");
        }
    }
}

impl<J: Job> FsyncPool<J> {
    pub fn new(threads: usize, wake: Arc<dyn Fn() + Send + Sync>) -> io::Result<FsyncPool<J>> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Option<J>>();
        let (done_tx, done_rx) = mpsc::channel();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let mut workers = Vec::with_capacity(threads);
        for n in 0..threads.max(1) {
            let jobs_rx = Arc::clone(&jobs_rx);
            let done_tx = done_tx.clone();
            let wake = Arc::clone(&wake);
            let worker = std::thread::Builder::new()
                .name(format!("mortar-fsync-{n}"))
                .spawn(move || worker_loop(&jobs_rx, &done_tx, &*wake))?;
            workers.push(worker);
        }
        Ok(FsyncPool {
            jobs: jobs_tx,
            done: done_rx,
            workers,
        })
    }

    pub fn submitter(&self) -> Submitter<J> {
        Submitter(self.jobs.clone())
    }

    pub fn submit(&self, job: J) {
        self.submitter().submit(job)
    }

    /// Moves every finished job's completion into `out` without blocking.
    pub fn drain_completions(&self, out: &mut Vec<Completion<J>>) {
        out.extend(self.done.try_iter());
    }

    /// Waits for every submitted job to finish, then stops the workers.
    pub fn shutdown(mut self) -> Vec<Completion<J>> {
        // One stop marker per worker, queued behind every job already submitted;
        // submitters may still hold the channel, so closing it would not stop them.
        for _ in 0..self.workers.len() {
            let _ = self.jobs.send(None);
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        self.done.try_iter().collect()
    }
}

fn worker_loop<J: Job>(
    jobs: &Mutex<Receiver<Option<J>>>,
    done: &Sender<Completion<J>>,
    wake: &dyn Fn(),
) {
    loop {
        // The lock is held only while waiting for the next job, never while running it.
        let next = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(Some(mut job)) = next else { return };
        let started = Instant::now();
        let result = job.run();
        let completion = Completion {
            job,
            result,
            elapsed: started.elapsed(),
        };
        if done.send(completion).is_err() {
            return;
        }
        wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Numbered(u64);

    impl Job for Numbered {
        fn run(&mut self) -> io::Result<()> {
            if self.0 == 3 {
                Err(io::Error::other("boom"))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn jobs_complete_and_wake_the_submitter() {
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = Arc::clone(&wakes);
        let pool = FsyncPool::new(
            2,
            Arc::new(move || {
                w.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
        for id in 0..10 {
            pool.submit(Numbered(id));
        }
        let done = pool.shutdown();
        assert_eq!(done.len(), 10);
        assert_eq!(wakes.load(Ordering::SeqCst), 10);
        let failed: Vec<u64> = done
            .iter()
            .filter(|c| c.result.is_err())
            .map(|c| c.job.0)
            .collect();
        assert_eq!(failed, vec![3]);
    }
}

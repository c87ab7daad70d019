//! A tiny persistent thread pool for the forward pass.
//!
//! Why not rayon: a decode step issues a few hundred small parallel loops, and rayon's injector
//! allocates as jobs flow through it, which the zero-allocation decode loop forbids. This pool
//! hands every worker the same `&dyn Fn(worker_index)` and waits for all of them: no allocation
//! per dispatch. Idle workers spin briefly (dispatches inside one token come microseconds apart)
//! and then park, so an idle server burns no CPU on a shared vCPU.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    generation: AtomicU64,
    /// Written by the dispatcher before `generation` is bumped; read by workers after they see
    /// the bump (release/acquire on `generation`). Valid until `pending` reaches zero.
    job: UnsafeCell<Option<&'static Job>>,
    pending: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written while no worker reads it (between dispatches, guarded by
// `dispatch_lock` and `pending == 0`), and read only after the generation bump publishes it.
unsafe impl Sync for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    dispatch_lock: Mutex<()>,
}

impl Pool {
    /// A pool running jobs on `threads` threads in all: the caller plus `threads - 1` workers.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("llm-worker-{index}"))
                    .spawn(move || worker(&shared, index))
                    .expect("spawning a worker thread")
            })
            .collect();
        Pool {
            shared,
            workers,
            dispatch_lock: Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` once for every thread index `i` in `0..threads()`, in parallel, and returns
    /// when all have finished. Concurrent callers are serialised.
    pub fn broadcast(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _guard = self.dispatch_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: we wait below until every worker is done with `f` before returning, so
        // extending its lifetime to 'static never lets a worker see it dangle.
        let job: &'static Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(f) };
        unsafe { *s.job.get() = Some(job) };
        s.pending.store(self.workers.len(), Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Splits `0..n` into chunks of `chunk` and runs `f(thread_index, range)` over them on all
    /// threads, handing out chunks dynamically so a thread slowed by a noisy neighbour takes
    /// fewer. `thread_index` (< `threads()`) lets tasks use per-thread scratch.
    pub fn for_chunks(&self, n: usize, chunk: usize, f: &(dyn Fn(usize, Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        if self.workers.is_empty() || n <= chunk {
            if n > 0 {
                f(0, 0..n);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        self.broadcast(&|thread| loop {
            let start = next.fetch_add(chunk, Ordering::Relaxed);
            if start >= n {
                break;
            }
            f(thread, start..(start + chunk).min(n));
        });
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut generation = s.generation.load(Ordering::Acquire);
        while generation == seen && !s.shutdown.load(Ordering::Relaxed) {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen
                    && !s.shutdown.load(Ordering::SeqCst)
                {
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            generation = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = generation;
        // SAFETY: published by the generation bump; the dispatcher keeps it alive until
        // `pending` reaches zero, which happens only after this call.
        let job = unsafe { *s.job.get() }.expect("a job is published with every generation");
        // A panicking job must still be counted, or the dispatcher would wait forever.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index)));
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_exactly_once_across_threads() {
        for threads in 1..=3 {
            let pool = Pool::new(threads);
            for n in [0, 1, 7, 64, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.for_chunks(n, 5, &|_, r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "threads {threads} n {n}"
                );
            }
        }
    }

    #[test]
    fn parked_workers_wake_for_the_next_dispatch() {
        let pool = Pool::new(2);
        let count = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(SPIN * 5); // let the worker park
            pool.broadcast(&|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(count.load(Ordering::Relaxed), 6);
    }
}

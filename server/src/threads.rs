//! A tiny persistent thread pool for the forward pass.
//!
//! Why not rayon: a decode step issues a few hundred small parallel loops, and rayon's injector
//! allocates as jobs flow through it, which the zero-allocation decode loop forbids. This pool
//! hands every worker the same `&dyn Fn(worker_index)` and waits for the workers that took it:
//! no allocation per dispatch. Idle workers spin briefly (dispatches inside one token come
//! microseconds apart) and then park, so an idle server burns no CPU on a shared vCPU.
//!
//! In [`Pool::for_chunks`] a worker only helps: the dispatcher takes chunks itself, and once
//! none is left it waits for the workers that joined, not for those that did not show up yet.
//! On a machine shared with other work a worker is often descheduled (or parked after a pause
//! between tokens) when a loop is dispatched; waiting for it to wake up only to find nothing
//! to do cost the decode thread a scheduler time slice per loop.

mod default_count;

pub use default_count::{
    choose, cpu_quota, default_threads, parse_cfs, parse_cpu_max, CpuQuota, DefaultThreads,
};

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);
/// Spins between looks at the clock: reading it every spin made up 5 % of a profile.
const SPINS_PER_CLOCK_READ: u32 = 64;

type Job = dyn Fn(usize) + Sync;

/// [`Shared::ticket`]: the dispatch's generation in the high 32 bits (it wraps, which is fine:
/// a worker only asks whether it changed), then [`CLOSED`], then how many workers joined it.
const GENERATION_SHIFT: u32 = 32;
const CLOSED: u64 = 1 << 31;
const JOINED: u64 = CLOSED - 1;

fn generation_of(ticket: u64) -> u64 {
    ticket >> GENERATION_SHIFT
}

struct Shared {
    /// The current dispatch, and who joined it (see [`GENERATION_SHIFT`]). A worker joins by
    /// incrementing the count while the generation is the one it saw and it is not closed, so
    /// it never runs a job the dispatcher stopped waiting for.
    ticket: AtomicU64,
    /// Written by the dispatcher before the ticket's generation is bumped; read by workers
    /// after they joined (release/acquire on `ticket`). Valid until every joined worker is
    /// counted in `finished`.
    job: UnsafeCell<Option<&'static Job>>,
    /// Joined workers done with the current job.
    finished: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written while no worker reads it (between dispatches, guarded by
// `dispatch_lock`, after every joined worker finished), and read only by a worker that joined
// the generation that published it.
unsafe impl Sync for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    dispatch_lock: Mutex<()>,
}

/// Whether a dispatch waits for every worker to run the job, or only for those that joined
/// before the dispatcher finished its own part.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Everyone,
    Joined,
}

impl Pool {
    /// A pool running jobs on `threads` threads in all: the caller plus `threads - 1` workers.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            ticket: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            finished: AtomicUsize::new(0),
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
        self.dispatch(f, Wait::Everyone);
    }

    fn dispatch(&self, f: &(dyn Fn(usize) + Sync), wait: Wait) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _guard = self.dispatch_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: we wait below until every worker that joined is done with `f` before
        // returning, and no worker joins after that, so extending its lifetime to 'static
        // never lets a worker see it dangle.
        let job: &'static Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(f) };
        unsafe { *s.job.get() = Some(job) };
        s.finished.store(0, Ordering::Relaxed);
        let generation = generation_of(s.ticket.load(Ordering::Relaxed)) + 1;
        s.ticket
            .store(generation << GENERATION_SHIFT, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        if wait == Wait::Everyone {
            let everyone = self.workers.len() as u64;
            spin_until(|| s.ticket.load(Ordering::Acquire) & JOINED == everyone);
        }
        let joined = (s.ticket.fetch_or(CLOSED, Ordering::AcqRel) & JOINED) as usize;
        spin_until(|| s.finished.load(Ordering::Acquire) == joined);
    }

    /// Splits `0..n` into chunks of `chunk` and runs `f(thread_index, range)` over them on all
    /// threads, handing out chunks dynamically so a thread slowed by a noisy neighbour takes
    /// fewer (a worker that is not running when the loop starts may take none).
    /// `thread_index` (< `threads()`) lets tasks use per-thread scratch.
    pub fn for_chunks(&self, n: usize, chunk: usize, f: &(dyn Fn(usize, Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        if self.workers.is_empty() || n <= chunk {
            if n > 0 {
                f(0, 0..n);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        self.dispatch(
            &|thread| loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n {
                    break;
                }
                f(thread, start..(start + chunk).min(n));
            },
            Wait::Joined,
        );
    }

    /// Runs `f(first_row, rows)` over `data` cut into rows of `row_len` values, at least
    /// `min_values` values per chunk (whole rows), the chunks shared out as in
    /// [`Pool::for_chunks`]: prefill's per-token steps (an activation row's quantisation, the
    /// gated unit) run on every thread instead of on the caller alone. One row, or fewer values
    /// than a chunk, runs on the caller without waking a worker (decode).
    pub fn for_rows_mut<T: Send>(
        &self,
        data: &mut [T],
        row_len: usize,
        min_values: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let row_len = row_len.max(1);
        let rows = data.len() / row_len;
        let chunk = min_values.div_ceil(row_len).max(1);
        let base = SharedMut::new(data.as_mut_ptr());
        self.for_chunks(rows, chunk, &|_, range| {
            // SAFETY: `for_chunks` hands out disjoint row ranges below `rows`, so each call
            // borrows its own part of `data`, which outlives the dispatch.
            let part = unsafe { base.slice_mut(range.start * row_len, range.len() * row_len) };
            f(range.start, part);
        });
    }
}

/// A pointer into one buffer that parallel tasks share, each writing its own disjoint part:
/// [`Pool::for_rows_mut`]'s rows, a matmul's output rows, attention's (token, head) outputs
/// and per-thread scratch.
///
/// The borrow checker cannot see that the parts are disjoint, so the caller takes the buffer's
/// pointer (`new`), shares the wrapper with the tasks (it is `Sync` and `Send` when `T: Send`),
/// and each task borrows its part with [`SharedMut::slice_mut`]. Sharing is sound as long as
/// the callers keep its contract: every element is reached by at most one task at a time, the
/// parts stay inside the buffer, and the buffer outlives the tasks (and is not otherwise
/// touched while they run).
///
/// The pointer is reached through methods only, so that closures capture the whole (`Sync`)
/// wrapper rather than its raw-pointer field.
pub(crate) struct SharedMut<T>(*mut T);

// Not derived: the derive would ask `T: Copy`; the wrapper copies a pointer, not a `T`.
impl<T> Clone for SharedMut<T> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}

// SAFETY: tasks reach only disjoint parts of the buffer through it, each part from one thread
// at a time (the contract of `slice_mut`), and `T: Send`, so handing those parts to other
// threads is sound.
unsafe impl<T: Send> Sync for SharedMut<T> {}
// SAFETY: as for `Sync`.
unsafe impl<T: Send> Send for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// Wraps `ptr`, the start of the shared buffer (may be null or dangling if never
    /// dereferenced through [`SharedMut::slice_mut`]).
    #[inline]
    pub(crate) fn new(ptr: *mut T) -> Self {
        SharedMut(ptr)
    }

    /// The `len` elements from `start` of the buffer.
    ///
    /// # Safety
    /// `start..start + len` lies inside the buffer the pointer came from, which stays alive
    /// and is not otherwise accessed for `'a`; no other live reference (this task's or another
    /// task's) overlaps these elements for `'a`.
    #[inline]
    pub(crate) unsafe fn slice_mut<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: in bounds and unaliased (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// Spins, then yields, until `done()`.
fn spin_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins += 1;
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let ticket = wait_for_dispatch(s, seen);
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = generation_of(ticket);
        if !join(s, ticket) {
            continue; // the dispatcher finished without this worker
        }
        // SAFETY: published before the ticket this worker joined; the dispatcher keeps it
        // alive until `finished` counts this worker, which happens only after this call.
        let job = unsafe { *s.job.get() }.expect("a job is published with every generation");
        // A panicking job must still be counted, or the dispatcher would wait forever.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index)));
        s.finished.fetch_add(1, Ordering::Release);
    }
}

/// The ticket of the first dispatch after generation `seen` (or any, at shutdown): spins for
/// [`SPIN`], then parks.
fn wait_for_dispatch(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let ticket = s.ticket.load(Ordering::Acquire);
        if generation_of(ticket) != seen || s.shutdown.load(Ordering::Relaxed) {
            return ticket;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(SPINS_PER_CLOCK_READ) || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.sleepers.fetch_add(1, Ordering::SeqCst);
        while generation_of(s.ticket.load(Ordering::SeqCst)) == seen
            && !s.shutdown.load(Ordering::SeqCst)
        {
            l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
        }
        s.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(l);
        return s.ticket.load(Ordering::Acquire);
    }
}

/// Counts this worker in the dispatch of `ticket`, unless it was closed or replaced meanwhile.
fn join(s: &Shared, mut ticket: u64) -> bool {
    let generation = generation_of(ticket);
    while generation_of(ticket) == generation && ticket & CLOSED == 0 {
        match s.ticket.compare_exchange_weak(
            ticket,
            ticket + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return true,
            Err(now) => ticket = now,
        }
    }
    false
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
    fn many_short_loops_each_run_every_chunk_once() {
        // Workers join some loops and miss others (the dispatcher may take every chunk first):
        // either way each chunk runs once and no loop waits for a worker that did not join.
        let pool = Pool::new(3);
        let total = AtomicUsize::new(0);
        for i in 0..20_000 {
            let n = 2 + i % 7;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_chunks(n, 1, &|_, r| {
                for j in r {
                    hits[j].fetch_add(1, Ordering::Relaxed);
                    total.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "loop {i}"
            );
        }
        let expected: usize = (0..20_000).map(|i| 2 + i % 7).sum();
        assert_eq!(total.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn rows_mut_reach_every_row_once_at_its_index() {
        for threads in 1..=3 {
            let pool = Pool::new(threads);
            for (rows, row_len, min_values) in
                [(0, 4, 1), (1, 4, 1), (7, 3, 1), (64, 10, 25), (5, 8, 1000)]
            {
                let mut data = vec![0usize; rows * row_len];
                pool.for_rows_mut(&mut data, row_len, min_values, &|first, part| {
                    assert_eq!(part.len() % row_len, 0, "whole rows");
                    for (i, v) in part.iter_mut().enumerate() {
                        *v += first * row_len + i + 1;
                    }
                });
                let expected: Vec<usize> = (1..=rows * row_len).collect();
                assert_eq!(
                    data, expected,
                    "threads {threads} rows {rows} row_len {row_len}"
                );
            }
        }
    }

    #[test]
    fn broadcast_runs_on_every_thread() {
        let pool = Pool::new(3);
        for _ in 0..1000 {
            let seen: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.broadcast(&|i| {
                seen[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(seen.iter().all(|h| h.load(Ordering::Relaxed) == 1));
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

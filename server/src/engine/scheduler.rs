//! Slots, the request queue and the decode thread.
//!
//! Each of the `--parallel` slots owns a [`Session`] (its KV cache and scratch, allocated once at
//! start-up). One dedicated thread runs every slot, one step per slot per round: a chunk of the
//! prompt or one generated token. Decoding is CPU-bound and synchronous, so it never runs on the
//! tokio workers, and round-robin is fair on one or two cores where slots would otherwise fight
//! over the same CPUs. Jobs come in through the queue and report through their own channel; an
//! owner that goes away (the client disconnected) drops its receiver, and the slot is freed at
//! its next step.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use super::counters::Counters;
use super::generation::{FinishReason, Usage};
use super::job::{Event, Job, JobFailure, Refused};
use super::stop::StopMatcher;
use super::Slots;
use crate::model::{Model, Session};
use crate::sampler::Sampler;
use crate::tokenizer::StreamDecoder;

/// Prompt tokens evaluated per round: long prompts are split so that other slots keep
/// streaming while one slot reads a long prompt.
const PREFILL_CHUNK: usize = 64;

pub(super) struct Scheduler {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    n_ctx: usize,
    queue_capacity: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    counters: Arc<Counters>,
}

struct State {
    pending: VecDeque<Job>,
    /// Slots without a job, as the decode thread last left them.
    idle_slots: usize,
    stopping: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Scheduler {
    /// Allocates one session of `n_ctx` tokens per slot and starts the decode thread.
    pub fn start(
        model: Arc<Model>,
        slots: Slots,
        counters: Arc<Counters>,
    ) -> std::io::Result<Scheduler> {
        let Slots {
            parallel,
            n_ctx,
            queue: queue_capacity,
        } = slots;
        let slots: Vec<Slot> = (0..parallel)
            .map(|_| Slot {
                session: model.new_session(n_ctx),
                task: None,
            })
            .collect();
        counters.slots.store(parallel as u64, Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: VecDeque::with_capacity(queue_capacity + parallel),
                idle_slots: parallel,
                stopping: false,
            }),
            wake: Condvar::new(),
            counters,
        });
        let thread = std::thread::Builder::new()
            .name(super::DECODE_THREAD.into())
            .spawn({
                let shared = shared.clone();
                move || decode_loop(&model, &shared, slots)
            })?;
        Ok(Scheduler {
            shared,
            thread: Mutex::new(Some(thread)),
            n_ctx,
            queue_capacity,
        })
    }

    /// Each slot's context size.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Queues `job`, unless every slot is busy and `--queue` jobs are already waiting.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        let mut state = self.shared.lock();
        if state.stopping {
            return Err(Refused::ShuttingDown);
        }
        if state.pending.len() >= self.queue_capacity + state.idle_slots {
            return Err(Refused::QueueFull {
                queue: self.queue_capacity,
            });
        }
        state.pending.push_back(job);
        self.shared
            .counters
            .queue_depth
            .store(state.pending.len() as u64, Relaxed);
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Fails every queued and running job with [`JobFailure::ShuttingDown`], refuses new ones
    /// and waits for the decode thread to end.
    pub fn stop(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_one();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("the decode thread panicked");
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Slot {
    session: Session,
    task: Option<Task>,
}

/// The outcome of one step of a slot.
enum Step {
    Continue,
    /// The task is over; the event to send once the slot is free (`None`: the client left).
    Finished(Option<Event>),
}

/// A job running in a slot.
struct Task {
    job: Job,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// The prompt, then each generated token (what the repetition penalties look at).
    history: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens evaluated so far.
    prefilled: usize,
    generated: usize,
    max_tokens: usize,
    /// Released text, reused between tokens.
    text: String,
}

fn decode_loop(model: &Model, shared: &Shared, mut slots: Vec<Slot>) {
    let counters = &shared.counters;
    let slot_count = slots.len();
    loop {
        counters.beat();
        {
            let mut state = shared.lock();
            loop {
                if state.stopping {
                    for job in state.pending.drain(..) {
                        let _ = job.events.send(Event::Failed(JobFailure::ShuttingDown));
                    }
                    for slot in &mut slots {
                        if let Some(task) = slot.task.take() {
                            let _ = task
                                .job
                                .events
                                .send(Event::Failed(JobFailure::ShuttingDown));
                        }
                    }
                    counters.queue_depth.store(0, Relaxed);
                    counters.busy_slots.store(0, Relaxed);
                    return;
                }
                drop_abandoned(&mut state.pending, counters);
                for slot in slots.iter_mut().filter(|s| s.task.is_none()) {
                    let Some(job) = state.pending.pop_front() else {
                        break;
                    };
                    slot.session.clear();
                    slot.task = Some(Task::new(job, model, slot.session.n_ctx()));
                    state.idle_slots -= 1;
                }
                counters
                    .queue_depth
                    .store(state.pending.len() as u64, Relaxed);
                let busy = slots.len() - state.idle_slots;
                counters.busy_slots.store(busy as u64, Relaxed);
                if busy > 0 {
                    break;
                }
                state =
                    counters.idle(|| shared.wake.wait(state).unwrap_or_else(|e| e.into_inner()));
            }
        }
        for slot in &mut slots {
            let Step::Finished(last) = slot.step(model, counters) else {
                continue;
            };
            let Some(task) = slot.task.take() else {
                continue;
            };
            // The slot is counted free before the client hears the end, so that /metrics
            // read right after a response never shows it busy.
            let busy = {
                let mut state = shared.lock();
                state.idle_slots += 1;
                slot_count - state.idle_slots
            };
            counters.busy_slots.store(busy as u64, Relaxed);
            if let Some(event) = last {
                let _ = task.job.events.send(event);
            }
        }
    }
}

/// Removes queued jobs whose client left or whose time ran out while waiting.
fn drop_abandoned(pending: &mut VecDeque<Job>, counters: &Counters) {
    let now = Instant::now();
    pending.retain(|job| {
        if job.events.is_closed() {
            counters.cancelled.fetch_add(1, Relaxed);
            false
        } else if now >= job.deadline {
            let _ = job.events.send(Event::Failed(JobFailure::Timeout));
            false
        } else {
            true
        }
    });
}

impl Task {
    fn new(job: Job, model: &Model, n_ctx: usize) -> Task {
        let prompt_len = job.prompt.len();
        // Prompt and generated tokens together never outgrow the context.
        let mut history = Vec::with_capacity(n_ctx.max(prompt_len));
        history.extend_from_slice(&job.prompt);
        Task {
            sampler: Sampler::new(job.generation.sampler.clone(), model.tokenizer().n_vocab()),
            decoder: StreamDecoder::new(false),
            stop: StopMatcher::new(job.generation.stop.clone()),
            history,
            prompt_len,
            prefilled: 0,
            generated: 0,
            // Without max_tokens the end of the context ends the generation.
            max_tokens: job.generation.max_tokens.unwrap_or(usize::MAX),
            text: String::new(),
            job,
        }
    }

    fn send(&self, event: Event) {
        // A closed channel is noticed at the next step; nothing to do here.
        let _ = self.job.events.send(event);
    }

    /// Sends what is left of the text; returns the final event.
    fn finish(&mut self, finish: FinishReason, stopped: bool) -> Step {
        if !stopped {
            let tail = self.decoder.finish().unwrap_or_default();
            let stopped_now = self.stop.push(tail, &mut self.text);
            if !stopped_now {
                let mut rest = String::new();
                self.stop.finish(&mut rest);
                self.text.push_str(&rest);
            }
            if !self.text.is_empty() {
                let text = std::mem::take(&mut self.text);
                self.send(Event::Text(text));
            }
        }
        Step::Finished(Some(Event::Done {
            finish,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: self.generated,
            },
        }))
    }
}

impl Slot {
    /// Runs one step of this slot's task.
    fn step(&mut self, model: &Model, counters: &Counters) -> Step {
        let Slot { session, task } = self;
        let Some(task) = task.as_mut() else {
            return Step::Continue;
        };
        if task.job.events.is_closed() {
            counters.cancelled.fetch_add(1, Relaxed);
            return Step::Finished(None);
        }
        if Instant::now() >= task.job.deadline {
            return Step::Finished(Some(Event::Failed(JobFailure::Timeout)));
        }

        let started = Instant::now();
        let prefilling = task.prefilled < task.prompt_len;
        let input = if prefilling {
            let end = (task.prefilled + PREFILL_CHUNK).min(task.prompt_len);
            let chunk = task.prefilled..end;
            task.prefilled = end;
            &task.history[chunk]
        } else {
            &task.history[task.history.len() - 1..]
        };
        let n_input = input.len();
        let logits = match session.eval(model, input) {
            Ok(logits) => logits,
            Err(e) => {
                return Step::Finished(Some(Event::Failed(JobFailure::Engine(e.to_string()))))
            }
        };
        if prefilling {
            counters.add_prefill(started.elapsed());
            counters.prompt_tokens.fetch_add(n_input as u64, Relaxed);
            if task.prefilled < task.prompt_len {
                return Step::Continue;
            }
        } else {
            counters.add_decode(started.elapsed());
        }

        let token = task.sampler.sample(logits, &task.history);
        let tokenizer = model.tokenizer();
        if tokenizer.is_eog(token) {
            return task.finish(FinishReason::Stop, false);
        }
        task.history.push(token);
        task.generated += 1;
        counters.generated_tokens.fetch_add(1, Relaxed);
        if let Some(piece) = task.decoder.push(tokenizer, token) {
            let stopped = task.stop.push(piece, &mut task.text);
            if !task.text.is_empty() {
                let text = std::mem::take(&mut task.text);
                task.send(Event::Text(text));
            }
            if stopped {
                return task.finish(FinishReason::Stop, true);
            }
        }
        // The sampled token is evaluated at the next step, which needs a free cell.
        if task.generated >= task.max_tokens || session.n_past() >= session.n_ctx() {
            return task.finish(FinishReason::Length, false);
        }
        Step::Continue
    }
}

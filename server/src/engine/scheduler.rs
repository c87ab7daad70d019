//! Slots, the request queue and the decode thread.
//!
//! Each of the `--parallel` slots owns a [`Session`] (its KV cache and scratch, allocated once at
//! start-up), which keeps its conversation after a job: a new job goes to the slot whose cache
//! its prompt continues, and only the rest is evaluated. One dedicated thread runs every slot in
//! rounds: a chunk of the prompt for each slot reading one, then one pass over the weights for
//! every generating slot's next token (and any draft after it). Decoding is CPU-bound and
//! synchronous, so it never runs on the tokio workers, and rounds are fair on one or two cores
//! where slots would otherwise fight over the same CPUs. Jobs come in through the queue and
//! report through their own pipe; an owner that goes away (the client disconnected) drops its
//! receiver, and the slot is freed at its next step.
//!
//! With a [`SlotStore`], slots are restored from disk before the thread starts, saved when they
//! have been idle a while and when it stops, and slot actions (`POST /slots/{id}`) queue here
//! for the thread, which runs each once its slot is free ([`slot_store`](super::slot_store)).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::counters::Counters;
use super::draft;
use super::generation::{FinishReason, Usage};
use super::job::{End, Job, JobFailure, Refused};
use super::slot_store::{self, SlotError, SlotOp, SlotStore, Store};
use super::stop::StopMatcher;
use super::Slots;
use crate::grammar::Constraint;
use crate::model::{decode_batch, Model, Session, MAX_DRAFT, UBATCH};
use crate::quant::STREAM_GROUP;
use crate::sampler::{Sampler, TokenLogprob};
use crate::tokenizer::StreamDecoder;

/// Prompt tokens evaluated per round: long prompts are split so that other slots keep
/// streaming while one slot reads a long prompt.
const PREFILL_CHUNK: usize = 64;

pub(super) struct Scheduler {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    n_ctx: usize,
    queue_capacity: usize,
    parallel: usize,
    has_store: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    counters: Arc<Counters>,
}

struct State {
    pending: VecDeque<Job>,
    /// Slot actions waiting for their slot to be free.
    ops: VecDeque<SlotOp>,
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
    /// Allocates one session of `n_ctx` tokens per slot, restores them from `store`, and
    /// starts the decode thread.
    pub fn start(
        model: Arc<Model>,
        slots: Slots,
        counters: Arc<Counters>,
        store: Option<SlotStore>,
    ) -> std::io::Result<Scheduler> {
        let Slots {
            parallel,
            n_ctx,
            queue: queue_capacity,
        } = slots;
        let now = Instant::now();
        let mut slots: Vec<Slot> = (0..parallel)
            .map(|_| Slot {
                session: model.new_session(n_ctx),
                task: None,
                last_used: 0,
                decoding: false,
                changed: false,
                idle_since: now,
            })
            .collect();
        let has_store = store.is_some();
        let store = store.map(|config| {
            let store = Store::new(config, &model);
            store.clean_temporaries();
            for (id, slot) in slots.iter_mut().enumerate() {
                store.restore_at_start(&model, id, &mut slot.session);
            }
            store
        });
        counters.slots.store(parallel as u64, Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: VecDeque::with_capacity(queue_capacity + parallel),
                ops: VecDeque::with_capacity(slot_store::MAX_PENDING),
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
                move || decode_loop(&model, &shared, slots, store.as_ref())
            })?;
        Ok(Scheduler {
            shared,
            thread: Mutex::new(Some(thread)),
            n_ctx,
            queue_capacity,
            parallel,
            has_store,
        })
    }

    /// Whether slots are saved (`--slot-save-path`).
    pub fn has_store(&self) -> bool {
        self.has_store
    }

    /// Queues a slot action for the decode thread; its answer comes on `op.reply`.
    pub fn submit_op(&self, op: SlotOp) -> Result<(), SlotError> {
        if !self.has_store {
            return Err(SlotError::NotEnabled);
        }
        if op.slot >= self.parallel {
            return Err(SlotError::NoSuchSlot {
                id: op.slot,
                slots: self.parallel,
            });
        }
        let mut state = self.shared.lock();
        if state.stopping {
            return Err(SlotError::ShuttingDown);
        }
        if state.ops.len() >= slot_store::MAX_PENDING {
            return Err(SlotError::Busy);
        }
        state.ops.push_back(op);
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
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
    /// When the slot last took a job (a count of jobs taken by all slots).
    last_used: u64,
    /// The task's last token is to be evaluated in this round's batched pass.
    decoding: bool,
    /// The conversation changed since the slot's file was last written or read.
    changed: bool,
    /// When the slot's last task ended.
    idle_since: Instant,
}

/// The outcome of one step of a slot.
enum Step {
    Continue,
    /// The task is over; the end to report once the slot is free (`None`: the client left).
    Finished(Option<End>),
}

/// A job running in a slot.
struct Task {
    job: Job,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    constraint: Option<Constraint>,
    /// The prompt, then each generated token (what the repetition penalties look at).
    history: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens taken from the slot's cache.
    cached: usize,
    /// Prompt tokens in the cache so far, taken from it or evaluated.
    prefilled: usize,
    generated: usize,
    max_tokens: usize,
    /// Released text, reused between tokens.
    text: String,
    /// Log-probabilities of tokens whose text is not sent yet.
    logprobs: Vec<TokenLogprob>,
    /// Why the round's batched evaluation failed for this task.
    failed: Option<JobFailure>,
    /// What the round's pass evaluates: the last sampled token, then any draft after it.
    input: SmallVec<[u32; 1 + MAX_DRAFT]>,
    /// Draft tokens verified, and how many of them were taken.
    drafted: usize,
    accepted: usize,
}

/// Why the decode thread left its wait, when not to run a round.
enum Wake {
    Round,
    Op(SlotOp),
    SaveIdle,
    Stop,
}

fn decode_loop(model: &Model, shared: &Shared, mut slots: Vec<Slot>, store: Option<&Store>) {
    let counters = &shared.counters;
    let slot_count = slots.len();
    let mut jobs_taken = 0u64;
    loop {
        counters.beat();
        let wake = {
            let mut state = shared.lock();
            loop {
                if state.stopping {
                    for job in state.pending.drain(..) {
                        job.output.end(End::Failed(JobFailure::ShuttingDown));
                    }
                    for op in state.ops.drain(..) {
                        let _ = op.reply.send(Err(SlotError::ShuttingDown));
                    }
                    for slot in &mut slots {
                        if let Some(task) = slot.task.take() {
                            task.job.output.end(End::Failed(JobFailure::ShuttingDown));
                            slot.changed = true;
                        }
                    }
                    counters.queue_depth.store(0, Relaxed);
                    counters.busy_slots.store(0, Relaxed);
                    break Wake::Stop;
                }
                // An action on a free slot goes before the jobs waiting for one.
                let free_op = state
                    .ops
                    .iter()
                    .position(|op| slots[op.slot].task.is_none());
                if let Some(op) = free_op.and_then(|i| state.ops.remove(i)) {
                    break Wake::Op(op);
                }
                drop_abandoned(&mut state.pending, counters);
                while state.idle_slots > 0 {
                    let Some(job) = state.pending.pop_front() else {
                        break;
                    };
                    jobs_taken += 1;
                    let slot = pick_slot(&mut slots, model, &job);
                    slot.last_used = jobs_taken;
                    let reuse = if job.generation.cache_prompt {
                        slot.session.resume(model, &job.prompt)
                    } else {
                        slot.session.clear();
                        0
                    };
                    counters
                        .cached_prompt_tokens
                        .fetch_add(reuse as u64, Relaxed);
                    slot.task = Some(Task::new(job, model, slot.session.n_ctx(), reuse));
                    state.idle_slots -= 1;
                }
                counters
                    .queue_depth
                    .store(state.pending.len() as u64, Relaxed);
                let busy = slots.len() - state.idle_slots;
                counters.busy_slots.store(busy as u64, Relaxed);
                if busy > 0 {
                    break Wake::Round;
                }
                let due = store
                    .and_then(|s| s.config.idle_save)
                    .and_then(|after| next_idle_save(&slots, after));
                match due {
                    Some(at) if at <= Instant::now() => break Wake::SaveIdle,
                    Some(at) => {
                        let wait = at - Instant::now();
                        state = counters.idle(|| {
                            let waited = shared.wake.wait_timeout(state, wait);
                            waited.map_or_else(|e| e.into_inner().0, |(s, _)| s)
                        });
                    }
                    None => {
                        state = counters
                            .idle(|| shared.wake.wait(state).unwrap_or_else(|e| e.into_inner()));
                    }
                }
            }
        };
        match wake {
            Wake::Round => {}
            Wake::Stop => {
                if let Some(store) = store {
                    save_changed(model, store, &mut slots, None);
                }
                return;
            }
            Wake::SaveIdle => {
                if let Some(store) = store {
                    let after = store.config.idle_save.unwrap_or_default();
                    save_changed(model, store, &mut slots, Some(after));
                }
                continue;
            }
            Wake::Op(op) => {
                if let Some(store) = store {
                    let slot = &mut slots[op.slot];
                    let result = store.run(model, &mut slot.session, &op);
                    // A restore or erase changes the conversation; a failed restore empties it.
                    if op.action != slot_store::SlotAction::Save {
                        slot.changed = true;
                        slot.idle_since = Instant::now();
                    }
                    let _ = op.reply.send(result);
                }
                continue;
            }
        }
        // A chunk of its prompt for each slot reading one, then one token of every generating
        // slot, all in one pass over the weights.
        for slot in &mut slots {
            let step = slot.step(model, counters);
            slot.end_if_finished(step, shared, slot_count);
        }
        share_draft_rows(&mut slots);
        decode_round(model, counters, &mut slots);
        for slot in slots.iter_mut().filter(|s| s.decoding) {
            slot.decoding = false;
            let step = slot.verify(model, counters);
            slot.end_if_finished(step, shared, slot_count);
        }
    }
}

/// Cuts the drafts of the slots decoding this round to [`draft_shares`] of a pass of
/// [`STREAM_GROUP`] rows.
fn share_draft_rows(slots: &mut [Slot]) {
    let wanted: SmallVec<[usize; 8]> = slots.iter().map(Slot::input_len).collect();
    let shares = draft_shares(&wanted, STREAM_GROUP);
    for (slot, share) in slots.iter_mut().zip(shares) {
        if let Some(task) = slot.task.as_mut().filter(|_| slot.decoding) {
            task.input.truncate(1 + share);
        }
    }
}

/// How many of its drafted tokens each slot keeps, given each slot's input (`inputs[i]`: its
/// token and its draft, 0 when it does not decode): what fits in `rows` after every slot's own
/// token, one draft token per slot in turn. A pass of up to [`STREAM_GROUP`] rows reads and
/// unpacks the weights once for all of them; a row past that costs the arithmetic of another
/// group, which a draft pays whether its token is taken or not (with four streams and drafts
/// the aggregate fell by a fifth).
fn draft_shares(inputs: &[usize], rows: usize) -> SmallVec<[usize; 8]> {
    let mut room = rows.saturating_sub(inputs.iter().filter(|&&n| n > 0).count());
    let mut shares: SmallVec<[usize; 8]> = inputs.iter().map(|_| 0).collect();
    while room > 0 {
        let before = room;
        for (share, &n) in shares.iter_mut().zip(inputs) {
            if room > 0 && n > 1 + *share {
                *share += 1;
                room -= 1;
            }
        }
        if room == before {
            break;
        }
    }
    shares
}

/// Evaluates the input (last sampled token and draft) of every slot marked `decoding`, as
/// many slots per pass as [`UBATCH`] rows allow; on an error every slot of that pass fails.
fn decode_round(model: &Model, counters: &Counters, slots: &mut [Slot]) {
    let started = Instant::now();
    let mut any = false;
    let mut rest = slots;
    while !rest.is_empty() {
        // The longest run of slots whose inputs fit in one pass.
        let mut rows = 0;
        let mut take = 0;
        for slot in rest.iter() {
            let n = slot.input_len();
            if rows + n > UBATCH {
                break;
            }
            rows += n;
            take += 1;
        }
        let (batch, tail) = std::mem::take(&mut rest).split_at_mut(take.max(1));
        rest = tail;
        let mut sessions: SmallVec<[&mut Session; 8]> = SmallVec::new();
        let mut inputs: SmallVec<[&[u32]; 8]> = SmallVec::new();
        for slot in batch.iter_mut().filter(|s| s.decoding) {
            let Slot { session, task, .. } = slot;
            if let Some(task) = task.as_ref() {
                sessions.push(session);
                inputs.push(&task.input);
            }
        }
        if inputs.is_empty() {
            continue;
        }
        any = true;
        let result = decode_batch(model, &mut sessions, &inputs);
        counters.decode_passes.fetch_add(1, Relaxed);
        drop((sessions, inputs));
        if let Err(e) = result {
            for slot in batch.iter_mut().filter(|s| s.decoding) {
                if let Some(task) = slot.task.as_mut() {
                    task.failed = Some(JobFailure::Engine(e.to_string()));
                }
            }
        }
    }
    if any {
        counters.add_decode(started.elapsed());
    }
}

/// The idle slot for `job`. A slot whose cache the prompt continues is taken, the longest such
/// prefix first: it keeps at least half of the cached conversation (the next turn of a chat), or
/// it holds the whole prompt (a repeated request, or a regenerated answer, whose cache holds the
/// prompt and an answer often longer than it). Otherwise an empty slot, else the least recently
/// used, so that a new conversation does not evict one that is still going on just because both
/// start with the chat template's opening and a system prompt (it still reuses whatever it
/// shares).
fn pick_slot<'s>(slots: &'s mut [Slot], model: &Model, job: &Job) -> &'s mut Slot {
    let reusable = |slot: &Slot| {
        if job.generation.cache_prompt {
            slot.session.reusable(model, &job.prompt)
        } else {
            0
        }
    };
    let idle = || slots.iter().enumerate().filter(|(_, s)| s.task.is_none());
    let continued = idle()
        .map(|(i, s)| (i, reusable(s), s.session.tokens().len()))
        .filter(|&(_, reuse, cached)| {
            let whole_prompt = reuse + 1 == job.prompt.len();
            reuse > 0 && (2 * reuse >= cached || whole_prompt)
        })
        .max_by_key(|&(i, reuse, _)| (reuse, std::cmp::Reverse(slots[i].last_used)))
        .map(|(i, _, _)| i);
    let index = continued.unwrap_or_else(|| {
        idle()
            .min_by_key(|(_, s)| (!s.session.tokens().is_empty(), s.last_used))
            .expect("called with an idle slot")
            .0
    });
    &mut slots[index]
}

/// When the next changed slot is due to be saved, idle for `after`.
fn next_idle_save(slots: &[Slot], after: Duration) -> Option<Instant> {
    slots
        .iter()
        .filter(|s| s.changed && s.task.is_none())
        .map(|s| s.idle_since + after)
        .min()
}

/// Saves every free slot whose conversation changed (and that has been idle for `after`, if
/// given) to its own file.
fn save_changed(model: &Model, store: &Store, slots: &mut [Slot], after: Option<Duration>) {
    let now = Instant::now();
    for (id, slot) in slots.iter_mut().enumerate() {
        let due = after.is_none_or(|after| slot.idle_since + after <= now);
        if slot.changed && slot.task.is_none() && due {
            // A failed save is not retried until the slot changes again: the log said why.
            store.autosave(model, id, &slot.session);
            slot.changed = false;
        }
    }
}

/// Removes queued jobs whose client left or whose time ran out while waiting.
fn drop_abandoned(pending: &mut VecDeque<Job>, counters: &Counters) {
    let now = Instant::now();
    pending.retain(|job| {
        if job.output.is_closed() {
            counters.cancelled.fetch_add(1, Relaxed);
            false
        } else if now >= job.deadline {
            job.output.end(End::Failed(JobFailure::Timeout));
            false
        } else {
            true
        }
    });
}

impl Task {
    /// A task for `job` in a slot whose cache holds the first `cached` tokens of its prompt.
    fn new(mut job: Job, model: &Model, n_ctx: usize, cached: usize) -> Task {
        let prompt_len = job.prompt.len();
        // Prompt and generated tokens together never outgrow the context.
        let mut history = Vec::with_capacity(n_ctx.max(prompt_len));
        history.extend_from_slice(&job.prompt);
        Task {
            sampler: Sampler::new(job.generation.sampler.clone(), model.tokenizer().n_vocab()),
            decoder: StreamDecoder::new(job.generation.special),
            stop: StopMatcher::new(job.generation.stop.clone()),
            constraint: job.generation.constraint.take(),
            history,
            prompt_len,
            cached,
            prefilled: cached,
            generated: 0,
            // Without max_tokens the end of the context ends the generation.
            max_tokens: job.generation.max_tokens.unwrap_or(usize::MAX),
            text: String::new(),
            logprobs: Vec::new(),
            failed: None,
            input: SmallVec::new(),
            drafted: 0,
            accepted: 0,
            job,
        }
    }

    /// The next pass's input: the last sampled token and, where speculation is on and pays, the
    /// tokens an n-gram lookup drafts after it, within the `room` left in the context and the
    /// tokens left to generate.
    fn prepare_input(&mut self, room: usize) {
        let last = *self.history.last().expect("a prompt is never empty");
        self.input.clear();
        self.input.push(last);
        let left = self.max_tokens.saturating_sub(self.generated + 1);
        let max = left.min(room.saturating_sub(1));
        // A constrained output tests each token against its grammar: drafting past that would
        // need the grammar's state for every prefix.
        let speculate = self.job.generation.speculative
            && self.constraint.is_none()
            && draft::worth_drafting(self.drafted, self.accepted);
        if speculate {
            self.input.extend(draft::ngram_draft(&self.history, max));
        }
    }

    /// Sends the released text with the log-probabilities gathered since the last piece (a
    /// closed pipe is noticed at the next step). Both buffers keep their capacity.
    fn send_text(&mut self) {
        self.job.output.text(&self.text, &mut self.logprobs);
        self.text.clear();
    }

    /// Sends what is left of the text; returns the final event.
    fn finish(&mut self, mut finish: FinishReason, stopped: bool) -> Step {
        if !stopped {
            let tail = self.decoder.finish().unwrap_or_default();
            let stopped_now = self.stop.push(tail, &mut self.text);
            if let Some(index) = self.stop.matched().filter(|_| stopped_now) {
                finish = FinishReason::StopSequence(index);
            } else {
                let mut rest = String::new();
                self.stop.finish(&mut rest);
                self.text.push_str(&rest);
            }
            if !self.text.is_empty() || !self.logprobs.is_empty() {
                self.send_text();
            }
        }
        Step::Finished(Some(End::Done {
            finish,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                cached_tokens: self.cached,
                completion_tokens: self.generated,
            },
        }))
    }
}

impl Slot {
    /// Runs this slot's part of a round that needs no other slot: a chunk of its prompt, then
    /// (when that was the last) the first token. A slot with a token to evaluate is marked
    /// `decoding` for the round's batched pass.
    fn step(&mut self, model: &Model, counters: &Counters) -> Step {
        let Slot { session, task, .. } = self;
        let Some(task) = task.as_mut() else {
            return Step::Continue;
        };
        if task.job.output.is_closed() {
            counters.cancelled.fetch_add(1, Relaxed);
            return Step::Finished(None);
        }
        if Instant::now() >= task.job.deadline {
            return Step::Finished(Some(End::Failed(JobFailure::Timeout)));
        }
        if task.prefilled == task.prompt_len {
            task.prepare_input(session.n_ctx() - session.n_past());
            self.decoding = true;
            return Step::Continue;
        }
        let started = Instant::now();
        let end = (task.prefilled + PREFILL_CHUNK).min(task.prompt_len);
        let chunk = task.prefilled..end;
        task.prefilled = end;
        // Only the prompt's last chunk needs the logits after it.
        let tokens = &task.history[chunk.clone()];
        let evaluated = if end < task.prompt_len {
            session.extend(model, tokens)
        } else {
            session.eval(model, tokens).map(|_| ())
        };
        if let Err(e) = evaluated {
            return Step::Finished(Some(End::Failed(JobFailure::Engine(e.to_string()))));
        }
        counters.add_prefill(started.elapsed());
        counters
            .prompt_tokens
            .fetch_add(chunk.len() as u64, Relaxed);
        if task.prefilled < task.prompt_len {
            return Step::Continue;
        }
        self.sample(model, counters)
    }

    /// Rows this slot puts in the round's pass.
    fn input_len(&self) -> usize {
        match &self.task {
            Some(task) if self.decoding => task.input.len(),
            _ => 0,
        }
    }

    /// Frees the slot if `step` ended its task, and reports how it ended.
    fn end_if_finished(&mut self, step: Step, shared: &Shared, slot_count: usize) {
        let Step::Finished(last) = step else {
            return;
        };
        let Some(task) = self.task.take() else {
            return;
        };
        self.decoding = false;
        // The slot is counted free before the client hears the end, so that /metrics read
        // right after a response never shows it busy.
        let busy = {
            let mut state = shared.lock();
            state.idle_slots += 1;
            slot_count - state.idle_slots
        };
        shared.counters.busy_slots.store(busy as u64, Relaxed);
        self.changed = true;
        self.idle_since = Instant::now();
        if let Some(end) = last {
            task.job.output.end(end);
        }
    }

    /// Samples the first token from the logits after the prompt.
    fn sample(&mut self, model: &Model, counters: &Counters) -> Step {
        let Slot { session, task, .. } = self;
        let Some(task) = task.as_mut() else {
            return Step::Continue;
        };
        task.take_token(
            model,
            counters,
            session.logits(),
            session.n_past(),
            session.n_ctx(),
        )
    }

    /// After the round's pass over `[last token, draft...]`: samples from the logits after each
    /// row in turn while the sampled token is the drafted one, so every token is drawn from the
    /// same distribution, with the same random numbers, as without a draft (a rejected draft
    /// token is simply a different sample). The cache forgets the rows after the first
    /// disagreement.
    fn verify(&mut self, model: &Model, counters: &Counters) -> Step {
        let Slot { session, task, .. } = self;
        let Some(task) = task.as_mut() else {
            return Step::Continue;
        };
        if let Some(failure) = task.failed.take() {
            return Step::Finished(Some(End::Failed(failure)));
        }
        let drafted = task.input.len() - 1;
        let start = session.n_past() - task.input.len();
        let mut step = Step::Continue;
        let mut rows = 0;
        while rows <= drafted {
            let n_past = start + rows + 1;
            let logits = session.logits_row(rows);
            step = task.take_token(model, counters, logits, n_past, session.n_ctx());
            rows += 1;
            let agreed = rows <= drafted && task.history.last() == Some(&task.input[rows]);
            if !matches!(step, Step::Continue) || !agreed {
                break;
            }
        }
        // Rows past the first disagreement hold the keys of tokens that were not taken.
        session.forget_from(start + rows);
        let accepted = rows - 1;
        task.drafted += drafted;
        task.accepted += accepted;
        counters.drafted_tokens.fetch_add(drafted as u64, Relaxed);
        counters.accepted_tokens.fetch_add(accepted as u64, Relaxed);
        step
    }
}

impl Task {
    /// Samples a token from `logits` (`n_past` positions in the cache, including the one they
    /// follow), takes it into the output and sends its text.
    fn take_token(
        &mut self,
        model: &Model,
        counters: &Counters,
        logits: &[f32],
        n_past: usize,
        n_ctx: usize,
    ) -> Step {
        let task = self;
        let mask = match task.constraint.as_mut().map(Constraint::mask).transpose() {
            Ok(mask) => mask,
            Err(e) => return Step::Finished(Some(End::Failed(JobFailure::Engine(e.to_string())))),
        };
        let tokenizer = model.tokenizer();
        let token = match task.job.generation.logprobs {
            None => task
                .sampler
                .sample_allowed(logits, &task.history, mask.as_ref()),
            Some(top_n) => {
                let (token, lp) =
                    task.sampler
                        .sample_logprobs(logits, &task.history, mask.as_ref(), top_n);
                // Ids only: the front end writes out their text from the vocabulary.
                task.logprobs.push(lp);
                token
            }
        };
        if tokenizer.is_eog(token) {
            // The end token is no part of the answer, nor of its log-probabilities (OpenAI's).
            if task.job.generation.logprobs.is_some() {
                task.logprobs.pop();
            }
            return task.finish(FinishReason::Stop, false);
        }
        if let Some(constraint) = task.constraint.as_mut() {
            if let Err(e) = constraint.accept(token) {
                return Step::Finished(Some(End::Failed(JobFailure::Engine(e.to_string()))));
            }
        }
        task.history.push(token);
        task.generated += 1;
        counters.generated_tokens.fetch_add(1, Relaxed);
        if let Some(piece) = task.decoder.push(tokenizer, token) {
            let stopped = task.stop.push(piece, &mut task.text);
            if !task.text.is_empty() {
                task.send_text();
            }
            if stopped {
                let index = task.stop.matched().unwrap_or_default();
                return task.finish(FinishReason::StopSequence(index), true);
            }
        }
        // A complete output that nothing may extend ends here, as if the model had ended it.
        if task.constraint.as_ref().is_some_and(Constraint::is_done) {
            return task.finish(FinishReason::Stop, false);
        }
        // The sampled token is evaluated at the next step, which needs a free cell.
        if task.generated >= task.max_tokens || n_past >= n_ctx {
            return task.finish(FinishReason::Length, false);
        }
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::draft_shares;

    /// A pass of four rows: one stream keeps three of its four drafted tokens, two streams one
    /// each, four streams none; short drafts leave their room to the others; slots that do not
    /// decode (0) get nothing and take no room.
    #[test]
    fn drafts_fill_the_pass_up_to_its_rows_in_turn() {
        let shares = |inputs: &[usize]| draft_shares(inputs, 4).to_vec();
        assert_eq!(shares(&[5]), [3]);
        assert_eq!(shares(&[1]), [0]);
        assert_eq!(shares(&[5, 5]), [1, 1]);
        assert_eq!(shares(&[5, 0, 5]), [1, 0, 1]);
        assert_eq!(shares(&[1, 5]), [0, 2]);
        assert_eq!(shares(&[2, 5, 5]), [1, 0, 0]);
        assert_eq!(shares(&[5, 5, 5, 5]), [0, 0, 0, 0]);
        assert_eq!(shares(&[5, 5, 5, 5, 5]), [0, 0, 0, 0, 0]);
        assert_eq!(draft_shares(&[5, 5], 8).to_vec(), [3, 3]);
    }
}

//! The decode loop allocates nothing: after a session and a sampler exist, evaluating a token,
//! sampling the next and streaming its text touch no allocator, on one thread or two. A
//! counting global allocator proves it (its counter covers every thread, the pool's workers
//! included).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use llm_server::model::{LoadOptions, Model};
use llm_server::sampler::{Sampler, SamplerParams};
use llm_server::tokenizer::StreamDecoder;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is process-wide, so the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn decode_allocations(model_path: &std::path::Path, threads: usize, sampled: bool) -> usize {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Model::load(
        model_path,
        &LoadOptions {
            threads,
            mlock: false,
        },
    )
    .unwrap();
    let tok = model.tokenizer();
    let prompt = tok.encode("The capital of France is", true, true);
    let n_decode = 24;
    let mut session = model.new_session(prompt.len() + n_decode + 1);
    let params = if sampled {
        SamplerParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.05,
            seed: 1,
            ..Default::default()
        }
    } else {
        SamplerParams::greedy()
    };
    let mut sampler = Sampler::new(params, model.config().n_vocab);
    let mut decoder = StreamDecoder::new(false);
    let mut history = Vec::with_capacity(prompt.len() + n_decode);
    history.extend_from_slice(&prompt);
    let mut next = sampler.sample(session.eval(&model, &prompt).unwrap(), &history);
    // One step outside the count: the first token may fault pages and warm lazy tables.
    history.push(next);
    next = sampler.sample(session.eval(&model, &[next]).unwrap(), &history);
    decoder.push(tok, next);

    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let mut text_bytes = 0;
    for _ in 0..n_decode - 2 {
        history.push(next);
        let logits = session.eval(&model, &[next]).unwrap();
        next = sampler.sample(logits, &history);
        if let Some(piece) = decoder.push(tok, next) {
            text_bytes += piece.len();
        }
    }
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert!(history.len() > prompt.len() + 10 && text_bytes > 0);
    after - before
}

#[test]
fn decode_loop_allocates_nothing_on_one_thread() {
    assert_eq!(
        decode_allocations(&test_support::default_model(), 1, false),
        0
    );
}

#[test]
fn decode_loop_allocates_nothing_with_two_threads_and_sampling() {
    assert_eq!(
        decode_allocations(&test_support::default_model(), 2, true),
        0
    );
}

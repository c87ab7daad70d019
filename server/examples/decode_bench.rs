//! Prefill and decode throughput on a model: `decode_bench MODEL [THREADS] [PROMPT_TOKENS] [DECODE_TOKENS]`.
//! Prints one JSON line. A minimal harness for profiling (callgrind, perf); `llm-server bench` is
//! the measurement `bench/compare.sh` runs beside llama.cpp.

use std::time::Instant;

use llm_server::model::{LoadOptions, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: decode_bench MODEL [THREADS] [PROMPT_TOKENS] [DECODE_TOKENS]");
    let threads: usize = args.get(2).map_or(1, |s| s.parse().expect("threads"));
    let n_prompt: usize = args
        .get(3)
        .map_or(128, |s| s.parse().expect("prompt tokens"));
    let n_decode: usize = args
        .get(4)
        .map_or(64, |s| s.parse().expect("decode tokens"));
    let model = Model::load(
        path.as_ref(),
        &LoadOptions {
            threads,
            mlock: false,
        },
    )
    .expect("load");
    // A fixed, ordinary prompt: token ids from a text, cycled to length.
    let text = "The quick brown fox jumps over the lazy dog while the memory of a small server stays free. ";
    let ids = model.tokenizer().encode(text, false, false);
    let mut prompt = vec![model.tokenizer().bos().unwrap_or(0)];
    prompt.extend(ids.iter().cycle().take(n_prompt - 1));
    let mut session = model.new_session(n_prompt + n_decode + 8);
    // Warm the page cache and the code paths once.
    session.eval(&model, &prompt[..8]).expect("warm-up");
    session.clear();

    let t = Instant::now();
    let mut logits = session.eval(&model, &prompt).expect("prefill").to_vec();
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..n_decode {
        let next = argmax(&logits);
        logits.copy_from_slice(session.eval(&model, &[next]).expect("decode"));
    }
    let decode = t.elapsed().as_secs_f64();
    println!(
        "{{\"engine\":\"llm-server\",\"threads\":{threads},\"prefill_tok_s\":{:.1},\"decode_tok_s\":{:.1}}}",
        n_prompt as f64 / prefill,
        n_decode as f64 / decode
    );
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

//! Teacher-forced logits for a token sequence, one JSON array per position:
//! `dump_logits MODEL ID,ID,... [--one-by-one]` (one batch, or one token per evaluation as a
//! decode loop feeds them). `bench/parity.py` runs it beside llama.cpp to find the first
//! position and the layer of arithmetic where the two engines part.

use std::io::Write;

use llm_server::model::{LoadOptions, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(ids)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: dump_logits MODEL ID,ID,...");
        std::process::exit(2);
    };
    let ids: Vec<u32> = match ids.split(',').map(|s| s.trim().parse()).collect() {
        Ok(ids) => ids,
        Err(e) => fail(&format!(
            "the ids must be comma-separated token numbers ({e}): {ids}"
        )),
    };
    let model = Model::load(
        path.as_ref(),
        &LoadOptions {
            threads: 1,
            mlock: false,
        },
    )
    .unwrap_or_else(|e| fail(&format!("{path}: {e}")));
    let mut session = model.new_session(ids.len());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut print = |logits: &[f32]| {
        let line = serde_json::to_string(logits).expect("f32s serialise");
        writeln!(out, "{line}").expect("stdout");
    };
    if args.get(3).is_some_and(|a| a == "--one-by-one") {
        for &id in &ids {
            print(
                session
                    .eval(&model, &[id])
                    .unwrap_or_else(|e| fail(&format!("eval: {e}"))),
            );
        }
    } else {
        session
            .eval_all(&model, &ids, &mut |_, logits| print(logits))
            .unwrap_or_else(|e| fail(&format!("eval: {e}")));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("dump_logits: {why}");
    std::process::exit(2);
}

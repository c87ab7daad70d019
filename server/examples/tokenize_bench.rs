//! Tokenizer throughput: `cargo run --release --example tokenize_bench -- VOCAB.gguf TEXT`
//! prints the vocabulary load time and MB/s of `encode(text, add_bos = false,
//! parse_special = false)` (what llama.cpp's `llama_tokenize(.., add_special = false,
//! parse_special = false)` does, for comparison with it).
//!
//! With a third argument, a file of whitespace-separated ids (e.g. llama.cpp's output for the
//! same text), it also reports whether the ids are identical.
//!
//! `tokenize_bench --write-corpus OUT [GOLDEN_VOCAB_DIR]` writes the reproducible ~100 KB
//! benchmark text: the English prose below plus llama.cpp's tokenizer test strings
//! (`ggml-vocab-*.gguf.inp`), repeated until 100 KB.

use std::path::{Path, PathBuf};
use std::time::Instant;

use llm_server::gguf::Gguf;
use llm_server::tokenizer::Tokenizer;

const PROSE: &str = "\
The appliance boots, mounts its disk and starts a single service. That service maps the model \
file into memory, checks that the machine has the instructions it was built for, and sizes \
every buffer it will ever need before it answers its first request. Nothing is allocated while \
a token is being generated; the cache for past keys and values was laid out at start-up, one \
ring for the layers that only look at a sliding window and a full array for the others.\n\n\
Memory on a one-gigabyte machine is a budget, not a hope. The kernel keeps the weights as page \
cache that it can drop and read back, while the small compressed swap holds the cold pages of \
everything else. An early out-of-memory daemon watches both free memory and free swap, and it \
is told to spare the model server and to prefer the rest. If the plan does not fit, the \
server says so at once, with the numbers, instead of dying half-way through a reply.\n\n\
A request arrives as JSON over HTTP. It is checked, queued and, when a slot is free, turned \
into tokens: \"Hello, world!\" becomes a handful of integers, numbers like 3.14159 or \
1,000,000 are split the way the model expects, and words in other scripts (Zürich, São Paulo, \
Ελληνικά, русский, 日本語) fall back to smaller pieces or raw bytes. The reply streams back \
as server-sent events, one fragment of text at a time, and the connection closing early \
cancels the work. It's simple; it isn't magic, and we'd like to keep it that way.\n\n";

const TARGET_BYTES: usize = 100 * 1024;

fn write_corpus(out: &Path, vocab_dir: &Path) -> Result<(), String> {
    let mut unit = PROSE.to_string();
    for name in ["llama-spm", "llama-bpe", "qwen2", "gpt-2"] {
        let path = vocab_dir.join(format!("ggml-vocab-{name}.gguf.inp"));
        let inp = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e} (pass the golden vocab dir)", path.display()))?;
        unit.push_str(&inp.replace("\n__ggml_vocab_test__\n", "\n"));
        unit.push_str(PROSE);
    }
    let mut text = String::with_capacity(TARGET_BYTES + unit.len());
    while text.len() < TARGET_BYTES {
        text.push_str(&unit);
    }
    std::fs::write(out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("wrote {} bytes to {}", text.len(), out.display());
    Ok(())
}

fn bench(vocab: &Path, text_path: &Path, expected: Option<&Path>) -> Result<(), String> {
    let text =
        std::fs::read_to_string(text_path).map_err(|e| format!("{}: {e}", text_path.display()))?;
    let gguf = Gguf::open(vocab).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let tok = Tokenizer::from_metadata(&gguf.metadata).map_err(|e| e.to_string())?;
    let load = t.elapsed();

    // Warm up, then time enough repetitions for a stable figure (at least 1 s).
    let ids = tok.encode(&text, false, false);
    let n_tokens = ids.len();
    let mut runs = 0u32;
    let t = Instant::now();
    while runs < 5 || t.elapsed().as_secs_f64() < 1.0 {
        std::hint::black_box(tok.encode(std::hint::black_box(&text), false, false));
        runs += 1;
    }
    let per_run = t.elapsed().as_secs_f64() / runs as f64;
    println!(
        "{}: vocab {} tokens built in {:.1} ms; {} bytes -> {} tokens in {:.2} ms: {:.2} MB/s",
        vocab.file_name().unwrap_or_default().to_string_lossy(),
        tok.n_vocab(),
        load.as_secs_f64() * 1e3,
        text.len(),
        n_tokens,
        per_run * 1e3,
        text.len() as f64 / per_run / 1e6
    );
    if let Some(path) = expected {
        let want = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|t| {
                t.parse()
                    .map_err(|e| format!("{}: {t:?}: {e}", path.display()))
            })
            .collect::<Result<_, _>>()?;
        match ids.iter().zip(&want).position(|(a, b)| a != b) {
            None if ids.len() == want.len() => println!("ids identical to {}", path.display()),
            at => {
                return Err(format!(
                    "ids differ from {} at index {} ({} vs {} tokens)",
                    path.display(),
                    at.unwrap_or(ids.len().min(want.len())),
                    ids.len(),
                    want.len()
                ))
            }
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [flag, out, rest @ ..] if flag == "--write-corpus" => {
            let dir = rest.first().map_or_else(
                || test_support::testdata_dir().join("vocab"),
                PathBuf::from,
            );
            write_corpus(Path::new(out), &dir)
        }
        [vocab, text] => bench(Path::new(vocab), Path::new(text), None),
        [vocab, text, ids] => bench(Path::new(vocab), Path::new(text), Some(Path::new(ids))),
        _ => Err("usage: tokenize_bench VOCAB.gguf TEXT [IDS] | tokenize_bench --write-corpus OUT [VOCAB_DIR]".into()),
    };
    if let Err(e) = result {
        eprintln!("tokenize_bench: {e}");
        std::process::exit(1);
    }
}

//! Arbitrary bytes into the GGUF reader. It must return, never panic or allocate without bound
//! (run with `-malloc_limit_mb`), and whatever it accepts must be safe to use: every tensor view
//! inside the buffer and consistent with its shape, every metadata value readable.

#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use llm_server::gguf::{Gguf, Metadata};

fuzz_target!(|data: &[u8]| {
    let g = match Gguf::from_vec(data.to_vec()) {
        Ok(g) => g,
        Err(e) => {
            black_box(e.to_string());
            return;
        }
    };
    for info in &g.tensors {
        assert_eq!(g.tensor_data(info).len(), info.size);
        // Types the kernels do not read are listed but have no typed view.
        let Ok(t) = g.tensor(&info.name) else {
            assert!(info.ty.ggml().is_none());
            continue;
        };
        assert_eq!(t.data.len(), info.size);
        assert_eq!(t.row_bytes() * info.n_rows(), info.size);
        black_box(t.row(info.n_rows() - 1));
        black_box(t.data.iter().fold(0u8, |acc, &b| acc ^ b));
    }
    for (key, value) in g.metadata.iter() {
        black_box(value.to_string());
        touch_accessors(&g.metadata, key);
    }
});

/// Every typed accessor on `key`: each must answer, converting or naming the type mismatch.
fn touch_accessors(m: &Metadata, key: &str) {
    black_box(m.u32(key).map_err(|e| e.to_string()).ok());
    black_box(m.u64(key).map_err(|e| e.to_string()).ok());
    black_box(m.usize(key).ok());
    black_box(m.f32(key).ok());
    black_box(m.bool(key).ok());
    black_box(m.str(key).ok());
    black_box(m.strings(key).ok());
    black_box(m.f32s(key).ok());
    black_box(m.i32s(key).ok());
    black_box(m.opt(key, Metadata::u32).ok());
}

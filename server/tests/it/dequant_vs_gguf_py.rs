//! Our `dequantize_row` against gguf-py's `gguf.quants.dequantize` (an independent numpy
//! implementation), on real rows of every tensor type llama.cpp wrote into the golden synth models,
//! and on random rows of the types llama.cpp writes only with an importance matrix (no synth model
//! has them).
//! Needs `python3` with the `gguf` and `numpy` modules; it fails (never skips) without them.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use llm_server::gguf::Gguf;
use llm_server::quant::{dequantize_row, random_row, GgmlType};

/// Types no synth model holds (llama.cpp makes them only with an importance matrix): compared on
/// random rows instead.
const RANDOM_ONLY: &[GgmlType] = &[
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ2_S,
    GgmlType::IQ1_M,
];

/// Files whose tensors together cover every weight type we support.
const FILES: &[&str] = &[
    "synth-llama-f32.gguf",
    "synth-llama-f16.gguf",
    "synth-llama-bf16.gguf",
    "synth-llama-q8_0.gguf",
    "synth-llama-q4_0.gguf",
    "synth-llama-q4_1.gguf",
    "synth-llama-q5_0.gguf",
    "synth-llama-q5_1.gguf",
    "synth-llama-q2_k.gguf",
    "synth-llama-q3_k_s.gguf",
    "synth-llama-q3_k_m.gguf",
    "synth-llama-q4_k_m.gguf",
    "synth-llama-q5_k_m.gguf",
    "synth-llama-q6_k.gguf",
    "synth-llama-tq2_0.gguf",
    "synth-llama-tq1_0.gguf",
    "synth-llama-iq3_s.gguf",
    "synth-llama-iq4_nl.gguf",
    "synth-llama-iq4_xs.gguf",
];

/// Prints, as little-endian f32, each requested `name@row` dequantised by gguf-py.
const DEQUANTIZE_PY: &str = r#"
import sys
try:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError as e:
    sys.exit(f"missing Python module ({e}): run `python3 -m pip install gguf numpy`")
path, requests = sys.argv[1], sys.argv[2:]
tensors = {t.name: t for t in GGUFReader(path).tensors}
for request in requests:
    name, row = request.rsplit("@", 1)
    t = tensors[name]
    values = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))[int(row)]
    sys.stdout.buffer.write(values.astype("<f4").tobytes())
"#;

/// gguf-py's dequantisation of the rows `(tensor name, row index)`, concatenated.
fn gguf_py_rows(path: &Path, rows: &[(&str, usize)]) -> Vec<f32> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(DEQUANTIZE_PY)
        .arg(path)
        .args(rows.iter().map(|(name, row)| format!("{name}@{row}")))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install Python 3, then `python3 -m pip install gguf numpy`")
        });
    assert!(
        out.status.success(),
        "gguf-py failed on {}: {}\n(if a module is missing: `python3 -m pip install gguf numpy`)",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn dequantize_row_matches_gguf_py_for_every_type() {
    let mut covered: Vec<GgmlType> = Vec::new();
    for file in FILES {
        let path = test_support::synth(file);
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The first and last rows of the first tensor of each type in the file.
        let mut rows: Vec<(&str, usize)> = Vec::new();
        for t in &g.tensors {
            if !rows
                .iter()
                .any(|(name, _)| g.tensor(name).unwrap().ty() == t.ty)
            {
                rows.extend([(t.name.as_str(), 0), (t.name.as_str(), t.n_rows() - 1)]);
            }
        }
        let theirs = gguf_py_rows(&path, &rows);
        let mut at = 0;
        for (name, r) in rows {
            let tensor = g.tensor(name).unwrap();
            let (ty, n) = (tensor.ty(), tensor.info.row_len());
            let mut ours = vec![0f32; n];
            dequantize_row(ty, tensor.row(r), &mut ours);
            let reference = &theirs[at..at + n];
            at += n;
            let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * scale,
                    "{file} {name} ({ty}) row {r} value {i}: ours {a}, gguf-py {b}"
                );
            }
            if !covered.contains(&ty) {
                covered.push(ty);
            }
        }
        assert_eq!(
            at,
            theirs.len(),
            "{file}: gguf-py returned more values than asked for"
        );
    }
    for ty in GgmlType::SUPPORTED {
        assert!(
            covered.contains(&ty) || RANDOM_ONLY.contains(&ty),
            "no {ty} tensor in the synth models was compared"
        );
    }
}

/// Prints, as little-endian f32, gguf-py's dequantisation of the raw rows on stdin (ggml type id
/// and bytes per row in argv).
const DEQUANTIZE_RAW_PY: &str = r#"
import sys
try:
    import numpy as np
    from gguf.quants import dequantize
    from gguf.constants import GGMLQuantizationType
except ImportError as e:
    sys.exit(f"missing Python module ({e}): run `python3 -m pip install gguf numpy`")
ty, row_bytes = int(sys.argv[1]), int(sys.argv[2])
data = np.frombuffer(sys.stdin.buffer.read(), dtype=np.uint8).reshape(-1, row_bytes)
values = dequantize(data, GGMLQuantizationType(ty))
sys.stdout.buffer.write(values.astype("<f4").tobytes())
"#;

/// gguf-py's dequantisation of `rows` (whole rows of `row_bytes` bytes of type `ty`).
fn gguf_py_raw(ty: GgmlType, row_bytes: usize, rows: &[u8]) -> Vec<f32> {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(DEQUANTIZE_RAW_PY)
        .arg(ty.id().to_string())
        .arg(row_bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install Python 3, then `python3 -m pip install gguf numpy`")
        });
    child.stdin.take().unwrap().write_all(rows).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "gguf-py failed on random {ty} rows: {}\n(if a module is missing: `python3 -m pip install gguf numpy`)",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Random valid rows (every grid index, sign pattern and scale bit drawn) of each type no synth
/// model holds: ours and gguf-py's dequantisations agree bit for bit (both do ggml's float
/// operations in ggml's order).
#[test]
fn dequantize_row_matches_gguf_py_on_random_rows_of_imatrix_types() {
    const ROWS: usize = 64;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for &ty in RANDOM_ONLY {
        // 64 rows of 8 super-blocks: 16384 or more grid groups, every index of even the largest
        // grid (2048 entries) drawn several times over.
        let n = 8 * ty.block_len();
        let row_bytes = ty.row_bytes(n).unwrap();
        let rows: Vec<u8> = (0..ROWS)
            .flat_map(|_| random_row(ty, n, 2.0, &mut next))
            .collect();
        let theirs = gguf_py_raw(ty, row_bytes, &rows);
        assert_eq!(
            theirs.len(),
            ROWS * n,
            "{ty}: gguf-py returned {} values",
            theirs.len()
        );
        for (r, (row, reference)) in rows.chunks(row_bytes).zip(theirs.chunks(n)).enumerate() {
            let mut ours = vec![0f32; n];
            dequantize_row(ty, row, &mut ours);
            for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "random {ty} row {r} value {i}: ours {a}, gguf-py {b}"
                );
            }
        }
    }
}

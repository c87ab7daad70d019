//! The GGUF reader against hostile and damaged files: every malformed input must give the
//! right `GgufError` variant with a message that names the cause and the fix, never a panic and
//! never an allocation out of proportion to the file. Files are built in memory by a small
//! test-only writer; the real files of the test data (`testdata/`) are parsed too, and their facts were
//! checked against gguf-py's `GGUFReader`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use llm_server::gguf::{parse, Array, Gguf, GgufError, Metadata, Value};
use llm_server::model::{ConfigError, LoadOptions, Model, ModelError};
use llm_server::quant::GgmlType;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Allocation accounting: this test binary counts, per thread, the bytes live on the heap, so a
// test can measure the peak a single parse reaches while other tests run on other threads.

struct CountingAlloc;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    // `try_with`: the allocator also runs while thread-locals are being torn down.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + size;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn note_free(size: usize) {
    // Memory allocated on another thread may be freed here, hence saturating.
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size)));
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note_free(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note_free(layout.size());
            note_alloc(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result with the most heap bytes it had live at once on this thread.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// The heap a parse of `len` input bytes may use. The parsed structures legitimately outweigh
/// the input (a 24-byte `String` per 8-byte string header, a 32-byte `Array` per 12-byte array
/// header, nested four deep), so the bound is linear with a generous factor: what matters is
/// that no count in the file can make it grow beyond the file's size.
fn heap_budget(len: usize) -> usize {
    16 * len + 16 * 1024
}

// ---------------------------------------------------------------------------------------------
// A test-only GGUF writer. It writes what it is told, including lies (counts, offsets, types),
// so each test can damage exactly one thing.

/// GGUF value type ids (`enum gguf_type` in gguf.h).
mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml type ids (`enum ggml_type` in ggml.h) used below.
const F32: u32 = 0;
const BF16: u32 = 30;
const Q4_0: u32 = 2;
/// A ggml type this engine does not read (MXFP4: blocks of 32 values in 17 bytes).
const MXFP4: u32 = 39;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => vt::U8,
        Value::I8(_) => vt::I8,
        Value::U16(_) => vt::U16,
        Value::I16(_) => vt::I16,
        Value::U32(_) => vt::U32,
        Value::I32(_) => vt::I32,
        Value::U64(_) => vt::U64,
        Value::I64(_) => vt::I64,
        Value::F32(_) => vt::F32,
        Value::F64(_) => vt::F64,
        Value::Bool(_) => vt::BOOL,
        Value::String(_) => vt::STRING,
        Value::Array(_) => vt::ARRAY,
    }
}

fn element_type(a: &Array) -> u32 {
    match a {
        Array::U8(_) => vt::U8,
        Array::I8(_) => vt::I8,
        Array::U16(_) => vt::U16,
        Array::I16(_) => vt::I16,
        Array::U32(_) => vt::U32,
        Array::I32(_) => vt::I32,
        Array::U64(_) => vt::U64,
        Array::I64(_) => vt::I64,
        Array::F32(_) => vt::F32,
        Array::F64(_) => vt::F64,
        Array::Bool(_) => vt::BOOL,
        Array::String(_) => vt::STRING,
        Array::Array(_) => vt::ARRAY,
    }
}

/// The payload of a value (what follows its type id).
fn encode_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => encode_array(out, a),
    }
}

/// An array payload: element type, length, elements (nested arrays repeat this recursively).
fn encode_array(out: &mut Vec<u8>, a: &Array) {
    put_u32(out, element_type(a));
    put_u64(out, a.len() as u64);
    fn each<T>(out: &mut Vec<u8>, v: &[T], f: impl Fn(&mut Vec<u8>, &T)) {
        v.iter().for_each(|x| f(out, x));
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => each(out, v, |o, x| o.push(u8::from(*x))),
        Array::String(v) => each(out, v, |o, s| put_str(o, s)),
        Array::Array(v) => each(out, v, encode_array),
    }
}

#[derive(Clone)]
struct TestTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
    /// Written instead of the offset the layout gives, to lie about where the data is.
    offset: Option<u64>,
}

#[derive(Clone)]
struct GgufWriter {
    magic: [u8; 4],
    version: u32,
    /// Alignment the writer lays the data out with; `general.alignment` is only written when
    /// [`GgufWriter::alignment`] is called.
    alignment: u64,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<TestTensor>,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
}

/// A file as written, with where the writer put things.
struct Written {
    bytes: Vec<u8>,
    data_start: usize,
    /// Absolute offset of each tensor's data (by the layout, whatever the header claims).
    data_at: Vec<usize>,
}

impl GgufWriter {
    fn new() -> Self {
        GgufWriter {
            magic: *b"GGUF",
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
            tensor_count: None,
            kv_count: None,
        }
    }

    fn kv(self, key: &str, v: Value) -> Self {
        let mut payload = Vec::new();
        encode_value(&mut payload, &v);
        self.raw_kv(key, value_type(&v), payload)
    }

    /// A key with an arbitrary type id and payload bytes.
    fn raw_kv(mut self, key: &str, type_id: u32, payload: Vec<u8>) -> Self {
        self.kvs.push((key.to_string(), type_id, payload));
        self
    }

    fn alignment(mut self, a: u64) -> Self {
        // Lay out with a usable alignment even when the key is deliberately invalid.
        self.alignment = a.max(1);
        self.kv("general.alignment", Value::U64(a))
    }

    fn tensor(mut self, name: &str, type_id: u32, dims: &[u64], data: Vec<u8>) -> Self {
        self.tensors.push(TestTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
            offset: None,
        });
        self
    }

    /// A tensor whose header claims data offset `offset`; it has no data of its own.
    fn tensor_at(mut self, name: &str, type_id: u32, dims: &[u64], offset: u64) -> Self {
        self.tensors.push(TestTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data: Vec::new(),
            offset: Some(offset),
        });
        self
    }

    fn write(&self) -> Written {
        let align = |n: usize| n.next_multiple_of(self.alignment as usize);
        let mut rel = Vec::new();
        let mut end = 0;
        for t in &self.tensors {
            let at = align(end);
            rel.push(at);
            end = at + t.data.len();
        }

        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        put_u32(&mut out, self.version);
        put_u64(
            &mut out,
            self.tensor_count.unwrap_or(self.tensors.len() as u64),
        );
        put_u64(&mut out, self.kv_count.unwrap_or(self.kvs.len() as u64));
        for (key, type_id, payload) in &self.kvs {
            put_str(&mut out, key);
            put_u32(&mut out, *type_id);
            out.extend_from_slice(payload);
        }
        for (t, &at) in self.tensors.iter().zip(&rel) {
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            t.dims.iter().for_each(|&d| put_u64(&mut out, d));
            put_u32(&mut out, t.type_id);
            put_u64(&mut out, t.offset.unwrap_or(at as u64));
        }
        let data_start = align(out.len());
        let mut data_at = Vec::new();
        if !self.tensors.is_empty() {
            out.resize(data_start, 0);
            for (t, &at) in self.tensors.iter().zip(&rel) {
                out.resize(data_start + at, 0);
                data_at.push(out.len());
                out.extend_from_slice(&t.data);
            }
        }
        Written {
            bytes: out,
            data_start,
            data_at,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.write().bytes
    }
}

/// `n` distinct, recognisable bytes.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every metadata type, nested arrays three deep, and tensors of several types whose sizes force
/// padding between them. The last tensor ends exactly at the end of the file.
fn sample_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(1 << 40)),
        ("t.i64", Value::I64(-(1 << 40))),
        ("t.i64_small", Value::I64(7)),
        ("t.f32", Value::F32(1.5)),
        ("t.f64", Value::F64(-2.25)),
        ("t.true", Value::Bool(true)),
        ("t.false", Value::Bool(false)),
        ("t.string", Value::String("héllo ✓".into())),
        ("t.empty_string", Value::String(String::new())),
        ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-128, 127]))),
        ("a.u16", Value::Array(Array::U16(vec![1, 65_535]))),
        ("a.i16", Value::Array(Array::I16(vec![-1, 2]))),
        ("a.u32", Value::Array(Array::U32(vec![3, 4, 5]))),
        ("a.i32", Value::Array(Array::I32(vec![-6, 7]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, 0]))),
        ("a.f32", Value::Array(Array::F32(vec![0.5, -1e30]))),
        ("a.f64", Value::Array(Array::F64(vec![1e300]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        (
            "a.string",
            Value::Array(Array::String(vec!["a".into(), "".into(), "ßç".into()])),
        ),
        ("a.empty", Value::Array(Array::U8(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::String(vec!["x".into()]),
                Array::I8(vec![-1]),
                Array::Array(vec![Array::F64(vec![2.5]), Array::Array(vec![])]),
            ])),
        ),
    ]
}

fn sample() -> GgufWriter {
    let w = sample_metadata()
        .into_iter()
        .fold(GgufWriter::new(), |w, (k, v)| w.kv(k, v));
    w.tensor("f32", F32, &[3, 2], pattern(24, 1))
        .tensor("q8_0", Q8_0, &[64, 2], pattern(2 * 68, 2))
        .tensor("bf16", BF16, &[5], pattern(10, 3))
        .tensor("q4_K", Q4_K, &[256, 1, 1, 1], pattern(144, 4))
}

/// A small valid file (about 100 bytes) to lie about counts in.
fn small() -> GgufWriter {
    GgufWriter::new()
        .kv("general.name", Value::String("x".into()))
        .tensor("w", F32, &[2], pattern(8, 0))
}

// ---------------------------------------------------------------------------------------------
// Helpers for asserting on errors.

fn parse_err(bytes: Vec<u8>) -> GgufError {
    match Gguf::from_vec(bytes) {
        Ok(_) => panic!("a malformed file parsed"),
        Err(e) => e,
    }
}

/// Asserts the message contains every one of `needles` (the cause and the fix).
fn assert_says(e: &GgufError, needles: &[&str]) {
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message lacks {n:?}: {msg}");
    }
}

const CORRUPT_FIX: &str = "fetch it again or re-convert it";
const TRUNCATED_FIX: &str = "fetch the file again";

/// A file with a single key whose value is `type_id` followed by `payload`.
fn one_kv(type_id: u32, payload: Vec<u8>) -> Vec<u8> {
    GgufWriter::new().raw_kv("k", type_id, payload).bytes()
}

/// A file with one tensor info and no data.
fn one_tensor(type_id: u32, dims: &[u64]) -> GgufError {
    parse_err(GgufWriter::new().tensor_at("w", type_id, dims, 0).bytes())
}

// ---------------------------------------------------------------------------------------------
// The valid file round-trips.

#[test]
fn every_metadata_type_round_trips() {
    let g = Gguf::from_vec(sample().bytes()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    let expected = sample_metadata();
    assert_eq!(g.metadata.len(), expected.len());
    for (k, v) in &expected {
        assert_eq!(g.metadata.get(k), Some(v), "{k}");
    }
}

#[test]
fn typed_accessors_convert_only_what_fits() {
    let g = Gguf::from_vec(sample().bytes()).unwrap();
    let m = &g.metadata;
    // u32 accepts any integer type whose value is in range...
    assert_eq!(m.u32("t.u8").unwrap(), 200);
    assert_eq!(m.u32("t.u16").unwrap(), 60_000);
    assert_eq!(m.u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(m.u32("t.i64_small").unwrap(), 7);
    assert_eq!(m.u64("t.u64").unwrap(), 1 << 40);
    assert_eq!(m.usize("t.u8").unwrap(), 200);
    // ...and names the key and both types otherwise.
    for (key, got) in [
        ("t.i8", "i8"),
        ("t.i16", "i16"),
        ("t.u64", "u64"),
        ("t.f32", "f32"),
    ] {
        let e = m.u32(key).unwrap_err();
        assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
        assert_says(&e, &[key, "u32", got]);
    }
    assert!(matches!(m.u64("t.i64"), Err(GgufError::WrongType { .. })));

    assert_eq!(m.f32("t.f32").unwrap(), 1.5);
    assert_eq!(m.f32("t.f64").unwrap(), -2.25);
    assert!(matches!(m.f32("t.u8"), Err(GgufError::WrongType { .. })));
    assert!(m.bool("t.true").unwrap());
    assert!(!m.bool("t.false").unwrap());
    assert_eq!(m.str("t.string").unwrap(), "héllo ✓");
    assert_eq!(m.str("t.empty_string").unwrap(), "");
    assert_eq!(m.strings("a.string").unwrap(), ["a", "", "ßç"]);
    assert_eq!(m.f32s("a.f32").unwrap(), [0.5, -1e30]);
    assert_eq!(m.i32s("a.i32").unwrap(), [-6, 7]);
    let e = m.strings("a.i32").unwrap_err();
    assert_says(&e, &["a.i32", "array of string", "array of i32"]);

    assert_eq!(m.opt("t.u8", Metadata::u32).unwrap(), Some(200));
    assert_eq!(m.opt("absent", Metadata::u32).unwrap(), None);
    assert!(matches!(
        m.opt("t.string", Metadata::u32),
        Err(GgufError::WrongType { .. })
    ));
    let e = m.u32("absent").unwrap_err();
    assert!(
        matches!(&e, GgufError::MissingKey(k) if k == "absent"),
        "{e}"
    );
}

#[test]
fn tensor_views_are_exactly_the_written_bytes() {
    let w = sample();
    let written = w.write();
    let g = Gguf::from_vec(written.bytes.clone()).unwrap();
    assert_eq!(g.tensors.len(), w.tensors.len());
    for (t, &at) in w.tensors.iter().zip(&written.data_at) {
        let view = g.tensor(&t.name).unwrap();
        assert_eq!(view.data, &t.data[..], "{}", t.name);
        assert_eq!(view.info.offset, at);
        assert_eq!((view.info.offset - written.data_start) % 32, 0);
        assert_eq!(view.ty().id(), t.type_id);
        let dims: Vec<u64> = view.info.dims.iter().map(|&d| d as u64).collect();
        assert_eq!(dims, t.dims);
    }
    let q8 = g.tensor("q8_0").unwrap();
    assert_eq!(
        (q8.info.row_len(), q8.info.n_rows(), q8.row_bytes()),
        (64, 2, 68)
    );
    assert_eq!(q8.row(1), &w.tensors[1].data[68..]);
    assert_eq!(g.tensor("q4_K").unwrap().info.n_rows(), 1);

    let e = g.tensor("absent").unwrap_err();
    assert!(
        matches!(&e, GgufError::MissingTensor(n) if n == "absent"),
        "{e}"
    );
    assert_eq!(
        parse(&written.bytes).unwrap().data_start,
        written.data_start
    );
}

#[test]
fn version_2_and_a_larger_alignment_parse() {
    let mut w = sample().alignment(64);
    w.version = 2;
    let written = w.write();
    let g = Gguf::from_vec(written.bytes).unwrap();
    assert_eq!((g.version, g.alignment), (2, 64));
    assert_eq!(written.data_start % 64, 0);
    for (t, &at) in w.tensors.iter().zip(&written.data_at) {
        assert_eq!(g.tensor(&t.name).unwrap().info.offset, at);
        assert_eq!(g.tensor(&t.name).unwrap().data, &t.data[..]);
    }
}

#[test]
fn a_file_without_tensors_needs_no_data_section() {
    let bytes = GgufWriter::new().kv("k", Value::U8(1)).bytes();
    let g = Gguf::from_vec(bytes).unwrap();
    assert!(g.tensors.is_empty());
    assert_eq!(g.metadata.u32("k").unwrap(), 1);
}

#[test]
fn open_maps_the_same_file_and_names_a_missing_path() {
    let bytes = sample().bytes();
    let path = std::env::temp_dir().join(format!("gguf_malformed_{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let opened = Gguf::open(&path);
    std::fs::remove_file(&path).unwrap();
    let opened = opened.unwrap();
    let in_memory = Gguf::from_vec(bytes).unwrap();
    assert_eq!(opened.tensors, in_memory.tensors);
    assert_eq!(opened.bytes(), in_memory.bytes());

    let missing = Path::new("/nonexistent/model.gguf");
    let e = match Gguf::open(missing) {
        Ok(_) => panic!("opened a missing file"),
        Err(e) => e,
    };
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    assert_says(&e, &["/nonexistent/model.gguf"]);
}

// ---------------------------------------------------------------------------------------------
// Truncation.

#[test]
fn every_prefix_of_a_valid_file_is_an_error() {
    let written = sample().write();
    let full = &written.bytes;
    assert_eq!(full.len(), *written.data_at.last().unwrap() + 144);
    for len in 0..full.len() {
        let e = parse_err(full[..len].to_vec());
        // A cut in the header is reported as truncation; a cut in the data leaves the header
        // intact, so it shows as a tensor running past the end of the file.
        if len < written.data_start {
            assert!(matches!(e, GgufError::Truncated(_)), "cut at {len}: {e}");
            assert_says(&e, &["truncated", TRUNCATED_FIX]);
        } else {
            assert!(matches!(e, GgufError::OutOfBounds(_)), "cut at {len}: {e}");
            assert_says(&e, &["ends past the end of the file", "truncated"]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fixed header fields.

#[test]
fn bad_magic_names_what_the_file_starts_with() {
    let mut w = sample();
    w.magic = *b"GGML";
    let e = parse_err(w.bytes());
    assert!(matches!(&e, GgufError::BadMagic(m) if m == b"GGML"), "{e}");
    assert_says(&e, &["not a GGUF file", "47, 47, 4d, 4c", "check the path"]);

    // Too short to hold a magic, and not the start of one either.
    let e = parse_err(b"hi".to_vec());
    assert!(matches!(&e, GgufError::BadMagic(m) if m == b"hi"), "{e}");
}

#[test]
fn unsupported_versions_name_the_supported_ones() {
    for version in [0, 1, 4, u32::MAX] {
        let mut w = sample();
        w.version = version;
        let e = parse_err(w.bytes());
        assert!(matches!(e, GgufError::BadVersion(v) if v == version), "{e}");
        assert_says(
            &e,
            &[
                &format!("version {version}"),
                "versions 2 and 3",
                "re-convert",
            ],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Counts: every count is checked against the bytes left before anything is allocated.

#[test]
fn huge_counts_are_rejected_without_allocating() {
    let huge = [1u64 << 60, u64::MAX, u64::MAX / 8];
    let mut files = Vec::new();
    for n in huge {
        let mut w = small();
        w.tensor_count = Some(n);
        files.push(("tensor count", w.bytes()));
        let mut w = small();
        w.kv_count = Some(n);
        files.push(("metadata count", w.bytes()));
        // A string length in a key, a value, and a tensor name.
        let mut key = Vec::new();
        put_u64(&mut key, n);
        // Zeros after the length so the key count itself is plausible.
        let mut bytes = GgufWriter::new().bytes();
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&key);
        bytes.extend_from_slice(&[0; 16]);
        files.push(("metadata key #0", bytes));
        let mut value = Vec::new();
        put_u64(&mut value, n);
        files.push(("k", one_kv(vt::STRING, value)));
        let mut bytes = GgufWriter::new().bytes();
        bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&n.to_le_bytes());
        bytes.extend_from_slice(&[0; 24]);
        files.push(("name of tensor #0", bytes));
        // An array length, for every element type (the reader sizes each differently).
        for ty in vt::U8..=vt::F64 {
            let mut payload = Vec::new();
            put_u32(&mut payload, ty);
            put_u64(&mut payload, n);
            files.push(("length of array `k`", one_kv(vt::ARRAY, payload)));
        }
    }
    for (what, bytes) in files {
        let len = bytes.len();
        assert!(len <= 128, "hostile files here are small ({len} bytes)");
        let (result, peak) = peak_heap(|| Gguf::from_vec(bytes).err());
        let e = result.expect("a hostile count parsed");
        assert!(matches!(e, GgufError::Truncated(_)), "{what}: {e}");
        assert_says(&e, &[what, "bytes left", TRUNCATED_FIX]);
        // The budget includes the input itself (it is moved into the parser).
        assert!(
            peak <= heap_budget(len),
            "{what}: {peak} bytes of heap for a {len}-byte file"
        );
    }
}

#[test]
fn the_largest_counts_the_bytes_allow_stay_within_the_heap_budget() {
    // Counts just within what the file's bytes can back, so the reader does reserve for them,
    // nested as deep as allowed: an array of arrays of arrays of arrays of strings.
    const PAD: usize = 4096;
    let mut files = Vec::new();
    for ty in vt::U8..=vt::F64 {
        let mut payload = Vec::new();
        put_u32(&mut payload, ty);
        put_u64(&mut payload, (PAD / 16) as u64);
        payload.resize(payload.len() + PAD, 0);
        files.push(one_kv(vt::ARRAY, payload));
    }
    let mut payload = Vec::new();
    for _ in 0..3 {
        put_u32(&mut payload, vt::ARRAY);
        put_u64(&mut payload, (PAD / 12) as u64);
    }
    put_u32(&mut payload, vt::STRING);
    put_u64(&mut payload, (PAD / 8) as u64);
    payload.resize(payload.len() + PAD, 0);
    files.push(one_kv(vt::ARRAY, payload));

    for bytes in files {
        let len = bytes.len();
        let (_, peak) = peak_heap(|| Gguf::from_vec(bytes).err());
        assert!(
            peak <= heap_budget(len),
            "{peak} bytes of heap for a {len}-byte file"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Metadata values.

#[test]
fn duplicate_key_is_named() {
    let bytes = GgufWriter::new()
        .kv("general.name", Value::String("a".into()))
        .kv("general.name", Value::String("b".into()))
        .bytes();
    let e = parse_err(bytes);
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`general.name` appears twice", CORRUPT_FIX]);
}

#[test]
fn bool_bytes_other_than_0_and_1_are_rejected() {
    let e = parse_err(one_kv(vt::BOOL, vec![2]));
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`k`", "bool byte is 2", CORRUPT_FIX]);

    let mut payload = Vec::new();
    encode_array(&mut payload, &Array::Bool(vec![true, false]));
    *payload.last_mut().unwrap() = 0xff;
    let e = parse_err(one_kv(vt::ARRAY, payload));
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`k`", "bool byte is 255"]);
}

#[test]
fn unknown_value_types_are_named() {
    let e = parse_err(one_kv(13, vec![0; 8]));
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`k`", "unknown value type 13", "0..=12", CORRUPT_FIX]);

    let mut payload = Vec::new();
    put_u32(&mut payload, u32::MAX);
    put_u64(&mut payload, 0);
    let e = parse_err(one_kv(vt::ARRAY, payload));
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`k`", "array of unknown value type 4294967295"]);
}

/// An array nested `depth` deep (depth 1 is a plain array of u8).
fn nested(depth: usize) -> Array {
    (1..depth).fold(Array::U8(vec![9]), |inner, _| Array::Array(vec![inner]))
}

#[test]
fn arrays_nest_four_deep_and_no_deeper() {
    let g = Gguf::from_vec(GgufWriter::new().kv("k", Value::Array(nested(4))).bytes()).unwrap();
    assert_eq!(g.metadata.get("k"), Some(&Value::Array(nested(4))));

    let bytes = GgufWriter::new().kv("k", Value::Array(nested(5))).bytes();
    let e = parse_err(bytes);
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["`k`", "nested deeper than 4", CORRUPT_FIX]);

    // Deep nesting far past the limit is cut off before it can exhaust the stack.
    let e = parse_err(GgufWriter::new().kv("k", Value::Array(nested(100))).bytes());
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for a in [0, 3, 48, u64::MAX] {
        let e = parse_err(GgufWriter::new().alignment(a).bytes());
        assert!(matches!(e, GgufError::Malformed(_)), "alignment {a}: {e}");
        assert_says(&e, &[&format!("general.alignment is {a}"), "power of two"]);
    }
    let bytes = GgufWriter::new()
        .kv("general.alignment", Value::String("32".into()))
        .bytes();
    let e = parse_err(bytes);
    assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
    assert_says(&e, &["general.alignment", "string"]);

    // A power of two so large the data section cannot start inside the file.
    let mut w = GgufWriter::new().tensor("w", F32, &[1], vec![0; 4]);
    w = w.kv("general.alignment", Value::U64(1 << 40));
    let e = parse_err(w.bytes());
    assert!(matches!(e, GgufError::Truncated(_)), "{e}");
    assert_says(&e, &["1099511627776"]);
}

// ---------------------------------------------------------------------------------------------
// Tensor infos.

#[test]
fn tensor_past_the_end_of_the_file_is_named() {
    let w = sample().tensor_at("late", F32, &[8], 1 << 20);
    let e = parse_err(w.bytes());
    assert!(matches!(e, GgufError::OutOfBounds(_)), "{e}");
    assert_says(&e, &["`late`", "32 bytes", "1048576", "ends past the end"]);
    assert_says(&e, &["corrupt or truncated", "fetch it again"]);

    // An offset so large that offset + size overflows.
    let w = sample().tensor_at("wraps", F32, &[8], u64::MAX - 31);
    let e = parse_err(w.bytes());
    assert!(matches!(e, GgufError::OutOfBounds(_)), "{e}");
    assert_says(&e, &["`wraps`", "ends past the end"]);
}

#[test]
fn misaligned_offset_is_named() {
    let e = parse_err(sample().tensor_at("odd", F32, &[1], 8).bytes());
    assert!(matches!(e, GgufError::OutOfBounds(_)), "{e}");
    assert_says(&e, &["`odd`", "offset 8", "alignment 32"]);

    let e = parse_err(
        sample()
            .alignment(64)
            .tensor_at("odd", F32, &[1], 32)
            .bytes(),
    );
    assert!(matches!(e, GgufError::OutOfBounds(_)), "{e}");
    assert_says(&e, &["offset 32", "alignment 64"]);
}

/// A file with a tensor type the kernels do not read opens and lists it (so `inspect` and
/// `tokenize` work); taking the tensor's typed view for inference is refused, naming the tensor,
/// its type and id, the supported types and the fix.
#[test]
fn unsupported_tensor_types_open_but_their_view_lists_the_supported_ones() {
    let g = Gguf::from_vec(
        GgufWriter::new()
            .tensor("w", MXFP4, &[64, 2], pattern(68, 1))
            .bytes(),
    )
    .expect("a file with an mxfp4 tensor opens");
    let info = g.tensor_info("w").unwrap();
    assert_eq!((info.ty.name(), info.ty.id(), info.size), ("mxfp4", 39, 68));
    assert_eq!(info.ty.ggml(), None);
    assert_eq!(g.tensor_data(info), &pattern(68, 1)[..]);
    let e = g.tensor("w").expect_err("the typed view is refused");
    assert!(
        matches!(
            e,
            GgufError::UnsupportedType {
                id: 39,
                name: Some("mxfp4"),
                ..
            }
        ),
        "{e}"
    );
    assert_says(&e, &["`w`", "mxfp4", "ggml id 39", "re-quantize"]);
    for t in GgmlType::SUPPORTED {
        assert_says(&e, &[t.name()]);
    }

    // An id ggml does not have cannot even be located (its block size is unknown): refused
    // when the file is opened.
    let e = one_tensor(99, &[32]);
    assert!(
        matches!(
            e,
            GgufError::UnsupportedType {
                id: 99,
                name: None,
                ..
            }
        ),
        "{e}"
    );
    assert_says(&e, &["unknown", "ggml id 99", "q4_0", "q4_K"]);
}

#[test]
fn bad_shapes_are_named() {
    let cases: &[(u32, &[u64], &[&str])] = &[
        (Q4_0, &[48, 2], &["48 values", "q4_0 blocks of 32"]),
        (Q4_K, &[640], &["640 values", "q4_K blocks of 256"]),
        (F32, &[4, 0], &["dimension 1 is 0", "at least 1"]),
        (F32, &[0], &["dimension 0 is 0"]),
        (F32, &[1, 1, 1, 1, 1], &["5 dimensions", "1 to 4"]),
        (F32, &[], &["0 dimensions", "1 to 4"]),
        (
            F32,
            &[1 << 32, 1 << 32, 1 << 32],
            &["element count overflows"],
        ),
        // One dimension that fits but whose byte size does not (a panic before the fix).
        (F32, &[1 << 62], &["byte size overflows"]),
        (BF16, &[1 << 63], &["byte size overflows"]),
        (F32, &[1 << 61, 4], &["byte size overflows"]),
    ];
    for (ty, dims, needles) in cases {
        let e = one_tensor(*ty, dims);
        assert!(matches!(e, GgufError::Shape { .. }), "{dims:?}: {e}");
        assert_says(&e, &["`w` has a bad shape", CORRUPT_FIX]);
        assert_says(&e, needles);
    }
    // A dimension count far beyond the limit is rejected before any dimension is read.
    let mut bytes = GgufWriter::new().bytes();
    bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
    put_str(&mut bytes, "w");
    put_u32(&mut bytes, u32::MAX);
    bytes.extend_from_slice(&[0; 24]);
    let e = parse_err(bytes);
    assert!(matches!(e, GgufError::Shape { .. }), "{e}");
    assert_says(&e, &["4294967295 dimensions"]);
}

#[test]
fn duplicate_tensor_is_named() {
    let w = GgufWriter::new()
        .tensor("w", F32, &[1], vec![0; 4])
        .tensor("w", F32, &[1], vec![0; 4]);
    let e = parse_err(w.bytes());
    assert!(matches!(e, GgufError::Malformed(_)), "{e}");
    assert_says(&e, &["tensor `w` appears twice", CORRUPT_FIX]);
}

// ---------------------------------------------------------------------------------------------
// Random damage: whatever the bytes, the reader returns (no panic, no runaway allocation), and a
// file it accepts has every tensor inside it.

fn check_accepted(g: &Gguf) {
    for info in &g.tensors {
        assert_eq!(g.tensor_data(info).len(), info.size);
        match g.tensor(&info.name) {
            Ok(t) => {
                assert_eq!(t.data.len(), info.size);
                assert_eq!(t.data.len(), t.row_bytes() * info.n_rows());
            }
            Err(GgufError::UnsupportedType { .. }) => assert_eq!(info.ty.ggml(), None),
            Err(e) => panic!("{}: {e}", info.name),
        }
        assert!(info.offset + info.size <= g.bytes().len());
        assert_eq!(info.size % info.ty.block_bytes(), 0);
    }
    for (_, v) in g.metadata.iter() {
        let _ = v.to_string();
    }
}

proptest! {
    #[test]
    fn damaged_files_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        trim in any::<bool>(),
    ) {
        let mut bytes = sample().bytes();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if trim {
            bytes.truncate(cut.index(bytes.len()));
        }
        let len = bytes.len();
        let (result, peak) = peak_heap(|| Gguf::from_vec(bytes));
        if let Ok(g) = &result {
            check_accepted(g);
        }
        prop_assert!(peak <= heap_budget(len), "{} bytes of heap for {} bytes", peak, len);
    }
}

// ---------------------------------------------------------------------------------------------
// The fuzzer's seed corpus comes from this writer (fuzz/README.md):
// `GGUF_FUZZ_SEEDS=fuzz/corpus/gguf_parse cargo test -p llm-server --test it
// gguf_malformed::write_fuzz_seeds -- --ignored`.

#[test]
#[ignore = "writes the fuzz seed corpus into $GGUF_FUZZ_SEEDS"]
fn write_fuzz_seeds() {
    let dir = std::env::var_os("GGUF_FUZZ_SEEDS").expect("set GGUF_FUZZ_SEEDS to a directory");
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut seeds = vec![
        ("sample", sample().bytes()),
        ("small", small().bytes()),
        (
            "nested",
            GgufWriter::new().kv("k", Value::Array(nested(4))).bytes(),
        ),
    ];
    let mut v2 = sample().alignment(64);
    v2.version = 2;
    seeds.push(("v2-align64", v2.bytes()));
    // One valid tensor of every supported type, two rows of two blocks each.
    for t in GgmlType::SUPPORTED {
        let n = 2 * t.block_len();
        let data = pattern(2 * t.row_bytes(n).unwrap(), t.id() as u8);
        let w = GgufWriter::new().tensor(t.name(), t.id(), &[n as u64, 2], data);
        seeds.push((t.name(), w.bytes()));
    }
    // The start of real vocabulary files, for their key layout.
    for f in ["ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"] {
        let bytes = std::fs::read(test_support::testdata(&format!("vocab/{f}"))).unwrap();
        seeds.push((f, bytes[..4096].to_vec()));
    }
    for (name, bytes) in seeds {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions found by `fuzz/` (each input is the fuzzer's, minimised).

// ---------------------------------------------------------------------------------------------
// Real files. Every fact below was checked with gguf-py's GGUFReader (gguf 0.17), independent
// of this reader.

/// (file, metadata keys, tensors, data section offset, tensor count per type)
type Facts = (
    &'static str,
    usize,
    usize,
    usize,
    &'static [(&'static str, usize)],
);

const SYNTH: &[Facts] = &[
    ("synth-gemma3-f32.gguf", 25, 80, 16608, &[("f32", 80)]),
    (
        "synth-gemma3-iq4_xs.gguf",
        27,
        80,
        16672,
        &[("f32", 37), ("iq4_xs", 36), ("q5_K", 6), ("q6_K", 1)],
    ),
    (
        "synth-gemma3-q4_k_m.gguf",
        27,
        80,
        16672,
        &[("f32", 37), ("q4_K", 38), ("q6_K", 5)],
    ),
    (
        "synth-gemma3-q8_0.gguf",
        27,
        80,
        16672,
        &[("f32", 37), ("q8_0", 43)],
    ),
    (
        "synth-llama-bf16.gguf",
        24,
        21,
        13088,
        &[("bf16", 16), ("f32", 5)],
    ),
    (
        "synth-llama-f16.gguf",
        24,
        21,
        13088,
        &[("f16", 16), ("f32", 5)],
    ),
    ("synth-llama-f32.gguf", 22, 21, 12992, &[("f32", 21)]),
    (
        "synth-llama-iq4_nl.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("iq4_nl", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-iq4_xs.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("iq4_xs", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q4_0.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q4_0", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q4_1.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q4_1", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q4_k_m.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q4_K", 13), ("q6_K", 3)],
    ),
    (
        "synth-llama-q5_0.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q5_0", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q5_k_m.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q5_K", 13), ("q6_K", 3)],
    ),
    (
        "synth-llama-q6_k.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q6_K", 16)],
    ),
    (
        "synth-llama-q8_0.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q8_0", 16)],
    ),
    (
        "synth-llama-iq3_s.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("iq3_s", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q2_k.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q2_K", 9), ("q3_K", 6), ("q6_K", 1)],
    ),
    (
        "synth-llama-q3_k_m.gguf",
        24,
        21,
        13088,
        &[
            ("f32", 5),
            ("q3_K", 9),
            ("q4_K", 4),
            ("q5_K", 2),
            ("q6_K", 1),
        ],
    ),
    (
        "synth-llama-q3_k_s.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q3_K", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-q5_1.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q5_1", 15), ("q6_K", 1)],
    ),
    (
        "synth-llama-tq1_0.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q4_K", 1), ("q6_K", 1), ("tq1_0", 14)],
    ),
    (
        "synth-llama-tq2_0.gguf",
        24,
        21,
        13088,
        &[("f32", 5), ("q4_K", 1), ("q6_K", 1), ("tq2_0", 14)],
    ),
    ("synth-qwen2-f32.gguf", 21, 27, 13248, &[("f32", 27)]),
    (
        "synth-qwen2-q4_k_m.gguf",
        23,
        27,
        13312,
        &[("f32", 11), ("q4_K", 13), ("q6_K", 3)],
    ),
    (
        "synth-qwen2-q8_0.gguf",
        23,
        27,
        13312,
        &[("f32", 11), ("q8_0", 16)],
    ),
    ("synth-qwen3-f32.gguf", 23, 25, 13248, &[("f32", 25)]),
    (
        "synth-qwen3-q4_k_m.gguf",
        25,
        25,
        13344,
        &[("f32", 9), ("q4_K", 13), ("q6_K", 3)],
    ),
    (
        "synth-qwen3-q8_0.gguf",
        25,
        25,
        13344,
        &[("f32", 9), ("q8_0", 16)],
    ),
];

/// Vocabulary-only files: no tensors, so their data section may start past the end.
const VOCAB: &[Facts] = &[
    ("ggml-vocab-deepseek-coder.gguf", 25, 0, 1156096, &[]),
    ("ggml-vocab-deepseek-llm.gguf", 23, 0, 3970176, &[]),
    ("ggml-vocab-falcon.gguf", 18, 0, 2287744, &[]),
    ("ggml-vocab-gpt-2.gguf", 16, 0, 1766816, &[]),
    ("ggml-vocab-llama-bpe.gguf", 20, 0, 7818144, &[]),
    ("ggml-vocab-llama-spm.gguf", 22, 0, 723872, &[]),
    ("ggml-vocab-mpt.gguf", 17, 0, 1771424, &[]),
    ("ggml-vocab-phi-3.gguf", 26, 0, 726048, &[]),
    ("ggml-vocab-qwen2.gguf", 20, 0, 5928704, &[]),
    ("ggml-vocab-qwen35.gguf", 20, 0, 5928704, &[]),
    ("ggml-vocab-refact.gguf", 18, 0, 1720736, &[]),
    ("ggml-vocab-starcoder.gguf", 19, 0, 1719360, &[]),
];

fn open_golden(dir: &str, file: &str) -> Gguf {
    let path = test_support::testdata(&format!("{dir}/{file}"));
    Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `facts` name every `.gguf` in `testdata/<dir>`, and each file opens with its facts, whatever
/// its tensor types.
fn check_facts(dir: &str, facts: &[Facts]) {
    let mut on_disk: Vec<String> = std::fs::read_dir(test_support::testdata_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".gguf"))
        .collect();
    on_disk.sort();
    let mut covered: Vec<String> = facts.iter().map(|f| String::from(f.0)).collect();
    covered.sort();
    assert_eq!(on_disk, covered, "a golden file is not covered here");
    for &(file, n_kv, n_tensors, data_start, types) in facts {
        let g = open_golden(dir, file);
        assert_eq!(g.version, 3, "{file}");
        assert_eq!(g.metadata.len(), n_kv, "{file}");
        assert_eq!(g.tensors.len(), n_tensors, "{file}");
        assert_eq!(parse(g.bytes()).unwrap().data_start, data_start, "{file}");
        for &(ty, n) in types {
            let count = g.tensors.iter().filter(|t| t.ty.name() == ty).count();
            assert_eq!(count, n, "{file}: {ty}");
        }
        // Writers pack tensors in header order, each at the next aligned offset (llama.cpp's
        // loader insists on it), so every size and offset this reader derived must tile exactly.
        let mut next = data_start;
        for t in &g.tensors {
            assert_eq!(t.offset, next, "{file}: {}", t.name);
            next = (t.offset + t.size).next_multiple_of(g.alignment);
        }
        if n_tensors > 0 {
            assert_eq!(next, g.bytes().len(), "{file}");
        }
        check_accepted(&g);
    }
}

/// A file with a tensor of a type no kernel reads (i32 has f32's block layout, so the file stays
/// well formed) opens, but loading it for inference is refused, naming that type.
fn check_load_refuses_unread_type() {
    let llama = std::fs::read(test_support::synth("synth-llama-q4_0.gguf")).unwrap();
    let bytes = test_support::with_tensor_type(llama, "blk.0.attn_norm.weight", 26);
    Gguf::from_vec(bytes.clone()).expect("the patched file still parses");
    let path = std::env::temp_dir().join(format!("gguf_malformed_i32_{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let opts = LoadOptions {
        threads: 1,
        mlock: false,
    };
    // The refusal comes from the first typed view taken: the configuration's or a weight's.
    let refused = match Model::load(&path, &opts) {
        Err(ModelError::Gguf(e) | ModelError::Config(ConfigError::Gguf(e))) => Err(e),
        other => other
            .map(|_| ())
            .map_err(|e| GgufError::Malformed(e.to_string())),
    };
    std::fs::remove_file(&path).unwrap();
    match refused {
        Err(GgufError::UnsupportedType {
            name: Some(name), ..
        }) => assert_eq!(name, "i32", "refused for {name}, not for the i32 tensor"),
        Err(e) => panic!("refused with {e}, not for the i32 tensor"),
        Ok(_) => panic!("a file with an i32 weight loaded for inference"),
    }
}

#[test]
fn golden_synth_files_parse_with_their_facts() {
    check_facts("synth", SYNTH);
    check_load_refuses_unread_type();

    let g = open_golden("synth", "synth-llama-q4_0.gguf");
    let ty = |name: &str| g.tensor(name).unwrap().ty();
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4_0);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q4_0);
    assert_eq!(ty("output.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.0.attn_norm.weight"), GgmlType::F32);
    assert_eq!(
        g.tensor("blk.0.attn_k.weight").unwrap().info.dims,
        [256, 128]
    );
    assert_eq!(g.metadata.str("general.architecture").unwrap(), "llama");

    let g = open_golden("synth", "synth-gemma3-q8_0.gguf");
    let m = &g.metadata;
    assert_eq!(m.str("general.architecture").unwrap(), "gemma3");
    assert_eq!(m.u32("gemma3.block_count").unwrap(), 6);
    assert_eq!(m.u32("gemma3.attention.sliding_window").unwrap(), 8);
    assert_eq!(m.u32("gemma3.attention.key_length").unwrap(), 64);
    assert_eq!(m.u32("gemma3.attention.head_count_kv").unwrap(), 1);
    assert_eq!(m.f32("gemma3.rope.freq_base").unwrap(), 1e6);
    assert_eq!(
        m.f32("gemma3.attention.layer_norm_rms_epsilon").unwrap(),
        1e-6
    );
    assert!(!m.bool("tokenizer.ggml.add_space_prefix").unwrap());
    assert_eq!(m.strings("tokenizer.ggml.tokens").unwrap().len(), 512);
    assert_eq!(m.f32s("tokenizer.ggml.scores").unwrap().len(), 512);
    assert_eq!(m.u32("general.file_type").unwrap(), 7);
    assert!(g.tensor_info("blk.5.attn_q_norm.weight").is_some());
}

#[test]
fn golden_vocab_files_parse_with_their_facts() {
    check_facts("vocab", VOCAB);

    let g = open_golden("vocab", "ggml-vocab-llama-bpe.gguf");
    let m = &g.metadata;
    assert_eq!(m.str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(m.strings("tokenizer.ggml.tokens").unwrap().len(), 128_256);
    assert_eq!(m.i32s("tokenizer.ggml.token_type").unwrap().len(), 128_256);
    assert_eq!(m.strings("tokenizer.ggml.merges").unwrap().len(), 280_147);
    assert_eq!(m.u32("tokenizer.ggml.bos_token_id").unwrap(), 128_000);
    assert_eq!(m.f32("llama.rope.freq_base").unwrap(), 500_000.0);

    let g = open_golden("vocab", "ggml-vocab-llama-spm.gguf");
    let m = &g.metadata;
    assert_eq!(m.str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(m.f32s("tokenizer.ggml.scores").unwrap().len(), 32_000);
    assert_eq!(m.u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);

    let g = open_golden("vocab", "ggml-vocab-gpt-2.gguf");
    assert_eq!(
        g.metadata.strings("tokenizer.ggml.merges").unwrap().len(),
        50_000
    );
    assert_eq!(
        g.metadata.u32("tokenizer.ggml.eos_token_id").unwrap(),
        50_256
    );
}

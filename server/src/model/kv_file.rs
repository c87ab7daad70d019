//! A slot's conversation on disk: its tokens and the KV cache rows that stand for them, so that
//! a restarted server answers a repeated long prompt from its cache (`serve --slot-save-path`).
//!
//! Layout (little-endian), version [`VERSION`]:
//! ```text
//! header  magic "LLMSLOT\0" · version u32 · model identity [32] · engine layout u32 ·
//!         n_layer u32 · n_head_kv u32 · head_dim u32 · dtype u32 (1 = f16) · n_ctx u32 ·
//!         n_tokens u32 · written u32 · rows u32 × n_layer · sha256 of all the above [32]
//! body    tokens u32 × n_tokens · per layer: keys then values of its rows, in position
//!         order, f16 × kv_dim each · sha256 of the body [32]
//! ```
//! Each layer keeps the positions its cache still holds intact: all of them in a global layer,
//! the ring's last `cells` in a sliding-window layer ([`Session::written`]). A file is restored
//! only into a session whose every wrapped ring has the same cells, so the restored cache is
//! the one that was saved, cell for cell, and resumes exactly where the saved one would have.
//!
//! The model's identity is not the GGUF's sha256: hashing a 700 MB file at every start reads
//! all of it before the first request (seconds on the appliance's disk and CPU, and the weights
//! are otherwise faulted in lazily). It is the sha256 of the file's length, its whole header
//! (metadata, vocabulary and tensor table: names, types, shapes, offsets) and 4 KiB at the
//! start, middle and end of every tensor's data. A re-quantised or retrained file changes its
//! metadata or its data's samples; a file edited in place elsewhere in a tensor would not be
//! noticed, which is the price of reading ~1 % of the file. The engine's layout version
//! ([`ENGINE_LAYOUT`]) is bumped by any change of what a KV row holds (the cache's type, RoPE,
//! the float order of the projections), so another build's cache is never loaded.
//!
//! Bad files (another model, another layout, corrupt, truncated, too long for the slot) are
//! refused with a [`KvFileError`] that names the reason; nothing is read into the cache before
//! the header is checked, and a body whose checksum fails leaves the session empty.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use half::f16;
use sha2::{Digest, Sha256};

use super::kv_cache;
use super::{Config, Session};
use crate::gguf::Gguf;

pub const MAGIC: &[u8; 8] = b"LLMSLOT\0";
/// The file layout's version.
pub const VERSION: u32 = 1;
/// What a KV row holds in this build: bump on any change of the cache's contents.
pub const ENGINE_LAYOUT: u32 = 1;
const DTYPE_F16: u32 = 1;
/// More layers than any model has: a header claiming more is corrupt.
const MAX_LAYERS: u32 = 4096;
/// Fixed part of the header, before the per-layer rows and the checksum.
const FIXED: usize = 8 + 4 + 32 + 4 * 9;
/// Bytes hashed at each sampled place of a tensor's data.
const SAMPLE: usize = 4096;

/// The model's identity as the header records it (see the module doc).
pub type ModelId = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum KvFileError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a slot file (no LLMSLOT magic)")]
    NotASlotFile,
    #[error("written in format version {found}, this build reads {VERSION}")]
    Version { found: u32 },
    #[error("its header is corrupt (checksum mismatch)")]
    HeaderChecksum,
    #[error("it was written for another model file")]
    OtherModel,
    #[error("it was written by a build with another KV layout ({0})")]
    Layout(String),
    #[error("it holds {tokens} tokens, more than the slot's context of {n_ctx}")]
    TooLong { tokens: usize, n_ctx: usize },
    #[error("it is {found} bytes long where its header says {expected} (truncated or padded)")]
    Size { expected: u64, found: u64 },
    #[error("its contents are corrupt (checksum mismatch)")]
    BodyChecksum,
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
}

impl KvFileError {
    /// Whether the file itself is at fault (to be deleted), not the disk or the system.
    pub fn is_bad_file(&self) -> bool {
        match self {
            KvFileError::Io(e) => e.kind() == io::ErrorKind::UnexpectedEof,
            _ => true,
        }
    }
}

/// What a save or a restore moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub tokens: usize,
    pub bytes: u64,
}

/// The identity of the model in `gguf` (see the module doc).
pub fn model_identity(gguf: &Gguf) -> ModelId {
    let bytes = gguf.bytes();
    let data_start = gguf
        .tensors
        .iter()
        .map(|t| t.offset)
        .min()
        .unwrap_or(bytes.len())
        .min(bytes.len());
    let mut h = Sha256::new();
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(&bytes[..data_start]);
    for t in &gguf.tensors {
        let data = gguf.tensor_data(t);
        let n = data.len();
        for at in [0, n / 2, n.saturating_sub(SAMPLE)] {
            h.update(&data[at.min(n)..(at + SAMPLE).min(n)]);
        }
    }
    h.finalize().into()
}

/// The header as written and read.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    model: ModelId,
    layout: u32,
    n_layer: u32,
    n_head_kv: u32,
    head_dim: u32,
    dtype: u32,
    n_ctx: u32,
    n_tokens: u32,
    written: u32,
    rows: Vec<u32>,
}

impl Header {
    fn of(s: &Session, c: &Config, model: &ModelId) -> Header {
        Header {
            model: *model,
            layout: ENGINE_LAYOUT,
            n_layer: c.n_layer as u32,
            n_head_kv: c.n_head_kv as u32,
            head_dim: c.head_dim as u32,
            dtype: DTYPE_F16,
            n_ctx: s.n_ctx as u32,
            n_tokens: s.n_past as u32,
            written: s.written.max(s.n_past) as u32,
            rows: s
                .kv
                .layers
                .iter()
                .map(|l| intact(s.n_past, s.written, l.cells).len() as u32)
                .collect(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + 4 * self.rows.len() + 32);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.model);
        for v in [
            self.layout,
            self.n_layer,
            self.n_head_kv,
            self.head_dim,
            self.dtype,
            self.n_ctx,
            self.n_tokens,
            self.written,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        // Pads the fixed part to its declared size (one spare word for a later field).
        b.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(b.len(), FIXED);
        for r in &self.rows {
            b.extend_from_slice(&r.to_le_bytes());
        }
        let sum: [u8; 32] = Sha256::digest(&b).into();
        b.extend_from_slice(&sum);
        b
    }

    /// Reads and checks the header's own consistency (magic, version, checksum).
    fn decode(r: &mut impl Read) -> Result<(Header, usize), KvFileError> {
        let mut fixed = [0u8; FIXED];
        r.read_exact(&mut fixed).map_err(eof_is_not_slot_file)?;
        if &fixed[..8] != MAGIC {
            return Err(KvFileError::NotASlotFile);
        }
        let word = |i: usize| u32::from_le_bytes(fixed[i..i + 4].try_into().expect("4 bytes"));
        let version = word(8);
        if version != VERSION {
            return Err(KvFileError::Version { found: version });
        }
        let at = 12 + 32;
        let n_layer = word(at + 4);
        if n_layer > MAX_LAYERS {
            return Err(KvFileError::HeaderChecksum);
        }
        let mut rest = vec![0u8; 4 * n_layer as usize + 32];
        r.read_exact(&mut rest)?;
        let (rows, sum) = rest.split_at(4 * n_layer as usize);
        let mut h = Sha256::new();
        h.update(fixed);
        h.update(rows);
        if h.finalize()[..] != sum[..] {
            return Err(KvFileError::HeaderChecksum);
        }
        let header = Header {
            model: fixed[12..44].try_into().expect("32 bytes"),
            layout: word(at),
            n_layer,
            n_head_kv: word(at + 8),
            head_dim: word(at + 12),
            dtype: word(at + 16),
            n_ctx: word(at + 20),
            n_tokens: word(at + 24),
            written: word(at + 28),
            rows: rows
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
                .collect(),
        };
        Ok((header, FIXED + rest.len()))
    }

    /// Bytes of the body after the header, checksum included.
    fn body_bytes(&self) -> u64 {
        let kv_row = self.n_head_kv as u64 * self.head_dim as u64 * 2;
        let rows: u64 = self.rows.iter().map(|&r| r as u64).sum();
        4 * self.n_tokens as u64 + 2 * kv_row * rows + 32
    }
}

/// A short file ends where its magic should be: not one of ours.
fn eof_is_not_slot_file(e: io::Error) -> KvFileError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        KvFileError::NotASlotFile
    } else {
        KvFileError::Io(e)
    }
}

/// Positions of a layer of `cells` that still hold their keys and values, with `0..n_past` in
/// the cache and `written` the highest written since the last clear.
fn intact(n_past: usize, written: usize, cells: usize) -> std::ops::Range<usize> {
    written.max(n_past).saturating_sub(cells).min(n_past)..n_past
}

/// Bytes a file of `s` would take (to check the disk before writing).
pub fn file_bytes(s: &Session, c: &Config) -> u64 {
    let h = Header::of(s, c, &[0; 32]);
    (FIXED + 4 * h.rows.len() + 32) as u64 + h.body_bytes()
}

/// Writes `s` to `path` atomically: into a temporary file beside it, flushed to the disk, then
/// renamed over `path` (and the directory synced), so that a crash leaves the old file or the
/// new one, never half of one.
pub fn save(s: &Session, c: &Config, model: &ModelId, path: &Path) -> Result<Moved, KvFileError> {
    let tmp = temp_path(path);
    let result = write_file(s, c, model, &tmp).and_then(|moved| {
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            // Makes the rename itself durable; some file systems refuse to sync a directory.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(moved)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `.NAME.tmp` beside `path`: hidden, and never a name the API accepts (no leading dot).
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp"))
}

fn write_file(s: &Session, c: &Config, model: &ModelId, path: &Path) -> Result<Moved, KvFileError> {
    let header = Header::of(s, c, model);
    let file = File::create(path)?;
    let mut w = BufWriter::with_capacity(1 << 16, file);
    let head = header.encode();
    w.write_all(&head)?;
    let mut body = Sha256::new();
    let mut put = |w: &mut BufWriter<File>, bytes: &[u8]| -> io::Result<()> {
        body.update(bytes);
        w.write_all(bytes)
    };
    for &t in &s.tokens[..s.n_past] {
        put(&mut w, &t.to_le_bytes())?;
    }
    let kv_dim = c.kv_dim();
    let mut row = vec![0u8; kv_dim * 2];
    for layer in &s.kv.layers {
        for cache in [&layer.k, &layer.v] {
            for pos in intact(s.n_past, s.written, layer.cells) {
                let cell = layer.cell(pos);
                let values = &cache[cell * kv_dim..(cell + 1) * kv_dim];
                for (b, v) in row.chunks_exact_mut(2).zip(values) {
                    b.copy_from_slice(&v.to_bits().to_le_bytes());
                }
                put(&mut w, &row)?;
            }
        }
    }
    let sum: [u8; 32] = body.finalize().into();
    w.write_all(&sum)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(Moved {
        tokens: s.n_past,
        bytes: (head.len() as u64) + header.body_bytes(),
    })
}

/// Reads `path` into `s`, replacing its conversation. A file refused by its header leaves the
/// session as it was; one that fails later leaves it empty (its cache may hold part of the
/// file, which nothing reads).
pub fn restore(
    s: &mut Session,
    c: &Config,
    model: &ModelId,
    path: &Path,
) -> Result<Moved, KvFileError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 16, file);
    let (header, head_len) = Header::decode(&mut r)?;
    check(&header, s, c, model)?;
    let expected = head_len as u64 + header.body_bytes();
    if len != expected {
        return Err(KvFileError::Size {
            expected,
            found: len,
        });
    }
    s.clear();
    let result = read_body(&mut r, &header, s, c);
    match result {
        Ok(()) => Ok(Moved {
            tokens: s.n_past,
            bytes: expected,
        }),
        Err(e) => {
            s.clear();
            Err(e)
        }
    }
}

/// Whether a file of `h` fits `s`: same model, layout and, for every ring that wrapped, the
/// same cells.
fn check(h: &Header, s: &Session, c: &Config, model: &ModelId) -> Result<(), KvFileError> {
    if h.model != *model {
        return Err(KvFileError::OtherModel);
    }
    if h.layout != ENGINE_LAYOUT {
        return Err(KvFileError::Layout(format!(
            "engine layout {}, this build's is {ENGINE_LAYOUT}",
            h.layout
        )));
    }
    let ours = (c.n_layer as u32, c.n_head_kv as u32, c.head_dim as u32);
    let theirs = (h.n_layer, h.n_head_kv, h.head_dim);
    if ours != theirs || h.dtype != DTYPE_F16 {
        return Err(KvFileError::Layout(format!(
            "n_layer, n_head_kv, head_dim {theirs:?} and dtype {}, this model's are {ours:?} and f16",
            h.dtype
        )));
    }
    let (n, written) = (h.n_tokens as usize, h.written as usize);
    if n > s.n_ctx {
        return Err(KvFileError::TooLong {
            tokens: n,
            n_ctx: s.n_ctx,
        });
    }
    if written < n || written > h.n_ctx as usize {
        return Err(KvFileError::HeaderChecksum);
    }
    for (il, (&rows, layer)) in h.rows.iter().zip(&s.kv.layers).enumerate() {
        let saved_cells = kv_cache::cells(c, il, h.n_ctx as usize);
        let wanted = intact(n, written, saved_cells).len();
        if rows as usize != wanted {
            return Err(KvFileError::Layout(format!(
                "layer {il} holds {rows} rows where this build's cache would hold {wanted}"
            )));
        }
        // A wrapped ring is restored cell for cell: only into a ring of the same size.
        if (rows as usize) < n && layer.cells != saved_cells {
            return Err(KvFileError::Layout(format!(
                "layer {il}'s ring has {} cells here, {saved_cells} in the file (another --ctx-size)",
                layer.cells
            )));
        }
    }
    Ok(())
}

fn read_body(
    r: &mut impl Read,
    h: &Header,
    s: &mut Session,
    c: &Config,
) -> Result<(), KvFileError> {
    let n = h.n_tokens as usize;
    let mut body = Sha256::new();
    let mut word = [0u8; 4];
    for _ in 0..n {
        r.read_exact(&mut word)?;
        body.update(word);
        let t = u32::from_le_bytes(word);
        if t as usize >= c.n_vocab {
            return Err(KvFileError::BadToken(t));
        }
        s.tokens.push(t);
    }
    let kv_dim = c.kv_dim();
    let mut row = vec![0u8; kv_dim * 2];
    let written = h.written as usize;
    for (layer, &rows) in s.kv.layers.iter_mut().zip(&h.rows) {
        let cells = layer.cells;
        for cache in [&mut layer.k, &mut layer.v] {
            for pos in n - rows as usize..n {
                r.read_exact(&mut row)?;
                body.update(&row);
                // In a ring smaller than the file's positions (a shorter context: only
                // unwrapped rings get here), the last `cells` land and the rest are skipped.
                if pos + cells < written.max(n) {
                    continue;
                }
                let cell = pos % cells;
                let values = &mut cache[cell * kv_dim..(cell + 1) * kv_dim];
                for (v, b) in values.iter_mut().zip(row.chunks_exact(2)) {
                    *v = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }
        }
    }
    let mut sum = [0u8; 32];
    r.read_exact(&mut sum)?;
    if body.finalize()[..] != sum[..] {
        return Err(KvFileError::BodyChecksum);
    }
    s.n_past = n;
    // Kept as saved even past this context: what it says a ring lost stays lost.
    s.written = written;
    s.kept = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LoadOptions, Model};

    fn model(name: &str) -> Model {
        Model::load(&test_support::synth(name), &LoadOptions::default()).unwrap()
    }

    fn tokens(n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| 4 + (i * 37) % 500).collect()
    }

    struct Fixture {
        m: Model,
        id: ModelId,
        dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        // Sliding window of 8: its rings wrap many times over 300 tokens.
        let m = model("synth-gemma3-q8_0.gguf");
        let id = model_identity(m.gguf());
        Fixture {
            m,
            id,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A session that read 300 tokens, then a draft of 3 it rejected (a ring lost positions).
    fn saved(f: &Fixture, n_ctx: usize) -> (Session, PathBuf) {
        let mut s = f.m.new_session(n_ctx);
        s.eval(&f.m, &tokens(300)).unwrap();
        s.eval(&f.m, &[5, 6, 7]).unwrap();
        s.forget_from(300);
        let path = f.dir.path().join("slot-0.kv");
        let moved = save(&s, f.m.config(), &f.id, &path).unwrap();
        assert_eq!(moved.tokens, 300);
        assert_eq!(moved.bytes, std::fs::metadata(&path).unwrap().len());
        assert_eq!(moved.bytes, file_bytes(&s, f.m.config()));
        (s, path)
    }

    #[test]
    fn a_restored_session_continues_exactly_as_the_saved_one() {
        let f = fixture();
        let (mut s, path) = saved(&f, 512);
        let next = [9u32, 10, 11];
        let mut restored = f.m.new_session(512);
        let moved = restore(&mut restored, f.m.config(), &f.id, &path).unwrap();
        assert_eq!(moved.tokens, 300);
        assert_eq!(restored.tokens(), s.tokens());
        let prompt = [&tokens(300)[..], &next[..]].concat();
        // Both resume at the same place (the rewind moved `written` past n_past in both).
        assert_eq!(restored.reusable(&f.m, &prompt), s.reusable(&f.m, &prompt));
        assert_eq!(restored.resume(&f.m, &prompt), 300);
        assert_eq!(s.resume(&f.m, &prompt), 300);
        let want = s.eval(&f.m, &next).unwrap().to_vec();
        assert!(restored.eval(&f.m, &next).unwrap() == &want[..]);
        // Into a longer context: global layers grow, the rings that wrapped are the same size.
        let mut longer = f.m.new_session(1024);
        restore(&mut longer, f.m.config(), &f.id, &path).unwrap();
        assert_eq!(longer.resume(&f.m, &prompt), 300);
        assert!(longer.eval(&f.m, &next).unwrap() == &want[..]);
    }

    #[test]
    fn files_that_do_not_fit_are_refused_and_leave_the_session_empty() {
        let f = fixture();
        let (_, path) = saved(&f, 512);
        let bytes = std::fs::read(&path).unwrap();
        let c = f.m.config();
        let mut s = f.m.new_session(512);
        let mut try_bytes = |b: &[u8]| {
            let p = f.dir.path().join("bad.kv");
            std::fs::write(&p, b).unwrap();
            s.eval(&f.m, &[1, 2]).unwrap();
            let e = restore(&mut s, c, &f.id, &p).unwrap_err();
            assert!(s.tokens().is_empty() || s.tokens() == [1, 2]);
            s.clear();
            e
        };
        // Truncated: in the body, in the header, at the magic.
        let e = try_bytes(&bytes[..bytes.len() - 1]);
        assert!(matches!(e, KvFileError::Size { .. }), "{e}");
        assert!(matches!(
            try_bytes(&bytes[..FIXED + 5]),
            KvFileError::Io(ref e) if e.kind() == io::ErrorKind::UnexpectedEof
        ));
        assert!(matches!(try_bytes(&bytes[..3]), KvFileError::NotASlotFile));
        assert!(matches!(try_bytes(b"hello"), KvFileError::NotASlotFile));
        // A bit flipped in the header's model id, in its token count, in the body.
        for at in [20, FIXED - 12] {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(matches!(try_bytes(&b), KvFileError::HeaderChecksum));
        }
        let mut b = bytes.clone();
        let last = b.len() - 40;
        b[last] ^= 1;
        assert!(matches!(try_bytes(&b), KvFileError::BodyChecksum));
        // Another version.
        let mut b = bytes.clone();
        b[8] = 2;
        assert!(matches!(try_bytes(&b), KvFileError::Version { found: 2 }));
        // Every refusal is the file's fault, to be deleted.
        assert!(try_bytes(&bytes[..bytes.len() - 1]).is_bad_file());
        // Another model's identity (a file with a valid header for it).
        let mut other = f.m.new_session(512);
        let other_id = [7u8; 32];
        other.eval(&f.m, &[1, 2, 3]).unwrap();
        let p = f.dir.path().join("other.kv");
        save(&other, c, &other_id, &p).unwrap();
        assert!(matches!(
            restore(&mut s, c, &f.id, &p),
            Err(KvFileError::OtherModel)
        ));
        // A context too short for the file's tokens.
        let mut short = f.m.new_session(200);
        let e = restore(&mut short, c, &f.id, &path).unwrap_err();
        assert!(
            matches!(
                e,
                KvFileError::TooLong {
                    tokens: 300,
                    n_ctx: 200
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn another_layout_is_refused() {
        let f = fixture();
        let (_, path) = saved(&f, 512);
        // Another model with another KV shape, the file's identity forged to match.
        let llama = model("synth-llama-q4_0.gguf");
        let id = f.id;
        let mut s = llama.new_session(512);
        let e = restore(&mut s, llama.config(), &id, &path).unwrap_err();
        assert!(matches!(e, KvFileError::Layout(_)), "{e}");
        // Rings are min(window + UBATCH - 1 + REWIND, n_ctx): one that wrapped is the same
        // size in any context that can hold its tokens, one that did not fits a smaller ring.
        let mut s = f.m.new_session(512);
        s.eval(&f.m, &tokens(150)).unwrap();
        let p = f.dir.path().join("ring.kv");
        save(&s, f.m.config(), &f.id, &p).unwrap();
        let mut cut = f.m.new_session(160);
        assert!(cut.kv.layers.iter().any(|l| l.cells == 160));
        // 150 tokens did not wrap a ring of 199 cells, so a ring of 160 takes them all.
        restore(&mut cut, f.m.config(), &f.id, &p).unwrap();
        assert_eq!(cut.n_past(), 150);
    }

    #[test]
    fn the_identity_tells_models_apart_and_is_stable() {
        let a = model("synth-gemma3-q8_0.gguf");
        let b = model("synth-llama-q4_0.gguf");
        assert_eq!(model_identity(a.gguf()), model_identity(a.gguf()));
        assert_ne!(model_identity(a.gguf()), model_identity(b.gguf()));
    }

    #[test]
    fn an_empty_session_round_trips() {
        let f = fixture();
        let s = f.m.new_session(64);
        let p = f.dir.path().join("empty.kv");
        save(&s, f.m.config(), &f.id, &p).unwrap();
        let mut r = f.m.new_session(64);
        r.eval(&f.m, &[1, 2, 3]).unwrap();
        assert_eq!(restore(&mut r, f.m.config(), &f.id, &p).unwrap().tokens, 0);
        assert_eq!(r.n_past(), 0);
        assert!(!temp_path(&p).exists());
    }
}

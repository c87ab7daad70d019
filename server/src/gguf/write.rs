//! Writing GGUF v3 files: the header (metadata, tensor table) and the tensor data, streamed row
//! by row so a file of any size is written in constant memory. The layout is the one
//! [`super::parse`] reads (the GGUF specification in ggml's repository): little-endian,
//! strings as u64 length + bytes, every tensor's data aligned to the file's alignment. The
//! round-trip tests hold the value type numbers here to the reader's.

use std::io::{self, Write};

use super::{Array, Value};
use crate::quant::GgmlType;

/// ggml's default, used when the metadata has no `general.alignment`.
const DEFAULT_ALIGNMENT: usize = 32;

/// One tensor to write: ggml dimension order (`dims[0]` is the row length).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<usize>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, ty: GgmlType, dims: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
        }
    }

    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product()
    }

    /// Bytes of one row, or `None` when the row is not whole blocks of the type.
    pub fn row_bytes(&self) -> Option<usize> {
        self.ty.row_bytes(self.dims[0])
    }

    pub fn bytes(&self) -> Option<usize> {
        self.row_bytes()?.checked_mul(self.n_rows())
    }
}

/// Writes a GGUF file: `metadata` in the given order, then `tensors`, whose rows `fill(tensor,
/// row, bytes)` writes into a buffer of the row's size. Returns the bytes written. A tensor whose
/// rows are not whole blocks of its type is refused before anything is written.
pub fn write(
    out: &mut impl Write,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut fill: impl FnMut(&TensorSpec, usize, &mut [u8]),
) -> io::Result<u64> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => v
            .as_i128()
            .and_then(|a| usize::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| invalid(format!("general.alignment {v} is not a power of two")))?,
    };
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        if t.dims.is_empty() || t.dims.len() > 4 {
            return Err(invalid(format!(
                "tensor `{}` needs 1 to 4 dimensions",
                t.name
            )));
        }
        let bytes = t.bytes().ok_or_else(|| {
            invalid(format!(
                "tensor `{}`: rows of {} values are not whole {} blocks of {}; pick a type \
                 whose block divides the row (a 32-value type for 1152-wide rows)",
                t.name,
                t.dims[0],
                t.ty.name(),
                t.ty.block_len()
            ))
        })?;
        sizes.push(bytes);
    }

    let mut w = Counting { out, n: 0 };
    w.write_all(b"GGUF")?;
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata {
        string(&mut w, key)?;
        w.write_all(&value_type(value).to_le_bytes())?;
        write_value(&mut w, value)?;
    }
    let mut offset = 0usize;
    for (t, &size) in tensors.iter().zip(&sizes) {
        string(&mut w, &t.name)?;
        w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
        for &d in &t.dims {
            w.write_all(&(d as u64).to_le_bytes())?;
        }
        w.write_all(&t.ty.id().to_le_bytes())?;
        w.write_all(&(offset as u64).to_le_bytes())?;
        offset = (offset + size).next_multiple_of(alignment);
    }
    pad(&mut w, alignment)?;
    let mut row = Vec::new();
    for t in tensors {
        let row_bytes = t.row_bytes().expect("checked above");
        row.resize(row_bytes, 0);
        for r in 0..t.n_rows() {
            row.fill(0);
            fill(t, r, &mut row);
            w.write_all(&row)?;
        }
        pad(&mut w, alignment)?;
    }
    w.flush()?;
    Ok(w.n)
}

/// A writer that counts, for the padding.
struct Counting<'a, W: Write> {
    out: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn pad(w: &mut Counting<'_, impl Write>, alignment: usize) -> io::Result<()> {
    let n = w.n.next_multiple_of(alignment as u64) - w.n;
    w.write_all(&vec![0u8; n as usize])
}

fn string(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// GGUF's value type numbers (`enum gguf_type`).
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_type(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&x.to_le_bytes()),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[u8::from(*x)]),
        Value::String(s) => string(w, s),
        Value::Array(a) => write_array(w, a),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

fn write_array(w: &mut impl Write, a: &Array) -> io::Result<()> {
    w.write_all(&array_type(a).to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    macro_rules! each {
        ($v:expr) => {{
            for x in $v {
                w.write_all(&x.to_le_bytes())?;
            }
            Ok(())
        }};
    }
    match a {
        Array::U8(v) => each!(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::Bool(v) => each!(v.iter().map(|b| u8::from(*b))),
        Array::String(v) => v.iter().try_for_each(|s| string(w, s)),
        Array::Array(v) => v.iter().try_for_each(|inner| write_array(w, inner)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Gguf;

    #[test]
    fn what_is_written_reads_back_key_for_key_and_byte_for_byte() {
        let metadata: Vec<(String, Value)> = vec![
            ("a.u8".into(), Value::U8(7)),
            ("a.i8".into(), Value::I8(-7)),
            ("a.u16".into(), Value::U16(700)),
            ("a.i16".into(), Value::I16(-700)),
            ("a.u32".into(), Value::U32(70_000)),
            ("a.i32".into(), Value::I32(-70_000)),
            ("a.u64".into(), Value::U64(1 << 40)),
            ("a.i64".into(), Value::I64(-(1 << 40))),
            ("a.f32".into(), Value::F32(0.5)),
            ("a.f64".into(), Value::F64(-0.25)),
            ("a.bool".into(), Value::Bool(true)),
            ("a.str".into(), Value::String("héllo".into())),
            (
                "a.strings".into(),
                Value::Array(Array::String(vec!["x".into(), "".into()])),
            ),
            (
                "a.bools".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            ("a.i32s".into(), Value::Array(Array::I32(vec![-1, 2]))),
            (
                "a.nested".into(),
                Value::Array(Array::Array(vec![
                    Array::F32(vec![1.0]),
                    Array::F32(vec![]),
                ])),
            ),
        ];
        let tensors = [
            TensorSpec::new("t.f32", GgmlType::F32, &[3, 2]),
            TensorSpec::new("t.q4_0", GgmlType::Q4_0, &[64, 3]),
            TensorSpec::new("t.q6_k", GgmlType::Q6_K, &[256]),
        ];
        let mut bytes = Vec::new();
        let n = write(&mut bytes, &metadata, &tensors, |t, r, row| {
            for (i, b) in row.iter_mut().enumerate() {
                *b = (t.name.len() + 3 * r + i) as u8;
            }
        })
        .unwrap();
        assert_eq!(n as usize, bytes.len());
        let g = Gguf::from_vec(bytes).unwrap();
        assert_eq!(g.version, 3);
        for (k, v) in &metadata {
            assert_eq!(g.metadata.get(k), Some(v), "{k}");
        }
        assert_eq!(g.metadata.len(), metadata.len());
        for t in &tensors {
            let info = g.tensor_info(&t.name).unwrap();
            assert_eq!(info.dims, t.dims);
            assert_eq!(info.ty.ggml(), Some(t.ty));
            assert_eq!(info.offset % 32, 0);
            let data = g.tensor_data(info);
            assert_eq!(data.len(), t.bytes().unwrap());
            let row = t.row_bytes().unwrap();
            for r in 0..t.n_rows() {
                assert_eq!(data[r * row + 1], (t.name.len() + 3 * r + 1) as u8);
            }
        }
    }

    #[test]
    fn a_row_that_is_not_whole_blocks_is_refused_before_writing() {
        let mut bytes = Vec::new();
        let e = write(
            &mut bytes,
            &[],
            &[TensorSpec::new(
                "blk.0.attn_q.weight",
                GgmlType::IQ4_XS,
                &[1152, 4],
            )],
            |_, _, _| {},
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("1152") && e.to_string().contains("iq4_xs"),
            "{e}"
        );
        assert!(bytes.is_empty());
    }
}

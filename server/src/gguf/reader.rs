//! The GGUF header parser. The input is hostile: every count is checked against the bytes left
//! before anything is allocated, nesting is capped, and every failure is an error, never a panic.

use super::value::{Array, Metadata, Value};
use super::{GgufError, TensorInfo, TensorType};

const MAGIC: &[u8; 4] = b"GGUF";
/// Arrays of arrays deeper than this are rejected so a crafted file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 4;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: usize = 4;
const DEFAULT_ALIGNMENT: usize = 32;

/// Everything before the tensor data.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    /// Absolute offset of the tensor data section.
    pub data_start: usize,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                GgufError::Truncated(format!(
                    "{what} needs {n} bytes at offset {} but the file has {} bytes",
                    self.pos,
                    self.bytes.len()
                ))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be backed by at least `min_elem_bytes` bytes per element.
    fn count(&mut self, what: &str, min_elem_bytes: usize) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(min_elem_bytes.max(1)))
            .is_some_and(|need| need <= self.remaining());
        if !fits {
            return Err(GgufError::Truncated(format!(
                "{what} is {n}, more than the {} bytes left in the file can hold",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.count(what, 1)?;
        let bytes = self.take(len, what)?;
        // Values are kept even when a converter wrote invalid UTF-8 (seen in some vocabularies).
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// Parses the header of a GGUF file held in `bytes` and checks every tensor against the data.
pub fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    // A file shorter than the magic is truncated if what it has is the start of "GGUF", and
    // not a GGUF file at all otherwise.
    if bytes.len() < MAGIC.len() && !MAGIC.starts_with(bytes) {
        return Err(GgufError::BadMagic(bytes.to_vec()));
    }
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.array::<4>("the magic \"GGUF\"")?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic(magic.to_vec()));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::BadVersion(version));
    }
    // Each tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // each key/value at least 8 (key length) + 4 (type) + 1.
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 13)?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("type of `{key}`"))?;
        let value = read_value(&mut c, ty, &key, 0)?;
        metadata.insert(key, value)?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => {
            let a = metadata.usize("general.alignment")?;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::Malformed(format!(
                    "general.alignment is {a}; it must be a power of two"
                )));
            }
            a
        }
    };

    let mut infos = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        infos.push(read_tensor_info(&mut c, i)?);
    }
    let data_start = c.pos.div_ceil(alignment).saturating_mul(alignment);
    if data_start > bytes.len() && n_tensors > 0 {
        return Err(GgufError::Truncated(format!(
            "the tensor data would start at offset {data_start} but the file has {} bytes",
            bytes.len()
        )));
    }

    let mut tensors = Vec::with_capacity(infos.len());
    let mut names = std::collections::HashSet::new();
    for raw in infos {
        if !names.insert(raw.name.clone()) {
            return Err(GgufError::Malformed(format!(
                "tensor `{}` appears twice",
                raw.name
            )));
        }
        tensors.push(check_tensor(raw, alignment, data_start, bytes.len())?);
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
    Ok(match ty {
        0 => Value::U8(c.u8(key)?),
        1 => Value::I8(c.u8(key)? as i8),
        2 => Value::U16(c.u16(key)?),
        3 => Value::I16(c.u16(key)? as i16),
        4 => Value::U32(c.u32(key)?),
        5 => Value::I32(c.u32(key)? as i32),
        6 => Value::F32(f32::from_bits(c.u32(key)?)),
        7 => Value::Bool(read_bool(c, key)?),
        8 => Value::String(c.string(key)?),
        9 => Value::Array(read_array(c, key, depth)?),
        10 => Value::U64(c.u64(key)?),
        11 => Value::I64(c.u64(key)? as i64),
        12 => Value::F64(f64::from_bits(c.u64(key)?)),
        other => {
            return Err(GgufError::Malformed(format!(
                "metadata `{key}` has unknown value type {other} (GGUF defines 0..=12)"
            )))
        }
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool, GgufError> {
    match c.u8(key)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(GgufError::Malformed(format!(
            "metadata `{key}`: bool byte is {b}, not 0 or 1"
        ))),
    }
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array, GgufError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::Malformed(format!(
            "metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
        )));
    }
    let ty = c.u32(key)?;
    let min_bytes = match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        other => {
            return Err(GgufError::Malformed(format!(
                "metadata `{key}`: array of unknown value type {other}"
            )))
        }
    };
    let n = c.count(&format!("length of array `{key}`"), min_bytes)?;
    macro_rules! collect {
        ($variant:ident, $read:expr) => {{
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push($read);
            }
            Array::$variant(v)
        }};
    }
    Ok(match ty {
        0 => collect!(U8, c.u8(key)?),
        1 => collect!(I8, c.u8(key)? as i8),
        2 => collect!(U16, c.u16(key)?),
        3 => collect!(I16, c.u16(key)? as i16),
        4 => collect!(U32, c.u32(key)?),
        5 => collect!(I32, c.u32(key)? as i32),
        6 => collect!(F32, f32::from_bits(c.u32(key)?)),
        7 => collect!(Bool, read_bool(c, key)?),
        8 => collect!(String, c.string(key)?),
        9 => collect!(Array, read_array(c, key, depth + 1)?),
        10 => collect!(U64, c.u64(key)?),
        11 => collect!(I64, c.u64(key)? as i64),
        _ => collect!(F64, f64::from_bits(c.u64(key)?)),
    })
}

/// A tensor info as read, before it is checked against the data section.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

fn read_tensor_info(c: &mut Cursor, i: usize) -> Result<RawTensorInfo, GgufError> {
    let name = c.string(&format!("name of tensor #{i}"))?;
    let n_dims = c.u32(&format!("dimension count of `{name}`"))? as usize;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::Shape {
            tensor: name,
            why: format!("it has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims);
    for d in 0..n_dims {
        dims.push(c.u64(&format!("dimension {d} of `{name}`"))?);
    }
    let type_id = c.u32(&format!("type of `{name}`"))?;
    let offset = c.u64(&format!("offset of `{name}`"))?;
    Ok(RawTensorInfo {
        name,
        dims,
        type_id,
        offset,
    })
}

fn check_tensor(
    raw: RawTensorInfo,
    alignment: usize,
    data_start: usize,
    file_len: usize,
) -> Result<TensorInfo, GgufError> {
    let name = raw.name;
    // An id ggml does not have: without its block size the tensor cannot even be located.
    let ty = TensorType::from_id(raw.type_id).ok_or_else(|| GgufError::UnsupportedType {
        tensor: name.clone(),
        id: raw.type_id,
        name: TensorType::name_of_id(raw.type_id),
    })?;
    let shape_err = |why: String| GgufError::Shape {
        tensor: name.clone(),
        why,
    };
    let mut dims = Vec::with_capacity(raw.dims.len());
    let mut count: usize = 1;
    for (i, &d) in raw.dims.iter().enumerate() {
        let d = usize::try_from(d).ok().filter(|&d| d > 0).ok_or_else(|| {
            shape_err(format!(
                "dimension {i} is {d}; every dimension must be at least 1 (shape {:?})",
                raw.dims
            ))
        })?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| shape_err(format!("element count overflows (shape {:?})", raw.dims)))?;
        dims.push(d);
    }
    if dims[0] % ty.block_len() != 0 {
        return Err(shape_err(format!(
            "rows of {} values are not a whole number of {ty} blocks of {}",
            dims[0],
            ty.block_len()
        )));
    }
    let size = ty
        .row_bytes(dims[0])
        .and_then(|row_bytes| row_bytes.checked_mul(count / dims[0]))
        .ok_or_else(|| shape_err(format!("byte size overflows (shape {:?})", raw.dims)))?;
    let rel = usize::try_from(raw.offset).unwrap_or(usize::MAX);
    if rel % alignment != 0 {
        return Err(GgufError::OutOfBounds(format!(
            "tensor `{name}`: offset {rel} is not a multiple of the alignment {alignment}"
        )));
    }
    let offset = data_start.checked_add(rel);
    let end = offset.and_then(|o| o.checked_add(size));
    match (offset, end) {
        (Some(offset), Some(end)) if end <= file_len => Ok(TensorInfo {
            name,
            ty,
            dims,
            offset,
            size,
        }),
        _ => Err(GgufError::OutOfBounds(format!(
            "tensor `{name}` ({size} bytes at data offset {rel}) ends past the end of the file \
             ({file_len} bytes, data from {data_start})"
        ))),
    }
}

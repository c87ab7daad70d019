//! GGUF metadata values and the typed accessors model code reads them with.

use std::collections::BTreeMap;
use std::fmt;

use super::GgufError;

/// One metadata value, typed as the file stores it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array. Arrays are homogeneous in GGUF, so they are stored as typed vectors: a
/// 262,144-entry vocabulary is one `Vec<String>`, not a vector of enums.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }
}

impl Value {
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "u8".into(),
            Value::I8(_) => "i8".into(),
            Value::U16(_) => "u16".into(),
            Value::I16(_) => "i16".into(),
            Value::U32(_) => "u32".into(),
            Value::I32(_) => "i32".into(),
            Value::U64(_) => "u64".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("array of {}", a.type_name()),
        }
    }

    /// The value as an integer, whatever integer type the writer chose.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl fmt::Display for Value {
    /// Short rendering for `inspect`: long arrays are summarised, not dumped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) if s.chars().count() > 80 => {
                let head: String = s.chars().take(77).collect();
                write!(f, "{head:?}… ({} bytes)", s.len())
            }
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => match a {
                Array::String(v) if v.len() <= 8 => write!(f, "{v:?}"),
                Array::U32(v) if v.len() <= 8 => write!(f, "{v:?}"),
                Array::I32(v) if v.len() <= 8 => write!(f, "{v:?}"),
                Array::F32(v) if v.len() <= 8 => write!(f, "{v:?}"),
                _ => write!(f, "[{} × {}]", a.len(), a.type_name()),
            },
        }
    }
}

/// All key/value pairs of a file, with accessors that name the key and the fix in their errors.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    map: BTreeMap<String, Value>,
}

impl Metadata {
    pub(super) fn insert(&mut self, key: String, value: Value) -> Result<(), GgufError> {
        if self.map.contains_key(&key) {
            return Err(GgufError::Malformed(format!(
                "metadata key `{key}` appears twice"
            )));
        }
        self.map.insert(key, value);
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong_type(key: &str, want: &str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            want: want.to_string(),
            got: v.type_name(),
        }
    }

    /// An unsigned integer key (any integer type that holds a value in range).
    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::wrong_type(key, "unsigned integer", v))
    }

    pub fn usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.u64(key)?;
        usize::try_from(v).map_err(|_| GgufError::Malformed(format!("`{key}` = {v} is too large")))
    }

    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::wrong_type(key, "u32", v))
    }

    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            v => Err(Self::wrong_type(key, "f32", v)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            v => Err(Self::wrong_type(key, "bool", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(Self::wrong_type(key, "string", v)),
        }
    }

    pub fn strings(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            v => Err(Self::wrong_type(key, "array of string", v)),
        }
    }

    pub fn f32s(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            v => Err(Self::wrong_type(key, "array of f32", v)),
        }
    }

    pub fn i32s(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            v => Err(Self::wrong_type(key, "array of i32", v)),
        }
    }

    /// `Ok(None)` when the key is absent; an error only when it is present with the wrong type.
    pub fn opt<T>(
        &self,
        key: &str,
        get: impl FnOnce(&Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.get(key).is_some() {
            get(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

//! GGUF v2/v3 files, memory-mapped. Tensors are typed views into the map: weights are never
//! copied to the heap, so they stay reclaimable, shared page cache.

mod reader;
pub mod synth;
mod types;
mod value;
pub mod write;

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::quant::GgmlType;
pub use reader::{parse, Header};
pub use types::TensorType;
pub use value::{Array, Metadata, Value};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file: it starts with {0:02x?} instead of \"GGUF\" (47 47 55 46); check the path points at a .gguf model")]
    BadMagic(Vec<u8>),
    #[error("GGUF version {0} is not supported (versions 2 and 3 are); re-convert the model with a current llama.cpp")]
    BadVersion(u32),
    #[error("truncated GGUF file: {0}; the download or copy is probably incomplete: fetch the file again")]
    Truncated(String),
    #[error("malformed GGUF file: {0}; {CORRUPT_FIX}")]
    Malformed(String),
    #[error("tensor out of bounds: {0}; the file is corrupt or truncated: fetch it again, or re-convert it if it was written by a non-conforming tool")]
    OutOfBounds(String),
    #[error("tensor `{tensor}` has type {} (ggml id {id}), which is not supported; supported types: {}; re-quantize the model to one of them (e.g. llama-quantize ... Q4_K_M)", name.unwrap_or("unknown"), supported_types())]
    UnsupportedType {
        tensor: String,
        id: u32,
        name: Option<&'static str>,
    },
    #[error("tensor `{tensor}` has a bad shape: {why}; {CORRUPT_FIX}")]
    Shape { tensor: String, why: String },
    #[error("metadata key `{0}` is missing; the file was not written by a converter this engine understands")]
    MissingKey(String),
    #[error("metadata key `{key}` should be {want} but is {got}")]
    WrongType {
        key: String,
        want: String,
        got: String,
    },
    #[error("tensor `{0}` is missing from the model file")]
    MissingTensor(String),
    #[error("mlock of the model's {mib} MiB failed: {source}; raise the memlock limit (ulimit -l, LimitMEMLOCK=) or drop --mlock")]
    Lock {
        mib: usize,
        source: nix::errno::Errno,
    },
}

/// The fix for structural damage the reader cannot attribute to truncation.
const CORRUPT_FIX: &str = "the file is corrupt or was written by a non-conforming tool: fetch it again or re-convert it with a current llama.cpp";

fn supported_types() -> String {
    GgmlType::SUPPORTED.map(GgmlType::name).join(", ")
}

/// Where a tensor lives in the file and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Any ggml type: the reader lists tensors the kernels cannot read; [`Gguf::tensor`] refuses them.
    pub ty: TensorType,
    /// ggml order: `dims[0]` is the row length (the contiguous dimension).
    pub dims: Vec<usize>,
    /// Absolute byte offset in the file.
    pub offset: usize,
    pub size: usize,
}

impl TensorInfo {
    pub fn row_len(&self) -> usize {
        self.dims[0]
    }

    /// Number of rows: the product of every dimension but the first.
    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product()
    }
}

/// A tensor of a type the kernels read: its description and its bytes inside the map.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
    ty: GgmlType,
}

impl<'a> Tensor<'a> {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.info.n_rows()
    }

    pub fn row(&self, i: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.data[i * n..(i + 1) * n]
    }
}

enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

/// An opened GGUF file.
pub struct Gguf {
    bytes: Bytes,
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
}

impl Gguf {
    /// Maps `path` and parses its header. The data is not read here; see [`Gguf::advise_willneed`].
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. If another process truncates the file while we run,
        // reads fault (SIGBUS); that is the accepted contract of every mmap-based engine.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        // Before the first fault (the header's): read-ahead into a mapping so marked fills the
        // page cache with 2 MiB folios, which the kernel then maps with one PMD entry each
        // (`FilePmdMapped` in smaps; file systems with large folios, e.g. ext4 from Linux 6.16).
        // Decode streams every weight once per token, and over 4 KiB pages it pays a TLB miss
        // every 4 KiB. Failing to advise (older kernels, THP off) only costs that speed.
        let _ = map.advise(memmap2::Advice::HugePage);
        Self::from_bytes_inner(Bytes::Map(map))
    }

    /// Parses a file already in memory (tests and fuzzing).
    pub fn from_vec(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Self::from_bytes_inner(Bytes::Owned(bytes))
    }

    fn from_bytes_inner(bytes: Bytes) -> Result<Gguf, GgufError> {
        let slice = match &bytes {
            Bytes::Map(m) => &m[..],
            Bytes::Owned(v) => &v[..],
        };
        let h = parse(slice)?;
        Ok(Gguf {
            bytes,
            version: h.version,
            metadata: h.metadata,
            tensors: h.tensors,
            alignment: h.alignment,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a listed tensor, whatever its type.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.bytes()[info.offset..info.offset + info.size]
    }

    /// The typed view of tensor `name`, for inference: refused when the kernels do not read its
    /// type (the file still opens, so `inspect` and `tokenize` work on it).
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let ty = info.ty.ggml().ok_or_else(|| GgufError::UnsupportedType {
            tensor: name.to_string(),
            id: info.ty.id(),
            name: Some(info.ty.name()),
        })?;
        Ok(Tensor {
            info,
            data: self.tensor_data(info),
            ty,
        })
    }

    /// Asks the kernel to start reading the whole map in (`madvise(MADV_WILLNEED)`).
    pub fn advise_willneed(&self) -> std::io::Result<()> {
        match &self.bytes {
            Bytes::Map(m) => m.advise(memmap2::Advice::WillNeed),
            Bytes::Owned(_) => Ok(()),
        }
    }

    /// Locks the map into RAM (`mlock`), so the weights are never evicted. Needs
    /// `RLIMIT_MEMLOCK` (or `LimitMEMLOCK=` in the unit) at least the file's size.
    pub fn lock(&self) -> Result<(), GgufError> {
        let Bytes::Map(m) = &self.bytes else {
            return Ok(());
        };
        // An empty map has nothing to lock.
        let Some(ptr) = std::ptr::NonNull::new(m.as_ptr() as *mut std::ffi::c_void) else {
            return Ok(());
        };
        // SAFETY: the range is exactly our live mapping.
        unsafe { nix::sys::mman::mlock(ptr, m.len()) }.map_err(|source| GgufError::Lock {
            mib: m.len() >> 20,
            source,
        })
    }
}

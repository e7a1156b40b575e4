//! GGUF reader (and a writer for tests and tools): the container of llama.cpp
//! / ggml model files, versions 2 and 3 (the GGUF specification published
//! by the ggml project).
//!
//! # Layout (all little-endian)
//! 1. header: magic `GGUF` (the bytes `47 47 55 46`), `u32 version` (2 or 3),
//!    `u64 tensor_count`, `u64 metadata_kv_count`;
//! 2. `metadata_kv_count` key/value pairs: the key is a string, then
//!    `u32 value_type` ([`ValueType`]) and the value. A string is `u64 len` and
//!    `len` bytes of UTF-8 (no NUL); a bool is one byte, 0 or 1; an array is
//!    `u32 element_type`, `u64 count` and `count` values (arrays may nest);
//! 3. `tensor_count` tensor infos: name (string), `u32 n_dims` (1..=4),
//!    `n_dims` × `u64` dimensions, `ne[0]` first (the innermost, contiguous
//!    one: the length of a row), `u32 ggml_type`, `u64 offset` relative to the
//!    data section;
//! 4. padding to the alignment: `general.alignment` (a `u32` power of two),
//!    32 when the key is absent;
//! 5. the data section: each tensor's bytes at its offset, a multiple of the
//!    alignment.
//!
//! # What this module owns, and its invariants
//! - [`Gguf`] maps the file read-only (memmap2: no copy of the tensor data)
//!   and parses the header, every metadata value and the tensor table in
//!   [`Gguf::open`]. Once it returns `Ok`: keys and tensor names are unique;
//!   every tensor's type is one the CPU reference computes ([`GgmlType`]: F32,
//!   F16, Q4_0, Q4_1, Q8_0; any other is [`GgufError::UnsupportedType`] naming
//!   the type and the tensor); its row length is a whole number of the type's
//!   blocks; its offset is aligned; and its bytes (the length its type and
//!   shape imply) lie inside the file. [`Gguf::tensor_data`] can then never
//!   read out of bounds.
//! - Every count read from the file (tensors, keys, array elements, string
//!   lengths) is checked against the bytes left in the file before anything
//!   is allocated for it: a `2^60`-element array in a 1 KiB file is
//!   [`GgufError::AbsurdCount`], not an allocation failure. Arrays nest at
//!   most [`MAX_NESTING`] deep (no stack overflow from a crafted file).
//! - Every failure is a typed [`GgufError`] naming the header field, key or
//!   tensor at fault, with offsets in bytes from the start of the file.
//! - Typed metadata access ([`Gguf::u32`], [`Gguf::f32`], [`Gguf::str`],
//!   [`Gguf::str_array`], ...) answers [`GgufError::MissingKey`] or
//!   [`GgufError::KeyType`] naming the key.
//!
//! What the keys mean for a model (`llama.*`, `tokenizer.*`) and whether the
//! tensors' shapes agree with it belongs to `config`, `llama` and `bpe`.
//!
//! # Safety
//! [`Gguf::open`] maps the file with `memmap2::Mmap::map`, unsafe because
//! another process could change the file under the map. The file is opened
//! read-only and the contract (as llama.cpp's mmap loading) is that a model
//! file is not modified while xtc runs; every read of the map goes through
//! bounds-checked slices whose bounds the parse proved.
//!
//! [`GgufWriter`] writes the same format (used by the tests to build small and
//! deliberately corrupted files, and by tools); it can write values the reader
//! refuses (raw type ids, chosen offsets) on purpose.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// Deepest nesting of arrays in a metadata value that [`Gguf`] accepts
/// (an array of arrays is depth 2).
pub const MAX_NESTING: usize = 8;

/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Alignment of the data section and of tensor offsets when
/// `general.alignment` is absent (bytes).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The four magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Why a GGUF file could not be read. Offsets are bytes from the start of
/// the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {msg}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        msg: String,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected {MAGIC:02x?} (\"GGUF\")")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {version} (this reader takes versions 2 and 3)")]
    BadVersion {
        /// The version field.
        version: u32,
    },
    /// The file ends inside the named field.
    #[error(
        "GGUF file truncated in {what}: needs {needed} bytes at offset {offset}, file has {len}"
    )]
    Truncated {
        /// Header field, key, or tensor (and which part of it).
        what: String,
        /// Where the field starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// File length.
        len: u64,
    },
    /// A count that cannot fit in the bytes left in the file.
    #[error(
        "GGUF {what}: count {count} is impossible, at most {limit} fit in the rest of the file"
    )]
    AbsurdCount {
        /// `tensor_count`, `metadata_kv_count`, or the key whose array or string it is.
        what: String,
        /// The count read.
        count: u64,
        /// The most that the remaining bytes could hold.
        limit: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("GGUF key `{key}`: unknown value type {ty}")]
    BadValueType {
        /// The key whose value (or array element) has it.
        key: String,
        /// The type id read.
        ty: u32,
    },
    /// A value that its type does not allow (a bool other than 0 or 1, a
    /// string that is not UTF-8).
    #[error("GGUF {what}: {why}")]
    BadValue {
        /// Key or tensor name (or "key" when the key itself is bad).
        what: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Arrays nested deeper than [`MAX_NESTING`].
    #[error("GGUF key `{key}`: arrays nested more than {MAX_NESTING} deep")]
    NestingTooDeep {
        /// The key.
        key: String,
    },
    /// A key that appears twice.
    #[error("GGUF key `{key}` appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A tensor name that appears twice.
    #[error("GGUF tensor `{tensor}` appears twice")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("GGUF key `general.alignment` = {value}: must be a power of two")]
    BadAlignment {
        /// The value read.
        value: u64,
    },
    /// A tensor shape the format does not allow: no dimensions or more than
    /// [`MAX_DIMS`], a zero dimension, an element count beyond `i64`, or a
    /// row that is not a whole number of blocks.
    #[error("GGUF tensor `{tensor}`: bad shape {dims:?}: {why}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its dimensions as read (`ne[0]` first).
        dims: Vec<u64>,
        /// What is wrong.
        why: &'static str,
    },
    /// A tensor type other than F32, F16, Q4_0, Q4_1, Q8_0.
    #[error("GGUF tensor `{tensor}` has type {} (id {ty}), which xtc cannot compute (supported: F32, F16, Q4_0, Q4_1, Q8_0)", ggml_type_name(*ty).unwrap_or("unknown"))]
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// The ggml type id.
        ty: u32,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error(
        "GGUF tensor `{tensor}`: offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes start at or past the end of the file.
    #[error(
        "GGUF tensor `{tensor}`: offset {offset} is past the end of the data section ({data_len} bytes)"
    )]
    OffsetPastEnd {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// A tensor whose bytes start inside the file but run past its end.
    #[error(
        "GGUF tensor `{tensor}` truncated: {size} bytes at data offset {offset}, the data section has {data_len}"
    )]
    TruncatedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// Its byte length.
        size: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// A key the caller needs is absent.
    #[error("GGUF key `{key}` is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A key whose value has another type than the caller needs.
    #[error("GGUF key `{key}` has a {found} value, expected {expected}")]
    KeyType {
        /// The key.
        key: String,
        /// What the caller needs.
        expected: &'static str,
        /// What the file has.
        found: &'static str,
    },
    /// A tensor the caller needs is absent.
    #[error("GGUF tensor `{tensor}` is missing")]
    MissingTensor {
        /// The tensor.
        tensor: String,
    },
}

/// The name llama.cpp gives ggml type id `ty` (`"Q4_K"` for 12), or `None`
/// for an id it does not define.
pub fn ggml_type_name(ty: u32) -> Option<&'static str> {
    const NAMES: [&str; 36] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "Q4_0_4_4",
        "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
    ];
    NAMES.get(ty as usize).copied()
}

/// The tensor types xtc computes, with their ggml ids and block formats.
///
/// A block holds [`GgmlType::block_elems`] consecutive elements of a row in
/// [`GgmlType::block_bytes`] bytes (layouts in `quant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32, id 0.
    F32,
    /// IEEE binary16, id 1.
    F16,
    /// 32 elements: f16 scale `d`, 16 bytes of 4-bit `q`; `x = d * (q - 8)`. Id 2.
    Q4_0,
    /// 32 elements: f16 scale `d`, f16 min `m`, 16 bytes of 4-bit `q`;
    /// `x = d * q + m`. Id 3.
    Q4_1,
    /// 32 elements: f16 scale `d`, 32 × i8 `q`; `x = d * q`. Id 8.
    Q8_0,
}

impl GgmlType {
    /// The type of ggml id `id`, or `None` for any other.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            _ => return None,
        })
    }
    /// The ggml id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
        }
    }
    /// Elements per block (1 for F32 and F16, 32 for the quantized types).
    pub fn block_elems(self) -> u64 {
        match self {
            GgmlType::F32 | GgmlType::F16 => 1,
            _ => 32,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
        }
    }
    /// ggml's name (`"Q4_1"`).
    pub fn name(self) -> &'static str {
        ggml_type_name(self.id()).unwrap_or("?")
    }
    /// Bytes of `n` elements (a whole number of blocks), or `None` when `n`
    /// is not one or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value type id (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// One byte, 0 or 1.
    Bool = 7,
    /// `u64` length + UTF-8 bytes.
    String = 8,
    /// Element type, `u64` count, elements.
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl ValueType {
    /// The type of id `id` (0..=12), or `None`.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies in a file (a string
    /// or array needs at least its length / header).
    fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// Lower-case name for messages.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// An array: its element type and elements (all of that type).
    Array(ValueType, Vec<Value>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an integer of any width or signedness.
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

    /// A short description for messages: the value, or `array of N <type>`.
    pub fn describe(&self) -> String {
        match self {
            Value::String(s) => format!("{s:?}"),
            Value::Array(t, v) => format!("array of {} {}", v.len(), t.name()),
            Value::F32(v) => v.to_string(),
            Value::F64(v) => v.to_string(),
            Value::Bool(v) => v.to_string(),
            other => other.as_i128().map(|v| v.to_string()).unwrap_or_default(),
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, `ne[0]` (the row length) first; 1..=4 of them, each > 0.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Byte offset in the data section (a multiple of the alignment).
    pub offset: u64,
    /// Byte length (whole blocks of `ty`).
    pub size: u64,
}

impl TensorInfo {
    /// Elements in the tensor (the product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

enum Backing {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: metadata, tensor table and the mapped bytes.
///
/// See the module documentation for the invariants that hold once it exists.
pub struct Gguf {
    backing: Backing,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("len", &self.backing.bytes().len())
            .field("keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl Gguf {
    /// Maps the file at `path` read-only and parses it.
    ///
    /// The file must not be modified while the returned value (or anything
    /// borrowing its tensor data) lives: the bytes are read in place.
    ///
    /// # Errors
    /// [`GgufError::Io`] when it cannot be opened or mapped, else as
    /// [`Gguf::from_bytes`].
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; the file
        // was opened read-only. Its bytes may still change if another process
        // writes the file while it is mapped (the documented contract: model
        // files are not modified while xtc runs, as with llama.cpp's mmap
        // loading); every read goes through bounds-checked slices of the map.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Map(map))
    }

    /// Parses a GGUF file held in memory (tests, tools).
    ///
    /// # Errors
    /// Any [`GgufError`] but `Io`: bad magic or version, truncation, absurd
    /// counts, bad value types or values, duplicate keys or tensors, a bad
    /// alignment, bad shapes, unsupported tensor types, misaligned offsets,
    /// tensor data past the end of the file.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Gguf, GgufError> {
        let bytes = backing.bytes();
        let mut r = Reader { bytes, pos: 0 };
        let magic: [u8; 4] = r.take(4, &|| "magic".into())?.try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(GgufError::BadVersion { version });
        }
        let n_tensors = r.u64(&|| "tensor_count".into())?;
        let n_kv = r.u64(&|| "metadata_kv_count".into())?;
        // A key/value pair needs at least 8 (key length) + 4 (type) + 1 bytes;
        // a tensor info 8 (name length) + 4 + 8 (one dim) + 4 + 8.
        r.bound(n_kv, 13, "metadata_kv_count")?;
        r.bound(n_tensors, 32, "tensor_count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut key_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = r.string(&|| format!("key of metadata pair {i}"), "key")?;
            let ty = r.u32(&|| format!("value type of key `{key}`"))?;
            let value = r.value(ty, &key, 0)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }
        let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(Value::U32(a)) => return Err(GgufError::BadAlignment { value: (*a).into() }),
            Some(v) => {
                return Err(GgufError::KeyType {
                    key: "general.alignment".into(),
                    expected: "u32",
                    found: v.value_type().name(),
                });
            }
        };

        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&|| format!("name of tensor {i}"), "tensor name")?;
            let ctx = |part: &str| format!("{part} of tensor `{name}`");
            let n_dims = r.u32(&|| ctx("n_dims"))?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(GgufError::BadShape {
                    tensor: name,
                    dims: vec![],
                    why: "the number of dimensions must be 1 to 4",
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&|| ctx("dimensions"))?);
            }
            let ty = r.u32(&|| ctx("type"))?;
            let offset = r.u64(&|| ctx("offset"))?;
            raw.push((name, dims, ty, offset));
        }
        let data_offset = r.pos.next_multiple_of(alignment as usize) as u64;
        let len = bytes.len() as u64;
        if !raw.is_empty() && data_offset > len {
            return Err(GgufError::Truncated {
                what: "padding before the data section".into(),
                offset: r.pos as u64,
                needed: data_offset - r.pos as u64,
                len,
            });
        }
        let data_len = len.saturating_sub(data_offset);

        let mut tensors = Vec::with_capacity(raw.len());
        let mut tensor_index = HashMap::with_capacity(raw.len());
        for (name, dims, ty_id, offset) in raw {
            let info = check_tensor(name, dims, ty_id, offset, alignment, data_len)?;
            if tensor_index.contains_key(&info.name) {
                return Err(GgufError::DuplicateTensor { tensor: info.name });
            }
            tensor_index.insert(info.name.clone(), tensors.len());
            tensors.push(info);
        }
        Ok(Gguf {
            backing,
            version,
            metadata,
            key_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data section's alignment in bytes (a power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Length of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// Every metadata pair, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`].
    pub fn value(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::KeyType {
            key: key.into(),
            expected,
            found: v.value_type().name(),
        }
    }

    /// `key` as a `u32`: any integer type whose value fits.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`]; [`GgufError::KeyType`] for a non-integer or
    /// a value outside `u32`.
    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.value(key)?;
        v.as_i128()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "an integer in 0..=4294967295", v))
    }

    /// `key` as an `f32` (an f32 or f64 value).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::KeyType`].
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.value(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// `key` as a bool.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::KeyType`].
    pub fn bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.value(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// `key` as a string.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::KeyType`].
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    /// `key` as an array of strings.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::KeyType`] (also for an array of
    /// another element type).
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        match self.value(key)? {
            Value::Array(ValueType::String, items) => Ok(items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.as_str(),
                    _ => unreachable!("elements have the array's type"),
                })
                .collect()),
            v => Err(Self::wrong(key, "array of string", v)),
        }
    }

    /// `key` as an array of integers (any integer element type), widened to `i64`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::KeyType`] (also for elements
    /// outside `i64`).
    pub fn int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.value(key)?;
        match v {
            Value::Array(_, items) => items
                .iter()
                .map(|x| x.as_i128().and_then(|i| i64::try_from(i).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Self::wrong(key, "array of integers", v)),
            _ => Err(Self::wrong(key, "array of integers", v)),
        }
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn find_tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor called `name`.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`].
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.find_tensor(name)
            .ok_or_else(|| GgufError::MissingTensor {
                tensor: name.into(),
            })
    }

    /// The bytes of `info` (`info.size` of them), which must come from this
    /// file's [`tensors`](Gguf::tensors).
    ///
    /// # Panics
    /// If `info` lies outside this file (a `TensorInfo` of another file).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.backing.bytes()[start..start + info.size as usize]
    }
}

/// Checks one tensor-table entry against the format and the file
/// (see [`Gguf::from_bytes`]'s errors).
fn check_tensor(
    name: String,
    dims: Vec<u64>,
    ty_id: u32,
    offset: u64,
    alignment: u64,
    data_len: u64,
) -> Result<TensorInfo, GgufError> {
    let bad = |dims: &Vec<u64>, why| GgufError::BadShape {
        tensor: name.clone(),
        dims: dims.clone(),
        why,
    };
    if dims.contains(&0) {
        return Err(bad(&dims, "a dimension is 0"));
    }
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).filter(|&p| p <= i64::MAX as u64)
        })
        .ok_or_else(|| bad(&dims, "the element count overflows i64"))?;
    let Some(ty) = GgmlType::from_id(ty_id) else {
        return Err(GgufError::UnsupportedType {
            tensor: name,
            ty: ty_id,
        });
    };
    if !dims[0].is_multiple_of(ty.block_elems()) {
        return Err(bad(
            &dims,
            "the row length is not a multiple of the type's block",
        ));
    }
    let size = ty
        .bytes_for(n)
        .ok_or_else(|| bad(&dims, "the byte size overflows"))?;
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            tensor: name,
            offset,
            alignment,
        });
    }
    if offset >= data_len {
        return Err(GgufError::OffsetPastEnd {
            tensor: name,
            offset,
            data_len,
        });
    }
    if size > data_len - offset {
        return Err(GgufError::TruncatedTensor {
            tensor: name,
            offset,
            size,
            data_len,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        size,
    })
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses `count` items of at least `min` bytes each when the rest of
    /// the file cannot hold them (before anything is allocated).
    fn bound(&self, count: u64, min: u64, what: &str) -> Result<(), GgufError> {
        let limit = self.remaining() / min;
        if count > limit {
            return Err(GgufError::AbsurdCount {
                what: what.into(),
                count,
                limit,
            });
        }
        Ok(())
    }

    /// A string: `u64` length then UTF-8 bytes. `owner` names the key or
    /// tensor for the UTF-8 error.
    fn string(&mut self, what: &dyn Fn() -> String, owner: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        // `take` checks `n` against the bytes left before anything is copied.
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| GgufError::BadValue {
            what: format!("{owner} {}", what()),
            why: "not UTF-8",
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        let vt = ValueType::from_id(ty).ok_or_else(|| GgufError::BadValueType {
            key: key.into(),
            ty,
        })?;
        let what = || format!("value of key `{key}`");
        Ok(match vt {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                _ => {
                    return Err(GgufError::BadValue {
                        what: format!("key `{key}`"),
                        why: "a bool must be 0 or 1",
                    });
                }
            },
            ValueType::String => Value::String(self.string(&what, &format!("key `{key}`"))?),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::NestingTooDeep { key: key.into() });
                }
                let et = self.u32(&|| format!("element type of key `{key}`"))?;
                let elem = ValueType::from_id(et).ok_or_else(|| GgufError::BadValueType {
                    key: key.into(),
                    ty: et,
                })?;
                let n = self.u64(&|| format!("element count of key `{key}`"))?;
                self.bound(
                    n,
                    elem.min_bytes(),
                    &format!("element count of key `{key}`"),
                )?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

/// One tensor for [`GgufWriter`], with raw fields so tests can write what the
/// reader must refuse.
#[derive(Debug, Clone, PartialEq)]
pub struct RawTensor {
    /// Name.
    pub name: String,
    /// Dimensions, `ne[0]` first.
    pub dims: Vec<u64>,
    /// ggml type id (any `u32`).
    pub ty: u32,
    /// Bytes written to the data section at the tensor's offset (none when
    /// empty: a table entry pointing past the end of the file writes nothing).
    pub data: Vec<u8>,
    /// Offset written to the table; `None`: the next aligned offset after the
    /// data of the previous tensor placed this way (a chosen offset does not
    /// move the tensors after it).
    pub offset: Option<u64>,
}

/// Writes GGUF files (tests and tools): header, metadata in insertion order,
/// tensor table, padding, data. Pads with the `general.alignment` value when
/// that key is set (a `u32`), else [`DEFAULT_ALIGNMENT`].
#[derive(Debug, Clone)]
pub struct GgufWriter {
    /// Version field written (3 by default).
    pub version: u32,
    kv: Vec<(String, Value)>,
    tensors: Vec<RawTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds (or replaces) metadata pair `key`.
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kv.push((key.into(), value)),
        }
        self
    }

    /// Removes metadata pair `key` (if present).
    pub fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    /// Adds a tensor of type `ty` whose bytes are `data` (`ty.bytes_for` the
    /// element count of `dims`; not checked here).
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.raw_tensor(RawTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty: ty.id(),
            data,
            offset: None,
        })
    }

    /// Adds a tensor with raw fields.
    pub fn raw_tensor(&mut self, t: RawTensor) -> &mut Self {
        self.tensors.retain(|x| x.name != t.name);
        self.tensors.push(t);
        self
    }

    /// The tensors added so far (mutable: tests patch fields).
    pub fn tensors_mut(&mut self) -> &mut Vec<RawTensor> {
        &mut self.tensors
    }

    /// Removes tensor `name` (if present).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = match self.kv.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) if a.is_power_of_two() => *a as usize,
            _ => DEFAULT_ALIGNMENT as usize,
        };
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            write_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut out, v);
        }
        let mut next = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            let off = t.offset.unwrap_or(next);
            offsets.push(off);
            if t.offset.is_none() {
                next = (off + t.data.len() as u64).next_multiple_of(align as u64);
            }
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(align), 0);
        let data_start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            if t.data.is_empty() {
                continue;
            }
            let at = data_start + off as usize;
            if out.len() < at + t.data.len() {
                out.resize(at + t.data.len(), 0);
            }
            out[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        if !self.tensors.is_empty() {
            out.resize(out.len().next_multiple_of(align), 0);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_str(out, s),
        Value::Array(t, items) => {
            out.extend_from_slice(&(*t as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                write_value(out, i);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Shorthand for a string value.
pub fn string(s: &str) -> Value {
    Value::String(s.into())
}

/// Shorthand for an array of strings.
pub fn string_array<S: AsRef<str>>(items: &[S]) -> Value {
    Value::Array(
        ValueType::String,
        items.iter().map(|s| string(s.as_ref())).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back() {
        let mut w = GgufWriter::new();
        w.kv("a.u8", Value::U8(7))
            .kv("a.i64", Value::I64(-5))
            .kv("a.s", string("héllo"))
            .kv(
                "a.arr",
                Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]),
            )
            .tensor("t", &[32, 2], GgmlType::Q8_0, vec![1; 68]);
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.u32("a.u8").unwrap(), 7);
        assert_eq!(g.str("a.s").unwrap(), "héllo");
        assert_eq!(g.int_array("a.arr").unwrap(), [1, -2]);
        assert!(matches!(g.u32("a.i64"), Err(GgufError::KeyType { .. })));
        let t = g.tensor("t").unwrap().clone();
        assert_eq!((t.ty, t.size, t.offset), (GgmlType::Q8_0, 68, 0));
        assert_eq!(g.tensor_data(&t), &[1; 68][..]);
    }

    #[test]
    fn type_names_follow_ggml() {
        assert_eq!(ggml_type_name(12), Some("Q4_K"));
        assert_eq!(ggml_type_name(30), Some("BF16"));
        assert_eq!(ggml_type_name(1000), None);
        for t in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
        ] {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
    }
}

//! The vocabulary of a GGUF file: its limits and magic, [`GgufError`], the
//! tensor types ([`GgmlType`]), the metadata values ([`ValueType`],
//! [`Value`]) and a tensor's table entry ([`TensorInfo`]).

use std::fmt;

/// Deepest nesting of arrays in a metadata value that [`Gguf`](super::Gguf) accepts
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
    pub(super) fn min_bytes(self) -> u64 {
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

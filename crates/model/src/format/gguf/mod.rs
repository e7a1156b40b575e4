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

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

mod map;
mod types;
mod writer;

use map::Backing;
pub use types::*;
pub use writer::*;

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
        Self::parse(Backing::map(&file).map_err(io)?)
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

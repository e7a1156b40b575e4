//! Writing GGUF files (tests and tools): [`GgufWriter`], with
//! [`RawTensor`] for what the reader must refuse.

use super::types::{DEFAULT_ALIGNMENT, GgmlType, MAGIC, Value, ValueType};

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

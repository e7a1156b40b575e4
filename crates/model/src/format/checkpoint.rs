//! Loader (and writer) of llama2.c checkpoints (Karpathy's `run.c` legacy format).
//!
//! Layout, all little-endian:
//! 1. header: seven `i32` — `dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//!    vocab_size, seq_len`; a negative `vocab_size` means the classifier
//!    (`wcls`) is stored separately (unshared), a positive one that it is the
//!    token embedding table;
//! 2. `f32` tensors in [`Weights`] order: `token_embedding [vocab, dim]`,
//!    `rms_att [L, dim]`, `wq [L, dim, dim]`, `wk [L, kv_dim, dim]`,
//!    `wv [L, kv_dim, dim]`, `wo [L, dim, dim]`, `rms_ffn [L, dim]`,
//!    `w1 [L, hidden, dim]`, `w2 [L, dim, hidden]`, `w3 [L, hidden, dim]`,
//!    `rms_final [dim]`;
//! 3. the legacy RoPE tables `freq_cis_real/imag [seq_len, head_size / 2]`,
//!    skipped (RoPE is computed);
//! 4. `wcls [vocab, dim]` only when unshared.
//!
//! A truncated file, an inconsistent header or trailing bytes are
//! [`CheckpointError`]s naming the offending field.

use std::io::Write;
use std::path::Path;

use crate::{Config, Weights};

/// Why a checkpoint could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be read.
    #[error("cannot read checkpoint {path}: {msg}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        msg: String,
    },
    /// The file ends inside the named header field or tensor.
    #[error(
        "checkpoint truncated in `{field}`: needs {needed} bytes at offset {offset}, file has {len}"
    )]
    Truncated {
        /// Header field or tensor being read.
        field: &'static str,
        /// Byte offset where it starts.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// File length.
        len: usize,
    },
    /// A header field has an impossible value, or fields disagree.
    #[error("checkpoint header field `{field}` = {value}: {why}")]
    Inconsistent {
        /// Header field at fault.
        field: &'static str,
        /// Its value.
        value: i64,
        /// What is wrong.
        why: &'static str,
    },
    /// Bytes remain after the last tensor the header describes.
    #[error(
        "checkpoint has {extra} trailing bytes after `{last_field}` (header does not match the tensors)"
    )]
    Trailing {
        /// Bytes left over.
        extra: usize,
        /// The last tensor read.
        last_field: &'static str,
    },
}

/// Byte cursor that names what it reads when it runs out.
struct Cursor<'a> {
    buf: &'a [u8],
    off: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, field: &'static str, bytes: usize) -> Result<&'a [u8], CheckpointError> {
        let end = self.off.checked_add(bytes).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(CheckpointError::Truncated {
            field,
            offset: self.off,
            needed: bytes,
            len: self.buf.len(),
        })?;
        let s = &self.buf[self.off..end];
        self.off = end;
        Ok(s)
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, CheckpointError> {
        let b = self.take(field, 4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn f32s(&mut self, field: &'static str, n: usize) -> Result<Vec<f32>, CheckpointError> {
        let bytes = n.checked_mul(4).ok_or(CheckpointError::Inconsistent {
            field,
            value: n as i64,
            why: "tensor size overflows",
        })?;
        let b = self.take(field, bytes)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Every header count is below this (`Config::validate`).
const MAX_COUNT: usize = 1 << 24;
/// Largest `dim / n_heads` the attention kernel takes (`Config::validate`).
const MAX_HEAD_SIZE: usize = 256;

/// Header field names, in file order.
const HEADER: [&str; 7] = [
    "dim",
    "hidden_dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "vocab_size",
    "seq_len",
];

/// Reads a checkpoint file.
///
/// # Errors
/// [`CheckpointError::Io`], or as [`parse`].
pub fn load(path: &Path) -> Result<Weights, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| CheckpointError::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    parse(&bytes)
}

/// Parses a checkpoint held in memory.
///
/// # Errors
/// [`CheckpointError::Truncated`], [`CheckpointError::Inconsistent`] or
/// [`CheckpointError::Trailing`], each naming the field.
pub fn parse(bytes: &[u8]) -> Result<Weights, CheckpointError> {
    let mut cur = Cursor { buf: bytes, off: 0 };
    let (config, shared) = read_header(&mut cur)?;
    let c = config;
    let (l, d, h, kv, v) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim(), c.vocab_size);
    let token_embedding = cur.f32s("token_embedding", v * d)?;
    let rms_att = cur.f32s("rms_att", l * d)?;
    let wq = cur.f32s("wq", l * d * d)?;
    let wk = cur.f32s("wk", l * kv * d)?;
    let wv = cur.f32s("wv", l * kv * d)?;
    let wo = cur.f32s("wo", l * d * d)?;
    let rms_ffn = cur.f32s("rms_ffn", l * d)?;
    let w1 = cur.f32s("w1", l * h * d)?;
    let w2 = cur.f32s("w2", l * d * h)?;
    let w3 = cur.f32s("w3", l * h * d)?;
    let rms_final = cur.f32s("rms_final", d)?;
    let half = c.seq_len * c.head_size() / 2;
    cur.take("freq_cis_real", half * 4)?;
    cur.take("freq_cis_imag", half * 4)?;
    let (wcls, last_field) = if shared {
        (token_embedding.clone(), "freq_cis_imag")
    } else {
        (cur.f32s("wcls", v * d)?, "wcls")
    };
    if cur.off != bytes.len() {
        return Err(CheckpointError::Trailing {
            extra: bytes.len() - cur.off,
            last_field,
        });
    }
    Ok(Weights {
        config,
        token_embedding,
        rms_att,
        wq,
        wk,
        wv,
        wo,
        rms_ffn,
        w1,
        w2,
        w3,
        rms_final,
        wcls,
    })
}

fn read_header(cur: &mut Cursor<'_>) -> Result<(Config, bool), CheckpointError> {
    let mut f = [0i32; 7];
    for (slot, name) in f.iter_mut().zip(HEADER) {
        *slot = cur.i32(name)?;
    }
    if f[0] == 0x616b_3432 {
        return Err(bad(
            "dim",
            f[0],
            "this is the llama2.c `ak42` v1/v2 export; use the legacy export (version 0)",
        ));
    }
    for (i, name) in HEADER.iter().enumerate() {
        let v = if i == 5 {
            f[i].unsigned_abs() as i64
        } else {
            f[i] as i64
        };
        if v <= 0 {
            return Err(bad(name, f[i], "must be positive"));
        }
    }
    let config = Config {
        dim: f[0] as usize,
        hidden_dim: f[1] as usize,
        n_layers: f[2] as usize,
        n_heads: f[3] as usize,
        n_kv_heads: f[4] as usize,
        vocab_size: f[5].unsigned_abs() as usize,
        seq_len: f[6] as usize,
    };
    check_config(&config)?;
    Ok((config, f[5] > 0))
}

fn bad(field: &'static str, value: i32, why: &'static str) -> CheckpointError {
    CheckpointError::Inconsistent {
        field,
        value: value.into(),
        why,
    }
}

/// Checks the relations between a config's fields (the ones the model's
/// kernels rely on).
///
/// # Errors
/// [`CheckpointError::Inconsistent`] naming the field that breaks a relation.
pub fn check_config(c: &Config) -> Result<(), CheckpointError> {
    let v = |x: usize| x as i32;
    // The limits of `Config::validate` (what the kernels and the CPU
    // reference accept), each named: a file that loads is one that runs.
    for (name, n) in HEADER.iter().zip(c.counts()) {
        if n >= MAX_COUNT {
            return Err(bad(name, v(n), "must be below 2^24 (16777216)"));
        }
    }
    if !c.dim.is_multiple_of(c.n_heads) {
        return Err(bad("n_heads", v(c.n_heads), "does not divide dim"));
    }
    if c.n_kv_heads > c.n_heads || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(bad(
            "n_kv_heads",
            v(c.n_kv_heads),
            "does not divide n_heads",
        ));
    }
    if !c.head_size().is_multiple_of(2) {
        return Err(bad(
            "n_heads",
            v(c.n_heads),
            "dim / n_heads must be even (RoPE pairs)",
        ));
    }
    if c.head_size() > MAX_HEAD_SIZE {
        return Err(bad(
            "n_heads",
            v(c.n_heads),
            "dim / n_heads is above the attention kernel's head size of 256",
        ));
    }
    debug_assert!(
        c.validate().is_ok(),
        "check_config and Config::validate agree"
    );
    Ok(())
}

/// Writes `w` in the llama2.c legacy format (`shared`: classifier tied to the
/// embedding, so `wcls` is not written and `vocab_size` is positive). The
/// RoPE tables are written as zeros (loaders skip them).
///
/// # Errors
/// The writer's I/O errors.
pub fn write(w: &Weights, shared: bool, out: &mut impl Write) -> std::io::Result<()> {
    let c = &w.config;
    let vocab = if shared {
        c.vocab_size as i32
    } else {
        -(c.vocab_size as i32)
    };
    let header = [
        c.dim,
        c.hidden_dim,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        0,
        c.seq_len,
    ];
    for (i, &x) in header.iter().enumerate() {
        let x = if i == 5 { vocab } else { x as i32 };
        out.write_all(&x.to_le_bytes())?;
    }
    let tensors = [
        &w.token_embedding,
        &w.rms_att,
        &w.wq,
        &w.wk,
        &w.wv,
        &w.wo,
        &w.rms_ffn,
        &w.w1,
        &w.w2,
        &w.w3,
        &w.rms_final,
    ];
    for t in tensors {
        write_f32s(out, t)?;
    }
    write_f32s(out, &vec![0.0; c.seq_len * c.head_size()])?;
    if !shared {
        write_f32s(out, &w.wcls)?;
    }
    Ok(())
}

fn write_f32s(out: &mut impl Write, xs: &[f32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(f: [i32; 7]) -> Vec<u8> {
        f.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn header_errors_name_the_field() {
        let e = parse(&header([8, 16, 1, 3, 1, 10, 4])).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Inconsistent {
                    field: "n_heads",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse(&header([8, 16, 1, 2, 3, 10, 4])).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Inconsistent {
                    field: "n_kv_heads",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse(&header([8, 16, 0, 2, 1, 10, 4])).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Inconsistent {
                    field: "n_layers",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse(&header([8, 16, 1, 2, 1, 10, 4])[..6]).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Truncated {
                    field: "hidden_dim",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_tensor_is_named() {
        let mut b = header([8, 16, 1, 2, 1, 10, 4]);
        b.extend(vec![0u8; 10 * 8 * 4]); // token_embedding only
        let e = parse(&b).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Truncated {
                    field: "rms_att",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("rms_att"));
    }
}

//! llama2.c `tokenizer.bin` reader, for printing generated tokens as text
//! (`xtc decode --model M --tokenizer T`).
//!
//! Layout, little-endian: `i32 max_token_length`, then for each of the
//! model's `vocab_size` tokens: `f32 score`, `i32 len`, `len` bytes of the
//! token's piece (UTF-8 or a raw-byte piece `<0xHH>`). Token 1 is BOS and 2
//! is EOS in llama2.c's tokenizers.

use std::path::Path;

/// Beginning-of-sequence token id of llama2.c tokenizers.
pub const BOS: u32 = 1;
/// End-of-sequence token id of llama2.c tokenizers.
pub const EOS: u32 = 2;

/// Why a tokenizer could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// The file could not be read.
    #[error("cannot read tokenizer {path}: {msg}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        msg: String,
    },
    /// The file ends inside the named field.
    #[error("tokenizer truncated in {field} of token {token}")]
    Truncated {
        /// `max_token_length`, `score`, `len` or `piece`.
        field: &'static str,
        /// Token id being read (0 for the header).
        token: usize,
    },
    /// The file holds a different number of tokens than the model's
    /// vocabulary: a tokenizer for another model.
    #[error("{}", vocab_mismatch(*tokens, *vocab_size))]
    VocabMismatch {
        /// Whole tokens in the file; `None` when bytes after the model's
        /// `vocab_size` tokens are no whole token.
        tokens: Option<usize>,
        /// The model's `vocab_size`.
        vocab_size: usize,
    },
    /// A piece length is negative or above `max_token_length`.
    #[error("tokenizer token {token}: piece length {len} is outside 0..={max}")]
    BadLength {
        /// Token id.
        token: usize,
        /// The length read.
        len: i32,
        /// `max_token_length` of the header.
        max: i32,
    },
}

/// The vocabulary of a llama2.c tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pieces: Vec<Vec<u8>>,
}

impl Tokenizer {
    /// Reads `vocab_size` tokens from a `tokenizer.bin` file.
    ///
    /// # Errors
    /// [`TokenizerError::Io`], or as [`Tokenizer::parse`].
    pub fn load(path: &Path, vocab_size: usize) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|e| TokenizerError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Self::parse(&bytes, vocab_size)
    }

    /// Parses a tokenizer held in memory.
    ///
    /// # Errors
    /// [`TokenizerError::Truncated`] or [`TokenizerError::BadLength`].
    /// [`TokenizerError::VocabMismatch`] when the file ends cleanly before
    /// `vocab_size` tokens or holds bytes after them.
    pub fn parse(bytes: &[u8], vocab_size: usize) -> Result<Self, TokenizerError> {
        let mut r = Reader { bytes, off: 0 };
        let max = i32::from_le_bytes(r.take::<4>("max_token_length", 0)?);
        let mut pieces = Vec::with_capacity(vocab_size.min(bytes.len() / 8));
        for token in 0..vocab_size {
            if r.at_end() {
                return Err(TokenizerError::VocabMismatch {
                    tokens: Some(token),
                    vocab_size,
                });
            }
            pieces.push(r.token(token, max)?);
        }
        if !r.at_end() {
            let mut n = vocab_size;
            let tokens = loop {
                if r.at_end() {
                    break Some(n);
                }
                match r.token(n, max) {
                    Ok(_) => n += 1,
                    Err(_) => break None,
                }
            };
            return Err(TokenizerError::VocabMismatch { tokens, vocab_size });
        }
        Ok(Tokenizer { pieces })
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The bytes `token` prints as after `prev` (llama2.c's `decode`: a
    /// leading space is dropped after BOS, `<0xHH>` is the raw byte). An
    /// unknown token prints as nothing.
    pub fn piece(&self, prev: u32, token: u32) -> Vec<u8> {
        let Some(p) = self.pieces.get(token as usize) else {
            return Vec::new();
        };
        let p = if prev == BOS && p.first() == Some(&b' ') {
            &p[1..]
        } else {
            &p[..]
        };
        let hex = p.strip_prefix(b"<0x").and_then(|r| r.strip_suffix(b">"));
        let byte = hex
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        if let Some(b) = byte {
            return vec![b];
        }
        p.to_vec()
    }

    /// The text of `tokens` following `prev` (lossy UTF-8).
    pub fn decode(&self, prev: u32, tokens: &[u32]) -> String {
        let mut out = Vec::new();
        let mut prev = prev;
        for &t in tokens {
            out.extend(self.piece(prev, t));
            prev = t;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

fn vocab_mismatch(tokens: Option<usize>, vocab_size: usize) -> String {
    match tokens {
        Some(n) => format!(
            "tokenizer has {n} tokens but the model has vocab_size {vocab_size} \
             (a tokenizer for another model?)"
        ),
        None => format!(
            "tokenizer has bytes after the model's vocab_size {vocab_size} tokens that are \
             no whole token (a tokenizer for another model, or a damaged file?)"
        ),
    }
}

/// Byte reader over a `tokenizer.bin` that names what it runs out in.
struct Reader<'a> {
    bytes: &'a [u8],
    off: usize,
}

impl<'a> Reader<'a> {
    fn at_end(&self) -> bool {
        self.off >= self.bytes.len()
    }

    fn slice(
        &mut self,
        n: usize,
        field: &'static str,
        token: usize,
    ) -> Result<&'a [u8], TokenizerError> {
        let s = self
            .off
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.off..end))
            .ok_or(TokenizerError::Truncated { field, token })?;
        self.off += n;
        Ok(s)
    }

    fn take<const N: usize>(
        &mut self,
        field: &'static str,
        token: usize,
    ) -> Result<[u8; N], TokenizerError> {
        let s = self.slice(N, field, token)?;
        Ok(s.try_into().expect("slice of N bytes"))
    }

    /// One token record: score, length, piece.
    fn token(&mut self, token: usize, max: i32) -> Result<Vec<u8>, TokenizerError> {
        self.take::<4>("score", token)?;
        let len = i32::from_le_bytes(self.take::<4>("len", token)?);
        if len < 0 || len > max {
            return Err(TokenizerError::BadLength { token, len, max });
        }
        Ok(self.slice(len as usize, "piece", token)?.to_vec())
    }
}

/// Serialises pieces as a llama2.c `tokenizer.bin` (scores 0); for tests and examples.
pub fn write(pieces: &[&str]) -> Vec<u8> {
    let max = pieces.iter().map(|p| p.len()).max().unwrap_or(0) as i32;
    let mut out = max.to_le_bytes().to_vec();
    for p in pieces {
        out.extend(0f32.to_le_bytes());
        out.extend((p.len() as i32).to_le_bytes());
        out.extend(p.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_pieces_bytes_and_bos_space() {
        let bin = write(&["<unk>", "<s>", "</s>", " hello", " world", "<0x21>"]);
        let t = Tokenizer::parse(&bin, 6).unwrap();
        assert_eq!(t.decode(BOS, &[3, 4, 5]), "hello world!");
        assert_eq!(t.decode(0, &[3]), " hello");
        assert_eq!(t.decode(0, &[99]), "");
    }

    #[test]
    fn truncated_and_bad_lengths_are_errors() {
        let bin = write(&["a", "bb"]);
        assert_eq!(
            Tokenizer::parse(&bin, 3).unwrap_err(),
            TokenizerError::VocabMismatch {
                tokens: Some(2),
                vocab_size: 3
            }
        );
        assert_eq!(
            Tokenizer::parse(&bin[..bin.len() - 4], 2).unwrap_err(),
            TokenizerError::Truncated {
                field: "len",
                token: 1
            }
        );
        let mut bad = bin.clone();
        bad[8..12].copy_from_slice(&7i32.to_le_bytes()); // len of token 0
        assert!(matches!(
            Tokenizer::parse(&bad, 2).unwrap_err(),
            TokenizerError::BadLength {
                token: 0,
                len: 7,
                ..
            }
        ));
    }
}

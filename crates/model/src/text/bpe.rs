//! GPT-2 byte-level BPE tokenizer from GGUF metadata
//! (`tokenizer.ggml.model = gpt2`), as Hugging Face `tokenizers` and
//! llama.cpp run it.
//!
//! # Metadata read
//! - `tokenizer.ggml.tokens`: the vocabulary, one string per id. Normal
//!   tokens are in GPT-2's byte alphabet: each byte of text is one printable
//!   character ([`byte_char`]: bytes `!..~`, `¡..¬`, `®..ÿ` are themselves,
//!   the other 68 are U+0100 onwards in byte order; a space is `Ġ`, a
//!   newline `Ċ`).
//! - `tokenizer.ggml.token_type` (optional): 1 normal, 3 control (special
//!   tokens such as `<|im_start|>`, written as literal text), 4 user-defined,
//!   others kept but never produced by [`Bpe::encode`].
//! - `tokenizer.ggml.merges`: `"left right"` pairs in priority order.
//! - `tokenizer.ggml.pre`: the pre-tokenizer. `smollm` (SmolLM2): each
//!   numeric character (`\p{N}`) is a piece of its own, then the GPT-2 split
//!   of the rest; `gpt-2` and `default`: the GPT-2 split alone. Others are
//!   refused (naming the key).
//! - `tokenizer.ggml.bos_token_id` (optional), `tokenizer.ggml.eos_token_id`.
//!
//! # Encoding
//! 1. With [`Bpe::encode_with_specials`] only: control and user-defined
//!    tokens found in the text (leftmost, longest first) become their ids;
//!    the text between them is encoded as below. [`Bpe::encode`] never
//!    parses special tokens (user text cannot inject `<|im_end|>`).
//! 2. Pre-tokenization: the text is cut into pieces by the GPT-2 pattern
//!    `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//!    (fancy-regex: the `(?!\S)` lookahead keeps the last space of a run for
//!    the next word).
//! 3. Each piece starts as one symbol per byte and the adjacent pair of
//!    lowest merge rank (leftmost among equals) is merged until no pair has
//!    a merge: O(n log n) per piece with a heap. A byte without a
//!    single-byte token in the vocabulary is dropped, as Hugging Face and
//!    llama.cpp drop it ([`Bpe::uncovered_bytes`]: SmolLM2 lacks 21 of the
//!    256, e.g. `0x04` and the UTF-8 lead bytes `F1`, `F2`; callers can warn
//!    with [`Bpe::uncovered_in`]).
//!
//! Decoding maps each token back to bytes ([`Bpe::token_bytes`]); special
//! tokens decode to their text. [`TextStream`] turns a stream of token bytes
//! into UTF-8 text without splitting a character across two writes.
//!
//! Invariant: for any text whose bytes all have tokens, `decode(encode(text))
//! == text` (merges only join) and `decode(encode_with_specials(text)) == text`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::ModelError;
use crate::format::gguf::Gguf;

/// The GPT-2 pre-tokenization pattern (see the module documentation).
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// A token's kind (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text (1, or absent).
    Normal,
    /// Special control token, e.g. `<|im_start|>` (3).
    Control,
    /// User-defined token, matched in text like a control token (4).
    UserDefined,
    /// Any other type (unknown 2, unused 5, byte 6): never produced by encoding.
    Other,
}

/// Which pre-tokenizer the vocabulary was trained with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `smollm`: numerals one by one, then the GPT-2 split.
    SmolLm,
    /// `gpt-2` / `default`: the GPT-2 split.
    Gpt2,
}

/// The character GPT-2's byte alphabet writes byte `b` as.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("U+0100..U+0143")
}

/// A byte-level BPE tokenizer (see the module documentation).
#[derive(Debug, Clone)]
pub struct Bpe {
    bytes: Vec<Vec<u8>>,
    kinds: Vec<TokenKind>,
    byte_token: [Option<u32>; 256],
    merges: HashMap<(u32, u32), (u32, u32)>,
    specials: Option<regex::Regex>,
    special_ids: HashMap<String, u32>,
    split: fancy_regex::Regex,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: u32,
}

fn tok_err(key: &str, why: impl Into<String>) -> ModelError {
    ModelError::Tokenizer {
        key: key.into(),
        why: why.into(),
    }
}

impl Bpe {
    /// Reads the tokenizer from `g`'s metadata.
    ///
    /// # Errors
    /// [`ModelError::Gguf`] for a required key that is missing or of the
    /// wrong type; [`ModelError::Tokenizer`] naming the key for a model other
    /// than `gpt2`, an unknown pre-tokenizer, a `token_type` array of another
    /// length, a merge that is not two tokens of the vocabulary joining into
    /// a third, no single-byte token at all, or a BOS/EOS id outside the vocabulary.
    pub fn from_gguf(g: &Gguf) -> Result<Bpe, ModelError> {
        let model = g.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(tok_err(
                "tokenizer.ggml.model",
                format!("{model:?}: only gpt2 (byte-level BPE) is supported"),
            ));
        }
        let pre = match g.get("tokenizer.ggml.pre") {
            None => PreTokenizer::Gpt2,
            Some(_) => match g.str("tokenizer.ggml.pre")? {
                "smollm" => PreTokenizer::SmolLm,
                "gpt-2" | "default" => PreTokenizer::Gpt2,
                other => {
                    return Err(tok_err(
                        "tokenizer.ggml.pre",
                        format!("{other:?}: supported pre-tokenizers are smollm, gpt-2, default"),
                    ));
                }
            },
        };
        let tokens = g.str_array("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || n >= 1 << 24 {
            return Err(tok_err("tokenizer.ggml.tokens", format!("{n} tokens")));
        }
        let kinds: Vec<TokenKind> = match g.get("tokenizer.ggml.token_type") {
            None => vec![TokenKind::Normal; n],
            Some(_) => {
                let t = g.int_array("tokenizer.ggml.token_type")?;
                if t.len() != n {
                    return Err(tok_err(
                        "tokenizer.ggml.token_type",
                        format!("{} entries for {n} tokens", t.len()),
                    ));
                }
                t.iter()
                    .map(|k| match k {
                        1 => TokenKind::Normal,
                        3 => TokenKind::Control,
                        4 => TokenKind::UserDefined,
                        _ => TokenKind::Other,
                    })
                    .collect()
            }
        };
        let mut char_byte = HashMap::with_capacity(256);
        for b in 0..=255u8 {
            char_byte.insert(byte_char(b), b);
        }
        let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
        let mut bytes = Vec::with_capacity(n);
        let mut special_ids = HashMap::new();
        for (i, (t, k)) in tokens.iter().zip(&kinds).enumerate() {
            match k {
                TokenKind::Control | TokenKind::UserDefined => {
                    bytes.push(t.as_bytes().to_vec());
                    if !t.is_empty() {
                        special_ids.insert(t.to_string(), i as u32);
                    }
                }
                _ => {
                    // Characters outside the byte alphabet decode as their UTF-8.
                    let mut b = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match char_byte.get(&c) {
                            Some(&x) => b.push(x),
                            None => b.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    bytes.push(b);
                    // The first id of a string wins (as a vocabulary map).
                    ids.entry(t).or_insert(i as u32);
                }
            }
        }
        let mut byte_token = [None; 256];
        for b in 0..=255u8 {
            byte_token[b as usize] = ids.get(byte_char(b).to_string().as_str()).copied();
        }
        if byte_token.iter().all(Option::is_none) {
            return Err(tok_err(
                "tokenizer.ggml.tokens",
                "no token for any single byte: not a byte-level vocabulary",
            ));
        }
        let merge_list = g.str_array("tokenizer.ggml.merges")?;
        let mut merges = HashMap::with_capacity(merge_list.len());
        for (rank, m) in merge_list.iter().enumerate() {
            let key = || format!("tokenizer.ggml.merges[{rank}]");
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                tok_err(
                    &key(),
                    format!("{m:?} is not two tokens separated by a space"),
                )
            })?;
            let id = |s: &str| {
                ids.get(s)
                    .copied()
                    .ok_or_else(|| tok_err(&key(), format!("{s:?} is not in the vocabulary")))
            };
            let (ia, ib, joined) = (id(a)?, id(b)?, id(&format!("{a}{b}"))?);
            merges.entry((ia, ib)).or_insert((rank as u32, joined));
        }
        let id_key = |key: &str| -> Result<Option<u32>, ModelError> {
            match g.get(key) {
                None => Ok(None),
                Some(_) => {
                    let v = g.u32(key)?;
                    if v as usize >= n {
                        return Err(tok_err(
                            key,
                            format!("id {v} is not below the vocabulary size {n}"),
                        ));
                    }
                    Ok(Some(v))
                }
            }
        };
        let bos = id_key("tokenizer.ggml.bos_token_id")?;
        let eos = id_key("tokenizer.ggml.eos_token_id")?.ok_or_else(|| {
            ModelError::Gguf(crate::format::gguf::GgufError::MissingKey {
                key: "tokenizer.ggml.eos_token_id".into(),
            })
        })?;
        let specials = if special_ids.is_empty() {
            None
        } else {
            let mut names: Vec<&String> = special_ids.keys().collect();
            // Longest first: the alternation then takes the longest match at a position.
            names.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
            let pat = names
                .iter()
                .map(|s| regex::escape(s))
                .collect::<Vec<_>>()
                .join("|");
            Some(regex::Regex::new(&pat).expect("escaped literals"))
        };
        Ok(Bpe {
            bytes,
            kinds,
            byte_token,
            merges,
            specials,
            special_ids,
            split: fancy_regex::Regex::new(GPT2_PATTERN).expect("the GPT-2 pattern compiles"),
            pre,
            bos,
            eos,
        })
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }
    /// Beginning-of-sequence id, if the vocabulary names one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    /// End-of-sequence id.
    pub fn eos(&self) -> u32 {
        self.eos
    }
    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
    /// Bytes with no single-byte token in the vocabulary (SmolLM2 lacks 21:
    /// six control characters and lead bytes that valid UTF-8 never or
    /// rarely uses); encoding drops them.
    pub fn uncovered_bytes(&self) -> Vec<u8> {
        (0..=255u8)
            .filter(|&b| self.byte_token[b as usize].is_none())
            .collect()
    }

    /// The bytes of `text` that [`Bpe::encode`] would drop (no token), in order.
    pub fn uncovered_in(&self, text: &str) -> Vec<u8> {
        text.bytes()
            .filter(|&b| self.byte_token[b as usize].is_none())
            .collect()
    }

    /// The id of special (control or user-defined) token `text`, e.g. `<|im_start|>`.
    pub fn special(&self, text: &str) -> Option<u32> {
        self.special_ids.get(text).copied()
    }
    /// The kind of token `id`.
    ///
    /// # Panics
    /// If `id` is not below [`Bpe::vocab_size`].
    pub fn kind(&self, id: u32) -> TokenKind {
        self.kinds[id as usize]
    }
    /// The bytes token `id` stands for (special tokens: their text).
    ///
    /// # Panics
    /// If `id` is not below [`Bpe::vocab_size`].
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        &self.bytes[id as usize]
    }

    /// The bytes of `ids`, concatenated.
    ///
    /// # Panics
    /// If an id is not below [`Bpe::vocab_size`].
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .flat_map(|&i| self.token_bytes(i).iter().copied())
            .collect()
    }

    /// The text of `ids` (invalid UTF-8 replaced by U+FFFD).
    ///
    /// # Panics
    /// If an id is not below [`Bpe::vocab_size`].
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Encodes `text` as plain text: special-token strings in it are
    /// ordinary characters.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_into(text, &mut out);
        out
    }

    /// Encodes `text`, turning each special token's text in it into its id.
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let Some(re) = &self.specials else {
            return self.encode(text);
        };
        let mut out = Vec::new();
        let mut at = 0;
        for m in re.find_iter(text) {
            self.encode_into(&text[at..m.start()], &mut out);
            out.push(self.special_ids[m.as_str()]);
            at = m.end();
        }
        self.encode_into(&text[at..], &mut out);
        out
    }

    fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        match self.pre {
            PreTokenizer::Gpt2 => self.split_gpt2(text, out),
            PreTokenizer::SmolLm => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        self.split_gpt2(&text[start..i], out);
                        self.bpe(&text[i..i + c.len_utf8()], out);
                        start = i + c.len_utf8();
                    }
                }
                self.split_gpt2(&text[start..], out);
            }
        }
    }

    /// The GPT-2 split of `text`, each piece through BPE (text between
    /// matches, which the pattern never leaves, would be a piece too).
    fn split_gpt2(&self, text: &str, out: &mut Vec<u32>) {
        let mut at = 0;
        for m in self.split.find_iter(text) {
            let Ok(m) = m else {
                // Backtrack limit: the rest as one piece (still lossless).
                break;
            };
            if m.start() > at {
                self.bpe(&text[at..m.start()], out);
            }
            self.bpe(m.as_str(), out);
            at = m.end();
        }
        if at < text.len() {
            self.bpe(&text[at..], out);
        }
    }

    /// Byte-level BPE of one piece (see the module documentation, step 3).
    fn bpe(&self, piece: &str, out: &mut Vec<u32>) {
        // Bytes without a token are dropped (as Hugging Face and llama.cpp do).
        let ids: Vec<u32> = piece
            .bytes()
            .filter_map(|x| self.byte_token[x as usize])
            .collect();
        if ids.is_empty() {
            return;
        }
        struct Sym {
            id: u32,
            prev: usize,
            next: usize,
            alive: bool,
        }
        const NONE: usize = usize::MAX;
        let n = ids.len();
        let mut syms: Vec<Sym> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Sym {
                id,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            })
            .collect();
        // (rank, left position, right position), smallest first.
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if let Some(&(rank, _)) = self.merges.get(&(syms[l].id, syms[r].id)) {
                heap.push(Reverse((rank, l, r)));
            }
        };
        for i in 0..n - 1 {
            push(&mut heap, &syms, i, i + 1);
        }
        while let Some(Reverse((rank, l, r))) = heap.pop() {
            if !syms[l].alive || !syms[r].alive || syms[l].next != r {
                continue;
            }
            let Some(&(cur, joined)) = self.merges.get(&(syms[l].id, syms[r].id)) else {
                continue;
            };
            if cur != rank {
                continue;
            }
            syms[l].id = joined;
            syms[r].alive = false;
            let nx = syms[r].next;
            syms[l].next = nx;
            if nx != NONE {
                syms[nx].prev = l;
                push(&mut heap, &syms, l, nx);
            }
            let pv = syms[l].prev;
            if pv != NONE {
                push(&mut heap, &syms, pv, l);
            }
        }
        let mut i = 0;
        while i != NONE {
            out.push(syms[i].id);
            i = syms[i].next;
        }
    }
}

/// Turns token bytes into UTF-8 text as they stream: a character split
/// across tokens is held back until complete; bytes that can never be UTF-8
/// become U+FFFD.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Appends `bytes`; returns the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let ok = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..ok]).expect("valid prefix"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..ok + bad);
                        }
                        None => {
                            self.pending.drain(..ok);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The bytes still held (an incomplete character at the end), lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::{GgufWriter, Value, ValueType, string, string_array};

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(0), '\u{100}');
        assert_eq!(byte_char(0xad), '\u{143}');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
    }

    /// A toy vocabulary: 256 byte tokens, merges `h e`, `l l`, `he ll`,
    /// `hell o`, `Ġ w`, and the control token `<|x|>`.
    fn toy(pre: &str) -> Bpe {
        let mut toks: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w"];
        for m in merges {
            toks.push(m.replace(' ', ""));
        }
        toks.push("<|x|>".into());
        let mut types = vec![Value::I32(1); toks.len()];
        *types.last_mut().unwrap() = Value::I32(3);
        let mut w = GgufWriter::new();
        w.kv("tokenizer.ggml.model", string("gpt2"))
            .kv("tokenizer.ggml.pre", string(pre))
            .kv("tokenizer.ggml.tokens", string_array(&toks))
            .kv(
                "tokenizer.ggml.token_type",
                Value::Array(ValueType::I32, types),
            )
            .kv("tokenizer.ggml.merges", string_array(&merges))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(261));
        Bpe::from_gguf(&Gguf::from_bytes(w.to_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn merges_apply_by_rank() {
        let t = toy("smollm");
        // h e l l o -> he l l o -> he ll o -> hell o -> hello (ids 256..=259).
        assert_eq!(t.encode("hello"), vec![259]);
        assert_eq!(t.encode("hell"), vec![258]);
        assert_eq!(t.encode("lle"), vec![257, u32::from(b'e')]);
        assert_eq!(t.encode(" w"), vec![260]);
        assert_eq!(t.decode(&t.encode("hello world")), "hello world");
    }

    #[test]
    fn numerals_are_split_one_by_one_under_smollm_only() {
        let digits = |t: &Bpe, s: &str| t.encode(s).len();
        assert_eq!(digits(&toy("smollm"), "2024"), 4);
        // GPT-2 alone keeps " 2024" as one piece; with byte tokens only it is still 5 bytes.
        assert_eq!(digits(&toy("gpt-2"), " 2024"), 5);
        assert_eq!(toy("smollm").encode("x2y").len(), 3);
    }

    #[test]
    fn specials_are_parsed_only_when_asked() {
        let t = toy("smollm");
        assert_eq!(t.encode_with_specials("a<|x|>b"), vec![97, 261, 98]);
        assert_eq!(t.encode("<|x|>").len(), 5);
        assert_eq!(t.decode(&[261]), "<|x|>");
    }

    #[test]
    fn text_streams_hold_split_characters() {
        let mut s = TextStream::new();
        let e = "é".as_bytes();
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.push(&e[1..]), "é");
        assert_eq!(s.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
}

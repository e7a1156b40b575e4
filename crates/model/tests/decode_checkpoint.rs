//! llama2.c checkpoints: a tiny checkpoint written in that format loads back
//! tensor for tensor (shared and unshared classifier); truncated or
//! inconsistent files are errors naming the offending field.

use xtc_model::format::checkpoint::{self, CheckpointError};
use xtc_model::{Config, Weights};

const TINY: Config = Config {
    dim: 8,
    hidden_dim: 12,
    n_layers: 2,
    n_heads: 2,
    n_kv_heads: 1,
    vocab_size: 11,
    seq_len: 16,
};

fn tiny(shared: bool) -> Weights {
    let mut x = 0.0f32;
    let mut t = |n: usize| {
        (0..n)
            .map(|_| {
                x += 0.25;
                x
            })
            .collect::<Vec<f32>>()
    };
    let c = TINY;
    let (l, d, h, kv, v) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim(), c.vocab_size);
    let token_embedding = t(v * d);
    let mut w = Weights {
        config: c,
        rms_att: t(l * d),
        wq: t(l * d * d),
        wk: t(l * kv * d),
        wv: t(l * kv * d),
        wo: t(l * d * d),
        rms_ffn: t(l * d),
        w1: t(l * h * d),
        w2: t(l * d * h),
        w3: t(l * h * d),
        rms_final: t(d),
        wcls: token_embedding.clone(),
        token_embedding,
    };
    if !shared {
        w.wcls = t(v * d);
    }
    w
}

fn bytes(w: &Weights, shared: bool) -> Vec<u8> {
    let mut b = Vec::new();
    checkpoint::write(w, shared, &mut b).unwrap();
    b
}

fn assert_same(a: &Weights, b: &Weights) {
    assert_eq!(a.config, b.config);
    assert_eq!(a.token_embedding, b.token_embedding);
    assert_eq!(a.rms_att, b.rms_att);
    assert_eq!((&a.wq, &a.wk, &a.wv, &a.wo), (&b.wq, &b.wk, &b.wv, &b.wo));
    assert_eq!((&a.w1, &a.w2, &a.w3), (&b.w1, &b.w2, &b.w3));
    assert_eq!(
        (&a.rms_ffn, &a.rms_final, &a.wcls),
        (&b.rms_ffn, &b.rms_final, &b.wcls)
    );
}

#[test]
fn shared_and_unshared_checkpoints_round_trip() {
    for shared in [true, false] {
        let w = tiny(shared);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tiny.bin");
        std::fs::write(&p, bytes(&w, shared)).unwrap();
        let back = checkpoint::load(&p).unwrap();
        assert_same(&w, &back);
        assert_eq!(back.wcls == back.token_embedding, shared);
    }
}

#[test]
fn header_is_seven_i32_with_negative_vocab_for_unshared() {
    let b = bytes(&tiny(false), false);
    let field = |i: usize| i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(
        (0..7).map(field).collect::<Vec<_>>(),
        [8, 12, 2, 2, 1, -11, 16]
    );
    let b = bytes(&tiny(true), true);
    assert_eq!(i32::from_le_bytes(b[20..24].try_into().unwrap()), 11);
}

#[test]
fn truncation_names_the_tensor_being_read() {
    let w = tiny(false);
    let full = bytes(&w, false);
    let c = TINY;
    let d = c.dim;
    // cut inside each tensor in turn: the error names it
    let sizes = [
        ("token_embedding", c.vocab_size * d),
        ("rms_att", 2 * d),
        ("wq", 2 * d * d),
        ("wk", 2 * c.kv_dim() * d),
        ("wv", 2 * c.kv_dim() * d),
        ("wo", 2 * d * d),
        ("rms_ffn", 2 * d),
        ("w1", 2 * c.hidden_dim * d),
        ("w2", 2 * d * c.hidden_dim),
        ("w3", 2 * c.hidden_dim * d),
        ("rms_final", d),
        ("freq_cis_real", c.seq_len * c.head_size() / 2),
        ("freq_cis_imag", c.seq_len * c.head_size() / 2),
        ("wcls", c.vocab_size * d),
    ];
    let mut off = 28;
    for (name, n) in sizes {
        let cut = off + 4 * n - 2;
        match checkpoint::parse(&full[..cut]).unwrap_err() {
            CheckpointError::Truncated { field, .. } => assert_eq!(field, name),
            e => panic!("{name}: {e}"),
        }
        off += 4 * n;
    }
    assert_eq!(off, full.len());
}

#[test]
fn inconsistent_headers_and_trailing_bytes_are_errors() {
    let mut b = bytes(&tiny(true), true);
    b.extend([0u8; 8]);
    let e = checkpoint::parse(&b).unwrap_err();
    assert!(
        matches!(e, CheckpointError::Trailing { extra: 8, .. }),
        "{e}"
    );
    // an unshared header on a shared file: the classifier is missing
    let mut b = bytes(&tiny(true), true);
    b[20..24].copy_from_slice(&(-11i32).to_le_bytes());
    let e = checkpoint::parse(&b).unwrap_err();
    assert!(
        matches!(e, CheckpointError::Truncated { field: "wcls", .. }),
        "{e}"
    );
    let mut b = bytes(&tiny(true), true);
    b[24..28].copy_from_slice(&(-3i32).to_le_bytes());
    let e = checkpoint::parse(&b).unwrap_err();
    assert!(e.to_string().contains("seq_len"), "{e}");
    let mut b = bytes(&tiny(true), true);
    b[0..4].copy_from_slice(&0x616b_3432i32.to_le_bytes());
    assert!(
        checkpoint::parse(&b)
            .unwrap_err()
            .to_string()
            .contains("ak42")
    );
    let e = checkpoint::load(std::path::Path::new("/nonexistent/m.bin")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/m.bin"), "{e}");
}

fn header(f: [i32; 7]) -> Vec<u8> {
    f.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Zero weights of any shape, written as a shared-classifier checkpoint.
fn zero_checkpoint(c: Config) -> Vec<u8> {
    let (l, d, h, kv, v) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim(), c.vocab_size);
    let z = |n: usize| vec![0.0f32; n];
    let w = Weights {
        config: c,
        token_embedding: z(v * d),
        rms_att: z(l * d),
        wq: z(l * d * d),
        wk: z(l * kv * d),
        wv: z(l * kv * d),
        wo: z(l * d * d),
        rms_ffn: z(l * d),
        w1: z(l * h * d),
        w2: z(l * d * h),
        w3: z(l * h * d),
        rms_final: z(d),
        wcls: z(v * d),
    };
    bytes(&w, true)
}

/// The error of a checkpoint expected to fail (no Debug dump of the weights).
fn parse_err(b: &[u8]) -> CheckpointError {
    match checkpoint::parse(b) {
        Ok(w) => panic!("checkpoint with {:?} loaded", w.config),
        Err(e) => e,
    }
}

/// A checkpoint the loader accepts is one the model can run: before the fix a
/// head size above the attention kernel's 256 (or a count at or above 2^24)
/// loaded fine and the run then failed with a bare "invalid argument
/// (XTC_E_INVAL)" naming no field. Now the loader names it, from the header
/// alone (before any tensor is read).
#[test]
fn shapes_the_model_cannot_run_are_refused_naming_the_field() {
    let wide = Config {
        dim: 260,
        hidden_dim: 4,
        n_layers: 1,
        n_heads: 1,
        n_kv_heads: 1,
        vocab_size: 4,
        seq_len: 4,
    };
    let e = parse_err(&zero_checkpoint(wide));
    assert!(
        matches!(
            e,
            CheckpointError::Inconsistent {
                field: "n_heads",
                value: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("256"), "{e}");
    let ok = checkpoint::parse(&zero_checkpoint(Config { dim: 256, ..wide })).unwrap();
    ok.validate().unwrap();
    for (i, field) in ["dim", "hidden_dim", "n_layers", "vocab_size", "seq_len"]
        .into_iter()
        .enumerate()
    {
        let mut f = [8, 16, 1, 2, 1, 10, 4];
        let slot = [0, 1, 2, 5, 6][i];
        f[slot] = 1 << 24;
        if field == "dim" {
            f[3] = 1 << 16; // keep the head size legal: only the count is wrong
        }
        let e = parse_err(&header(f));
        assert!(
            matches!(e, CheckpointError::Inconsistent { field: got, .. } if got == field),
            "{field}: {e}"
        );
    }
}

/// A tokenizer for another vocabulary is an error saying so: before the fix
/// one with more tokens than the model's `vocab_size` loaded silently (the
/// text printed was another vocabulary's) and one with fewer said only
/// "tokenizer truncated in score of token N".
#[test]
fn tokenizer_of_another_vocabulary_is_refused() {
    use xtc_model::format::tokenizer::{self, Tokenizer, TokenizerError};
    let pieces = ["<unk>", "<s>", "</s>", " a", " b"];
    let bin = tokenizer::write(&pieces);
    assert_eq!(Tokenizer::parse(&bin, 5).unwrap().vocab_size(), 5);
    let more = Tokenizer::parse(&bin, 4).unwrap_err();
    assert_eq!(
        more,
        TokenizerError::VocabMismatch {
            tokens: Some(5),
            vocab_size: 4
        }
    );
    assert!(
        more.to_string().contains("5 tokens") && more.to_string().contains("vocab_size 4"),
        "{more}"
    );
    let fewer = Tokenizer::parse(&bin, 7).unwrap_err();
    assert_eq!(
        fewer,
        TokenizerError::VocabMismatch {
            tokens: Some(5),
            vocab_size: 7
        }
    );
    // Bytes after the last token that are no whole token: trailing garbage.
    let mut junk = bin.clone();
    junk.extend([1, 2, 3]);
    assert_eq!(
        Tokenizer::parse(&junk, 5).unwrap_err(),
        TokenizerError::VocabMismatch {
            tokens: None,
            vocab_size: 5
        }
    );
    // A file cut inside a token is still reported where it was cut.
    assert_eq!(
        Tokenizer::parse(&bin[..bin.len() - 1], 5).unwrap_err(),
        TokenizerError::Truncated {
            field: "piece",
            token: 4
        }
    );
}

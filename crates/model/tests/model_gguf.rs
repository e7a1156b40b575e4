//! Bad GGUF input, built in the test (no model file needed): every case is
//! a typed error naming the header field, key or tensor at fault, never a
//! panic or an allocation sized by the file.
//!
//! Cases: bad magic, bad version, every truncation, offsets past the end,
//! tensor data running past the end, absurd counts (tensors, keys, array
//! elements, string lengths), nesting, unsupported tensor types, bad value
//! types and values, duplicates, alignment, shapes; then the model level
//! (missing and mistyped keys, configs the kernels cannot run, missing
//! tensors, shape mismatches, norm types) and the tokenizer metadata.

use xtc_model::cpu::llama::{Llama, gguf_from_weights};
use xtc_model::format::gguf::{
    GgmlType, Gguf, GgufError, GgufWriter, RawTensor, Value, ValueType, string, string_array,
};
use xtc_model::text::bpe::Bpe;
use xtc_model::{Config, ModelError, Weights};

/// A tiny llama (dim 64, 4 layers, vocab 512) in Q4_1, tied head.
fn tiny() -> GgufWriter {
    gguf_from_weights(
        &Weights::synthetic(Config::tiny(), 1),
        GgmlType::Q4_1,
        10000.0,
        true,
    )
}

fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
    Gguf::from_bytes(bytes)
}

fn load(w: &GgufWriter) -> Result<Llama, ModelError> {
    Llama::from_gguf(Gguf::from_bytes(w.to_bytes()).map_err(ModelError::Gguf)?)
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A file with one metadata pair `key` = `value` and nothing else.
fn one_kv(key: &str, value: Value) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.kv(key, value);
    w.to_bytes()
}

#[test]
fn the_tiny_model_loads() {
    let m = load(&tiny()).unwrap();
    assert_eq!(m.config().shape, Config::tiny());
    assert!(m.config().tied_output);
}

#[test]
fn every_value_type_reads_back() {
    let values = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", string("héllo, wörld")),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-2.25e300)),
        ("t.empty", Value::Array(ValueType::F32, vec![])),
        ("t.strings", string_array(&["a", "", "ç"])),
        (
            "t.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::U16, vec![Value::U16(1), Value::U16(2)]),
                    Value::Array(ValueType::Bool, vec![Value::Bool(false)]),
                ],
            ),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.kv(k, v.clone());
    }
    let g = parse(w.to_bytes()).unwrap();
    assert_eq!(g.metadata().len(), values.len());
    for ((k, v), (rk, rv)) in values.iter().zip(g.metadata()) {
        assert_eq!((*k, v), (rk.as_str(), rv));
    }
    assert_eq!(g.f32("t.f32").unwrap(), 1.5e-5);
    assert_eq!(
        g.f32("t.f64").unwrap(),
        f32::NEG_INFINITY,
        "an f64 beyond f32 rounds to infinity"
    );
    assert_eq!(g.u32("t.u16").unwrap(), 60000);
    assert!(g.bool("t.bool").unwrap());
    assert_eq!(g.str_array("t.strings").unwrap(), ["a", "", "ç"]);
    assert!(matches!(g.u32("t.i64"), Err(GgufError::KeyType { .. })));
    assert!(matches!(
        g.str("t.u8"),
        Err(GgufError::KeyType {
            expected: "string",
            found: "u8",
            ..
        })
    ));
    assert_eq!(g.tensors().len(), 0);
}

#[test]
fn bad_magic_is_refused() {
    let mut b = tiny().to_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert_eq!(
        parse(b).unwrap_err(),
        GgufError::BadMagic { found: *b"GGML" }
    );
}

#[test]
fn unsupported_versions_are_refused() {
    for version in [0, 1, 4, u32::MAX] {
        let mut w = tiny();
        w.version = version;
        assert_eq!(
            parse(w.to_bytes()).unwrap_err(),
            GgufError::BadVersion { version }
        );
    }
    let mut w = tiny();
    w.version = 2;
    assert!(parse(w.to_bytes()).is_ok(), "version 2 has the same layout");
}

/// Every prefix of the file up to the data section, and a sample of those
/// inside it, is refused with a truncation error.
#[test]
fn every_truncation_is_a_typed_error() {
    let b = tiny().to_bytes();
    let data_offset = parse(b.clone()).unwrap().data_offset() as usize;
    let lens = (0..data_offset + 64).chain((data_offset + 64..b.len()).step_by(61));
    for len in lens {
        let e = parse(b[..len].to_vec()).expect_err("a truncated file parses");
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::AbsurdCount { .. }
                    | GgufError::OffsetPastEnd { .. }
                    | GgufError::TruncatedTensor { .. }
            ),
            "prefix of {len} bytes: {e}"
        );
    }
    let e = parse(b[..30].to_vec()).unwrap_err();
    assert!(e.to_string().contains("metadata_kv_count"), "{e}");
    // Cut inside the last tensor's name in the table.
    let at = b[..data_offset]
        .windows(18)
        .rposition(|s| s == b"output_norm.weight")
        .unwrap();
    let e = parse(b[..at + 5].to_vec()).unwrap_err();
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.starts_with("name of tensor")),
        "{e}"
    );
}

#[test]
fn an_empty_file_and_a_missing_one_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    match Gguf::open(&empty).unwrap_err() {
        GgufError::Truncated { what, .. } => assert_eq!(what, "magic"),
        other => panic!("{other}"),
    }
    let missing = dir.path().join("missing.gguf");
    assert!(matches!(
        Gguf::open(&missing).unwrap_err(),
        GgufError::Io { .. }
    ));
    let e = Llama::load(&missing).unwrap_err();
    assert!(matches!(e, ModelError::NotFound { .. }));
    assert!(e.to_string().contains("scripts/fetch-model.sh"), "{e}");
}

#[test]
fn offsets_past_the_end_are_refused() {
    let mut w = tiny();
    let t = &mut w.tensors_mut()[3];
    t.offset = Some(1 << 40);
    t.data.clear();
    let name = t.name.clone();
    match parse(w.to_bytes()).unwrap_err() {
        GgufError::OffsetPastEnd { tensor, offset, .. } => {
            assert_eq!((tensor, offset), (name, 1 << 40));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn tensor_data_running_past_the_end_is_refused() {
    let mut w = tiny();
    // A last tensor of exactly 128 bytes (aligned), then one byte cut.
    w.tensor("last", &[32], GgmlType::F32, vec![0; 128]);
    let mut b = w.to_bytes();
    b.pop();
    match parse(b).unwrap_err() {
        GgufError::TruncatedTensor { tensor, size, .. } => {
            assert_eq!((tensor.as_str(), size), ("last", 128))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut b = tiny().to_bytes();
    put_u64(&mut b, 8, u64::MAX);
    assert!(
        matches!(parse(b).unwrap_err(), GgufError::AbsurdCount { what, .. } if what == "tensor_count")
    );
    let mut b = tiny().to_bytes();
    put_u64(&mut b, 16, 1 << 60);
    assert!(
        matches!(parse(b).unwrap_err(), GgufError::AbsurdCount { what, .. } if what == "metadata_kv_count")
    );
    // Array of u32 under key "a.arr": its count is at 24 + (8 + 5) + 4 + 4.
    let mut b = one_kv(
        "a.arr",
        Value::Array(ValueType::U32, vec![Value::U32(1); 3]),
    );
    put_u64(&mut b, 45, u64::MAX / 2);
    match parse(b).unwrap_err() {
        GgufError::AbsurdCount { what, count, limit } => {
            assert!(what.contains("a.arr"), "{what}");
            assert_eq!(count, u64::MAX / 2);
            assert!(limit <= 16, "{limit}");
        }
        other => panic!("{other}"),
    }
    // A string value whose length runs past the end: at 24 + 13 + 4.
    let mut b = one_kv("a.str", string("hello"));
    put_u64(&mut b, 41, 1 << 50);
    assert!(
        matches!(parse(b).unwrap_err(), GgufError::Truncated { what, .. } if what.contains("a.str"))
    );
}

#[test]
fn nesting_is_bounded() {
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(1)]);
    for _ in 0..9 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    assert!(
        matches!(parse(one_kv("deep", v)).unwrap_err(), GgufError::NestingTooDeep { key } if key == "deep")
    );
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(1)]);
    for _ in 0..6 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    assert!(parse(one_kv("ok", v)).is_ok());
}

#[test]
fn unsupported_tensor_types_name_the_type_and_the_tensor() {
    for (ty, name) in [(12u32, "Q4_K"), (30, "BF16"), (6, "Q5_0"), (77, "unknown")] {
        let mut w = tiny();
        w.raw_tensor(RawTensor {
            name: "blk.0.odd".into(),
            dims: vec![256],
            ty,
            data: vec![0; 256],
            offset: None,
        });
        let e = parse(w.to_bytes()).unwrap_err();
        assert_eq!(
            e,
            GgufError::UnsupportedType {
                tensor: "blk.0.odd".into(),
                ty
            }
        );
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains("blk.0.odd"), "{msg}");
    }
}

#[test]
fn bad_value_types_and_values_are_refused() {
    // Value type id at 24 + 8 + 3 ("a.b").
    let mut b = one_kv("a.b", Value::U32(1));
    b[35..39].copy_from_slice(&13u32.to_le_bytes());
    assert_eq!(
        parse(b).unwrap_err(),
        GgufError::BadValueType {
            key: "a.b".into(),
            ty: 13
        }
    );
    let mut b = one_kv("a.b", Value::Bool(true));
    assert_eq!(b[39], 1);
    b[39] = 2;
    assert!(
        matches!(parse(b).unwrap_err(), GgufError::BadValue { what, .. } if what.contains("a.b"))
    );
    let mut b = one_kv("a.b", Value::U8(0));
    b[32] = 0xff; // the key's first byte: not UTF-8
    assert!(matches!(
        parse(b).unwrap_err(),
        GgufError::BadValue {
            why: "not UTF-8",
            ..
        }
    ));
}

#[test]
fn duplicate_keys_and_tensors_are_refused() {
    let mut w = GgufWriter::new();
    w.kv("a.x", Value::U8(1)).kv("a.y", Value::U8(2));
    let mut b = w.to_bytes();
    // Second key's last byte: 24 + (8 + 3 + 4 + 1) + 8 + 2.
    assert_eq!(b[50], b'y');
    b[50] = b'x';
    assert_eq!(
        parse(b).unwrap_err(),
        GgufError::DuplicateKey { key: "a.x".into() }
    );
    let mut w = GgufWriter::new();
    w.tensor("t.a", &[32], GgmlType::F32, vec![0; 128]).tensor(
        "t.b",
        &[32],
        GgmlType::F32,
        vec![0; 128],
    );
    let mut b = w.to_bytes();
    let at = b.windows(3).rposition(|s| s == b"t.b").unwrap();
    b[at + 2] = b'a';
    assert_eq!(
        parse(b).unwrap_err(),
        GgufError::DuplicateTensor {
            tensor: "t.a".into()
        }
    );
}

#[test]
fn alignment_must_be_a_u32_power_of_two_and_offsets_aligned() {
    assert_eq!(
        parse(one_kv("general.alignment", Value::U32(24))).unwrap_err(),
        GgufError::BadAlignment { value: 24 }
    );
    assert!(matches!(
        parse(one_kv("general.alignment", Value::U64(32))).unwrap_err(),
        GgufError::KeyType { key, .. } if key == "general.alignment"
    ));
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(64));
    w.tensor("a", &[32], GgmlType::F32, vec![0; 128]);
    w.raw_tensor(RawTensor {
        name: "b".into(),
        dims: vec![8],
        ty: 0,
        data: vec![0; 32],
        offset: Some(160),
    });
    assert_eq!(
        parse(w.to_bytes()).unwrap_err(),
        GgufError::Misaligned {
            tensor: "b".into(),
            offset: 160,
            alignment: 64
        }
    );
}

#[test]
fn bad_shapes_are_refused() {
    let cases: [(Vec<u64>, u32, &str); 5] = [
        (vec![], 0, "number of dimensions"),
        (vec![1, 1, 1, 1, 1], 0, "number of dimensions"),
        (vec![32, 0], 0, "is 0"),
        (vec![1 << 62, 4], 0, "overflows"),
        (vec![48, 2], 2, "block"),
    ];
    for (dims, ty, why) in cases {
        let mut w = GgufWriter::new();
        w.raw_tensor(RawTensor {
            name: "t".into(),
            dims: dims.clone(),
            ty,
            data: vec![0; 64],
            offset: None,
        });
        match parse(w.to_bytes()).unwrap_err() {
            e @ GgufError::BadShape { .. } => {
                assert!(
                    e.to_string().contains(why) && e.to_string().contains("`t`"),
                    "{dims:?}: {e}"
                )
            }
            other => panic!("{dims:?}: {other}"),
        }
    }
}

/// Random byte flips in the header, metadata and tensor table: any outcome
/// but a panic (the model is built too when the file still parses).
#[test]
fn corrupted_headers_never_panic() {
    let b = tiny().to_bytes();
    let end = parse(b.clone()).unwrap().data_offset() as usize;
    let mut rng = fastrand::Rng::with_seed(13);
    for _ in 0..3000 {
        let mut c = b.clone();
        for _ in 0..rng.usize(1..4) {
            let at = rng.usize(0..end);
            c[at] = rng.u8(..);
        }
        if let Ok(g) = Gguf::from_bytes(c) {
            let _ = Llama::from_gguf(g);
        }
    }
}

// ---- the model level -------------------------------------------------

fn config_err(w: &GgufWriter) -> (String, String) {
    match load(w).unwrap_err() {
        ModelError::Config { field, why, .. } => (field, why),
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn missing_and_mistyped_keys_are_named() {
    let mut w = tiny();
    w.remove_kv("llama.block_count");
    assert_eq!(
        load(&w).unwrap_err(),
        ModelError::Gguf(GgufError::MissingKey {
            key: "llama.block_count".into()
        })
    );
    let mut w = tiny();
    w.kv("llama.attention.layer_norm_rms_epsilon", string("small"));
    assert!(matches!(
        load(&w).unwrap_err(),
        ModelError::Gguf(GgufError::KeyType { key, .. }) if key == "llama.attention.layer_norm_rms_epsilon"
    ));
    let mut w = tiny();
    w.kv("llama.embedding_length", Value::I32(-64));
    assert!(matches!(
        load(&w).unwrap_err(),
        ModelError::Gguf(GgufError::KeyType { key, .. }) if key == "llama.embedding_length"
    ));
}

#[test]
fn configs_the_kernels_cannot_run_are_refused_naming_the_key() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "general.architecture",
            string("gpt2"),
            "general.architecture",
        ),
        (
            "llama.attention.head_count",
            Value::U32(5),
            "llama.attention.head_count",
        ),
        (
            "llama.attention.head_count_kv",
            Value::U32(3),
            "llama.attention.head_count_kv",
        ),
        // One query head over the tiny model's two KV heads.
        (
            "llama.attention.head_count",
            Value::U32(1),
            "llama.attention.head_count_kv",
        ),
        (
            "llama.embedding_length",
            Value::U32(80),
            "llama.embedding_length",
        ),
        (
            "llama.feed_forward_length",
            Value::U32(100),
            "llama.feed_forward_length",
        ),
        (
            "llama.rope.dimension_count",
            Value::U32(8),
            "llama.rope.dimension_count",
        ),
        ("llama.expert_count", Value::U32(8), "llama.expert_count"),
        (
            "llama.rope.scaling.type",
            string("yarn"),
            "llama.rope.scaling.type",
        ),
        (
            "llama.rope.freq_base",
            Value::F32(-1.0),
            "llama.rope.freq_base",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(0.0),
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "llama.context_length",
            Value::U32(0),
            "llama.context_length",
        ),
        (
            "llama.block_count",
            Value::U32(1 << 24),
            "llama.block_count",
        ),
    ];
    for (key, value, field) in cases {
        let mut w = tiny();
        w.kv(key, value.clone());
        let (got, why) = config_err(&w);
        assert_eq!(got, field, "{key} = {value:?}: {why}");
    }
    // A head size above 256: dim 576 over 1 head.
    let mut w = tiny();
    w.kv("llama.embedding_length", Value::U32(576))
        .kv("llama.attention.head_count", Value::U32(1));
    w.kv("llama.attention.head_count_kv", Value::U32(1));
    let (field, why) = config_err(&w);
    assert_eq!(field, "llama.attention.head_count");
    assert!(why.contains("576"), "{why}");
}

#[test]
fn missing_tensors_and_shape_mismatches_are_named() {
    let mut w = tiny();
    w.remove_tensor("blk.1.ffn_up.weight");
    assert_eq!(
        load(&w).unwrap_err(),
        ModelError::Gguf(GgufError::MissingTensor {
            tensor: "blk.1.ffn_up.weight".into()
        })
    );
    // attn_k with its dims swapped ([kv_dim, dim] instead of [dim, kv_dim]).
    let mut w = tiny();
    let t = w
        .tensors_mut()
        .iter_mut()
        .find(|t| t.name == "blk.2.attn_k.weight")
        .unwrap();
    t.dims = vec![32, 64];
    assert_eq!(
        load(&w).unwrap_err(),
        ModelError::Shape {
            tensor: "blk.2.attn_k.weight".into(),
            expected: vec![64, 32],
            found: vec![32, 64]
        }
    );
    // The embedding for a vocabulary other than llama.vocab_size.
    let mut w = tiny();
    w.kv("llama.vocab_size", Value::U32(500));
    assert!(
        matches!(load(&w).unwrap_err(), ModelError::Shape { tensor, .. } if tensor == "token_embd.weight")
    );
    // A norm vector in Q8_0.
    let mut w = tiny();
    w.tensor("blk.0.ffn_norm.weight", &[64], GgmlType::Q8_0, vec![0; 68]);
    assert!(matches!(
        load(&w).unwrap_err(),
        ModelError::TensorType { tensor, ty: GgmlType::Q8_0, .. } if tensor == "blk.0.ffn_norm.weight"
    ));
}

// ---- the tokenizer metadata ----------------------------------------------

fn tokenizer_kv(w: &mut GgufWriter) {
    let mut toks: Vec<String> = (0..=255u8)
        .map(|b| xtc_model::text::bpe::byte_char(b).to_string())
        .collect();
    toks.push("ab".into());
    toks.push("<|im_start|>".into());
    toks.push("<|im_end|>".into());
    let mut types = vec![Value::I32(1); toks.len()];
    types[257] = Value::I32(3);
    types[258] = Value::I32(3);
    w.kv("tokenizer.ggml.model", string("gpt2"))
        .kv("tokenizer.ggml.pre", string("smollm"))
        .kv("tokenizer.ggml.tokens", string_array(&toks))
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        )
        .kv("tokenizer.ggml.merges", string_array(&["a b"]))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(257))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(258));
}

fn bpe(w: &GgufWriter) -> Result<Bpe, ModelError> {
    Bpe::from_gguf(&Gguf::from_bytes(w.to_bytes()).unwrap())
}

#[test]
fn tokenizer_metadata_errors_name_the_key() {
    let mut w = GgufWriter::new();
    tokenizer_kv(&mut w);
    let t = bpe(&w).unwrap();
    assert_eq!(
        t.encode_with_specials("<|im_start|>ab<|im_end|>"),
        [257, 256, 258]
    );
    let key_of = |w: &GgufWriter| match bpe(w).unwrap_err() {
        ModelError::Tokenizer { key, .. } => key,
        ModelError::Gguf(GgufError::MissingKey { key }) => key,
        other => panic!("{other}"),
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "tokenizer.ggml.model",
            string("llama"),
            "tokenizer.ggml.model",
        ),
        ("tokenizer.ggml.pre", string("qwen2"), "tokenizer.ggml.pre"),
        (
            "tokenizer.ggml.merges",
            string_array(&["a b", "a zz"]),
            "tokenizer.ggml.merges[1]",
        ),
        (
            "tokenizer.ggml.merges",
            string_array(&["ab"]),
            "tokenizer.ggml.merges[0]",
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, vec![Value::I32(1)]),
            "tokenizer.ggml.token_type",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::U32(259),
            "tokenizer.ggml.eos_token_id",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            Value::U32(1 << 20),
            "tokenizer.ggml.bos_token_id",
        ),
    ];
    for (key, value, named) in cases {
        let mut w = GgufWriter::new();
        tokenizer_kv(&mut w);
        w.kv(key, value);
        assert_eq!(key_of(&w), named);
    }
    let mut w = GgufWriter::new();
    tokenizer_kv(&mut w);
    w.remove_kv("tokenizer.ggml.eos_token_id");
    assert_eq!(key_of(&w), "tokenizer.ggml.eos_token_id");
}

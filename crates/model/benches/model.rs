//! CPU reference of the GGUF model (issue 13), side by side in one run:
//!
//! - `matmul/{type}/m{M}`: the quantized product `[1536, 576] · x[M]` (one
//!   FFN matrix of SmolLM2-135M) per block format, M = 1 (decode) and 16
//!   (a batch of 16 streams, or a prefill chunk), portable and AVX2 kernel
//!   forms; criterion's elements/s = multiply-adds per second.
//! - `lm_head/m1`: the tied Q8_0 LM head `[49152, 576]` for one row.
//! - `decode_step`, `prefill16`, `batch16_decode` (needs the model file;
//!   skipped with a line when it is absent): one decode token of one stream
//!   at position 16, a 16-token prompt, and one decode token for each of 16
//!   streams in one forward pass. The per-token time of `decode_step` is one
//!   stream's tokens/s (`xtc generate` prints the same figure from a real
//!   run).
//!
//! Threads: rayon's default pool (one per core); `RAYON_NUM_THREADS=1`
//! measures one thread.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use xtc_model::cpu::llama::{Chunk, Llama, Logits};
use xtc_model::cpu::qmatmul::{Isa, best_isa, matmul_with};
use xtc_model::find_model;
use xtc_model::format::gguf::GgmlType;
use xtc_model::format::quant::{QMatrix, quantize};

fn matmuls(c: &mut Criterion) {
    let mut rng = fastrand::Rng::with_seed(1);
    let (rows, cols) = (1536, 576);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.f32() - 0.5).collect();
    let mut g = c.benchmark_group("matmul");
    let mut isas = vec![Isa::Baseline];
    if best_isa() == Isa::Avx2 {
        isas.push(Isa::Avx2);
    }
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::F32,
    ] {
        let bytes = quantize(ty, &w);
        let q = QMatrix::new(ty, rows, cols, &bytes).unwrap();
        for m in [1usize, 16] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.f32() - 0.5).collect();
            let mut y = vec![0f32; m * rows];
            g.throughput(Throughput::Elements((rows * cols * m) as u64));
            for &isa in &isas {
                let id = BenchmarkId::new(format!("{ty}/{isa:?}"), format!("m{m}"));
                g.bench_with_input(id, &m, |b, &m| {
                    b.iter(|| matmul_with(isa, &q, black_box(&x), m, &mut y))
                });
            }
        }
    }
    g.finish();
    let (rows, cols) = (49152, 576);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.f32() - 0.5).collect();
    let bytes = quantize(GgmlType::Q8_0, &w);
    let q = QMatrix::new(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
    let x: Vec<f32> = (0..cols).map(|_| rng.f32() - 0.5).collect();
    let mut y = vec![0f32; rows];
    let mut g = c.benchmark_group("lm_head");
    g.throughput(Throughput::Elements((rows * cols) as u64));
    g.bench_function("m1", |b| {
        b.iter(|| matmul_with(best_isa(), &q, black_box(&x), 1, &mut y))
    });
    g.finish();
}

fn model(c: &mut Criterion) {
    let model = match find_model(None).and_then(|p| Llama::load(&p)) {
        Ok(m) => m,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("model benches skipped: {e} (set CI=1 to make this a failure)");
            return;
        }
        Err(e) => panic!("CI is set but the model is missing or unreadable: {e}"),
    };
    let prompt: Vec<u32> = (0..16).map(|i| 100 + 37 * i).collect();
    let mut g = c.benchmark_group("model");
    g.sample_size(20);
    g.throughput(Throughput::Elements(1));
    let mut base = model.new_sequence();
    model
        .forward(&mut [Chunk {
            seq: &mut base,
            tokens: &prompt,
            logits: Logits::None,
        }])
        .unwrap();
    g.bench_function("decode_step", |b| {
        b.iter(|| {
            let mut seq = base.clone();
            model
                .forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &[42],
                    logits: Logits::Last,
                }])
                .unwrap()
        })
    });
    g.throughput(Throughput::Elements(16));
    g.bench_function("prefill16", |b| {
        b.iter(|| {
            let mut seq = model.new_sequence();
            model
                .forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &prompt,
                    logits: Logits::Last,
                }])
                .unwrap()
        })
    });
    g.bench_function("batch16_decode", |b| {
        b.iter(|| {
            let mut seqs: Vec<_> = (0..16).map(|_| base.clone()).collect();
            let toks: Vec<[u32; 1]> = (0..16).map(|i| [50 + i]).collect();
            let mut chunks: Vec<Chunk> = seqs
                .iter_mut()
                .zip(&toks)
                .map(|(seq, t)| Chunk {
                    seq,
                    tokens: t,
                    logits: Logits::Last,
                })
                .collect();
            model.forward(&mut chunks).unwrap()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(3));
    targets = matmuls, model
}
criterion_main!(benches);

//! The uniform windows of the kernel ABI (`vk::Window`,
//! `Recorder::dispatch_windowed`) and the windowed matmul (`matmul_win`) that
//! reads its operands through them on CPU devices (lavapipe).
//!
//! The windowed form must give exactly the bits of the storage-buffer CPU
//! forms (same arithmetic, K summed in order), also when the product is split
//! into chunks because its x rows or W rows do not fit one 64 KiB window, and
//! when a chunk boundary falls inside one of the regions of a split output
//! (q|k|v). Where it does not apply (K or an offset not a multiple of 4) the
//! storage form runs instead, with the same results.

mod rig_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use rig_support::{Rig, rand_vec};
use vk_support::max_abs_diff;
use xtc_model::cpu::f32_model;
use xtc_model::vulkan::ops::{Matmul, Op, Variant, Windowed};
use xtc_vk::{VkError, WINDOW_BYTES, WINDOWS, Window};

const TOL: f32 = 1e-4;

/// What one run of an op in both forms gives back.
struct Forms {
    /// Output with the windowed form.
    on: Vec<f32>,
    /// Output with the storage-buffer form.
    off: Vec<f32>,
    /// The windowed dispatches (`None`: not windowed) and the windows.
    chunks: Option<Vec<Windowed<Matmul>>>,
    windows: [Window; WINDOWS as usize],
}

impl Forms {
    fn n_chunks(&self) -> Option<usize> {
        self.chunks.as_ref().map(Vec::len)
    }

    fn same_bits(&self) -> bool {
        self.on.len() == self.off.len()
            && self
                .on
                .iter()
                .zip(&self.off)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

/// Runs `op` with windows on and off on the same inputs: each `(buffer,
/// element offset, data)` of `writes` is written first; `out` is `(element
/// offset, length)` of the activations to read back.
fn both_forms(
    dev: &xtc_vk::Device,
    elems: [usize; 5],
    writes: &[(usize, usize, &[f32])],
    op: Matmul,
    out: (usize, usize),
) -> Forms {
    let mut results = Vec::new();
    let mut chunks = None;
    let mut windows = None;
    for on in [true, false] {
        let mut rig = Rig::with_variant(dev, elems, Variant::Cpu);
        rig.ops = rig.ops.clone().with_windows(on);
        if on {
            let win = rig.windows();
            chunks = op.windowed(Variant::Cpu, &win);
            windows = Some(win);
        }
        for &(buf, at, data) in writes {
            rig.write(buf, at, data);
        }
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        results.push(rig.read::<f32>(1, out.0, out.1));
    }
    let off = results.pop().unwrap();
    let on = results.pop().unwrap();
    Forms {
        on,
        off,
        chunks,
        windows: windows.expect("set on the windowed run"),
    }
}

/// Plain products: one chunk, chunks over W rows (columns of y), chunks over
/// x rows, both; each bit-identical to the storage form and within tolerance
/// of the reference.
#[test]
fn windowed_matmul_is_bit_identical_to_the_storage_form_and_chunks_what_does_not_fit() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(11);
    let window_f32 = WINDOW_BYTES as usize / 4;
    // (m, n, k, least chunk count)
    let shapes = [
        (1, 128, 64, 1),
        (8, 130, 64, 1),
        (37, 300, 200, 4),  // W: 240 KB
        (100, 64, 192, 2),  // x: 76.8 KB
        (120, 200, 180, 6), // both: x 86.4 KB, W 144 KB
        (3, 5000, 4, 2),    // many thin rows of W
    ];
    for (m, n, k, least) in shapes {
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        let op = Matmul::plain(m as u32, n as u32, k as u32, 0, 0, (m * k) as u32, false);
        let elems = [n * k, m * k + m * n, 1, 1, 1];
        let f = both_forms(&dev, elems, &[(0, 0, &w), (1, 0, &x)], op, (m * k, m * n));
        let (on, off) = (&f.on, &f.off);
        let chunks = f
            .n_chunks()
            .unwrap_or_else(|| panic!("({m},{n},{k}) not windowed"));
        let need = (m * k).div_ceil(window_f32) * (n * k).div_ceil(window_f32);
        assert!(
            chunks >= least && chunks >= need,
            "({m},{n},{k}): {chunks} chunks"
        );
        assert!(
            f.same_bits(),
            "({m},{n},{k}) windowed differs from the storage form by {}",
            max_abs_diff(on, off)
        );
        let mut want = vec![0f32; n];
        for r in 0..m {
            f32_model::matmul(&mut want, &x[r * k..][..k], &w);
            let d = max_abs_diff(&on[r * n..][..n], &want);
            assert!(d <= TOL * (k as f32).sqrt(), "({m},{n},{k}) row {r}: {d}");
        }
    }
}

/// A split product (q|k|v) whose W is chunked at a column inside the third
/// region, accumulating (`x += W.h`) into an output behind the input; each
/// column lands in its own region, bit-identical to the storage form.
#[test]
fn windowed_split_and_accumulate_match_the_storage_form_across_chunk_boundaries() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(12);
    let (m, k) = (21usize, 100usize);
    let ns = [100u32, 50, 50]; // W: 200 rows x 400 B = 80 KB: a boundary near column 163
    let n = 200usize;
    let x = rand_vec(&mut rng, m * k);
    let w = rand_vec(&mut rng, n * k);
    // Regions in reverse order, apart from each other: y3 [m, 50], then y2
    // [m, 50] 8 elements later, then y1 [m, 100] at a multiple of 4 after it.
    let ys = [m * k + 2 * m * 50 + 100, m * k + m * 50 + 8, m * k];
    let len = ys[0] + m * 100 - m * k;
    let elems = [n * k, m * k + len, 1, 1, 1];
    let op = Matmul::split(m as u32, k as u32, ns, 0, 0, ys.map(|y| y as u32));
    let f = both_forms(&dev, elems, &[(0, 0, &w), (1, 0, &x)], op, (m * k, len));
    let (on, chunks) = (&f.on, f.n_chunks());
    assert!(chunks.is_some_and(|c| c >= 2), "{chunks:?}");
    assert!(f.same_bits());
    let mut want = vec![0f32; n];
    for r in 0..m {
        f32_model::matmul(&mut want, &x[r * k..][..k], &w);
        let mut col = 0;
        for (part, &np) in ns.iter().enumerate() {
            let np = np as usize;
            let at = ys[part] - m * k + r * np;
            let d = max_abs_diff(&on[at..at + np], &want[col..col + np]);
            assert!(d <= TOL * (k as f32).sqrt(), "part {part} row {r}: {d}");
            col += np;
        }
    }

    // Accumulate: y0 + x.W^T, windowed over an x that starts at element 4096.
    let (m, n, k) = (50usize, 96usize, 64usize);
    let x_off = 4096;
    let x = rand_vec(&mut rng, m * k);
    let w = rand_vec(&mut rng, n * k);
    let y_off = x_off + m * k;
    let op = Matmul::plain(
        m as u32,
        n as u32,
        k as u32,
        x_off as u32,
        0,
        y_off as u32,
        true,
    );
    let elems = [n * k, y_off + m * n, 1, 1, 1];
    let y0 = vec![0.5f32; m * n];
    let writes: [(usize, usize, &[f32]); 3] = [(0, 0, &w), (1, x_off, &x), (1, y_off, &y0)];
    let f = both_forms(&dev, elems, &writes, op, (y_off, m * n));
    assert!(f.same_bits());
    for r in 0..m {
        f32_model::matmul(&mut want[..n], &x[r * k..][..k], &w);
        let with_y: Vec<f32> = want[..n].iter().map(|v| v + 0.5).collect();
        assert!(
            max_abs_diff(&f.on[r * n..][..n], &with_y) <= TOL * 8.0,
            "row {r}"
        );
    }
}

/// K or an offset that is not a multiple of 4: no windowed form; the storage
/// form computes the same product.
#[test]
fn unaligned_operands_fall_back_to_the_storage_form() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(13);
    for (m, n, k, x_off) in [(9, 40, 30, 0), (9, 40, 32, 1), (5, 16, 8, 6)] {
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        let y = x_off + m * k;
        let op = Matmul::plain(
            m as u32,
            n as u32,
            k as u32,
            x_off as u32,
            0,
            y as u32,
            false,
        );
        let elems = [n * k, y + m * n, 1, 1, 1];
        let f = both_forms(&dev, elems, &[(0, 0, &w), (1, x_off, &x)], op, (y, m * n));
        let (on, off, chunks) = (&f.on, &f.off, f.n_chunks());
        assert_eq!(
            chunks, None,
            "({m},{n},{k}) at {x_off} must not be windowed"
        );
        assert_eq!(on, off);
        let mut want = vec![0f32; n];
        for r in 0..m {
            f32_model::matmul(&mut want, &x[r * k..][..k], &w);
            assert!(max_abs_diff(&on[r * n..][..n], &want) <= TOL * 6.0);
        }
    }
}

/// `dispatch_windowed` refuses offsets that are not aligned or whose window
/// would end past its buffer, and a transfer-only recorder; nothing is
/// recorded for a refused call.
#[test]
fn dispatch_windowed_refuses_bad_offsets() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rig = Rig::with_variant(&dev, [1 << 16, 1 << 16, 1, 1, 1], Variant::Cpu);
    let [w0, w1] = rig.windows();
    assert_eq!(w0.range, WINDOW_BYTES.min(w0.buffer));
    assert!(w0.align >= 16 && w0.align.is_multiple_of(16));
    let op = Matmul::plain(1, 4, 4, 0, 0, 64, false);
    let kernels = xtc_vk::Kernels::new(&dev).unwrap();
    let k = kernels.get("matmul_win").unwrap();
    let past_end = (w1.buffer - w1.range) / w1.align * w1.align + w1.align;
    let mut errors = Vec::new();
    rig.run(|_, rec| {
        for offs in [[w0.align / 2, 0], [0, past_end], [u64::MAX - 15, 0]] {
            errors.push(rec.dispatch_windowed(k, &op, [1, 1, 1], offs));
        }
        rec.dispatch_windowed(k, &op, [1, 1, 1], [0, 0]).unwrap();
    });
    for e in errors {
        assert!(matches!(e, Err(VkError::Inval(_))), "{e:?}");
    }
}

/// The windowed RMSNorm (one invocation per row, rows chunked to fit the
/// activation window) matches the reference like the storage form; a row
/// list (the LM head's gather) keeps the storage form.
#[test]
fn windowed_rmsnorm_chunks_rows_and_matches_the_reference() {
    use xtc_model::cpu::f32_model::EPS;
    use xtc_model::vulkan::ops::RmsNorm;
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(14);
    for (dim, rows, least) in [(64usize, 5usize, 1usize), (256, 80, 2), (4, 1, 1)] {
        let x: Vec<f32> = rand_vec(&mut rng, rows * dim)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let w = rand_vec(&mut rng, dim);
        let op = RmsNorm {
            n_rows: rows as u32,
            dim: dim as u32,
            in_off: 0,
            out_off: (rows * dim) as u32,
            w_off: 0,
            row_list: u32::MAX,
            eps: EPS,
            row_base: 0,
        };
        let listed = RmsNorm { row_list: 0, ..op };
        let mut rig = Rig::with_variant(&dev, [dim, 2 * rows * dim, 1, rows, 1], Variant::Cpu);
        let chunks = op.windowed(Variant::Cpu, &rig.windows()).map(|c| c.len());
        assert!(
            chunks.is_some_and(|c| c >= least),
            "dim {dim} rows {rows}: {chunks:?}"
        );
        assert!(listed.windowed(Variant::Cpu, &rig.windows()).is_none());
        rig.write(0, 0, &w);
        rig.write(1, 0, &x);
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let got: Vec<f32> = rig.read(1, rows * dim, rows * dim);
        let mut want = vec![0f32; dim];
        for r in 0..rows {
            f32_model::rmsnorm(&mut want, &x[r * dim..][..dim], &w);
            let d = max_abs_diff(&got[r * dim..][..dim], &want);
            assert!(d <= TOL, "dim {dim} rows {rows} row {r}: {d}");
        }
    }
}

/// Operands at the very end of their buffers: the windows cannot start at the
/// operands (offset + range would pass the buffer end), so they are clamped
/// back and the kernel reads from inside them; and operands that straddle
/// several placements. Same bits as the storage form.
#[test]
fn windows_clamped_at_the_buffer_end_read_the_right_elements() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(15);
    // (m, n, k, elements of act before y, gap between y and x)
    for (m, n, k, y_at, gap) in [
        (5usize, 40usize, 64usize, 20_000usize, 36usize),
        (70, 24, 96, 30_000, 4),
    ] {
        let y = y_at;
        let x_off = y + m * n + gap;
        let act_len = x_off + m * k; // x ends exactly at the buffer's end
        let w_pad = 20_000; // W ends at the weight buffer's end, after padding
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        let op = Matmul::plain(
            m as u32,
            n as u32,
            k as u32,
            x_off as u32,
            w_pad as u32,
            y as u32,
            false,
        );
        let elems = [w_pad + n * k, act_len, 1, 1, 1];
        let f = both_forms(
            &dev,
            elems,
            &[(0, w_pad, &w), (1, x_off, &x)],
            op,
            (y, m * n),
        );
        let (c, win) = (f.chunks.as_ref().expect("windowed"), f.windows);
        // Both buffers exceed a window, so the placements over the operands
        // at their ends are clamped: they start before the operand and end at
        // the buffer's end.
        assert!(win[0].buffer > win[0].range && win[1].buffer > win[1].range);
        assert!(
            c.iter()
                .any(|d| d.offsets[1] + win[1].range == win[1].buffer && d.push.x_off > 0),
            "({m},{n},{k}): x window not clamped"
        );
        assert!(
            c.iter()
                .any(|d| d.offsets[0] + win[0].range == win[0].buffer && d.push.w_off > 0),
            "({m},{n},{k}): W window not clamped"
        );
        assert!(f.same_bits());
        let mut want = vec![0f32; n];
        for r in 0..m {
            f32_model::matmul(&mut want, &x[r * k..][..k], &w);
            let d = max_abs_diff(&f.on[r * n..][..n], &want);
            assert!(d <= TOL * (k as f32).sqrt(), "({m},{n},{k}) row {r}: {d}");
        }
    }
}

/// Rows of K = 4096 and more fill a 64 KiB window with 4 rows or fewer: the
/// windowed form then split a product into one dispatch per handful of
/// outputs (K = 16384: one per output) and ran 2-20x slower on lavapipe than
/// the storage forms it claims to beat, so it must not apply there; it still
/// applies where a window holds 8 rows (K = 2048) or the whole operand.
#[test]
fn long_rows_that_leave_a_window_few_rows_take_the_storage_form() {
    let big = Window {
        range: WINDOW_BYTES,
        align: 16,
        buffer: 1 << 30,
    };
    let win = [big; 2];
    for (m, n, k) in [
        (1, 4096, 4096),
        (16, 1024, 4096),
        (8, 512, 11008),
        (64, 256, 16384),
    ] {
        let op = Matmul::plain(m, n, k, 0, 0, m * k, false);
        assert!(
            op.windowed(Variant::Cpu, &win).is_none(),
            "({m},{n},{k}) windowed"
        );
    }
    for (m, n, k) in [(1, 768, 2048), (64, 768, 2048), (32, 32000, 288)] {
        let op = Matmul::plain(m, n, k, 0, 0, m * k, false);
        assert!(op.windowed(Variant::Cpu, &win).is_some(), "({m},{n},{k})");
    }
    // A weight of 3 rows of K = 4096 in a 48 KiB buffer: the window holds
    // the whole operand, so the form applies.
    let small = Window {
        range: 3 * 4096 * 4,
        align: 16,
        buffer: 3 * 4096 * 4,
    };
    let op = Matmul::plain(1, 3, 4096, 0, 0, 4096, false);
    assert!(op.windowed(Variant::Cpu, &[small, big]).is_some());
}

// Generator of `qmatmul.wgsl`: the quantized matrix products and embedding
// lookups of the GGUF Vulkan model (Q4_1, Q8_0, F16, F32 weights; Q4_0 is
// uploaded as Q4_1).
//
// Run by the Vulkan crate's build script (`crates/vk/build/qmatmul_gen.rs`),
// so the WGSL is produced at build time and never committed. The CPU-device
// forms are unrolled here (`subgroupBroadcast` needs a constant lane, and
// llvmpipe keeps unrolled straight-line code in registers), which is why the
// WGSL is generated rather than written.
//
// The file holds, in order: the header comment and the shared prelude
// (parameters, bindings, store and unpacking helpers), the GPU form's shared
// declarations, the block dequantizers, then per weight type the CPU-form
// products for each row count, the GPU-form product and the two embedding
// lookups. Pure std, deterministic output, and no inner attributes or doc
// comments, so a build script can `include!` it or declare it as a module.

use std::fmt::Write as _;

/// Token rows per invocation of the CPU form: one kernel `qmm_<ty>_r<R>` each.
const ROWS: [u32; 4] = [1, 2, 4, 8];
/// Output rows (columns n of y) per invocation of the CPU form.
const C: u32 = 4;
/// Row tiles of the CPU form's `_rkv` twins (the q|k|v product with RoPE
/// and the KV-cache append fused into its stores; the host's tiles stop at
/// 4 rows), for the block formats with scales (Q4_1, Q8_0).
const RKV_ROWS: [u32; 3] = [1, 2, 4];
/// Q4_1 codes are masked in place against x scaled by powers of two (one AND
/// and one conversion per code instead of a shift, an AND and a conversion) up
/// to this many rows per invocation: measured 4-9% faster at one row, even at
/// four (where the unpacking is shared by four rows and the scaling is paid
/// per row).
const MASKED_ROWS: u32 = 2;
/// CPU-form workgroup size: one llvmpipe subgroup of 8 lanes. Measured against
/// 16 (two subgroups) in the same run: about 2x faster at every shape and row
/// count (576x576 at M = 1: 22.6 against 12.4 GFLOP/s; at M = 32 with 4 rows:
/// 49.6 against 25.4), and twice the workgroups to spread over the threads.
const WG: u32 = 8;

/// Appends one formatted line to a `String`, indented by `depth` levels of 4
/// spaces, and its newline.
macro_rules! emit {
    ($out:expr, $depth:literal, $($fmt:tt)*) => {{
        $out.push_str(&"    ".repeat($depth));
        writeln!($out, $($fmt)*).expect("formatting into a String cannot fail")
    }};
}

/// A weight block format as the kernels read it (32 elements a block).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ty {
    /// Q4_1 (and Q4_0, uploaded as Q4_1): 16 nibble bytes, `w = d*q + m`.
    Q41,
    /// Q8_0: 32 signed bytes, `w = d*q`.
    Q80,
    /// binary16 elements, no scale.
    F16,
    /// f32 elements, no scale.
    F32,
}

impl Ty {
    /// Every type, in the order the file lists them.
    const ALL: [Ty; 4] = [Ty::Q41, Ty::Q80, Ty::F16, Ty::F32];

    /// The suffix of the kernel names (`qmm_<name>_*`, `deq_<name>_*`).
    fn name(self) -> &'static str {
        match self {
            Ty::Q41 => "q41",
            Ty::Q80 => "q80",
            Ty::F16 => "f16",
            Ty::F32 => "f32",
        }
    }

    /// Code texels (16 bytes each) per 32-element block.
    fn texels(self) -> u32 {
        match self {
            Ty::Q41 => 1,
            Ty::Q80 => 2,
            Ty::F16 => 4,
            Ty::F32 => 8,
        }
    }

    /// Whether the blocks carry a `(d, m)` scale texel.
    fn has_scales(self) -> bool {
        matches!(self, Ty::Q41 | Ty::Q80)
    }
}

/// Where the texel stream is read from.
#[derive(Clone, Copy)]
enum Src {
    /// The weight image (binding 8), CPU devices.
    Img,
    /// The weights buffer (binding 0), GPUs.
    Buf,
}

impl Src {
    /// Both sources, in the order the file lists them.
    const ALL: [Src; 2] = [Src::Img, Src::Buf];

    /// The suffix of the dequantizer names (`deq_<ty>_<name>`).
    fn name(self) -> &'static str {
        match self {
            Src::Img => "img",
            Src::Buf => "buf",
        }
    }

    /// The WGSL function that fetches texel i.
    fn fetch(self) -> &'static str {
        match self {
            Src::Img => "wtex",
            Src::Buf => "wbuf_tex",
        }
    }
}

/// Returns the complete text of qmatmul.wgsl.
pub fn generate() -> String {
    let mut out = String::with_capacity(320 * 1024);
    out.push_str(HEADER);
    out.push_str(PRELUDE);
    out.push_str(GPU_COMMON);
    for ty in Ty::ALL {
        for src in Src::ALL {
            dequant_fn(&mut out, ty, src);
        }
    }
    for ty in Ty::ALL {
        for rows in ROWS {
            cpu_kernel(&mut out, ty, rows, false);
        }
        if ty.has_scales() {
            for rows in RKV_ROWS {
                cpu_kernel(&mut out, ty, rows, true);
            }
        }
        gpu_kernel(&mut out, ty, 4);
        gpu_kernel(&mut out, ty, 8);
        gpu_mm_kernel(&mut out, ty);
        embed_kernel(&mut out, ty, Src::Img);
        embed_kernel(&mut out, ty, Src::Buf);
    }
    out
}

/// `fn deq_<ty>_<src>(qs_off, sc_off, n, nb, b) -> array<vec4<f32>, 8>`: block
/// `b` of row `n` of a matrix dequantized to 8 vec4 (elements 4t .. 4t+3),
/// its texels fetched from the image (`img`) or the buffer (`buf`). Used by
/// the GPU-form products and the embedding lookups.
fn dequant_fn(out: &mut String, ty: Ty, src: Src) {
    let (name, s, f) = (ty.name(), src.name(), src.fetch());
    emit!(
        out,
        0,
        "fn deq_{name}_{s}(qs_off: u32, sc_off: u32, n: u32, nb: u32, b: u32) -> array<vec4<f32>, 8> {{"
    );
    emit!(out, 1, "var o: array<vec4<f32>, 8>;");
    emit!(out, 1, "let pb = (n / 32u) * nb + b;");
    emit!(out, 1, "let j = n % 32u;");
    let blk = "pb * 32u + j";
    if ty.has_scales() {
        emit!(
            out,
            1,
            "let dm = unpack2x16float({f}(sc_off + pb * 8u + j / 4u)[j % 4u]);"
        );
    }
    match ty {
        Ty::Q41 => {
            emit!(out, 1, "let w = {f}(qs_off + {blk});");
            for t in 0..4 {
                emit!(out, 1, "o[{t}] = nib_lo(w[{t}u]) * dm.x + dm.y;");
                emit!(out, 1, "o[{}] = nib_hi(w[{t}u]) * dm.x + dm.y;", t + 4);
            }
        }
        Ty::Q80 => {
            for h in 0..2 {
                emit!(out, 1, "let w{h} = {f}(qs_off + 2u * ({blk}) + {h}u);");
                for t in 0..4 {
                    emit!(out, 1, "o[{}] = i8x4(w{h}[{t}u]) * dm.x;", 4 * h + t);
                }
            }
        }
        Ty::F16 => {
            for h in 0..4 {
                emit!(out, 1, "let w{h} = {f}(qs_off + 4u * ({blk}) + {h}u);");
                for t in 0..2 {
                    let (o, lo, hi) = (2 * h + t, 2 * t, 2 * t + 1);
                    emit!(
                        out,
                        1,
                        "o[{o}] = vec4<f32>(unpack2x16float(w{h}[{lo}u]), unpack2x16float(w{h}[{hi}u]));"
                    );
                }
            }
        }
        Ty::F32 => {
            for h in 0..8 {
                emit!(
                    out,
                    1,
                    "o[{h}] = bitcast<vec4<f32>>({f}(qs_off + 8u * ({blk}) + {h}u));"
                );
            }
        }
    }
    emit!(out, 1, "return o;");
    emit!(out, 0, "}}");
}

/// `qmm_<ty>_r<R>`, the CPU form (lavapipe; subgroups of at least 8 lanes):
/// workgroup of 8 lanes, each invocation computes 4 consecutive outputs n for
/// R consecutive rows m, x broadcast lane to lane from the activation window,
/// weights fetched from the image as whole texels, all unrolled.
fn cpu_kernel(out: &mut String, ty: Ty, rows: u32, rkv: bool) {
    cpu_prologue(out, ty, rows, rkv);
    emit!(out, 1, "for (var b = 0u; b < nb; b++) {{");
    cpu_load_x(out, ty, rows);
    match ty {
        Ty::Q41 => cpu_dot_q41(out, rows),
        _ => cpu_dot_texels(out, ty, rows),
    }
    cpu_scale(out, ty, rows);
    emit!(out, 1, "}}");
    cpu_epilogue(out, rows, rkv);
}

/// The CPU form's signature, indices and accumulators.
fn cpu_prologue(out: &mut String, ty: Ty, rows: u32, rkv: bool) {
    let (name, t) = (ty.name(), ty.texels());
    let suffix = if rkv { "_rkv" } else { "" };
    emit!(
        out,
        0,
        r#"
@compute @workgroup_size({WG})
fn qmm_{name}_r{rows}{suffix}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) sl: u32) {{
    let col = wg.y * {WG}u + li;
    let c0 = col * {C}u; // past N: zero rows of the last panel, never stored
    let live = c0 < p.n;
    let r0 = wg.x * {rows}u;
    let norm = p.norm_off != NO_NORM;
    let g0 = p.norm_off / 4u + (sl & 7u);
    let nb = p.k / 32u;
    let k4 = p.k / 4u;
    let q0 = p.qs_off + ((c0 / 32u) * nb * 32u + c0 % 32u) * {t}u; // + b * 32 T + c T + h
    let s0 = p.sc_off + (c0 / 32u) * nb * 8u + (c0 % 32u) / 4u; // + b * 8"#
    );
    for r in 0..rows {
        emit!(
            out,
            1,
            "let xr{r} = p.x_off / 4u + min(r0 + {r}u, p.m - 1u) * k4 + (sl & 7u);"
        );
        emit!(out, 1, "var ss{r} = 0.0;");
        for c in 0..C {
            emit!(out, 1, "var y{r}_{c} = 0.0;");
        }
    }
}

/// Per block: this lane's vec4 of x for each row (scaled by the norm weights
/// when fused), its sum of squares, and zeroed block accumulators.
fn cpu_load_x(out: &mut String, ty: Ty, rows: u32) {
    emit!(out, 2, "var g = vec4<f32>(1.0);");
    emit!(out, 2, "if (norm) {{ g = wwin.v[g0 + b * 8u]; }}");
    for r in 0..rows {
        emit!(out, 2, "let raw{r} = xwin.v[xr{r} + b * 8u];");
        emit!(out, 2, "ss{r} += dot(raw{r}, raw{r});");
        emit!(out, 2, "let mine{r} = raw{r} * g;");
        for c in 0..C {
            emit!(out, 2, "var a{r}_{c} = 0.0;");
        }
        if ty == Ty::Q41 {
            emit!(out, 2, "var xs{r} = 0.0;");
        }
    }
}

/// Q4_1 block dot products: one code texel per output, word t holding
/// elements 4t .. 4t+3 (low nibbles) and 4t+16 .. 4t+19 (high nibbles); the
/// sum of x (`xs`) is kept for the `m` term. Up to [`MASKED_ROWS`] rows the
/// codes are masked in place (q * 2^s, exact as f32) against x scaled by
/// 2^-s: one AND and one conversion per code.
fn cpu_dot_q41(out: &mut String, rows: u32) {
    for c in 0..C {
        emit!(out, 2, "let w{c} = wtex(q0 + b * 32u + {c}u);");
    }
    for t in 0..4 {
        let high = t + 4; // the vec4 of x the high nibbles of word t multiply
        emit!(out, 2, "{{");
        for r in 0..rows {
            emit!(out, 3, "let xa{r} = subgroupBroadcast(mine{r}, {t}u);");
            emit!(out, 3, "let xb{r} = subgroupBroadcast(mine{r}, {high}u);");
            emit!(out, 3, "xs{r} += dot(xa{r} + xb{r}, vec4<f32>(1.0));");
        }
        let masked = rows <= MASKED_ROWS;
        if masked {
            for r in 0..rows {
                emit!(out, 3, "let sa{r} = xa{r} * LO_SCALE;");
                emit!(out, 3, "let sb{r} = xb{r} * HI_SCALE;");
            }
        }
        for c in 0..C {
            if masked {
                emit!(
                    out,
                    3,
                    "let lo{c} = vec4<f32>(vec4<u32>(w{c}[{t}u]) & LO_MASK);"
                );
                emit!(
                    out,
                    3,
                    "let hi{c} = vec4<f32>(vec4<u32>(w{c}[{t}u]) & HI_MASK);"
                );
            } else {
                emit!(out, 3, "let lo{c} = nib_lo(w{c}[{t}u]);");
                emit!(out, 3, "let hi{c} = nib_hi(w{c}[{t}u]);");
            }
        }
        let (xa, xb) = if masked { ("sa", "sb") } else { ("xa", "xb") };
        for r in 0..rows {
            for c in 0..C {
                emit!(
                    out,
                    3,
                    "a{r}_{c} += dot(lo{c}, {xa}{r}) + dot(hi{c}, {xb}{r});"
                );
            }
        }
        emit!(out, 2, "}}");
    }
}

/// Q8_0 / F16 / F32 block dot products: T code texels per output, each
/// covering 8 / T of the block's vec4 groups u of x (texel h = u / (8 / T)).
fn cpu_dot_texels(out: &mut String, ty: Ty, rows: u32) {
    let t = ty.texels();
    let per = 8 / t; // vec4 groups per texel (q80: 4, f16: 2, f32: 1)
    for h in 0..t {
        emit!(out, 2, "{{");
        for c in 0..C {
            let (step, texel) = (32 * t, c * t + h);
            emit!(out, 3, "let w{c} = wtex(q0 + b * {step}u + {texel}u);");
        }
        for g in 0..per {
            let u = h * per + g;
            for r in 0..rows {
                emit!(out, 3, "let x{r}_{g} = subgroupBroadcast(mine{r}, {u}u);");
            }
            for c in 0..C {
                match ty {
                    Ty::Q80 => emit!(out, 3, "let v{c}_{g} = i8x4(w{c}[{g}u]);"),
                    Ty::F16 => {
                        let (lo, hi) = (2 * g, 2 * g + 1);
                        emit!(
                            out,
                            3,
                            "let v{c}_{g} = vec4<f32>(unpack2x16float(w{c}[{lo}u]), unpack2x16float(w{c}[{hi}u]));"
                        );
                    }
                    _ => emit!(out, 3, "let v{c}_{g} = bitcast<vec4<f32>>(w{c});"),
                }
            }
            for r in 0..rows {
                for c in 0..C {
                    emit!(out, 3, "a{r}_{c} += dot(v{c}_{g}, x{r}_{g});");
                }
            }
        }
        emit!(out, 2, "}}");
    }
}

/// Folds the block accumulators into the outputs, through the block's
/// `(d, m)` scales for Q4_1 / Q8_0.
fn cpu_scale(out: &mut String, ty: Ty, rows: u32) {
    if !ty.has_scales() {
        for r in 0..rows {
            for c in 0..C {
                emit!(out, 2, "y{r}_{c} += a{r}_{c};");
            }
        }
        return;
    }
    emit!(out, 2, "let sc = wtex(s0 + b * 8u);");
    for c in 0..C {
        emit!(out, 2, "let dm{c} = unpack2x16float(sc[{c}u]);");
    }
    for r in 0..rows {
        for c in 0..C {
            if ty == Ty::Q41 {
                emit!(out, 2, "y{r}_{c} += dm{c}.x * a{r}_{c} + dm{c}.y * xs{r};");
            } else {
                emit!(out, 2, "y{r}_{c} += dm{c}.x * a{r}_{c};");
            }
        }
    }
}

/// The fused norm's factors, the argmax partials (mode 3) and the stores.
fn cpu_epilogue(out: &mut String, rows: u32, rkv: bool) {
    let store = if rkv { "store4_rkv" } else { "store4" };
    let ys = |r: u32| {
        (0..C)
            .map(|c| format!("y{r}_{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in 0..rows {
        emit!(out, 1, "let inv{r} = inv_rms(subgroupAdd(ss{r}));");
    }
    emit!(out, 1, "if ((p.mode & 255u) == 3u) {{");
    for r in 0..rows {
        let y = ys(r);
        emit!(
            out,
            2,
            "partial(p.m_base + r0 + {r}u, r0 + {r}u < p.m, live, col, c0, vec4<f32>({y}) * inv{r}, sl);"
        );
    }
    emit!(out, 1, "}}");
    emit!(out, 1, "if (!live) {{ return; }}");
    for r in 0..rows {
        let y = ys(r);
        emit!(out, 1, "if (r0 + {r}u < p.m) {{");
        emit!(
            out,
            2,
            "{store}(p.m_base + r0 + {r}u, c0, vec4<f32>({y}) * inv{r});"
        );
        emit!(out, 1, "}}");
    }
    emit!(out, 0, "}}");
}

/// `qmm_<ty>_gpu` and `qmm_<ty>_gpu8`, the GPU form: workgroup 64 = 4
/// outputs x 16 threads, 4 (or 8) rows m per workgroup, x staged through
/// workgroup memory 512 columns at a time, each thread taking every 16th
/// block of its output row through `deq_<ty>_buf`, partial sums reduced in
/// workgroup memory. The 8-row form dequantizes each weight block once per 8
/// rows; a row's element goes to the same invocation and its sums run in the
/// same order in both, so a row's results are the same bits in either.
fn gpu_kernel(out: &mut String, ty: Ty, rows: u32) {
    let ty = ty.name();
    let (suffix, xsh, acc) = match rows {
        4 => ("", "xsh", "vec4<f32>(0.0)"),
        _ => (
            "8",
            "xsh8",
            "array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)",
        ),
    };
    write!(
        out,
        r#"
@compute @workgroup_size(64)
fn qmm_{ty}_gpu{suffix}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = wg.x * 4u + li / 16u;
    let j = li % 16u;
    let r0 = wg.y * {rows}u;
    let nb = p.k / 32u;
    let norm = p.norm_off != NO_NORM;
    var acc = {acc}; // rows r0 .. r0 + {rows} - 1
    var ss = {acc}; // this thread's share of each row's sum of squares
    // Only the rows that exist are staged and multiplied (one of the four
    // at one row), and of the last step's columns only those that exist;
    // a staged element goes to the same invocation, in the same order,
    // whatever the rows, so the sums are the same.
    let rows = min({rows}u, p.m - r0);
    for (var k0 = 0u; k0 < p.k; k0 += GT) {{
        let cols = min(GT, p.k - k0);
        for (var i = li; i < rows * GT; i += 64u) {{
            let r = i / GT;
            let c = i % GT;
            if (c < cols) {{
                var v = act[p.x_off + (r0 + r) * p.k + k0 + c];
                ss[r] += v * v;
                if (norm) {{
                    let e = p.norm_off + k0 + c;
                    v *= bitcast<f32>(wbuf[e / 4u][e % 4u]);
                }}
                {xsh}[i] = v;
            }}
        }}
        workgroupBarrier();
        let b = k0 / 32u + j;
        if (j < cols / 32u && n < p.n) {{
            let w = deq_{ty}_buf(p.qs_off, p.sc_off, n, nb, b);
            for (var r = 0u; r < rows; r++) {{
                var s = 0.0;
                for (var t = 0u; t < 8u; t++) {{
                    let e = r * GT + j * 32u + 4u * t;
                    s += dot(w[t], vec4<f32>({xsh}[e], {xsh}[e + 1u], {xsh}[e + 2u], {xsh}[e + 3u]));
                }}
                acc[r] += s;
            }}
        }}
        workgroupBarrier();
    }}
"#
    )
    .expect("formatting into a String cannot fail");
    match rows {
        4 => out.push_str(GPU_EPILOGUE),
        _ => out.push_str(&gpu_epilogue8()),
    }
}

/// [`GPU_EPILOGUE`] for 8 rows a workgroup (`qmm_<ty>_gpu8`): the same
/// reductions, in the same order per row, over `red8`, `red2_8` and
/// `outv8`.
fn gpu_epilogue8() -> String {
    GPU_EPILOGUE
        .replace("red[", "red8[")
        .replace("red2[", "red2_8[")
        .replace("outv[", "outv8[")
        .replace(
            "for (var r = 0u; r < 4u; r++)",
            "for (var r = 0u; r < 8u; r++)",
        )
        .replace("li * 4u + r", "li * 8u + r")
        .replace("if (j < 4u)", "if (j < 8u)")
        .replace("(base + t) * 4u + r", "(base + t) * 8u + r")
        .replace("t * 4u + r", "t * 8u + r")
        .replace("(li / 16u) * 4u + r", "(li / 16u) * 8u + r")
        .replace("if (li < 16u)", "if (li < 32u)")
        .replace("let slot = li / 4u;", "let slot = li / 8u;")
        .replace("let r = li % 4u;", "let r = li % 8u;")
        .replace("slot * 4u + r", "slot * 8u + r")
        .replace("(slot + 1u) * 4u + r", "(slot + 1u) * 8u + r")
        .replace("c * 4u + r", "c * 8u + r")
}

/// `qmm_<ty>_gpu_mm`, the GPU form's tiled product for many rows: a
/// workgroup of 128 computes a tile of 32 rows x 64 outputs (each thread 4
/// rows x 4 consecutive outputs, 16 accumulators), stepping K two blocks (64
/// columns) at a time through workgroup memory: x staged as [column][row
/// quad], W dequantized once per tile into [column][output quad], so each
/// weight block is read and dequantized once per 32 rows instead of once per
/// 4, and each pair of vec4 loads from workgroup memory feeds 16 FMAs. Same
/// parameters and modes as `qmm_<ty>_gpu` (the argmax partials of mode 3 are
/// per 4 outputs, one thread's); grid (ceil(N / 64), ceil(m / 32)).
fn gpu_mm_kernel(out: &mut String, ty: Ty) {
    let ty = ty.name();
    write!(
        out,
        r#"
@compute @workgroup_size(128)
fn qmm_{ty}_gpu_mm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n0 = wg.x * 64u;
    let r0 = wg.y * 32u;
    let tx = li % 16u; // outputs n0 + 4 tx .. + 3
    let ty = li / 16u; // rows r0 + 4 ty .. + 3
    let nb = p.k / 32u;
    let norm = p.norm_off != NO_NORM;
    let sr = li / 4u; // the x row this thread stages
    let sc = (li % 4u) * 16u; // its first staged column of the step
    let wo = li % 64u; // the W row (output n0 + wo) this thread dequantizes
    let wh = li / 64u; // and which block of the step's two
    var acc: array<vec4<f32>, 4>;
    var ss = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += 64u) {{
        for (var i = 0u; i < 16u; i++) {{
            let c = sc + i;
            var v = 0.0;
            if (r0 + sr < p.m && k0 + c < p.k) {{
                v = act[p.x_off + (r0 + sr) * p.k + k0 + c];
                ss += v * v;
                if (norm) {{
                    let e = p.norm_off + k0 + c;
                    v *= bitcast<f32>(wbuf[e / 4u][e % 4u]);
                }}
            }}
            mm_x[c * 8u + sr / 4u][sr % 4u] = v;
        }}
        let b = k0 / 32u + wh;
        var w: array<vec4<f32>, 8>;
        if (b < nb && n0 + wo < p.n) {{
            w = deq_{ty}_buf(p.qs_off, p.sc_off, n0 + wo, nb, b);
        }}
        for (var t = 0u; t < 8u; t++) {{
            for (var e = 0u; e < 4u; e++) {{
                mm_w[(wh * 32u + 4u * t + e) * 16u + wo / 4u][wo % 4u] = w[t][e];
            }}
        }}
        workgroupBarrier();
        for (var c = 0u; c < 64u; c++) {{
            let xv = mm_x[c * 8u + ty];
            let wv = mm_w[c * 16u + tx];
            acc[0] += xv.x * wv;
            acc[1] += xv.y * wv;
            acc[2] += xv.z * wv;
            acc[3] += xv.w * wv;
        }}
        workgroupBarrier();
    }}
    mm_ss[li] = ss;
    workgroupBarrier();
    let c0 = n0 + 4u * tx;
    for (var i = 0u; i < 4u; i++) {{
        let rr = 4u * ty + i;
        let row = r0 + rr;
        if (row >= p.m || c0 >= p.n) {{
            continue;
        }}
        let q = 4u * rr;
        let v = acc[i] * inv_rms(mm_ss[q] + mm_ss[q + 1u] + mm_ss[q + 2u] + mm_ss[q + 3u]);
        let mode = p.mode & 255u;
        if (mode == 2u) {{
            let o = p.y_off + (p.m_base + row) * (p.n / 2u) + c0 / 2u;
            act[o] = silu(v.x) * v.y;
            if (c0 + 2u < p.n) {{
                act[o + 1u] = silu(v.z) * v.w;
            }}
            continue;
        }}
        for (var e = 0u; e < 4u; e++) {{
            if (c0 + e < p.n) {{
                store(p.m_base + row, c0 + e, v[e]);
            }}
        }}
        if (mode == 3u) {{
            var best = v.x;
            var bi = c0;
            for (var e = 1u; e < 4u; e++) {{
                if (c0 + e < p.n && v[e] > best) {{
                    best = v[e];
                    bi = c0 + e;
                }}
            }}
            let o = p.y2_off + ((p.m_base + row) * (p.n / 4u) + c0 / 4u) * 2u;
            act[o] = best;
            act[o + 1u] = bitcast<f32>(bi);
        }}
    }}
}}
"#
    )
    .expect("formatting into a String cannot fail");
}

/// `qembed_<ty>` (image) / `qembed_<ty>_buf` (buffer): `x[r, :]` = the
/// dequantized row `token(r)` of the table, one invocation per (row, block).
fn embed_kernel(out: &mut String, ty: Ty, src: Src) {
    let suffix = match src {
        Src::Img => "",
        Src::Buf => "_buf",
    };
    let (ty, src) = (ty.name(), src.name());
    write!(
        out,
        r#"
@compute @workgroup_size(64)
fn qembed_{ty}{suffix}(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let nb = p.k / 32u;
    let b = gid.x;
    let r = gid.y;
    if (b >= nb || r >= p.m) {{
        return;
    }}
    let tok = md[p.x_off + r * 4u];
    let w = deq_{ty}_{src}(p.qs_off, p.sc_off, tok, nb, b);
    let o = p.y_off + r * p.k + b * 32u;
    for (var t = 0u; t < 8u; t++) {{
        act[o + 4u * t] = w[t].x;
        act[o + 4u * t + 1u] = w[t].y;
        act[o + 4u * t + 2u] = w[t].z;
        act[o + 4u * t + 3u] = w[t].w;
    }}
}}
"#
    )
    .expect("formatting into a String cannot fail");
}

/// The GPU form's end, shared by the f32-activation products and the int8
/// ones (`build/qmatmul8_gen.rs`): each thread's `acc` / `ss` (vec4, one
/// lane per row r0 + r) reduced in workgroup memory, the fused norm's factor,
/// the stores by mode and the argmax partials; closes the function.
pub(crate) const GPU_EPILOGUE: &str = r#"    for (var r = 0u; r < 4u; r++) {
        red[li * 4u + r] = acc[r];
        red2[li * 4u + r] = ss[r];
    }
    workgroupBarrier();
    if (j < 4u) {
        let r = j;
        let base = (li / 16u) * 16u;
        var s = 0.0;
        var sq = 0.0;
        for (var t = 0u; t < 16u; t++) {
            s += red[(base + t) * 4u + r];
        }
        for (var t = 0u; t < 64u; t++) {
            sq += red2[t * 4u + r];
        }
        outv[(li / 16u) * 4u + r] = s * inv_rms(sq);
    }
    workgroupBarrier();
    if (li < 16u) {
        let slot = li / 4u;
        let r = li % 4u;
        let nn = wg.x * 4u + slot;
        if (r0 + r < p.m && nn < p.n) {
            if ((p.mode & 255u) == 2u) {
                if (slot % 2u == 0u) {
                    let o = p.y_off + (p.m_base + r0 + r) * (p.n / 2u) + nn / 2u;
                    act[o] = silu(outv[slot * 4u + r]) * outv[(slot + 1u) * 4u + r];
                }
            } else {
                store(p.m_base + r0 + r, nn, outv[slot * 4u + r]);
            }
            if ((p.mode & 255u) == 3u && slot == 0u) {
                var v = outv[r];
                var i = wg.x * 4u;
                for (var c = 1u; c < 4u; c++) {
                    if (wg.x * 4u + c < p.n && outv[c * 4u + r] > v) {
                        v = outv[c * 4u + r];
                        i = wg.x * 4u + c;
                    }
                }
                let o = p.y2_off + ((p.m_base + r0 + r) * (p.n / 4u) + wg.x) * 2u;
                act[o] = v;
                act[o + 1u] = bitcast<f32>(i);
            }
        }
    }
}
"#;

/// The header comment: what the file holds and the weight layout it reads.
const HEADER: &str = r#"// GENERATED by the Vulkan crate's build script from crates/vk/build/qmatmul_gen.rs:
// edit the generator, not this file.
//
// qmatmul: quantized matrix products y[m, n] (+)= sum_k x[m, k] * W[n, k] with
// W read in its block format and dequantized in registers (f32 accumulation), and
// embedding lookups from the same weights.
//
// Weights: the *texel stream* (the GGUF Vulkan model's weight layout): 16-byte texels, per matrix
// [N, K] (K % 32 == 0, N % 4 == 0, nb = K / 32 blocks per row), rows in panels of 32
// (the last padded with zero rows); T code texels per block (q41 1, q80 2, f16 4,
// f32 8); row n = 32 pan + j:
//   code texel h of block (n, b): qs_off + ((pan*nb + b)*32 + j)*T + h
//     q41: the 16 nibble bytes (element i < 16 is the low nibble of byte i, i + 16
//          its high nibble; w = d*q + m); q80: bytes 16h .. 16h+15 (i8, w = d*q);
//     f16: elements 8h .. 8h+7 (binary16 pairs); f32: elements 4h .. 4h+3
//   scale texel of block b, rows 4(j/4) .. +3: sc_off + (pan*nb + b)*8 + j/4 =
//     pack2x16float(d, m) of the four rows (q41, q80 with m = 0)
// so a CPU-form workgroup (8 lanes x 4 rows = one panel) reads each block step as
// one contiguous run of 512 T bytes.
// On CPU devices the stream lives in the weight image (binding 8, rgba32ui, texel i at
// (i & 4095, (i >> 12) & 16383, layer i >> 26)); on GPUs in the weights buffer (binding 0)
// viewed as array<vec4<u32>> (texel i at byte 16 i).
//
// Two forms of the product, same parameters (the GGUF Vulkan model's `QMatmul` op):
// - `qmm_<ty>_r<R>` (CPU devices such as lavapipe; subgroups of at least 8 lanes):
//   workgroup 8 (one llvmpipe subgroup); each invocation computes 4 consecutive outputs n for R consecutive
//   rows m; x is read through the activation uniform window (binding 6; rows
//   m_base .. m_base + m of the product start at element x_off of the window, K apart;
//   the RMSNorm weights, when fused, through the weight window, binding 5):
//   lane l of a subgroup loads the vec4 l of the block's 32 x values and
//   subgroupBroadcast hands each value to every lane, so x costs one gather per
//   8 lanes and the weights are fetched as whole texels (vectorised on llvmpipe,
//   where storage-buffer loads go lane by lane). Every lane stays active until the
//   stores (the broadcasts need all 8), so invocations past N compute zero rows of
//   the last panel and store nothing. grid (ceil(m / R), ceil(N / 32)): row tiles vary
//   fastest, so the workgroups that llvmpipe runs one after the other reuse the
//   same weight texels from cache (with the column groups fastest, a 30 MB LM head
//   was streamed from memory once per row tile: 2-3x slower).
// - `qmm_<ty>_gpu` (GPUs): workgroup 64 = 4 outputs x 16 threads, 4 rows m per
//   workgroup; x staged through workgroup memory 512 columns at a time, each thread
//   takes every 16th block of its output row, partial sums reduced in workgroup
//   memory; weights from the storage buffer; x from act at x_off (absolute).
//   grid (N / 4, ceil(m / 4)).
// - `qmm_<ty>_gpu_mm` (GPUs, many rows): workgroup 128 computes 32 rows x 64
//   outputs, each thread 4 rows x 4 consecutive outputs; K stepped 64 columns (two
//   blocks) at a time: x staged as [column][row quad] and W dequantized once per
//   tile into [column][output quad] in workgroup memory, so a weight block is
//   dequantized once per 32 rows, not once per 4. Same parameters and modes.
//   grid (ceil(N / 64), ceil(m / 32)).
// Fused RMSNorm (norm_off != 0xffffffff): the product takes rmsnorm(x) * g for g the
// [K] f32 vector at norm_off of the weights buffer (in the weight window, relative,
// in the CPU form): x is scaled by g as it is loaded, the row's sum of squares is
// accumulated alongside (subgroupAdd in the CPU form, workgroup memory in the GPU
// form), and each output is multiplied by 1 / sqrt(mean + eps) at the end
// (W (x * g) * inv == W (x * inv * g) up to rounding).
// Outputs, by mode = p.mode & 255: 0 overwrite, 1 add (the residual add):
// column n < n1 -> y_off + row * n1 + n; n1 <= n < n1 + n2 -> y2_off + row * n2
// + (n - n1); the rest -> y3_off + row * (N - n1 - n2) + (n - n1 - n2);
// 2 (SwiGLU): W's rows are gate and up interleaved (gate_j at row 2j, up_j at 2j+1,
// `TexelStream::push_interleaved`), and h[row, j] = silu(gate_j . x) * (up_j . x) goes
// to y_off + row * N / 2 + j; 3 (logits and argmax partials, the LM head): y stored
// as by mode 0 (no split) and, per group of outputs (32 in the CPU form: a subgroup's
// 8 lanes x 4; 4 in the GPU form: a workgroup's), the largest value and its lowest
// index (f32 value, u32 index bits) at y2_off + (row * groups + group) * 2, for
// `argmax_part` to finish. Row index = m_base + chunk row. p.mode >> 8 is the
// weight type (host side only).
// `qmm_<ty>_r<R>_rkv` (q41, q80; R = 1, 2, 4): the CPU form of the q|k|v split
// product (mode 0) with `kernels/rope.wgsl`'s `rope_kv_img` fused into its stores,
// one dispatch group fewer per layer: q (n < n1) turned by RoPE and stored at
// y_off; k (n2 = kv_dim wide) turned and v (n2 wide) written into the KV image
// (binding 7, layers y2_off / y3_off); head_size, block_size, rope_tab (the cos /
// sin table in the weights buffer, f32 elements, a multiple of 4) and rows_off (the
// row records in md, binding 3) are the extra parameters (see `store4_rkv`).
//
// `qembed_<ty>` (image) / `qembed_<ty>_buf` (buffer): x[r, :] = dequantized row
// token(r) of the table (row records in md at rows_off, token first), one
// invocation per (row, block); grid (ceil(K / 32 / 64), n_rows).

"#;

/// The shared declarations and helpers of every kernel.
const PRELUDE: &str = r#"struct Params {
    m: u32, n: u32, k: u32, x_off: u32, qs_off: u32, sc_off: u32, y_off: u32, mode: u32,
    n1: u32, n2: u32, y2_off: u32, y3_off: u32, m_base: u32, norm_off: u32, eps: f32,
    rope_tab: u32, head_size: u32, block_size: u32, rows_off: u32, // `_rkv` twins only
}
const NO_NORM: u32 = 0xffffffffu;
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> wbuf: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;
struct Window { v: array<vec4<f32>, 4096>, }
@group(0) @binding(5) var<uniform> wwin: Window;
@group(0) @binding(6) var<uniform> xwin: Window;
@group(0) @binding(8) var wimg: texture_storage_2d_array<rgba32uint, read>;
@group(0) @binding(7) var kv_img: texture_storage_2d_array<rgba32float, read_write>;

fn wtex(i: u32) -> vec4<u32> {
    return textureLoad(wimg, vec2<u32>(i & 4095u, (i >> 12u) & 16383u), i >> 26u);
}

fn store(m: u32, n: u32, v: f32) {
    var o: u32;
    if (n < p.n1) {
        o = p.y_off + m * p.n1 + n;
    } else if (n < p.n1 + p.n2) {
        o = p.y2_off + m * p.n2 + (n - p.n1);
    } else {
        o = p.y3_off + m * (p.n - p.n1 - p.n2) + (n - p.n1 - p.n2);
    }
    if ((p.mode & 255u) == 1u) {
        act[o] += v;
    } else {
        act[o] = v;
    }
}

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

/// Stores the outputs c0 .. c0 + 3 of row `row` by mode (see the header).
fn store4(row: u32, c0: u32, y: vec4<f32>) {
    if ((p.mode & 255u) == 2u) {
        let o = p.y_off + row * (p.n / 2u) + c0 / 2u;
        act[o] = silu(y.x) * y.y;
        act[o + 1u] = silu(y.z) * y.w;
    } else {
        store(row, c0, y.x);
        store(row, c0 + 1u, y.y);
        store(row, c0 + 2u, y.z);
        store(row, c0 + 3u, y.w);
    }
}

/// `kernels/rope.wgsl`'s `turn`: the pairs (v.x, v.y) and (v.z, v.w) rotated by
/// the angles whose cosines are c and sines s (the same arithmetic, so the fused
/// stores write what `rope_kv_img` would).
fn turn(v: vec4<f32>, c: vec2<f32>, s: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(v.x * c.x - v.y * s.x, v.x * s.x + v.y * c.x, v.z * c.y - v.w * s.y, v.z * s.y + v.w * c.y);
}

/// The `_rkv` twins' store (mode 0 split product over q|k|v, see the header):
/// outputs c0 .. c0 + 3 of row `row`; q (c0 < n1) turned by RoPE and stored at
/// y_off [m, n1]; k (n1 <= c0 < n1 + n2) turned and v (the rest, n2 wide) written
/// into the KV image (`rope_kv_img`'s layout: layer y2_off / y3_off, image row = the
/// row's block, texel (pos % block_size) * n2 / 4 + e / 4). Position and block
/// table from the row record md[rows_off + 4 row ..] (token, seq, pos,
/// block_table_off); cos / sin from weights[rope_tab + (pos * head_size / 2 + pair) * 2].
fn store4_rkv(row: u32, c0: u32, y: vec4<f32>) {
    let rec = p.rows_off + row * 4u;
    let pos = md[rec + 2u];
    let is_v = c0 >= p.n1 + p.n2;
    var v = y;
    var e = c0;
    if (c0 >= p.n1) {
        e = c0 - p.n1;
    }
    if (is_v) {
        e = c0 - p.n1 - p.n2;
    } else {
        let t = p.rope_tab + (pos * (p.head_size / 2u) + (e % p.head_size) / 2u) * 2u;
        let cs = bitcast<vec4<f32>>(wbuf[t / 4u]);
        v = turn(y, cs.xz, cs.yw);
    }
    if (c0 < p.n1) {
        let o = p.y_off + row * p.n1 + c0;
        act[o] = v.x;
        act[o + 1u] = v.y;
        act[o + 2u] = v.z;
        act[o + 3u] = v.w;
        return;
    }
    let block = md[md[rec + 3u] + pos / p.block_size];
    let at = vec2<u32>((pos % p.block_size) * (p.n2 / 4u) + e / 4u, block);
    textureStore(kv_img, at, select(p.y2_off, p.y3_off, is_v), v);
}

/// Mode 3, CPU form: the subgroup's largest output of row `row` (lowest index
/// among equal ones; lanes past N or rows past m count for nothing) goes to
/// its partial slot. Called by every lane (subgroup operations).
fn partial(row: u32, row_live: bool, live: bool, col: u32, c0: u32, y: vec4<f32>, sl: u32) {
    var v = -3.4028235e38;
    var i = 0xffffffffu;
    if (live) {
        v = y.x;
        i = c0;
        for (var c = 1u; c < 4u; c++) {
            if (y[c] > v) {
                v = y[c];
                i = c0 + c;
            }
        }
    }
    let best = subgroupMax(v);
    let at = subgroupMin(select(0xffffffffu, i, v == best && live));
    let groups = (p.n + 31u) / 32u;
    // A subgroup wholly past N (the last workgroup's second one) has no slot.
    if (sl == 0u && row_live && col / 8u < groups) {
        let o = p.y2_off + (row * groups + col / 8u) * 2u;
        act[o] = best;
        act[o + 1u] = bitcast<f32>(at);
    }
}

/// 1 / sqrt(mean square + eps) for a row whose squares sum to `ss`, or 1
/// without a fused norm.
fn inv_rms(ss: f32) -> f32 {
    if (p.norm_off == NO_NORM) {
        return 1.0;
    }
    return 1.0 / sqrt(ss / f32(p.k) + p.eps);
}

fn i8x4(v: u32) -> vec4<f32> {
    let s = bitcast<i32>(v);
    return vec4<f32>(f32((s << 24u) >> 24u), f32((s << 16u) >> 24u), f32((s << 8u) >> 24u), f32(s >> 24u));
}

// A Q4_1 word's codes masked in place: byte i's low nibble is q * 2^(8i), its high
// nibble q * 2^(8i + 4), exact as f32; x scaled by the inverse powers of two makes
// the products exactly q * x.
const LO_MASK: vec4<u32> = vec4<u32>(0xfu, 0xf00u, 0xf0000u, 0xf000000u);
const HI_MASK: vec4<u32> = vec4<u32>(0xf0u, 0xf000u, 0xf00000u, 0xf0000000u);
const LO_SCALE: vec4<f32> = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 5.9604644775390625e-8);
const HI_SCALE: vec4<f32> = vec4<f32>(0.0625, 0.000244140625, 9.5367431640625e-7, 3.7252902984619141e-9);

fn nib_lo(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(v & 15u, (v >> 8u) & 15u, (v >> 16u) & 15u, (v >> 24u) & 15u));
}

fn nib_hi(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>((v >> 4u) & 15u, (v >> 12u) & 15u, (v >> 20u) & 15u, v >> 28u));
}

/// Block (32 elements) `blk` of a matrix as 8 vec4 (elements 4t .. 4t+3), `scale`
/// the (d, m) pair of its row; `tex(i)` fetches texel i of the stream.
"#;

/// The GPU form's buffer fetch and workgroup memory.
const GPU_COMMON: &str = r#"
fn wbuf_tex(i: u32) -> vec4<u32> {
    return wbuf[i];
}

const GT: u32 = 512u; // x columns staged per step (16 blocks)
var<workgroup> xsh: array<f32, 2048>; // [4 rows][GT]
var<workgroup> red: array<f32, 256>; // [64 threads][4 rows]: partial dot products
var<workgroup> red2: array<f32, 256>; // [64 threads][4 rows]: partial sums of squares
var<workgroup> outv: array<f32, 16>; // [4 outputs][4 rows]
// `qmm_<ty>_gpu8`'s: x [8 rows][GT], the partials [64 threads][8 rows], the
// outputs [4 outputs][8 rows] (20 KiB in all).
var<workgroup> xsh8: array<f32, 4096>;
var<workgroup> red8: array<f32, 512>;
var<workgroup> red2_8: array<f32, 512>;
var<workgroup> outv8: array<f32, 32>;
// `qmm_<ty>_gpu_mm`'s tiles: x [64 columns][8 row quads], W [64 columns][16
// output quads], the per-thread sums of squares (24.5 KiB in all).
var<workgroup> mm_x: array<vec4<f32>, 512>;
var<workgroup> mm_w: array<vec4<f32>, 1024>;
var<workgroup> mm_ss: array<f32, 128>;
"#;

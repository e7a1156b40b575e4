// Generator of the int8-activation half of `qmatmul.wgsl`: the Q8_1-style
// activation quantizer and the CPU-form products of Q4_1 / Q8_0 weights
// against quantized activations with packed 4x8-bit integer dot products.
//
// Appended by the Vulkan crate's build script after `build/qmatmul_gen.rs`'s
// text, whose prelude (parameters, bindings, `wtex`, `store4`, `partial`,
// `inv_rms`) it uses. Pure std, deterministic output, no inner attributes or
// doc comments (declared as a module of the build script).
//
// Every product (CPU form `_r<R>`, GPU form `_gpu`) is emitted twice: `qmm8_<ty>_r<R>` calls WGSL's
// `dot4I8Packed` (naga writes SPIR-V `OpSDot` with the `DotProduct`
// capabilities: the device must enable `VK_KHR_shader_integer_dot_product`),
// and `qmm8_<ty>_r<R>_poly` the same sum written with shifts and an integer
// `dot` (no capability beyond core), so a device without the extension, or
// one where the driver lowers `OpSDot` badly, still has the form. The CPU form's
// Q4_1 products have a third twin, `qmm8_q41_r<R>_swar` (packed pairs, see
// `swar_product`): lavapipe lowers `OpSDot` to byte extractions, four multiplies a
// word, where the pairs take one multiply for two products.

use std::fmt::Write as _;

/// Token rows per invocation of the CPU form (as `qmatmul_gen::ROWS` minus 8).
const ROWS: [u32; 3] = [1, 2, 4];
/// Output rows per invocation (as `qmatmul_gen::C`).
const C: u32 = 4;
/// Workgroup size (as `qmatmul_gen::WG`: one llvmpipe subgroup).
const WG: u32 = 8;

/// The weight types with an int8 product: (name, code texels per block).
const TYPES: [(&str, u32); 2] = [("q41", 1), ("q80", 2)];

/// One line into `out`, indented by `depth` levels of 4 spaces.
fn line(out: &mut String, depth: usize, text: &str) {
    out.push_str(&"    ".repeat(depth));
    out.push_str(text);
    out.push('\n');
}

/// The entry points whose SPIR-V uses `OpSDot` (the device must enable
/// integer dot products to build them), for the build script's table.
pub fn integer_dot_entries() -> Vec<String> {
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for rows in ROWS {
            v.push(format!("qmm8_{ty}_r{rows}"));
        }
        v.push(format!("qmm8_{ty}_gpu"));
    }
    v
}

/// Every entry point this file generates (the quantizer, both dot forms).
pub fn int8_entries() -> Vec<String> {
    let mut v = vec!["quant_q81".to_string(), "quant_q81_win".to_string()];
    for (ty, _) in TYPES {
        for rows in ROWS {
            v.push(format!("qmm8_{ty}_r{rows}"));
            v.push(format!("qmm8_{ty}_r{rows}_poly"));
        }
        v.push(format!("qmm8_{ty}_gpu"));
        v.push(format!("qmm8_{ty}_gpu_poly"));
    }
    for rows in ROWS {
        v.push(format!("qmm8_q41_r{rows}_swar"));
        v.push(format!("qmm8_q41_r{rows}_swar_rkv"));
        v.push(format!("qmm8_q41_r{rows}_swar_h"));
    }
    v
}

/// Returns the int8 kernels' WGSL (after `qmatmul_gen::generate()`'s text).
pub fn generate() -> String {
    let mut out = String::with_capacity(96 * 1024);
    out.push_str(HEADER);
    for (ty, texels) in TYPES {
        for poly in [false, true] {
            for rows in ROWS {
                product(&mut out, ty, texels, rows, poly);
            }
            gpu_product(&mut out, ty, texels, poly);
        }
    }
    for rows in ROWS {
        for kind in [Swar::Plain, Swar::Rkv, Swar::Half] {
            swar_product(&mut out, rows, kind);
        }
    }
    out
}

/// The packed pairs' entry points: the product (`qmm8_q41_r<R>_swar`), its
/// `_rkv` twin (the q|k|v split product with RoPE and the KV append fused
/// into its stores, `store4_rkv`, as `qmatmul_gen`'s `_rkv` twins of the f32
/// products) and its `_h` twin (against half blocks: the products whose input
/// a GLU product quantized, see `q81_half`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Swar {
    Plain,
    Rkv,
    Half,
}

/// `qmm8_q41_r<R>_swar`: the CPU form of the Q4_1 product against Q8_1
/// blocks with two products per 32-bit multiply (SIMD within a register).
/// Codes `a0`, `a1` of elements `e0`, `e1` sit in the 16-bit halves of one
/// word (`w & 0x000f000f` and its shifts by 4, 8, 12: the nibbles of bytes 0
/// and 2, or 1 and 3), the activations in the opposite order (`X = x[e1] +
/// x[e0] * 2^16`), so `W * X = a0 * x[e1] + (a0 * x[e0] + a1 * x[e1]) * 2^16
/// (mod 2^32)`: the upper half gathers the two products. Eight such words
/// (16 elements) keep both halves' sums below 2^15 in magnitude (|a x| <=
/// 15 * 127), and an accumulator started at 2^15 makes the upper half exact
/// with one arithmetic shift. Per block and output the sum is the same
/// integer as `dot4I8Packed`'s, and the scaling the same expression: a row's
/// results are the same bits as `qmm8_q41_r<R>`'s.
fn swar_product(out: &mut String, rows: u32, kind: Swar) {
    let suffix = match kind {
        Swar::Plain => "",
        Swar::Rkv => "_rkv",
        Swar::Half => "_h",
    };
    cpu_prologue(out, &format!("qmm8_q41_r{rows}_swar{suffix}"), rows, 1);
    for c in 0..C {
        line(out, 2, &format!("let w{c} = wtex(q0 + b * 32u + {c}u);"));
    }
    // Each lane pairs the activations of the vec4 it loaded (lanes 0 and 1:
    // code words 0..3 and 4..7), then the pairs go round: e = (x0, x2) and
    // o = (x1, x3) of each word, the first element in the upper half.
    for r in 0..rows {
        line(
            out,
            2,
            &format!("let mine{r} = xwin.v[xr{r} + b * 3u + min(sl & 7u, 2u)];"),
        );
        line(out, 2, &format!("let v{r} = bitcast<vec4<u32>>(mine{r});"));
        line(
            out,
            2,
            &format!(
                "let e{r} = bitcast<vec4<u32>>((bitcast<vec4<i32>>(v{r} << vec4<u32>(24u)) >> vec4<u32>(8u)) + (bitcast<vec4<i32>>(v{r} << vec4<u32>(8u)) >> vec4<u32>(24u)));"
            ),
        );
        line(
            out,
            2,
            &format!(
                "let o{r} = bitcast<vec4<u32>>(((bitcast<vec4<i32>>(v{r} << vec4<u32>(16u)) >> vec4<u32>(24u)) << vec4<u32>(16u)) + (bitcast<vec4<i32>>(v{r}) >> vec4<u32>(24u)));"
            ),
        );
        line(out, 2, &format!("let ea{r} = subgroupBroadcast(e{r}, 0u);"));
        line(out, 2, &format!("let oa{r} = subgroupBroadcast(o{r}, 0u);"));
        line(out, 2, &format!("let eb{r} = subgroupBroadcast(e{r}, 1u);"));
        line(out, 2, &format!("let ob{r} = subgroupBroadcast(o{r}, 1u);"));
        line(
            out,
            2,
            &format!("let xd{r} = subgroupBroadcast(mine{r}, 2u);"),
        );
        if kind != Swar::Half {
            line(out, 2, &format!("ss{r} += xd{r}.z;"));
        }
    }
    line(out, 2, "let sc = wtex(s0 + b * 8u);");
    for c in 0..C {
        line(out, 2, &format!("let dm{c} = unpack2x16float(sc[{c}u]);"));
        // Codes in pairs: low nibbles of bytes (0, 2) and (1, 3), high
        // nibbles likewise (elements 16 + ..).
        line(
            out,
            2,
            &format!("let le{c} = w{c} & vec4<u32>(0x000f000fu);"),
        );
        line(
            out,
            2,
            &format!("let lo{c} = (w{c} >> vec4<u32>(8u)) & vec4<u32>(0x000f000fu);"),
        );
        line(
            out,
            2,
            &format!("let he{c} = (w{c} >> vec4<u32>(4u)) & vec4<u32>(0x000f000fu);"),
        );
        line(
            out,
            2,
            &format!("let ho{c} = (w{c} >> vec4<u32>(12u)) & vec4<u32>(0x000f000fu);"),
        );
    }
    for r in 0..rows {
        for c in 0..C {
            let lo: Vec<String> = (0..4)
                .flat_map(|t| {
                    [
                        format!("le{c}[{t}u] * ea{r}[{t}u]"),
                        format!("lo{c}[{t}u] * oa{r}[{t}u]"),
                    ]
                })
                .collect();
            let hi: Vec<String> = (0..4)
                .flat_map(|t| {
                    [
                        format!("he{c}[{t}u] * eb{r}[{t}u]"),
                        format!("ho{c}[{t}u] * ob{r}[{t}u]"),
                    ]
                })
                .collect();
            line(
                out,
                2,
                &format!("let pl{r}_{c} = 0x8000u + {};", lo.join(" + ")),
            );
            line(
                out,
                2,
                &format!("let ph{r}_{c} = 0x8000u + {};", hi.join(" + ")),
            );
            if kind == Swar::Half {
                // Half blocks: (d0, s0, d1, s1), elements 0..15 and 16..31.
                line(
                    out,
                    2,
                    &format!(
                        "y{r}_{c} += dm{c}.x * (xd{r}.x * f32(bitcast<i32>(pl{r}_{c}) >> 16u) + xd{r}.z * f32(bitcast<i32>(ph{r}_{c}) >> 16u)) + dm{c}.y * (xd{r}.y + xd{r}.w);"
                    ),
                );
                continue;
            }
            line(
                out,
                2,
                &format!(
                    "let i{r}_{c} = f32((bitcast<i32>(pl{r}_{c}) >> 16u) + (bitcast<i32>(ph{r}_{c}) >> 16u));"
                ),
            );
            line(
                out,
                2,
                &format!("y{r}_{c} += dm{c}.x * xd{r}.x * i{r}_{c} + dm{c}.y * xd{r}.y;"),
            );
        }
    }
    line(out, 1, "}");
    epilogue(
        out,
        rows,
        if kind == Swar::Rkv {
            "store4_rkv"
        } else {
            "store4"
        },
    );
}

/// `qmm8_<ty>_gpu[_poly]`, the GPU form against Q8_1 blocks: workgroup 64 =
/// 4 outputs x 16 threads, 4 rows m per workgroup, each thread taking every
/// 16th block of its output row for the 4 rows (x blocks read straight from
/// the activation buffer: 48 bytes a block, adjacent threads adjacent
/// blocks), then `qmatmul_gen`'s GPU epilogue (reduction, norm, stores).
fn gpu_product(out: &mut String, ty: &str, t: u32, poly: bool) {
    let suffix = if poly { "_poly" } else { "" };
    let dot = if poly { "dot4_poly" } else { "dot4I8Packed" };
    let (load, lo, hi, m_term) = if t == 1 {
        (
            "let w = wbuf[p.qs_off + pb * 32u + jj];",
            "w[t] & 0x0f0f0f0fu",
            "(w[t] >> 4u) & 0x0f0f0f0fu",
            " + dm.y * act[o + 9u]",
        )
    } else {
        (
            "let wa = wbuf[p.qs_off + 2u * (pb * 32u + jj)];\n            let wb = wbuf[p.qs_off + 2u * (pb * 32u + jj) + 1u];",
            "wa[t]",
            "wb[t]",
            "",
        )
    };
    write!(
        out,
        r#"
@compute @workgroup_size(64)
fn qmm8_{ty}_gpu{suffix}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = wg.x * 4u + li / 16u;
    let j = li % 16u;
    let r0 = wg.y * 4u;
    let nb = p.k / 32u;
    let jj = n % 32u;
    var acc = vec4<f32>(0.0); // rows r0 .. r0 + 3
    var ss = vec4<f32>(0.0); // sums of squares: kept by the first output's threads only
    for (var b = j; b < nb && n < p.n; b += 16u) {{
        let pb = (n / 32u) * nb + b;
        let dm = unpack2x16float(wbuf[p.sc_off + pb * 8u + jj / 4u][jj % 4u]);
        {load}
        for (var r = 0u; r < 4u; r++) {{
            if (r0 + r < p.m) {{
                let o = p.x_off + ((r0 + r) * nb + b) * 12u;
                var i = 0;
                for (var t = 0u; t < 4u; t++) {{
                    i += {dot}({lo}, bitcast<u32>(act[o + t]));
                    i += {dot}({hi}, bitcast<u32>(act[o + 4u + t]));
                }}
                acc[r] += dm.x * act[o + 8u] * f32(i){m_term};
                if (li < 16u) {{
                    ss[r] += act[o + 10u];
                }}
            }}
        }}
    }}
"#
    )
    .expect("formatting into a String cannot fail");
    out.push_str(crate::qmatmul_gen::GPU_EPILOGUE);
}

/// The CPU form's entry point up to the block loop: the signature, this
/// invocation's outputs (4 from `c0`) and rows (`rows` from `r0`), the
/// weights' first code texel `q0` (`t` texels a block and output) and
/// scale texel `s0`, each row's block offset `xr<r>`, sum of squares and
/// accumulators; then `for (var b = 0u; b < nb; b++) {` opened.
fn cpu_prologue(out: &mut String, entry: &str, rows: u32, t: u32) {
    write!(
        out,
        r#"
@compute @workgroup_size({WG})
fn {entry}(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) sl: u32) {{
    let col = wg.y * {WG}u + li;
    let c0 = col * {C}u;
    let live = c0 < p.n;
    let r0 = wg.x * {rows}u;
    let nb = p.k / 32u;
    let q0 = p.qs_off + ((c0 / 32u) * nb * 32u + c0 % 32u) * {t}u;
    let s0 = p.sc_off + (c0 / 32u) * nb * 8u + (c0 % 32u) / 4u;
"#
    )
    .expect("formatting into a String cannot fail");
    for r in 0..rows {
        line(
            out,
            1,
            &format!("let xr{r} = p.x_off / 4u + min(r0 + {r}u, p.m - 1u) * nb * 3u;"),
        );
        line(out, 1, &format!("var ss{r} = 0.0;"));
        for c in 0..C {
            line(out, 1, &format!("var y{r}_{c} = 0.0;"));
        }
    }
    line(out, 1, "for (var b = 0u; b < nb; b++) {");
}

/// `qmm8_<ty>_r<R>[_poly]`: the CPU form of the product against Q8_1 blocks.
fn product(out: &mut String, ty: &str, t: u32, rows: u32, poly: bool) {
    let suffix = if poly { "_poly" } else { "" };
    let dot = if poly { "dot4_poly" } else { "dot4I8Packed" };
    cpu_prologue(out, &format!("qmm8_{ty}_r{rows}{suffix}"), rows, t);
    for c in 0..C {
        for h in 0..t {
            let texel = c * t + h;
            line(
                out,
                2,
                &format!("let w{c}_{h} = wtex(q0 + b * {}u + {texel}u);", 32 * t),
            );
        }
    }
    // Lanes 0, 1, 2 load the block's three vec4 (one gather for the 8
    // lanes; the same address in every lane would gather three times, see
    // docs/arch/vk.md) and subgroupBroadcast hands them round.
    for r in 0..rows {
        line(
            out,
            2,
            &format!("let mine{r} = xwin.v[xr{r} + b * 3u + min(sl & 7u, 2u)];"),
        );
        line(
            out,
            2,
            &format!("let xa{r} = bitcast<vec4<u32>>(subgroupBroadcast(mine{r}, 0u));"),
        );
        line(
            out,
            2,
            &format!("let xb{r} = bitcast<vec4<u32>>(subgroupBroadcast(mine{r}, 1u));"),
        );
        line(
            out,
            2,
            &format!("let xd{r} = subgroupBroadcast(mine{r}, 2u);"),
        );
        line(out, 2, &format!("ss{r} += xd{r}.z;"));
    }
    // Codes of output c against x's words: (lo, hi) = elements (4t.., 16+4t..).
    let code = |c: u32, half: u32, w: u32| -> String {
        if t == 1 {
            if half == 0 {
                format!("lo{c}_{w}")
            } else {
                format!("hi{c}_{w}")
            }
        } else {
            format!("w{c}_{half}[{w}u]")
        }
    };
    if t == 1 {
        for c in 0..C {
            for w in 0..4 {
                line(
                    out,
                    2,
                    &format!("let lo{c}_{w} = w{c}_0[{w}u] & 0x0f0f0f0fu;"),
                );
                line(
                    out,
                    2,
                    &format!("let hi{c}_{w} = (w{c}_0[{w}u] >> 4u) & 0x0f0f0f0fu;"),
                );
            }
        }
    }
    line(out, 2, "let sc = wtex(s0 + b * 8u);");
    for c in 0..C {
        line(out, 2, &format!("let dm{c} = unpack2x16float(sc[{c}u]);"));
    }
    for r in 0..rows {
        for c in 0..C {
            let terms: Vec<String> = (0..2)
                .flat_map(|half| (0..4).map(move |w| (half, w)))
                .map(|(half, w)| {
                    let x = if half == 0 { "xa" } else { "xb" };
                    format!("{dot}({}, {x}{r}[{w}u])", code(c, half, w))
                })
                .collect();
            line(
                out,
                2,
                &format!("let i{r}_{c} = f32({});", terms.join(" + ")),
            );
            let m_term = if t == 1 {
                format!(" + dm{c}.y * xd{r}.y")
            } else {
                String::new()
            };
            line(
                out,
                2,
                &format!("y{r}_{c} += dm{c}.x * xd{r}.x * i{r}_{c}{m_term};"),
            );
        }
    }
    line(out, 1, "}");
    epilogue(out, rows, "store4");
}

/// The fused norm's factors (every lane holds its rows' whole sums of
/// squares), the argmax partials (mode 3), the quantized output (`QOUT`) and
/// the stores through `store` (`store4`, or `store4_rkv` for an `_rkv`
/// twin).
fn epilogue(out: &mut String, rows: u32, store: &str) {
    let ys = |r: u32| {
        (0..C)
            .map(|c| format!("y{r}_{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in 0..rows {
        line(out, 1, &format!("let inv{r} = inv_rms(ss{r});"));
    }
    line(out, 1, "if ((p.mode & 255u) == 3u) {");
    for r in 0..rows {
        let y = ys(r);
        line(
            out,
            2,
            &format!(
                "partial(p.m_base + r0 + {r}u, r0 + {r}u < p.m, live, col, c0, vec4<f32>({y}) * inv{r}, sl);"
            ),
        );
    }
    line(out, 1, "}");
    // Quantized output (QOUT, residual-add products only): before the stores,
    // while every lane is still active (the subgroup operations need all 8),
    // each row's new x (the old x plus this product, as the store below adds
    // it) quantized as one Q8_1 block: this workgroup's 32 outputs are block
    // c0 / 32 of the row.
    line(
        out,
        1,
        "if ((p.mode & QOUT) != 0u && (p.mode & 255u) == 1u) {",
    );
    for r in 0..rows {
        let y = ys(r);
        line(out, 2, &format!("if (r0 + {r}u < p.m) {{"));
        line(
            out,
            3,
            &format!("let o{r} = p.y_off + (p.m_base + r0 + {r}u) * p.n + c0;"),
        );
        line(out, 3, &format!("var old{r} = vec4<f32>(0.0);"));
        line(out, 3, "if (live) {");
        line(
            out,
            4,
            &format!(
                "old{r} = vec4<f32>(act[o{r}], act[o{r} + 1u], act[o{r} + 2u], act[o{r} + 3u]);"
            ),
        );
        line(out, 3, "}");
        line(
            out,
            3,
            &format!(
                "q81_out(old{r} + vec4<f32>({y}) * inv{r}, p.m_base + r0 + {r}u, c0 / 32u, p.n / 32u, sl & 7u);"
            ),
        );
        line(out, 2, "}");
    }
    line(out, 1, "}");
    // The same for a GLU product: each lane's 2 outputs h (as store4 makes
    // them), the workgroup's 16 half a block (`q81_half`).
    line(
        out,
        1,
        "if ((p.mode & QOUT) != 0u && (p.mode & 255u) == 2u) {",
    );
    for r in 0..rows {
        let y = ys(r);
        line(out, 2, &format!("if (r0 + {r}u < p.m) {{"));
        line(out, 3, &format!("let v{r} = vec4<f32>({y}) * inv{r};"));
        line(out, 3, &format!("var h{r} = vec2<f32>(0.0);"));
        line(out, 3, "if (live) {");
        line(
            out,
            4,
            &format!("h{r} = vec2<f32>(silu(v{r}.x) * v{r}.y, silu(v{r}.z) * v{r}.w);"),
        );
        line(out, 3, "}");
        line(
            out,
            3,
            &format!("q81_half(h{r}, p.m_base + r0 + {r}u, c0 / 2u, sl & 7u);"),
        );
        line(out, 2, "}");
    }
    line(out, 1, "}");
    line(out, 1, "if (!live) { return; }");
    for r in 0..rows {
        let y = ys(r);
        line(out, 1, &format!("if (r0 + {r}u < p.m) {{"));
        line(
            out,
            2,
            &format!("{store}(p.m_base + r0 + {r}u, c0, vec4<f32>({y}) * inv{r});"),
        );
        line(out, 1, "}");
    }
    line(out, 0, "}");
}

/// The int8 section's comment, the quantizer and the polyfill.
const HEADER: &str = r#"
// ---- int8 activations (generated from crates/vk/build/qmatmul8_gen.rs) ----
//
// Q8_1-style blocks of the activations: per row of x [m, k], nb = k / 32 blocks of
// 12 words (3 vec4, 48 bytes): words 0..7 the 32 codes q_i = round(x_i / d) as
// int8, 4 per word (element 4w + j in byte j of word w); word 8 d = amax / 127
// (f32, 0 for an all-zero block); word 9 s = d * sum(q_i); word 10 the sum of
// squares of the raw x (before the norm's g), for a fused RMSNorm; word 11 zero.
//
// `quant_q81`: x [m, k] at x_off (f32, absolute) -> blocks [m][nb][12] at y_off
// (absolute, a multiple of 4); with norm_off != NO_NORM, x * g is quantized (g [k]
// f32 at norm_off of the weights buffer). One invocation per (block, row); grid
// (ceil(nb / 64), m).
//
// `quant_q81_win` (CPU devices): the same blocks, one subgroup of 8 lanes per
// QUANT_BLOCKS blocks of a row of the chunk (a workgroup a block cost lavapipe more in
// workgroup overhead than in work): lane l reads x's vec4 l of each block through the
// activation window (x_off relative to it; g through the weight window, norm_off
// relative), subgroupMax / subgroupAdd give amax, the code sum and the sum of squares;
// rows m_base + r of the blocks at y_off (absolute). Grid (ceil(nb / QUANT_BLOCKS),
// chunk rows).
const QUANT_BLOCKS: u32 = 16u;
//
// `qmm8_<ty>_r<R>` (q41, q80; R = 1, 2, 4): QMatmul's CPU form (same parameters,
// outputs and modes, see above) with x_off the blocks' offset inside the activation
// window (row stride 12 nb words); lanes 0..2 load a row's block (3 vec4) and
// subgroupBroadcast hands it to every lane, and per block and output sum_i q4_i * q8_i in integers: four
// dot4I8Packed per 16 elements (Q4_1 nibbles are 0..15, so as signed bytes they
// are themselves), then y += d4 * d8 * isum (+ m4 * s8 for Q4_1). With a fused norm
// the quantizer applied g and the product scales by 1 / rms from the blocks' sums
// of squares. `_poly` twins: the same with `dot4_poly` (shifts and an integer dot).
//
// `qmm8_q41_r<R>_swar` (CPU form, Q4_1): the same sums with two products per 32-bit
// multiply: two codes in the 16-bit halves of a word (w & 0x000f000f and its shifts),
// two activations the other way round (x[e1] + x[e0] * 2^16), so the upper half of
// W * X is a0 x[e0] + a1 x[e1]; 8 such words (16 elements) a sum, started at 2^15 so
// `>> 16` is exact. The same integers, so the same bits as `qmm8_q41_r<R>`.
// `qmm8_q41_r<R>_swar_rkv`: the q|k|v split product with `store4_rkv` (RoPE and the
// KV append in its stores, as the f32 products' `_rkv` twins).
//
// `qmm8_<ty>_gpu` (GPUs): QMatmul's GPU form (workgroup 64 = 4 outputs x 16 threads,
// 4 rows m per workgroup, grid (N / 4, ceil(m / 4))) against the blocks at x_off
// (absolute): each thread takes every 16th block of its output for the 4 rows,
// reading the blocks from act; then the f32 GPU form's reduction and stores.

// The Q8_1 block of 32 activations that lane l (of a subgroup of 8) holds 4 of:
// `raw` the lane's x values (elements 4l .. 4l+3), `x` the same times the norm's g
// (or `raw`); the block goes to act[o ..]. Shared by `quant_q81_win` and the products'
// quantized output, so both write the same bits for the same x.
fn q81_block(raw: vec4<f32>, x: vec4<f32>, o: u32, l: u32) {
    let ss = subgroupAdd(dot(raw, raw));
    let ax = abs(x);
    let amax = subgroupMax(max(max(ax.x, ax.y), max(ax.z, ax.w)));
    let d = amax / 127.0;
    var id = 0.0;
    if (d > 0.0) {
        id = 1.0 / d;
    }
    let q = clamp(vec4<i32>(round(x * id)), vec4<i32>(-127), vec4<i32>(127));
    let u = bitcast<vec4<u32>>(q) & vec4<u32>(255u);
    let word = u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
    let sum = subgroupAdd(q.x + q.y + q.z + q.w);
    act[o + l] = bitcast<f32>(word);
    if (l == 0u) {
        act[o + 8u] = d;
        act[o + 9u] = d * f32(sum);
        act[o + 10u] = ss;
        act[o + 11u] = 0.0;
    }
}

// QOUT (host bit 18 of p.mode, CPU-form int8 products with mode 1, n1 = n, n % 32 ==
// 0): the product also writes the new x [m, n] (old x + y, what its stores leave) as
// Q8_1 blocks, row stride n / 32 blocks, at y2_off (absolute), of x * g for g [n] at
// y3_off of the weight window (NO_NORM: none): the next products' input, quantized
// where it is made, without a `quant_q81` dispatch group. Block b of row `row` from
// lane l's 4 values.
const QOUT: u32 = 0x40000u;
fn q81_out(raw: vec4<f32>, row: u32, b: u32, nb: u32, l: u32) {
    var x = raw;
    if (p.y3_off != NO_NORM) {
        x *= wwin.v[p.y3_off / 4u + b * 8u + l];
    }
    q81_block(raw, x, p.y2_off + (row * nb + b) * 12u, l);
}

// QOUT on a GLU product (mode 2; n % 64 == 0, no fused norm on its consumer): the
// h [m, n / 2] it stores, also as *half blocks* at y2_off (row stride n / 64 blocks
// of 12 words): words 0..7 the codes as in a Q8_1 block, then d0, s0 = d0 *
// sum(q_0..15), d1, s1 = d1 * sum(q_16..31): each half of 16 has its own scale,
// since a workgroup makes 16 of h (8 lanes x 2). Only the `_h` twins of the
// packed pairs read them (no sum of squares: no fused norm). Half `(e0 % 32) / 16`
// of block e0 / 32 from lane l's 2 values (elements e0, e0 + 1 = c0 / 2, + 1):
// the codes of 2 lanes make one word, gathered with one subgroupAdd (disjoint
// bits).
fn q81_half(h: vec2<f32>, row: u32, e0: u32, l: u32) {
    let ah = abs(h);
    let amax = subgroupMax(max(ah.x, ah.y));
    let d = amax / 127.0;
    var id = 0.0;
    if (d > 0.0) {
        id = 1.0 / d;
    }
    let q = clamp(vec2<i32>(round(h * id)), vec2<i32>(-127), vec2<i32>(127));
    let u = bitcast<vec2<u32>>(q) & vec2<u32>(255u);
    var slot = vec4<u32>(0u);
    slot[l / 2u] = (u.x | (u.y << 8u)) << (16u * (l & 1u));
    let words = subgroupAdd(slot);
    let sum = subgroupAdd(q.x + q.y);
    let half = (e0 % 32u) / 16u;
    let o = p.y2_off + (row * (p.n / 64u) + e0 / 32u) * 12u;
    if (l < 4u) {
        act[o + half * 4u + l] = bitcast<f32>(words[l]);
    }
    if (l == 0u) {
        act[o + 8u + 2u * half] = d;
        act[o + 9u + 2u * half] = d * f32(sum);
    }
}

@compute @workgroup_size(8)
fn quant_q81_win(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) sl: u32) {
    let nb = p.k / 32u;
    let r = wg.y;
    let l = sl & 7u;
    let b1 = min(nb, (wg.x + 1u) * QUANT_BLOCKS);
    for (var b = wg.x * QUANT_BLOCKS; b < b1; b++) {
        let raw = xwin.v[p.x_off / 4u + r * (p.k / 4u) + b * 8u + l];
        var x = raw;
        if (p.norm_off != NO_NORM) {
            x *= wwin.v[p.norm_off / 4u + b * 8u + l];
        }
        q81_block(raw, x, p.y_off + ((p.m_base + r) * nb + b) * 12u, l);
    }
}

fn dot4_poly(a: u32, b: u32) -> i32 {
    let sh = vec4<u32>(24u, 16u, 8u, 0u);
    let x = bitcast<vec4<i32>>(vec4<u32>(a) << sh) >> vec4<u32>(24u);
    let y = bitcast<vec4<i32>>(vec4<u32>(b) << sh) >> vec4<u32>(24u);
    return dot(x, y);
}

@compute @workgroup_size(64)
fn quant_q81(@builtin(global_invocation_id) gid: vec3<u32>) {
    let nb = p.k / 32u;
    let b = gid.x;
    let r = gid.y;
    if (b >= nb || r >= p.m) {
        return;
    }
    let src = p.x_off + r * p.k + b * 32u;
    var v: array<f32, 32>;
    var amax = 0.0;
    var ss = 0.0;
    for (var i = 0u; i < 32u; i++) {
        var x = act[src + i];
        ss += x * x;
        if (p.norm_off != NO_NORM) {
            let e = p.norm_off + b * 32u + i;
            x *= bitcast<f32>(wbuf[e / 4u][e % 4u]);
        }
        v[i] = x;
        amax = max(amax, abs(x));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (d > 0.0) {
        id = 1.0 / d;
    }
    let o = p.y_off + (r * nb + b) * 12u;
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var j = 0u; j < 4u; j++) {
            let q = clamp(i32(round(v[4u * w + j] * id)), -127, 127);
            sum += q;
            word |= (bitcast<u32>(q) & 255u) << (8u * j);
        }
        act[o + w] = bitcast<f32>(word);
    }
    act[o + 8u] = d;
    act[o + 9u] = d * f32(sum);
    act[o + 10u] = ss;
    act[o + 11u] = 0.0;
}
"#;

// Generator of `chain.wgsl`: the persistent chain of the CPU form, one
// dispatch that runs a whole sequence of the decode iteration's dispatch
// groups (the f32 products and the image attention), each group's
// workgroups spread over the chain's few workgroups, with a grid barrier
// (an atomic counter) between groups instead of a pipeline barrier and a
// new dispatch.
//
// Why: on a CPU device (lavapipe) every dispatch hands its workgroups to the
// driver's worker threads and waits for them: tens of microseconds of
// wake-ups a group (more in a virtual machine whose idle vCPUs halt), paid
// 154 times an iteration. The chain's workgroups are as many as the
// driver's threads, so each stays on its thread for the whole chain and a
// grid barrier costs about a microsecond (spinning on the counter).
//
// The chain's code is the products' own: the text of `qmatmul_gen`'s f32
// section and `qmatmul8_gen`'s int8 one (the packed pairs: an iteration with
// int8 activations chains as an f32 one does) with the chosen entry points
// turned into functions (the
// `@compute` attributes and builtins dropped) and the push constants `p`
// made a private variable that the chain loads from the step's record in
// the metadata buffer: the same arithmetic on the same values, so a
// chained iteration computes the same bits as the dispatched one. The
// products read x and the norm vector through the uniform windows as
// dispatched (llvmpipe issues a storage-buffer load lane by lane: the first
// chain, which read them from the storage buffers, computed about 1.5x
// slower), so one placement of each window serves a whole chain: the host
// lays a small iteration's activations out so its x, attention output and
// h fit one window (`ActOffsets::compact`) and ends a chain where the next
// norm vector falls outside the weights window. The image attention is
// `kernels/attention.wgsl`'s `attend_img` and `attention_img`'s body with their
// parameters renamed (`AttParams`, `pa`); its split form (positions over the
// lanes, for few rows) `attention_img_split`'s body; its int8 form (the output
// also quantized for the `o` product) `attention_img_q81`'s body.
//
// Pure std, deterministic output (declared as a module of the build script).

use std::fmt::Write as _;

/// The product entry points the chain runs, in kind order (kind `1 + i`;
/// kind 0 is the image attention, the kinds after them its split form and
/// its int8 form). `chain_kinds()` gives the host the same table. The f32
/// products (the first [`F32_PRODUCTS`]), then the packed pairs (int8
/// activations on CPU devices: plain, with RoPE and the KV append, and
/// reading the GLU's half blocks).
const PRODUCTS: [&str; 7] = [
    "qmm_q41_r1",
    "qmm_q41_r1_rkv",
    "qmm_q80_r1",
    "qmm_q80_r1_rkv",
    "qmm8_q41_r1_swar",
    "qmm8_q41_r1_swar_rkv",
    "qmm8_q41_r1_swar_h",
];

/// [`PRODUCTS`]' f32 products (the rest take int8 activations).
const F32_PRODUCTS: usize = 4;

/// The chain's two families of entry points: `chain_r<T>` runs an f32
/// iteration's kinds (the image attention, the f32 products, the split
/// attention), `chain8_r<T>` an int8 one's (the packed pairs, the int8
/// attention). An iteration is one or the other, and llvmpipe pays a masked
/// turn of every kind's loop a step, so neither family carries the other's.
pub const FAMILIES: [&str; 2] = ["chain", "chain8"];

/// The kinds family `f` ([`FAMILIES`]) runs.
fn family_kinds(f: usize) -> Vec<usize> {
    let products = 1..=PRODUCTS.len();
    match f {
        0 => std::iter::once(0)
            .chain(products.take(F32_PRODUCTS))
            .chain([split_kind()])
            .collect(),
        _ => products.skip(F32_PRODUCTS).chain([q81_kind()]).collect(),
    }
}

/// Token rows per invocation of the chain's entry points (`chain_r<T>`):
/// each runs [`PRODUCTS`]' `_r<T>` twins (the CPU form's tiles with an
/// `_rkv` twin), so an iteration of up to 4 rows has a chain.
pub const TILES: [u32; 3] = [1, 2, 4];

/// [`PRODUCTS`]' names for tile `t`.
fn products_of(t: u32) -> Vec<String> {
    PRODUCTS
        .iter()
        .map(|p| p.replacen("_r1", &format!("_r{t}"), 1))
        .collect()
}

/// The chain's entry points, one a family and tile (`chain_r1`, ...,
/// `chain8_r1`, ...).
pub fn chain_entries() -> Vec<String> {
    FAMILIES
        .iter()
        .flat_map(|f| TILES.iter().map(move |t| format!("{f}_r{t}")))
        .collect()
}

/// Polls of the grid barrier's counter a round (unrolled: a round is one
/// turn of a loop, against llvmpipe's loop budget).
pub const POLLS: u32 = 256;

/// Words of one step's record in the metadata buffer: kind, grid x, grid
/// y, 0, then the step's parameters (`Params` or `AttParams`, at most 20
/// words).
pub const STEP_WORDS: u32 = 24;

/// The chain's kinds in order: `"attention_img"`, then [`PRODUCTS`] (tile
/// 1's names; tile t runs their `_r<t>` twins under the same kinds), then
/// `"attention_img_split"` and `"attention_img_q81"`.
pub fn chain_kinds() -> Vec<&'static str> {
    let mut v = vec!["attention_img"];
    v.extend(PRODUCTS);
    v.push("attention_img_split");
    v.push("attention_img_q81");
    v
}

/// The kind of the split attention (`attention_img_split`).
fn split_kind() -> usize {
    PRODUCTS.len() + 1
}

/// The kind of the int8 attention (`attention_img_q81`): the last.
fn q81_kind() -> usize {
    PRODUCTS.len() + 2
}

/// The fields `(name, is_f32)` of the struct `name` in `text`.
fn struct_fields(text: &str, name: &str) -> Vec<(String, bool)> {
    let start = text
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("chain_gen: no struct {name}"));
    let body = &text[start..];
    let end = body.find('}').expect("chain_gen: struct end");
    let body = &body[body.find('{').unwrap() + 1..end];
    let mut out = vec![];
    for line in body.lines() {
        let line = line.split("//").next().unwrap();
        for field in line.split(',') {
            let field = field.trim();
            if field.is_empty() {
                continue;
            }
            let (n, ty) = field.split_once(':').expect("chain_gen: field");
            let ty = ty.trim();
            assert!(ty == "u32" || ty == "f32", "chain_gen: field type {ty}");
            out.push((n.trim().to_string(), ty == "f32"));
        }
    }
    out
}

/// `text` from the line that starts with `from` to the first line `}` after it.
fn item<'a>(text: &'a str, from: &str) -> &'a str {
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("chain_gen: no {from:?}"));
    let rest = &text[start..];
    let end = rest.find("\n}\n").expect("chain_gen: item end") + 3;
    &rest[..end]
}

/// The products' module text (`qmatmul_gen::generate()`) made into the
/// chain's: only [`PRODUCTS`]' entry points kept, as functions; `p`
/// private; the windows read from storage.
fn products(qmatmul: &str) -> String {
    let mut out = String::with_capacity(qmatmul.len());
    let mut rest = qmatmul;
    while let Some(i) = rest.find("@compute @workgroup_size(") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let end = tail.find("\n}\n").expect("chain_gen: entry end") + 3;
        let entry = &tail[..end];
        let sig = entry.find("\nfn ").expect("chain_gen: entry fn") + 4;
        let name = &entry[sig..sig + entry[sig..].find('(').unwrap()];
        if TILES
            .iter()
            .any(|&t| products_of(t).iter().any(|p| p == name))
        {
            let f = entry[sig - 3..]
                .replacen("@builtin(workgroup_id) ", "", 1)
                .replacen("@builtin(local_invocation_index) ", "", 1)
                .replacen("@builtin(subgroup_invocation_id) ", "", 1);
            out.push_str(&f);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    for name in TILES.iter().flat_map(|&t| products_of(t)) {
        assert!(
            out.contains(&format!("\nfn {name}(wg: vec3<u32>, li: u32, sl: u32)")),
            "chain_gen: entry {name} not found with the CPU form's builtins"
        );
    }
    let out = out.replacen("var<immediate> p: Params;", "var<private> p: Params;", 1);
    assert!(out.contains("var<private> p: Params;"), "chain_gen: p");
    out
}

/// The image attention's parameters and `attend_img`, from
/// `kernels/attention.wgsl`'s text, renamed (`AttParams`, `pa`).
fn attention(att: &str) -> String {
    let params = item(att, "struct Params {").replacen("struct Params", "struct AttParams", 1);
    let head = item(att, "struct HeadOut {");
    let part = item(att, "struct HeadPart {");
    let head_q = rename_params(item(att, "fn head_q("));
    let attend_part = rename_params(item(att, "fn attend_img_part("));
    let attend = rename_params(item(att, "fn attend_img("));
    let neg = att
        .lines()
        .find(|l| l.starts_with("const NEG:"))
        .expect("chain_gen: NEG");
    // Kind 0 runs `attention_img`'s own body for invocation `idx` (64 a
    // workgroup there, 8 here); the int8 kind `attention_img_q81`'s the
    // same way.
    let one_invocation = |name: &str, as_fn: &str| {
        entry_body(
            att,
            &format!(
                "fn {name}(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    let idx = gid.x;\n"
            ),
            &format!("fn {as_fn}(idx: u32) {{\n"),
        )
    };
    let body = one_invocation("attention_img", "chain_attention");
    let q81_body = one_invocation("attention_img_q81", "chain_attention_q81");
    // The split kind runs `attention_img_split`'s body for workgroup `idx`
    // (one a (row, head) there too) on lane `sl`.
    let split_body = entry_body(
        att,
        "fn attention_img_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) sl: u32) {\n    let idx = wg.x;\n",
        "fn chain_attention_split(idx: u32, sl: u32) {\n",
    );
    format!(
        "{params}var<private> pa: AttParams;\n{neg}\n\n{head}\n{part}\n{head_q}\n{attend_part}\n{attend}\n{body}\n{split_body}\n{q81_body}"
    )
}

/// The entry point of `att` whose text starts with `sig` (its signature
/// and first line, checked) as the function `as_fn` (a signature and `{`),
/// its parameters renamed ([`rename_params`]).
fn entry_body(att: &str, sig: &str, as_fn: &str) -> String {
    let name = &sig[..sig.find('(').expect("chain_gen: signature")];
    let entry = item(att, &format!("{name}("));
    assert!(entry.starts_with(sig), "chain_gen: {name}'s first lines");
    rename_params(&entry.replacen(sig, as_fn, 1))
}

/// `text` with every `p.` that does not end a longer name turned into `pa.`.
fn rename_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut prev: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        let starts_name = !prev.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if ch == 'p' && starts_name && chars.peek() == Some(&'.') {
            out.push_str("pa");
        } else {
            out.push(ch);
        }
        prev = Some(ch);
    }
    out
}

/// A loader `fn <fn_name>(o: u32) -> <ty>` of the struct from `md[o ..]`.
fn loader(out: &mut String, fn_name: &str, ty: &str, fields: &[(String, bool)]) {
    assert!(
        fields.len() + 4 <= STEP_WORDS as usize,
        "chain_gen: {ty} too long"
    );
    writeln!(out, "fn {fn_name}(o: u32) -> {ty} {{").unwrap();
    writeln!(out, "    var v: {ty};").unwrap();
    for (i, (name, f)) in fields.iter().enumerate() {
        if *f {
            writeln!(out, "    v.{name} = bitcast<f32>(md[o + {i}u]);").unwrap();
        } else {
            writeln!(out, "    v.{name} = md[o + {i}u];").unwrap();
        }
    }
    out.push_str("    return v;\n}\n\n");
}

/// The chain module: `qmatmul` is `qmatmul_gen::generate()`'s text followed
/// by `qmatmul8_gen::generate()`'s, `att` `kernels/attention.wgsl`'s.
pub fn generate(qmatmul: &str, att: &str) -> String {
    let mut out = String::with_capacity(qmatmul.len() / 2);
    out.push_str(HEADER);
    out.push_str(&products(qmatmul));
    out.push('\n');
    out.push_str(&attention(att));
    out.push('\n');
    loader(
        &mut out,
        "step_params",
        "Params",
        &struct_fields(qmatmul, "Params"),
    );
    loader(
        &mut out,
        "step_att_params",
        "AttParams",
        &struct_fields(att, "Params"),
    );
    let mut polls = String::new();
    for _ in 0..POLLS {
        polls.push_str(
            "            if (atomicAdd(&sync[c.sync_off], 0u) >= goal) { ok = 1u; break; }\n",
        );
    }
    out.push_str(
        &ENTRY
            .replace("//POLLS\n", &polls)
            .replace("POLLS", &POLLS.to_string())
            .replace("STEP_WORDS", &format!("{STEP_WORDS}u")),
    );
    for (f, family) in FAMILIES.iter().enumerate() {
        for t in TILES {
            let products = products_of(t);
            let mut cases = String::new();
            for kind in family_kinds(f) {
                let call = match kind {
                    0 => "chain_attention(w * 8u + li);".to_string(),
                    k if k == split_kind() => "chain_attention_split(w, sl);".to_string(),
                    k if k == q81_kind() => "chain_attention_q81(w * 8u + li);".to_string(),
                    k => format!(
                        "{}(vec3<u32>(w % gx, w / gx, 0u), li, sl);",
                        products[k - 1]
                    ),
                };
                writeln!(
                    cases,
                    "        if (kind == {kind}u) {{\n            for (var w = g.x; w < total; w += nw.x) {{\n                {call}\n            }}\n        }}"
                )
                .unwrap();
            }
            out.push_str(
                &ENTRY_FN
                    .replace("//CASES\n", &cases)
                    .replace("FAMILY", family)
                    .replace("TILE", &t.to_string())
                    .replace("SPLIT_KIND", &split_kind().to_string())
                    .replace("Q81_KIND", &q81_kind().to_string())
                    .replace("STEP_WORDS", &format!("{STEP_WORDS}u")),
            );
        }
    }
    out
}

const HEADER: &str = "\
// chain.wgsl: generated by crates/vk/build/chain_gen.rs (see there); the
// entry points are `chain_r1`, `chain_r2` and `chain_r4` (f32 iterations) and
// `chain8_r1`, `chain8_r2` and `chain8_r4` (int8 ones) at the end.
";

const ENTRY: &str = r#"
// Push constants: the steps' records at md[prog_off ..] (STEP_WORDS words
// each), their count, the counter and abort flag at sync[sync_off],
// sync[sync_off + 1] (zeroed before the dispatch), how many rounds of POLLS
// polls a workgroup may wait at the chain's grid barriers in all, and the
// grid's width, the entry point's tile, the windows' placements and the
// entry point's family (the host's copies; the shader reads
// `num_workgroups`, and the windows are bound where w_at and x_at say).
struct Chain { prog_off: u32, n_steps: u32, sync_off: u32, spin_rounds: u32, workgroups: u32, tile: u32, w_at: u32, x_at: u32, family: u32 }
var<immediate> c: Chain;

@group(0) @binding(4) var<storage, read_write> sync: array<atomic<u32>>;

var<workgroup> chain_ok: u32;
// Rounds of polls this workgroup's invocation has made in the chain, all
// barriers together (lane 0; private variables start at 0).
var<private> polled: u32;

// Grid barrier `k` (0-based) of `n` workgroups: each arrives once (after its
// stores, which the read-modify-writes order before the arrival), then polls
// the counter until all `n` have arrived `k + 1` times. The polls are
// read-modify-writes (`atomicAdd(.., 0)`): llvmpipe compiles `atomicLoad`
// to a plain load that the compiler may hoist out of the loop. llvmpipe
// also ends every loop of a workgroup's invocation once the loops of that
// invocation have gone round 65535 times in all (one budget for the whole
// shader, see `chain.rs`), so the polls come POLLS to a round, unrolled,
// and the chain's rounds are counted: `spin_rounds` is what the host left
// of that budget after the steps' loops. A workgroup whose rounds run out
// (or that sees the abort flag) sets the flag and returns false: every workgroup then stops, and the host
// reruns the iteration dispatched (a device whose threads are fewer than
// the chain's workgroups would otherwise wait for ever).
fn grid_barrier(k: u32, n: u32, li: u32) -> bool {
    storageBarrier();
    if (li == 0u) {
        atomicAdd(&sync[c.sync_off], 1u);
        let goal = (k + 1u) * n;
        var ok = 0u;
        loop {
            if (polled >= c.spin_rounds) {
                break;
            }
            polled++;
//POLLS
            if (atomicAdd(&sync[c.sync_off + 1u], 0u) != 0u) {
                break;
            }
        }
        if (ok == 0u) {
            atomicStore(&sync[c.sync_off + 1u], 1u);
        }
        chain_ok = ok;
    }
    return workgroupUniformLoad(&chain_ok) == 1u;
}

"#;

/// The entry point `FAMILY_rTILE` (FAMILY, TILE, //CASES filled in).
const ENTRY_FN: &str = r#"
// The chain (FAMILY: the kinds below): step s's record is md[prog_off + s * STEP_WORDS ..]: kind,
// grid (gx, gy) of the dispatched form (attention: gx = ceil(invocations /
// 8); the split attention: a workgroup a (row, head)), 0, then its
// parameters. Workgroup w of the chain runs the step's
// workgroups w, w + n, w + 2n, ... (x fastest), then waits at the grid
// barrier. Grid: (n, 1, 1), n no more than the device runs at once.
@compute @workgroup_size(8)
fn FAMILY_rTILE(
    @builtin(workgroup_id) g: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    for (var s = 0u; s < c.n_steps; s++) {
        let o = c.prog_off + s * STEP_WORDS;
        let kind = md[o];
        let gx = md[o + 1u];
        let total = gx * md[o + 2u];
        if (kind == 0u || kind == SPLIT_KINDu || kind == Q81_KINDu) {
            pa = step_att_params(o + 4u);
        } else {
            p = step_params(o + 4u);
        }
        // One loop a kind, not a switch in one loop: llvmpipe runs every
        // branch of a switch or if with the lanes masked off, so a kind not
        // taken costs one masked turn of its loop here, not a masked copy of
        // its body in every turn (and this family's kinds only).
//CASES
        if (s + 1u < c.n_steps) {
            if (!grid_barrier(s, nw.x, li)) {
                break;
            }
        }
    }
}
"#;

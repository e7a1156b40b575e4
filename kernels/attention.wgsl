// attention: causal grouped-query attention of each (token row, query head) over its
// sequence's cached positions 0..=pos in the paged KV cache, with online softmax
// (running max and sum over chunks of 64 positions, flash-attention style).
// Query head h reads KV head h / (n_heads / n_kv_heads); scores are scaled by 1/sqrt(head_size).
//
// Shapes / layouts (f32 elements; offsets in elements):
//   md[rows_off ..]            row records [n_rows][4] u32: (token, seq, pos, block_table_off)
//   md[block_table_off ..]     the row's sequence's block table (u32 block ids)
//   act[q_off ..]              q [n_rows, dim] (dim = n_heads * head_size), after RoPE
//   kv[kc_off ..], kv[vc_off ..]   this layer's K and V caches [n_blocks, block_size, kv_dim]
//   act[out_off ..] (written)  out [n_rows, dim]
// Bindings (group 0): 1 act f32 (read_write), 2 kv f32 (read_write), 3 md u32 (read).
// head_size <= 256. llvmpipe (lavapipe) ends a shader invocation's loops after
// 65535 iterations in total (gallivm LP_MAX_TGSI_LOOP_ITERATIONS, shared by all
// loops of the invocation), so the host only picks `attention_lane` when
// head_size <= 64 and (max_pos + 1) * (2 * head_size + 2) + 2 * head_size stays
// under 60000.
// Six entry points, same parameters (results: see each):
// - `attention` (GPUs): one workgroup of 64 per (head, row), positions 64 at a
//   time: the chunk's K, then its V, staged through workgroup memory 64 dims at
//   a time (invocation li loads dim li of every position, so consecutive
//   invocations read consecutive floats of one cache row), each invocation
//   scoring its own position from there (d ascending) and turning its score
//   into a softmax weight (one exponential a position), then owning output
//   dims li, li+64, ...; one block-table lookup a position; grid (n_heads,
//   n_rows).
// - `attention_direct` (CPU devices past `attention_lane`'s loop budget): the
//   same workgroups and arithmetic, bit for bit, but each invocation reads its
//   position's K row and the V rows straight from the cache (llvmpipe gathers
//   per lane either way, and there the staging's extra loads, stores and
//   barriers measured about 1.3x slower over 2,000-3,000 positions).
// - `attention_lane` (CPU devices such as lavapipe, where workgroup barriers are
//   costly): one invocation per (row, head), no workgroup memory; q and the
//   output accumulator in private arrays (head_size <= 64), online softmax one
//   position at a time; workgroup 64; grid (ceil(n_rows * n_heads / 64), 1).

// - `attention_img` (CPU devices, the first choice there): `attention_lane` over the
//   KV cache held in the storage image (binding 7; see `kv_append_img`: position t of
//   a sequence is row md[bt + t / block_size], texels (t % block_size) * kv_dim / 4 ..
//   of layer kc_off (K) or vc_off (V)), which llvmpipe fetches with vector address
//   arithmetic instead of one bounds-checked load per lane; the loops over the head's
//   texels have a constant trip count (16, left early at head_size / 4) so the
//   compiler can unroll them and keep q and the accumulator out of per-lane scratch
//   memory (10-13% faster at 32-60 cached positions). head_size % 4 == 0 and
//   <= 64, kv_dim % 4 == 0; the same arithmetic per element as `attention_lane` (the
//   two forms agree bit for bit). Loop budget: (max_pos + 1) * (head_size / 2 + 1) +
//   head_size / 2 < 60000. Workgroup 64; grid (ceil(n_rows * n_heads / 64), 1).

//
// - `attention_img_q81` (CPU devices, int8 activations): `attention_img`, whose
//   invocation also quantizes the head it just wrote as the next product's Q8_1
//   blocks (qmatmul.wgsl's int8 section: 8 words of int8 codes, d, d * sum, the sum
//   of squares, 0; row stride dim / 32 blocks) at q_out: head h of row r is blocks
//   h * head_size / 32 .. of row r. Codes, d and d * sum are `quant_q81_win`'s bits
//   (the same expressions of the same values); the sum of squares is summed in
//   another order, so a consumer may use these blocks only without a fused norm
//   (the o product's input). head_size % 32 == 0 and dim % 32 == 0; one loop of
//   head_size / 4 iterations more in the loop budget.
//
// - `attention_img_split` (CPU devices, iterations of few rows at enough cached
//   positions: the host's cost model, `AttentionImageSplit::pays`): `attention_img`
//   with each (row, head)'s positions split over the 8 lanes of a workgroup, the
//   lanes' softmaxes merged with subgroup operations (see the entry point). Not the
//   same bits as `attention_img` (another summation order). Workgroup 8; grid
//   (n_rows * n_heads, 1).
struct Params {
    n_rows: u32, n_heads: u32, n_kv_heads: u32, head_size: u32,
    block_size: u32, rows_off: u32, q_off: u32, out_off: u32,
    kc_off: u32, vc_off: u32, kv_dim: u32, dim: u32,
    max_pos: u32, // largest position among the rows (the host picks the form by it)
    q_out: u32, // `attention_img_q81` only (the other entry points never read it)
}
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> kv: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

const WG: u32 = 64u;
const NEG: f32 = -3.4028235e38;
var<workgroup> qs: array<f32, 256>;
// `attention` and `attention_direct`: a chunk's scores, softmax weights and
// cache slots.
var<workgroup> sc: array<f32, 64>;
var<workgroup> ew: array<f32, 64>;
var<workgroup> slots: array<u32, 64>;
// `attention`: a chunk's K (then V) staged 64 dims at a time, one row of
// KVS_ROW floats per position (65: invocation li's reads of its own row,
// li * 65 + i, fall in distinct banks).
const KVS_ROW: u32 = 65u;
var<workgroup> kvs: array<f32, 4160>;
var<workgroup> n_pos_shared: u32;

fn slot_of(bt: u32, t: u32) -> u32 {
    return md[bt + t / p.block_size] * p.block_size + t % p.block_size;
}

// `attention` and `attention_direct`: what a workgroup (head h, row r)
// reads of its row.
struct AttRow {
    n_pos: u32,   // positions 0..=pos: pos + 1 (workgroup-uniform)
    bt: u32,      // the row's block table in md
    kv_head: u32, // the KV head's first dim in a cache row
    scale: f32,   // 1 / sqrt(head_size)
}

// Head h's q of row r into qs, and the row's AttRow (n_pos read uniformly,
// also a barrier: qs is ready).
fn att_begin(h: u32, r: u32, li: u32) -> AttRow {
    let hs = p.head_size;
    for (var d = li; d < hs; d += WG) {
        qs[d] = act[p.q_off + r * p.dim + h * hs + d];
    }
    if (li == 0u) {
        n_pos_shared = md[p.rows_off + r * 4u + 2u] + 1u;
    }
    let n_pos = workgroupUniformLoad(&n_pos_shared);
    let kvh = h / (p.n_heads / p.n_kv_heads);
    return AttRow(n_pos, md[p.rows_off + r * 4u + 3u], kvh * hs, 1.0 / sqrt(f32(hs)));
}

// The online softmax's step over a chunk: invocation li's score s (NEG
// past the chunk's cnt positions) into sc; after a barrier (the scores, and
// whatever the caller wrote before it, are ready) the chunk's max, the
// running sum l and accumulator acc rescaled to it, and invocation li < cnt's
// weight exp(s - max) in ew, ready after a second barrier. Returns the new
// running max (call in uniform control flow).
fn att_softmax(li: u32, cnt: u32, s: f32, m: f32, l: ptr<function, f32>, acc: ptr<function, array<f32, 4>>) -> f32 {
    sc[li] = s;
    workgroupBarrier();
    var cm = NEG;
    for (var j = 0u; j < cnt; j++) {
        cm = max(cm, sc[j]);
    }
    let m_new = max(m, cm);
    if (li < cnt) {
        ew[li] = exp(sc[li] - m_new);
    }
    let corr = exp(m - m_new);
    *l *= corr;
    for (var c = 0u; c < 4u; c++) {
        (*acc)[c] *= corr;
    }
    workgroupBarrier();
    return m_new;
}

// `attention`: dims d0 .. d0 + 63 of the chunk's cnt cached rows (K or V of
// this head, from `head`) into kvs, position j's at row j; invocation li
// loads dim d0 + li of each. Waits first for the previous dims' readers
// (d0 > 0), and after for the staging (a barrier both: call it in uniform
// control flow).
fn att_stage(head: u32, d0: u32, li: u32, cnt: u32) {
    if (d0 > 0u) {
        workgroupBarrier();
    }
    if (d0 + li < p.head_size) {
        for (var j = 0u; j < cnt; j++) {
            kvs[j * KVS_ROW + li] = kv[head + slots[j] * p.kv_dim + d0 + li];
        }
    }
    workgroupBarrier();
}

// Invocation li's output dims li, li + 64, ... of head h of row r.
fn att_store(h: u32, r: u32, li: u32, acc: array<f32, 4>, l: f32) {
    let hs = p.head_size;
    for (var c = 0u; c < 4u; c++) {
        let d = li + c * WG;
        if (d < hs) {
            act[p.out_off + r * p.dim + h * hs + d] = acc[c] / l;
        }
    }
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let r = wg.y;
    let hs = p.head_size;
    let row = att_begin(h, r, li);
    let n_pos = row.n_pos;
    let bt = row.bt;
    let scale = row.scale;
    let k_head = p.kc_off + row.kv_head;
    let v_head = p.vc_off + row.kv_head;
    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0); // dims li, li+64, li+128, li+192
    for (var t0 = 0u; t0 < n_pos; t0 += WG) {
        let t = t0 + li;
        let live = t < n_pos;
        let cnt = min(WG, n_pos - t0);
        // Five barriers a chunk when head_size <= 64 (the softmax weights'
        // own array saves the one before they overwrite the scores), one
        // more per further 64 dims of K and of V. The next chunk's first write (slots) is to
        // memory this chunk no longer reads once its V is staged.
        if (live) {
            slots[li] = slot_of(bt, t);
        }
        workgroupBarrier();
        // Scores: the chunk's K staged 64 dims at a time (invocation li
        // loads dim d0 + li of every position: consecutive invocations read
        // consecutive floats), then invocation li's own position's dot
        // product, d ascending as one loop over d would take it.
        var dot = 0.0;
        for (var d0 = 0u; d0 < hs; d0 += WG) {
            att_stage(k_head, d0, li, cnt);
            if (live) {
                let n = min(WG, hs - d0);
                for (var i = 0u; i < n; i++) {
                    dot += qs[d0 + i] * kvs[li * KVS_ROW + i];
                }
            }
        }
        var s = NEG;
        if (live) {
            s = dot * scale;
        }
        let m_new = att_softmax(li, cnt, s, m, &l, &acc);
        for (var j = 0u; j < cnt; j++) {
            l += ew[j];
        }
        // Values: staged 64 dims at a time as K was; invocation li adds
        // dim c * 64 + li, j ascending.
        for (var c = 0u; c < 4u; c++) {
            let d0 = c * WG;
            if (d0 >= hs) {
                break;
            }
            att_stage(v_head, d0, li, cnt);
            if (d0 + li < hs) {
                for (var j = 0u; j < cnt; j++) {
                    acc[c] += ew[j] * kvs[j * KVS_ROW + li];
                }
            }
        }
        m = m_new;
    }
    att_store(h, r, li, acc, l);
}

@compute @workgroup_size(64)
fn attention_direct(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let r = wg.y;
    let hs = p.head_size;
    let row = att_begin(h, r, li);
    let n_pos = row.n_pos;
    let bt = row.bt;
    let scale = row.scale;
    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0); // dims li, li+64, li+128, li+192
    for (var t0 = 0u; t0 < n_pos; t0 += WG) {
        let t = t0 + li;
        let cnt = min(WG, n_pos - t0);
        var s = NEG;
        if (t < n_pos) {
            let slot = slot_of(bt, t);
            slots[li] = slot;
            let kb = p.kc_off + slot * p.kv_dim + row.kv_head;
            var dot = 0.0;
            for (var d = 0u; d < hs; d++) {
                dot += qs[d] * kv[kb + d];
            }
            s = dot * scale;
        }
        let m_new = att_softmax(li, cnt, s, m, &l, &acc);
        for (var j = 0u; j < cnt; j++) {
            let e = ew[j];
            l += e;
            let vb = p.vc_off + slots[j] * p.kv_dim + row.kv_head;
            for (var c = 0u; c < 4u; c++) {
                let d = li + c * WG;
                if (d < hs) {
                    acc[c] += e * kv[vb + d];
                }
            }
        }
        m = m_new;
        workgroupBarrier(); // slots, sc and ew are read: the next chunk may write them
    }
    att_store(h, r, li, acc, l);
}

@compute @workgroup_size(64)
fn attention_lane(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x;
    if (idx >= p.n_rows * p.n_heads) {
        return;
    }
    let r = idx / p.n_heads;
    let h = idx % p.n_heads;
    let pos = md[p.rows_off + r * 4u + 2u];
    let bt = md[p.rows_off + r * 4u + 3u];
    let hs = p.head_size;
    let head = (h / (p.n_heads / p.n_kv_heads)) * hs;
    let scale = 1.0 / sqrt(f32(hs));
    // Query and accumulator in private memory (head_size <= 64 in this form).
    var q: array<f32, 64>;
    var acc: array<f32, 64>;
    let q_base = p.q_off + r * p.dim + h * hs;
    for (var d = 0u; d < hs; d++) {
        q[d] = act[q_base + d] * scale;
        acc[d] = 0.0;
    }
    var m = NEG;
    var l = 0.0;
    for (var t = 0u; t <= pos; t++) {
        let slot = slot_of(bt, t) * p.kv_dim + head;
        var s = 0.0;
        for (var d = 0u; d < hs; d++) {
            s += q[d] * kv[p.kc_off + slot + d];
        }
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let e = exp(s - m_new);
        l = l * corr + e;
        for (var d = 0u; d < hs; d++) {
            acc[d] = acc[d] * corr + e * kv[p.vc_off + slot + d];
        }
        m = m_new;
    }
    let out_base = p.out_off + r * p.dim + h * hs;
    for (var d = 0u; d < hs; d++) {
        act[out_base + d] = acc[d] / l;
    }
}

@group(0) @binding(7) var kv_img: texture_storage_2d_array<rgba32float, read_write>;

// One (row, head) of `attention_img`: the head's output (`acc / l`, head_size / 4
// vec4 used) with its row and head.
struct HeadOut {
    acc: array<vec4<f32>, 16>,
    r: u32,
    h: u32,
}

// A share of one (row, head) of the image attention: its positions t0, t0 + dt,
// .. up to the row's position, under a softmax of their own: the unnormalised
// output `acc` (head_size / 4 vec4 used), the running max `m` (NEG where the share
// has no position) and sum `l` of the exponentials. `attention_img` takes every
// position (t0 0, dt 1), `attention_img_split` one lane's in 8. Each of the
// `attend_img*` functions, `head_q` and their structs are copied into
// chain.wgsl by `crates/vk/build/chain_gen.rs`.
struct HeadPart {
    acc: array<vec4<f32>, 16>,
    m: f32,
    l: f32,
    r: u32,
    h: u32,
}

// Elements 4i .. 4i + 3 of (row, head) idx's query, scaled by 1 / sqrt(head_size).
fn head_q(idx: u32, i: u32) -> vec4<f32> {
    let r = idx / p.n_heads;
    let h = idx % p.n_heads;
    let scale = 1.0 / sqrt(f32(p.head_size));
    let b = p.q_off + r * p.dim + h * p.head_size + 4u * i;
    return vec4<f32>(act[b] * scale, act[b + 1u] * scale, act[b + 2u] * scale, act[b + 3u] * scale);
}

// `q`: (row, head) idx's query by `head_q` (head_size / 4 vec4 used).
fn attend_img_part(idx: u32, q: array<vec4<f32>, 16>, t0: u32, dt: u32) -> HeadPart {
    let r = idx / p.n_heads;
    let h = idx % p.n_heads;
    let pos = md[p.rows_off + r * 4u + 2u];
    let bt = md[p.rows_off + r * 4u + 3u];
    let hs = p.head_size;
    let d4 = hs / 4u;
    let kv4 = p.kv_dim / 4u;
    let head4 = (h / (p.n_heads / p.n_kv_heads)) * d4;
    var acc: array<vec4<f32>, 16>; // zeros
    var m = NEG;
    var l = 0.0;
    for (var t = t0; t <= pos; t += dt) {
        let at = vec2<u32>((t % p.block_size) * kv4 + head4, md[bt + t / p.block_size]);
        var s = 0.0;
        for (var i = 0u; i < 16u; i++) {
            if (i >= d4) { break; }
            let kk = textureLoad(kv_img, at + vec2<u32>(i, 0u), p.kc_off);
            let qq = q[i];
            s += qq.x * kk.x;
            s += qq.y * kk.y;
            s += qq.z * kk.z;
            s += qq.w * kk.w;
        }
        let m_new = max(m, s);
        let corr = exp(m - m_new);
        let e = exp(s - m_new);
        l = l * corr + e;
        for (var i = 0u; i < 16u; i++) {
            if (i >= d4) { break; }
            let vv = textureLoad(kv_img, at + vec2<u32>(i, 0u), p.vc_off);
            acc[i] = acc[i] * corr + e * vv;
        }
        m = m_new;
    }
    var out: HeadPart;
    out.acc = acc;
    out.m = m;
    out.l = l;
    out.r = r;
    out.h = h;
    return out;
}


fn attend_img(idx: u32) -> HeadOut {
    var q: array<vec4<f32>, 16>;
    for (var i = 0u; i < 16u; i++) {
        if (i >= p.head_size / 4u) { break; }
        q[i] = head_q(idx, i);
    }
    let part = attend_img_part(idx, q, 0u, 1u);
    var out: HeadOut;
    out.r = part.r;
    out.h = part.h;
    for (var i = 0u; i < 16u; i++) {
        if (i >= p.head_size / 4u) { break; }
        out.acc[i] = part.acc[i] / part.l;
    }
    return out;
}

@compute @workgroup_size(64)
fn attention_img(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x;
    if (idx >= p.n_rows * p.n_heads) {
        return;
    }
    let o = attend_img(idx);
    let out_base = p.out_off + o.r * p.dim + o.h * p.head_size;
    for (var i = 0u; i < 16u; i++) {
        if (i >= p.head_size / 4u) { break; }
        let v = o.acc[i];
        let at = out_base + 4u * i;
        act[at] = v.x;
        act[at + 1u] = v.y;
        act[at + 2u] = v.z;
        act[at + 3u] = v.w;
    }
}

// `attention_img_split`: one workgroup of 8 lanes (one subgroup) per (row, head),
// lane l taking positions l, l + 8, .. (`attend_img_part`), then the 8 shares'
// softmaxes merged: the largest max, each share's sum and output rescaled to it
// and summed across the lanes (flash-decoding's split over the positions). The
// host runs it for iterations of few rows, where `attention_img`'s one invocation a
// (row, head) leaves the threads idle: at one row a model with 9 heads is 9
// workgroups of 8 lanes instead of one workgroup with 9 live lanes. Same
// conditions and loop budget as `attention_img`; needs subgroups. Grid
// (n_rows * n_heads, 1, 1).
@compute @workgroup_size(8)
fn attention_img_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) sl: u32) {
    let idx = wg.x;
    // Lane l loads the query's vec4 l and l + 8, then the lanes share them.
    let d4 = p.head_size / 4u;
    var mine0 = vec4<f32>(0.0);
    var mine1 = vec4<f32>(0.0);
    if (sl < d4) {
        mine0 = head_q(idx, sl);
    }
    if (sl + 8u < d4) {
        mine1 = head_q(idx, sl + 8u);
    }
    var q: array<vec4<f32>, 16>;
    q[0] = subgroupBroadcast(mine0, 0u);
    q[1] = subgroupBroadcast(mine0, 1u);
    q[2] = subgroupBroadcast(mine0, 2u);
    q[3] = subgroupBroadcast(mine0, 3u);
    q[4] = subgroupBroadcast(mine0, 4u);
    q[5] = subgroupBroadcast(mine0, 5u);
    q[6] = subgroupBroadcast(mine0, 6u);
    q[7] = subgroupBroadcast(mine0, 7u);
    q[8] = subgroupBroadcast(mine1, 0u);
    q[9] = subgroupBroadcast(mine1, 1u);
    q[10] = subgroupBroadcast(mine1, 2u);
    q[11] = subgroupBroadcast(mine1, 3u);
    q[12] = subgroupBroadcast(mine1, 4u);
    q[13] = subgroupBroadcast(mine1, 5u);
    q[14] = subgroupBroadcast(mine1, 6u);
    q[15] = subgroupBroadcast(mine1, 7u);
    let part = attend_img_part(idx, q, sl, 8u);
    let m = subgroupMax(part.m);
    let f = exp(part.m - m);
    let l = subgroupAdd(part.l * f);
    let out_base = p.out_off + part.r * p.dim + part.h * p.head_size;
    for (var i = 0u; i < 16u; i++) {
        if (i >= p.head_size / 4u) { break; }
        let v = subgroupAdd(part.acc[i] * f) / l;
        if (i % 8u == sl) {
            let at = out_base + 4u * i;
            act[at] = v.x;
            act[at + 1u] = v.y;
            act[at + 2u] = v.z;
            act[at + 3u] = v.w;
        }
    }
}

@compute @workgroup_size(64)
fn attention_img_q81(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x;
    if (idx >= p.n_rows * p.n_heads) {
        return;
    }
    let o = attend_img(idx);
    let d4 = p.head_size / 4u;
    let out_base = p.out_off + o.r * p.dim + o.h * p.head_size;
    // The stores, with each block's largest magnitude and sum of squares
    // (head_size <= 64: at most two blocks).
    var amax = vec2<f32>(0.0);
    var ss = vec2<f32>(0.0);
    for (var i = 0u; i < 16u; i++) {
        if (i >= d4) { break; }
        let v = o.acc[i];
        let at = out_base + 4u * i;
        act[at] = v.x;
        act[at + 1u] = v.y;
        act[at + 2u] = v.z;
        act[at + 3u] = v.w;
        let ax = abs(v);
        let a = max(max(ax.x, ax.y), max(ax.z, ax.w));
        let b = i / 8u;
        amax[b] = max(amax[b], a);
        ss[b] += dot(v, v);
    }
    let d = amax / 127.0;
    var id = vec2<f32>(0.0);
    for (var b = 0u; b < 2u; b++) {
        if (d[b] > 0.0) {
            id[b] = 1.0 / d[b];
        }
    }
    let qb = p.q_out + (o.r * (p.dim / 32u) + o.h * (p.head_size / 32u)) * 12u;
    var sum = vec2<i32>(0);
    for (var i = 0u; i < 16u; i++) {
        if (i >= d4) { break; }
        let b = i / 8u;
        let q = clamp(vec4<i32>(round(o.acc[i] * id[b])), vec4<i32>(-127), vec4<i32>(127));
        let u = bitcast<vec4<u32>>(q) & vec4<u32>(255u);
        act[qb + b * 12u + i % 8u] = bitcast<f32>(u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u));
        sum[b] += q.x + q.y + q.z + q.w;
    }
    for (var b = 0u; b < 2u; b++) {
        if (b * 8u >= d4) { break; }
        let at = qb + b * 12u;
        act[at + 8u] = d[b];
        act[at + 9u] = d[b] * f32(sum[b]);
        act[at + 10u] = ss[b];
        act[at + 11u] = 0.0;
    }
}

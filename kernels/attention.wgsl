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
// Workgroup: 64; grid (n_heads, n_rows). head_size <= 256.

struct Params {
    n_rows: u32, n_heads: u32, n_kv_heads: u32, head_size: u32,
    block_size: u32, rows_off: u32, q_off: u32, out_off: u32,
    kc_off: u32, vc_off: u32, kv_dim: u32, dim: u32,
}
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> kv: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

const WG: u32 = 64u;
const NEG: f32 = -3.4028235e38;
var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> n_pos_shared: u32;

fn slot_of(bt: u32, t: u32) -> u32 {
    return md[bt + t / p.block_size] * p.block_size + t % p.block_size;
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let r = wg.y;
    let pos = md[p.rows_off + r * 4u + 2u];
    let bt = md[p.rows_off + r * 4u + 3u];
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let hs = p.head_size;
    for (var d = li; d < hs; d += WG) {
        qs[d] = act[p.q_off + r * p.dim + h * hs + d];
    }
    if (li == 0u) {
        n_pos_shared = pos + 1u;
    }
    let n_pos = workgroupUniformLoad(&n_pos_shared); // also a barrier: qs is ready
    let scale = 1.0 / sqrt(f32(hs));
    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0); // dims li, li+64, li+128, li+192
    for (var t0 = 0u; t0 < n_pos; t0 += WG) {
        let t = t0 + li;
        var s = NEG;
        if (t < n_pos) {
            let kb = p.kc_off + slot_of(bt, t) * p.kv_dim + kvh * hs;
            var dot = 0.0;
            for (var d = 0u; d < hs; d++) {
                dot += qs[d] * kv[kb + d];
            }
            s = dot * scale;
        }
        sc[li] = s;
        workgroupBarrier();
        let cnt = min(WG, n_pos - t0);
        var cm = NEG;
        for (var j = 0u; j < cnt; j++) {
            cm = max(cm, sc[j]);
        }
        let m_new = max(m, cm);
        let corr = exp(m - m_new);
        l *= corr;
        for (var c = 0u; c < 4u; c++) {
            acc[c] *= corr;
        }
        for (var j = 0u; j < cnt; j++) {
            let e = exp(sc[j] - m_new);
            l += e;
            let vb = p.vc_off + slot_of(bt, t0 + j) * p.kv_dim + kvh * hs;
            for (var c = 0u; c < 4u; c++) {
                let d = li + c * WG;
                if (d < hs) {
                    acc[c] += e * kv[vb + d];
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        let d = li + c * WG;
        if (d < hs) {
            act[p.out_off + r * p.dim + h * hs + d] = acc[c] / l;
        }
    }
}

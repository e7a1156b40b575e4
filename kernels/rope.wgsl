// rope: rotary position embedding, llama2.c (run.c) convention, in place on q and k.
// For each even element index i of a row: head_dim = i % head_size,
// freq = 1 / 10000^(head_dim / head_size), angle = pos * freq, and the pair
// (v[i], v[i+1]) is rotated by angle; q over i < dim, k over i < kv_dim.
//
// Shapes / layouts (f32 elements; offsets in elements):
//   md[rows_off ..]            row records [n_rows][4] u32: (token, seq, pos, block_table_off)
//   act[q_off ..]  (in place)  q [n_rows, dim]
//   act[k_off ..]  (in place)  k [n_rows, kv_dim]
// Bindings (group 0): 1 act f32 (read_write), 3 md u32 (read).
// Workgroup: 64; grid (ceil(dim / 2 / 64), n_rows). Angles in radians.

struct Params {
    n_rows: u32, dim: u32, kv_dim: u32, head_size: u32, rows_off: u32, q_off: u32, k_off: u32,
    tab_off: u32, // `rope_tab`, `rope_kv*` only
    v_off: u32, block_size: u32, kc_off: u32, vc_off: u32, // `rope_kv*` only
}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> kv: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;
@group(0) @binding(7) var kv_img: texture_storage_2d_array<rgba32float, read_write>;

const TWO_PI: f32 = 6.283185307179586;

fn rotate(base: u32, c: f32, s: f32) {
    let v0 = act[base];
    let v1 = act[base + 1u];
    act[base] = v0 * c - v1 * s;
    act[base + 1u] = v0 * s + v1 * c;
}

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x * 2u;
    let r = gid.y;
    if (i >= p.dim || r >= p.n_rows) {
        return;
    }
    let pos = md[p.rows_off + r * 4u + 2u];
    let head_dim = i % p.head_size;
    let freq = 1.0 / pow(10000.0, f32(head_dim) / f32(p.head_size));
    var angle = f32(pos) * freq;
    angle = angle - TWO_PI * floor(angle / TWO_PI); // keep cos/sin in their accurate range
    let c = cos(angle);
    let s = sin(angle);
    rotate(p.q_off + r * p.dim + i, c, s);
    if (i < p.kv_dim) {
        rotate(p.k_off + r * p.kv_dim + i, c, s);
    }
}

// `rope_tab`: the same rotation with cos and sin of each (position, pair) read
// from a table in the weights buffer: weights[tab_off + (pos * head_size / 2 + i) * 2]
// = cos, + 1 = sin, for pair i = (element % head_size) / 2 of a head (any RoPE base;
// the host computes the table as the CPU reference does). Grid as `rope`.
@compute @workgroup_size(64)
fn rope_tab(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x * 2u;
    let r = gid.y;
    if (i >= p.dim || r >= p.n_rows) {
        return;
    }
    let pos = md[p.rows_off + r * 4u + 2u];
    let t = p.tab_off + (pos * (p.head_size / 2u) + (i % p.head_size) / 2u) * 2u;
    let c = weights[t];
    let s = weights[t + 1u];
    rotate(p.q_off + r * p.dim + i, c, s);
    if (i < p.kv_dim) {
        rotate(p.k_off + r * p.kv_dim + i, c, s);
    }
}

// `rope_kv_img` / `rope_kv`: `rope_tab` and `kv_append` in one dispatch: q turned in
// place, k turned and written with v straight into the KV cache (the image, in the
// `KvImage` layout, for `rope_kv_img`: layer kc_off / vc_off, row = block, texel
// (pos % block_size) * kv_dim / 4 + i; the buffer for `rope_kv`: kv[kc_off / vc_off +
// slot * kv_dim + e]); k in act is left unturned. One invocation per 4 elements (two
// pairs, head_size % 4 == 0): grid (ceil(dim / 4 / 64), n_rows).
fn turn(v: vec4<f32>, c: vec2<f32>, s: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(v.x * c.x - v.y * s.x, v.x * s.x + v.y * c.x, v.z * c.y - v.w * s.y, v.z * s.y + v.w * c.y);
}

fn rope_q4(i: u32, r: u32) {
    let e = 4u * i;
    let pos = md[p.rows_off + r * 4u + 2u];
    let t = p.tab_off + (pos * (p.head_size / 2u) + (e % p.head_size) / 2u) * 2u;
    let c = vec2<f32>(weights[t], weights[t + 2u]);
    let s = vec2<f32>(weights[t + 1u], weights[t + 3u]);
    let qb = p.q_off + r * p.dim + e;
    let q = turn(vec4<f32>(act[qb], act[qb + 1u], act[qb + 2u], act[qb + 3u]), c, s);
    act[qb] = q.x;
    act[qb + 1u] = q.y;
    act[qb + 2u] = q.z;
    act[qb + 3u] = q.w;
}

fn kv_turned(i: u32, r: u32) -> array<vec4<f32>, 2> {
    let e = 4u * i;
    let pos = md[p.rows_off + r * 4u + 2u];
    let t = p.tab_off + (pos * (p.head_size / 2u) + (e % p.head_size) / 2u) * 2u;
    let c = vec2<f32>(weights[t], weights[t + 2u]);
    let s = vec2<f32>(weights[t + 1u], weights[t + 3u]);
    let kb = p.k_off + r * p.kv_dim + e;
    let vb = p.v_off + r * p.kv_dim + e;
    let k = turn(vec4<f32>(act[kb], act[kb + 1u], act[kb + 2u], act[kb + 3u]), c, s);
    let v = vec4<f32>(act[vb], act[vb + 1u], act[vb + 2u], act[vb + 3u]);
    return array<vec4<f32>, 2>(k, v);
}

@compute @workgroup_size(64)
fn rope_kv_img(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (4u * i >= p.dim || r >= p.n_rows) {
        return;
    }
    rope_q4(i, r);
    if (4u * i < p.kv_dim) {
        let kv2 = kv_turned(i, r);
        let pos = md[p.rows_off + r * 4u + 2u];
        let bt = md[p.rows_off + r * 4u + 3u];
        let block = md[bt + pos / p.block_size];
        let at = vec2<u32>((pos % p.block_size) * (p.kv_dim / 4u) + i, block);
        textureStore(kv_img, at, p.kc_off, kv2[0]);
        textureStore(kv_img, at, p.vc_off, kv2[1]);
    }
}

@compute @workgroup_size(64)
fn rope_kv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (4u * i >= p.dim || r >= p.n_rows) {
        return;
    }
    rope_q4(i, r);
    if (4u * i < p.kv_dim) {
        let kv2 = kv_turned(i, r);
        let pos = md[p.rows_off + r * 4u + 2u];
        let bt = md[p.rows_off + r * 4u + 3u];
        let slot = md[bt + pos / p.block_size] * p.block_size + pos % p.block_size;
        let o = slot * p.kv_dim + 4u * i;
        for (var j = 0u; j < 4u; j++) {
            kv[p.kc_off + o + j] = kv2[0][j];
            kv[p.vc_off + o + j] = kv2[1][j];
        }
    }
}

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
    tab_off: u32, // `rope_tab` only
}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

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

// rmsnorm: out[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps), one workgroup per row.
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[in_off ..]             x [*, dim]; input row of output row r is r, or md[row_list + r]
//                              when row_list != 0xffffffff (gathers the sampled rows for the LM head)
//   weights[w_off ..]          w [dim]
//   act[out_off ..] (written)  out [n_rows, dim]  (must not overlap the input rows)
// Bindings (group 0): 0 weights f32 (read), 1 act f32 (read_write), 3 md u32 (read);
// `rmsnorm_win` reads 5 and 6 (the uniform windows over weights and act) instead of 0.
// eps = 1e-5 as llama2.c.
// Two entry points, same results:
// - `rmsnorm`: one workgroup of 64 per row (strided partial sums, tree reduction);
//   grid (n_rows, 1, 1).
// - `rmsnorm_win` (CPU devices such as lavapipe: no workgroup barriers, operand
//   loads through the uniform windows): one invocation per row, the sum of squares
//   in row order like the CPU reference; identity row list only; dim % 4 == 0. The
//   host splits the rows into chunks whose input rows fit the activation window:
//   in_off is then the chunk's first input row inside that window, w_off is inside
//   the weight window, and the chunk's rows are output rows row_base .. row_base +
//   n_rows (out_off stays an offset in act). Workgroup 64; grid (ceil(n_rows / 64), 1, 1).

struct Params {
    n_rows: u32, dim: u32, in_off: u32, out_off: u32, w_off: u32, row_list: u32, eps: f32,
    row_base: u32, // `rmsnorm_win` only
}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn rmsnorm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wg.x;
    var src = r;
    if (p.row_list != 0xffffffffu) {
        src = md[p.row_list + r];
    }
    let in_base = p.in_off + src * p.dim;
    var s = 0.0;
    for (var i = li; i < p.dim; i += 64u) {
        let v = act[in_base + i];
        s += v * v;
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] += red[li + k];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
    let out_base = p.out_off + r * p.dim;
    for (var i = li; i < p.dim; i += 64u) {
        act[out_base + i] = weights[p.w_off + i] * (inv * act[in_base + i]);
    }
}

struct Window {
    v: array<vec4<f32>, 4096>,
}
@group(0) @binding(5) var<uniform> wwin: Window;
@group(0) @binding(6) var<uniform> xwin: Window;

@compute @workgroup_size(64)
fn rmsnorm_win(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.n_rows) {
        return;
    }
    let d4 = p.dim / 4u;
    let xb = p.in_off / 4u + r * d4;
    var s = 0.0;
    for (var i = 0u; i < d4; i++) {
        let v = xwin.v[xb + i];
        s += v.x * v.x;
        s += v.y * v.y;
        s += v.z * v.z;
        s += v.w * v.w;
    }
    let inv = 1.0 / sqrt(s / f32(p.dim) + p.eps);
    let wb = p.w_off / 4u;
    let o = p.out_off + (p.row_base + r) * p.dim;
    for (var i = 0u; i < d4; i++) {
        let v = xwin.v[xb + i];
        let w = wwin.v[wb + i];
        act[o + 4u * i] = w.x * (inv * v.x);
        act[o + 4u * i + 1u] = w.y * (inv * v.y);
        act[o + 4u * i + 2u] = w.z * (inv * v.z);
        act[o + 4u * i + 3u] = w.w * (inv * v.w);
    }
}

// rmsnorm: out[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps), one workgroup per row.
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[in_off ..]             x [*, dim]; input row of output row r is r, or md[row_list + r]
//                              when row_list != 0xffffffff (gathers the sampled rows for the LM head)
//   weights[w_off ..]          w [dim]
//   act[out_off ..] (written)  out [n_rows, dim]  (must not overlap the input rows)
// Bindings (group 0): 0 weights f32 (read), 1 act f32 (read_write), 3 md u32 (read).
// Workgroup: 64; grid (n_rows, 1, 1). eps = 1e-5 as llama2.c.

struct Params { n_rows: u32, dim: u32, in_off: u32, out_off: u32, w_off: u32, row_list: u32, eps: f32 }
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

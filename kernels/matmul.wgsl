// matmul: batched tiled f32 matmul over the packed token rows,
//   y[m, n] (+)= sum_k x[m, k] * W[n, k]      (W row-major [out = N, in = K], llama2.c)
// With accumulate != 0 the product is added to y (the residual add x += W.h).
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[x_off ..]              x [M, K], row-major
//   weights[w_off ..]          W [N, K], row-major
//   act[y_off ..]  (written)   y [M, N], row-major (must not overlap x)
// Bindings (group 0): 0 weights f32 (read), 1 act f32 (read_write).
// Workgroup: 16 x 16, one output per invocation, K walked in tiles of 16 through
// workgroup memory; grid (ceil(N / 16), ceil(M / 16)).

struct Params { m: u32, n: u32, k: u32, x_off: u32, w_off: u32, y_off: u32, accumulate: u32 }
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

const T: u32 = 16u;
var<workgroup> xs: array<f32, 256>; // [T rows of x][T k]
var<workgroup> ws: array<f32, 256>; // [T rows of W][T k]

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.y * T + lid.y; // m
    let col = wg.x * T + lid.x; // n
    let wrow = wg.x * T + lid.y; // row of W this invocation loads
    var acc = 0.0;
    for (var t = 0u; t < p.k; t += T) {
        let kk = t + lid.x;
        var xv = 0.0;
        if (row < p.m && kk < p.k) {
            xv = act[p.x_off + row * p.k + kk];
        }
        var wv = 0.0;
        if (wrow < p.n && kk < p.k) {
            wv = weights[p.w_off + wrow * p.k + kk];
        }
        xs[lid.y * T + lid.x] = xv;
        ws[lid.y * T + lid.x] = wv;
        workgroupBarrier();
        for (var j = 0u; j < T; j++) {
            acc += xs[lid.y * T + j] * ws[lid.x * T + j];
        }
        workgroupBarrier();
    }
    if (row < p.m && col < p.n) {
        let o = p.y_off + row * p.n + col;
        if (p.accumulate != 0u) {
            act[o] += acc;
        } else {
            act[o] = acc;
        }
    }
}

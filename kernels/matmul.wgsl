// matmul: batched tiled f32 matmul over the packed token rows,
//   y[m, n] (+)= sum_k x[m, k] * W[n, k]      (W row-major [out = N, in = K], llama2.c)
// With accumulate != 0 the product is added to y (the residual add x += W.h).
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[x_off ..]              x [M, K], row-major
//   weights[w_off ..]          W [N, K], row-major
//   act[y_off ..]  (written)   y [M, N], row-major (must not overlap x), or split by
//                              columns: n < n1 -> y1 [M, n1] at y_off, n1 <= n < n1 + n2 ->
//                              y2 [M, n2] at y2_off, the rest -> y3 [M, N - n1 - n2] at y3_off
//                              (one dispatch for q|k|v or w1|w3 with the weights stacked;
//                              a plain matmul has n1 = N, n2 = 0)
// Bindings (group 0): 0 weights f32 (read), 1 act f32 (read_write); `matmul_win`
// also reads 5 (uniform window over the weights) and 6 (uniform window over act).
//
// Five entry points, same results:
// - `matmul_tiled` (GPUs): workgroup 16 x 16, one output per invocation, K
//   walked in tiles of 16 through workgroup memory; grid (ceil(N / 16), ceil(M / 16)).
// - CPU devices such as lavapipe (workgroup barriers switch between all of a
//   workgroup's fibers, and every storage load is issued lane by lane): no
//   workgroup memory; each invocation keeps a register tile so each load feeds
//   several FMAs. K is summed in order (like the CPU reference).
//   `matmul8` (M >= 8): 8 rows x 8 columns per invocation; workgroup 64;
//   grid (ceil(N / 512), ceil(M / 8)).
//   `matmul` (4 <= M < 8): 4 rows x 4 columns per invocation; workgroup 64;
//   grid (ceil(N / 256), ceil(M / 4)).
//   `matmul_vec` (M < 4): 1 row x 4 columns; workgroup 64; grid (ceil(N / 256), M).
//   llvmpipe ends an invocation's loops after 65535 iterations in total, so the
//   host picks these forms only for K < 60000 (the store loops add at most 72).
// - `matmul_win` (CPU devices, the first choice there): every operand load goes
//   through a uniform window (a uniform-buffer load is one vector gather on
//   llvmpipe, or a broadcast when every lane reads the same address, where a
//   storage load is issued lane by lane). The host splits the product into chunks
//   whose x rows and W rows each fit a 64 KiB window and dispatches one chunk at a
//   time with the windows placed over its operands (only where a window holds at
//   least 8 rows of each, K <= 2048 for 64 KiB, or all of an operand's: with fewer
//   the tile idles, the dispatches multiply and the storage forms are faster).
//   In this form m is the chunk's row count, x_off and w_off are offsets inside
//   the windows (multiples of 4),
//   rows m_base .. m_base + m and columns n_base .. n_base + n_count of the whole
//   product are computed, and n, n1, n2 keep describing the whole product's output
//   layout. Requires K % 4 == 0. 8 rows x 2 columns per invocation, K read as vec4,
//   summed in order per element (the same arithmetic as the other CPU forms, so
//   the forms agree bit for bit); workgroup 64; grid (ceil(n_count / 128), ceil(m / 8)).

struct Params {
    m: u32, n: u32, k: u32, x_off: u32, w_off: u32, y_off: u32, accumulate: u32,
    n1: u32, n2: u32, y2_off: u32, y3_off: u32,
    m_base: u32, n_base: u32, n_count: u32, // `matmul_win` only
}
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

const T: u32 = 16u;
var<workgroup> xs: array<f32, 256>; // [T rows of x][T k]
var<workgroup> ws: array<f32, 256>; // [T rows of W][T k]

@compute @workgroup_size(16, 16)
fn matmul_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
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
        store(row, col, acc);
    }
}

/// Writes (or adds) output (m, n) to its split destination.
fn store(m: u32, n: u32, v: f32) {
    var o: u32;
    if (n < p.n1) {
        o = p.y_off + m * p.n1 + n;
    } else if (n < p.n1 + p.n2) {
        o = p.y2_off + m * p.n2 + (n - p.n1);
    } else {
        o = p.y3_off + m * (p.n - p.n1 - p.n2) + (n - p.n1 - p.n2);
    }
    if (p.accumulate != 0u) {
        act[o] += v;
    } else {
        act[o] = v;
    }
}

// Register tile of the CPU forms: 4 output columns per invocation.
const NR: u32 = 4u;

@compute @workgroup_size(64)
fn matmul_vec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = (wg.x * 64u + li) * NR;
    let m = wg.y;
    if (n0 >= p.n) {
        return;
    }
    let last = min(NR, p.n - n0) - 1u; // columns past the end repeat the last one
    let kk = p.k;
    let w0 = p.w_off + n0 * kk;
    let w1 = p.w_off + (n0 + min(1u, last)) * kk;
    let w2 = p.w_off + (n0 + min(2u, last)) * kk;
    let w3 = p.w_off + (n0 + min(3u, last)) * kk;
    let x = p.x_off + m * kk;
    var a = vec4<f32>(0.0);
    for (var k = 0u; k < kk; k++) {
        let xv = act[x + k];
        a += xv * vec4<f32>(weights[w0 + k], weights[w1 + k], weights[w2 + k], weights[w3 + k]);
    }
    for (var c = 0u; c <= last; c++) {
        store(m, n0 + c, a[c]);
    }
}

@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = (wg.x * 64u + li) * NR;
    let m0 = wg.y * 4u;
    if (n0 >= p.n) {
        return;
    }
    let last_c = min(NR, p.n - n0) - 1u;
    let last_r = min(4u, p.m - m0) - 1u; // rows past the end repeat the last one (never stored)
    let kk = p.k;
    let w0 = p.w_off + n0 * kk;
    let w1 = p.w_off + (n0 + min(1u, last_c)) * kk;
    let w2 = p.w_off + (n0 + min(2u, last_c)) * kk;
    let w3 = p.w_off + (n0 + min(3u, last_c)) * kk;
    let x0 = p.x_off + m0 * kk;
    let x1 = x0 + min(1u, last_r) * kk;
    let x2 = x0 + min(2u, last_r) * kk;
    let x3 = x0 + min(3u, last_r) * kk;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var k = 0u; k < kk; k++) {
        let w = vec4<f32>(weights[w0 + k], weights[w1 + k], weights[w2 + k], weights[w3 + k]);
        a0 += act[x0 + k] * w;
        a1 += act[x1 + k] * w;
        a2 += act[x2 + k] * w;
        a3 += act[x3 + k] * w;
    }
    let rows = array<vec4<f32>, 4>(a0, a1, a2, a3);
    for (var r = 0u; r <= last_r; r++) {
        let v = rows[r];
        for (var c = 0u; c <= last_c; c++) {
            store(m0 + r, n0 + c, v[c]);
        }
    }
}

// `matmul8`: 8 rows x 8 columns per invocation (M >= 8): 16 loads per k feed 64
// FMAs, against 8 per 16 in `matmul`; llvmpipe issues storage loads lane by lane,
// so loads, not FMAs, are what a row costs. workgroup 64;
// grid (ceil(N / 512), ceil(M / 8)).
@compute @workgroup_size(64)
fn matmul8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = (wg.x * 64u + li) * 8u;
    let m0 = wg.y * 8u;
    if (n0 >= p.n) {
        return;
    }
    let last_c = min(8u, p.n - n0) - 1u; // columns past the end repeat the last one (never stored)
    let last_r = min(8u, p.m - m0) - 1u; // rows past the end repeat the last one (never stored)
    let kk = p.k;
    let w0 = p.w_off + n0 * kk;
    let w1 = p.w_off + (n0 + min(1u, last_c)) * kk;
    let w2 = p.w_off + (n0 + min(2u, last_c)) * kk;
    let w3 = p.w_off + (n0 + min(3u, last_c)) * kk;
    let w4 = p.w_off + (n0 + min(4u, last_c)) * kk;
    let w5 = p.w_off + (n0 + min(5u, last_c)) * kk;
    let w6 = p.w_off + (n0 + min(6u, last_c)) * kk;
    let w7 = p.w_off + (n0 + min(7u, last_c)) * kk;
    let x0 = p.x_off + m0 * kk;
    let x1 = x0 + min(1u, last_r) * kk;
    let x2 = x0 + min(2u, last_r) * kk;
    let x3 = x0 + min(3u, last_r) * kk;
    let x4 = x0 + min(4u, last_r) * kk;
    let x5 = x0 + min(5u, last_r) * kk;
    let x6 = x0 + min(6u, last_r) * kk;
    let x7 = x0 + min(7u, last_r) * kk;
    var a0l = vec4<f32>(0.0);
    var a0h = vec4<f32>(0.0);
    var a1l = vec4<f32>(0.0);
    var a1h = vec4<f32>(0.0);
    var a2l = vec4<f32>(0.0);
    var a2h = vec4<f32>(0.0);
    var a3l = vec4<f32>(0.0);
    var a3h = vec4<f32>(0.0);
    var a4l = vec4<f32>(0.0);
    var a4h = vec4<f32>(0.0);
    var a5l = vec4<f32>(0.0);
    var a5h = vec4<f32>(0.0);
    var a6l = vec4<f32>(0.0);
    var a6h = vec4<f32>(0.0);
    var a7l = vec4<f32>(0.0);
    var a7h = vec4<f32>(0.0);
    for (var k = 0u; k < kk; k++) {
        let wl = vec4<f32>(weights[w0 + k], weights[w1 + k], weights[w2 + k], weights[w3 + k]);
        let wh = vec4<f32>(weights[w4 + k], weights[w5 + k], weights[w6 + k], weights[w7 + k]);
        let v0 = act[x0 + k];
        a0l += v0 * wl;
        a0h += v0 * wh;
        let v1 = act[x1 + k];
        a1l += v1 * wl;
        a1h += v1 * wh;
        let v2 = act[x2 + k];
        a2l += v2 * wl;
        a2h += v2 * wh;
        let v3 = act[x3 + k];
        a3l += v3 * wl;
        a3h += v3 * wh;
        let v4 = act[x4 + k];
        a4l += v4 * wl;
        a4h += v4 * wh;
        let v5 = act[x5 + k];
        a5l += v5 * wl;
        a5h += v5 * wh;
        let v6 = act[x6 + k];
        a6l += v6 * wl;
        a6h += v6 * wh;
        let v7 = act[x7 + k];
        a7l += v7 * wl;
        a7h += v7 * wh;
    }
    let lo = array<vec4<f32>, 8>(a0l, a1l, a2l, a3l, a4l, a5l, a6l, a7l);
    let hi = array<vec4<f32>, 8>(a0h, a1h, a2h, a3h, a4h, a5h, a6h, a7h);
    for (var r = 0u; r <= last_r; r++) {
        let l = lo[r];
        let h = hi[r];
        for (var c = 0u; c <= last_c; c++) {
            if (c < 4u) {
                store(m0 + r, n0 + c, l[c]);
            } else {
                store(m0 + r, n0 + c, h[c - 4u]);
            }
        }
    }
}

// The uniform windows: 64 KiB blocks placed by the host per dispatch.
struct Window {
    v: array<vec4<f32>, 4096>,
}
@group(0) @binding(5) var<uniform> wwin: Window;
@group(0) @binding(6) var<uniform> xwin: Window;

/// `a` plus x . w over one vec4 of K, one product at a time in K order.
fn acc4(a: f32, x: vec4<f32>, w: vec4<f32>) -> f32 {
    var s = a;
    s += x.x * w.x;
    s += x.y * w.y;
    s += x.z * w.z;
    s += x.w * w.w;
    return s;
}

@compute @workgroup_size(64)
fn matmul_win(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c0 = (wg.x * 64u + li) * 2u; // chunk column
    let r0 = wg.y * 8u; // chunk row
    if (c0 >= p.n_count) {
        return;
    }
    let last_c = min(2u, p.n_count - c0) - 1u; // a column past the end repeats the last (never stored)
    let last_r = min(8u, p.m - r0) - 1u; // rows past the end repeat the last (never stored)
    let k4 = p.k / 4u;
    let w0 = p.w_off / 4u + c0 * k4;
    let w1 = w0 + last_c * k4;
    let x0 = p.x_off / 4u + r0 * k4;
    let x1 = x0 + min(1u, last_r) * k4;
    let x2 = x0 + min(2u, last_r) * k4;
    let x3 = x0 + min(3u, last_r) * k4;
    let x4 = x0 + min(4u, last_r) * k4;
    let x5 = x0 + min(5u, last_r) * k4;
    let x6 = x0 + min(6u, last_r) * k4;
    let x7 = x0 + min(7u, last_r) * k4;
    var a00 = 0.0; var a01 = 0.0; var a10 = 0.0; var a11 = 0.0;
    var a20 = 0.0; var a21 = 0.0; var a30 = 0.0; var a31 = 0.0;
    var a40 = 0.0; var a41 = 0.0; var a50 = 0.0; var a51 = 0.0;
    var a60 = 0.0; var a61 = 0.0; var a70 = 0.0; var a71 = 0.0;
    for (var k = 0u; k < k4; k++) {
        let wa = wwin.v[w0 + k];
        let wb = wwin.v[w1 + k];
        let v0 = xwin.v[x0 + k];
        a00 = acc4(a00, v0, wa);
        a01 = acc4(a01, v0, wb);
        let v1 = xwin.v[x1 + k];
        a10 = acc4(a10, v1, wa);
        a11 = acc4(a11, v1, wb);
        let v2 = xwin.v[x2 + k];
        a20 = acc4(a20, v2, wa);
        a21 = acc4(a21, v2, wb);
        let v3 = xwin.v[x3 + k];
        a30 = acc4(a30, v3, wa);
        a31 = acc4(a31, v3, wb);
        let v4 = xwin.v[x4 + k];
        a40 = acc4(a40, v4, wa);
        a41 = acc4(a41, v4, wb);
        let v5 = xwin.v[x5 + k];
        a50 = acc4(a50, v5, wa);
        a51 = acc4(a51, v5, wb);
        let v6 = xwin.v[x6 + k];
        a60 = acc4(a60, v6, wa);
        a61 = acc4(a61, v6, wb);
        let v7 = xwin.v[x7 + k];
        a70 = acc4(a70, v7, wa);
        a71 = acc4(a71, v7, wb);
    }
    let first = array<f32, 8>(a00, a10, a20, a30, a40, a50, a60, a70);
    let second = array<f32, 8>(a01, a11, a21, a31, a41, a51, a61, a71);
    for (var r = 0u; r <= last_r; r++) {
        store(p.m_base + r0 + r, p.n_base + c0, first[r]);
        if (last_c == 1u) {
            store(p.m_base + r0 + r, p.n_base + c0 + 1u, second[r]);
        }
    }
}

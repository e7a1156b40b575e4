// peak: the device's own multiply-add ceiling, the second half of the
// roofline (issue 23, item 2). The machine's peaks (`--bench roofline`) say
// what these cores can do with hand-written vector code; these kernels say
// what this device's compiler makes of shader arithmetic on them: on
// lavapipe every invocation is a lane of llvmpipe's 8-wide code, and a
// multiply-add is whatever instructions llvmpipe emits for it.
//
// Each invocation runs `iters` turns of 8 unrolled steps over 12 independent
// accumulators (three vec4), every step `acc = acc * a + b`; the three forms
// differ only in how that is written:
//   peak_f32:     `acc * a + b` in f32 (what the products write);
//   peak_f32_fma: `fma(acc, a, b)`, the fused builtin;
//   peak_i32:     `acc * a + b` in i32 (the packed pairs' multiply-add:
//                 one 32-bit multiply makes two int8 x int4 products).
// With a = 1 and b = 1 (push constants, unknown to the compiler) every
// accumulator ends at its start + 8 * iters exactly (f32: while under 2^24),
// so the host checks that every turn ran: llvmpipe ends an invocation's loops
// silently after 65,535 turns in all, so `iters` stays under that.
//
// Shapes / layouts (offsets in elements; the i32 form's words are its
// accumulators' bits):
//   act[out_off ..]  [grid * 64]: each invocation's sum of its 12
//                     accumulators (f32; peak_i32 stores the i32's bits)
// Bindings (group 0): 1 act (read_write).
// Workgroup: 64 (two warps of a GPU, eight llvmpipe subgroups of 8 run one
// after the other on one thread: no barrier, so no fiber switch); grid
// (groups). Counting: one multiply-add is 2 ops; an invocation does
// 96 * iters of them.

struct Params { iters: u32, out_off: u32, a: u32, b: u32 }
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;

@compute @workgroup_size(64)
fn peak_f32(@builtin(global_invocation_id) gid: vec3<u32>) {
    let a = vec4<f32>(bitcast<f32>(p.a));
    let b = vec4<f32>(bitcast<f32>(p.b));
    var c0 = vec4<f32>(f32(gid.x & 255u));
    var c1 = c0 + 1.0;
    var c2 = c0 + 2.0;
    for (var i = 0u; i < p.iters; i++) {
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
    }
    let s = c0 + c1 + c2;
    act[p.out_off + gid.x] = s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(64)
fn peak_f32_fma(@builtin(global_invocation_id) gid: vec3<u32>) {
    let a = vec4<f32>(bitcast<f32>(p.a));
    let b = vec4<f32>(bitcast<f32>(p.b));
    var c0 = vec4<f32>(f32(gid.x & 255u));
    var c1 = c0 + 1.0;
    var c2 = c0 + 2.0;
    for (var i = 0u; i < p.iters; i++) {
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
        c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b);
    }
    let s = c0 + c1 + c2;
    act[p.out_off + gid.x] = s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(64)
fn peak_i32(@builtin(global_invocation_id) gid: vec3<u32>) {
    let a = vec4<i32>(bitcast<i32>(p.a));
    let b = vec4<i32>(bitcast<i32>(p.b));
    var c0 = vec4<i32>(i32(gid.x & 255u));
    var c1 = c0 + 1;
    var c2 = c0 + 2;
    for (var i = 0u; i < p.iters; i++) {
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b;
    }
    let s = c0 + c1 + c2;
    act[p.out_off + gid.x] = bitcast<f32>(s.x + s.y + s.z + s.w);
}

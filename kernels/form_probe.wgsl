// form_probe: the cost of a workgroup barrier on this device, measured once
// per device to choose the kernel form (crates/model/src/vulkan/form.rs).
// Two kernels do the same arithmetic, `iters` steps per invocation:
//   form_probe_barrier: each step trades a value with the next invocation
//     through workgroup memory between two workgroupBarrier()s
//     (acc = tile[(l + 1) % 64] * 0.5 + l);
//   form_probe_plain: no barrier, no workgroup memory (acc = acc * 0.5 + l).
// On a GPU a barrier costs a few cycles, so the two take about as long; on a
// CPU device (lavapipe) every barrier switches between the workgroup's
// fibers, so the first is many times slower.
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[out_off ..]  [n_groups * 64]: each invocation's final acc
// Bindings (group 0): 1 act f32 (read_write).
// Workgroup: 64; grid (n_groups).

struct Params { iters: u32, out_off: u32 }
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;

var<workgroup> tile: array<f32, 64>;

@compute @workgroup_size(64)
fn form_probe_barrier(
    @builtin(local_invocation_index) l: u32,
    @builtin(workgroup_id) g: vec3<u32>,
) {
    var acc = f32(l);
    for (var i = 0u; i < p.iters; i++) {
        tile[l] = acc;
        workgroupBarrier();
        acc = tile[(l + 1u) & 63u] * 0.5 + f32(l);
        workgroupBarrier();
    }
    act[p.out_off + g.x * 64u + l] = acc;
}

@compute @workgroup_size(64)
fn form_probe_plain(
    @builtin(local_invocation_index) l: u32,
    @builtin(workgroup_id) g: vec3<u32>,
) {
    var acc = f32(l);
    for (var i = 0u; i < p.iters; i++) {
        acc = acc * 0.5 + f32(l);
    }
    act[p.out_off + g.x * 64u + l] = acc;
}

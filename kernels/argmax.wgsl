// argmax: greedy next token for each sampled row: out[s] = argmax_i logits[s, i]
// (the lowest index wins a tie), one workgroup per row.
//
// Shapes / layouts:
//   act[logits_off ..]         logits [n_rows, vocab] f32
//   out[out_off ..] (written)  token ids [n_rows] u32
// Bindings (group 0): 1 act f32 (read_write), 4 out u32 (read_write).
// Workgroup: 64; grid (n_rows, 1, 1).

struct Params { n_rows: u32, vocab: u32, logits_off: u32, out_off: u32, groups: u32 }
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, 64>;
var<workgroup> best_i: array<u32, 64>;

// The workgroup's best (value, index) pair into best_v[0] / best_i[0]: each of the 64
// invocations offers its own (index 0xffffffff: none), and a tree keeps the larger
// value, the lower index among equal ones. Called by all 64 invocations (barriers).
fn workgroup_best(li: u32, bv: f32, bi: u32) {
    best_v[li] = bv;
    best_i[li] = bi;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            let ov = best_v[li + k];
            let oi = best_i[li + k];
            let mine = best_i[li];
            if (oi != 0xffffffffu && (mine == 0xffffffffu || ov > best_v[li] || (ov == best_v[li] && oi < mine))) {
                best_v[li] = ov;
                best_i[li] = oi;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wg.x;
    let base = p.logits_off + r * p.vocab;
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var i = li; i < p.vocab; i += 64u) {
        let v = act[base + i];
        if (bi == 0xffffffffu || v > bv) {
            bv = v;
            bi = i;
        }
    }
    workgroup_best(li, bv, bi);
    if (li == 0u) {
        out[p.out_off + r] = best_i[0];
    }
}

// `argmax_part`: finishes an argmax from per-group partials (written by the LM head's
// `qmm_*` in mode 3): row r's `groups` pairs (largest value, f32; its index, u32 bits)
// at act[logits_off + (r * groups + g) * 2]; the largest value wins, the earliest
// group among equal values (groups hold increasing index ranges, so that is the
// lowest index, as `argmax`). One invocation per row; grid (ceil(n_rows / 64)).
@compute @workgroup_size(64)
fn argmax_part(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.n_rows) {
        return;
    }
    let base = p.logits_off + r * p.groups * 2u;
    var bv = act[base];
    var bi = bitcast<u32>(act[base + 1u]);
    for (var g = 1u; g < p.groups; g++) {
        let v = act[base + 2u * g];
        if (v > bv) {
            bv = v;
            bi = bitcast<u32>(act[base + 2u * g + 1u]);
        }
    }
    out[p.out_off + r] = bi;
}

// `argmax_part_wg`: `argmax_part` with one workgroup per row (the GPU form, whose LM
// head writes `n / 4` partials a row: 12,288 for SmolLM2's vocabulary, which one
// invocation walked alone in about a millisecond on an H200). Each of the 64
// invocations keeps the best of groups li, li + 64, ... (strictly larger wins, so the
// earliest group among equal values), then a tree over the workgroup keeps the larger
// value, the lower token index among equal ones: the same token as `argmax_part`.
// Grid (n_rows, 1, 1).
@compute @workgroup_size(64)
fn argmax_part_wg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wg.x;
    let base = p.logits_off + r * p.groups * 2u;
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var g = li; g < p.groups; g += 64u) {
        let v = act[base + 2u * g];
        if (bi == 0xffffffffu || v > bv) {
            bv = v;
            bi = bitcast<u32>(act[base + 2u * g + 1u]);
        }
    }
    workgroup_best(li, bv, bi);
    if (li == 0u) {
        out[p.out_off + r] = best_i[0];
    }
}

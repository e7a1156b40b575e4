// swiglu: h1 = silu(h1) * h3 in place, silu(x) = x / (1 + exp(-x)) (llama2.c FFN gate).
//
// Shapes / layouts (f32 elements; offsets in elements):
//   act[h1_off ..] (in place)  w1 x  [n_rows, hidden_dim]
//   act[h3_off ..]             w3 x  [n_rows, hidden_dim]
// Bindings (group 0): 1 act f32 (read_write).
// Workgroup: 64; grid (ceil(hidden_dim / 64), n_rows).

struct Params { n_rows: u32, hidden_dim: u32, h1_off: u32, h3_off: u32 }
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;

@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.hidden_dim || r >= p.n_rows) {
        return;
    }
    let o = r * p.hidden_dim + i;
    let g = act[p.h1_off + o];
    act[p.h1_off + o] = g / (1.0 + exp(-g)) * act[p.h3_off + o];
}

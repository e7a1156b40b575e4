// embed: token embedding gather for the packed token rows of one iteration.
//
// Shapes / layouts (f32 elements unless said otherwise; all offsets in elements):
//   weights[emb_off ..]        token embedding table [vocab_size, dim], row-major (llama2.c)
//   md[rows_off ..]            row records [n_rows][4] u32: (token, seq, pos, block_table_off)
//   act[x_off ..]  (written)   x [n_rows, dim]
// Bindings (group 0): 0 weights f32 (read), 1 act f32 (read_write), 3 md u32 (read).
// Workgroup: 64 x 1; grid (ceil(dim / 64), n_rows). Tokens are checked < vocab_size on the host.

struct Params { n_rows: u32, dim: u32, rows_off: u32, emb_off: u32, x_off: u32 }
var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> weights: array<f32>;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.dim || r >= p.n_rows) {
        return;
    }
    let tok = md[p.rows_off + r * 4u];
    act[p.x_off + r * p.dim + i] = weights[p.emb_off + tok * p.dim + i];
}

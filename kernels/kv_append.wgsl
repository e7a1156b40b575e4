// kv_append: writes each row's k and v into its sequence's slot of the paged KV cache.
// Slot of position pos: block = block_table[pos / block_size], slot = block * block_size + pos % block_size.
//
// Shapes / layouts (f32 elements; offsets in elements):
//   md[rows_off ..]            row records [n_rows][4] u32: (token, seq, pos, block_table_off)
//   md[block_table_off ..]     the row's sequence's block table (u32 block ids, position order)
//   act[k_off ..], act[v_off ..]        k, v [n_rows, kv_dim]
//   kv[kc_off ..], kv[vc_off ..] (written)  this layer's K and V caches [n_blocks, block_size, kv_dim]
// Bindings (group 0): 1 act f32 (read_write), 2 kv f32 (read_write), 3 md u32 (read).
// Workgroup: 64; grid (ceil(kv_dim / 64), n_rows). Block ids are checked < n_blocks on the host.
//
// `kv_append_img`: the same into the KV cache held in the storage image (binding 7,
// rgba32f 2D array; the CPU-device layout, see `attention_img`): texel (x, y) of layer
// L holds kv_dim / 4 consecutive values of one position, x = (pos % block_size) *
// kv_dim / 4 + i, y = block, and kc_off / vc_off are this layer's K and V layers.
// kv_dim % 4 == 0. Workgroup 64; grid (ceil(kv_dim / 4 / 64), n_rows).

struct Params { n_rows: u32, kv_dim: u32, block_size: u32, rows_off: u32, k_off: u32, v_off: u32, kc_off: u32, vc_off: u32 }
var<immediate> p: Params;

@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> kv: array<f32>;
@group(0) @binding(3) var<storage, read> md: array<u32>;

@compute @workgroup_size(64)
fn kv_append(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.kv_dim || r >= p.n_rows) {
        return;
    }
    let pos = md[p.rows_off + r * 4u + 2u];
    let bt = md[p.rows_off + r * 4u + 3u];
    let block = md[bt + pos / p.block_size];
    let slot = block * p.block_size + pos % p.block_size;
    kv[p.kc_off + slot * p.kv_dim + i] = act[p.k_off + r * p.kv_dim + i];
    kv[p.vc_off + slot * p.kv_dim + i] = act[p.v_off + r * p.kv_dim + i];
}

@group(0) @binding(7) var kv_img: texture_storage_2d_array<rgba32float, read_write>;

@compute @workgroup_size(64)
fn kv_append_img(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    let kv4 = p.kv_dim / 4u;
    if (i >= kv4 || r >= p.n_rows) {
        return;
    }
    let pos = md[p.rows_off + r * 4u + 2u];
    let bt = md[p.rows_off + r * 4u + 3u];
    let block = md[bt + pos / p.block_size];
    let at = vec2<u32>((pos % p.block_size) * kv4 + i, block);
    let kb = p.k_off + r * p.kv_dim + 4u * i;
    let vb = p.v_off + r * p.kv_dim + 4u * i;
    textureStore(kv_img, at, p.kc_off, vec4<f32>(act[kb], act[kb + 1u], act[kb + 2u], act[kb + 3u]));
    textureStore(kv_img, at, p.vc_off, vec4<f32>(act[vb], act[vb + 1u], act[vb + 2u], act[vb + 3u]));
}

//! Generates `qmatmul.wgsl` (the quantized products, `build/qmatmul_gen.rs`)
//! into `OUT_DIR`, compiles it and every `kernels/*.wgsl` compute kernel at the
//! workspace root to SPIR-V with naga (pure Rust; no Vulkan SDK, glslc or
//! shaderc needed) and writes `kernels.rs` into `OUT_DIR`: a table
//! `KERNELS: &[(&str, &[u8])]` of (entry point name, SPIR-V bytes) that
//! `xtc_vk::Kernels` turns into pipelines, and `SUBGROUP_OPS: &[(&str, u32)]`:
//! for each entry point the subgroup operations its SPIR-V declares (the
//! `GroupNonUniform*` capabilities as `VkSubgroupFeatureFlags` bits), so a
//! device without them is never given a pipeline it cannot run. No generated WGSL and no prebuilt
//! SPIR-V is checked in; `XTC_WRITE_WGSL=DIR` also writes the generated WGSL
//! there, to read it.
//!
//! SPIR-V 1.5 targets the Vulkan 1.2 instance `vk` creates. Loops are not
//! bounded and integer division is not wrapped: the kernels' inputs are
//! validated on the host (`decode::model::BatchPlan::validate`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};

#[path = "build/chain_gen.rs"]
mod chain_gen;
#[path = "build/qmatmul8_gen.rs"]
mod qmatmul8_gen;
#[path = "build/qmatmul_gen.rs"]
mod qmatmul_gen;

/// The hand-written kernels: `kernels/` at the workspace root.
const KERNELS_DIR: &str = "../../kernels";

fn main() {
    println!("cargo:rerun-if-changed={KERNELS_DIR}");
    println!("cargo:rerun-if-changed=build/qmatmul_gen.rs");
    println!("cargo:rerun-if-changed=build/qmatmul8_gen.rs");
    println!("cargo:rerun-if-changed=build/chain_gen.rs");
    println!("cargo:rerun-if-env-changed=XTC_WRITE_WGSL");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let generated = out_dir.join("qmatmul.wgsl");
    let wgsl = qmatmul_gen::generate() + &qmatmul8_gen::generate();
    std::fs::write(&generated, &wgsl).expect("write qmatmul.wgsl");
    let att = std::fs::read_to_string(Path::new(KERNELS_DIR).join("attention.wgsl"))
        .expect("read kernels/attention.wgsl");
    let chain = chain_gen::generate(&wgsl, &att);
    let chain_path = out_dir.join("chain.wgsl");
    std::fs::write(&chain_path, &chain).expect("write chain.wgsl");
    if let Some(dir) = std::env::var_os("XTC_WRITE_WGSL") {
        std::fs::write(Path::new(&dir).join("qmatmul.wgsl"), &wgsl).expect("XTC_WRITE_WGSL");
        std::fs::write(Path::new(&dir).join("chain.wgsl"), &chain).expect("XTC_WRITE_WGSL");
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(KERNELS_DIR)
        .expect("kernels/ directory")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .collect();
    files.push(generated);
    files.push(chain_path);
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    let mut table =
        String::from("/// (entry point, SPIR-V bytes) of every kernel in `kernels/`.\n");
    table.push_str("pub const KERNELS: &[(&str, &[u8])] = &[\n");
    let mut needs = String::from(
        "/// (entry point, `VkSubgroupFeatureFlags` its SPIR-V needs), in `KERNELS` order.\n",
    );
    needs.push_str("pub const SUBGROUP_OPS: &[(&str, u32)] = &[\n");
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        for (entry, spv_path, ops) in compile(file, &out_dir) {
            writeln!(
                table,
                "    ({entry:?}, include_bytes!({:?})),",
                spv_path.display()
            )
            .unwrap();
            writeln!(needs, "    ({entry:?}, {ops:#x}),").unwrap();
        }
    }
    table.push_str("];\n");
    needs.push_str("];\n");
    table.push_str(&needs);
    table.push_str(
        "/// Entry points whose SPIR-V uses `OpSDot` (built only where the device\n\
         /// enables integer dot products).\npub const INTEGER_DOT: &[&str] = &[\n",
    );
    for entry in qmatmul8_gen::integer_dot_entries() {
        writeln!(table, "    {entry:?},").unwrap();
    }
    table.push_str("];\n");
    table.push_str(
        "/// The int8-activation entry points (built by `Kernels::with_int8` only).\n\
         pub const INT8: &[&str] = &[\n",
    );
    // The int8 chain's entry points too: an f32 model never runs them.
    let int8_chains = chain_gen::chain_entries()
        .into_iter()
        .filter(|e| e.starts_with("chain8_"));
    for entry in qmatmul8_gen::int8_entries().into_iter().chain(int8_chains) {
        writeln!(table, "    {entry:?},").unwrap();
    }
    table.push_str("];\n");
    table.push_str(
        "/// The persistent chain's step kinds (`chain_r1`): kind i runs entry point\n\
         /// `CHAIN_KINDS[i]`'s code (`build/chain_gen.rs`).\npub const CHAIN_KINDS: &[&str] = &[\n",
    );
    for entry in chain_gen::chain_kinds() {
        writeln!(table, "    {entry:?},").unwrap();
    }
    table.push_str("];\n");
    table.push_str(
        "/// The persistent chain's entry points, one a tile (`chain_r<T>`).\n\
         pub const CHAIN_ENTRIES: &[&str] = &[\n",
    );
    for entry in chain_gen::chain_entries() {
        writeln!(table, "    {entry:?},").unwrap();
    }
    table.push_str("];\n");
    writeln!(
        table,
        "/// Polls of the chain's grid-barrier counter a round (unrolled).\npub const CHAIN_POLLS: u32 = {};",
        chain_gen::POLLS
    )
    .unwrap();
    writeln!(
        table,
        "/// Words of one chain step's record in the metadata buffer.\npub const CHAIN_STEP_WORDS: u32 = {};",
        chain_gen::STEP_WORDS
    )
    .unwrap();
    std::fs::write(out_dir.join("kernels.rs"), table).expect("write kernels.rs");
}

/// The `VkSubgroupFeatureFlags` bits a SPIR-V module needs: one per
/// `OpCapability GroupNonUniform*` it declares (SPIR-V capabilities 61..=68,
/// in the order of the Vulkan flags `BASIC`, `VOTE`, `ARITHMETIC`, `BALLOT`,
/// `SHUFFLE`, `SHUFFLE_RELATIVE`, `CLUSTERED`, `QUAD`: bit `cap - 61`).
fn subgroup_ops(words: &[u32]) -> u32 {
    const OP_CAPABILITY: u32 = 17;
    const GROUP_NON_UNIFORM: u32 = 61;
    let mut ops = 0;
    // Instructions follow the 5-word header; each starts with
    // `word_count << 16 | opcode`.
    let mut i = 5;
    while i < words.len() {
        let (count, opcode) = ((words[i] >> 16) as usize, words[i] & 0xffff);
        if opcode == OP_CAPABILITY
            && let Some(&cap) = words.get(i + 1)
            && (GROUP_NON_UNIFORM..GROUP_NON_UNIFORM + 8).contains(&cap)
        {
            ops |= 1 << (cap - GROUP_NON_UNIFORM);
        }
        i += count.max(1);
    }
    ops
}

/// Compiles one WGSL file: one `.spv` per compute entry point, with the
/// subgroup operations it needs ([`subgroup_ops`]).
fn compile(file: &Path, out_dir: &Path) -> Vec<(String, PathBuf, u32)> {
    let src = std::fs::read_to_string(file).expect("read kernel");
    let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| {
        panic!(
            "{}",
            e.emit_to_string_with_path(&src, &file.display().to_string())
        )
    });
    let validate = |m: &naga::Module| {
        Validator::new(
            ValidationFlags::all(),
            Capabilities::IMMEDIATES
                | Capabilities::SUBGROUP
                | Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        )
        .validate(m)
        .unwrap_or_else(|e| panic!("{}: {}", file.display(), e.emit_to_string(&src)))
    };
    validate(&module);
    let options = spv::Options {
        lang_version: (1, 5),
        flags: spv::WriterFlags::empty(),
        force_loop_bounding: false,
        emit_int_div_checks: false,
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        ..spv::Options::default()
    };
    let mut out = Vec::new();
    for ep in &module.entry_points {
        // Each entry point alone, its unused functions compacted away: naga
        // writes every function of a module, so without this an entry point
        // that uses no subgroup operation would declare those of its
        // neighbours (the GPU-form products beside the CPU-form ones) and a
        // device without subgroups could not build it.
        let mut own = module.clone();
        own.entry_points.retain(|e| e.name == ep.name);
        naga::compact::compact(&mut own, naga::compact::KeepUnused::No);
        let info = validate(&own);
        let pipeline = spv::PipelineOptions {
            shader_stage: ep.stage,
            entry_point: ep.name.clone(),
        };
        let words = spv::write_vec(&own, &info, &options, Some(&pipeline))
            .unwrap_or_else(|e| panic!("{}: {}: {e}", file.display(), ep.name));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let path = out_dir.join(format!("{}.spv", ep.name));
        std::fs::write(&path, bytes).expect("write spv");
        out.push((ep.name.clone(), path, subgroup_ops(&words)));
    }
    out
}

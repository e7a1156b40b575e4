//! Generates `qmatmul.wgsl` (the quantized products, `build/qmatmul_gen.rs`)
//! into `OUT_DIR`, compiles it and every `kernels/*.wgsl` compute kernel at the
//! workspace root to SPIR-V with naga (pure Rust; no Vulkan SDK, glslc or
//! shaderc needed) and writes `kernels.rs` into `OUT_DIR`: a table
//! `KERNELS: &[(&str, &[u8])]` of (entry point name, SPIR-V bytes) that
//! `xtc_vk::Kernels` turns into pipelines. No generated WGSL and no prebuilt
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
    println!("cargo:rerun-if-env-changed=XTC_WRITE_WGSL");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let generated = out_dir.join("qmatmul.wgsl");
    let wgsl = qmatmul_gen::generate() + &qmatmul8_gen::generate();
    std::fs::write(&generated, &wgsl).expect("write qmatmul.wgsl");
    if let Some(dir) = std::env::var_os("XTC_WRITE_WGSL") {
        std::fs::write(Path::new(&dir).join("qmatmul.wgsl"), &wgsl).expect("XTC_WRITE_WGSL");
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(KERNELS_DIR)
        .expect("kernels/ directory")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .collect();
    files.push(generated);
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    let mut table =
        String::from("/// (entry point, SPIR-V bytes) of every kernel in `kernels/`.\n");
    table.push_str("pub const KERNELS: &[(&str, &[u8])] = &[\n");
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        for (entry, spv_path) in compile(file, &out_dir) {
            writeln!(
                table,
                "    ({entry:?}, include_bytes!({:?})),",
                spv_path.display()
            )
            .unwrap();
        }
    }
    table.push_str("];\n");
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
    for entry in qmatmul8_gen::int8_entries() {
        writeln!(table, "    {entry:?},").unwrap();
    }
    table.push_str("];\n");
    std::fs::write(out_dir.join("kernels.rs"), table).expect("write kernels.rs");
}

/// Compiles one WGSL file: one `.spv` per compute entry point.
fn compile(file: &Path, out_dir: &Path) -> Vec<(String, PathBuf)> {
    let src = std::fs::read_to_string(file).expect("read kernel");
    let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| {
        panic!(
            "{}",
            e.emit_to_string_with_path(&src, &file.display().to_string())
        )
    });
    let info = Validator::new(
        ValidationFlags::all(),
        Capabilities::IMMEDIATES | Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16_IN_FLOAT32,
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{}: {}", file.display(), e.emit_to_string(&src)));
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
        let pipeline = spv::PipelineOptions {
            shader_stage: ep.stage,
            entry_point: ep.name.clone(),
        };
        let words = spv::write_vec(&module, &info, &options, Some(&pipeline))
            .unwrap_or_else(|e| panic!("{}: {}: {e}", file.display(), ep.name));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let path = out_dir.join(format!("{}.spv", ep.name));
        std::fs::write(&path, bytes).expect("write spv");
        out.push((ep.name.clone(), path));
    }
    out
}

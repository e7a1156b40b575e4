//! The `xtc` command: see `xtc --help`.
fn main() {
    std::process::exit(xtc_cli::main());
}

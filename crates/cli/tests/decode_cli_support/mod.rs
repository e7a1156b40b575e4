//! Helpers shared by the `xtc decode` command tests (`decode_cli.rs`,
//! `decode_cli_files.rs`).
#![allow(dead_code)]

pub fn xtc(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let argv = ["xtc", "decode"].iter().chain(args).copied();
    let code = xtc_cli::run(argv, &mut out);
    (code, String::from_utf8(out).unwrap())
}

/// Fast flags: the toy model, a burst of arrivals.
pub const FAST: [&str; 4] = ["--device", "toy", "--time-scale", "10000"];

/// Runs the `xtc` binary (stderr is part of what the user sees).
pub fn xtc_bin(args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("decode")
        .args(args)
        .output()
        .unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap_or(-1), s(o.stdout), s(o.stderr))
}

/// The banner's first words: printed once the run is about to start.
pub const BANNER: &str = "requests from";

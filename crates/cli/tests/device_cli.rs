//! `--device` has one parser and one meaning of `auto` for every command
//! that runs a model (`crates/cli/src/device.rs`): the first Vulkan device,
//! else the CPU reference, said on stderr and in `--help`.

use std::process::{Command, Output};

fn xtc(args: &[&str], no_vulkan: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xtc"));
    c.args(args);
    if no_vulkan {
        // The loader then finds no driver: no Vulkan device opens.
        c.env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
            .env_remove("VK_ADD_DRIVER_FILES");
    }
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_command_documents_the_same_auto() {
    for cmd in ["decode", "generate", "perplexity"] {
        let o = xtc(&[cmd, "--help"], false);
        assert_eq!(o.status.code(), Some(0), "{cmd}");
        let help = text(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            help.contains("the CPU reference when no Vulkan device opens"),
            "{cmd}: {help}"
        );
    }
}

#[test]
fn decode_auto_without_vulkan_runs_on_the_cpu_reference() {
    let o = xtc(
        &[
            "decode",
            "--synthetic",
            "--device",
            "auto",
            "--requests",
            "2",
            "--time-scale",
            "10000",
        ],
        true,
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("xtc decode: no Vulkan device") && err.contains("CPU reference"),
        "{err}"
    );
}

#[test]
fn an_empty_device_is_a_usage_error_everywhere() {
    for cmd in [
        &["decode", "--device", ""][..],
        &["generate", "--device", " ", "hi"],
        &["perplexity", "--device", "", "x.txt"],
    ] {
        let o = xtc(cmd, false);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}");
        assert!(text(&o.stderr).contains("must name a device"), "{cmd:?}");
    }
}

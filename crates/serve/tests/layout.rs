//! The layering of `xtc serve`: the HTTP stack (tokio, axum, hyper) lives in
//! this crate only. The batch engine (`src/batch/`), the runtime (`src/rt/`)
//! and the model, the serving core and the benchmark (`crates/model/src/`,
//! `crates/kvbatch/src/`, `crates/replay/src/`) never name it (their
//! `Cargo.toml`s do not list it either, so the compiler holds this too), so
//! no tokio type enters them; the front end reaches the engine through
//! `batch::Remote`, never through the group's owner-loop API.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_http_stack_outside_the_serve_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for layer in [
        "src/batch",
        "src/rt",
        "crates/model/src",
        "crates/kvbatch/src",
        "crates/replay/src",
    ] {
        let mut files = Vec::new();
        sources(&root.join(layer), &mut files);
        assert!(!files.is_empty(), "{layer}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            // Paths, not prose: comments may cite tokio's designs.
            for word in ["tokio::", "axum::", "hyper::", "hyper_util::"] {
                assert!(
                    !text.contains(word),
                    "{} names {word}: the HTTP stack stays in crates/serve/",
                    f.display()
                );
            }
        }
    }
}

#[test]
fn the_front_end_reaches_the_engine_only_through_remote() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let http = std::fs::read_to_string(root.join("http.rs")).unwrap();
    assert!(
        !http.contains("xtc::batch"),
        "http.rs goes through EngineHandle"
    );
    let engine = std::fs::read_to_string(root.join("engine/mod.rs")).unwrap();
    // The HTTP side's handle holds a Remote, not the Group (which is !Send
    // and belongs to the engine loop).
    let handle = &engine[engine.find("pub struct EngineHandle").unwrap()..];
    let handle = &handle[..handle.find("\n}\n").unwrap()];
    assert!(handle.contains("remote: Remote<Job>"), "{handle}");
    assert!(!handle.contains("Group<"), "{handle}");
}

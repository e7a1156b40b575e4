//! `.ci/examples/gpu-runner.yml` cannot rot: every command its steps run is
//! read out of the YAML (its `run:` values, plain or block scalars) and
//! checked against the repository and the built `xtc`: each `xtc ci run`
//! flag is one `xtc ci run --help` documents (and `--suite`'s value one it
//! lists), the first run writes the baselines later runs read, every path
//! it names exists (the failure baseline excepted: the first run writes it),
//! every `-p` package is a workspace crate and every `--test` target a test
//! file of those packages, and `xtc probe` prints device kinds in the form
//! the GPU check greps for. No YAML parser is needed for that much.

use std::path::{Path, PathBuf};
use std::process::Command;

const XTC: &str = env!("CARGO_BIN_EXE_xtc");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml() -> String {
    std::fs::read_to_string(repo().join(".ci/examples/gpu-runner.yml")).unwrap()
}

/// Every `run:` value: a plain scalar, `|` (lines kept) or `>` (folded into
/// one line).
fn run_commands(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let Some(rest) = line.trim_start().strip_prefix("run:") else {
            i += 1;
            continue;
        };
        let rest = rest.trim();
        if rest == "|" || rest == ">" {
            let mut body = vec![];
            i += 1;
            while i < lines.len() {
                let l = lines[i];
                let ind = l.len() - l.trim_start().len();
                if !l.trim().is_empty() && ind <= indent {
                    break;
                }
                body.push(l.trim());
                i += 1;
            }
            out.push(body.join(if rest == "|" { "\n" } else { " " }));
        } else {
            out.push(rest.to_owned());
            i += 1;
        }
    }
    out
}

fn help(args: &[&str]) -> String {
    let out = Command::new(XTC).args(args).output().unwrap();
    assert!(out.status.success(), "xtc {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `xtc ci run` invocations: their words up to a shell operator.
fn ci_runs(cmds: &[String]) -> Vec<Vec<String>> {
    let mut runs = vec![];
    for c in cmds {
        let words: Vec<&str> = c.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if w.ends_with("xtc")
                && words.get(i + 1) == Some(&"ci")
                && words.get(i + 2) == Some(&"run")
            {
                let args = words[i + 3..]
                    .iter()
                    .take_while(|w| !matches!(**w, "||" | "&&" | "|" | ";"))
                    .map(|s| s.to_string())
                    .collect();
                runs.push(args);
            }
        }
    }
    runs
}

fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

#[test]
fn every_xtc_ci_flag_is_one_xtc_ci_run_documents() {
    let cmds = run_commands(&yaml());
    let runs = ci_runs(&cmds);
    assert_eq!(runs.len(), 2, "a first run and a comparing run: {runs:?}");
    let help = help(&["ci", "run", "--help"]);
    for args in &runs {
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            let documented = help
                .lines()
                .any(|l| l.trim_start().split([' ', ',', '=']).any(|w| w == flag));
            assert!(documented, "{flag} is not an option of `xtc ci run`");
        }
        let suite = value_of(args, "--suite").expect("--suite");
        assert!(help.contains(&format!("- {suite}:")), "--suite {suite}");
        assert_eq!(value_of(args, "--device"), Some("auto"));
        assert!(value_of(args, "--output").is_some());
    }
    let (first, later): (Vec<_>, Vec<_>) = runs
        .iter()
        .partition(|a| a.iter().any(|f| f == "--write-baseline"));
    assert_eq!((first.len(), later.len()), (1, 1));
    for flag in ["--baseline", "--golden", "--perf-baseline"] {
        assert_eq!(
            value_of(first[0], flag),
            value_of(later[0], flag),
            "the first run writes the {flag} file the later runs read"
        );
    }
    // The steps choose between the two by the file the first run writes.
    let baseline = value_of(first[0], "--baseline").unwrap();
    let cond = format!("hashFiles('{baseline}')");
    assert_eq!(yaml().matches(&cond).count(), 2, "{cond} guards both steps");
}

#[test]
fn every_path_package_and_test_target_it_names_exists() {
    let text = yaml();
    let cmds = run_commands(&text);
    assert!(cmds.len() >= 6, "{cmds:?}");
    let runs = ci_runs(&cmds);
    let written: Vec<&str> = runs
        .iter()
        .filter(|a| a.iter().any(|f| f == "--write-baseline"))
        .filter_map(|a| value_of(a, "--baseline"))
        .collect();
    let words = cmds.iter().flat_map(|c| c.split_whitespace());
    let mut checked = 0;
    for w in words.chain(
        text.lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("- ").or(Some(l))),
    ) {
        let w = w.trim_matches(|c| c == '\'' || c == '"');
        let repo_path = ["scripts/", "devices/", ".ci/", "tests/"]
            .iter()
            .any(|p| w.starts_with(p));
        if !repo_path || written.contains(&w) || w.contains(' ') {
            continue;
        }
        assert!(repo().join(w).exists(), "{w} is named but does not exist");
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} paths checked");

    for c in cmds.iter().filter(|c| c.starts_with("cargo test")) {
        let words: Vec<&str> = c.split_whitespace().collect();
        let flag = |f: &str| -> Vec<String> {
            words
                .windows(2)
                .filter(|w| w[0] == f)
                .map(|w| w[1].trim_matches('\'').to_owned())
                .collect()
        };
        let pkgs = flag("-p");
        let dirs: Vec<PathBuf> = if pkgs.is_empty() {
            vec![repo().join("tests")]
        } else {
            pkgs.iter().map(|p| package_dir(p).join("tests")).collect()
        };
        for t in flag("--test") {
            for d in &dirs {
                let found = std::fs::read_dir(d).unwrap().any(|e| {
                    let name = e.unwrap().file_name().to_string_lossy().into_owned();
                    let stem = name.strip_suffix(".rs").unwrap_or("");
                    match t.strip_suffix('*') {
                        Some(prefix) => stem.starts_with(prefix),
                        None => stem == t,
                    }
                });
                assert!(
                    found,
                    "cargo test --test {t}: no such test in {}",
                    d.display()
                );
            }
        }
    }
}

/// The folder of the workspace package `name`.
fn package_dir(name: &str) -> PathBuf {
    let root = repo();
    let dirs = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .chain([root.join("capi"), root.clone()]);
    for d in dirs {
        let Ok(toml) = std::fs::read_to_string(d.join("Cargo.toml")) else {
            continue;
        };
        if toml
            .lines()
            .any(|l| l.trim() == format!("name = \"{name}\""))
        {
            return d;
        }
    }
    panic!("-p {name}: no workspace package of that name");
}

/// The GPU check greps `xtc probe` for `" Discrete ` or `" Integrated `:
/// the Vulkan lines print the name in quotes, then the kind.
#[test]
fn xtc_probe_prints_device_kinds_as_the_gpu_check_greps_them() {
    assert!(yaml().contains(r#"grep -Eq '" (Discrete|Integrated) '"#));
    let out = Command::new(XTC).arg("probe").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let listed = text.lines().any(|l| {
        ["Discrete", "Integrated", "Virtual", "Cpu", "Other"]
            .iter()
            .any(|k| l.contains(&format!("\" {k} ")))
    });
    if !listed && std::env::var_os("CI").is_none() {
        eprintln!(
            "skipping: no Vulkan device listed by xtc probe; set CI=1 to make this a failure"
        );
        return;
    }
    assert!(
        listed,
        "xtc probe lists no device as `\"NAME\" Kind`: {text}"
    );
}

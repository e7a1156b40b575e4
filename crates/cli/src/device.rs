//! `--device`: ONE parser and ONE meaning for every command that runs a
//! model (`xtc decode`, `xtc generate`, `xtc perplexity`).
//!
//! - `auto` (the default): the first Vulkan device (a GPU if there is one,
//!   else lavapipe); when no Vulkan device can be opened, the CPU
//!   reference, saying so on stderr. `xtc decode` once refused to run
//!   then while `xtc generate` fell back: every command falls back now, so
//!   the default runs wherever the binary does.
//! - `cpu`: the CPU reference (no Vulkan).
//! - `toy`: no model, the batching alone (`xtc decode` only; the others
//!   refuse it as a usage error).
//! - anything else: a Vulkan device by index, part of its name, or render
//!   node; a device that does not open is an error listing the devices that
//!   exist.
//!
//! What is opened is an [`xtc_model::open::Target`], the front door's
//! device.

use xtc_model::adapters::IterationCost;
use xtc_model::open::Target;

/// What `--device` means, for each command's `--help`.
pub const HELP: &str = "`auto` (the default: the first Vulkan device, a GPU if present, else \
lavapipe; the CPU reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan), \
a Vulkan device index, part of its name or its render node (`xtc probe` lists them)";

/// A parsed `--device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceArg {
    /// `auto`: a Vulkan device, else the CPU reference.
    Auto,
    /// `cpu`: the CPU reference.
    Cpu,
    /// `toy`: no model (`xtc decode` only).
    Toy,
    /// A Vulkan selector: an index, part of a name or a render node.
    Vulkan(String),
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Auto => f.write_str("auto"),
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Toy => f.write_str("toy"),
            DeviceArg::Vulkan(s) => f.write_str(s),
        }
    }
}

/// The clap value parser of `--device`, for every command: anything but an
/// empty (or blank) selector, which the Vulkan layer would read as `auto`.
///
/// # Errors
/// An empty selector.
pub fn parse(s: &str) -> Result<DeviceArg, String> {
    Ok(match s.trim() {
        "" => {
            return Err(
                "must name a device: `auto`, `cpu`, an index, part of a name, \
                        or a render node (`xtc probe` lists them; `xtc decode` also takes `toy`)"
                    .into(),
            );
        }
        "auto" => DeviceArg::Auto,
        "cpu" => DeviceArg::Cpu,
        "toy" => DeviceArg::Toy,
        _ => DeviceArg::Vulkan(s.to_string()),
    })
}

/// Why `--device` could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceFailure {
    /// A usage error (exit status 2): `toy` for a command that runs a
    /// model, a selector the Vulkan layer cannot parse.
    Usage(String),
    /// No device matched, or it could not be opened (exit status 1).
    Error(String),
}

impl std::fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceFailure::Usage(m) | DeviceFailure::Error(m) => f.write_str(m),
        }
    }
}

/// What a command takes besides `auto`, `cpu` and Vulkan selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// `toy` too (`xtc decode`), with this modeled cost per iteration.
    Toy(IterationCost),
    /// A model is needed: `toy` is a usage error.
    ModelOnly,
}

/// Refuses what `takes` does not allow before anything loads: `toy` for
/// a command that needs a model.
///
/// # Errors
/// [`DeviceFailure::Usage`].
pub fn check(arg: &DeviceArg, takes: Takes) -> Result<(), DeviceFailure> {
    if *arg == DeviceArg::Toy && takes == Takes::ModelOnly {
        return Err(DeviceFailure::Usage(
            "--device toy runs no model (it is xtc decode's batching-only device); \
             use auto, cpu or a Vulkan device"
                .into(),
        ));
    }
    Ok(())
}

/// Opens `arg` for `cmd` (the command's name in messages, e.g. `xtc
/// generate`); see the module doc for what each selector means.
///
/// # Errors
/// See [`DeviceFailure`].
pub fn open(arg: &DeviceArg, cmd: &str, takes: Takes) -> Result<Target, DeviceFailure> {
    let keywords = match takes {
        Takes::Toy(_) => "`auto`, `cpu`, `toy`",
        Takes::ModelOnly => "`auto`, `cpu`",
    };
    match arg {
        DeviceArg::Cpu => Ok(Target::Cpu),
        DeviceArg::Toy => match takes {
            Takes::Toy(cost) => Ok(Target::Toy(cost)),
            Takes::ModelOnly => check(arg, takes).map(|()| Target::Cpu),
        },
        DeviceArg::Auto => match xtc_vk::Device::open(&xtc_vk::Selector::Auto) {
            Ok(d) => Ok(Target::Vulkan(note_idle(d, cmd))),
            // Only a machine without Vulkan falls back: a device that exists
            // and fails to open (validation asked for and not installed, a
            // bad `XTC_VK_VALIDATION`) is an error, never a silent switch.
            Err(e) if e.is_absent() => {
                eprintln!("{cmd}: no Vulkan device ({e}): running on the CPU reference");
                Ok(Target::Cpu)
            }
            Err(e) => Err(DeviceFailure::Error(format!("--device auto: {e}"))),
        },
        DeviceArg::Vulkan(s) => {
            let sel: xtc_vk::Selector = s
                .parse()
                .map_err(|e| DeviceFailure::Usage(format!("--device {s}: {e}")))?;
            xtc_vk::Device::open(&sel)
                .map(|d| Target::Vulkan(note_idle(d, cmd)))
                .map_err(|e| DeviceFailure::Error(device_error(s, &e, keywords)))
        }
    }
}

/// Where a KVM guest with the `cpuidle-haltpoll` driver says how long an
/// idle vCPU polls before it halts, ns.
pub const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// The note for a CPU Vulkan device (lavapipe) when the file at `path`
/// ([`HALT_POLL_NS`]) says idle vCPUs halt at once (`0`): each of
/// lavapipe's thread hand-offs (its workers sleep between dispatches, about
/// 150 dispatch groups a decoded token of a large batch, a few with the
/// persistent chain) then waits for a vCPU woken through
/// the hypervisor. `None` when the file is missing, unreadable or not a
/// number (not such a guest: nothing to say), or polling is on.
pub fn idle_note(path: &std::path::Path) -> Option<String> {
    let ns: u64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    (ns == 0).then(|| {
        format!(
            "this virtual machine's idle vCPUs halt at once ({} is 0), so lavapipe's \
             thread hand-offs (about 150 a decoded token of a large batch, a few where the \
             persistent chain holds an iteration of up to 4 rows) each wait for a vCPU woken through \
             the hypervisor; as root, `echo 200000 > {}` (the kernel's own default) made one
             stream decode 1.4-1.8x faster on a 2-core guest before the chain (benches/peers/beside-llama-cpp.md)",
            path.display(),
            path.display()
        )
    })
}

/// `d`, after printing [`idle_note`] for `cmd` on stderr when `d` is a CPU
/// device (lavapipe) and the note applies.
fn note_idle(d: xtc_vk::Device, cmd: &str) -> xtc_vk::Device {
    if d.info().kind == xtc_vk::DeviceKind::Cpu
        && let Some(note) = idle_note(std::path::Path::new(HALT_POLL_NS))
    {
        eprintln!("{cmd}: note: {note}");
    }
    d
}

/// The `--device` error as the user wrote the selector, with the Vulkan
/// devices that exist, the selector words the command takes (`keywords`,
/// e.g. "`auto`, `cpu`") and a pointer to `xtc probe`.
pub fn device_error(sel: &str, e: &xtc_vk::VkError, keywords: &str) -> String {
    let reason = match e {
        xtc_vk::VkError::NoMatch(_) => format!("no usable Vulkan device matches `{sel}`"),
        other => other.to_string(),
    };
    let list = match xtc_vk::enumerate() {
        Ok(devs) if devs.is_empty() => "no Vulkan devices found".to_string(),
        Ok(devs) => {
            let rows: Vec<String> = devs
                .iter()
                .map(|d| {
                    let node = d
                        .render_node
                        .as_ref()
                        .map_or(String::new(), |r| format!(", {}", r.path.display()));
                    format!("  {}: {} ({:?}{node})", d.index, d.name, d.kind)
                })
                .collect();
            format!("Vulkan devices here:\n{}", rows.join("\n"))
        }
        Err(e) => format!("cannot list Vulkan devices: {e}"),
    };
    format!(
        "--device {sel}: {reason}\n{list}\n\
         (use an index, part of a name, a render node, or {keywords}; \
         `xtc probe` shows the details)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_note_speaks_only_for_a_guest_that_halts_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("guest_halt_poll_ns");
        std::fs::write(&f, "0\n").unwrap();
        let note = idle_note(&f).expect("0: halts at once");
        assert!(
            note.contains("echo 200000 >") && note.contains("guest_halt_poll_ns"),
            "{note}"
        );
        for polling_or_bad in ["200000\n", "", "abc", "-1", "\u{0}"] {
            std::fs::write(&f, polling_or_bad).unwrap();
            assert_eq!(idle_note(&f), None, "{polling_or_bad:?}");
        }
        assert_eq!(idle_note(&dir.path().join("missing")), None);
    }

    #[test]
    fn one_parser_reads_every_selector() {
        assert_eq!(parse("auto"), Ok(DeviceArg::Auto));
        assert_eq!(parse(" cpu "), Ok(DeviceArg::Cpu));
        assert_eq!(parse("toy"), Ok(DeviceArg::Toy));
        assert_eq!(parse("1"), Ok(DeviceArg::Vulkan("1".into())));
        assert_eq!(parse("llvmpipe"), Ok(DeviceArg::Vulkan("llvmpipe".into())));
        let e = parse("  ").unwrap_err();
        assert!(e.contains("must name a device"), "{e}");
    }

    #[test]
    fn toy_is_a_usage_error_where_a_model_is_needed() {
        let e = open(&DeviceArg::Toy, "xtc generate", Takes::ModelOnly).unwrap_err();
        assert!(
            matches!(&e, DeviceFailure::Usage(m) if m.contains("runs no model")),
            "{e}"
        );
        let t = open(
            &DeviceArg::Toy,
            "xtc decode",
            Takes::Toy(IterationCost::NONE),
        )
        .unwrap();
        assert!(matches!(t, Target::Toy(_)));
        assert!(matches!(
            open(&DeviceArg::Cpu, "xtc generate", Takes::ModelOnly),
            Ok(Target::Cpu)
        ));
    }
}

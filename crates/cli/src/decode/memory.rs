//! What a run needs before it starts: a KV cache whose size block ids can
//! name (`check_kv_size`), requests that can fit it (the trace rows that
//! never can are named up front: `unfit_rows`), and host memory for the model's part
//! ([`xtc_model::open::model_memory`]) and the serving side's
//! ([`memory_need`]) within what the process can still get ([`host_limit`],
//! read through `xtc::rt::sysfs`).

use std::time::Duration;

use xtc::rt::sysfs::MemoryFiles;
use xtc_kvbatch::kv::KvLedger;
use xtc_kvbatch::reject::{self, RejectReason, Rejected};
use xtc_kvbatch::seq::RequestSpec;
use xtc_model::open::{Limits, MemoryKind, Target, model_memory};
use xtc_model::{Config, KvGeometry};
use xtc_replay::job::{self, JobOpts, Workload};
use xtc_replay::trace::Trace;

use super::args::DecodeArgs;

/// Where the KV-cache size came from, for error messages.
pub(crate) fn kv_origin(args: &DecodeArgs, o: &JobOpts) -> String {
    let size = format!(
        "KV cache of {} blocks x {} positions",
        o.kv_blocks, o.block_size
    );
    match args.kv_blocks {
        Some(_) => format!("{size}, from --kv-blocks: lower it"),
        None => format!(
            "{size}, derived from --max-active {} x {} blocks per request: \
             lower --max-active or set --kv-blocks",
            o.max_active,
            o.kv_blocks / o.max_active.max(1)
        ),
    }
}

/// Rejects a KV cache whose positions overflow, or with more blocks than
/// 32-bit block ids name (a derived size: `--kv-blocks` itself is limited
/// by its parser), naming the option the size came from.
pub(crate) fn check_kv_size(args: &DecodeArgs, config: &Config, o: &JobOpts) -> Result<(), String> {
    let positions = o.kv_blocks.checked_mul(o.block_size);
    let elems = positions.and_then(|p| p.checked_mul(2 * config.n_layers * config.kv_dim()));
    if elems.is_none() {
        return Err(format!(
            "the KV cache is too large ({})",
            kv_origin(args, o)
        ));
    }
    // Checked before the model allocates anything for the cache.
    if u32::try_from(o.kv_blocks).is_err() {
        return Err(format!(
            "the KV cache has more than the {} blocks block ids can name ({})",
            u32::MAX,
            kv_origin(args, o)
        ));
    }
    Ok(())
}

/// What a run's host memory holds, part by part, in bytes: everything whose
/// size follows from the options (an estimate from above of the big parts,
/// not of every allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNeed {
    /// `(what, bytes)`, largest first.
    pub parts: Vec<(&'static str, u128)>,
}

impl MemoryNeed {
    /// The sum of the parts.
    pub fn total(&self) -> u128 {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

/// Host memory of a run of `wl` under `o` on `kind` for a model of `config`
/// with `weight_elems` `f32` weights; `compare` keeps a second run's records.
/// The parts: the model's KV cache (by kind), the KV ledger's block free list
/// and flags ([`KvLedger::host_bytes`]), the Vulkan activations and
/// metadata (`--token-budget` rows, `--max-active` sequences), the batch
/// group's member storage (`--max-active`, `--requests`), and the requests'
/// tokens and per-iteration records (`--requests` and the lengths).
pub fn memory_need(
    config: &Config,
    weight_elems: u128,
    o: &JobOpts,
    kind: MemoryKind,
    wl: &Workload,
    compare: bool,
) -> MemoryNeed {
    let n = |x: usize| x as u128;
    let limits = Limits {
        kv: KvGeometry {
            block_size: o.block_size,
            n_blocks: o.kv_blocks,
        },
        max_tokens: o.token_budget,
        max_seqs: o.max_active.max(1),
        max_context: config.seq_len,
        kernels: None,
    };
    let sq = n(o.max_active.max(1));
    let mut parts = vec![("block allocator", KvLedger::host_bytes(o.kv_blocks))];
    parts.extend(model_memory(config, weight_elems, &limits, kind));
    // The group holds every request's slot and max-active members several
    // times over (ready, blocked, the driver's items): a generous bound.
    let seq = n(size_of::<xtc_kvbatch::seq::Sequence>());
    let slots = n(wl.requests.len().max(o.max_active));
    parts.push(("batch group", slots * (2 * seq + 64) + sq * (6 * seq + 64)));
    // Tokens live in the spec, the member and the output's copy; each token
    // row can cost an iteration record and a token gap.
    let tokens: u128 = wl
        .requests
        .iter()
        .map(|r| n(r.prompt.len()) + n(r.output_tokens))
        .sum();
    let per_token = n(3 * size_of::<u32>() + size_of::<job::IterRecord>() + size_of::<Duration>());
    let runs = if compare { 2 } else { 1 };
    parts.push(("requests and records", tokens * per_token * runs));
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    MemoryNeed { parts }
}

/// Refuses a run whose host memory ([`memory_need`]) is more than this
/// process can get ([`host_limit`]), naming the parts and the option the KV
/// cache's size came from. Before the fix only the KV tensors were counted,
/// against `MemTotal`: `--kv-blocks 4294967295 --block-size 1` on the toy
/// model passed and the kernel killed the run (20 GiB of allocator it missed).
pub(crate) fn check_memory(
    args: &DecodeArgs,
    config: &Config,
    weight_elems: u128,
    o: &JobOpts,
    dev: &Target,
    wl: &Workload,
) -> Result<(), String> {
    let kind = dev.memory_kind();
    let need = memory_need(config, weight_elems, o, kind, wl, args.compare);
    let Some(limit) = host_limit() else {
        return Ok(());
    };
    if need.total() <= limit.bytes {
        return Ok(());
    }
    let parts: Vec<String> = need
        .parts
        .iter()
        .filter(|(_, b)| *b >= 1 << 20)
        .map(|(what, b)| format!("{what} {}", gib(*b)))
        .collect();
    Err(format!(
        "the run needs about {} of host memory ({}), more than the {} {} \
         ({}; --token-budget {}, --max-active {})",
        gib(need.total()),
        parts.join(", "),
        gib(limit.bytes),
        limit.source,
        kv_origin(args, o),
        o.token_budget,
        o.max_active
    ))
}

/// `bytes` as GiB with one decimal (MiB below one GiB).
fn gib(bytes: u128) -> String {
    if bytes < 1 << 30 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// How much memory this process can still get, and what bounds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLimit {
    /// Bytes.
    pub bytes: u128,
    /// What bounds it, for the message ("available on this machine
    /// (MemAvailable)", "left under the address-space limit (ulimit -v)", ...).
    pub source: String,
}

/// The tightest of: `MemAvailable` (memory the kernel can hand out without
/// swapping, not `MemTotal`), the address-space and data rlimits less what
/// this process already maps, and the cgroup's `memory.max` less its
/// `memory.current`, read through [`MemoryFiles`] (bounded reads). `None`
/// when none can be read.
pub fn host_limit() -> Option<HostLimit> {
    host_limit_of(&MemoryFiles::live())
}

/// [`host_limit`] with the memory files of `files`.
pub fn host_limit_of(files: &MemoryFiles) -> Option<HostLimit> {
    use rustix::process::{Resource, getrlimit};
    let mut limits = Vec::new();
    if let Some(b) = files.mem_available() {
        limits.push((b, "available on this machine (MemAvailable)".to_string()));
    }
    for (res, field, what) in [
        (Resource::As, "VmSize:", "address-space limit (ulimit -v)"),
        (Resource::Data, "VmData:", "data-segment limit (ulimit -d)"),
    ] {
        if let Some(cur) = getrlimit(res).current {
            let used = files.self_status(field).unwrap_or(0);
            let left = u128::from(cur).saturating_sub(used);
            limits.push((left, format!("left under the {what}")));
        }
    }
    if let Some(left) = files.cgroup_left() {
        limits.push((left, "left under the cgroup's memory.max".to_string()));
    }
    limits
        .into_iter()
        .min_by_key(|(b, _)| *b)
        .map(|(bytes, source)| HostLimit { bytes, source })
}

/// Rows of a report of the requests that can never fit, listed by row.
const UNFIT_LISTED: usize = 5;

/// The requests of `wl` that can never fit under `o`, reported before the
/// run starts: a KV charge (prompt and output positions, in blocks) past
/// the cache's blocks, or positions past `seq_len` ([`reject::rejection`],
/// the rule the run applies at arrival). Says how many, then the first
/// [`UNFIT_LISTED`] by their trace row (1-based, the header not counted)
/// with the row's lengths, the scaled lengths and what they need against
/// what there is. `None` when every request fits (or the cache's sizes
/// are invalid: the run refuses those itself).
pub(crate) fn unfit_rows(
    trace: &Trace,
    wl: &Workload,
    o: &JobOpts,
    seq_len: usize,
) -> Option<String> {
    let kv = KvLedger::new(o.kv_blocks, o.block_size).ok()?;
    let mut unfit: Vec<(&RequestSpec, Rejected)> = wl
        .requests
        .iter()
        .filter_map(|r| reject::rejection(r, &kv, seq_len).map(|why| (r, why)))
        .collect();
    if unfit.is_empty() {
        return None;
    }
    unfit.sort_by_key(|(r, _)| r.id);
    let rows: Vec<String> = unfit
        .iter()
        .take(UNFIT_LISTED)
        .map(|(r, why)| {
            let raw = trace.requests.get(r.id).map_or_else(String::new, |t| {
                format!(
                    "ContextTokens {}, GeneratedTokens {}; ",
                    t.prompt_tokens, t.output_tokens
                )
            });
            let need = match why.kind {
                RejectReason::KvBlocks => format!(
                    "needs {} KV blocks of {} position{}, the cache has {}",
                    why.need,
                    o.block_size,
                    if o.block_size == 1 { "" } else { "s" },
                    why.limit
                ),
                _ => format!(
                    "needs {} positions, the model's context length is {}",
                    why.need, why.limit
                ),
            };
            format!(
                "trace row {} ({raw}{} prompt + {} output tokens as replayed) {need}",
                r.id + 1,
                r.prompt.len(),
                r.output_tokens
            )
        })
        .collect();
    let more = unfit.len().saturating_sub(UNFIT_LISTED);
    let more = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    Some(format!(
        "{} of {} requests can never fit and will be rejected at arrival (the run exits \
         3; a larger --kv-blocks or --block-size, or smaller lengths, make them fit): {}{more}",
        unfit.len(),
        wl.requests.len(),
        rows.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xtc_replay::job::Mode;
    use xtc_replay::trace::{Scaling, Trace, TraceRequest};

    /// Issue 22: a trace row that can never fit is reported before the run,
    /// by its row and lengths; a workload that fits reports nothing.
    #[test]
    fn rows_that_can_never_fit_are_named_before_the_run() {
        let row = |p, o| TraceRequest {
            arrival: Duration::ZERO,
            prompt_tokens: p,
            output_tokens: o,
        };
        let t = Trace {
            requests: vec![row(10, 6), row(40, 30), row(8, 8), row(100, 200)],
        };
        let wl = job::workload(&t, 4, &Scaling::IDENTITY, 100, 1, 0.0);
        // 16-position blocks, 4 of them (64 positions): rows 2 and 4 need more.
        let m = unfit_rows(&t, &wl, &opts(4, 16), 1000).unwrap();
        assert!(m.starts_with("2 of 4 requests can never fit"), "{m}");
        assert!(
            m.contains(
                "trace row 2 (ContextTokens 40, GeneratedTokens 30; 40 prompt + 30 output \
                 tokens as replayed) needs 5 KV blocks of 16 positions, the cache has 4"
            ),
            "{m}"
        );
        assert!(m.contains("trace row 4 ("), "{m}");
        assert!(!m.contains("trace row 1 ") && !m.contains("more"), "{m}");
        // Past the model's positions instead.
        let m = unfit_rows(&t, &wl, &opts(1000, 16), 100).unwrap();
        assert!(
            m.starts_with("1 of 4 requests")
                && m.contains("trace row 4 (")
                && m.contains("needs 299 positions, the model's context length is 100"),
            "{m}"
        );
        assert_eq!(unfit_rows(&t, &wl, &opts(1000, 16), 1000), None);
        // More than five: the first five by row, then a count.
        let many = Trace {
            requests: vec![row(100, 100); 8],
        };
        let wl = job::workload(&many, 8, &Scaling::IDENTITY, 100, 1, 0.0);
        let m = unfit_rows(&many, &wl, &opts(2, 16), 1000).unwrap();
        assert!(
            m.contains("trace row 5 (")
                && !m.contains("trace row 6 ")
                && m.ends_with("; and 3 more"),
            "{m}"
        );
    }

    fn workload(n: usize, tokens: usize) -> Workload {
        let t = Trace {
            requests: vec![
                TraceRequest {
                    arrival: Duration::ZERO,
                    prompt_tokens: tokens,
                    output_tokens: tokens,
                };
                n
            ],
        };
        job::workload(&t, n, &Scaling::IDENTITY, 100, 1, 0.0)
    }

    fn opts(kv_blocks: usize, block_size: usize) -> JobOpts {
        JobOpts {
            mode: Mode::Continuous,
            max_active: 32,
            kv_blocks,
            block_size,
            token_budget: 64,
            stop_token: None,
        }
    }

    /// Issue 12: the command of the issue needs 36 GiB (the check counted
    /// only the toy's 16 GiB of slots).
    #[test]
    fn memory_need_counts_the_allocator_and_the_toy_slots() {
        let need = memory_need(
            &Config::tiny(),
            0,
            &opts(u32::MAX as usize, 1),
            MemoryKind::Toy,
            &workload(3, 4),
            false,
        );
        let part = |name: &str| need.parts.iter().find(|(n, _)| *n == name).unwrap().1;
        let blocks = u32::MAX as u128;
        assert_eq!(part("block allocator"), 5 * blocks);
        assert_eq!(part("KV cache"), 4 * blocks);
        assert!(need.total() > 36 * (1 << 30) - (1 << 20), "{need:?}");
        assert_eq!(need.parts[0].0, "block allocator", "largest first");
    }

    #[test]
    fn memory_need_grows_with_every_option_that_sizes_memory() {
        let c = Config::tiny();
        let wl = workload(4, 8);
        let base = opts(64, 16);
        let total =
            |o: &JobOpts, kind, wl: &Workload| memory_need(&c, 1000, o, kind, wl, false).total();
        for kind in [
            MemoryKind::Toy,
            MemoryKind::Cpu,
            MemoryKind::VulkanHost,
            MemoryKind::VulkanDevice,
        ] {
            let t0 = total(&base, kind, &wl);
            assert!(total(&opts(128, 16), kind, &wl) > t0, "{kind:?} kv-blocks");
            let more_active = JobOpts {
                max_active: 64,
                ..base
            };
            assert!(total(&more_active, kind, &wl) > t0, "{kind:?} max-active");
            assert!(
                total(&base, kind, &workload(8, 8)) > t0,
                "{kind:?} requests"
            );
            assert!(
                total(&base, kind, &workload(4, 16)) > t0,
                "{kind:?} lengths"
            );
        }
        for kind in [MemoryKind::VulkanHost, MemoryKind::VulkanDevice] {
            let t0 = total(&base, kind, &wl);
            let budget = JobOpts {
                token_budget: 128,
                ..base
            };
            assert!(total(&budget, kind, &wl) > t0, "{kind:?} token-budget");
        }
        // The KV tensors: f32 K and V of every layer for the CPU reference.
        let kv = |kind| {
            let need = memory_need(&c, 0, &base, kind, &wl, false);
            need.parts.iter().find(|(n, _)| *n == "KV cache").unwrap().1
        };
        assert_eq!(
            kv(MemoryKind::Cpu),
            64 * 16 * 2 * 4 * 4 * c.kv_dim() as u128
        );
        assert_eq!(kv(MemoryKind::Toy), 64 * 16 * 4);
    }

    /// Issue 12: the check compared with `MemTotal`.
    #[test]
    fn host_memory_is_mem_available_not_mem_total() {
        let info = "MemTotal:       24684084 kB\nMemFree:         1000000 kB\n\
                    MemAvailable:    2000000 kB\n";
        assert_eq!(xtc::rt::sysfs::mem_available(info), Some(2_000_000 * 1024));
        let old_kernel = "MemTotal:       24684084 kB\nMemFree:         1000000 kB\n";
        assert_eq!(
            xtc::rt::sysfs::mem_available(old_kernel),
            Some(1_000_000 * 1024)
        );
        let limit = host_limit().expect("/proc/meminfo is readable here");
        assert!(limit.bytes > 0, "{limit:?}");
    }
}

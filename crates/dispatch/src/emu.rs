//! The emulated NPU: a `memmap2` register region polled by emulated cores.
//!
//! # Safety
//!
//! This file is the dispatch layer's only unsafe island. The region is one
//! anonymous, page-aligned, read-write mapping owned by [`Regs`] for its whole
//! life; it is never exposed as `&[u8]`/`&mut [u8]`. Every access goes through
//! `Regs::u32_at`/`Regs::u64_at`, which:
//! - check the offset is inside the mapping and naturally aligned (the stride
//!   and field offsets below are multiples of 8, the mapping is page-aligned);
//! - hand out `&AtomicU32`/`&AtomicU64` tied to `&self`, so the mapping
//!   outlives every reference, and all concurrent access is atomic (no data
//!   race even when a scheduler thread and a core host touch the same word).
//!
//! # Layout (per core, `STRIDE` = 256 bytes, every line 64-byte aligned)
//!
//! | offset | line | field | writer → reader |
//! |---|---|---|---|
//! | 0 | doorbell | `dmb` u32 token (DATA_MAIN_BASE) | scheduler → core |
//! | 64 | status | `cond` u32: bit 31 FIN, bits 0..30 token; +4 `fault` u32 | core → scheduler |
//! | 128 | `desc[0]` | descriptor for even tokens | scheduler → core |
//! | 192 | `desc[1]` | descriptor for odd tokens | scheduler → core |
//!
//! The doorbell and status words sit on separate cache lines (opposite
//! writers). Descriptors are double-buffered by token parity, so a scheduler
//! may prepare the next token's descriptor while the core still reads the last.
//! Publication contract (D-01/D-02): descriptor stores are relaxed, then ONE
//! release fence, then relaxed doorbell stores; the core's acquire load of
//! `dmb` synchronises with that fence.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapMut;

use xtc::{Error, Result};

/// Doorbell value of a core with no task yet (the upstream idle id).
pub const TOKEN_IDLE: u32 = 0x7FFF_FFFD;
/// First reserved token value; tokens at or above it are never issued.
pub const TOKEN_RESERVED: u32 = 0x7FFF_FFF0;
/// `cond` bit set by a core when the token's task finished.
pub const COND_FIN: u32 = 1 << 31;

const STRIDE: usize = 256;
const OFF_DMB: usize = 0;
const OFF_COND: usize = 64;
const OFF_FAULT: usize = 68;
const OFF_DESC: usize = 128;
const DESC_SIZE: usize = 64;

/// A task descriptor as a core reads it (one SPMD block's subtask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Desc {
    /// Task id in the run.
    pub task: u32,
    /// SPMD block index, `0..block_num`.
    pub block_idx: u32,
    /// Sub-core slot of the block: 0 AIC, 1 AIV0, 2 AIV1.
    pub sub: u32,
    /// Pop that published this descriptor (metrics: start span per pop).
    pub pop: u32,
    /// Output slot the subtask writes.
    pub out_index: u64,
    /// Value it writes there.
    pub value: u64,
    /// Emulated run time, ns (virtual under the stepper).
    pub duration_ns: u64,
    /// Test hook: the kernel reports a fault instead of writing its output.
    pub fail: bool,
}

/// The per-core register region of one emulated device.
pub struct Regs {
    map: MmapMut,
    cores: usize,
}

impl Regs {
    /// Maps a zeroed region for `cores` cores and sets every doorbell to
    /// [`TOKEN_IDLE`]. Errors: [`Error::Inval`] for 0 cores, [`Error::Nomem`]
    /// when the mapping fails.
    pub fn new(cores: usize) -> Result<Regs> {
        if cores == 0 {
            return Err(Error::Inval);
        }
        let map = MmapMut::map_anon(cores * STRIDE).map_err(|_| Error::Nomem)?;
        let regs = Regs { map, cores };
        regs.reset();
        Ok(regs)
    }

    /// Cores in the region.
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Returns every core to idle: doorbell [`TOKEN_IDLE`], cond and fault 0.
    pub fn reset(&self) {
        for c in 0..self.cores {
            self.dmb(c).store(TOKEN_IDLE, Ordering::Relaxed);
            self.u32_at(c * STRIDE + OFF_COND)
                .store(0, Ordering::Relaxed);
            self.u32_at(c * STRIDE + OFF_FAULT)
                .store(0, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::Release);
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(
            off + 4 <= self.map.len() && off.is_multiple_of(4),
            "register offset"
        );
        // SAFETY: `off` is in bounds and 4-aligned (checked above; the mapping
        // is page-aligned), the mapping lives as long as `&self`, and the word
        // is only ever accessed atomically (module memo).
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(
            off + 8 <= self.map.len() && off.is_multiple_of(8),
            "register offset"
        );
        // SAFETY: as in `u32_at`, with 8-byte alignment checked above.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn dmb(&self, core: usize) -> &AtomicU32 {
        self.u32_at(core * STRIDE + OFF_DMB)
    }

    fn desc_base(&self, core: usize, token: u32) -> usize {
        core * STRIDE + OFF_DESC + (token as usize & 1) * DESC_SIZE
    }

    /// Writes the descriptor for `token` into `desc[token & 1]` of `core`
    /// (relaxed: made visible by the next publication fence).
    pub fn write_desc(&self, core: usize, token: u32, d: &Desc) {
        let b = self.desc_base(core, token);
        let w0 = u64::from(d.task) | (u64::from(d.block_idx) << 32);
        let w1 = u64::from(d.sub) | (u64::from(d.pop) << 8) | (u64::from(d.fail) << 63);
        for (i, w) in [w0, w1, d.out_index, d.value, d.duration_ns]
            .into_iter()
            .enumerate()
        {
            self.u64_at(b + i * 8).store(w, Ordering::Relaxed);
        }
    }

    /// Reads the descriptor for `token` (after an acquire load of the doorbell).
    pub fn read_desc(&self, core: usize, token: u32) -> Desc {
        let b = self.desc_base(core, token);
        let w = |i: usize| self.u64_at(b + i * 8).load(Ordering::Relaxed);
        let (w0, w1) = (w(0), w(1));
        Desc {
            task: w0 as u32,
            block_idx: (w0 >> 32) as u32,
            sub: (w1 & 0xff) as u32,
            pop: ((w1 >> 8) & 0xffff_ffff) as u32,
            fail: w1 >> 63 == 1,
            out_index: w(2),
            value: w(3),
            duration_ns: w(4),
        }
    }

    /// Rings `core`'s doorbell with `token` (relaxed: the caller issued the
    /// release fence of its flush first, D-01/D-02).
    pub fn ring(&self, core: usize, token: u32) {
        self.dmb(core).store(token, Ordering::Relaxed);
    }

    /// The core side: acquire-loads the doorbell.
    pub fn doorbell(&self, core: usize) -> u32 {
        self.dmb(core).load(Ordering::Acquire)
    }

    /// The core side: release-stores `cond` (ACK = token, FIN = token | bit 31).
    pub fn set_cond(&self, core: usize, value: u32) {
        self.u32_at(core * STRIDE + OFF_COND)
            .store(value, Ordering::Release);
    }

    /// The scheduler side: acquire-loads `cond`.
    pub fn cond(&self, core: usize) -> u32 {
        self.u32_at(core * STRIDE + OFF_COND)
            .load(Ordering::Acquire)
    }

    /// The core side: records that `token` faulted (before its FIN).
    pub fn set_fault(&self, core: usize, token: u32) {
        self.u32_at(core * STRIDE + OFF_FAULT)
            .store(token, Ordering::Relaxed);
    }

    /// The scheduler side: the last faulted token of `core` (0 = none).
    pub fn fault(&self, core: usize) -> u32 {
        self.u32_at(core * STRIDE + OFF_FAULT)
            .load(Ordering::Relaxed)
    }
}

/// Next token after `prev` for a core: never 0, never reserved, parity
/// alternates (so the descriptor double buffer alternates).
pub fn next_token(prev: u32) -> u32 {
    let n = prev.wrapping_add(1);
    if n == 0 || n >= TOKEN_RESERVED {
        // Restart at 1 or 2 so the parity still alternates.
        if prev & 1 == 1 { 2 } else { 1 }
    } else {
        n
    }
}

/// One record of a core's work, for metrics and the swimlane trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreEvent {
    /// Core index (`cluster * 3 + sub`).
    pub core: u32,
    /// Descriptor the core ran.
    pub desc: Desc,
    /// Time the core saw the token and acknowledged it, ns.
    pub start_ns: u64,
    /// Time it wrote FIN, ns.
    pub end_ns: u64,
}

/// One emulated core: a non-blocking state machine a host thread polls.
#[derive(Debug)]
pub struct EmuCore {
    id: usize,
    last: u32,
    running: Option<(u32, Desc, u64)>,
}

/// What a [`EmuCore::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreStep {
    /// Nothing to do.
    Idle,
    /// Picked up a new token (ACK written).
    Started,
    /// Still running its task.
    Busy,
    /// Finished a task (output or fault, then FIN written).
    Finished(CoreEvent),
}

impl EmuCore {
    /// A core that has seen no token.
    pub fn new(id: usize) -> EmuCore {
        EmuCore {
            id,
            last: TOKEN_IDLE,
            running: None,
        }
    }

    /// True while a task runs on this core.
    pub fn is_busy(&self) -> bool {
        self.running.is_some()
    }

    /// Advances the core at time `now()` (read when needed, so start stamps
    /// are per core): finishes its task when due
    /// (writing `out[desc.out_index] = desc.value`, or a fault), or picks up a
    /// new doorbell token (ACK, start timestamp). The core reads only its own
    /// registers.
    pub fn poll(&mut self, regs: &Regs, out: &[AtomicU64], now: impl Fn() -> u64) -> CoreStep {
        if let Some((tok, d, start)) = self.running {
            let now_ns = now();
            if now_ns < start + d.duration_ns {
                return CoreStep::Busy;
            }
            if d.fail {
                regs.set_fault(self.id, tok);
            } else if let Some(slot) = out.get(d.out_index as usize) {
                slot.store(d.value, Ordering::Relaxed);
            }
            regs.set_cond(self.id, tok | COND_FIN);
            self.running = None;
            return CoreStep::Finished(CoreEvent {
                core: self.id as u32,
                desc: d,
                start_ns: start,
                end_ns: now_ns,
            });
        }
        let tok = regs.doorbell(self.id);
        if tok == self.last || tok == TOKEN_IDLE || tok == 0 || tok >= TOKEN_RESERVED {
            return CoreStep::Idle;
        }
        let d = regs.read_desc(self.id, tok);
        regs.set_cond(self.id, tok);
        self.last = tok;
        self.running = Some((tok, d, now()));
        CoreStep::Started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trips_by_parity() {
        let r = Regs::new(3).unwrap();
        let d = Desc {
            task: 7,
            block_idx: 5,
            sub: 2,
            pop: 99,
            out_index: 11,
            value: u64::MAX - 1,
            duration_ns: 1234,
            fail: true,
        };
        r.write_desc(2, 4, &d);
        r.write_desc(2, 5, &Desc::default());
        assert_eq!(r.read_desc(2, 6), d);
        assert_eq!(r.read_desc(2, 7), Desc::default());
        assert_eq!(Regs::new(0).err(), Some(Error::Inval));
    }

    #[test]
    fn core_acks_runs_and_finishes() {
        let r = Regs::new(1).unwrap();
        let out: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let mut c = EmuCore::new(0);
        assert_eq!(c.poll(&r, &out, || 0), CoreStep::Idle);
        let d = Desc {
            out_index: 1,
            value: 42,
            duration_ns: 10,
            ..Desc::default()
        };
        r.write_desc(0, 1, &d);
        r.ring(0, 1);
        assert_eq!(c.poll(&r, &out, || 5), CoreStep::Started);
        assert_eq!(r.cond(0), 1);
        assert_eq!(c.poll(&r, &out, || 14), CoreStep::Busy);
        assert!(matches!(c.poll(&r, &out, || 15), CoreStep::Finished(e) if e.start_ns == 5));
        assert_eq!(r.cond(0), 1 | COND_FIN);
        assert_eq!(out[1].load(Ordering::Relaxed), 42);
        // The same token is not run twice.
        assert_eq!(c.poll(&r, &out, || 20), CoreStep::Idle);
    }

    #[test]
    fn tokens_skip_reserved_and_keep_parity() {
        assert_eq!(next_token(1), 2);
        let t = next_token(TOKEN_RESERVED - 1);
        assert!(t < TOKEN_RESERVED && t & 1 != (TOKEN_RESERVED - 1) & 1);
    }
}

//! Requests that can never run, refused before admission: a charge over
//! the whole KV cache, or more positions than the model's `seq_len`. Both
//! `xtc serve` (400 before any work) and `xtc decode` (rejected in the
//! report) ask [`rejection`] first, so no member is admitted that could
//! never finish.

use crate::kv::KvLedger;
use crate::seq::RequestSpec;

/// Why a request was refused before admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RejectReason {
    /// Its charge (prompt + output, in KV blocks) is more than the cache holds.
    KvBlocks,
    /// Its positions (prompt + output - 1) are more than the model's `seq_len`.
    SeqLen,
    /// The group refused the submit.
    Submit,
}

impl RejectReason {
    /// Every reason, in order (reports list a count for each).
    pub const ALL: [RejectReason; 3] = [
        RejectReason::KvBlocks,
        RejectReason::SeqLen,
        RejectReason::Submit,
    ];

    /// The name printed in reports and JSON (`kv-blocks`, `seq-len`, `submit`).
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::KvBlocks => "kv-blocks",
            RejectReason::SeqLen => "seq-len",
            RejectReason::Submit => "submit",
        }
    }
}

/// A request refused before admission because it can never fit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// Request id.
    pub id: usize,
    /// The kind of refusal (reports count requests per kind).
    pub kind: RejectReason,
    /// What the request needs: KV blocks ([`RejectReason::KvBlocks`]) or
    /// positions ([`RejectReason::SeqLen`]); 0 for [`RejectReason::Submit`].
    pub need: u64,
    /// What there is: the cache's blocks or the model's `seq_len`; 0 for
    /// [`RejectReason::Submit`].
    pub limit: u64,
    /// The clear message for it (`request N rejected: ...`).
    pub reason: String,
}

/// The rejection of a request that can never fit, if it cannot: its charge
/// exceeds the cache's blocks, or its positions the model's `seq_len`.
pub fn rejection(spec: &RequestSpec, kv: &KvLedger, seq_len: usize) -> Option<Rejected> {
    let charge = kv.charge_for(spec.prompt.len(), spec.output_tokens);
    let positions = spec.prompt.len() + spec.output_tokens - 1;
    if charge > kv.capacity() as u64 {
        return Some(Rejected {
            id: spec.id,
            kind: RejectReason::KvBlocks,
            need: charge,
            limit: kv.capacity() as u64,
            reason: format!(
                "request {} rejected: needs {charge} KV blocks ({} prompt + {} output tokens, {} positions per block) but the cache has {} blocks",
                spec.id,
                spec.prompt.len(),
                spec.output_tokens,
                kv.block_size(),
                kv.capacity()
            ),
        });
    }
    if positions > seq_len {
        return Some(Rejected {
            id: spec.id,
            kind: RejectReason::SeqLen,
            need: positions as u64,
            limit: seq_len as u64,
            reason: format!(
                "request {} rejected: needs {positions} positions but the model's seq_len is {seq_len}",
                spec.id
            ),
        });
    }
    None
}

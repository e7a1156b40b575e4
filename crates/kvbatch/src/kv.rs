//! The KV ledger: the ONE owner of the paged KV cache's bookkeeping — a
//! request's charge, its admission against the cache, the growth of its block
//! table, and the return of its blocks.
//!
//! The KV cache is `n_blocks` blocks of `block_size` positions each (one
//! position holds K and V of every layer for one token; the tensors live in
//! the model). A sequence owns a *block table*: the ids of its blocks in
//! position order, so position `p` lives in block `block_table[p / block_size]`
//! at slot `p % block_size`. The table is held in the member's [`KvAccount`],
//! which only [`KvLedger`] changes.
//!
//! # An account's life
//! 1. [`KvLedger::account`]: a *pending* account carrying the request's charge,
//!    `ceil((prompt + output) / block_size)` blocks — all it may ever need.
//!    Nothing is reserved yet. The charge is also what the batch group admits
//!    by (B-036..B-040: `resource_capacity` = [`KvLedger::capacity`]).
//! 2. [`KvLedger::admit`]: reserves the charge. The local driver admits with
//!    it ([`KvLedger::fits`] first); the group step calls it the first time a
//!    member is in a ready vector, after the group admitted it under the same
//!    capacity.
//! 3. [`KvLedger::grow`]: allocates the blocks the member's positions need,
//!    lazily (paging), never beyond its charge.
//! 4. [`KvLedger::free`]: returns every block and the charge in one call
//!    (DONE, cancelled, failed; also for an account never admitted) and closes
//!    the account for good.
//!
//! # Example: one request's account
//!
//! ```
//! use xtc_kvbatch::kv::KvLedger;
//!
//! // 8 blocks of 16 positions.
//! let mut kv = KvLedger::new(8, 16).unwrap();
//! // 40 prompt + 10 output tokens may need ceil(50 / 16) = 4 blocks.
//! let mut acct = kv.account(40, 10);
//! assert_eq!(acct.charge(), 4);
//! assert!(acct.is_pending() && kv.fits(&acct));
//! kv.admit(&mut acct).unwrap(); // the charge is reserved, no block yet
//! assert_eq!((kv.reserved(), kv.used()), (4, 0));
//! kv.grow(&mut acct, 40).unwrap(); // prefill: 40 positions need 3 blocks
//! assert_eq!(acct.table().len(), 3);
//! kv.grow(&mut acct, 49).unwrap(); // 9 decode steps later: the 4th block
//! assert_eq!(kv.used(), 4);
//! assert!(kv.grow(&mut acct, 65).is_err(), "never beyond the charge");
//! assert_eq!(kv.free(&mut acct).unwrap(), 4); // blocks and charge back
//! assert_eq!((kv.reserved(), kv.used()), (0, 0));
//! assert!(kv.free(&mut acct).is_err(), "no double free");
//! ```
//!
//! # Invariants (tests below)
//! 1. `reserved()` = the sum of the admitted accounts' charges `<= capacity()`:
//!    [`KvLedger::admit`] refuses a charge that does not fit and changes
//!    nothing then.
//! 2. An admitted account holds at most its charge in blocks:
//!    [`KvLedger::grow`] refuses to go beyond it.
//! 3. Hence the free blocks (`capacity - used`) are at least the sum over
//!    admitted accounts of `charge - held`: **grow never fails for an admitted
//!    member** within its charge.
//! 4. **No double free**: every block is in at most one table, once; free
//!    returns exactly an account's blocks and closes it; a closed account can
//!    be neither grown nor freed again (an error, nothing changes). An account
//!    is not `Clone`, its fields are private, and it belongs to the ledger
//!    that admitted it (another ledger refuses it), so no copy of a table can
//!    be returned twice.
//! 5. **No leak**: once every account has been freed, `used()`, `reserved()`
//!    and `admitted()` are 0; at the end of a run `used()` is what leaked.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a block operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// More blocks were asked for than are free (an admission bug: the charge
    /// should have reserved them).
    #[error("KV cache exhausted: {wanted} blocks wanted, {free} free of {capacity}")]
    Exhausted {
        /// Blocks asked for.
        wanted: usize,
        /// Blocks free at the time.
        free: usize,
        /// Blocks in the cache.
        capacity: usize,
    },
    /// A freed block id is out of range or already free.
    #[error("KV block {0} is not allocated")]
    NotAllocated(u32),
    /// Admitting the charge would reserve more blocks than the cache has (the
    /// group and the ledger disagree: a bug).
    #[error(
        "KV ledger: admitting a charge of {charge} blocks with {reserved} reserved exceeds the cache's {capacity}"
    )]
    Overcommit {
        /// The account's charge.
        charge: u64,
        /// Blocks reserved by the admitted accounts.
        reserved: u64,
        /// Blocks in the cache.
        capacity: usize,
    },
    /// Growing a table past its account's charge (the charge was wrong).
    #[error("KV ledger: {positions} positions need {need} blocks, more than the {charge} charged")]
    BeyondCharge {
        /// Positions the table was to cover.
        positions: usize,
        /// Blocks they need.
        need: usize,
        /// The account's charge.
        charge: u64,
    },
    /// An operation the account's state does not allow (admitting one twice,
    /// growing or freeing one that is not admitted here).
    #[error("KV ledger: cannot {op} an account that is {state}")]
    State {
        /// `admit`, `grow` or `free`.
        op: &'static str,
        /// `pending`, `admitted`, `freed` or `another ledger's`.
        state: &'static str,
    },
    /// `block_size` or `n_blocks` is zero, or `n_blocks` exceeds `u32` ids.
    #[error("invalid KV cache shape: {n_blocks} blocks of {block_size} positions")]
    Shape {
        /// Blocks asked for.
        n_blocks: usize,
        /// Positions per block asked for.
        block_size: usize,
    },
}

/// Free-list allocator of KV-cache blocks with use accounting (private: the
/// ledger is its only user).
#[derive(Debug, Clone)]
struct BlockAllocator {
    block_size: usize,
    capacity: usize,
    /// Free block ids; popped from the end (lowest ids first).
    free: Vec<u32>,
    /// `allocated[b]` is true while block `b` belongs to a sequence.
    allocated: Vec<bool>,
    peak_used: usize,
}

impl BlockAllocator {
    /// A cache of `n_blocks` blocks of `block_size` positions, all free.
    ///
    /// # Errors
    /// [`KvError::Shape`] when either is zero or `n_blocks > u32::MAX`.
    pub fn new(n_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if n_blocks == 0 || block_size == 0 || u32::try_from(n_blocks).is_err() {
            return Err(KvError::Shape {
                n_blocks,
                block_size,
            });
        }
        Ok(BlockAllocator {
            block_size,
            capacity: n_blocks,
            free: (0..n_blocks as u32).rev().collect(),
            allocated: vec![false; n_blocks],
            peak_used: 0,
        })
    }

    /// Host bytes a cache of `n_blocks` blocks holds from [`new`](Self::new)
    /// on, whatever is allocated: the free list (one `u32` id per block) and
    /// the allocation flags (one `bool` per block). The KV tensors themselves
    /// live in the model, not here. `xtc decode` counts this before creating
    /// the allocator (4,294,967,295 blocks are 20 GiB of bookkeeping).
    pub fn host_bytes(n_blocks: usize) -> u128 {
        n_blocks as u128 * (size_of::<u32>() + size_of::<bool>()) as u128
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the cache (the group's `resource_capacity`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks allocated now.
    pub fn used(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// Highest [`used`](Self::used) seen since creation.
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }

    /// Blocks that `positions` positions occupy: `ceil(positions / block_size)`.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// A request's charge in blocks: the blocks it may need for its whole
    /// prompt and output (`ceil((prompt + output) / block_size)`).
    pub fn charge_for(&self, prompt_tokens: usize, output_tokens: usize) -> u64 {
        self.blocks_for(prompt_tokens + output_tokens) as u64
    }

    /// Grows `table` so it covers `positions` positions, allocating the
    /// missing blocks. A table already large enough is left as is.
    ///
    /// # Errors
    /// [`KvError::Exhausted`] (nothing is allocated then).
    pub fn grow(&mut self, table: &mut Vec<u32>, positions: usize) -> Result<(), KvError> {
        let need = self.blocks_for(positions).saturating_sub(table.len());
        table.extend(self.alloc(need)?);
        Ok(())
    }

    /// Allocates `n` blocks.
    ///
    /// # Errors
    /// [`KvError::Exhausted`] when fewer than `n` are free (nothing is allocated then).
    pub fn alloc(&mut self, n: usize) -> Result<Vec<u32>, KvError> {
        if n > self.free.len() {
            return Err(KvError::Exhausted {
                wanted: n,
                free: self.free.len(),
                capacity: self.capacity,
            });
        }
        let blocks = self.free.split_off(self.free.len() - n);
        for &b in &blocks {
            self.allocated[b as usize] = true;
        }
        self.peak_used = self.peak_used.max(self.used());
        Ok(blocks)
    }

    /// Returns every block of `table` to the free list and empties it.
    ///
    /// # Errors
    /// [`KvError::NotAllocated`] for an id out of range or already free (the
    /// blocks before it have been freed; the table keeps the rest).
    pub fn free(&mut self, table: &mut Vec<u32>) -> Result<(), KvError> {
        while let Some(&b) = table.last() {
            match self.allocated.get_mut(b as usize) {
                Some(slot @ true) => *slot = false,
                _ => return Err(KvError::NotAllocated(b)),
            }
            self.free.push(b);
            table.pop();
        }
        Ok(())
    }
}

/// Where an account is in its life (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccountState {
    /// Charged, nothing reserved.
    Pending,
    /// Its charge is reserved in the ledger with this id.
    Admitted(u64),
    /// Its blocks and charge went back; closed for good.
    Freed,
}

/// A member's share of the KV cache: its charge and the block table the
/// ledger grew for it. Made by [`KvLedger::account`], changed only by the
/// ledger; not `Clone`, so no copy of a table can be freed twice.
#[derive(Debug, PartialEq, Eq)]
pub struct KvAccount {
    charge: u64,
    table: Vec<u32>,
    state: AccountState,
}

impl KvAccount {
    /// The charge in blocks: all the blocks the request may need.
    pub fn charge(&self) -> u64 {
        self.charge
    }

    /// The block table: block ids in position order (empty until the first
    /// grow, and again once freed).
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// Charged but not admitted yet (its charge is not reserved).
    pub fn is_pending(&self) -> bool {
        self.state == AccountState::Pending
    }

    /// Freed: its blocks and charge went back.
    pub fn is_freed(&self) -> bool {
        self.state == AccountState::Freed
    }

    fn state_name(&self, ledger: u64) -> &'static str {
        match self.state {
            AccountState::Pending => "pending",
            AccountState::Admitted(id) if id == ledger => "admitted",
            AccountState::Admitted(_) => "another ledger's",
            AccountState::Freed => "freed",
        }
    }
}

/// Ids that tell ledgers apart (an account names the ledger that admitted it).
static NEXT_LEDGER: AtomicU64 = AtomicU64::new(1);

/// The KV ledger: the cache's blocks and the charges reserved against them
/// (see the module doc for the life of an account and the invariants).
#[derive(Debug)]
pub struct KvLedger {
    blocks: BlockAllocator,
    /// Sum of the admitted accounts' charges.
    reserved: u64,
    /// Accounts admitted and not freed.
    admitted: usize,
    id: u64,
}

impl KvLedger {
    /// A cache of `n_blocks` blocks of `block_size` positions, all free,
    /// nothing reserved.
    ///
    /// # Errors
    /// [`KvError::Shape`] when either is zero or `n_blocks > u32::MAX`.
    pub fn new(n_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        Ok(KvLedger {
            blocks: BlockAllocator::new(n_blocks, block_size)?,
            reserved: 0,
            admitted: 0,
            id: NEXT_LEDGER.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Host bytes a ledger of `n_blocks` blocks holds from [`new`](Self::new)
    /// on, whatever is allocated: the free list (one `u32` id per block) and
    /// the allocation flags (one `bool` per block); the block tables live in
    /// the accounts, the KV tensors in the model. `xtc decode` counts this
    /// before creating the ledger (4,294,967,295 blocks are 20 GiB of
    /// bookkeeping).
    pub fn host_bytes(n_blocks: usize) -> u128 {
        BlockAllocator::host_bytes(n_blocks)
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// Blocks in the cache (the group's `resource_capacity`).
    pub fn capacity(&self) -> usize {
        self.blocks.capacity()
    }

    /// Blocks allocated now (at the end of a run: the blocks leaked).
    pub fn used(&self) -> usize {
        self.blocks.used()
    }

    /// Highest [`used`](Self::used) seen since creation.
    pub fn peak_used(&self) -> usize {
        self.blocks.peak_used()
    }

    /// Blocks reserved: the sum of the admitted accounts' charges.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Accounts admitted and not freed yet.
    pub fn admitted(&self) -> usize {
        self.admitted
    }

    /// A request's charge in blocks: the blocks it may need for its whole
    /// prompt and output, `ceil((prompt + output) / block_size)`.
    pub fn charge_for(&self, prompt_tokens: usize, output_tokens: usize) -> u64 {
        self.blocks.charge_for(prompt_tokens, output_tokens)
    }

    /// A pending account for a request of `prompt_tokens` + `output_tokens`
    /// tokens, charged [`charge_for`](Self::charge_for) of them.
    pub fn account(&self, prompt_tokens: usize, output_tokens: usize) -> KvAccount {
        KvAccount {
            charge: self.charge_for(prompt_tokens, output_tokens),
            table: Vec::new(),
            state: AccountState::Pending,
        }
    }

    /// Whether `acct`'s charge fits in what is not reserved.
    pub fn fits(&self, acct: &KvAccount) -> bool {
        self.reserved + acct.charge <= self.capacity() as u64
    }

    /// Reserves a pending account's charge (invariant 1).
    ///
    /// # Errors
    /// [`KvError::Overcommit`] when the charge does not fit,
    /// [`KvError::State`] for an account that is not pending; nothing changes
    /// then.
    pub fn admit(&mut self, acct: &mut KvAccount) -> Result<(), KvError> {
        if !acct.is_pending() {
            return Err(self.state_error("admit", acct));
        }
        if !self.fits(acct) {
            return Err(KvError::Overcommit {
                charge: acct.charge,
                reserved: self.reserved,
                capacity: self.capacity(),
            });
        }
        self.reserved += acct.charge;
        self.admitted += 1;
        acct.state = AccountState::Admitted(self.id);
        Ok(())
    }

    /// Grows an admitted account's table so it covers `positions` positions,
    /// allocating the missing blocks; a table already large enough is left as
    /// is (invariants 2, 3).
    ///
    /// # Errors
    /// [`KvError::State`] for an account not admitted here,
    /// [`KvError::BeyondCharge`] past its charge, [`KvError::Exhausted`] only
    /// if an invariant was broken; nothing is allocated then.
    pub fn grow(&mut self, acct: &mut KvAccount, positions: usize) -> Result<(), KvError> {
        if acct.state != AccountState::Admitted(self.id) {
            return Err(self.state_error("grow", acct));
        }
        let need = self.blocks.blocks_for(positions);
        if need as u64 > acct.charge {
            return Err(KvError::BeyondCharge {
                positions,
                need,
                charge: acct.charge,
            });
        }
        self.blocks.grow(&mut acct.table, positions)
    }

    /// Returns every block of the account and its charge, empties its table
    /// and closes it (invariants 4, 5); returns the blocks freed. A pending
    /// account (a request that left before admission) is closed with nothing
    /// to return.
    ///
    /// # Errors
    /// [`KvError::State`] for an account already freed or admitted by another
    /// ledger (nothing changes then); [`KvError::NotAllocated`] only if an
    /// invariant was broken (the account stays admitted, holding the blocks
    /// from the bad id on).
    pub fn free(&mut self, acct: &mut KvAccount) -> Result<usize, KvError> {
        match acct.state {
            AccountState::Pending => {
                acct.state = AccountState::Freed;
                Ok(0)
            }
            AccountState::Admitted(id) if id == self.id => {
                let n = acct.table.len();
                self.blocks.free(&mut acct.table)?;
                self.reserved -= acct.charge;
                self.admitted -= 1;
                acct.state = AccountState::Freed;
                Ok(n)
            }
            _ => Err(self.state_error("free", acct)),
        }
    }

    fn state_error(&self, op: &'static str, acct: &KvAccount) -> KvError {
        KvError::State {
            op,
            state: acct.state_name(self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_covers_prompt_and_output() {
        let a = BlockAllocator::new(8, 16).unwrap();
        assert_eq!(a.charge_for(1, 0), 1);
        assert_eq!(a.charge_for(16, 0), 1);
        assert_eq!(a.charge_for(16, 1), 2);
        assert_eq!(a.charge_for(30, 20), 4);
    }

    #[test]
    fn grow_allocates_lazily_and_free_returns_everything() {
        let mut a = BlockAllocator::new(4, 4).unwrap();
        let mut t = Vec::new();
        a.grow(&mut t, 3).unwrap();
        assert_eq!(t.len(), 1);
        a.grow(&mut t, 4).unwrap();
        assert_eq!(t.len(), 1);
        a.grow(&mut t, 9).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(a.used(), 3);
        let mut u = Vec::new();
        let err = a.grow(&mut u, 8).unwrap_err();
        assert_eq!(
            err,
            KvError::Exhausted {
                wanted: 2,
                free: 1,
                capacity: 4
            }
        );
        assert!(u.is_empty());
        a.free(&mut t).unwrap();
        assert!(t.is_empty());
        assert_eq!(a.used(), 0);
        assert_eq!(a.peak_used(), 3);
    }

    #[test]
    fn double_free_and_bad_ids_are_errors() {
        let mut a = BlockAllocator::new(2, 4).unwrap();
        let mut t = a.alloc(1).unwrap();
        let mut copy = t.clone();
        a.free(&mut t).unwrap();
        assert_eq!(a.free(&mut copy), Err(KvError::NotAllocated(copy[0])));
        assert_eq!(a.free(&mut vec![7]), Err(KvError::NotAllocated(7)));
        assert!(BlockAllocator::new(0, 4).is_err());
        assert!(BlockAllocator::new(4, 0).is_err());
    }

    /// The memory check of `xtc decode` counts what `new` really reserves.
    #[test]
    fn host_bytes_is_what_new_reserves() {
        for n in [1, 7, 1000] {
            let a = BlockAllocator::new(n, 16).unwrap();
            let held = a.free.capacity() * size_of::<u32>() + a.allocated.capacity();
            assert_eq!(BlockAllocator::host_bytes(n), held as u128, "{n} blocks");
        }
        assert_eq!(
            BlockAllocator::host_bytes(u32::MAX as usize),
            5 * u32::MAX as u128
        );
    }

    #[test]
    fn blocks_are_distinct_across_tables() {
        let mut a = BlockAllocator::new(6, 2).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.grow(&mut x, 5).unwrap();
        a.grow(&mut y, 6).unwrap();
        let mut all: Vec<u32> = x.iter().chain(&y).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
    }

    fn admitted(l: &mut KvLedger, prompt: usize, output: usize) -> KvAccount {
        let mut a = l.account(prompt, output);
        l.admit(&mut a).unwrap();
        a
    }

    #[test]
    fn ledger_admission_never_overcommits() {
        let mut l = KvLedger::new(5, 4).unwrap();
        let a = admitted(&mut l, 6, 2); // 2 blocks
        let _b = admitted(&mut l, 9, 3); // 3 blocks
        assert_eq!((l.reserved(), l.admitted()), (5, 2));
        let mut c = l.account(1, 1);
        assert!(!l.fits(&c));
        assert_eq!(
            l.admit(&mut c),
            Err(KvError::Overcommit {
                charge: 1,
                reserved: 5,
                capacity: 5
            })
        );
        assert!(c.is_pending());
        assert_eq!((l.reserved(), l.admitted(), l.used()), (5, 2, 0));
        assert_eq!(a.charge(), 2);
    }

    #[test]
    fn grow_stays_within_the_charge() {
        let mut l = KvLedger::new(8, 4).unwrap();
        let mut a = admitted(&mut l, 5, 3); // 8 positions: 2 blocks
        l.grow(&mut a, 5).unwrap();
        assert_eq!(a.table().len(), 2);
        l.grow(&mut a, 8).unwrap();
        assert_eq!(a.table().len(), 2);
        assert_eq!(
            l.grow(&mut a, 9),
            Err(KvError::BeyondCharge {
                positions: 9,
                need: 3,
                charge: 2
            })
        );
        assert_eq!((a.table().len(), l.used()), (2, 2));
        let mut p = l.account(1, 1);
        let e = l.grow(&mut p, 1).unwrap_err();
        assert_eq!(
            e,
            KvError::State {
                op: "grow",
                state: "pending"
            }
        );
        assert_eq!(l.used(), 2);
    }

    #[test]
    fn free_returns_blocks_and_charge_exactly_once() {
        let mut l = KvLedger::new(6, 2).unwrap();
        let mut a = admitted(&mut l, 3, 3); // 3 blocks
        l.grow(&mut a, 5).unwrap();
        let mut b = admitted(&mut l, 2, 1); // 2 blocks
        l.grow(&mut b, 2).unwrap();
        assert_eq!((l.used(), l.reserved()), (4, 5));
        assert_eq!(l.free(&mut a), Ok(3));
        assert!(a.is_freed() && a.table().is_empty());
        assert_eq!((l.used(), l.reserved(), l.admitted()), (1, 2, 1));
        // a second free, a grow or a re-admission of a freed account: errors, no change
        let freed = KvError::State {
            op: "free",
            state: "freed",
        };
        assert_eq!(l.free(&mut a), Err(freed));
        assert!(l.grow(&mut a, 1).is_err());
        assert!(l.admit(&mut a).is_err());
        assert_eq!((l.used(), l.reserved(), l.admitted()), (1, 2, 1));
        // admitting twice is an error too
        assert_eq!(
            l.admit(&mut b),
            Err(KvError::State {
                op: "admit",
                state: "admitted"
            })
        );
        // a request that leaves before admission frees nothing
        let mut p = l.account(4, 4);
        assert_eq!(l.free(&mut p), Ok(0));
        assert!(p.is_freed());
        assert_eq!(l.free(&mut b), Ok(1));
        assert_eq!((l.used(), l.reserved(), l.admitted()), (0, 0, 0));
        assert_eq!(l.peak_used(), 4);
    }

    #[test]
    fn accounts_belong_to_their_ledger() {
        let mut l1 = KvLedger::new(4, 4).unwrap();
        let mut l2 = KvLedger::new(4, 4).unwrap();
        let mut a = admitted(&mut l1, 4, 4);
        l1.grow(&mut a, 4).unwrap();
        let foreign = |op| KvError::State {
            op,
            state: "another ledger's",
        };
        assert_eq!(l2.grow(&mut a, 8), Err(foreign("grow")));
        assert_eq!(l2.free(&mut a), Err(foreign("free")));
        assert_eq!((l1.used(), l2.used(), a.table().len()), (1, 0, 1));
        assert_eq!(l1.free(&mut a), Ok(1));
    }

    /// Invariants 1-5 under a seeded random mix of arrivals, growth and
    /// departures: every admission within the capacity succeeds, every grow
    /// within the charge succeeds, no block is in two tables, and freeing
    /// everything leaves nothing held.
    #[test]
    fn grow_never_fails_for_an_admitted_member_and_nothing_leaks() {
        let (cap, bs) = (40, 4);
        let mut l = KvLedger::new(cap, bs).unwrap();
        let mut rng = fastrand::Rng::with_seed(13);
        let mut members: Vec<(KvAccount, usize)> = Vec::new(); // (account, positions)
        for _ in 0..20_000 {
            match rng.u8(0..3) {
                0 => {
                    let (p, o) = (rng.usize(1..60), rng.usize(1..40));
                    let mut a = l.account(p, o);
                    if a.charge() <= cap as u64 && l.fits(&a) {
                        l.admit(&mut a).unwrap();
                        members.push((a, 0));
                    } else {
                        assert!(l.admit(&mut a).is_err());
                        assert_eq!(l.free(&mut a), Ok(0));
                    }
                }
                1 if !members.is_empty() => {
                    let i = rng.usize(..members.len());
                    let (a, pos) = &mut members[i];
                    let max = a.charge() as usize * bs;
                    *pos = (*pos + rng.usize(1..=bs * 2)).min(max);
                    l.grow(a, *pos).expect("grow within the charge never fails");
                    assert_eq!(a.table().len(), pos.div_ceil(bs));
                }
                2 if !members.is_empty() => {
                    let (mut a, _) = members.swap_remove(rng.usize(..members.len()));
                    let held = a.table().len();
                    assert_eq!(l.free(&mut a), Ok(held));
                }
                _ => {}
            }
            let charges: u64 = members.iter().map(|(a, _)| a.charge()).sum();
            assert_eq!(l.reserved(), charges);
            assert!(l.reserved() <= cap as u64);
            assert_eq!(l.admitted(), members.len());
            let mut ids: Vec<u32> = members
                .iter()
                .flat_map(|(a, _)| a.table())
                .copied()
                .collect();
            assert_eq!(l.used(), ids.len());
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), l.used(), "a block is in two tables");
        }
        for (mut a, _) in members {
            l.free(&mut a).unwrap();
        }
        assert_eq!((l.used(), l.reserved(), l.admitted()), (0, 0, 0));
    }
}

//! The paged KV cache's block allocator.
//!
//! The KV cache is `n_blocks` blocks of `block_size` positions each (one
//! position holds K and V of every layer for one token). A sequence owns a
//! *block table*: the ids of its blocks in position order, so position `p`
//! lives in block `block_table[p / block_size]` at slot `p % block_size`.
//!
//! The cache is the decode group's resource (B-036..B-040 admission by
//! charge): `resource_capacity` is [`BlockAllocator::capacity`] and a request's
//! charge is [`BlockAllocator::charge_for`] of its prompt + output, so FCFS
//! admission never over-commits the cache and [`BlockAllocator::alloc`] cannot
//! run dry for an admitted member. Blocks are handed out lazily, as a
//! sequence's positions grow (paging), and come back in one call when the
//! member completes ([`BlockAllocator::free`]).

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
    /// `block_size` or `n_blocks` is zero, or `n_blocks` exceeds `u32` ids.
    #[error("invalid KV cache shape: {n_blocks} blocks of {block_size} positions")]
    Shape {
        /// Blocks asked for.
        n_blocks: usize,
        /// Positions per block asked for.
        block_size: usize,
    },
}

/// Free-list allocator of KV-cache blocks with use accounting.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
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
}

//! Keyed-shard router (`xtc_batch_router_*`, B-168..B-171): N groups plus a
//! modulo, nothing more.
//!
//! The caller creates one group per shard loop (typically placed with
//! [`loop_for_device`](super::placement)), hands them to [`Router::new`], and
//! submits itself to the group [`Router::route`] returns: the router never
//! submits (B-170), holds no runtime state beyond the list, and adds no
//! coupling between groups (B-171).
//!
//! Ownership: the router holds whatever `G` is. With `G = &Group<R>` (or
//! `&Remote<R>`) it borrows the groups, as the C router copies the pointer
//! array (B-169), and dropping it frees only its own `Vec`, never a group;
//! the caller still closes and destroys each group on its owner loop. With an
//! owned `G`, [`Router::into_groups`] hands the groups back for that teardown.

use crate::{Error, Result};

/// A fixed list of groups and the modulo that maps a key to one of them.
#[derive(Debug, Clone)]
pub struct Router<G> {
    groups: Vec<G>,
}

impl<G> Router<G> {
    /// A router over `groups` (B-169), in the order given: shard `i` is
    /// `groups[i]`.
    ///
    /// # Errors
    /// [`Error::Inval`] for an empty list (the `n <= 0` of B-171);
    /// [`Error::Nosys`] in a build without the `sched-policy` feature (B-159).
    pub fn new(groups: Vec<G>) -> Result<Router<G>> {
        if !cfg!(feature = "sched-policy") {
            return Err(Error::Nosys);
        }
        if groups.is_empty() {
            return Err(Error::Inval);
        }
        Ok(Router { groups })
    }

    /// The group for `key`: `groups[key % n]` (B-169). The same key always
    /// returns the same group of the same router.
    pub fn route(&self, key: u64) -> &G {
        &self.groups[self.shard(key)]
    }

    /// The shard index for `key`: `key % n`, in `[0, n)`.
    pub fn shard(&self, key: u64) -> usize {
        // n >= 1 (checked in `new`) and the remainder is < n, so it fits usize.
        (key % self.groups.len() as u64) as usize
    }

    /// Number of shards (at least 1).
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Always `false`: a router has at least one group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups, in shard order.
    pub fn groups(&self) -> &[G] {
        &self.groups
    }

    /// Frees the router and hands the groups back (`xtc_batch_router_destroy`
    /// frees only the router, B-171): the caller then closes and destroys
    /// each group on its owner loop.
    pub fn into_groups(self) -> Vec<G> {
        self.groups
    }
}

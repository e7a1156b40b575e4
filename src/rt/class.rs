//! Scheduling classes and the loop's ready set.
//!
//! A [`SchedClass`] belongs to one loop (handing it to another loop is `Inval`,
//! B-182). Every runnable process waits in the FIFO of its class; class 0 is the
//! loop's default class (weight [`DEFAULT_WEIGHT`]). A real loop picks among
//! classes with runnable processes by stride scheduling (each class receives
//! turns in proportion to its weight); [`Sim`](super::Sim) picks a class with
//! probability proportional to its weight and a process in it uniformly, both
//! from its seeded RNG.

use super::LoopId;
use super::proc_table::ProcRunnable;
use std::collections::VecDeque;

/// Weight of a loop's default class (processes spawned with [`Loop::spawn`](super::Loop::spawn)).
pub const DEFAULT_WEIGHT: u32 = 100;

/// Stride numerator: a class advances its pass by `STRIDE / weight` per turn.
const STRIDE: u64 = 1 << 32;

/// A scheduling class of one loop: processes spawned into it with
/// [`Loop::spawn_in`](super::Loop::spawn_in) get turns in proportion to
/// `weight` against the loop's other classes (the default class weighs
/// [`DEFAULT_WEIGHT`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SchedClass {
    loop_id: LoopId,
    idx: u32,
    weight: u32,
}

impl SchedClass {
    pub(crate) fn new(loop_id: LoopId, idx: u32, weight: u32) -> SchedClass {
        SchedClass {
            loop_id,
            idx,
            weight,
        }
    }

    /// The loop this class belongs to.
    pub fn loop_id(&self) -> LoopId {
        self.loop_id
    }

    /// The class's relative weight (>= 1).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The class's index on its loop (0 is the default class; created classes are 1, 2, ...).
    pub fn id(&self) -> u32 {
        self.idx
    }
}

struct ClassQueue {
    weight: u32,
    pass: u64,
    queue: VecDeque<ProcRunnable>,
}

/// Runnable processes of one loop, queued per class.
pub(crate) struct ReadySet {
    classes: Vec<ClassQueue>,
    len: usize,
    /// Pass of the last class picked (a class that becomes runnable starts here).
    global_pass: u64,
}

impl ReadySet {
    pub(crate) fn new() -> ReadySet {
        let mut set = ReadySet {
            classes: Vec::new(),
            len: 0,
            global_pass: 0,
        };
        set.add_class(DEFAULT_WEIGHT);
        set
    }

    /// Adds a class and returns its index.
    pub(crate) fn add_class(&mut self, weight: u32) -> u32 {
        self.classes.push(ClassQueue {
            weight: weight.max(1),
            pass: 0,
            queue: VecDeque::new(),
        });
        (self.classes.len() - 1) as u32
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn push(&mut self, r: ProcRunnable) {
        let idx = r.metadata().class as usize;
        let class = &mut self.classes[idx];
        if class.queue.is_empty() {
            class.pass = class.pass.max(self.global_pass);
        }
        class.queue.push_back(r);
        self.len += 1;
    }

    /// Stride pick: the runnable class with the smallest pass, FIFO within it.
    pub(crate) fn pop(&mut self) -> Option<ProcRunnable> {
        if self.len == 0 {
            return None;
        }
        let idx = if self.classes.len() == 1 {
            0
        } else {
            self.classes
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.queue.is_empty())
                .min_by_key(|(i, c)| (c.pass, *i))
                .map(|(i, _)| i)?
        };
        let class = &mut self.classes[idx];
        self.global_pass = class.pass;
        class.pass = class.pass.saturating_add(STRIDE / u64::from(class.weight));
        self.len -= 1;
        class.queue.pop_front()
    }

    /// Sum of the weights of classes with runnable processes.
    pub(crate) fn weight_sum(&self) -> u64 {
        self.classes
            .iter()
            .filter(|c| !c.queue.is_empty())
            .map(|c| u64::from(c.weight))
            .sum()
    }

    /// Takes a runnable process from the class that `ticket` (in
    /// `0..weight_sum()`) falls into, at position `pick(len)` in its queue.
    pub(crate) fn take_weighted(
        &mut self,
        mut ticket: u64,
        pick: impl FnOnce(usize) -> usize,
    ) -> Option<ProcRunnable> {
        let class = self
            .classes
            .iter_mut()
            .filter(|c| !c.queue.is_empty())
            .find(|c| {
                let w = u64::from(c.weight);
                if ticket < w {
                    return true;
                }
                ticket -= w;
                false
            })?;
        let at = pick(class.queue.len());
        let r = class.queue.swap_remove_back(at)?;
        self.len -= 1;
        Some(r)
    }

    /// Removes every queued runnable (loop teardown).
    pub(crate) fn drain_all(&mut self) -> Vec<ProcRunnable> {
        self.len = 0;
        self.classes
            .iter_mut()
            .flat_map(|c| c.queue.drain(..))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ready set of `weights` (class 0 is the default class) with `n`
    /// runnable processes per class; returns how many of `picks` each got
    /// when every picked process is requeued at once (it yielded).
    fn picks(weights: &[u32], picks: usize) -> Vec<usize> {
        let mut set = ReadySet::new();
        let classes: Vec<u32> = weights.iter().map(|w| set.add_class(*w)).collect();
        let mut tasks = Vec::new();
        for &c in &classes {
            let (r, t) = async_task::Builder::new()
                .metadata(super::super::proc_table::ProcMeta { seq: 0, class: c })
                .spawn(|_| async {}, |_| {});
            set.push(r);
            tasks.push(t);
        }
        let mut got = vec![0; weights.len()];
        for _ in 0..picks {
            let r = set.pop().unwrap();
            let c = r.metadata().class as usize - 1;
            got[c] += 1;
            set.push(r);
        }
        got
    }

    #[test]
    fn stride_gives_turns_in_proportion_to_weight() {
        assert_eq!(picks(&[300, 100], 400), vec![300, 100]);
        assert_eq!(picks(&[1, 1, 2], 400), vec![100, 100, 200]);
    }

    #[test]
    fn weighted_take_follows_the_ticket() {
        let mut set = ReadySet::new();
        let a = set.add_class(10);
        let b = set.add_class(30);
        let mut tasks = Vec::new();
        for c in [a, b] {
            let (r, t) = async_task::Builder::new()
                .metadata(super::super::proc_table::ProcMeta { seq: 0, class: c })
                .spawn(|_| async {}, |_| {});
            set.push(r);
            tasks.push(t);
        }
        assert_eq!(set.weight_sum(), 40);
        let r = set.take_weighted(9, |_| 0).unwrap();
        assert_eq!(r.metadata().class, a);
        assert_eq!(set.weight_sum(), 30);
        let r2 = set.take_weighted(0, |_| 0).unwrap();
        assert_eq!(r2.metadata().class, b);
        assert_eq!(set.len(), 0);
        assert!(set.take_weighted(0, |_| 0).is_none());
    }
}

//! Hidden entry points for `benches/ring.rs` (the ring's types are
//! crate-private; benches are a separate crate). Not part of the API.
#![deny(unsafe_code)]

use std::sync::Arc;

use super::Pop;
use super::admission::{Admission, HandIn, HandleSpace, Inbox};

/// The producer half of an admission of `u64` requests.
#[derive(Debug, Clone)]
pub struct BenchProducer(Arc<Admission<u64>>);

/// The consumer half: drains and admits (releases SUBMIT records).
#[derive(Debug)]
pub struct BenchConsumer(Inbox<u64>);

/// An admission with `cap` SUBMIT and `cap` control records.
///
/// # Panics
/// When `cap == 0`.
pub fn admission(cap: usize) -> (BenchProducer, BenchConsumer) {
    let (shared, inbox) = Admission::new(cap, Arc::new(HandleSpace::default())).expect("cap > 0");
    (BenchProducer(shared), BenchConsumer(inbox))
}

impl BenchProducer {
    /// One `submit_mt` hand-in; `false` on `Again`.
    pub fn submit(&self, request: u64) -> bool {
        self.0.submit(request, 1).is_ok()
    }
}

impl BenchConsumer {
    /// Drains everything on the ring, admitting each submit at once; returns
    /// how many hand-ins it took.
    pub fn drain(&mut self) -> usize {
        let (mut n, mut submits) = (0, 0);
        while let Pop::Item(item) = self.0.pop() {
            if let HandIn::Submit { .. } = item {
                submits += 1;
            }
            n += 1;
        }
        self.0.release_submits(submits);
        n
    }
}

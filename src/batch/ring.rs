//! Bounded lock-free multi-producer single-consumer ring: the transport of
//! cross-loop admission (`xtc_batch(3)` B-109, B-110, B-121, B-141..B-143).
//!
//! The algorithm is Dmitry Vyukov's bounded queue (the one behind crossbeam's
//! `ArrayQueue`) with per-slot sequence stamps, specialised to ONE consumer and
//! using 64-bit positions that never wrap, so a stamp value is never reused
//! for another lap (no ABA) and no lap/index packing is needed. Two flag bits
//! in the tail word make closing atomic with reservation: a submit that
//! reserves a slot did so before close, or it is refused.
//!
//! # Fields (who may touch what, and what grants the right)
//!
//! - `tail` (producers, [`CachePadded`]): `(pos << FLAG_BITS) | FINISHED |
//!   CLOSED`. `pos` is the number of reservations ever made, i.e. the position
//!   the next producer reserves. A producer advances `pos` by exactly one with
//!   a CAS, which is what reserves position `pos` for it alone. The flags are
//!   only ever set (`fetch_or`), by the owner: `Ring::close` sets `CLOSED`
//!   (reservations of class `Class::Submit` fail from then on),
//!   `Ring::finish` sets `FINISHED` (every reservation fails).
//! - `head` (consumer, [`CachePadded`]): the position the consumer reads next.
//!   The consumer's own copy lives in its `ConsumerKey`; the atomic mirror is
//!   stored by the consumer only and read by producers only on the slow path
//!   that decides "full" (crossbeam does the same).
//! - `slots[i].stamp`: for the position `p` with `p & mask == i` that the slot
//!   serves next, `stamp == p` means FREE (the producer that reserves `p` may
//!   write it) and `stamp == p + 1` means FULL (it holds the value written at
//!   `p`, for the consumer when `head == p`). Only the producer that reserved
//!   `p` stores `p + 1` (Release, after writing the value); only the consumer
//!   stores `p + N` (Release, after moving the value out), which frees the slot
//!   for position `p + N`. Stamps only increase.
//! - `slots[i].value`: initialised exactly while the slot is FULL.
//! - `mask`: `N - 1`, where `N = slots.len()` is a power of two, at least 2.
//!
//! A reserved slot whose stamp still reads FREE is one whose producer is
//! "still writing"; the consumer reports it as `Pop::Busy` (there is a
//! reservation at or after `head`, `tail > head`, but the value is not
//! there yet), distinct from `Pop::Empty`. An owner-loop cancel uses that to
//! answer `Again` (B-053) rather than a wrong `Inval`.
//!
//! # Safety
//!
//! 1. *One writer per position.* Successful CASes on `tail` increase `pos` by
//!    one each, so each position is won by exactly one producer. The winner
//!    saw `stamp == pos` with Acquire; that value was stored (Release) by the
//!    consumer after it moved out the value of position `pos - N` (or is the
//!    initial stamp), so the consumer's read happens-before this write. No
//!    other producer writes the slot until its stamp reaches `pos + N`, which
//!    only the consumer stores, after reading this value.
//! 2. *One reader per value.* Only the holder of the ring's unique
//!    `ConsumerKey` (`&mut`, not `Clone`) reads, and only when
//!    `stamp == head + 1` was loaded with Acquire, which synchronises with the
//!    writer's Release store: the value is fully written. After reading it
//!    stores `head + N`, so it never reads the same value twice.
//! 3. *No ABA.* Positions are `u64`, reservation stops at `MAX_POS` (2^62, over
//!    14 000 years at 10 M hand-ins per second), so a stamp never means two
//!    laps at once.
//! 4. *Drop.* `&mut self`: no producer or consumer is running. A slot holds a
//!    value iff its stamp is FULL, i.e. `stamp & mask == (i + 1) & mask`; with
//!    `N >= 2` that is distinct from FREE (`stamp & mask == i`).
//! 5. *Peek.* `Ring::find_written` reads (never moves) values in FULL
//!    slots at or after `head`, under a borrow of the unique key, so no pop
//!    runs meanwhile: a FULL slot is written by no producer until the
//!    consumer frees it (point 1), and the Acquire load of its FULL stamp
//!    makes the value visible (point 2).
//!
//! A producer that reserved a position and then stopped forever (killed mid
//! call) would stall the consumer at that position; the mt calls never block
//! or yield between reserving and committing, so this cannot happen short of
//! a crash.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::sync::atomic::AtomicU64 as StdAtomicU64;

use crossbeam_utils::CachePadded;

use super::sync_facade::{AtomicU64, Ordering, UnsafeCell, fence, spin_hint};
use crate::{Error, Result};

pub(crate) mod admission;
#[doc(hidden)]
pub mod bench_support;
#[cfg(all(test, loom))]
mod loom_models;
#[cfg(all(test, not(loom)))]
mod tests;

/// Tail flag: submits are refused (set by [`Ring::close`]).
const CLOSED: u64 = 1;
/// Tail flag: every reservation is refused (set by [`Ring::finish`]).
const FINISHED: u64 = 2;
/// Low bits of `tail` used by the flags.
const FLAG_BITS: u32 = 2;
/// One position in `tail` units.
const ONE_POS: u64 = 1 << FLAG_BITS;
/// First position that is never reserved (keeps `tail`, stamps and `pos + N`
/// far from `u64` overflow).
const MAX_POS: u64 = 1 << 62;
/// Largest slot count a ring accepts.
const MAX_SLOTS: usize = 1 << 31;

/// Source of ring identities, tying a [`ConsumerKey`] to its ring (not part
/// of any loom model, hence `std`).
static NEXT_RING_ID: StdAtomicU64 = StdAtomicU64::new(1);

/// Which reservations a flag refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// A submit hand-in: refused once the ring is closed.
    Submit,
    /// A cancel or resume hand-in: refused only once the ring is finished.
    Control,
}

/// Why a push (or reservation) was refused. The value comes back with
/// [`PushError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every slot is reserved and not yet consumed.
    Full,
    /// [`Ring::close`] ran before this submit could reserve a slot.
    Closed,
    /// [`Ring::finish`] ran: the consumer is gone for good.
    Finished,
}

/// A refused push: the reason and the value, handed back (as crossbeam's
/// `ArrayQueue::push` and tokio's `TrySendError` do).
#[derive(Debug)]
pub(crate) struct PushError<T> {
    pub(crate) refusal: Refusal,
    pub(crate) value: T,
}

/// What the consumer found at `head`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pop<T> {
    /// The next value in reservation order.
    Item(T),
    /// No reservation at or after `head`.
    Empty,
    /// The position at `head` is reserved but its producer is still writing.
    Busy,
}

/// A reserved position that its producer must [`commit`](Ring::commit).
#[must_use = "a reservation that is never committed stalls the consumer"]
#[derive(Debug)]
struct Reservation {
    pos: u64,
}

/// One ring slot: a stamp and storage for one value.
struct Slot<T> {
    stamp: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// The consumer's capability: unique per ring, not `Clone`; holds `head`.
#[derive(Debug)]
pub(crate) struct ConsumerKey {
    ring_id: u64,
    head: u64,
}

impl ConsumerKey {
    /// Position of the next value to consume (= values consumed so far).
    pub(crate) fn head(&self) -> u64 {
        self.head
    }
}

/// Bounded lock-free MPSC ring (see the module memo for the protocol).
pub(crate) struct Ring<T> {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    slots: Box<[Slot<T>]>,
    mask: u64,
    id: u64,
}

// SAFETY: values move between threads through the ring (hence `T: Send`); the
// slot protocol in the module memo gives each value one writer and one reader
// with a happens-before edge between them, so sharing `&Ring` is sound.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: owning the ring owns the values in FULL slots; moving it moves them.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tail = self.tail.load(Ordering::Relaxed);
        f.debug_struct("Ring")
            .field("slots", &self.slots.len())
            .field("tail_pos", &(tail >> FLAG_BITS))
            .field("closed", &(tail & CLOSED != 0))
            .field("finished", &(tail & FINISHED != 0))
            .finish_non_exhaustive()
    }
}

/// Slot count for a ring asked to hold `min_slots` values: the next power of
/// two, at least 2. `Range` if that does not fit.
fn slot_count(min_slots: usize) -> Result<usize> {
    let n = min_slots
        .max(2)
        .checked_next_power_of_two()
        .ok_or(Error::Range)?;
    if n > MAX_SLOTS {
        return Err(Error::Range);
    }
    Ok(n)
}

impl<T> Ring<T> {
    /// A ring with room for at least `min_slots` values (rounded up to a power
    /// of two, at least 2), and the key of its single consumer.
    ///
    /// # Errors
    /// `Range` when the slot count overflows (more than 2^31 slots) or the
    /// slots' bytes exceed `isize::MAX` (B-018); `Nomem` when the allocator
    /// refuses them (B-185): the slots are allocated fallibly, never with an
    /// abort.
    pub(crate) fn with_capacity(min_slots: usize) -> Result<(Ring<T>, ConsumerKey)> {
        let n = slot_count(min_slots)?;
        let bytes = n
            .checked_mul(std::mem::size_of::<Slot<T>>())
            .ok_or(Error::Range)?;
        if bytes > isize::MAX as usize {
            return Err(Error::Range);
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(n).map_err(|_| Error::Nomem)?;
        slots.extend((0..n as u64).map(|i| Slot {
            stamp: AtomicU64::new(i),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }));
        let slots = slots.into_boxed_slice();
        let id = NEXT_RING_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ring = Ring {
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
            slots,
            mask: n as u64 - 1,
            id,
        };
        Ok((
            ring,
            ConsumerKey {
                ring_id: id,
                head: 0,
            },
        ))
    }

    /// Bytes a ring for `min_slots` values occupies (header plus slots), for
    /// charging the loop's resource accountant before creating it.
    ///
    /// # Errors
    /// `Range` on arithmetic overflow.
    pub(crate) fn bytes_for(min_slots: usize) -> Result<u64> {
        let n = slot_count(min_slots)? as u64;
        let slot = std::mem::size_of::<Slot<T>>() as u64;
        n.checked_mul(slot)
            .and_then(|b| b.checked_add(std::mem::size_of::<Ring<T>>() as u64))
            .ok_or(Error::Range)
    }

    /// Number of slots (a power of two).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, pos: u64) -> &Slot<T> {
        let i = (pos & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        &self.slots[i]
    }

    /// Pushes `value` at the next position; returns that position.
    ///
    /// # Errors
    /// The value comes back with the [`Refusal`]: `Full`, `Closed` (a submit
    /// after [`close`](Ring::close)) or `Finished`.
    pub(crate) fn push(&self, value: T, class: Class) -> Result<u64, PushError<T>> {
        match self.reserve(class) {
            Ok(r) => Ok(self.commit(r, value)),
            Err(refusal) => Err(PushError { refusal, value }),
        }
    }

    /// Reserves the next position for `class` (step one of a push).
    fn reserve(&self, class: Class) -> Result<Reservation, Refusal> {
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            if tail & FINISHED != 0 {
                return Err(Refusal::Finished);
            }
            if class == Class::Submit && tail & CLOSED != 0 {
                return Err(Refusal::Closed);
            }
            let pos = tail >> FLAG_BITS;
            if pos >= MAX_POS {
                return Err(Refusal::Full);
            }
            let stamp = self.slot(pos).stamp.load(Ordering::Acquire);
            if stamp == pos {
                let next = tail + ONE_POS;
                match self.tail.compare_exchange_weak(
                    tail,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(Reservation { pos }),
                    Err(current) => tail = current,
                }
            } else if stamp < pos {
                // The slot still serves position `pos - N`. Full only if the
                // consumer has truly not consumed it; otherwise our view of
                // the stamp was stale: look again.
                fence(Ordering::SeqCst);
                if self.head.load(Ordering::Relaxed) + self.slots.len() as u64 <= pos {
                    return Err(Refusal::Full);
                }
                spin_hint();
                tail = self.tail.load(Ordering::Relaxed);
            } else {
                // Another producer already reserved `pos`: our tail is stale.
                spin_hint();
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Writes `value` into the reserved position and publishes it (step two of
    /// a push); returns the position.
    fn commit(&self, r: Reservation, value: T) -> u64 {
        let slot = self.slot(r.pos);
        // SAFETY: safety memo point 1: the reservation of `r.pos` makes this
        // producer the slot's only writer until it publishes `r.pos + 1`, and
        // the consumer's read of the previous value happens-before (Acquire on
        // the FREE stamp in `reserve`). The slot is uninitialised (FREE).
        slot.value.with_mut(|p| unsafe { (*p).write(value) });
        slot.stamp.store(r.pos + 1, Ordering::Release);
        r.pos
    }

    /// Takes the value at the consumer's `head`, if it is there.
    ///
    /// # Panics
    /// When `key` belongs to another ring.
    pub(crate) fn pop(&self, key: &mut ConsumerKey) -> Pop<T> {
        assert_eq!(key.ring_id, self.id, "ConsumerKey of another ring");
        let head = key.head;
        let slot = self.slot(head);
        if slot.stamp.load(Ordering::Acquire) != head + 1 {
            let reserved = self.tail.load(Ordering::Acquire) >> FLAG_BITS;
            return if reserved > head {
                Pop::Busy
            } else {
                Pop::Empty
            };
        }
        // SAFETY: safety memo point 2: `&mut key` makes this the only reader,
        // and the Acquire load of the FULL stamp `head + 1` synchronises with
        // the writer's Release store, so the value is initialised and no
        // producer touches the slot until we store `head + N` below.
        let value = slot.value.with_mut(|p| unsafe { (*p).assume_init_read() });
        slot.stamp
            .store(head + self.slots.len() as u64, Ordering::Release);
        key.head = head + 1;
        self.head.store(head + 1, Ordering::Relaxed);
        Pop::Item(value)
    }

    /// The first value already written at some position from the
    /// consumer's `head` on that satisfies `f`: `Some(busy_before)`, where
    /// `busy_before` says whether a position before it is still being
    /// written (the next `pop`s stop there), or `None`. A read-only look
    /// past positions whose producer is still writing (nothing is moved out,
    /// `head` stays). Used by an owner-loop cancel to tell a live hand-in
    /// (cancel it, or `Again` while stuck behind a still-written one, B-053)
    /// from a stale handle (`Inval`), and by the driver's completion
    /// boundary to see a cancel stuck behind a still-written position.
    ///
    /// # Panics
    /// When `key` belongs to another ring.
    pub(crate) fn find_written(
        &self,
        key: &ConsumerKey,
        mut f: impl FnMut(&T) -> bool,
    ) -> Option<bool> {
        assert_eq!(key.ring_id, self.id, "ConsumerKey of another ring");
        let reserved = self.tail.load(Ordering::Acquire) >> FLAG_BITS;
        let mut busy_before = false;
        for pos in key.head..reserved {
            let slot = self.slot(pos);
            if slot.stamp.load(Ordering::Acquire) != pos + 1 {
                busy_before = true; // still being written (or not this lap)
                continue;
            }
            // SAFETY: safety memo point 5: the FULL stamp `pos + 1`, loaded
            // with Acquire, synchronises with its writer's Release store, so
            // the value is initialised; only the key's holder (borrowed here,
            // so no `pop` runs meanwhile) moves it out or frees the slot, so
            // it stays initialised and unwritten while `f` reads it.
            if slot.value.with(|p| f(unsafe { (*p).assume_init_ref() })) {
                return Some(busy_before);
            }
        }
        None
    }

    /// Whether the value at the consumer's `head` is written and ready to pop
    /// (a reserved-but-unwritten position reads `false`).
    pub(crate) fn has_ready(&self, key: &ConsumerKey) -> bool {
        self.slot(key.head).stamp.load(Ordering::Acquire) == key.head + 1
    }

    /// Closes the ring to submits (not to controls); returns the close
    /// position: every submit reserved before close has a position below it.
    /// Idempotent (a second call returns the current tail position, which is
    /// still an upper bound of every submit position).
    pub(crate) fn close(&self) -> u64 {
        self.tail.fetch_or(CLOSED, Ordering::AcqRel) >> FLAG_BITS
    }

    /// Refuses every later reservation (the consumer has finished for good).
    pub(crate) fn finish(&self) {
        self.tail.fetch_or(FINISHED | CLOSED, Ordering::AcqRel);
    }

    /// Whether [`close`](Ring::close) has run (a racing submit may still
    /// have reserved just before it).
    pub(crate) fn is_closed(&self) -> bool {
        self.tail.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Whether [`finish`](Ring::finish) has run.
    pub(crate) fn is_finished(&self) -> bool {
        self.tail.load(Ordering::Acquire) & FINISHED != 0
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        let mask = self.mask;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let stamp = slot.stamp.load(Ordering::Relaxed);
            if stamp & mask == (i as u64 + 1) & mask {
                // SAFETY: safety memo point 4: `&mut self` excludes every
                // producer and the consumer, and a FULL stamp means the value
                // was written and not yet moved out.
                slot.value.with_mut(|p| unsafe { (*p).assume_init_drop() });
            }
        }
    }
}

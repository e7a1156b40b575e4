//! Cross-loop mailboxes (B-129: "send commands to an owner process using
//! existing messaging APIs"): a `crossbeam-channel` whose [`Sender`] is `Send +
//! Clone` and whose [`Receiver`] is awaited on its owner loop.
//!
//! The receiver parks by leaving its waker in a shared slot; a send (from any
//! thread or loop) pushes the message, then takes and wakes that waker, which
//! reaches a parked real loop through its eventfd. The receiver registers its
//! waker *before* re-checking the channel, so a message is never missed. When
//! the last sender is dropped the receiver is woken and sees `Aborted`.

use crate::{Error, Result};
use crossbeam_channel as cb;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

type Slot = Arc<Mutex<Option<Waker>>>;

fn wake(slot: &Slot) {
    let w = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(w) = w {
        w.wake();
    }
}

/// A new unbounded mailbox.
pub fn mailbox<T: Send>() -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = cb::unbounded();
    let slot: Slot = Arc::new(Mutex::new(None));
    (
        Sender {
            tx: Some(tx),
            slot: slot.clone(),
        },
        Receiver { rx, slot },
    )
}

/// The sending half: `Send + Clone`, usable from any thread or loop.
pub struct Sender<T> {
    tx: Option<cb::Sender<T>>,
    slot: Slot,
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sender { .. }")
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            tx: self.tx.clone(),
            slot: self.slot.clone(),
        }
    }
}

impl<T> Sender<T> {
    /// Sends `msg` and wakes the receiver.
    ///
    /// # Errors
    /// The message comes back when the receiver was dropped.
    pub fn send(&self, msg: T) -> std::result::Result<(), T> {
        let Some(tx) = &self.tx else {
            return Err(msg);
        };
        tx.send(msg).map_err(|e| e.into_inner())?;
        wake(&self.slot);
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // Disconnect first (if this is the last sender), then wake the
        // receiver so it observes the disconnection.
        drop(self.tx.take());
        wake(&self.slot);
    }
}

/// The receiving half, awaited on its owner loop. `Send` (it may be handed to
/// the loop that will own it) but not `Clone`.
pub struct Receiver<T> {
    rx: cb::Receiver<T>,
    slot: Slot,
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("queued", &self.rx.len())
            .finish()
    }
}

impl<T> Receiver<T> {
    /// Waits for the next message.
    ///
    /// # Errors
    /// `Aborted` once every sender is gone and the queue is empty.
    pub fn recv(&self) -> Recv<'_, T> {
        Recv { rx: self }
    }

    /// The next message if one is queued.
    ///
    /// # Errors
    /// `Again` when empty, `Aborted` when empty and every sender is gone.
    pub fn try_recv(&self) -> Result<T> {
        self.rx.try_recv().map_err(|e| match e {
            cb::TryRecvError::Empty => Error::Again,
            cb::TryRecvError::Disconnected => Error::Aborted,
        })
    }
}

/// Future of [`Receiver::recv`].
#[must_use = "a receive does nothing unless awaited"]
pub struct Recv<'a, T> {
    rx: &'a Receiver<T>,
}

impl<T> Future for Recv<'_, T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        match self.rx.try_recv() {
            Err(Error::Again) => {}
            done => return Poll::Ready(done),
        }
        *self.rx.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        match self.rx.try_recv() {
            Err(Error::Again) => Poll::Pending,
            done => Poll::Ready(done),
        }
    }
}

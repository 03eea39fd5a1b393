//! Closing a pair so that every command ends exactly once: `close`.

use std::time::{Duration, Instant};

use super::blocking::Periodic;
use super::{Completion, IoQueuePair};
use crate::device::Device;
use crate::error::IoError;

impl<D: Device> IoQueuePair<D> {
    /// Closes the pair and returns every command not delivered yet, each
    /// exactly once, with its buffer: first it reaps (and announces anything
    /// queued) until nothing is in flight or `timeout` has passed; then it
    /// deletes the queues — Delete I/O SQ, a last reap of what that ended
    /// (typically Command Aborted due to SQ Deletion), Delete I/O CQ — and
    /// what is still without a completion ends with
    /// [`IoError::QueueDeleted`]: the device can no longer reach it.
    ///
    /// The drain keeps to `timeout`: the command timeout recovery (an
    /// Abort, then a reset) runs inside it only while more than the
    /// controller's admin timeout of `timeout` is left, as in
    /// [`IoQueuePair::execute_blocking`]. The deletion after it is not
    /// bounded by `timeout`: it waits for the admin queue (another thread's
    /// admin command or reset may hold it) and for each deletion up to the
    /// admin timeout.
    ///
    /// A release on the kernel's request (a removal, an unbind) refuses the
    /// deletion; the close then waits for the release to end (it is bounded:
    /// a disable of at most 500 ms, then the device's release) and returns
    /// what is left with [`IoError::ControllerRemoved`], with its buffer.
    ///
    /// Only when the controller cannot confirm the deletion (it failed or
    /// vanished, or refused the deletion) and was not disabled since does a
    /// command stay without a completion: its buffer is quarantined until
    /// the controller is disabled, never freed while the queues may exist
    /// (also after a release that could not confirm that DMA stopped).
    ///
    /// A reset from another thread during the close ends the commands it
    /// ended here, as the pair's next call would have — except when it
    /// lands right before the queue deletion, which then finds the queues
    /// gone and ends what is left with [`IoError::QueueDeleted`] (a command
    /// the pair had aborted included, which would otherwise end as
    /// `TimedOut`). A pair that is simply dropped delivers nothing (see
    /// `Drop`).
    pub fn close(mut self, timeout: Duration) -> Vec<Completion> {
        let mut out = Vec::new();
        let start = Instant::now();
        // The drain polls like a blocking wait: no PAUSE and no clock read
        // per poll (under emulation both cost more than the I/O). The clock
        // is read on the first empty poll after a completion, on every
        // 1024th poll, and on every poll once the wait sleeps; the pair's
        // `Backoff` starts once `spin_polls` polls in a row found nothing.
        // `Duration::ZERO` thus reaps until the CQ is empty, then deletes.
        let mut empty = 0u32;
        let mut periodic = Periodic::default();
        // The drain's timeout scans keep to `timeout` as a blocking wait's
        // do (none past it: `None` only for a timeout no Instant holds).
        self.drain_deadline = start.checked_add(timeout);
        loop {
            let before = out.len();
            let r = self.process_completions(u32::MAX, |_, c| out.push(c));
            if self.trackers.in_flight() == 0 && self.ready.is_empty() {
                return out;
            }
            if r.is_err() {
                break;
            }
            empty = if out.len() == before {
                empty.saturating_add(1)
            } else {
                0
            };
            let sleeping = empty > self.backoff.spin_polls && self.backoff.sleep.is_some();
            let (tick, _) = periodic.tick();
            if (tick || sleeping || empty == 1) && start.elapsed() >= timeout {
                break;
            }
            if empty > self.backoff.spin_polls {
                match self.backoff.sleep {
                    Some(d) => std::thread::sleep(d.min(timeout.saturating_sub(start.elapsed()))),
                    None => std::thread::yield_now(),
                }
            }
        }
        // The deletion is not bounded by `timeout`: its reap between the
        // deletions scans as the polled path does (a reset there ends
        // what the deletion would have).
        self.drain_deadline = None;
        let mut late = Vec::new();
        self.closing = true;
        let deleted = self.delete_queues(|qp| {
            let _ = qp.process_completions(u32::MAX, |_, c| late.push(c));
        });
        out.append(&mut late);
        if !deleted {
            // A release on the kernel's request refuses the deletion at
            // once (no admin command goes to the controller it disables)
            // and ends the commands itself, at its end — which may still
            // be a while away (closing a VFIO device resets the function):
            // wait for it, or the commands would stay undelivered and
            // their buffers be quarantined by the drop.
            self.ctrl.wait_for_release();
        }
        if !deleted && self.generation_changed() {
            // A reset (from another thread) came between: it disabled the
            // controller since these queues were created, so nothing can
            // reach the commands' memory any more — they end here, once,
            // as the reset ends them, instead of being dropped unseen.
            let closed = self.ctrl.is_closed();
            let slots: Vec<u16> = self.trackers.in_flight_slots().collect();
            for slot in slots {
                out.extend(self.end_in_flight(slot, closed).map(|(_, c)| c));
            }
            self.deleted = true;
        }
        // Parked completions (reaped on the owner's behalf) are delivered too.
        while let Some((_, c)) = self.ready.pop_front() {
            out.push(c);
        }
        if deleted {
            let slots: Vec<u16> = self.trackers.in_flight_slots().collect();
            for slot in slots {
                out.extend(self.end_slot(slot, IoError::QueueDeleted).map(|(_, c)| c));
            }
        }
        out
    }
}

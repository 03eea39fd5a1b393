//! Off the hot path: catching up with controller resets, command timeouts,
//! device faults, and turning a refusal into a descriptive error.

use upnvme_queues::{CqRing, SqRing, Sqe};

use super::split::Key;
use std::time::{Duration, Instant};

use super::{Completion, IoQueuePair, clock};
use crate::controller::CreateFailure;
use crate::device::Device;
use crate::error::{Error, IoError, Reject, Rejected, Result};

/// How often a submission catches up with resets that keep coming before it
/// gives up (see `resync_for_submit`).
const RESYNC_ROUNDS: u32 = 16;

/// Failed re-creations in a row that are retried at the next submit or poll;
/// after that the pair waits between tries (`RecreateRetry`).
const RECREATE_TRIES_AT_ONCE: u32 = 3;

/// The longest wait between two re-creation tries.
const RECREATE_MAX_WAIT: Duration = Duration::from_millis(100);

/// The re-creation of a pair's queues after a reset that keeps failing: how
/// often in a row, why the last time, and when the next try may be made.
/// Without it a polling application (which polls millions of times a
/// second) would send the controller a Create I/O Completion Queue per poll
/// for as long as the controller refuses it; with it the first
/// [`RECREATE_TRIES_AT_ONCE`] tries are made at once (a transient refusal
/// costs nothing) and later ones 1, 2, 4, ... ms apart, at most
/// [`RECREATE_MAX_WAIT`]. A new reset or a success starts over.
#[derive(Debug, Default)]
pub(super) struct RecreateRetry {
    /// Failed re-creations in a row since the last reset or success.
    failures: u32,
    /// The last failure's message.
    cause: String,
    /// Clock tick (`clock::now`) of the last failure.
    failed_at: u64,
    /// Clock tick before which no new try is made.
    not_before: u64,
}

impl RecreateRetry {
    /// Counts a failed re-creation, and when the next may be tried.
    fn failed(&mut self, cause: &Error) {
        self.failures = self.failures.saturating_add(1);
        self.cause = cause.to_string();
        self.failed_at = clock::now();
        self.not_before = match self.failures.checked_sub(RECREATE_TRIES_AT_ONCE) {
            None => 0,
            Some(k) => {
                let wait = Duration::from_millis(1u64 << k.min(16)).min(RECREATE_MAX_WAIT);
                self.failed_at.saturating_add(clock::ticks(wait))
            }
        };
    }

    /// How long until the next try may be made (zero: now). A clock that
    /// reads earlier than the failure (the thread moved to a core whose
    /// time-stamp counter is behind) ends the wait: it never lasts longer
    /// than its length, whatever the clock does.
    fn wait(&self) -> Duration {
        let now = clock::now();
        if self.not_before <= now || now < self.failed_at {
            return Duration::ZERO;
        }
        clock::ticks_to_duration(self.not_before - now)
    }
}

impl<D: Device> IoQueuePair<D> {
    /// The descriptive error behind a refusal: for [`Reject::Unusable`] the
    /// controller's own explanation (closed, failed and why, gone), for
    /// [`Reject::QueueFull`] [`Error::QueueFull`] with this pair's queue ID,
    /// otherwise [`Error::Rejected`] with the reason (still typed). Builds
    /// strings: call it off the hot path.
    #[cold]
    pub fn describe(&self, reason: Reject) -> Error {
        match reason {
            Reject::Unusable => {
                if self.failed || self.ctrl.check_usable().is_err() {
                    self.ctrl.unusable_error()
                } else if self.needs_recreate && self.recreate_retry.failures > 0 {
                    self.recreate_error()
                } else {
                    Error::ControllerFailed {
                        device: self.ctrl.name().to_string(),
                        reason: format!(
                            "queue pair {} could not re-create its queues after a reset",
                            self.qid
                        ),
                    }
                }
            }
            Reject::QueueFull => Error::QueueFull { qid: self.qid },
            // Typed, so a caller of a blocking helper can match on it; its
            // text says whether the argument was wrong
            // (`Reject::is_invalid_argument`).
            other => Error::Rejected(other),
        }
    }

    /// `queue_sqe` when the one-load check failed: after a reset, end what it
    /// ended and re-create the queues before anything is written to them;
    /// then refuse if the pair or the controller is failed or closed.
    #[cold]
    #[inline(never)]
    pub(super) fn resync_for_submit(&mut self) -> std::result::Result<(), Reject> {
        // Another thread may reset again right after this pair re-created its
        // queues (a management thread resetting every few milliseconds):
        // catch up again, a bounded number of times. Each round takes the
        // admin lock, which the resets take too, so they alternate.
        for _ in 0..RESYNC_ROUNDS {
            if self.current() {
                return Ok(());
            }
            // A reset under way (another thread) may have deleted the
            // queues: wait for it to end, then catch up with it.
            self.ctrl.wait_for_reset();
            if !(self.needs_recreate || self.generation_changed()) {
                // Failed or closed: no reset to catch up with.
                return Err(Reject::Unusable);
            }
            if self.sync_generation().is_err() {
                return Err(Reject::Unusable);
            }
        }
        if self.current() {
            Ok(())
        } else {
            Err(Reject::Unusable)
        }
    }

    /// The error for a pair or controller that cannot take commands.
    pub(super) fn check_usable(&self) -> Result<()> {
        if self.failed || !self.ctrl.is_usable() {
            return Err(self.ctrl.unusable_error());
        }
        Ok(())
    }

    /// `ring` when nothing may be announced: after a reset the queued
    /// commands end (once, ControllerReset) with the queue the reset deleted;
    /// a closed or failed controller never gets a doorbell (its queued
    /// commands end with the next reset or close).
    #[cold]
    #[inline(never)]
    pub(super) fn ring_refused(&mut self) {
        if self.needs_recreate || self.generation_changed() {
            let _ = self.sync_generation();
        }
    }

    /// Whether `cid` is the CID of a command in flight that is pushed to
    /// the SQ but not yet announced by a doorbell (the reap's check, asked
    /// again to explain a refusal).
    #[cold]
    #[inline(never)]
    pub(super) fn names_unannounced(&self, cid: u16) -> bool {
        let Ok(slot) = self.trackers.validate(cid) else {
            return false;
        };
        self.trackers.get(slot).is_some_and(|t| {
            super::reap::queued_unannounced(&self.sq_ring, &self.sq, t.sq_pos, cid)
        })
    }

    /// The SQ looked full when the command in tracker `slot` was about to
    /// be pushed. When every other command in flight is queued but not yet
    /// announced, every command this pair announced has completed (and been
    /// reaped), so the controller fetched every announced SQE whatever the
    /// SQ Head Pointer of their completions said
    /// ([`SqRing::infer_head`](upnvme_queues::SqRing::infer_head)): a device
    /// whose SQHD lags (or never moves) would otherwise keep the SQ "full"
    /// for ever with nothing in flight (a later completion whose SQHD lies
    /// behind the inferred head is then a head moving backwards, a
    /// `DeviceFault`). With an announced command still out the pair does
    /// not infer: its completion may already wait in the CQ with an SQHD
    /// taken before the head moved, which new SQEs in the freed slots would
    /// make ambiguous; the command is refused as `QueueFull` until it is
    /// reaped.
    /// Returns the slot the retried push got, or the command refused as
    /// `QueueFull`.
    #[cold]
    #[inline(never)]
    pub(super) fn sq_full(&mut self, slot: u16) -> std::result::Result<u16, Rejected> {
        self.settle_sq_head(1);
        self.sq_ring
            .push()
            .ok_or_else(|| self.unqueue(slot, Reject::QueueFull))
    }

    /// The head inference of [`IoQueuePair::sq_full`] with `own` commands
    /// allocated (counted in flight) but not yet in the SQ.
    #[cold]
    pub(super) fn settle_sq_head(&mut self, own: u32) {
        let unannounced = self.sq_ring.unannounced();
        if self.trackers.in_flight() == own + unannounced {
            self.sq_ring.infer_head(unannounced);
        }
    }

    /// The DeviceFault for a CQE that failed a check (checked again here, off
    /// the hot path, to say what was wrong); fails the pair and the controller.
    #[cold]
    #[inline(never)]
    pub(super) fn bad_completion(&mut self, dw2: u32, dw3: u32) -> Error {
        self.set_failed();
        let (sqid, sqhd, cid) = ((dw2 >> 16) as u16, dw2 as u16, dw3 as u16);
        let what = if sqid != self.qid {
            format!(
                "completion on CQ {} names SQ {sqid} (cid 0x{cid:04x})",
                self.qid
            )
        } else if let Err(e) = self.sq_ring.clone().update_head(sqhd) {
            format!("queue {}: {e}", self.qid)
        } else if self.names_unannounced(cid) {
            format!(
                "queue {}: completion for cid 0x{cid:04x}, whose command was queued but not yet \
                 announced (no SQ Tail doorbell covered it): the controller cannot have fetched it",
                self.qid
            )
        } else {
            match self.trackers.validate(cid) {
                Err(e) => format!("queue {}: {e}", self.qid),
                Ok(_) => format!("queue {}: completion refused (cid 0x{cid:04x})", self.qid),
            }
        };
        self.ctrl.fault(what)
    }

    /// The polled path's CSTS check ([`super::CSTS_INTERVAL`]): a controller
    /// that reports a fatal status (CSTS.CFS) is reset, which ends the
    /// commands in flight with [`crate::IoError::ControllerReset`] at the
    /// pair's next call, buffers returned; one whose CSTS reads all ones
    /// (removed, its link down) is marked failed and
    /// [`Error::ControllerGone`] returned, its buffers kept, since the
    /// device may still own them. Without it an application that only polls
    /// would wait for its command timeout — for ever with none set.
    #[cold]
    #[inline(never)]
    pub(super) fn check_csts_while_polling(&mut self) -> Result<()> {
        match crate::admin::check_csts(self.ctrl.dev(), self.ctrl.name()) {
            Ok(_) => Ok(()),
            // A release on the kernel's request (BAR0 reads all ones after
            // it) or a reset from another thread explains what CSTS shows:
            // the pair's next call ends the commands as that says
            // (ControllerRemoved, ControllerReset), not as a failure here.
            Err(_) if self.ctrl.is_removed() || self.generation_changed() => Ok(()),
            Err(Error::ControllerFatal { .. }) => {
                self.ctrl
                    .reset_unless_since(self.generation)
                    .map_err(|e| self.reset_failed(e))?;
                let _ = self.sync_generation();
                Ok(())
            }
            Err(e) => {
                self.ctrl.mark_failed(&e);
                Err(e)
            }
        }
    }

    /// Aborts commands older than the timeout; resets the controller when an
    /// aborted command is still not back after a second timeout, or when CSTS
    /// shows a fatal error.
    ///
    /// No clock is read on the I/O path: a command is stamped by the first
    /// scan that finds it in flight, and it is overdue when a later scan finds
    /// it older than the timeout. The stamp comes up to one scan interval
    /// (1024 polls) after the submission and the overdue scan up to one
    /// after the deadline, so a command times out between `command_timeout`
    /// and `command_timeout` plus two scan intervals after its submission —
    /// never early.
    ///
    /// Before anything is aborted or reset, what the controller has posted
    /// already is reaped (parked for delivery, as `reap_on_submit` does): a
    /// command whose completion sits in the CQ is not overdue — the scan
    /// runs after a reap bounded by the caller's `max`, and the host may
    /// have looked late — so it gets no Abort, and a reset for another
    /// command does not turn its success into `ControllerReset`. The same
    /// reap runs again right before a reset, after the Aborts (each may
    /// have waited up to the admin timeout while others completed).
    ///
    /// `abort_lock_by` (a blocking call's: its deadline less the admin
    /// timeout) bounds each Abort's wait for the admin lock, which another
    /// thread's admin command, Format NVM or reset may hold for long: an
    /// Abort that cannot have the lock by then is not sent, and the scan
    /// ends there — nothing more is aborted or reset (a reset needs the
    /// same lock) — so the call keeps to its timeout; the overdue commands
    /// stay as they are, for a later scan. `None` (the polled path, which
    /// has no deadline): each Abort waits for the lock as long as its
    /// holder keeps it.
    pub(super) fn check_timeouts(&mut self, abort_lock_by: Option<Instant>) -> Result<()> {
        let now = clock::now().max(1);
        let (mut to_abort, mut reset) = self.overdue(now);
        if to_abort.is_empty() && !reset {
            return Ok(());
        }
        self.park_posted();
        if self.failed {
            // The reap met a device fault: nothing more to do here.
            return Err(self.ctrl.unusable_error());
        }
        (to_abort, reset) = self.overdue(now);
        if to_abort.is_empty() && !reset {
            return Ok(());
        }
        if self.ctrl.is_removed() {
            // Released on the kernel's request: the release ends these
            // commands (ControllerRemoved, at the pair's next call); no
            // Abort for a controller it disabled, no reset of a device it
            // gave back.
            return Ok(());
        }
        // Something is overdue: is the controller still alive?
        let fatal = match crate::admin::check_csts(self.ctrl.dev(), self.ctrl.name()) {
            Ok(_) => false,
            // A release (all ones once the device is given back) or a reset
            // from another thread that began after the check above explains
            // it: the pair's next call ends the commands as that says.
            Err(_) if self.ctrl.is_removed() || self.generation_changed() => return Ok(()),
            Err(Error::ControllerFatal { .. }) => true,
            Err(e) => {
                self.ctrl.mark_failed(&e);
                return Err(e);
            }
        };
        if self.generation_changed() {
            // A reset from elsewhere came first: it ended these commands
            // (the pair's next call delivers them); the new controller has
            // none of these queues to abort in.
            return Ok(());
        }
        if fatal {
            // No Abort to a fatal controller (its admin path would reset it,
            // and this scan then again): the overdue commands end as
            // TimedOut with the one reset below.
            self.time_out(&to_abort);
            to_abort.clear();
            reset = true;
        }
        for (i, &slot) in to_abort.iter().enumerate() {
            let Some(cid) = self.trackers.cid_of(slot) else {
                continue;
            };
            if let Err(e) = self.ctrl.check_usable() {
                // Failed, closed or released since the CSTS check (by
                // another thread): the admin path would refuse the Abort,
                // so none is sent or counted. The overdue commands end as
                // TimedOut with the reset or close that ends them; until
                // then they keep their buffers (the device may own them).
                self.time_out(&to_abort[i..]);
                return if self.ctrl.is_removed() {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // The Abort's status does not matter: either the command
            // completes (with Command Abort Requested) or, after a second
            // timeout, the controller is reset. An Abort that got no
            // answer (or a broken one) left the controller marked failed,
            // and a failed controller's pair never gets to a second scan:
            // reset now, or nothing would end the overdue commands.
            let r = match self.ctrl.admin_command_by(
                Sqe::abort(self.qid, cid),
                &format!("Abort (SQ {}, CID 0x{cid:04x})", self.qid),
                abort_lock_by,
            ) {
                // The admin lock stayed busy past `abort_lock_by`: nothing
                // was sent, and this and the other overdue commands keep
                // their state for the next scan.
                Ok(None) => return Ok(()),
                Ok(Some(cqe)) => Ok(cqe),
                Err(e) => Err(e),
            };
            self.time_out(&[slot]);
            self.stats.aborts += 1;
            if self.generation_changed() {
                // The Abort met a fatal controller and was answered by a
                // reset (`with_admin`): the queues are gone and the
                // commands end at the pair's next call. The other overdue
                // ones end as TimedOut too, without Aborts for queues the
                // new controller does not have.
                self.time_out(&to_abort[i + 1..]);
                break;
            }
            match r {
                // Answered (its status does not matter, see above).
                Ok(_) | Err(Error::Command { .. }) => {}
                Err(Error::Timeout { .. } | Error::DeviceFault { .. }) => {
                    // No Abort gets through now: the other overdue commands
                    // are timed out too (the reset below ends them as
                    // TimedOut, not as ControllerReset).
                    self.time_out(&to_abort[i + 1..]);
                    reset = true;
                    break;
                }
                Err(e) => {
                    // The controller vanished, was released, or its fatal
                    // status could not be cleared by a reset: it is marked
                    // failed, and the admin path refuses further Aborts (and
                    // a reset could not reach a device that is gone). The
                    // commands keep their buffers; the error is the
                    // caller's, as the CSTS check above gives it.
                    self.time_out(&to_abort[i + 1..]);
                    return if self.ctrl.is_removed() {
                        Ok(())
                    } else {
                        Err(e)
                    };
                }
            }
        }
        if reset && !self.generation_changed() {
            // The Aborts above waited for their answers (each up to the
            // admin timeout): what the controller posted meanwhile is
            // parked as it completed, not ended by the reset. (A reap that
            // meets a device fault stops there; the reset still runs: it
            // is what ends a fault too.)
            self.park_posted();
            // Counted when this pair's request reset the controller (or
            // failed trying), not when another thread's reset since made it
            // unneeded.
            let reset = self.ctrl.reset_after_timeout(self.generation);
            self.stats.timeout_resets += u64::from(!matches!(reset, Ok(false)));
            reset.map_err(|e| self.reset_failed(e))?;
            // The commands the reset ended are parked with their buffers
            // whatever the re-creation does; a re-creation that fails now is
            // retried (and reported) by the next reap, so a blocking caller
            // finds its own completion first instead of this error.
            let _ = self.sync_generation();
        }
        Ok(())
    }

    /// `e`, the error of a reset this pair asked for, after parking what
    /// that reset ended: one that failed after it disabled the controller
    /// (a new generation: a later step such as CSTS.RDY = 1 or Identify
    /// failed) ended every command in flight, and nothing can reach their
    /// memory any more — they are delivered with their buffers (a blocking
    /// call finds its own among them) instead of staying in flight until a
    /// later call notices the generation.
    #[cold]
    fn reset_failed(&mut self, e: Error) -> Error {
        if self.generation_changed() {
            let _ = self.sync_generation();
        }
        e
    }

    /// Marks the commands in `slots` as timed out (`Tracker::aborted`):
    /// however they end from here — Command Abort Requested, or the reset
    /// or close that ends them — they end as [`IoError::TimedOut`], and a
    /// later scan resets the controller once they are two timeouts old.
    fn time_out(&mut self, slots: &[u16]) {
        for &slot in slots {
            if let Some(tr) = self.trackers.get_mut(slot) {
                tr.aborted = true;
            }
        }
    }

    /// [`IoQueuePair::check_timeouts`] inside a wait that has `left` of its
    /// timeout to go (a blocking helper, `close`'s drain): the scan may wait
    /// for an Abort (up to the admin timeout) and then reset, so it runs
    /// only while more than the admin timeout is left, and each Abort waits
    /// for the admin lock only until the admin timeout before the end.
    /// Otherwise nothing is done: the wait ends at its own timeout.
    pub(super) fn check_timeouts_within(&mut self, left: Duration) -> Result<()> {
        let Some(room) = left.checked_sub(self.ctrl.admin_timeout) else {
            return Ok(());
        };
        if room.is_zero() {
            return Ok(());
        }
        // None: no deadline an Instant can express (no bound, then).
        self.check_timeouts(Instant::now().checked_add(room))
    }

    /// The scan of [`IoQueuePair::check_timeouts`]: stamps the commands in
    /// flight that have no stamp yet, and returns those overdue for an
    /// Abort and whether an aborted one is overdue for a reset. Allocates
    /// only when a command is overdue (off the I/O path).
    fn overdue(&mut self, now: u64) -> (Vec<u16>, bool) {
        let t = self.timeout_ticks;
        let mut to_abort = Vec::new();
        let mut reset = false;
        // By index, not through a collected list: this scan runs every 1024
        // polls with commands in flight.
        for slot in 0..self.trackers.slots() {
            if !self.trackers.is_in_flight(slot) {
                continue;
            }
            let Some(tr) = self.trackers.get_mut(slot) else {
                continue;
            };
            match verdict(tr.stamp, now, t, tr.aborted) {
                Verdict::Restamp => tr.stamp = now,
                Verdict::Wait => {}
                Verdict::Abort => to_abort.push(slot),
                Verdict::Reset => reset = true,
            }
        }
        (to_abort, reset)
    }

    /// Before re-creating after a creation that may have left this pair's
    /// queues on the controller (no answer, or a CQ whose undo was
    /// refused): Delete I/O SQ, then Delete I/O CQ, each fine when the
    /// queue does not exist (Invalid Queue Identifier). Otherwise every
    /// later Create I/O CQ would be refused because the CQ exists, and the
    /// pair would send one per call for ever.
    #[cold]
    fn delete_leftover_queues(&mut self) -> Result<()> {
        let gone = |r: Result<upnvme_queues::Cqe>| match r {
            Ok(_) => Ok(()),
            Err(Error::Command { status, .. })
                if status.sct() == 1
                    && status.sc() == upnvme_queues::status::sc::command_specific::INVALID_QID =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        };
        gone(self.ctrl.admin_command(
            Sqe::delete_io_sq(self.qid),
            "Delete I/O Submission Queue (left by a failed re-creation)",
        ))?;
        gone(self.ctrl.admin_command(
            Sqe::delete_io_cq(self.qid),
            "Delete I/O Completion Queue (left by a failed re-creation)",
        ))?;
        self.recreated_maybe = false;
        Ok(())
    }

    /// Ends the in-flight command in `slot` once the controller was disabled
    /// (nothing can reach its buffer any more): frees its CID and builds its
    /// only completion — ControllerFailed after close, TimedOut if we had
    /// aborted it, ControllerReset otherwise.
    pub(super) fn end_in_flight(&mut self, slot: u16, closed: bool) -> Option<(Key, Completion)> {
        let aborted = self.trackers.get(slot).is_some_and(|t| t.aborted);
        let error = if closed && self.ctrl.is_removed() {
            IoError::ControllerRemoved
        } else if closed {
            IoError::ControllerFailed
        } else if aborted {
            IoError::TimedOut
        } else {
            IoError::ControllerReset
        };
        self.end_slot(slot, error)
    }

    /// Ends the command in `slot` (which the device can no longer reach)
    /// with `error`: frees its CID; returns its completion, or for a split's
    /// child the split's when it was the last.
    pub(super) fn end_slot(&mut self, slot: u16, error: IoError) -> Option<(Key, Completion)> {
        let (tag, child, (buffer, segments, metadata)) = match self.trackers.get_mut(slot) {
            Some(t) => {
                t.aborted = false;
                t.stamp = 0;
                (t.tag, t.child, t.take_memory())
            }
            None => (0, false, (None, None, None)),
        };
        let _ = self.trackers.cancel(slot);
        if child {
            return self.end_child(tag, Err(error));
        }
        Some((
            Key::from(slot),
            Completion {
                tag,
                result: Err(error),
                buffer,
                segments,
                metadata,
            },
        ))
    }

    /// Ends every command of the split `key` still in flight, as
    /// [`IoQueuePair::end_in_flight`] ends one; returns the split's
    /// completion.
    pub(super) fn end_split_in_flight(&mut self, key: Key, closed: bool) -> Option<Completion> {
        let index = u64::from(key & !super::split::SPLIT_KEY);
        let slots: Vec<u16> = self.trackers.in_flight_slots().collect();
        for slot in slots {
            if self
                .trackers
                .get(slot)
                .is_some_and(|t| t.child && t.tag == index)
                && let Some((k, c)) = self.end_in_flight(slot, closed)
            {
                debug_assert_eq!(k, key);
                return Some(c);
            }
        }
        None
    }

    /// After a controller reset: completes every command in flight exactly once
    /// (TimedOut if it had been aborted, ControllerReset otherwise) — the
    /// controller is disabled, so no buffer is still reachable by the device —
    /// then re-creates the queues.
    pub(super) fn sync_generation(&mut self) -> Result<()> {
        let g = self.ctrl.generation();
        if g != self.generation {
            let closed = self.ctrl.is_closed();
            let slots: Vec<u16> = self.trackers.in_flight_slots().collect();
            for slot in slots {
                if let Some(kc) = self.end_in_flight(slot, closed) {
                    self.ready.push_back(kc);
                }
            }
            // `pending` holds commands queued but not yet counted: those
            // behind the committed tail were announced (by a `submit`,
            // which counts only its own command) and count as submitted;
            // the rest were never announced.
            let entries = self.sq_ring.entries();
            let unannounced = (u32::from(self.sq_ring.tail()) + entries
                - u32::from(self.sq_ring.committed_tail()))
                % entries;
            self.stats.submissions += u64::from(self.pending.saturating_sub(unannounced));
            self.pending = 0;
            self.sq_ring = SqRing::new(self.sq_ring.entries())
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            self.cq_ring = CqRing::new(self.cq_ring.entries())
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            // Stale entries would look new to the restarted phase.
            self.cq.zero();
            self.doorbells.last_sq = 0;
            self.doorbells.last_cq = 0;
            self.generation = g;
            self.failed = false;
            self.needs_recreate = true;
            // The reset disabled the controller: a creation it never
            // answered is forgotten with everything else.
            self.recreated_maybe = false;
            self.recreate_retry = RecreateRetry::default();
            self.refresh_expect_state();
        }
        // Never while closing: the close is deleting these queues, and a
        // reset that came in between deleted them already.
        if self.needs_recreate && !self.closing {
            self.ctrl.check_usable()?;
            if self.recreate_retry.wait() > Duration::ZERO {
                return Err(self.recreate_error());
            }
            let before = self.generation;
            match self.recreate() {
                Ok(()) => self.recreate_retry = RecreateRetry::default(),
                Err(e) => {
                    if self.generation == before {
                        self.recreate_retry.failed(&e);
                    } else {
                        // A reset came during the try (and may be why it
                        // failed): the next try is its first.
                        self.recreate_retry = RecreateRetry::default();
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// [`Error::QueuesNotRecreated`] for this pair: why the last re-creation
    /// failed and when the next try is made.
    #[cold]
    fn recreate_error(&self) -> Error {
        Error::QueuesNotRecreated {
            device: self.ctrl.name().to_string(),
            qid: self.qid,
            failures: self.recreate_retry.failures,
            cause: self.recreate_retry.cause.clone(),
            retry_in: self.recreate_retry.wait(),
        }
    }

    /// Creates this pair's queues again after a reset (the rings are fresh,
    /// nothing is in flight): first deletes what a failed earlier try may
    /// have left, then Create I/O CQ and Create I/O SQ on the same memory.
    #[cold]
    fn recreate(&mut self) -> Result<()> {
        if self.recreated_maybe {
            self.delete_leftover_queues()?;
        }
        if let (Some(slots), Some(s)) = (self.doorbells.slots, self.ctrl.shadow()) {
            for b in [&s.doorbells, &s.event_idx] {
                b.store_release_u32(slots.sq, 0)?;
                b.store_release_u32(slots.cq, 0)?;
            }
        }
        // Nothing is in flight and the rings are fresh, so if another
        // reset came since `sync_generation` took the generation, the
        // queues created now simply belong to that newer one.
        let created = self.ctrl.create_io_queues(
            Sqe::create_io_cq(
                self.qid,
                self.cq_ring.entries(),
                self.cq.buffer().iova(),
                false,
                0,
            ),
            Sqe::create_io_sq(
                self.qid,
                self.sq_ring.entries(),
                self.sq.buffer().iova(),
                self.qid,
                0,
            ),
            self.qid,
            " (after reset)",
        );
        self.generation = match created {
            Ok(c) => {
                // The reset may have turned shadow doorbells off (its
                // Doorbell Buffer Config refused) or on again.
                self.doorbells.shadow = self.doorbells.slots.filter(|_| c.shadow_on);
                self.announce_free_below = if c.shadow_on { self.announce_shadow } else { 0 };
                c.generation
            }
            Err(CreateFailure {
                error,
                cq_left,
                during,
            }) => {
                // The generation the creation ran in, not the one read
                // before it: a reset in between would otherwise leave a
                // CQ of the newer generation looking like one of the
                // older, which `delete_queues` would take as gone (and
                // free its ID and memory).
                if let Some(g) = during {
                    self.generation = g;
                }
                // No answer, or a CQ that could not be deleted again: the
                // queues may exist on this memory (`delete_queues` then
                // deletes or quarantines it, and holds the ID).
                if cq_left.is_some() || !matches!(error, Error::Command { .. }) {
                    self.recreated_maybe = true;
                }
                return Err(error);
            }
        };
        self.recreated_maybe = false;
        self.needs_recreate = false;
        self.refresh_expect_state();
        Ok(())
    }
}

/// What the timeout scan does with one command in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Not stamped yet (0), or the clock reads behind the stamp: the wait
    /// restarts from now.
    Restamp,
    /// Not overdue.
    Wait,
    /// Overdue, not aborted yet: send an Abort.
    Abort,
    /// Aborted, and overdue twice over: reset the controller.
    Reset,
}

/// The scan's decision for a command stamped at `stamp` (clock ticks; 0:
/// not stamped yet), read at `now`, with a timeout of `t` ticks. A clock
/// behind the stamp (a TSC reset by a suspend, a core behind the one that
/// stamped) restarts the wait from now: a saturating age of 0 would keep
/// the command from timing out until the counter caught up with its stamp.
fn verdict(stamp: u64, now: u64, t: u64, aborted: bool) -> Verdict {
    if stamp == 0 || now < stamp {
        return Verdict::Restamp;
    }
    let age = now - stamp;
    if !aborted && age > t {
        Verdict::Abort
    } else if aborted && age > t.saturating_mul(2) {
        Verdict::Reset
    } else {
        Verdict::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::{Verdict, verdict};

    #[test]
    fn a_clock_behind_the_stamp_restarts_the_wait() {
        // After a suspend reset the TSC: far behind the stamp.
        assert_eq!(verdict(1_000_000, 5, 100, false), Verdict::Restamp);
        assert_eq!(verdict(1_000_000, 5, 100, true), Verdict::Restamp);
        // Restamped at 5, the command times out 100 ticks later, not once
        // the counter passes the old stamp.
        assert_eq!(verdict(5, 105, 100, false), Verdict::Wait);
        assert_eq!(verdict(5, 106, 100, false), Verdict::Abort);
        // Not stamped yet.
        assert_eq!(verdict(0, 7, 100, false), Verdict::Restamp);
    }

    #[test]
    fn an_aborted_command_resets_at_twice_the_timeout() {
        assert_eq!(verdict(10, 110, 100, false), Verdict::Wait);
        assert_eq!(verdict(10, 111, 100, false), Verdict::Abort);
        assert_eq!(verdict(10, 111, 100, true), Verdict::Wait);
        assert_eq!(verdict(10, 210, 100, true), Verdict::Wait);
        assert_eq!(verdict(10, 211, 100, true), Verdict::Reset);
        // A timeout so long that twice it overflows never resets.
        assert_eq!(verdict(1, u64::MAX, u64::MAX / 2 + 1, true), Verdict::Wait);
    }
}

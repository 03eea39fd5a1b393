//! Reaping: each CQE is checked (phase with an acquire load first, then SQ
//! ID, SQ head and CID) and handed to the owner exactly once, with its tag
//! and buffer; the CQ head doorbell is written when it is due.

use upnvme_dma::SqMemory;
use upnvme_queues::status::sc::generic as sc;
use upnvme_queues::{SqRing, Status};

use super::split::Key;
use super::{CSTS_INTERVAL, Completion, IoQueuePair, NEVER, PERIODIC_POLLS, clock};
use crate::device::Device;
use crate::error::{IoError, PiCheck, Result};

/// A checked completion before it is handed out (see `reap_next`).
pub(super) struct Reaped {
    slot: u16,
    tag: u64,
    /// CQE dword 0 (the result of a success).
    dw0: u32,
    status: Status,
    buffer: Option<upnvme_dma::DmaBuffer>,
    /// The tracker may hold a vector or metadata buffer too.
    extras: bool,
}

impl<D: Device> IoQueuePair<D> {
    /// Reaps up to `max` completions and hands each to `f` exactly once (tag,
    /// result, buffer), together with the pair itself, so that `f` may
    /// submit (or queue, or reap) on it: `|qp, c| { let _ = qp.submit(...); }`.
    /// Pending queued commands are announced first (a due SQ tail before a due
    /// CQ head). Returns how many were delivered.
    ///
    /// Does not wait for completions: one look at the CQ (entries that arrive
    /// while `f` runs are taken too, up to `max`). Two cold paths do send
    /// admin commands and wait for them, each wait bounded (by the admin
    /// timeout, a reset's by CAP.TO or `ready_timeout`): the timeout scan
    /// every 1024 polls with commands in flight (one Abort per overdue
    /// command, each waited for in turn; a reset when an aborted one is
    /// still not back), and re-creating the queues after a controller reset. A
    /// protocol violation by the device (unknown or stale CID, duplicate
    /// completion, SQ head out of range, wrong SQ ID, a completion for a
    /// command not yet announced) is [`crate::Error::DeviceFault`]; the pair and the
    /// controller are then failed, and commands still in flight keep their
    /// buffers until the controller is disabled.
    ///
    /// A closed loop that resubmits from the completion, the next command
    /// first and the bookkeeping after it:
    ///
    /// ```no_run
    /// # fn closed_loop(qp: &mut upnvme::IoQueuePair, ns: &upnvme::Namespace) -> upnvme::Result<()> {
    /// let mut done = 0u64;
    /// while done < 1_000_000 {
    ///     qp.process_completions(u32::MAX, |qp, c| {
    ///         if let Some(buf) = c.buffer {
    ///             let lba = (c.tag * 7919) % ns.lba_count();
    ///             if let Err(r) = qp.read(ns, lba, 1, buf, c.tag + 1) {
    ///                 eprintln!("{}", qp.describe(r.reason));
    ///             }
    ///         }
    ///         done += 1; // after the resubmission
    ///     })?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn process_completions<F>(&mut self, max: u32, mut f: F) -> Result<u32>
    where
        F: FnMut(&mut Self, Completion),
    {
        if !self.current() || !self.ready.is_empty() || self.pending != 0 {
            return self.process_completions_slow(max, &mut f);
        }
        self.poll_cq(max, &mut f)
    }

    /// The next completion, if one is ready: a lending-iterator form of
    /// [`IoQueuePair::process_completions`] (`while let Some(c) =
    /// qp.next_completion()? { qp.submit(..)?; }`).
    ///
    /// A completion reaped in the same call as an error (the periodic
    /// timeout scan runs after the reap and may fail: a reset that fails, a
    /// controller gone) is returned, not dropped; the error (the controller
    /// is then failed) comes with the next call.
    #[inline]
    pub fn next_completion(&mut self) -> Result<Option<Completion>> {
        let mut out = None;
        let r = self.process_completions(1, |_, c| out = Some(c));
        match (r, out) {
            (_, Some(c)) => Ok(Some(c)),
            (Err(e), None) => Err(e),
            (Ok(_), None) => Ok(None),
        }
    }

    /// `process_completions` when something needs attention first: a reset
    /// to catch up with, queued commands to announce, parked completions to
    /// deliver, or a failed or closed controller to report.
    #[inline(never)]
    fn process_completions_slow<F>(&mut self, max: u32, f: &mut F) -> Result<u32>
    where
        F: FnMut(&mut Self, Completion),
    {
        let mut recreate_error = None;
        if self.needs_recreate || (!self.current() && self.generation_changed()) {
            // Deliver what the reset ended even if re-creating fails now.
            recreate_error = self.sync_generation().err();
        }
        if self.pending != 0 || self.sq_ring.tail() != self.sq_ring.committed_tail() {
            self.ring();
        }
        let mut n = 0;
        while n < max {
            match self.ready.pop_front() {
                Some((_, c)) => {
                    f(self, c);
                    n += 1;
                }
                None => break,
            }
        }
        if self.failed {
            if n > 0 {
                return Ok(n);
            }
            return Err(self.ctrl.unusable_error());
        }
        if n == 0 && !self.ctrl.is_usable() {
            // Closed or failed elsewhere (admin path, another pair): say so
            // instead of reporting an empty queue forever.
            return Err(self.ctrl.unusable_error());
        }
        if n == 0
            && self.needs_recreate
            && let Some(e) = recreate_error
        {
            // The queues are not there again: say why, instead of an empty
            // queue (the next call tries again).
            return Err(e);
        }
        if n < max && self.current() {
            n += self.poll_cq(max - n, f)?;
        } else if self.current() {
            self.count_parked_poll()?;
        }
        Ok(n)
    }

    /// Parked completions alone filled `max` (a loop of `next_completion`
    /// with `reap_on_submit` parks the next one at every resubmission): the
    /// call still counts as a poll, or the periodic work — the command
    /// timeout scan, the CSTS check — would never run while they keep
    /// coming, and a command the controller lost would never time out.
    /// Not generic over the callback: one copy, out of the reap's way.
    #[cold]
    #[inline(never)]
    fn count_parked_poll(&mut self) -> Result<()> {
        self.poll_countdown -= 1;
        if self.poll_countdown == 0 {
            self.periodic()?;
        }
        Ok(())
    }

    /// Looks at the CQ and delivers up to `max` new entries to `f`.
    #[inline(always)]
    fn poll_cq<F>(&mut self, max: u32, f: &mut F) -> Result<u32>
    where
        F: FnMut(&mut Self, Completion),
    {
        let mut n = 0u32;
        while n < max {
            match self.reap_next()? {
                Some(r) => {
                    n += 1;
                    if r.extras {
                        // A split's child that is not its last delivers
                        // nothing (`child_consumed` applied the CQ head
                        // rule to its entry).
                        if !self.deliver_extras(r.slot, r.tag, r.dw0, r.status, r.buffer, f) {
                            n -= 1;
                        }
                    } else if r.status.is_success() {
                        // Spelled out so that `f` sees the two `None`s and
                        // drops nothing for them, and a literal `Ok` (a
                        // success in an arm of its own: no `Result` to
                        // build and test).
                        let c = Completion {
                            tag: r.tag,
                            result: Ok(r.dw0),
                            buffer: r.buffer,
                            segments: None,
                            metadata: None,
                        };
                        f(self, c);
                    } else {
                        let c = Completion {
                            tag: r.tag,
                            result: Err(self.io_error_of(r.slot, r.status)),
                            buffer: r.buffer,
                            segments: None,
                            metadata: None,
                        };
                        f(self, c);
                    }
                    // The callback may have failed the pair (a nested reap
                    // that met a device fault): stop looking at its CQ. (Not
                    // stopping when nothing is left in flight: a spurious or
                    // duplicate entry right behind is caught in this call.)
                    if self.expect_state == NEVER {
                        break;
                    }
                }
                None => break,
            }
        }
        // `stats.polls` is the countdown's (see `polls_since_periodic`).
        if n == 0 {
            self.stats.idle_polls += 1;
        } else {
            if self.cq_head_due_after_reap() {
                self.commit_cq_head();
            } else {
                self.stats.cq_doorbell_skipped += 1;
            }
        }
        self.poll_countdown -= 1;
        if self.poll_countdown == 0 {
            self.periodic()?;
        }
        Ok(n)
    }

    /// Consumes the CQE at the head if it is new: checks it and returns its
    /// slot and completion. The CQ head is not written here: at the end of
    /// the reap batch when it is due, and before any submission that could
    /// otherwise leave the controller short of CQ space
    /// ([`IoQueuePair::cq_space_for_submit`]).
    ///
    /// A split's child that is not its last is consumed and counted, and the
    /// next entry looked at: what comes back is always a completion to hand
    /// out, with its key (split.rs).
    #[inline(always)]
    pub(super) fn reap_one(&mut self) -> Result<Option<(Key, Completion)>> {
        loop {
            match self.reap_next()? {
                Some(r) if r.extras => {
                    if let Some(kc) =
                        self.completion_extras(r.slot, r.tag, r.dw0, r.status, r.buffer)
                    {
                        return Ok(Some(kc));
                    }
                }
                Some(r) => return Ok(Some((Key::from(r.slot), self.completion(r)))),
                None => return Ok(None),
            }
        }
    }

    /// [`IoQueuePair::reap_one`] before the completion is put together: a
    /// command without a vector or metadata buffer (`extras` false) needs
    /// nothing more from its tracker.
    #[inline(always)]
    fn reap_next(&mut self) -> Result<Option<Reaped>> {
        let head = u32::from(self.cq_ring.head());
        // Acquire: the rest of the entry is read only after its phase is seen.
        let Some((dw3, entry)) = self.cq.load_dw3(head) else {
            return Ok(None);
        };
        if !self.cq_ring.is_new_dw3(dw3) {
            return Ok(None);
        }
        let (dw2, dw0) = (entry.dw2(), entry.dw0());
        self.cq_ring.advance();
        // SQ ID and SQ head: one compare when the SQ ID is ours and the
        // controller fetched everything announced (`dw2 ^ qid_dw2` is then
        // the SQ head alone, and equal to the committed tail, which is below
        // 10000h); else both checked on their own.
        if !self.sq_ring.head_to_committed_if(dw2 ^ self.qid_dw2)
            && ((dw2 >> 16) as u16 != self.qid || self.sq_ring.update_head(dw2 as u16).is_err())
        {
            return Err(self.bad_completion(dw2, dw3));
        }
        // The CID, and its command announced: one queued but not yet
        // announced (at depth, the callback's resubmissions waiting for the
        // doorbell at the end of the reap) cannot have been fetched, so a
        // completion naming it is bogus, and its buffer must not go back
        // (the device would run the command once a doorbell announces it).
        // One compare while everything is announced.
        let (sq_ring, sq) = (&self.sq_ring, &self.sq);
        let cid = dw3 as u16;
        let (slot, tag, buffer, extras) = match self
            .trackers
            .complete_mut_if(cid, |t| !queued_unannounced(sq_ring, sq, t.sq_pos, cid))
        {
            Some((slot, t)) => (slot, t.tag, t.buffer.take(), t.extras),
            None => return Err(self.bad_completion(dw2, dw3)),
        };
        self.stats.completions += 1;
        Ok(Some(Reaped {
            slot,
            tag,
            dw0,
            status: Status::from_dw3(dw3),
            buffer,
            extras,
        }))
    }

    /// The completion of a reaped command: its vector and metadata buffer
    /// taken from the tracker when it had them.
    #[inline(always)]
    fn completion(&mut self, r: Reaped) -> Completion {
        let result = if r.status.is_success() {
            Ok(r.dw0)
        } else {
            Err(self.io_error_of(r.slot, r.status))
        };
        let (segments, metadata) = if r.extras {
            self.take_extras(r.slot)
        } else {
            (None, None)
        };
        Completion {
            tag: r.tag,
            result,
            buffer: r.buffer,
            segments,
            metadata,
        }
    }

    /// The completion of a reaped command whose tracker had `extras`: its
    /// vector and metadata buffer taken back, or, for a split's child, the
    /// split's completion when this was its last child (else nothing).
    /// (The reaped command's fields one by one: a `Reaped` passed by value
    /// to a function that is not inlined lives in memory, and the hot
    /// reap shuffled its bytes through the stack for it: 8 instructions.)
    #[cold]
    #[inline(never)]
    fn completion_extras(
        &mut self,
        slot: u16,
        tag: u64,
        dw0: u32,
        status: Status,
        buffer: Option<upnvme_dma::DmaBuffer>,
    ) -> Option<(Key, Completion)> {
        let r = Reaped {
            slot,
            tag,
            dw0,
            status,
            buffer,
            extras: true,
        };
        let child = self.trackers.get(r.slot).is_some_and(|t| t.child);
        if child {
            let result = if r.status.is_success() {
                Ok(r.dw0)
            } else {
                Err(self.io_error_of(r.slot, r.status))
            };
            if let Some(t) = self.trackers.get_mut(r.slot) {
                t.extras = false;
                t.child = false;
            }
            let done = self.end_child(r.tag, result);
            if done.is_none() {
                self.child_consumed();
            }
            return done;
        }
        let slot = Key::from(r.slot);
        Some((slot, self.completion(r)))
    }

    /// [`IoQueuePair::completion_extras`] handed to `f` here, off the hot
    /// loop (its `Option<(Key, Completion)>` would otherwise be returned
    /// through the reap's stack frame). False when there was nothing to
    /// deliver.
    #[cold]
    #[inline(never)]
    fn deliver_extras<F>(
        &mut self,
        slot: u16,
        tag: u64,
        dw0: u32,
        status: Status,
        buffer: Option<upnvme_dma::DmaBuffer>,
        f: &mut F,
    ) -> bool
    where
        F: FnMut(&mut Self, Completion),
    {
        match self.completion_extras(slot, tag, dw0, status, buffer) {
            Some((_, c)) => {
                f(self, c);
                true
            }
            None => false,
        }
    }

    /// A split's child that was not its last was reaped: no completion is
    /// delivered for its entry, so a reap that finds only such entries
    /// would not apply the end-of-reap CQ head rule; apply it here.
    #[cold]
    fn child_consumed(&mut self) {
        if self.cq_head_due_after_reap() {
            self.commit_cq_head();
        }
    }

    /// How the command reaped from `slot` with a non-success `status`
    /// ended. Right after its reap: the slot was released but not handed
    /// out again, so its tracker still says whether an Abort was sent.
    #[cold]
    #[inline(never)]
    fn io_error_of(&self, slot: u16, status: Status) -> IoError {
        let aborted = self.trackers.get(slot).is_some_and(|t| t.aborted);
        self.io_error(status, aborted)
    }

    /// The vector and metadata buffer of the command that was in `slot`
    /// (only commands that had one set [`super::Tracker::extras`]).
    #[cold]
    #[inline(never)]
    fn take_extras(&mut self, slot: u16) -> (Option<crate::IoVec>, Option<upnvme_dma::DmaBuffer>) {
        match self.trackers.get_mut(slot) {
            Some(t) => {
                t.extras = false;
                (t.segments.take(), t.metadata.take())
            }
            None => (None, None),
        }
    }

    /// How a command that completed with a non-success status ended.
    #[cold]
    #[inline(never)]
    fn io_error(&self, status: Status, aborted: bool) -> IoError {
        if aborted && status.sct() == 0 && status.sc() == sc::ABORT_REQUESTED {
            // Command Abort Requested, after our timeout's Abort.
            IoError::TimedOut
        } else if status.sct() == 0 && status.sc() == sc::ABORTED_SQ_DELETION {
            // The driver deletes a live pair's SQ only in `IoQueuePair::close`,
            // a reset or a controller close (`Inner::delete_io_queues`): the
            // pair's own close ends it as `QueueDeleted`, the others with the
            // ending of the commands a reset finds still in flight. (A Delete
            // sent through `admin_passthrough` for a pair's queue ID breaks
            // that pair; its doc says so.)
            if self.closing {
                IoError::QueueDeleted
            } else if self.ctrl.is_closed() {
                IoError::ControllerFailed
            } else if aborted {
                IoError::TimedOut
            } else if self.ctrl.state() & crate::controller::STATE_RESETTING != 0
                || self.generation_changed()
            {
                IoError::ControllerReset
            } else {
                // No deletion of the driver's: the controller's own doing
                // (or a misbehaving one), reported as it said, not as a
                // reset that did not happen.
                IoError::Status(status)
            }
        } else if let Some(check) = PiCheck::from_status(status) {
            IoError::Protection { check, status }
        } else {
            IoError::Status(status)
        }
    }

    /// Before a command is announced: if more CQ entries were consumed
    /// unannounced than the slack allows, write the CQ head first. With U
    /// entries unannounced and O commands in flight the controller must never
    /// find the CQ full: U + O ≤ cq_entries − 1. O never exceeds `max_depth`
    /// (the tracker free stack), so U ≤ cq_entries − 1 − max_depth is enough
    /// — checked here, where O can grow (also from inside a completion
    /// callback, in the middle of a reap), and at the end of every reap.
    #[inline(always)]
    pub(super) fn cq_space_for_submit(&mut self) {
        if self.cq_ring.uncommitted() > self.cq_threshold {
            self.commit_cq_head();
        }
    }

    /// After a reap that consumed entries: is the CQ head due (every reap
    /// with `CqHeadPolicy::EveryReap`, even when a submission from the
    /// callback already wrote it; else when the slack or batch limit is used
    /// up)? The one rule for `poll_cq`, `reap_on_submit` and the blocking
    /// helpers: one compare against `reap_due_at` (0, or `cq_threshold` + 1).
    #[inline(always)]
    pub(super) fn cq_head_due_after_reap(&self) -> bool {
        self.cq_ring.uncommitted() >= self.reap_due_at
    }

    /// Writes the CQ head doorbell (shadow and/or MMIO, see doorbell.rs).
    #[inline(never)]
    pub(super) fn commit_cq_head(&mut self) {
        // Never a doorbell for a failed or closed controller, or for queues a
        // reset deleted (parked completions may still be delivered then).
        if !self.current() {
            return;
        }
        if let Some(head) = self.cq_ring.commit() {
            let shadow = self.ctrl.shadow().map(|s| (&s.doorbells, &s.event_idx));
            self.doorbells
                .ring_cq(self.ctrl.dev(), shadow, head, &mut self.stats);
        }
    }

    /// Every [`PERIODIC_POLLS`] polls with commands in flight: CSTS once per
    /// [`CSTS_INTERVAL`] (a fatal or vanished controller ends the wait
    /// whether or not a command timeout is set), and the command timeout
    /// scan.
    #[cold]
    #[inline(never)]
    fn periodic(&mut self) -> Result<()> {
        // Wrapping: `reset_stats` may have left it "below zero".
        self.stats.polls = self.stats.polls.wrapping_add(u64::from(PERIODIC_POLLS));
        self.poll_countdown = PERIODIC_POLLS;
        if self.trackers.in_flight() > 0 {
            let now = clock::now();
            if now >= self.csts_due {
                self.csts_due = now.saturating_add(clock::ticks(CSTS_INTERVAL));
                self.check_csts_while_polling()?;
            }
            if self.timeout_ticks > 0 && self.trackers.in_flight() > 0 {
                match self.drain_deadline {
                    None => self.check_timeouts(None)?,
                    Some(d) => self.check_timeouts_within(
                        d.saturating_duration_since(std::time::Instant::now()),
                    )?,
                }
            }
        }
        Ok(())
    }
}

/// Whether the command with CID `cid`, whose tracker says it went into SQ
/// slot `pos`, is still queued but not yet announced: SQEs wait for their
/// doorbell, `pos` is one of them, and that slot's SQE carries `cid` (a
/// command fetched long ago may still be in flight while its SQ slot was
/// reused by a newer, unannounced one: the slot alone does not say which
/// command it holds; the CID does, CIDs in flight being unique). One
/// compare while every SQE is announced; constant time otherwise.
#[inline(always)]
pub(super) fn queued_unannounced(sq_ring: &SqRing, sq: &SqMemory, pos: u16, cid: u16) -> bool {
    sq_ring.has_unannounced()
        && sq_ring.is_unannounced(pos)
        && sq
            .read_cdw0(u32::from(pos))
            .is_some_and(|cdw0| (cdw0 >> 16) as u16 == cid)
}

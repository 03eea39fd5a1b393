//! The admin queue: submit a command, wait for its completion with a bound,
//! keep Asynchronous Event Requests outstanding, and validate everything the
//! controller writes back (NVMe 2.0 §3.3 "Queue Mechanism", §5 "Admin Command
//! Set").
//!
//! The admin queue is not on the I/O path: it lives behind the controller's
//! mutex, rings the SQ tail doorbell once per command and writes the CQ head
//! doorbell once per reap. It never uses shadow doorbells (they apply to I/O
//! queues only, as in Linux and QEMU).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use upnvme_dma::{DmaBuffer, DmaPages};
use upnvme_queues::regs::{REG_CSTS, cq_head_doorbell, sq_tail_doorbell};
use upnvme_queues::{AsyncEvent, CidTable, CqRing, Cqe, Csts, SqRing, Sqe};

use crate::device::Device;
use crate::error::{Error, Result};

/// Bytes per submission / completion queue entry (CC.IOSQES = 6, CC.IOCQES = 4).
const SQE_BYTES: usize = 64;
const CQE_BYTES: usize = 16;

/// Empty polls between two clock reads while waiting: keeps clock_gettime
/// (about 1 us under emulation) out of the tight loop.
const POLLS_PER_CLOCK: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotKind {
    Free,
    /// A synchronous command; the completion is parked here for its waiter.
    Sync,
    /// An Asynchronous Event Request.
    Aer,
    /// A command whose waiter does not hold the admin lock while it waits
    /// (`start_detached`): the completion goes to `AdminQueue::detached`,
    /// keyed by its CID, since the slot is free for another command once
    /// reaped.
    Detached,
}

/// A command started with [`AdminQueue::start_detached`]: its CID and the
/// reset epoch it was sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    cid: u16,
    epoch: u64,
}

/// What a reset carries over from the admin queue it replaces for detached
/// commands ([`AdminQueue::take_detached`]).
#[derive(Debug)]
pub(crate) struct DetachedState {
    epoch: u64,
    done: Vec<DetachedDone>,
    waiting: Vec<Ticket>,
}

/// A detached command's completion, reaped and not yet taken by its waiter.
#[derive(Debug)]
struct DetachedDone {
    /// The reset epoch it was reaped in.
    epoch: u64,
    cqe: Cqe,
    /// Its data buffer, which the device is done with.
    data: Option<DmaBuffer>,
}

/// What became of a detached command ([`AdminQueue::detached_outcome`]).
#[derive(Debug)]
pub(crate) enum Detached {
    /// It completed; its data buffer (the device is done with it) comes
    /// back with it.
    Done(Cqe, Option<DmaBuffer>),
    /// Still in flight.
    Pending,
    /// A controller reset ended it without a completion (it may or may not
    /// have taken effect).
    Ended,
}

/// Whether a detached command may take a command identifier now
/// ([`AdminQueue::detached_room`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// Yes: what the driver keeps for itself stays free after it.
    Yes,
    /// Not while so many other detached commands are outstanding.
    NotNow,
    /// Never on a queue this small: the command waits under the lock.
    Never,
}

/// What is waiting on a CID slot.
#[derive(Debug)]
struct Slot {
    kind: SlotKind,
    opcode: u8,
    done: Option<Cqe>,
    /// A detached command's data buffer and PRP List page: the slot owns
    /// them while the device may use them — until the completion is reaped,
    /// or the controller is disabled ([`AdminQueue::forget_in_flight`]).
    data: Option<DmaBuffer>,
    list: Option<DmaBuffer>,
}

/// The admin submission/completion queue pair (qid 0).
#[derive(Debug)]
pub(crate) struct AdminQueue {
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_ring: SqRing,
    cq_ring: CqRing,
    cids: CidTable,
    slots: Vec<Slot>,
    sq_db: usize,
    cq_db: usize,
    events: VecDeque<AsyncEvent>,
    /// AERs the controller completed that must be re-posted.
    aer_to_post: u32,
    /// AERs in a row that ended with a retryable error (see
    /// [`MAX_AER_RETRIES`]); a success ends the run.
    aer_error_streak: u32,
    /// An AER ended and was not re-posted (an error with DNR, the limit
    /// exceeded, too many errors in a row): fewer are outstanding than
    /// wanted, and a notice may be missed.
    aer_lost: bool,
    /// The Log Page Identifier of a Notice the controller reported (other
    /// than Namespace Attribute Changed, which the driver follows itself)
    /// whose log page no Get Log Page with Retain Asynchronous Event clear
    /// has read since: the controller masks every Notice until that read
    /// (NVMe 2.0 §5.2, Asynchronous Event Request command), the namespace
    /// notice included. Set when the event is reaped, cleared when such a
    /// read completes or the controller is reset.
    notice_masked: Option<(u8, u64)>,
    /// Notices (other than Namespace Attribute Changed) reaped so far: the
    /// second half of `notice_masked`, so that a read clears only a Notice
    /// reaped before it was sent — one the controller posts when that read
    /// unmasks the type (a Notice it kept meanwhile) masks it again.
    notices_reaped: u64,
    /// `notice_masked` was cleared by a read: a controller may have dropped
    /// a namespace notice while the type was masked, so the next poll
    /// checks every handle once.
    notice_mask_ended: bool,
    /// Buffers of commands that timed out: kept until the controller is
    /// disabled, because a late DMA into freed memory is silent corruption.
    quarantine: Vec<DmaPages>,
    /// Completions of detached commands, tagged with the epoch they were
    /// reaped in, until their waiters take them.
    detached: Vec<DetachedDone>,
    /// Detached commands whose waiters still wait (`start_detached` to
    /// `detached_outcome`'s answer or `abandon`): their completions are
    /// kept across resets, any other is dropped at the next reset.
    waiting: Vec<Ticket>,
    /// Controller resets seen (`forget_in_flight`): a detached command of
    /// an earlier epoch without a completion was ended by one.
    epoch: u64,
    /// Asynchronous Event Requests the driver keeps posted (the last
    /// [`AdminQueue::post_aers`] target, capped as it caps it): their
    /// command identifiers are never given to detached commands.
    aer_target: u32,
    /// Asynchronous Event Requests this queue's controller ended for good
    /// (Asynchronous Event Request Limit Exceeded, DNR, or retryable errors
    /// without end): it takes that many fewer than the target, so
    /// [`AdminQueue::post_aers`] posts that many fewer (a reset, which
    /// builds a new queue, tries the whole target again).
    aers_refused: u32,
    /// The controller's "released on the kernel's request" flag
    /// (`Inner::removed`, shared by [`AdminQueue::share_removal`]): once
    /// set, no doorbell is written — the release may already have disabled
    /// the controller — and no command is sent.
    removed: Arc<AtomicBool>,
}

impl AdminQueue {
    /// Allocates the admin queues' memory.
    pub(crate) fn new<D: Device>(dev: &D, entries: u32, dstrd: u8) -> Result<AdminQueue> {
        let sq_ring = SqRing::new(entries).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let cq_ring = CqRing::new(entries).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // The controller writes the CQ and only reads the SQ (mapped
        // without its write permission where the IOMMU allows). The CQ
        // first: with one hugepage free, it takes it, and the SQ falls back
        // to the CQ's region (see `Device::alloc_dma_device_read_only`), so
        // bring-up needs no more hugepages than before.
        let cq = dev.alloc_dma(entries as usize * CQE_BYTES)?;
        let sq = dev.alloc_dma_device_read_only(entries as usize * SQE_BYTES)?;
        // One slot is always empty in a ring, so entries-1 commands fit.
        let slots_n = (entries - 1) as u16;
        Ok(AdminQueue {
            sq,
            cq,
            sq_ring,
            cq_ring,
            cids: CidTable::new(slots_n),
            slots: (0..slots_n)
                .map(|_| Slot {
                    kind: SlotKind::Free,
                    opcode: 0,
                    done: None,
                    data: None,
                    list: None,
                })
                .collect(),
            sq_db: sq_tail_doorbell(0, dstrd),
            cq_db: cq_head_doorbell(0, dstrd),
            events: VecDeque::new(),
            aer_to_post: 0,
            aer_error_streak: 0,
            aer_lost: false,
            notice_masked: None,
            notices_reaped: 0,
            notice_mask_ended: false,
            quarantine: Vec::new(),
            detached: Vec::new(),
            waiting: Vec::new(),
            epoch: 0,
            aer_target: 0,
            aers_refused: 0,
            removed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Follows the controller's release flag: from the moment a release on
    /// the kernel's request begins, this queue sends nothing and writes no
    /// doorbell (a command already in flight may still be reaped).
    pub(crate) fn share_removal(&mut self, removed: Arc<AtomicBool>) {
        self.removed = removed;
    }

    /// Whether a release on the kernel's request has begun.
    fn released(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Whether a release on the kernel's request has begun and `csts` (read
    /// since) says the controller stopped: disabled (RDY = 0) — the
    /// release's CC.EN = 0, on a device whose registers stay live because
    /// it could not be given back (a released one reads all ones, which
    /// `check_csts` reports). No completion comes any more, so a waiter
    /// looks at the CQ once more and gives up with `ControllerRemoved`
    /// instead of waiting out its bound.
    pub(crate) fn stopped_by_release(&self, csts: Csts) -> bool {
        self.released() && !csts.rdy()
    }

    /// The queues' pages (and those of timed-out commands), without access:
    /// what is quarantined when the controller may still use them.
    pub(crate) fn into_pages(self) -> Vec<DmaPages> {
        let mut keep = self.quarantine;
        for s in self.slots {
            keep.extend(s.data.into_iter().chain(s.list).map(DmaBuffer::into_pages));
        }
        keep.push(self.sq.into_pages());
        keep.push(self.cq.into_pages());
        keep
    }

    /// Leaks the queues' pages and those of timed-out commands (they stay
    /// mapped and are never handed out again): for a controller that could
    /// not be disabled and whose device cannot say its DMA stopped.
    pub(crate) fn leak_memory(&mut self) {
        std::mem::forget(std::mem::take(&mut self.quarantine));
        for s in &mut self.slots {
            for b in s.data.take().into_iter().chain(s.list.take()) {
                std::mem::forget(b.into_pages());
            }
        }
        std::mem::forget(self.sq.detach_pages());
        std::mem::forget(self.cq.detach_pages());
    }

    /// IOVA of the submission queue (for ASQ).
    pub(crate) fn sq_iova(&self) -> u64 {
        self.sq.iova()
    }

    /// IOVA of the completion queue (for ACQ).
    pub(crate) fn cq_iova(&self) -> u64 {
        self.cq.iova()
    }

    /// Entries of each admin queue.
    pub(crate) fn entries(&self) -> u32 {
        self.sq_ring.entries()
    }

    /// Writes `sqe` (with a fresh CID) into the SQ and rings the tail doorbell.
    /// Returns the CID slot.
    fn submit<D: Device>(&mut self, dev: &D, mut sqe: Sqe, kind: SlotKind) -> Result<u16> {
        if self.released() {
            return Err(Error::ControllerRemoved { device: dev.name() });
        }
        let cid = self.cids.alloc().ok_or_else(|| Error::DeviceFault {
            device: dev.name(),
            what: format!(
                "all {} admin command identifiers are held by commands the controller has not \
                 completed (timed-out commands and Asynchronous Event Requests); reset the \
                 controller (Controller::reset)",
                self.slots.len()
            ),
        })?;
        sqe.set_cid(cid.value);
        let Some(pos) = self.sq_ring.push() else {
            // Unreachable after `make_room` with a free CID; refused, not
            // assumed.
            let _ = self.cids.cancel(cid.slot);
            return Err(Error::DeviceFault {
                device: dev.name(),
                what: "admin queue: no submission queue slot is free although a command \
                       identifier is"
                    .into(),
            });
        };
        self.sq
            .write_bytes(pos as usize * SQE_BYTES, &sqe.to_le_bytes())?;
        let slot = &mut self.slots[cid.slot as usize];
        slot.kind = kind;
        slot.opcode = sqe.opcode();
        slot.done = None;
        if let Some(tail) = self.sq_ring.commit() {
            // The doorbell write orders the SQE stores before it (Device::write32).
            dev.write32(self.sq_db, tail as u32);
        }
        Ok(cid.slot)
    }

    /// Makes sure the SQ has a free slot for one more command when a CID is
    /// free: the SQ is never full then, whatever the SQ Head Pointers said.
    /// There are `entries − 1` CIDs, so when the reported heads leave every
    /// slot occupied, some occupied slot holds a command that completed;
    /// after a reap (so that no completion with an older SQHD still waits),
    /// [`SqRing::infer_head`] moves the head past what the completions
    /// prove fetched, with every command in flight (timed-out ones and AERs
    /// included) as the bound. A device whose admin SQHD lags or never
    /// moves does not run the admin queue out of room.
    fn make_room<D: Device>(&mut self, dev: &D, name: &str) -> Result<()> {
        if self.sq_ring.is_full() {
            self.reap(dev, name)?;
            self.sq_ring.infer_head(self.cids.in_flight());
        }
        Ok(())
    }

    /// Reaps every completion that is ready; returns how many were reaped.
    /// Any protocol violation by the device is an error (the caller marks the
    /// controller failed).
    pub(crate) fn reap<D: Device>(&mut self, dev: &D, name: &str) -> Result<u32> {
        let mut n = 0;
        loop {
            let off = self.cq_ring.head() as usize * CQE_BYTES;
            // Acquire: the rest of the entry is read only after its phase is seen.
            let dw3 = self.cq.load_acquire_u32(off + 12)?;
            if Cqe::phase_of_dw3(dw3) != self.cq_ring.phase() {
                break;
            }
            let cqe = Cqe {
                dw: [
                    self.cq.read_u32(off)?,
                    self.cq.read_u32(off + 4)?,
                    self.cq.read_u32(off + 8)?,
                    dw3,
                ],
            };
            self.cq_ring.advance();
            n += 1;
            let fault = |what: String| Error::DeviceFault {
                device: name.to_string(),
                what,
            };
            if cqe.sqid() != 0 {
                return Err(fault(format!(
                    "admin completion names SQ {} (cid 0x{:04x})",
                    cqe.sqid(),
                    cqe.cid()
                )));
            }
            self.sq_ring
                .update_head(cqe.sqhd())
                .map_err(|e| fault(format!("admin completion: {e}")))?;
            let slot = self
                .cids
                .complete(cqe.cid())
                .map_err(|e| fault(format!("admin completion: {e}")))?;
            let s = &mut self.slots[slot as usize];
            match s.kind {
                SlotKind::Aer => {
                    s.kind = SlotKind::Free;
                    let status = cqe.status();
                    if status.is_success() {
                        let e = AsyncEvent::from_dw0(cqe.dw0());
                        if e.event_type == upnvme_queues::aer::event_type::NOTICE
                            && !e.is_namespace_attribute_changed()
                        {
                            self.notices_reaped += 1;
                            self.notice_masked = Some((e.log_page, self.notices_reaped));
                        }
                        self.events.push_back(e);
                        self.aer_to_post += 1;
                        self.aer_error_streak = 0;
                    } else if aer_error_is_retryable(status)
                        && self.aer_error_streak < MAX_AER_RETRIES
                    {
                        // A transient error (DNR clear, e.g. Internal
                        // Error): without a re-post the notices this AER
                        // carries would stop for good.
                        self.aer_to_post += 1;
                        self.aer_error_streak += 1;
                    } else {
                        // Asynchronous Event Request Limit Exceeded, DNR
                        // set, or errors without end: not re-posted. Nor is
                        // its identifier kept for it any longer (the
                        // controller takes fewer than AERL + 1): application
                        // commands may use it until a reset posts the
                        // target again.
                        self.aer_lost = true;
                        self.aers_refused += 1;
                        self.aer_target = self.aer_target.saturating_sub(1);
                    }
                }
                SlotKind::Sync => s.done = Some(cqe),
                SlotKind::Detached => {
                    s.kind = SlotKind::Free;
                    // Completed: the device is done with the list.
                    s.list = None;
                    self.detached.push(DetachedDone {
                        epoch: self.epoch,
                        cqe,
                        data: s.data.take(),
                    });
                }
                SlotKind::Free => {
                    return Err(fault(format!(
                        "completion for cid 0x{:04x} that has no waiter",
                        cqe.cid()
                    )));
                }
            }
        }
        // No CQ head doorbell once a release began: the controller may be
        // disabled already (the entries count as consumed all the same).
        if n > 0
            && let Some(head) = self.cq_ring.commit()
            && !self.released()
        {
            dev.write32(self.cq_db, head as u32);
        }
        Ok(n)
    }

    /// Submits `sqe` and waits for its completion, at most `timeout`. `data` is
    /// the command's data buffer and `prp_list` the page its PRP2 points to
    /// (PRP List, NVMe 2.0 §4.3.1), if any: when the wait ends without the
    /// completion (timeout, a device fault, the controller fatal or gone)
    /// both are quarantined — kept until the controller is disabled, since
    /// the device may still read the list and write through it — rather
    /// than returned or freed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute<D: Device>(
        &mut self,
        dev: &D,
        name: &str,
        sqe: Sqe,
        data: Option<DmaBuffer>,
        prp_list: Option<DmaBuffer>,
        timeout: Duration,
        what: &str,
    ) -> Result<(Cqe, Option<DmaBuffer>)> {
        self.make_room(dev, name)?;
        // Get Log Page with Retain Asynchronous Event (CDW10 bit 15) clear:
        // its log, whose Notice it re-arms.
        let rae_clear_lid = (sqe.opcode() == upnvme_queues::sqe::opcode::admin::GET_LOG_PAGE
            && sqe.dw[10] & (1 << 15) == 0)
            .then_some(sqe.dw[10] as u8);
        // What the CQ already holds is reaped first: a Notice posted before
        // this read counts as one it re-arms.
        if rae_clear_lid.is_some() {
            self.reap(dev, name)?;
        }
        let reaped_before = self.notices_reaped;
        let slot = self.submit(dev, sqe, SlotKind::Sync)?;
        let start = Instant::now();
        let mut polls = 0u32;
        // The release stopped the controller: this is the last look.
        let mut last_look = false;
        let ended = loop {
            if let Err(e) = self.reap(dev, name) {
                break e;
            }
            if let Some(cqe) = self.slots[slot as usize].done.take() {
                self.slots[slot as usize].kind = SlotKind::Free;
                if let (Some(lid), Some((masked, n))) = (rae_clear_lid, self.notice_masked)
                    && lid == masked
                    && n <= reaped_before
                    && cqe.status().is_success()
                {
                    self.notice_masked = None;
                    self.notice_mask_ended = true;
                }
                // Completed: the device is done with the list too.
                drop(prp_list);
                return Ok((cqe, data));
            }
            if last_look {
                break Error::ControllerRemoved { device: dev.name() };
            }
            polls += 1;
            if polls >= POLLS_PER_CLOCK {
                polls = 0;
                match check_csts(dev, name) {
                    Err(e) => break e,
                    Ok(csts) if self.stopped_by_release(csts) => {
                        // One more reap (at the top): a completion posted
                        // before the controller stopped is the answer.
                        last_look = true;
                        continue;
                    }
                    Ok(_) => {}
                }
                let waited = start.elapsed();
                if waited >= timeout {
                    break Error::Timeout {
                        what: format!("{what} to complete on the admin queue"),
                        after: waited,
                    };
                }
                std::thread::yield_now();
            }
        };
        self.quarantine
            .extend(data.into_iter().chain(prp_list).map(DmaBuffer::into_pages));
        Err(ended)
    }

    /// Whether a detached command may take a command identifier now. The
    /// driver keeps the Asynchronous Event Requests it wants posted
    /// (outstanding or to re-post) and two identifiers for its own commands
    /// (a queue pair's Create I/O CQ/SQ, an Abort, a reset's Identify; as
    /// `post_aers` keeps them): application commands waited for without the
    /// lock, as many as threads send, must not take those — a host that ran
    /// out of identifiers would have to fail the controller, and lost
    /// event requests are not posted again.
    pub(crate) fn detached_room(&self) -> Room {
        let slots = self.slots.len() as u32;
        let aers = self.aers_outstanding();
        let kept = self.aer_target.max(aers) + DRIVER_CIDS;
        if kept + 1 > slots {
            return Room::Never;
        }
        let others = self.cids.in_flight().saturating_sub(aers);
        if others + 1 + kept <= slots {
            Room::Yes
        } else {
            Room::NotNow
        }
    }

    /// Detached commands in flight.
    pub(crate) fn detached_in_flight(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| s.kind == SlotKind::Detached)
            .count() as u32
    }

    /// Submits `sqe` for a waiter that polls with
    /// [`AdminQueue::detached_outcome`] and does not hold the admin lock in
    /// between: other admin commands (a queue pair re-creating its queues,
    /// an event poll) run meanwhile. Any reap stores its completion. `data`
    /// is the command's data buffer and `prp_list` the page its PRP2 points
    /// to, if any (the SQE's data pointer names them): the queue keeps both
    /// while the device may use them — until the completion is reaped, when
    /// the buffer goes to the completion and the list is freed, or until the
    /// controller is disabled, whatever became of the waiter.
    pub(crate) fn start_detached<D: Device>(
        &mut self,
        dev: &D,
        name: &str,
        mut sqe: Sqe,
        data: Option<DmaBuffer>,
        prp_list: Option<DmaBuffer>,
    ) -> Result<Ticket> {
        self.make_room(dev, name)?;
        if data.is_none() {
            // No data: no pointer of anyone's.
            sqe.set_prp1(0);
            sqe.set_prp2(0);
        }
        let slot = self.submit(dev, sqe, SlotKind::Detached)?;
        // Stored before anything can reap the completion: reaps take the
        // admin lock, which the caller holds.
        self.slots[slot as usize].data = data;
        self.slots[slot as usize].list = prp_list;
        let cid = self.cids.cid_of(slot).ok_or_else(|| Error::DeviceFault {
            device: name.to_string(),
            what: "admin queue: a command just submitted has no command identifier".into(),
        })?;
        let ticket = Ticket {
            cid,
            epoch: self.epoch,
        };
        self.waiting.push(ticket);
        Ok(ticket)
    }

    /// The waiter of `ticket` gives up (an error ended its wait): its
    /// completion, should one come, is dropped at the next reset.
    pub(crate) fn abandon(&mut self, ticket: Ticket) {
        self.waiting.retain(|&t| t != ticket);
    }

    /// What became of the detached command `ticket` (reap first). Its
    /// completion is reaped in the epoch it was sent in (a reset forgets
    /// the command), so a CID of a later epoch's command, which a fresh
    /// admin queue may hand out again, is never taken for it.
    pub(crate) fn detached_outcome(&mut self, ticket: Ticket) -> Detached {
        if let Some(i) = self
            .detached
            .iter()
            .position(|d| d.epoch == ticket.epoch && d.cqe.cid() == ticket.cid)
        {
            self.abandon(ticket);
            let done = self.detached.swap_remove(i);
            return Detached::Done(done.cqe, done.data);
        }
        if self.epoch != ticket.epoch {
            self.abandon(ticket);
            return Detached::Ended;
        }
        Detached::Pending
    }

    /// The reset epoch and the detached completions not taken yet, for the
    /// admin queue a reset builds ([`AdminQueue::keep_detached`]).
    pub(crate) fn take_detached(&mut self) -> DetachedState {
        DetachedState {
            epoch: self.epoch,
            done: std::mem::take(&mut self.detached),
            waiting: std::mem::take(&mut self.waiting),
        }
    }

    /// Carries over what [`AdminQueue::take_detached`] took from the queue
    /// this one replaces.
    pub(crate) fn keep_detached(&mut self, state: DetachedState) {
        self.epoch = state.epoch;
        self.detached = state.done;
        self.waiting = state.waiting;
    }

    /// Posts Asynchronous Event Requests until `target` are outstanding (plus
    /// re-posting those that completed), less those the controller ended
    /// for good (`aers_refused`).
    pub(crate) fn post_aers<D: Device>(&mut self, dev: &D, target: u32) -> Result<()> {
        let outstanding = self.aers_outstanding();
        // Keep at least two command identifiers for real admin commands, however
        // small the admin queue.
        let cap = (self.slots.len() as u32).saturating_sub(DRIVER_CIDS);
        self.aer_target = target.min(cap).saturating_sub(self.aers_refused);
        let mut want = self.aer_target.saturating_sub(outstanding);
        if want > 0 && self.sq_ring.free_slots() <= 2 {
            // As `make_room`: every caller has just reaped (or the queue is
            // new), so no completion with an older SQHD waits.
            self.sq_ring.infer_head(self.cids.in_flight());
        }
        while want > 0
            && self.sq_ring.free_slots() > 2
            && self.cids.in_flight() + DRIVER_CIDS < self.slots.len() as u32
        {
            self.submit(dev, Sqe::async_event_request(), SlotKind::Aer)?;
            want -= 1;
        }
        // What could not be posted now (identifiers held by other commands)
        // is posted at the next poll, not forgotten.
        self.aer_to_post = want;
        Ok(())
    }

    /// Whether a Notice's log page is unread, so that the controller masks
    /// the namespace notice too (see `notice_masked`).
    pub(crate) fn notice_masked(&self) -> bool {
        self.notice_masked.is_some()
    }

    /// Whether a Notice mask ended since the last call (see
    /// `notice_mask_ended`).
    pub(crate) fn take_notice_mask_ended(&mut self) -> bool {
        std::mem::take(&mut self.notice_mask_ended)
    }

    /// The controller was disabled: every event mask is clear.
    pub(crate) fn event_masks_cleared(&mut self) {
        self.notice_masked = None;
    }

    /// Asynchronous Event Requests outstanding at the controller.
    pub(crate) fn aers_outstanding(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| s.kind == SlotKind::Aer)
            .count() as u32
    }

    /// Number of AERs that completed since the last [`AdminQueue::post_aers`].
    pub(crate) fn aers_to_repost(&self) -> u32 {
        self.aer_to_post
    }

    /// Whether an AER ended without being re-posted since the last call.
    pub(crate) fn take_aer_lost(&mut self) -> bool {
        std::mem::take(&mut self.aer_lost)
    }

    /// Takes the asynchronous events received so far.
    pub(crate) fn take_events(&mut self) -> Vec<AsyncEvent> {
        self.events.drain(..).collect()
    }

    /// Puts events taken from a previous admin queue (a reset replaces it)
    /// in front of any received since.
    pub(crate) fn keep_events(&mut self, events: Vec<AsyncEvent>) {
        for e in events.into_iter().rev() {
            self.events.push_front(e);
        }
    }

    /// Queues `event` unless an event like it waits already.
    pub(crate) fn keep_event_once(&mut self, event: AsyncEvent) {
        if !self.events.contains(&event) {
            self.events.push_back(event);
        }
    }

    /// Forgets every command in flight: only valid once the controller is
    /// disabled (CSTS.RDY = 0), when no more DMA can happen. Releases
    /// quarantined buffers.
    pub(crate) fn forget_in_flight(&mut self) {
        let slots: Vec<u16> = self.cids.in_flight_slots().collect();
        for s in slots {
            let _ = self.cids.cancel(s);
            let slot = &mut self.slots[s as usize];
            slot.kind = SlotKind::Free;
            slot.done = None;
            // Disabled: the device no longer uses a detached command's
            // buffers.
            slot.data = None;
            slot.list = None;
        }
        self.quarantine.clear();
        // A detached command still in flight is ended (its waiter sees the
        // new epoch); a completion reaped before stays while its waiter
        // waits (it may not have looked since, however many resets came
        // meanwhile), and is dropped once the waiter gave up.
        let waiting = &self.waiting;
        self.detached.retain(|d| {
            waiting.contains(&Ticket {
                cid: d.cqe.cid(),
                epoch: d.epoch,
            })
        });
        self.epoch += 1;
    }
}

/// Checks CSTS for a vanished (all ones) or fatally failed (CFS) controller.
pub(crate) fn check_csts<D: Device>(dev: &D, name: &str) -> Result<Csts> {
    csts_alive(Csts(dev.read32(REG_CSTS)), name)
}

/// [`check_csts`] on a value read already.
pub(crate) fn csts_alive(csts: Csts, name: &str) -> Result<Csts> {
    if csts.is_all_ones() {
        return Err(Error::ControllerGone {
            device: name.to_string(),
        });
    }
    if csts.cfs() {
        return Err(Error::ControllerFatal {
            device: name.to_string(),
        });
    }
    Ok(csts)
}

/// Command identifiers kept free for the driver's own admin commands:
/// neither Asynchronous Event Requests nor detached commands take them.
const DRIVER_CIDS: u32 = 2;

/// AERs in a row ended by a retryable error that are posted again; past
/// it the controller is taken to refuse them for good.
const MAX_AER_RETRIES: u32 = 8;

/// Whether an Asynchronous Event Request that ended with `status` is worth
/// posting again: not with DNR (Do Not Retry) set, and not Asynchronous
/// Event Request Limit Exceeded (Command Specific Status 05h: the
/// controller takes no more).
fn aer_error_is_retryable(status: upnvme_queues::Status) -> bool {
    !(status.dnr() || status.sct() == 1 && status.sc() == 0x05)
}

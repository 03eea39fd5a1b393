//! Polled I/O queue pairs: the hot path.
//!
//! One [`IoQueuePair`] is one I/O submission queue and its own completion queue,
//! created with interrupts disabled (Create I/O Completion Queue with IEN = 0,
//! no vector). It is `Send` but not `Sync`: one owner thread drives it, so the
//! I/O path takes no lock and allocates nothing.
//!
//! ## Ordering contract (the reason this type is `!Sync`)
//!
//! Submission, in this order:
//! 1. the tracker for the command's CID slot gets the caller's tag and buffer;
//! 2. the SQE is written into the SQ slot;
//! 3. the SQ tail doorbell (MMIO, or shadow + EventIdx check) is written —
//!    `Device::write32` orders the SQE stores before it;
//! 4. only then software bookkeeping (statistics) runs, while the device is
//!    already fetching the command.
//!
//! Step 4 after step 3 is safe because the CID → tracker entry was written in
//! step 1, before the device could see the command, and nothing can reap this
//! queue before the owner thread finishes submitting: the pair is single-owner
//! (`!Sync`, `&mut self` everywhere), and the opportunistic reap
//! (`reap_on_submit`) runs after the bookkeeping.
//!
//! Completion: the CQE's dword 3 (phase, status, CID) is read with an acquire
//! load before the rest of the entry; the CID is validated (slot and
//! generation), the SQ head taken from SQHD is validated against the window of
//! submitted commands, and only then is the buffer handed back.
//!
//! ## For the lowest latency at low depth
//!
//! When a completion leaves nothing in flight, the device idles until the
//! next SQ tail doorbell, so everything the application does between seeing
//! the completion and submitting again is part of the next round trip. Keep
//! the completion callback small, submit the next command first, and do the
//! bookkeeping (latency records, statistics) after [`IoQueuePair::submit`]
//! or [`IoQueuePair::ring`] returns. Under QEMU that turnaround decides
//! whether a QD1 round trip takes ~10 or ~22 µs (docs/benchmarks.md, "Where
//! the QD1 round trip goes"); `upnvme perf`'s depth-1 loop follows this.

mod clock;
mod command;
mod doorbell;
mod stats;

use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use upnvme_dma::DmaBuffer;
use upnvme_queues::prp::{build_contiguous, list_pages, prp_pair_4k};
use upnvme_queues::regs::{cq_head_doorbell, sq_tail_doorbell};
use upnvme_queues::shadow::{cq_head_offset, sq_tail_offset};
use upnvme_queues::status::sc::generic as sc;
use upnvme_queues::{CidTable, CqRing, Cqe, DsmRange, SqRing, Sqe};

pub use command::{Completion, IoCommand, IoError, IoFailure};
pub use doorbell::CqHeadPolicy;
use doorbell::{Doorbells, ShadowSlots};
pub use stats::QueueStats;

use crate::controller::{Controller, Inner, STATE_GENERATION_SHIFT};
use crate::device::{Device, VfioNvme};
use crate::error::{Error, Result};

/// NVMe memory page size used by the driver (CC.MPS = 0).
const PAGE: usize = 4096;
// `prp_pair_4k` is the fast path for this memory page size (CC.MPS = 0).
const _: () = assert!(PAGE == 4096);
const SQE_BYTES: usize = 64;
const CQE_BYTES: usize = 16;
/// Largest transfer per command the queue pair accepts, whatever MDTS allows
/// (larger I/Os are split by the caller; the PRP list pages for it are
/// preallocated per tracker).
pub(crate) const MAX_TRANSFER_CAP: usize = 4 << 20;
/// Most ranges a Dataset Management command carries (NR is 8 bits, 0-based).
const MAX_DSM_RANGES: usize = 256;

/// The tag blocking helpers give their commands: if a blocking call times out,
/// its completion surfaces later from `process_completions` with this tag.
pub const BLOCKING_TAG: u64 = u64::MAX;

/// How blocking helpers wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Empty polls spent spinning (no PAUSE, no clock read per poll) before
    /// backing off.
    pub spin_polls: u32,
    /// After that: `None` yields the CPU between polls; `Some(d)` sleeps `d`.
    pub sleep: Option<Duration>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin_polls: 200_000,
            sleep: None,
        }
    }
}

/// Options of one I/O queue pair. No global knobs: every pair can differ.
#[derive(Clone, Debug)]
pub struct QueuePairOptions {
    /// Submission queue entries (2..=CAP.MQES+1). `None`: min(256, CQ limit/2).
    /// At most `entries - 1` commands (and at most 4096) are in flight.
    pub entries: Option<u32>,
    /// Completion queue entries. `None`: twice the SQ, capped at CAP.MQES+1 —
    /// the slack is what lets the CQ head doorbell be moderated.
    pub cq_entries: Option<u32>,
    /// Let the shadow doorbell EventIdx skip MMIO writes (when the controller
    /// has Doorbell Buffer Config active). Off: every doorbell update is also
    /// written over MMIO.
    pub shadow_doorbells: bool,
    /// After ringing the SQ doorbell (and the bookkeeping), reap whatever is
    /// ready. Off by default; exists to be measured.
    pub reap_on_submit: bool,
    /// When the CQ head doorbell is written.
    pub cq_head_policy: CqHeadPolicy,
    /// How blocking helpers wait.
    pub backoff: Backoff,
    /// A command not completed after this long is aborted (Abort admin
    /// command); if it still has not completed after another `command_timeout`,
    /// the controller is reset. It then completes exactly once with
    /// [`IoError::TimedOut`]. `None` disables command timeouts.
    pub command_timeout: Option<Duration>,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            entries: None,
            cq_entries: None,
            shadow_doorbells: true,
            reap_on_submit: false,
            cq_head_policy: CqHeadPolicy::default(),
            backoff: Backoff::default(),
            command_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Per-CID-slot state: who gets the completion and which buffer the device owns.
#[derive(Debug, Default)]
struct Tracker {
    tag: u64,
    buffer: Option<DmaBuffer>,
    /// Clock ticks (see `clock.rs`) when the command was announced; 0 before.
    submitted: u64,
    /// Abort sent for this command (its deadline is then `submitted` + 2 x timeout).
    aborted: bool,
}

/// What the queue pair caches about a namespace for argument checks.
#[derive(Clone, Copy, Debug)]
struct NsInfo {
    nsid: u32,
    blocks: u64,
    lba_shift: u32,
}

/// A polled I/O submission/completion queue pair. See the module docs for the
/// ordering contract.
pub struct IoQueuePair<D: Device = VfioNvme> {
    // Hot fields first.
    sq_ring: SqRing,
    cq_ring: CqRing,
    cids: CidTable,
    sq: DmaBuffer,
    cq: DmaBuffer,
    doorbells: Doorbells,
    trackers: Box<[Tracker]>,
    stats: QueueStats,
    /// Commands queued since the last `ring`: not yet stamped for timeouts
    /// or counted, and (with MMIO doorbells) not yet announced.
    pending: u32,
    max_depth: u32,
    /// `cq_entries - 1 - max_depth`: consumed entries the controller may be
    /// left unaware of (see doorbell.rs).
    cq_slack: u32,
    qid: u16,
    reap_on_submit: bool,
    failed: bool,
    policy: CqHeadPolicy,
    /// Completions reaped on behalf of the owner (by `reap_on_submit` or a
    /// blocking helper), delivered by the next `process_completions`.
    /// Capacity `max_depth`: pushing never allocates.
    ready: VecDeque<(u16, Completion)>,
    namespaces: Box<[NsInfo]>,
    /// PRP list pages: `list_pages_per_slot` pages per tracker slot.
    prp_lists: DmaBuffer,
    list_pages_per_slot: usize,
    prp_scratch: Box<[u64]>,
    max_transfer: usize,
    backoff: Backoff,
    /// Command timeout in clock ticks (0 = none).
    timeout_ticks: u64,
    /// Controller reset generation this pair's queues belong to.
    generation: u64,
    /// The queues must be re-created (after a reset) before the next command.
    needs_recreate: bool,
    /// Slots queued since the last `ring` (their timestamps are taken after
    /// the doorbell). Capacity `max_depth`.
    pending_slots: Box<[u16]>,
    ctrl: Arc<Inner<D>>,
    /// `Cell` is `Send + !Sync`: the pair can move between threads but never be
    /// shared.
    _not_sync: PhantomData<Cell<()>>,
}

impl<D: Device> std::fmt::Debug for IoQueuePair<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueuePair")
            .field("qid", &self.qid)
            .field("sq_entries", &self.sq_ring.entries())
            .field("cq_entries", &self.cq_ring.entries())
            .field("in_flight", &self.cids.in_flight())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<D: Device> Controller<D> {
    /// Creates an I/O queue pair: Create I/O Completion Queue (PC = 1, IEN = 0,
    /// no interrupt vector), then Create I/O Submission Queue bound to it.
    ///
    /// Fails with [`Error::NoQueuesLeft`] when every queue the controller
    /// granted is in use.
    pub fn io_queue_pair(&self, options: QueuePairOptions) -> Result<IoQueuePair<D>> {
        IoQueuePair::create(self.inner.clone(), options)
    }
}

impl<D: Device> IoQueuePair<D> {
    fn create(ctrl: Arc<Inner<D>>, opts: QueuePairOptions) -> Result<Self> {
        ctrl.check_usable()?;
        let mqes = ctrl.cap.max_queue_entries().min(65536);
        let check = |what: &str, n: u32| {
            if !(2..=mqes).contains(&n) {
                return Err(Error::InvalidArgument(format!(
                    "{what} of {n}: must be 2..={mqes} (CAP.MQES + 1)"
                )));
            }
            Ok(n)
        };
        let sq_entries = match opts.entries {
            Some(n) => check("queue entries", n)?,
            None => 256.min(mqes / 2).max(2),
        };
        let cq_entries = match opts.cq_entries {
            Some(n) => check("completion queue entries", n)?,
            None => (sq_entries * 2).min(mqes),
        };
        let max_depth = (sq_entries - 1)
            .min(cq_entries - 1)
            .min(upnvme_queues::cid::MAX_SLOTS as u32);
        let cq_slack = cq_entries - 1 - max_depth;
        // PRP list pages are preallocated per tracker for the largest transfer:
        // cap it so an MDTS of 2 GiB (or none) does not pin gigabytes per queue.
        let max_transfer = ctrl
            .max_transfer()
            .unwrap_or(MAX_TRANSFER_CAP)
            .min(MAX_TRANSFER_CAP);
        // A transfer of max_transfer bytes at any dword offset touches at most
        // this many memory pages; PRP1 covers the first.
        let list_entries = max_transfer / PAGE + 1;
        let list_pages_per_slot = list_pages(list_entries, PAGE).max(1);

        let dev = &ctrl.dev;
        let sq = dev.alloc_dma(sq_entries as usize * SQE_BYTES)?;
        let cq = dev.alloc_dma(cq_entries as usize * CQE_BYTES)?;
        let prp_lists = dev.alloc_dma(max_depth as usize * list_pages_per_slot * PAGE)?;

        let dstrd = ctrl.cap.dstrd();
        let qid = ctrl.alloc_qid()?;
        let sq_db = sq_tail_doorbell(qid, dstrd);
        let cq_db = cq_head_doorbell(qid, dstrd);
        if cq_db + 4 > dev.bar_len() {
            ctrl.free_qid(qid);
            return Err(Error::Unsupported {
                device: ctrl.name.clone(),
                what: format!(
                    "doorbells of queue {qid} lie beyond BAR0 ({} bytes)",
                    dev.bar_len()
                ),
            });
        }
        let shadow = match &ctrl.shadow {
            Some(s) => {
                let slots = ShadowSlots {
                    sq: sq_tail_offset(qid, dstrd),
                    cq: cq_head_offset(qid, dstrd),
                };
                // A re-used qid may have left values in the shadow buffer: the
                // new queues start at tail 0 / head 0.
                let zero = |b: &DmaBuffer| -> Result<()> {
                    b.write_u32(slots.sq, 0)?;
                    b.write_u32(slots.cq, 0)?;
                    Ok(())
                };
                if let Err(e) = zero(&s.doorbells).and_then(|()| zero(&s.event_idx)) {
                    ctrl.free_qid(qid);
                    return Err(e);
                }
                Some(slots)
            }
            None => None,
        };

        let generation = match ctrl.create_io_queues(
            Sqe::create_io_cq(qid, cq_entries, cq.iova(), false, 0),
            Sqe::create_io_sq(qid, sq_entries, sq.iova(), qid, 0),
            qid,
            "",
        ) {
            Ok(g) => g,
            Err(e) => {
                ctrl.free_qid(qid);
                return Err(e);
            }
        };
        let timeout_ticks = opts.command_timeout.map_or(0, |d| clock::ticks(d).max(1));
        let namespaces = ctrl
            .namespaces()
            .iter()
            .map(|n| NsInfo {
                nsid: n.id(),
                blocks: n.lba_count(),
                lba_shift: n.lba_size().trailing_zeros(),
            })
            .collect();
        Ok(IoQueuePair {
            sq_ring: SqRing::new(sq_entries).map_err(|e| Error::InvalidArgument(e.to_string()))?,
            cq_ring: CqRing::new(cq_entries).map_err(|e| Error::InvalidArgument(e.to_string()))?,
            cids: CidTable::new(max_depth as u16),
            sq,
            cq,
            doorbells: Doorbells {
                sq_db,
                cq_db,
                shadow,
                use_event_idx: opts.shadow_doorbells,
                last_sq: 0,
                last_cq: 0,
            },
            trackers: (0..max_depth).map(|_| Tracker::default()).collect(),
            stats: QueueStats::default(),
            pending: 0,
            max_depth,
            cq_slack,
            qid,
            reap_on_submit: opts.reap_on_submit,
            failed: false,
            policy: opts.cq_head_policy,
            ready: VecDeque::with_capacity(max_depth as usize),
            namespaces,
            prp_lists,
            list_pages_per_slot,
            prp_scratch: vec![0u64; list_pages_per_slot * PAGE / 8].into_boxed_slice(),
            max_transfer,
            backoff: opts.backoff,
            timeout_ticks,
            generation,
            needs_recreate: false,
            pending_slots: vec![0u16; max_depth as usize].into_boxed_slice(),
            ctrl,
            _not_sync: PhantomData,
        })
    }

    /// One load: the controller is usable and was not reset since this
    /// pair's queues were created (see `Inner::state`).
    #[inline(always)]
    fn ctrl_current(&self) -> bool {
        self.ctrl.state() == self.generation << STATE_GENERATION_SHIFT
    }

    /// True when a controller reset or close bumped the generation since this
    /// pair's queues were created (or last re-created): they no longer exist.
    #[inline]
    fn generation_changed(&self) -> bool {
        self.generation != self.ctrl.generation()
    }

    /// The queue ID (SQ and CQ share it).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Submission queue entries.
    pub fn sq_entries(&self) -> u32 {
        self.sq_ring.entries()
    }

    /// Completion queue entries.
    pub fn cq_entries(&self) -> u32 {
        self.cq_ring.entries()
    }

    /// Most commands that can be in flight at once.
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// Commands submitted (or queued) whose completion has not been reaped.
    pub fn in_flight(&self) -> u32 {
        self.cids.in_flight()
    }

    /// Largest data transfer of one command in bytes (from MDTS).
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// Whether the shadow doorbell buffer is in use for this pair.
    pub fn shadow_doorbells(&self) -> bool {
        self.doorbells.shadow.is_some()
    }

    /// The counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Resets the counters to zero (e.g. after a warm-up).
    pub fn reset_stats(&mut self) {
        self.stats = QueueStats::default();
    }

    // ------------------------------------------------------------ submission

    /// Submits one command and rings the doorbell. `buffer` is required for
    /// Read, Write and Compare (at least `blocks × LBA size` bytes) and ignored
    /// (handed back with the completion) otherwise. The completion carries
    /// `tag` and the buffer.
    ///
    /// A full queue is [`Error::QueueFull`], returned at once with the buffer.
    #[inline]
    pub fn submit(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        tag: u64,
    ) -> std::result::Result<(), IoFailure> {
        self.queue(cmd, buffer, tag)?;
        self.ring();
        Ok(())
    }

    /// Writes one command into the SQ for a batch: several `queue` calls
    /// followed by one [`IoQueuePair::ring`]. With MMIO doorbells nothing is
    /// announced until `ring` writes the SQ tail once for the whole batch.
    /// With shadow doorbells and the EventIdx in use (the default where the
    /// controller offers Doorbell Buffer Config), `queue` announces the
    /// command at once through the shadow doorbell (an MMIO write only when
    /// the controller's EventIdx asks for one), so the device may start, or
    /// even finish, before `ring`; `ring` then only does the bookkeeping.
    /// `process_completions` and the blocking helpers ring pending commands
    /// first.
    #[inline]
    pub fn queue(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        tag: u64,
    ) -> std::result::Result<(), IoFailure> {
        match self.queue_inner(cmd, buffer.as_ref(), tag) {
            Ok(slot) => {
                self.trackers[slot as usize].buffer = buffer;
                self.publish_early();
                Ok(())
            }
            Err(error) => Err(IoFailure { error, buffer }),
        }
    }

    /// With the EventIdx in use, announces the command just queued at once,
    /// as `submit` would (see doorbell.rs): shadow tail store, fence,
    /// EventIdx check, and an MMIO write only if the controller asks for one.
    /// Its tracker (tag and buffer) is complete, so the device may start on
    /// it now; the SQ ring counts it as announced, so its completion is in
    /// the SQ head window.
    #[inline]
    fn publish_early(&mut self) {
        // As in `ring`: never announce to a queue a reset deleted since
        // `queue_inner` checked, nor to a failed or closed controller; the
        // command then stays pending and `ring` ends or announces it.
        if !self.doorbells.use_event_idx
            || self.ctrl.shadow.is_none()
            || self.failed
            || self.needs_recreate
            || !self.ctrl_current()
        {
            return;
        }
        if let Some(s) = &self.ctrl.shadow
            && let Some(tail) = self.sq_ring.commit()
        {
            self.doorbells.ring_sq(
                &self.ctrl.dev,
                Some((&s.doorbells, &s.event_idx)),
                tail,
                &mut self.stats,
            );
        }
    }

    /// Announces every queued command not yet announced with one SQ tail
    /// doorbell write (nothing is left with the EventIdx in use, see
    /// [`IoQueuePair::queue`]), then does the bookkeeping (timeout stamps,
    /// statistics), then (with `reap_on_submit`) reaps what is ready.
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.needs_recreate || self.failed || !self.ctrl_current() {
            self.ring_refused();
            return;
        }
        // Tails `queue` already published to the shadow buffer are committed
        // in the ring but not yet checked against the EventIdx: ring when the
        // tail moved since the last check.
        let _ = self.sq_ring.commit();
        let tail = self.sq_ring.committed_tail();
        if tail != self.doorbells.last_sq {
            let shadow = self
                .ctrl
                .shadow
                .as_ref()
                .map(|s| (&s.doorbells, &s.event_idx));
            self.doorbells
                .ring_sq(&self.ctrl.dev, shadow, tail, &mut self.stats);
        }
        // Bookkeeping strictly after the doorbell (see the module docs).
        if self.timeout_ticks > 0 && self.pending > 0 {
            let now = clock::now().max(1);
            for &slot in &self.pending_slots[..self.pending as usize] {
                self.trackers[slot as usize].submitted = now;
            }
        }
        self.stats.submissions += self.pending as u64;
        self.pending = 0;
        if self.reap_on_submit {
            self.reap_after_ring();
        }
    }

    /// `ring` when nothing may be announced: after a reset the queued
    /// commands end (once, ControllerReset) with the queue the reset deleted;
    /// a closed or failed controller never gets a doorbell (its queued
    /// commands end with the next reset or close).
    #[cold]
    #[inline(never)]
    fn ring_refused(&mut self) {
        if self.needs_recreate || self.generation_changed() {
            let _ = self.sync_generation();
        }
    }

    /// `reap_on_submit`: reaps what is ready right after the doorbell, for
    /// the next `process_completions` to deliver.
    #[inline(never)]
    fn reap_after_ring(&mut self) {
        if self.failed {
            return;
        }
        let mut ready = std::mem::take(&mut self.ready);
        // A device fault found here is reported by the next
        // process_completions (the pair is marked failed).
        let _ = self.reap(u32::MAX, &mut |slot, c| ready.push_back((slot, c)));
        self.ready = ready;
    }

    /// Validates, writes the SQE and fills the tracker's tag; returns the slot.
    /// The caller stores the buffer in the tracker (before any doorbell).
    #[inline]
    fn queue_inner(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<&DmaBuffer>,
        tag: u64,
    ) -> Result<u16> {
        if self.needs_recreate || self.failed || !self.ctrl_current() {
            self.queue_refused_or_resynced()?;
        }
        let ns = self.ns(cmd.nsid())?;
        // The SQE, and for data commands the buffer and transfer length.
        let (mut sqe, data) = match cmd {
            IoCommand::Read { slba, blocks, .. }
            | IoCommand::Write { slba, blocks, .. }
            | IoCommand::Compare { slba, blocks, .. } => {
                self.check_range(&ns, slba, blocks)?;
                let bytes = (blocks as usize) << ns.lba_shift;
                let Some(buf) = buffer else {
                    return Err(Error::InvalidArgument(format!(
                        "{} of {blocks} blocks needs a data buffer",
                        cmd.name()
                    )));
                };
                if buf.len() < bytes {
                    return Err(Error::InvalidArgument(format!(
                        "{} of {blocks} blocks needs {bytes} bytes; the buffer has {}",
                        cmd.name(),
                        buf.len()
                    )));
                }
                if bytes > self.max_transfer {
                    return Err(Error::InvalidArgument(format!(
                        "{} of {bytes} bytes exceeds the maximum transfer of {} bytes per command (MDTS, at most 4 MiB); split it",
                        cmd.name(),
                        self.max_transfer
                    )));
                }
                let sqe = match cmd {
                    IoCommand::Read { .. } => Sqe::read(ns.nsid, slba, blocks),
                    IoCommand::Write { .. } => Sqe::write(ns.nsid, slba, blocks),
                    _ => Sqe::compare(ns.nsid, slba, blocks),
                };
                (sqe, Some((buf, bytes)))
            }
            IoCommand::Flush { .. } => (Sqe::flush(ns.nsid), None),
            IoCommand::WriteZeroes {
                slba,
                blocks,
                deallocate,
                ..
            } => {
                self.check_range(&ns, slba, blocks)?;
                if blocks > 0x1_0000 {
                    return Err(Error::InvalidArgument(format!(
                        "Write Zeroes of {blocks} blocks: at most 65536 per command"
                    )));
                }
                (Sqe::write_zeroes(ns.nsid, slba, blocks, deallocate), None)
            }
            IoCommand::Deallocate { ranges, .. } => {
                if ranges.is_empty() || ranges.len() > MAX_DSM_RANGES {
                    return Err(Error::InvalidArgument(format!(
                        "Dataset Management with {} ranges: must be 1..=256",
                        ranges.len()
                    )));
                }
                for r in ranges {
                    self.check_range(&ns, r.slba, r.nlb)?;
                }
                (
                    Sqe::dataset_management(ns.nsid, ranges.len() as u32, true),
                    None,
                )
            }
        };
        // Completions waiting in `ready` count against the depth too, so that
        // queue never grows beyond its preallocated capacity.
        if self.cids.in_flight() + self.ready.len() as u32 >= self.max_depth
            || self.sq_ring.is_full()
        {
            return Err(Error::QueueFull { qid: self.qid });
        }
        // Not `ok_or`: building (and dropping) the error on every I/O costs.
        let Some(cid) = self.cids.alloc() else {
            return Err(Error::QueueFull { qid: self.qid });
        };
        sqe.set_cid(cid.value);
        if let Err(e) = self.place_data(&cmd, data, cid.slot, &mut sqe) {
            let _ = self.cids.cancel(cid.slot);
            return Err(e);
        }
        let Some(pos) = self.sq_ring.push() else {
            let _ = self.cids.cancel(cid.slot);
            return Err(Error::QueueFull { qid: self.qid });
        };
        if let Err(e) = self
            .sq
            .write_bytes(pos as usize * SQE_BYTES, &sqe.to_le_bytes())
        {
            // Cannot happen (pos < entries); if it did, the slot holds garbage
            // and must never be announced: fail the pair.
            self.failed = true;
            return Err(e.into());
        }
        let t = &mut self.trackers[cid.slot as usize];
        t.tag = tag;
        t.submitted = 0;
        t.aborted = false;
        self.pending_slots[self.pending as usize] = cid.slot;
        self.pending += 1;
        Ok(cid.slot)
    }

    /// Fills DPTR: PRPs for data commands (PRP lists go to the slot's
    /// preallocated list pages), the range list for Dataset Management.
    #[inline(always)]
    fn place_data(
        &mut self,
        cmd: &IoCommand<'_>,
        data: Option<(&DmaBuffer, usize)>,
        slot: u16,
        sqe: &mut Sqe,
    ) -> Result<()> {
        match data {
            Some((buf, bytes)) => match prp_pair_4k(buf.iova(), bytes) {
                // One or two pages (every 4 KiB I/O): no PRP List.
                Some((prp1, prp2)) => {
                    sqe.set_prp1(prp1);
                    sqe.set_prp2(prp2);
                    Ok(())
                }
                None => self.place_prp_list(buf, bytes, slot, sqe),
            },
            None => match *cmd {
                IoCommand::Deallocate { ranges, .. } => self.place_ranges(ranges, slot, sqe),
                _ => Ok(()),
            },
        }
    }

    /// PRP1 and a PRP List in the slot's list pages, for a transfer of more
    /// than two memory pages.
    #[inline(never)]
    fn place_prp_list(
        &mut self,
        buf: &DmaBuffer,
        bytes: usize,
        slot: u16,
        sqe: &mut Sqe,
    ) -> Result<()> {
        let list_base = slot as usize * self.list_pages_per_slot * PAGE;
        let list_iova = self.prp_lists.iova() + list_base as u64;
        let prps = build_contiguous(buf.iova(), bytes, PAGE, &mut self.prp_scratch, |i| {
            list_iova + (i * PAGE) as u64
        })
        .map_err(|e| Error::InvalidArgument(format!("PRP: {e}")))?;
        for (i, entry) in self.prp_scratch[..prps.list_len].iter().enumerate() {
            self.prp_lists.write_u64(list_base + i * 8, *entry)?;
        }
        sqe.set_prp1(prps.prp1);
        sqe.set_prp2(prps.prp2);
        Ok(())
    }

    /// Dataset Management ranges in the slot's list page; PRP1 points there.
    #[inline(never)]
    fn place_ranges(&mut self, ranges: &[DsmRange], slot: u16, sqe: &mut Sqe) -> Result<()> {
        let list_base = slot as usize * self.list_pages_per_slot * PAGE;
        for (i, r) in ranges.iter().enumerate() {
            self.prp_lists
                .write_bytes(list_base + i * 16, &r.to_le_bytes())?;
        }
        sqe.set_prp1(self.prp_lists.iova() + list_base as u64);
        Ok(())
    }

    #[inline]
    fn ns(&self, nsid: u32) -> Result<NsInfo> {
        self.namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .copied()
            .ok_or_else(|| Error::NoSuchNamespace {
                device: self.ctrl.name.clone(),
                nsid,
                active: self.namespaces.iter().map(|n| n.nsid).collect(),
            })
    }

    #[inline]
    fn check_range(&self, ns: &NsInfo, slba: u64, blocks: u32) -> Result<()> {
        if blocks == 0 || blocks > 0x1_0000 {
            return Err(Error::InvalidArgument(format!(
                "block count {blocks}: must be 1..=65536"
            )));
        }
        match slba.checked_add(blocks as u64) {
            Some(end) if end <= ns.blocks => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "LBA range {slba}..+{blocks} is outside namespace {} ({} blocks)",
                ns.nsid, ns.blocks
            ))),
        }
    }

    /// `queue_inner` off the hot path: after a reset, end what it ended and
    /// re-create the queues before anything is written to them; then refuse
    /// if the pair or the controller is failed or closed.
    #[cold]
    #[inline(never)]
    fn queue_refused_or_resynced(&mut self) -> Result<()> {
        if self.needs_recreate || self.generation_changed() {
            self.sync_generation()?;
        }
        self.check_usable()
    }

    #[inline]
    fn check_usable(&self) -> Result<()> {
        if self.failed || !self.ctrl.is_usable() {
            return Err(self.ctrl.unusable_error());
        }
        Ok(())
    }

    // ------------------------------------------------------------ completion

    /// Reaps up to `max` completions and hands each to `f` exactly once (tag,
    /// result, buffer). Pending queued commands are announced first (a due SQ
    /// tail before a due CQ head). Returns how many were delivered.
    ///
    /// Never blocks and never spins: one look at the CQ. A protocol violation
    /// by the device (unknown or stale CID, duplicate completion, SQ head out of
    /// range, wrong SQ ID) is [`Error::DeviceFault`]; the pair and the
    /// controller are then failed, and commands still in flight keep their
    /// buffers until the controller is disabled.
    #[inline]
    pub fn process_completions(&mut self, max: u32, mut f: impl FnMut(Completion)) -> Result<u32> {
        if self.needs_recreate || (!self.ctrl_current() && self.generation_changed()) {
            // Deliver what the reset ended even if re-creating fails now.
            let _ = self.sync_generation();
        }
        if self.pending > 0 {
            self.ring();
        }
        let mut n = 0;
        while n < max {
            match self.ready.pop_front() {
                Some((_, c)) => {
                    f(c);
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
        if n < max && !self.needs_recreate {
            n += self.reap(max - n, &mut |_, c| f(c))?;
        }
        if self.timeout_ticks > 0 && self.stats.polls & 1023 == 0 && self.cids.in_flight() > 0 {
            self.check_timeouts()?;
        }
        Ok(n)
    }

    /// Aborts commands older than the timeout; resets the controller when an
    /// aborted command is still not back after a second timeout, or when CSTS
    /// shows a fatal error.
    fn check_timeouts(&mut self) -> Result<()> {
        let now = clock::now();
        let t = self.timeout_ticks;
        let mut to_abort = Vec::new();
        let mut reset = false;
        for slot in self.cids.in_flight_slots() {
            let tr = &self.trackers[slot as usize];
            if tr.submitted == 0 {
                continue;
            }
            let age = now.saturating_sub(tr.submitted);
            if !tr.aborted && age > t {
                to_abort.push(slot);
            } else if tr.aborted && age > t.saturating_mul(2) {
                reset = true;
            }
        }
        if to_abort.is_empty() && !reset {
            return Ok(());
        }
        // Something is overdue: is the controller still alive?
        match crate::admin::check_csts(&self.ctrl.dev, &self.ctrl.name) {
            Ok(_) => {}
            Err(Error::ControllerFatal { .. }) => reset = true,
            Err(e) => {
                self.ctrl.mark_failed(&e);
                return Err(e);
            }
        }
        for slot in to_abort {
            if let Some(cid) = self.cids.cid_of(slot) {
                // The Abort's own result does not matter: either the command
                // completes (with Command Abort Requested) or, after a second
                // timeout, the controller is reset.
                let _ = self.ctrl.admin_command(
                    Sqe::abort(self.qid, cid),
                    &format!("Abort (SQ {}, CID 0x{cid:04x})", self.qid),
                );
                self.trackers[slot as usize].aborted = true;
                self.stats.aborts += 1;
            }
        }
        if reset {
            self.stats.timeout_resets += 1;
            self.ctrl.reset_after_timeout()?;
            self.sync_generation()?;
        }
        Ok(())
    }

    /// Ends the in-flight command in `slot` once the controller was disabled
    /// (nothing can reach its buffer any more): frees its CID and builds its
    /// only completion — ControllerFailed after close, TimedOut if we had
    /// aborted it, ControllerReset otherwise.
    fn end_in_flight(&mut self, slot: u16, closed: bool) -> Completion {
        let t = &mut self.trackers[slot as usize];
        let result = Err(if closed {
            IoError::ControllerFailed
        } else if t.aborted {
            IoError::TimedOut
        } else {
            IoError::ControllerReset
        });
        let c = Completion {
            tag: t.tag,
            result,
            buffer: t.buffer.take(),
        };
        t.aborted = false;
        t.submitted = 0;
        let _ = self.cids.cancel(slot);
        c
    }

    /// After a controller reset: completes every command in flight exactly once
    /// (TimedOut if it had been aborted, ControllerReset otherwise) — the
    /// controller is disabled, so no buffer is still reachable by the device —
    /// then re-creates the queues.
    fn sync_generation(&mut self) -> Result<()> {
        let g = self.ctrl.generation();
        if g != self.generation {
            let closed = self.ctrl.is_closed();
            let slots: Vec<u16> = self.cids.in_flight_slots().collect();
            for slot in slots {
                let c = self.end_in_flight(slot, closed);
                self.ready.push_back((slot, c));
            }
            self.pending = 0;
            self.sq_ring = SqRing::new(self.sq_ring.entries())
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            self.cq_ring = CqRing::new(self.cq_ring.entries())
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            // Stale entries would look new to the restarted phase.
            self.cq.fill(0, self.cq.len(), 0)?;
            self.doorbells.last_sq = 0;
            self.doorbells.last_cq = 0;
            self.generation = g;
            self.failed = false;
            self.needs_recreate = true;
        }
        if self.needs_recreate {
            self.ctrl.check_usable()?;
            if let (Some(slots), Some(s)) = (self.doorbells.shadow, &self.ctrl.shadow) {
                for b in [&s.doorbells, &s.event_idx] {
                    b.write_u32(slots.sq, 0)?;
                    b.write_u32(slots.cq, 0)?;
                }
            }
            // Nothing is in flight and the rings are fresh, so if another
            // reset came since the generation was taken above, the queues
            // created now simply belong to that newer one.
            self.generation = self.ctrl.create_io_queues(
                Sqe::create_io_cq(self.qid, self.cq_ring.entries(), self.cq.iova(), false, 0),
                Sqe::create_io_sq(
                    self.qid,
                    self.sq_ring.entries(),
                    self.sq.iova(),
                    self.qid,
                    0,
                ),
                self.qid,
                " (after reset)",
            )?;
            self.needs_recreate = false;
        }
        Ok(())
    }

    /// Looks at the CQ once and consumes up to `max` new entries.
    #[inline]
    fn reap(&mut self, max: u32, sink: &mut impl FnMut(u16, Completion)) -> Result<u32> {
        self.stats.polls += 1;
        let mut n = 0u32;
        while n < max {
            let off = self.cq_ring.head() as usize * CQE_BYTES;
            // Acquire: the rest of the entry is read only after its phase is seen.
            let dw3 = self.cq.load_acquire_u32(off + 12)?;
            if Cqe::phase_of_dw3(dw3) != self.cq_ring.phase() {
                break;
            }
            let dw2 = self.cq.read_u32(off + 8)?;
            let dw0 = self.cq.read_u32(off)?;
            self.cq_ring.advance();
            let cqe = Cqe {
                dw: [dw0, 0, dw2, dw3],
            };
            let Some(slot) = self.validate(&cqe) else {
                return Err(self.bad_completion(&cqe));
            };
            let t = &mut self.trackers[slot as usize];
            let status = cqe.status();
            let result = if status.is_success() {
                Ok(dw0)
            } else if t.aborted && status.sct() == 0 && status.sc() == sc::ABORT_REQUESTED {
                // Command Abort Requested, after our timeout's Abort.
                Err(IoError::TimedOut)
            } else if status.sct() == 0 && status.sc() == sc::ABORTED_SQ_DELETION {
                // The driver deletes a live pair's SQ only in a reset or a
                // close (`Inner::delete_io_queues`): the same ending as the
                // commands the reset finds still in flight. (A Delete sent
                // through `admin_passthrough` for a pair's queue ID breaks
                // that pair; its doc says so.)
                Err(if self.ctrl.is_closed() {
                    IoError::ControllerFailed
                } else if t.aborted {
                    IoError::TimedOut
                } else {
                    IoError::ControllerReset
                })
            } else {
                Err(IoError::Status(status))
            };
            t.aborted = false;
            t.submitted = 0;
            sink(
                slot,
                Completion {
                    tag: t.tag,
                    result,
                    buffer: t.buffer.take(),
                },
            );
            n += 1;
        }
        if n == 0 {
            self.stats.idle_polls += 1;
        } else {
            self.stats.completions += n as u64;
            self.update_cq_head();
        }
        Ok(n)
    }

    /// Checks a CQE against what we submitted; returns its tracker slot, or
    /// `None` for a protocol violation (the pair is then failed, see
    /// [`IoQueuePair::bad_completion`]).
    #[inline(always)]
    fn validate(&mut self, cqe: &Cqe) -> Option<u16> {
        if cqe.sqid() != self.qid || self.sq_ring.update_head(cqe.sqhd()).is_err() {
            return None;
        }
        self.cids.complete(cqe.cid()).ok()
    }

    /// The DeviceFault for a CQE [`IoQueuePair::validate`] refused (checked
    /// again here, off the hot path, to say what was wrong); fails the
    /// controller.
    #[cold]
    #[inline(never)]
    fn bad_completion(&mut self, cqe: &Cqe) -> Error {
        self.failed = true;
        let what = if cqe.sqid() != self.qid {
            format!(
                "completion on CQ {} names SQ {} (cid 0x{:04x})",
                self.qid,
                cqe.sqid(),
                cqe.cid()
            )
        } else if let Err(e) = self.sq_ring.update_head(cqe.sqhd()) {
            format!("queue {}: {e}", self.qid)
        } else {
            match self.cids.validate(cqe.cid()) {
                Err(e) => format!("queue {}: {e}", self.qid),
                Ok(_) => format!(
                    "queue {}: completion refused (cid 0x{:04x})",
                    self.qid,
                    cqe.cid()
                ),
            }
        };
        self.ctrl.fault(what)
    }

    /// Writes the CQ head doorbell if it is due (see doorbell.rs).
    #[inline(always)]
    fn update_cq_head(&mut self) {
        let u = self.cq_ring.uncommitted();
        // The moderation rule applies with shadow doorbells too: a controller
        // that sets the CQ EventIdx to the head it last saw (QEMU does) would
        // otherwise ask for an MMIO write on every reap.
        let due = match self.policy {
            CqHeadPolicy::EveryReap => true,
            CqHeadPolicy::Adaptive { batch } => u > self.cq_slack || (batch > 0 && u >= batch),
        };
        if due {
            if let Some(head) = self.cq_ring.commit() {
                let shadow = self
                    .ctrl
                    .shadow
                    .as_ref()
                    .map(|s| (&s.doorbells, &s.event_idx));
                self.doorbells
                    .ring_cq(&self.ctrl.dev, shadow, head, &mut self.stats);
            }
        } else {
            self.stats.cq_doorbell_skipped += 1;
        }
    }

    // ------------------------------------------------------------ blocking

    /// Submits `cmd` and waits for its completion, at most `timeout`. Other
    /// completions that arrive meanwhile are kept for `process_completions`.
    ///
    /// On an NVMe error status the buffer comes back in the [`IoFailure`]. On
    /// timeout the command stays in flight and keeps its buffer (the device may
    /// still write it); its completion surfaces later from
    /// `process_completions` with tag [`BLOCKING_TAG`].
    pub fn execute_blocking(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        timeout: Duration,
    ) -> std::result::Result<Option<DmaBuffer>, IoFailure> {
        let slot = match self.queue_inner(cmd, buffer.as_ref(), BLOCKING_TAG) {
            Ok(slot) => slot,
            Err(error) => return Err(IoFailure { error, buffer }),
        };
        self.trackers[slot as usize].buffer = buffer;
        self.publish_early();
        // No opportunistic reap here: the loop below reaps, and knows which
        // completion is ours by its slot.
        let reap_on_submit = std::mem::replace(&mut self.reap_on_submit, false);
        self.ring();
        self.reap_on_submit = reap_on_submit;
        let start = Instant::now();
        let mut empty = 0u32;
        loop {
            let mut mine = None;
            let mut ready = std::mem::take(&mut self.ready);
            let r = self.reap(u32::MAX, &mut |s, c| {
                if s == slot && mine.is_none() {
                    mine = Some(c);
                } else {
                    ready.push_back((s, c));
                }
            });
            self.ready = ready;
            if let Err(error) = r {
                // Our own completion may have come in the same batch as the
                // fault: its buffer is the caller's again.
                return Err(IoFailure {
                    error,
                    buffer: mine.and_then(|c| c.buffer),
                });
            }
            if let Some(c) = mine {
                return finish_blocking(c, &cmd);
            }
            if !self.cids.is_in_flight(slot) {
                // A reset handled by `ring` or by a timeout scan ended the
                // command and parked its completion in `ready`; the newest
                // entry for this slot is ours (nothing was queued since).
                if let Some(i) = self.ready.iter().rposition(|(s, _)| *s == slot)
                    && let Some((_, c)) = self.ready.remove(i)
                {
                    return finish_blocking(c, &cmd);
                }
            }
            if self.generation_changed() {
                // A reset ended the command: it completes here, once.
                let c = self.end_in_flight(slot, false);
                let _ = self.sync_generation();
                return finish_blocking(c, &cmd);
            }
            empty = empty.saturating_add(1);
            // Clock reads, CSTS checks and back-off only every so often: no PAUSE
            // and no clock_gettime in the tight loop.
            if empty % 1024 == 0 {
                if start.elapsed() >= timeout {
                    return Err(IoFailure {
                        error: Error::Timeout {
                            what: format!("{} on queue {}", cmd.name(), self.qid),
                            after: start.elapsed(),
                        },
                        buffer: None,
                    });
                }
                if let Err(error) = self.check_usable() {
                    return Err(IoFailure {
                        error,
                        buffer: None,
                    });
                }
                if empty % (16 * 1024) == 0 {
                    // A dead or fatally failed controller ends the wait early.
                    match crate::admin::check_csts(&self.ctrl.dev, &self.ctrl.name) {
                        Ok(_) => {}
                        Err(Error::ControllerFatal { .. }) => {
                            let _ = self.ctrl.reset();
                            continue;
                        }
                        Err(error) => {
                            self.ctrl.mark_failed(&error);
                            return Err(IoFailure {
                                error,
                                buffer: None,
                            });
                        }
                    }
                }
                if self.timeout_ticks > 0
                    && let Err(error) = self.check_timeouts()
                {
                    return Err(IoFailure {
                        error,
                        buffer: None,
                    });
                }
            }
            if empty > self.backoff.spin_polls {
                match self.backoff.sleep {
                    Some(d) => std::thread::sleep(d),
                    None => std::thread::yield_now(),
                }
            }
        }
    }

    /// Reads `blocks` logical blocks at `slba` into `buffer` and waits.
    pub fn read_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        timeout: Duration,
    ) -> std::result::Result<DmaBuffer, IoFailure> {
        self.execute_blocking(
            IoCommand::Read { nsid, slba, blocks },
            Some(buffer),
            timeout,
        )
        .and_then(need_buffer)
    }

    /// Writes `blocks` logical blocks at `slba` from `buffer` and waits.
    pub fn write_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        timeout: Duration,
    ) -> std::result::Result<DmaBuffer, IoFailure> {
        self.execute_blocking(
            IoCommand::Write { nsid, slba, blocks },
            Some(buffer),
            timeout,
        )
        .and_then(need_buffer)
    }
}

fn need_buffer(b: Option<DmaBuffer>) -> std::result::Result<DmaBuffer, IoFailure> {
    b.ok_or_else(|| IoFailure {
        error: Error::InvalidArgument("completion without its buffer".into()),
        buffer: None,
    })
}

fn finish_blocking(
    c: Completion,
    cmd: &IoCommand<'_>,
) -> std::result::Result<Option<DmaBuffer>, IoFailure> {
    match c.result {
        Ok(_) => Ok(c.buffer),
        Err(IoError::Status(status)) => Err(IoFailure {
            error: Error::Command {
                command: cmd.name().to_string(),
                status,
            },
            buffer: c.buffer,
        }),
        Err(e) => Err(IoFailure {
            error: Error::Io {
                command: cmd.name().to_string(),
                error: e,
            },
            buffer: c.buffer,
        }),
    }
}

impl<D: Device> Drop for IoQueuePair<D> {
    fn drop(&mut self) {
        // Delete I/O SQ first: the controller completes or aborts every command
        // in it before the deletion completes; then the CQ. After both, the
        // device cannot touch the queues or any command's buffer.
        let generation = self.ctrl.generation();
        if generation != self.generation || self.needs_recreate {
            // A reset disabled the controller since these queues were created:
            // they no longer exist and nothing can reach their memory.
            self.ctrl.free_qid(self.qid);
            return;
        }
        let deleted = self.ctrl.is_usable()
            && self
                .ctrl
                .admin_command(Sqe::delete_io_sq(self.qid), "Delete I/O Submission Queue")
                .is_ok()
            && self
                .ctrl
                .admin_command(Sqe::delete_io_cq(self.qid), "Delete I/O Completion Queue")
                .is_ok();
        if !deleted {
            // The device may still DMA: keep everything it could touch alive
            // until the controller is disabled.
            let mut keep: Vec<DmaBuffer> = self
                .trackers
                .iter_mut()
                .filter_map(|t| t.buffer.take())
                .collect();
            keep.push(self.sq.take_ownership());
            keep.push(self.cq.take_ownership());
            keep.push(self.prp_lists.take_ownership());
            self.ctrl.quarantine(keep);
        }
        self.ctrl.free_qid(self.qid);
    }
}

//! Polled I/O queue pairs: the hot path.
//!
//! One [`IoQueuePair`] is one I/O submission queue and its own completion queue,
//! created with interrupts disabled (Create I/O Completion Queue with IEN = 0,
//! no vector). It is `Send` but not `Sync`: one owner thread drives it, so the
//! I/O path takes no lock and allocates nothing.
//!
//! Where each concern lives: [`options`](QueuePairOptions) (what a pair can be
//! told), `create.rs` (Create I/O CQ/SQ, Delete on drop), `submit.rs` (SQE,
//! data pointer, doorbell), `reap.rs` (CQE checks, completion delivery, CQ
//! head), `recovery.rs` (timeouts, resets, device faults), `blocking.rs`
//! (`execute_blocking` and friends), `doorbell.rs` (the doorbell economy),
//! `stats.rs`, `command.rs` (what is submitted and what comes back),
//! `iodata.rs` (the memory a command transfers through: buffers, slices,
//! vectors), `plain.rs` (the plain Read/Write of one buffer, compiled on its
//! own), `metadata.rs` (data commands on formats with metadata and
//! protection information), `split.rs` (transfers above MDTS as several
//! commands with one completion), `limits.rs` (the NVM Command Set's
//! per-command size limits), `close.rs` (`close`: every command ends once),
//! `clock.rs` (the timeout scan's clock).
//!
//! ## Ordering contract (the reason this type is `!Sync`)
//!
//! Submission, in this order (`submit.rs`, `queue_sqe` then `submit`):
//! 1. the pair's state is checked (one load of the controller's state word
//!    against the pair's expected value) and the command validated; nothing
//!    has happened yet if either refuses;
//! 2. the tracker of the command's CID slot gets the caller's tag and buffer;
//! 3. CQ space is ensured (`cq_space_for_submit`: the CQ head doorbell is
//!    written first if more entries were consumed unannounced than the slack
//!    allows);
//! 4. a PRP List (or the Dataset Management ranges) goes into the slot's
//!    page, and the SQE is written into the SQ slot;
//! 5. the state word is checked once more (a reset from another thread may
//!    have deleted the queues), then the SQ tail doorbell (MMIO, or shadow +
//!    EventIdx check) is written — `Device::write32` orders the SQE stores
//!    before it;
//! 6. only then software bookkeeping (statistics) runs, while the device is
//!    already fetching the command.
//!
//! Step 6 after step 5 is safe because the CID → tracker entry was written in
//! step 2, before the device could see the command, and nothing can reap this
//! queue before the owner thread finishes submitting: the pair is single-owner
//! (`!Sync`, `&mut self` everywhere), and the opportunistic reap
//! (`reap_on_submit`) runs after the bookkeeping.
//!
//! Completion: the CQE's dword 3 (phase, status, CID) is read with an acquire
//! load before the rest of the entry; the SQ ID, the SQ head (inside the
//! window of announced commands) and the CID (slot and generation) are
//! checked, and only then are the tag and the buffer handed back.
//!
//! ## Submitting from the completion
//!
//! [`IoQueuePair::process_completions`] hands its callback the pair itself:
//! `|qp, c| { if let Err(r) = qp.submit(next, c.buffer, c.tag) { .. } }`
//! resubmits with the shortest turnaround, at any depth (a refusal hands
//! the buffer back in `r.buffer`), and [`IoQueuePair::next_completion`]
//! is the same as a lending iterator. The CQ-space argument (doorbell.rs)
//! stays true: a submission first writes the CQ head if more entries were
//! consumed unannounced than the slack allows (`cq_space_for_submit`), so
//! whenever the callback submits, the controller's free CQ space covers
//! every command that can be in flight; a reap writes it at its end when due.
//!
//! ## For the lowest latency at low depth
//!
//! When a completion leaves nothing in flight, the device idles until the
//! next SQ tail doorbell, so everything the application does between seeing
//! the completion and submitting again is part of the next round trip. Submit
//! the next command first (from the callback), and do the bookkeeping
//! (latency records, statistics) after [`IoQueuePair::submit`] returns. Under
//! QEMU that turnaround decides whether a QD1 round trip takes ~10 or ~22 µs
//! (docs/benchmarks.md, "Where the QD1 round trip goes").

mod blocking;
mod clock;
mod close;
mod command;
mod create;
mod doorbell;
mod iodata;
mod limits;
mod metadata;
mod options;
mod plain;
mod reap;
mod recovery;
mod split;
mod stats;
mod submit;

use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use upnvme_dma::{CqMemory, DmaBuffer, ListPages, SqMemory};
use upnvme_queues::{CidTable, CqRing, SqRing};

pub use command::{
    Completion, CopyRange, CopySource, DsmAttributes, IoCommand, IoFlags, Protection,
};
pub use doorbell::CqHeadPolicy;
use doorbell::Doorbells;
pub use iodata::{IoData, IoSegment, IoVec, SegmentOutOfBounds};
pub use options::{Backoff, QueuePairOptions, SglMode, SqAnnounce};
pub use stats::QueueStats;

use crate::controller::Inner;
use crate::device::{Device, VfioNvme};

/// NVMe memory page size used by the driver (CC.MPS = 0).
const PAGE: usize = 4096;
// `prp_pair_4k` is the fast path for this memory page size (CC.MPS = 0).
const _: () = assert!(PAGE == 4096);

/// The tag blocking helpers give their commands: if a blocking call times out,
/// its completion surfaces later from `process_completions` with this tag.
pub const BLOCKING_TAG: u64 = u64::MAX;

/// `IoQueuePair::expect_state` when the pair may not submit without the
/// cold path (failed, or its queues must be re-created): a value the
/// controller's state word never takes (closed and failed at the largest
/// generation).
const NEVER: u64 = u64::MAX;

/// Polls between two runs of the periodic work (command timeout scan).
const PERIODIC_POLLS: u32 = 1024;

/// How often the polled path reads CSTS while commands are in flight (at a
/// periodic run, so up to 1024 polls later). By time, not by polls: under
/// emulation an MMIO read waits for the emulator's lock, and one per 16 Ki
/// polls — hundreds a second at depth — cost 3–6% of QD128 IOPS in the guest.
const CSTS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Per-CID-slot state: who gets the completion and which buffer the device
/// owns. Kept in the [`CidTable`] slot of the command's CID.
#[derive(Debug, Default)]
struct Tracker {
    tag: u64,
    buffer: Option<DmaBuffer>,
    /// The vector of a vectored command.
    segments: Option<IoVec>,
    /// The separate metadata buffer of a command on a metadata namespace.
    metadata: Option<DmaBuffer>,
    /// Clock ticks (see `clock.rs`) when a timeout scan first saw the command
    /// in flight; 0 before.
    stamp: u64,
    /// Abort sent for this command (its deadline is then `stamp` + 2 x timeout).
    aborted: bool,
    /// `segments` or `metadata` may be `Some`: the reap takes them only
    /// then, so a plain command's completion never loads or clears them.
    /// False whenever both are `None` for a slot being filled or freed.
    /// Also set for a split's child, whose end goes to its parent.
    extras: bool,
    /// The command is a child of a split (split.rs): `tag` is the split's
    /// index, and the tracker holds no memory.
    child: bool,
    /// The SQ slot its SQE went into: with the committed SQ tail and the
    /// CID in that slot it tells, in constant time, whether the command
    /// was announced yet (a completion naming a command no doorbell covered
    /// is bogus; see `names_unannounced`).
    sq_pos: u16,
}

/// The memory a tracker holds for its command: buffer, vector, metadata.
type TrackedMemory = (Option<DmaBuffer>, Option<IoVec>, Option<DmaBuffer>);

impl Tracker {
    /// Takes everything the command's memory is (every path that frees a
    /// slot other than the reap's plain case goes through here).
    fn take_memory(&mut self) -> TrackedMemory {
        self.extras = false;
        self.child = false;
        (
            self.buffer.take(),
            self.segments.take(),
            self.metadata.take(),
        )
    }

    /// Every buffer the device may still reach through this tracker: the
    /// data buffer, the vector's buffers and the metadata buffer.
    fn take_buffers(&mut self) -> impl Iterator<Item = DmaBuffer> + use<> {
        let (buffer, segments, metadata) = self.take_memory();
        buffer
            .into_iter()
            .chain(segments.into_iter().flat_map(IoVec::into_buffers))
            .chain(metadata)
    }
}

/// A polled I/O submission/completion queue pair. See the module docs for the
/// ordering contract.
pub struct IoQueuePair<D: Device = VfioNvme> {
    // Grouped by use for the reader; rustc chooses the layout (no
    // `#[repr(C)]`), so no placement in cache lines is implied.
    /// `ctrl.state()` equals this exactly when the controller is usable, was
    /// not reset since this pair's queues were made, and the pair is neither
    /// failed nor waiting to re-create its queues ([`NEVER`] then).
    expect_state: u64,
    sq: SqMemory,
    sq_ring: SqRing,
    cq: CqMemory,
    cq_ring: CqRing,
    trackers: CidTable<Tracker>,
    doorbells: Doorbells,
    /// Write the CQ head when more than this many entries were consumed
    /// since the last write (see doorbell.rs).
    cq_threshold: u32,
    qid: u16,
    /// `qid << 16`: CQE dword 2 (SQ ID in the upper half, SQ head in the
    /// lower) xor this is the SQ head alone exactly when the SQ ID is
    /// `qid`, so the usual completion's SQ ID and SQ head are one compare.
    qid_dw2: u32,
    /// Announce a command through the shadow doorbell as it is queued when
    /// fewer tracker slots than this are free ([`SqAnnounce::free_below`];
    /// 0 without shadow doorbells and the EventIdx).
    announce_free_below: u32,
    /// `announce_free_below` while the controller has shadow doorbells on
    /// (they can go off and on again at a reset: `recreate`).
    announce_shadow: u32,
    /// After a reap, the CQ head is due when at least this many entries are
    /// unannounced: `cq_threshold + 1`, or 0 with `CqHeadPolicy::EveryReap`
    /// (always, as the policy says; the write itself is skipped when a
    /// submission from the callback already made it).
    reap_due_at: u32,
    reap_on_submit: bool,
    /// Polls left until the periodic work (the command timeout scan); the
    /// polls counted down are also the ones `stats.polls` does not hold yet.
    poll_countdown: u32,
    /// When (clock ticks) the polled path reads CSTS next ([`CSTS_INTERVAL`]).
    csts_due: u64,
    /// The controller instance (namespace handles of other controllers are
    /// refused).
    instance: u64,
    /// The IOMMU mapping of this controller's memory (`DmaBuffer::domain`
    /// of the pair's own SQ): a command's buffers must live in it.
    domain: usize,
    max_transfer: usize,
    /// The controller's SGL support (Identify Controller SGLS).
    sgl: upnvme_queues::sgl::SglSupport,
    sgl_mode: SglMode,
    /// Identify Controller SGLS SDT (SGL Descriptor Threshold): with
    /// [`SglMode::Auto`], a vector of more pieces than this goes as PRPs
    /// where PRPs can describe it. `usize::MAX` when the controller
    /// reports none.
    sgl_threshold: usize,
    /// Identify Controller ONCS: optional commands are refused unless set.
    oncs: u16,
    /// The NVM Command Set's size limits (limits.rs).
    limits: limits::SizeLimits,
    /// A contiguous transfer ending at most this far past its first page's
    /// start goes in PRP1/PRP2 directly: two memory pages, or 0 with
    /// [`SglMode::Always`] (every transfer then takes the SGL path).
    inline_prp_end: usize,
    stats: QueueStats,
    /// Completions reaped on behalf of the owner (by `reap_on_submit` or a
    /// blocking helper), with their slot, delivered by the next
    /// `process_completions`. Capacity `max_depth`: pushing never allocates.
    ready: VecDeque<(split::Key, Completion)>,
    /// Split commands waiting for their children (split.rs).
    splits: split::Splits,
    max_depth: u32,
    /// Commands queued since the last `ring`: counted as submissions (and,
    /// with MMIO doorbells, announced) by `ring`.
    pending: u32,
    failed: bool,
    /// The queues must be re-created (after a reset) before the next command.
    needs_recreate: bool,
    /// A re-creation after a reset may have left queues on this pair's
    /// memory: it got no answer (timeout, device fault: the controller may
    /// yet create them), or its SQ was refused and the CQ could not be
    /// deleted again. Until the next reset the queues count as existing
    /// (deleted on drop, or their memory quarantined and the ID held).
    recreated_maybe: bool,
    /// Failed re-creations in a row and when the next may be tried.
    recreate_retry: recovery::RecreateRetry,
    /// `close` deleted the queues already (Drop has nothing left to delete).
    deleted: bool,
    /// `close` is deleting the queues: what the deletion aborts ends with
    /// `IoError::QueueDeleted`.
    closing: bool,
    /// While `close` drains: when its timeout ends. The polled path's
    /// timeout scan then keeps to it as a blocking wait's does
    /// (`IoQueuePair::check_timeouts_within`); `None` otherwise.
    drain_deadline: Option<std::time::Instant>,
    /// Controller reset generation this pair's queues belong to.
    generation: u64,
    /// List pages (PRP Lists, SGL segments, ranges): one area of whole
    /// pages per tracker slot.
    lists: ListPages,
    prp_scratch: Box<[u64]>,
    backoff: Backoff,
    /// Command timeout in clock ticks (0 = none).
    timeout_ticks: u64,
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
            .field("in_flight", &self.trackers.in_flight())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<D: Device> IoQueuePair<D> {
    /// Recomputes [`IoQueuePair::expect_state`] after `failed`,
    /// `needs_recreate` or `generation` changed.
    fn refresh_expect_state(&mut self) {
        self.expect_state = if self.failed || self.needs_recreate {
            NEVER
        } else {
            self.generation << crate::controller::STATE_GENERATION_SHIFT
        };
    }

    /// Marks the pair failed (a device fault on its queues).
    fn set_failed(&mut self) {
        self.failed = true;
        self.refresh_expect_state();
    }

    /// One load: the controller is usable, was not reset since this pair's
    /// queues were created, and the pair itself is fine.
    #[inline(always)]
    fn current(&self) -> bool {
        self.ctrl.state() == self.expect_state
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
        self.trackers.in_flight()
    }

    /// Largest data transfer of one command in bytes (from MDTS).
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// When this pair's data pointers are SGLs.
    pub fn sgl_mode(&self) -> SglMode {
        self.sgl_mode
    }

    /// Whether the shadow doorbell buffer is in use for this pair. Taken
    /// when the pair creates its queues: after a controller reset it says
    /// the mode of the queues before it until the pair's next call
    /// re-creates them with the reset's mode
    /// ([`crate::Controller::shadow_doorbells`]).
    pub fn shadow_doorbells(&self) -> bool {
        self.doorbells.shadow.is_some()
    }

    /// The counters.
    pub fn stats(&self) -> QueueStats {
        let mut s = self.stats;
        s.polls = s.polls.wrapping_add(self.polls_since_periodic());
        s
    }

    /// Resets the counters to zero (e.g. after a warm-up).
    pub fn reset_stats(&mut self) {
        self.stats = QueueStats {
            // `stats()` adds the polls of this period back.
            polls: 0u64.wrapping_sub(self.polls_since_periodic()),
            ..QueueStats::default()
        };
    }

    /// `process_completions` polls since the periodic work last ran: they
    /// are counted by the countdown alone, and added to `stats.polls` when
    /// it runs out (one counter per poll, not two).
    fn polls_since_periodic(&self) -> u64 {
        u64::from(PERIODIC_POLLS - self.poll_countdown)
    }
}

//! An in-memory NVMe controller that implements [`upnvme::Device`].
//!
//! [`ModelController`] is a controller in the sense of the NVMe Base
//! Specification 2.0: a register file (§3.1.3), an admin queue and I/O queues
//! in host memory, admin and NVM commands, completions with phase tags.
//! The driver reaches it only through [`Device`]: register reads and writes,
//! and DMA memory from [`Device::alloc_dma`], which the model maps at fake
//! IOVAs in its own IOMMU table so that it can fetch submission queue entries,
//! walk PRP lists, move data and post completion queue entries by IOVA — as a
//! PCIe device does.
//!
//! Work happens synchronously inside the MMIO doorbell write that makes it
//! due ([`Device::write32`]): every submission queue entry between the
//! model's head and the new tail is fetched, executed and completed before
//! `write32` returns, unless a [`Fault`] holds the completion back or the
//! completion queue is full.
//!
//! # A checker as well as a device
//!
//! A hostile or buggy driver cannot make the model panic; what it does wrong
//! is recorded and the offending access is ignored, as a controller would
//! ignore it. Tests assert that [`ModelController::violations`] is empty and
//! [`ModelController::dma_faults`] is 0. Recorded violations include: SQ tail
//! or CQ head doorbells beyond the queue size or for queues that do not
//! exist, a CQ head doorbell that releases entries not yet posted, a
//! completion due while the completion queue is full ("Full Queue": the
//! controller may not post; the completion is held until the host moves the
//! head), doorbells while the controller is not ready, a command identifier
//! reused while its command is outstanding, CC fields changed while enabled,
//! CC.EN set again before CSTS.RDY returned to 0, CC.EN cleared while
//! CSTS.RDY is still on its way to 1, invalid register accesses,
//! a data pointer the host may not build (a PRP offset rule broken, an SGL
//! that is malformed — a segment off a qword among them — or does not
//! describe the transfer exactly, PSDT the
//! controller does not offer, an SGL on an admin command) and a transfer
//! above MDTS — these also complete with the error status QEMU gives.
//!
//! Where QEMU's hw/nvme is stricter than the specification requires, the
//! model follows QEMU (model/tests/spec_strictness.rs): PRP List chain
//! pointers with offset 0, no SGLs on admin commands, Get Log Page within
//! MDTS, Number of Queues refused once I/O queues were created until a
//! reset, an event type masked once reported until its log page is read
//! (RAE clear) or the controller is reset.
//!
//! # Example
//!
//! ```no_run
//! use upnvme::Device;
//! use upnvme_tests::{ModelConfig, ModelController};
//!
//! let model = ModelController::new(ModelConfig::default());
//! let cap = model.read64(0);
//! assert_eq!(cap & 0xffff, 2047); // CAP.MQES
//! // ... drive it with the driver, then:
//! assert!(model.violations().is_empty());
//! assert_eq!(model.dma_faults(), 0);
//! ```

mod admin;
mod command;
mod config;
mod engine;
mod faults;
mod features;
mod identify;
mod io;
mod logs;
mod memory;
mod pi;
mod post;
mod prp;
mod regs;
mod sgl;
mod shadow;
mod state;
mod status;
mod storage;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use upnvme::{Device, ReadOnlyMemory};
use upnvme_dma::{DeviceAccess, DmaAllocator, DmaBuffer, DmaError, PageBacking};

pub use config::{ModelConfig, NamespaceConfig, NvmLimitsConfig};
pub use faults::{Fault, Match};
pub use status::Status;

use memory::IovaTable;
use state::State;

/// The model's view of a submission queue (for test assertions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqState {
    /// Number of entries.
    pub size: u32,
    /// SQ Head Pointer: the next entry the model fetches.
    pub head: u32,
    /// Tail as last written by the host.
    pub tail: u32,
    /// Completion queue the SQ completes to.
    pub cqid: u16,
}

/// The model's view of a completion queue (for test assertions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqState {
    /// Number of entries.
    pub size: u32,
    /// Head as last written by the host (MMIO or shadow doorbell).
    pub head: u32,
    /// Next slot the model posts to.
    pub tail: u32,
    /// Phase Tag of the next entry the model posts.
    pub phase: bool,
    /// Completions due but held because the queue is full.
    pub backlog: usize,
    /// Create I/O CQ IEN (Interrupts Enabled) as the host set it.
    pub interrupts_enabled: bool,
}

struct Shared {
    table: Arc<IovaTable>,
    alloc: DmaAllocator,
    /// [`Device::alloc_dma_device_read_only`]'s memory: the model refuses
    /// its own writes there, as an IOMMU does.
    alloc_read_only: DmaAllocator,
    state: Mutex<State>,
    release: Arc<ModelRelease>,
}

/// The model's device request channel (VFIO's `VFIO_PCI_REQ_IRQ_INDEX`
/// stand-in): offered to the driver after [`ModelController::offer_release_request`].
#[derive(Default)]
struct ModelRelease {
    offered: std::sync::atomic::AtomicBool,
    raised: Mutex<bool>,
    cv: std::sync::Condvar,
    released: std::sync::atomic::AtomicBool,
    /// CC.EN was 0 when the driver released the device.
    disabled_first: std::sync::atomic::AtomicBool,
}

impl upnvme::ReleaseRequest for ModelRelease {
    fn wait(&self, timeout: std::time::Duration) -> bool {
        let g = self.raised.lock().unwrap_or_else(|p| p.into_inner());
        let (mut g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |r| !*r)
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *g)
    }
}

/// An in-memory NVMe controller; see the [module documentation](self).
///
/// A cheap handle: clones share one controller, so a test can keep one while
/// the driver owns another (as `Arc<dyn Device>`).
#[derive(Clone)]
pub struct ModelController {
    inner: Arc<Shared>,
}

impl fmt::Debug for ModelController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state();
        f.debug_struct("ModelController")
            .field("serial", &s.cfg.serial)
            .field("cc", &format_args!("{:#x}", s.regs.cc))
            .field("csts", &format_args!("{:#x}", s.csts_peek()))
            .field("queues", &s.sqs.len())
            .field("violations", &s.stats.violations.len())
            .field("dma_faults", &s.stats.dma_faults)
            .finish()
    }
}

impl ModelController {
    /// A powered-on, disabled controller (CC.EN = 0) with empty namespaces.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid ([`ModelConfig::validate`]): that is a
    /// mistake in the test, not input from the driver.
    pub fn new(config: ModelConfig) -> Self {
        match Self::try_new(config) {
            Ok(m) => m,
            Err(e) => panic!("invalid ModelConfig: {e}"),
        }
    }

    /// As [`ModelController::new`], returning configuration errors.
    pub fn try_new(config: ModelConfig) -> Result<Self, String> {
        config.validate()?;
        let table = Arc::new(IovaTable::new(config.refuse_read_only_mappings));
        let alloc = DmaAllocator::new(table.clone(), PageBacking::Small4K);
        let alloc_read_only =
            DmaAllocator::with_access(table.clone(), PageBacking::Small4K, DeviceAccess::ReadOnly);
        let state = Mutex::new(State::new(config, table.clone()));
        Ok(ModelController {
            inner: Arc::new(Shared {
                table,
                alloc,
                alloc_read_only,
                state,
                release: Arc::default(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> ModelConfig {
        self.state().cfg.clone()
    }

    // ----- fault injection -------------------------------------------------

    /// Queues a one-shot [`Fault`].
    pub fn inject(&self, fault: Fault) {
        self.state().faults.push(fault);
    }

    /// Faults injected and not yet consumed.
    pub fn pending_faults(&self) -> Vec<Fault> {
        self.state().faults.pending()
    }

    /// Removes every fault not yet consumed.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Posts every completion held by [`Fault::DelayCompletion`] now (subject
    /// to completion queue space); returns how many were released.
    pub fn release_delayed(&self) -> usize {
        self.state().release_all_delayed()
    }

    /// Number of completions currently held by [`Fault::DelayCompletion`].
    pub fn delayed_completions(&self) -> usize {
        self.state().held.len()
    }

    /// Commands whose completion was dropped by [`Fault::DropCompletion`] and
    /// that the controller has not forgotten (by reset or SQ deletion), as
    /// (SQ id, CID).
    pub fn dropped_completions(&self) -> Vec<(u16, u16)> {
        self.state().dropped.clone()
    }

    /// Sets CSTS.CFS (Controller Fatal Status) now: from here on
    /// nothing is fetched or completed until the host resets the controller
    /// (CC.EN 1→0, which clears CFS).
    pub fn set_fatal(&self) {
        self.state().fatal = true;
    }

    /// Surprise removal: every register read returns all ones, writes and
    /// doorbells are ignored, no completion is ever posted again. DMA memory
    /// allocation keeps working (it is host memory).
    pub fn unplug(&self) {
        self.state().gone = true;
    }

    /// Offers the driver a device request channel (as VFIO does): a
    /// controller opened after this call watches it. Off by default.
    pub fn offer_release_request(&self) {
        self.inner.release.offered.store(true, Ordering::SeqCst);
    }

    /// The kernel asks for the device back (a removal or an unbind): raises
    /// the request the driver watches.
    pub fn request_release(&self) {
        *self
            .inner
            .release
            .raised
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = true;
        self.inner.release.cv.notify_all();
    }

    /// Whether the driver released the device (`Device::release`); from then
    /// on the model behaves as unplugged.
    pub fn is_released(&self) -> bool {
        self.inner.release.released.load(Ordering::SeqCst)
    }

    /// Whether CC.EN was 0 when the driver released the device.
    pub fn disabled_before_release(&self) -> bool {
        self.inner.release.disabled_first.load(Ordering::SeqCst)
    }

    /// True after [`ModelController::unplug`] or [`Fault::UnplugOn`].
    pub fn is_unplugged(&self) -> bool {
        self.state().gone
    }

    /// Raises an asynchronous event (Asynchronous Event Request, §5.2):
    /// completes one outstanding
    /// Asynchronous Event Request with dword 0 = Asynchronous Event Type
    /// (2:0) | Asynchronous Event Information (15:8) | Log Page Identifier
    /// (23:16), or keeps the event until the host posts a request.
    pub fn raise_async_event(&self, event_type: u8, info: u8, log_page: u8) {
        let event = u32::from(event_type & 7) | u32::from(info) << 8 | u32::from(log_page) << 16;
        self.state().async_event(event);
    }

    /// Another host changes namespace `nsid` (nothing the driver sent):
    /// `Some(cfg)` formats or resizes it to `cfg` (its data reads as zeros
    /// afterwards) or attaches it if it was not attached, `None` detaches
    /// it. The namespace is listed in the Changed Namespace List (log 04h)
    /// and, if the host enabled Namespace Attribute Notices (Asynchronous
    /// Event Configuration bit 8), a Notice / Namespace Attribute Changed
    /// event is raised (once until the host reads log 04h).
    pub fn change_namespace(&self, nsid: u32, cfg: Option<NamespaceConfig>) {
        self.state().change_namespace(nsid, cfg);
    }

    /// [`ModelController::change_namespace`] by a controller that does not
    /// keep the rules: the namespace is listed in the Changed Namespace List
    /// only when `listed`, and the event is raised only when `notice` (and
    /// the host enabled the notices and read log 04h since the last one).
    /// A host learns of a change neither listed nor noticed only by reading
    /// Identify Namespace again.
    pub fn change_namespace_unannounced(
        &self,
        nsid: u32,
        cfg: Option<NamespaceConfig>,
        listed: bool,
        notice: bool,
    ) {
        self.state()
            .change_namespace_with(nsid, cfg, listed, notice);
    }

    /// The Changed Namespace List (log 04h) as the next Get Log Page would
    /// return it: the NSIDs listed since the host last read it with Retain
    /// Asynchronous Event clear, `None` when more than 1024 changed (the
    /// first entry FFFFFFFFh).
    pub fn changed_namespace_list(&self) -> Option<Vec<u32>> {
        let s = self.state();
        (!s.changed_overflow).then(|| s.changed_nsids.clone())
    }

    /// Namespace `nsid` as it is now (after changes and Format NVM), `None`
    /// when it is not attached.
    pub fn namespace_config(&self, nsid: u32) -> Option<NamespaceConfig> {
        let s = self.state();
        s.namespace(nsid).map(|i| s.namespaces[i].cfg)
    }

    /// Sets the SMART / Health Information log's Critical Warning byte (for
    /// example before raising a SMART / Health asynchronous event).
    pub fn set_critical_warning(&self, warning: u8) {
        self.state().health.critical_warning = warning;
    }

    /// Asynchronous Event Requests the model holds outstanding.
    pub fn outstanding_async_requests(&self) -> usize {
        self.state().aers.len()
    }

    /// Simulates a controller that polls the shadow doorbell buffer (§5.8):
    /// reads every I/O queue's shadow SQ tail and CQ head, processes new
    /// commands, posts what is due and updates the EventIdx buffer — without
    /// an MMIO doorbell write. Does nothing before Doorbell Buffer Config or
    /// while the controller is not ready.
    pub fn process_shadow(&self) {
        let mut s = self.state();
        if s.shadow.is_some() && s.regs.rdy && !s.shut_down {
            s.wake();
        }
    }

    /// While `frozen`, the model leaves the EventIdx buffer unchanged after
    /// it processes (NVMe 2.0 §5.8 lets a controller move its EventIdx when
    /// it likes): the host's EventIdx checks then see a controller that has
    /// not caught up and skip MMIO writes, so only `process_shadow` (a
    /// controller polling the shadow doorbells) picks those commands up.
    pub fn freeze_event_idx(&self, frozen: bool) {
        self.state().event_idx_frozen = frozen;
    }

    /// While `frozen`, every completion for SQ `qid` reports the SQ Head
    /// Pointer the queue had when it was frozen, however far the model
    /// fetches: a controller whose SQHD never moves. Deleting the queue or
    /// resetting the controller ends it. Returns false when SQ `qid` does
    /// not exist.
    pub fn freeze_sq_head(&self, qid: u16, frozen: bool) -> bool {
        let mut st = self.state();
        let Some(sq) = st.sqs.get_mut(&qid) else {
            return false;
        };
        sq.frozen_head = frozen.then_some(sq.head);
        true
    }

    /// Writes a hand-made completion queue entry into the next slot of
    /// completion queue `cqid`, as if the controller posted it: `dwords` are
    /// CQE dwords 0-3 (Completion Queue Entry layout) and the Phase Tag (dword 3 bit 16) is
    /// replaced by the queue's current phase so the host sees a new entry.
    /// For hostile-completion and fuzz tests: any CID, SQ head, SQ id or
    /// status. Returns false (and posts nothing) when the queue does not
    /// exist, is full, or the controller is failed or unplugged.
    pub fn post_raw_completion(&self, cqid: u16, dwords: [u32; 4]) -> bool {
        self.state().post_raw(cqid, dwords)
    }

    /// Makes Identify with this CNS and NSID return `data` (zero-padded or
    /// cut to 4096 bytes) instead of the model's own structure, or restores
    /// the model's own with `None`. For tests that feed the driver unusual
    /// or hostile Identify data.
    pub fn set_identify_data(&self, cns: u8, nsid: u32, data: Option<Vec<u8>>) {
        let mut s = self.state();
        match data {
            Some(d) => s.identify_overrides.insert((cns, nsid), d),
            None => s.identify_overrides.remove(&(cns, nsid)),
        };
    }

    // ----- inspection ------------------------------------------------------

    /// Every protocol violation by the host recorded so far, oldest first.
    pub fn violations(&self) -> Vec<String> {
        let s = self.state();
        let mut v = s.stats.violations.clone();
        if s.stats.violations_lost > 0 {
            v.push(format!("... and {} more", s.stats.violations_lost));
        }
        v
    }

    /// Returns the violations recorded so far and forgets them (for tests
    /// that provoke violations on purpose).
    pub fn take_violations(&self) -> Vec<String> {
        let mut s = self.state();
        s.stats.violations_lost = 0;
        std::mem::take(&mut s.stats.violations)
    }

    /// Number of DMA accesses the model attempted to IOVAs that are not
    /// mapped — the equivalent of the guest's DMAR fault count. Each faulting
    /// command completed with Data Transfer Error.
    pub fn dma_faults(&self) -> u64 {
        self.state().stats.dma_faults
    }

    /// Set Features Host Behavior Support commands the model accepted
    /// (with `ModelConfig::elbas`, or OCFS reporting Format 2h or 3h),
    /// resets included.
    pub fn host_behavior_sets(&self) -> u32 {
        self.state().stats.hbs_sets
    }

    /// The Host Behavior Support data structure (FID 16h, 512 bytes) the
    /// host set last, `None` when none was set since the last Controller
    /// Level Reset (which sets features back to their defaults).
    pub fn host_behavior(&self) -> Option<Vec<u8>> {
        self.state().features.hbs.clone()
    }

    /// Descriptions of the DMA faults (what was accessed, where).
    pub fn dma_fault_log(&self) -> Vec<String> {
        self.state().stats.dma_fault_log.clone()
    }

    /// MMIO doorbell writes to queue `qid`: (SQ tail doorbell, CQ head
    /// doorbell), counting every write, valid or not.
    pub fn doorbell_writes(&self, qid: u16) -> (u64, u64) {
        self.state()
            .stats
            .doorbells
            .get(&qid)
            .copied()
            .unwrap_or_default()
    }

    /// MMIO doorbell writes to all queues.
    pub fn total_doorbell_writes(&self) -> u64 {
        self.state().stats.doorbell_total
    }

    /// Every command fetched, in order: (SQ id, opcode, CID). The log keeps
    /// the first 2^20 commands; [`ModelController::commands_fetched`] counts
    /// them all.
    pub fn commands_seen(&self) -> Vec<(u16, u8, u16)> {
        self.state().stats.seen.clone()
    }

    /// Number of commands fetched since the model was created (what
    /// [`Match::Nth`] counts).
    pub fn commands_fetched(&self) -> u64 {
        self.state().stats.fetched
    }

    /// How the device may reach `iova`: `None` where nothing is mapped,
    /// [`DeviceAccess::ReadOnly`] in memory the driver took from
    /// [`Device::alloc_dma_device_read_only`] (a device write there is a DMA
    /// fault, as under an IOMMU).
    pub fn device_access(&self, iova: u64) -> Option<DeviceAccess> {
        self.inner.table.read_only_at(iova).map(|ro| {
            if ro {
                DeviceAccess::ReadOnly
            } else {
                DeviceAccess::ReadWrite
            }
        })
    }

    /// The last 64 commands fetched from any SQ: (SQ id, the 64-byte SQE as the model fetched it), oldest first.
    pub fn recent_commands(&self) -> Vec<(u16, [u8; 64])> {
        self.state().stats.recent.iter().copied().collect()
    }

    /// The opcode and CDW12 (bytes 51:48 of the SQE) of the newest I/O
    /// command fetched (any SQ but the admin SQ), if any.
    pub fn last_io_cdw12(&self) -> Option<(u8, u32)> {
        self.state()
            .stats
            .recent
            .iter()
            .rev()
            .find(|(q, _)| *q != 0)
            .map(|(_, raw)| {
                (
                    raw[0],
                    u32::from_le_bytes([raw[48], raw[49], raw[50], raw[51]]),
                )
            })
    }

    /// Data transfers the model walked, by encoding: (PRP, SGL).
    pub fn transfers_by_encoding(&self) -> (u64, u64) {
        let s = self.state();
        (s.stats.prp_transfers, s.stats.sgl_transfers)
    }

    /// Reads `blocks` logical blocks of namespace `nsid` from `lba`
    /// (unwritten or deallocated blocks read as zeros).
    ///
    /// # Panics
    ///
    /// If the namespace does not exist or the range is outside it (a test
    /// mistake).
    pub fn namespace_data(&self, nsid: u32, lba: u64, blocks: u64) -> Vec<u8> {
        self.with_range(nsid, lba, blocks, |ns| ns.read(lba, blocks))
    }

    /// The metadata of `blocks` logical blocks of namespace `nsid` from
    /// `lba` (LBAF.MS bytes each; unwritten blocks read as zeros with an
    /// all-FFh PI tuple).
    ///
    /// # Panics
    ///
    /// If the namespace does not exist or the range is outside it.
    pub fn namespace_metadata(&self, nsid: u32, lba: u64, blocks: u64) -> Vec<u8> {
        self.with_range(nsid, lba, blocks, |ns| ns.read_meta(lba, blocks))
    }

    /// Runs `f` on namespace `nsid` once `[lba, lba + blocks)` is checked
    /// to lie inside it (panics otherwise: a test mistake).
    fn with_range<T>(
        &self,
        nsid: u32,
        lba: u64,
        blocks: u64,
        f: impl FnOnce(&storage::Namespace) -> T,
    ) -> T {
        let s = self.state();
        let ns = s
            .namespace(nsid)
            .and_then(|i| s.namespaces.get(i))
            .unwrap_or_else(|| panic!("no namespace {nsid}"));
        assert!(
            ns.in_range(lba, blocks),
            "LBA range outside namespace {nsid}"
        );
        f(ns)
    }

    /// Writes whole logical blocks of namespace `nsid` from `lba` directly
    /// (no command involved).
    ///
    /// # Panics
    ///
    /// If the namespace does not exist, `data` is not a whole number of
    /// blocks, or the range is outside the namespace (a test mistake).
    pub fn write_namespace_data(&self, nsid: u32, lba: u64, data: &[u8]) {
        let mut s = self.state();
        let i = s
            .namespace(nsid)
            .unwrap_or_else(|| panic!("no namespace {nsid}"));
        let Some(ns) = s.namespaces.get_mut(i) else {
            return;
        };
        let bs = ns.lba_size();
        assert!(
            data.len().is_multiple_of(bs),
            "data is not a whole number of {bs}-byte blocks"
        );
        assert!(
            ns.in_range(lba, (data.len() / bs) as u64),
            "LBA range outside namespace {nsid}"
        );
        ns.write(lba, data);
    }

    /// Number of blocks of namespace `nsid` that hold written data (not
    /// deallocated); 0 for an unknown namespace.
    pub fn allocated_blocks(&self, nsid: u32) -> u64 {
        let s = self.state();
        s.namespace(nsid)
            .and_then(|i| s.namespaces.get(i))
            .map_or(0, |ns| ns.allocated_blocks())
    }

    /// CC as last written by the host.
    pub fn cc(&self) -> u32 {
        self.state().regs.cc
    }

    /// CSTS as the host would read it now, without advancing delayed RDY or
    /// SHST transitions (reads all ones after unplug).
    pub fn csts(&self) -> u32 {
        let s = self.state();
        if s.gone { u32::MAX } else { s.csts_peek() }
    }

    /// True when a submission or completion queue with identifier `qid`
    /// exists (0 is the admin queue pair).
    pub fn queue_exists(&self, qid: u16) -> bool {
        let s = self.state();
        s.sqs.contains_key(&qid) || s.cqs.contains_key(&qid)
    }

    /// The model's view of submission queue `qid`.
    pub fn sq_state(&self, qid: u16) -> Option<SqState> {
        self.state().sqs.get(&qid).map(|q| SqState {
            size: q.size,
            head: q.head,
            tail: q.tail,
            cqid: q.cqid,
        })
    }

    /// The model's view of completion queue `qid`.
    pub fn cq_state(&self, qid: u16) -> Option<CqState> {
        self.state().cqs.get(&qid).map(|q| CqState {
            size: q.size,
            head: q.head,
            tail: q.tail,
            phase: q.phase,
            backlog: q.backlog.len(),
            interrupts_enabled: q.ien,
        })
    }

    /// Whether Create I/O Completion Queue set IEN (Interrupts Enabled) for
    /// `qid`; `None` if the queue does not exist.
    pub fn cq_interrupts_enabled(&self, qid: u16) -> Option<bool> {
        self.state().cqs.get(&qid).map(|q| q.ien)
    }

    /// The shadow doorbell configuration from Doorbell Buffer Config:
    /// (Shadow Doorbell buffer IOVA, EventIdx buffer IOVA).
    pub fn shadow_config(&self) -> Option<(u64, u64)> {
        self.state().shadow.map(|s| (s.db, s.ei))
    }

    /// I/O queues granted by Set Features — Number of Queues, as counts
    /// (submission queues, completion queues); `None` before the feature was
    /// set.
    pub fn granted_queues(&self) -> Option<(u16, u16)> {
        self.state()
            .features
            .granted
            .map(|(s, c)| (s.saturating_add(1), c.saturating_add(1)))
    }

    /// DMA buffers allocated from this model ([`Device::alloc_dma`] and
    /// [`Device::alloc_dma_device_read_only`]) and not yet given back
    /// (dropped, or leaked on purpose).
    pub fn live_dma_buffers(&self) -> usize {
        self.inner.alloc.live_buffers() + self.inner.alloc_read_only.live_buffers()
    }

    /// Number of DMA regions currently mapped in the model's IOMMU table.
    pub fn iova_mappings(&self) -> usize {
        self.inner.table.mappings()
    }

    /// Narrows the model's IOVA space to `bytes` beyond what is mapped now
    /// (each mapping also takes a 2 MiB-aligned span plus a 2 MiB guard
    /// gap), as an IOMMU with few address bits would: larger registrations
    /// are refused as larger than the IOVA window, and mappings that no
    /// longer fit as IOVA exhaustion.
    pub fn limit_iova_window(&self, bytes: u64) {
        self.inner.table.limit_window(bytes);
    }
}

impl Device for ModelController {
    fn read32(&self, offset: usize) -> u32 {
        self.state().read32(offset)
    }

    fn write32(&self, offset: usize, value: u32) {
        self.state().write32(offset, value);
    }

    fn read64(&self, offset: usize) -> u64 {
        self.state().read64(offset)
    }

    fn write64(&self, offset: usize, value: u64) {
        self.state().write64(offset, value);
    }

    fn bar_len(&self) -> usize {
        self.state().cfg.bar_len
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.inner.alloc.alloc(len)
    }

    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.inner.alloc_read_only.alloc_or(len, &self.inner.alloc)
    }

    fn read_only_memory(&self) -> ReadOnlyMemory {
        ReadOnlyMemory::from_fallbacks(self.inner.alloc_read_only.fallbacks())
    }

    fn name(&self) -> String {
        "model".into()
    }

    fn dma_mapper(&self) -> Option<Arc<dyn upnvme_dma::DmaMapper>> {
        Some(self.inner.table.clone())
    }

    fn release_request(&self) -> Option<Arc<dyn upnvme::ReleaseRequest>> {
        self.inner
            .release
            .offered
            .load(Ordering::SeqCst)
            .then(|| self.inner.release.clone() as Arc<dyn upnvme::ReleaseRequest>)
    }

    fn release(&self) -> bool {
        let mut s = self.state();
        let disabled = s.regs.cc & 1 == 0;
        s.gone = true;
        drop(s);
        let r = &self.inner.release;
        r.disabled_first.store(disabled, Ordering::SeqCst);
        r.released.store(true, Ordering::SeqCst);
        // A released model neither fetches nor posts anything any more.
        true
    }
}

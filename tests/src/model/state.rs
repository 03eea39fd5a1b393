//! The controller's mutable state behind the model's lock: queues, held
//! completions, features, counters, and the bookkeeping tests inspect.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::command::Command;
use super::config::ModelConfig;
use super::faults::{FaultQueue, Plan, PostMods};
use super::logs::{ErrorLog, Health};
use super::memory::{DmaFault, IovaTable};
use super::prp::{self, PrpError};
use super::regs::Regs;
use super::sgl::{self, SglError};
use super::status::Status;
use super::storage::Namespace;

/// At most this many violation messages are kept (the rest are counted).
const MAX_VIOLATIONS: usize = 10_000;
/// At most this many commands are kept in the log of fetched commands.
pub(crate) const MAX_SEEN: usize = 1 << 20;

/// A submission queue: where the model fetches from.
#[derive(Clone, Debug)]
pub(crate) struct SubQueue {
    /// IOVA of slot 0.
    pub base: u64,
    /// Number of entries (2 ..= 65536).
    pub size: u32,
    /// Next slot the model fetches (SQ Head Pointer).
    pub head: u32,
    /// Tail as last written by the host (SQyTDBL or its shadow).
    pub tail: u32,
    /// The completion queue its commands complete to.
    pub cqid: u16,
    /// While set, completions report this SQ Head Pointer whatever the
    /// model fetched ([`super::ModelController::freeze_sq_head`]).
    pub frozen_head: Option<u32>,
}

/// A completion held in a completion queue's backlog because the queue was
/// full (the spec forbids posting into a slot the host has not released).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    /// The completion.
    pub c: Completion,
    /// Corruptions to apply when it is written.
    pub mods: PostMods,
    /// False for an injected duplicate (never held, never a violation).
    pub counts: bool,
}

/// A completion queue: where the model posts to.
#[derive(Clone, Debug)]
pub(crate) struct CompQueue {
    /// IOVA of slot 0.
    pub base: u64,
    /// Number of entries (2 ..= 65536).
    pub size: u32,
    /// Head as last written by the host (CQyHDBL or its shadow).
    pub head: u32,
    /// Next slot the model posts to.
    pub tail: u32,
    /// Phase Tag the model writes into the next entry.
    pub phase: bool,
    /// Create I/O CQ IEN (Interrupts Enabled), recorded only.
    pub ien: bool,
    /// Completions due but not postable because the queue is full.
    pub backlog: VecDeque<Pending>,
}

impl CompQueue {
    /// A new queue: head = tail = 0, phase 1.
    pub fn new(base: u64, size: u32, ien: bool) -> Self {
        CompQueue {
            base,
            size,
            head: 0,
            tail: 0,
            phase: true,
            ien,
            backlog: VecDeque::new(),
        }
    }

    /// Full as the spec defines it ("Full Queue"): one slot short of wrapping
    /// onto the head the host last reported.
    pub fn is_full(&self) -> bool {
        (self.tail + 1) % self.size == self.head
    }

    /// Entries posted that the host has not released.
    pub fn posted(&self) -> u32 {
        (self.tail + self.size - self.head) % self.size
    }
}

/// A completion the model owes: created when a command finishes executing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    /// Submission queue of the command.
    pub sqid: u16,
    /// Completion queue to post to.
    pub cqid: u16,
    /// Command Identifier.
    pub cid: u16,
    /// Dword 0, command specific.
    pub dw0: u32,
    /// SQ head right after the command was fetched (used when the SQ is gone
    /// by the time the completion is posted).
    pub sqhd_hint: u32,
    /// Status Field.
    pub status: Status,
    /// Faults that apply to it.
    pub plan: Plan,
}

/// A completion held back by [`Fault::DelayCompletion`](super::Fault::DelayCompletion).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    /// The completion.
    pub c: Completion,
    /// Post once the total doorbell count reaches this, if set.
    pub release_at: Option<u64>,
}

/// An Asynchronous Event Request waiting for an event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ParkedAer {
    /// Its Command Identifier.
    pub cid: u16,
    /// Faults that apply to its completion.
    pub plan: Plan,
}

/// Shadow doorbell configuration (Doorbell Buffer Config, §5.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shadow {
    /// IOVA of the Shadow Doorbell buffer (PRP1).
    pub db: u64,
    /// IOVA of the EventIdx buffer (PRP2).
    pub ei: u64,
}

/// Current values of the features the model supports (Set Features, §5.27).
#[derive(Clone, Debug, Default)]
pub(crate) struct Features {
    /// Volatile Write Cache (FID 06h) WCE.
    pub wce: bool,
    /// Asynchronous Event Configuration (FID 0Bh) dword 11.
    pub aec: u32,
    /// Temperature Threshold (FID 04h) keyed by (TMPSEL, THSEL).
    pub temp: BTreeMap<(u8, u8), u16>,
    /// Number of Queues (FID 07h) granted: (NSQA, NCQA), 0-based.
    pub granted: Option<(u16, u16)>,
    /// Host Behavior Support (FID 16h) LBAFEE, byte 2 bit 0.
    pub lbafee: bool,
    /// Host Behavior Support (FID 16h): the data structure set last.
    pub hbs: Option<Vec<u8>>,
}

/// Everything tests can inspect.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Spec and protocol violations by the host.
    pub violations: Vec<String>,
    /// Violations not kept because the list was full.
    pub violations_lost: u64,
    /// DMA accesses to unmapped IOVAs.
    pub dma_faults: u64,
    /// Set Features Host Behavior Support commands accepted.
    pub hbs_sets: u32,
    /// Descriptions of the first DMA faults.
    pub dma_fault_log: Vec<String>,
    /// MMIO doorbell writes per queue: (SQ tail, CQ head).
    pub doorbells: BTreeMap<u16, (u64, u64)>,
    /// MMIO doorbell writes, all queues.
    pub doorbell_total: u64,
    /// Every command fetched: (SQ id, opcode, CID); the first
    /// [`MAX_SEEN`] only.
    pub seen: Vec<(u16, u8, u16)>,
    /// Number of commands fetched (the index [`Match::Nth`] counts).
    ///
    /// [`Match::Nth`]: super::Match::Nth
    pub fetched: u64,
    /// The last [`RECENT_SQES`] commands fetched: (SQ id, the 64 bytes).
    pub recent: VecDeque<(u16, [u8; 64])>,
    /// Data transfers described by an SGL (CDW0.PSDT = 01b) the model walked.
    pub sgl_transfers: u64,
    /// Data transfers described by PRPs the model walked.
    pub prp_transfers: u64,
}

/// How many fetched commands [`Stats::recent`] keeps.
pub(crate) const RECENT_SQES: usize = 64;

/// The whole controller state.
pub(crate) struct State {
    /// Fixed configuration.
    pub cfg: ModelConfig,
    /// The IOVA table the model performs DMA through.
    pub mem: Arc<IovaTable>,
    /// Controller registers.
    pub regs: Regs,
    /// CSTS.CFS: fatal error, nothing is processed until a reset.
    pub fatal: bool,
    /// Surprise removal: registers read all ones, nothing happens.
    pub gone: bool,
    /// A shutdown notification was processed; nothing is processed until a
    /// reset.
    pub shut_down: bool,
    /// Submission queues by identifier (0 = admin).
    pub sqs: BTreeMap<u16, SubQueue>,
    /// Completion queues by identifier (0 = admin).
    pub cqs: BTreeMap<u16, CompQueue>,
    /// Delayed completions.
    pub held: Vec<Held>,
    /// Commands whose completion was dropped: (SQ id, CID).
    pub dropped: Vec<(u16, u16)>,
    /// Outstanding Asynchronous Event Requests.
    pub aers: Vec<ParkedAer>,
    /// Asynchronous events waiting for a request (completion dword 0).
    pub events: VecDeque<u32>,
    /// The Changed Namespace List (log 04h): NSIDs changed since the host
    /// last read it, up to 1024 (more: the list says FFFFFFFFh).
    pub changed_nsids: Vec<u32>,
    /// More than 1024 namespaces changed since the last read.
    pub changed_overflow: bool,
    /// Asynchronous Event Types (bit = type) reported and masked until the
    /// host reads their log page with RAE clear (Error 01h, SMART 02h,
    /// Changed Namespace List 04h) or resets the controller.
    pub aer_masked: u8,
    /// An I/O queue was created since the last reset: Number of Queues is
    /// refused from then on (QEMU's `qs_created`).
    pub queues_created: bool,
    /// A Namespace Attribute Changed notice was sent and the host has not
    /// read log 04h since: no further notice until it does.
    pub ns_notice_masked: bool,
    /// Feature values.
    pub features: Features,
    /// Shadow doorbells, once configured.
    pub shadow: Option<Shadow>,
    /// Leave the EventIdx buffer as it is after processing, like a
    /// controller still working through its queues that has not yet moved
    /// its EventIdx (see [`super::ModelController::freeze_event_idx`]).
    pub event_idx_frozen: bool,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// SMART / Health counters.
    pub health: Health,
    /// Error Information log.
    pub errors: ErrorLog,
    /// Injected faults.
    pub faults: FaultQueue,
    /// Identify data returned instead of the model's own, keyed by (CNS,
    /// NSID).
    pub identify_overrides: BTreeMap<(u8, u32), Vec<u8>>,
    /// Inspection counters.
    pub stats: Stats,
}

impl State {
    /// A powered-off controller (CC.EN = 0) with empty namespaces.
    pub fn new(cfg: ModelConfig, mem: Arc<IovaTable>) -> Self {
        let namespaces = cfg.namespaces.iter().copied().map(Namespace::new).collect();
        let health = Health {
            critical_warning: cfg.smart_critical_warning,
            ..Health::default()
        };
        State {
            cfg,
            mem,
            regs: Regs::default(),
            fatal: false,
            gone: false,
            shut_down: false,
            sqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            held: Vec::new(),
            dropped: Vec::new(),
            aers: Vec::new(),
            events: VecDeque::new(),
            changed_nsids: Vec::new(),
            changed_overflow: false,
            ns_notice_masked: false,
            aer_masked: 0,
            queues_created: false,
            features: Features::default(),
            shadow: None,
            event_idx_frozen: false,
            namespaces,
            health,
            errors: ErrorLog::default(),
            faults: FaultQueue::default(),
            identify_overrides: BTreeMap::new(),
            stats: Stats::default(),
        }
    }

    /// Records a protocol violation by the host.
    pub fn violation(&mut self, msg: String) {
        if self.stats.violations.len() < MAX_VIOLATIONS {
            self.stats.violations.push(msg);
        } else {
            self.stats.violations_lost += 1;
        }
    }

    /// Records a DMA fault (the guest's DMAR fault counter).
    pub fn dma_fault(&mut self, fault: DmaFault, what: &str) {
        self.stats.dma_faults += 1;
        if self.stats.dma_fault_log.len() < MAX_VIOLATIONS {
            self.stats.dma_fault_log.push(format!("{what}: {fault}"));
        }
    }

    /// Doorbell stride in bytes, `4 << CAP.DSTRD`.
    pub fn stride(&self) -> u64 {
        4u64 << self.cfg.dstrd
    }

    /// Forgets every queue and every command in flight: what CC.EN 1→0 and a
    /// shutdown do ("Controller Reset").
    pub fn drop_queues(&mut self) {
        self.sqs.clear();
        self.cqs.clear();
        self.held.clear();
        self.dropped.clear();
        self.aers.clear();
        self.shadow = None;
    }

    /// True when a command with `cid` from SQ `sqid` has not completed from
    /// the host's point of view (held, dropped, parked or in a CQ backlog).
    pub fn cid_outstanding(&self, sqid: u16, cid: u16) -> bool {
        self.held.iter().any(|h| h.c.sqid == sqid && h.c.cid == cid)
            || self.dropped.contains(&(sqid, cid))
            || (sqid == 0 && self.aers.iter().any(|a| a.cid == cid))
            || self.cqs.values().any(|cq| {
                cq.backlog
                    .iter()
                    .any(|p| p.counts && p.c.sqid == sqid && p.c.cid == cid)
            })
    }

    /// The namespace with identifier `nsid`, if attached.
    pub fn namespace(&self, nsid: u32) -> Option<usize> {
        self.namespaces.iter().position(|n| n.cfg.nsid == nsid)
    }

    fn segments(
        &mut self,
        cmd: &Command,
        len: usize,
        need: usize,
    ) -> Result<Vec<prp::Segment>, Status> {
        match cmd.psdt() {
            0 => {}
            1 if self.cfg.sgls & 3 == 1 || self.cfg.sgls & 3 == 2 => {
                let dword = self.cfg.sgls & 3 == 2;
                return match sgl::segments(&self.mem, [cmd.prp1(), cmd.prp2()], len, dword) {
                    Ok(s) => {
                        self.stats.sgl_transfers += 1;
                        Ok(s)
                    }
                    Err(SglError::Status(s)) => {
                        // The host built an SGL the specification does not
                        // allow (or one that does not describe the transfer
                        // exactly): QEMU refuses it, other controllers may
                        // move data wrongly.
                        self.violation(format!(
                            "opcode {:#04x} CID {:#06x}: its SGL (SGL1 {:#x} {:#x}) for a {len}-byte transfer is invalid (status {:#x})",
                            cmd.opcode(),
                            cmd.cid(),
                            cmd.prp1(),
                            cmd.prp2(),
                            s.code_only().0
                        ));
                        Err(s)
                    }
                    Err(SglError::Dma(f)) => {
                        self.dma_fault(f, "SGL segment read");
                        Err(Status::DATA_TRANSFER_ERROR)
                    }
                };
            }
            // SGLs not supported (SGLS bits 1:0 = 00b), or a metadata SGL
            // (PSDT 10b), which the model does not offer (SGLS bit 19 clear).
            psdt => {
                self.violation(format!(
                    "opcode {:#04x} CID {:#06x}: PSDT {psdt:#04b} on a controller with SGLS {:#x}",
                    cmd.opcode(),
                    cmd.cid(),
                    self.cfg.sgls
                ));
                return Err(Status::INVALID_FIELD.with_dnr());
            }
        }
        let page = self.regs.page_size();
        match prp::segments(&self.mem, cmd.prp1(), cmd.prp2(), len, need, page) {
            Ok(s) => {
                self.stats.prp_transfers += 1;
                Ok(s)
            }
            Err(PrpError::Offset { entry }) => {
                self.violation(format!(
                    "opcode {:#04x} CID {:#06x}: PRP entry {entry:#x} breaks an offset rule (PRP1 {:#x}, PRP2 {:#x}, {len}-byte transfer, {page}-byte pages)",
                    cmd.opcode(),
                    cmd.cid(),
                    cmd.prp1(),
                    cmd.prp2()
                ));
                Err(Status::PRP_OFFSET_INVALID.with_dnr())
            }
            Err(PrpError::Dma(f)) => {
                self.dma_fault(f, "PRP list read");
                Err(Status::DATA_TRANSFER_ERROR)
            }
        }
    }

    /// Reads `len` bytes of command data from the host (a write-direction
    /// transfer) through the command's PRPs.
    pub fn read_host_data(&mut self, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
        let segs = self.segments(cmd, len, len)?;
        let mut data = vec![0u8; len];
        let mut at = 0usize;
        for (iova, n) in segs {
            let Some(dst) = data.get_mut(at..at + n) else {
                return Err(Status::INTERNAL_ERROR);
            };
            if let Err(f) = self.mem.read(iova, dst) {
                self.dma_fault(f, "data read");
                return Err(Status::DATA_TRANSFER_ERROR);
            }
            at += n;
        }
        Ok(data)
    }

    /// Writes `data` to the host (a read-direction transfer) through the
    /// command's PRPs, which describe a buffer of `len` bytes (`data` may be
    /// shorter: only its bytes are written).
    pub fn write_host_data(
        &mut self,
        cmd: &Command,
        data: &[u8],
        len: usize,
    ) -> Result<(), Status> {
        let segs = self.segments(cmd, len, data.len())?;
        let mut at = 0usize;
        for (iova, n) in segs {
            if at >= data.len() {
                break;
            }
            let n = n.min(data.len() - at);
            let src = data.get(at..at + n).unwrap_or_default();
            if let Err(f) = self.mem.write(iova, src) {
                self.dma_fault(f, "data write");
                return Err(Status::DATA_TRANSFER_ERROR);
            }
            at += n;
        }
        Ok(())
    }
}

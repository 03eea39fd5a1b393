//! The controller: open, bring up, talk over the admin queue, shut down.
//!
//! Bring-up follows NVMe 2.0 §3.5.1 "Memory-based Controller Initialization" as
//! an explicit sequence of [`BringupStep`]s, each bounded by a timeout derived
//! from CAP.TO (or the caller's options), never a bare spin.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use upnvme_dma::{DmaBuffer, DmaPages, DmaPool, PciAddress, SharedWords, Sysfs};
use upnvme_queues::regs::{
    Crto, REG_ACQ, REG_AQA, REG_ASQ, REG_CAP, REG_CC, REG_CRTO, REG_CSTS, REG_VS, aqa,
    cq_head_doorbell,
};
use upnvme_queues::sqe::opcode::admin as admin_op;
use upnvme_queues::{
    AsyncEvent, Cap, Cc, Cqe, Csts, ErrorLogEntry, FirmwareSlotLog, IdentifyController,
    IdentifyControllerNvm, IdentifyNamespace, SmartLog, Sqe, Vs, parse_ns_list,
};
use upnvme_queues::{cns, feature, log_id};

use crate::admin::{AdminQueue, Detached, Room, check_csts};
use crate::device::{Device, VfioNvme};
use crate::error::{Error, Result};
use crate::namespace::Namespace;
use crate::options::ControllerOptions;
use crate::passthrough::{
    AdminHandle, admin_transfer, feature_data, passthrough_len, passthrough_refusal,
};

/// Memory page size the driver configures (CC.MPS = 0).
const PAGE: usize = 4096;

/// The steps of controller bring-up, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BringupStep {
    /// CC.EN = 0, wait for CSTS.RDY = 0.
    Disable,
    /// Allocate the admin queues; program AQA, ASQ, ACQ.
    ConfigureAdminQueue,
    /// CC with IOSQES = 6, IOCQES = 4, MPS = 0, CSS = NVM, EN = 1; wait CSTS.RDY = 1.
    Enable,
    /// Identify Controller (CNS 01h).
    IdentifyController,
    /// Set Features, Number of Queues (FID 07h).
    SetNumberOfQueues,
    /// Identify Active Namespace ID list (CNS 02h) and each namespace (CNS 00h).
    IdentifyNamespaces,
    /// Doorbell Buffer Config, when OACS bit 8 says it is supported.
    DoorbellBufferConfig,
    /// Post Asynchronous Event Requests.
    AsyncEventRequests,
}

/// Shadow doorbell and EventIdx buffers registered with Doorbell Buffer Config.
/// Shared by every queue pair of the controller, each on its own thread, so
/// they are reached through atomic word accesses only ([`SharedWords`]).
#[derive(Debug)]
pub struct ShadowBuffers {
    /// The Shadow Doorbell buffer (PRP1 of the command).
    pub doorbells: SharedWords,
    /// The EventIdx buffer (PRP2 of the command).
    pub event_idx: SharedWords,
}

/// `Inner::state` bit: closed.
const STATE_CLOSED: u64 = 1;
/// `Inner::state` bit: failed.
const STATE_FAILED: u64 = 2;
/// `Inner::state` bit: a reset is under way (set under the admin lock before
/// its queue deletions, cleared when it ends): no queue pair writes a doorbell
/// while it is set, since its queues may already be deleted or the controller
/// disabled.
pub(crate) const STATE_RESETTING: u64 = 4;
/// `Inner::state` bit: a release on the kernel's request is under way (set
/// before its CC.EN = 0, cleared when it ends, with the closed and failed
/// bits and the new generation): no queue pair writes a doorbell while it
/// is set, since the controller may already be disabled. Not
/// `STATE_RESETTING`: a reset running at the same time clears that bit when
/// it ends.
pub(crate) const STATE_RELEASING: u64 = 8;
/// `Inner::state`: the reset generation starts at this bit.
pub(crate) const STATE_GENERATION_SHIFT: u32 = 4;

pub(crate) struct Inner<D: Device> {
    dev: D,
    /// Process-unique number of this controller (namespace handles carry it).
    instance: u64,
    name: String,
    cap: Cap,
    pub(crate) vs: Vs,
    pub(crate) options: ControllerOptions,
    admin: Mutex<AdminQueue>,
    pub(crate) admin_timeout: Duration,
    ready_timeout: Duration,
    failure: Mutex<Option<String>>,
    /// What the I/O path checks, in one word (one load per check): bit 0
    /// closed, bit 1 failed (set with `failure`), bit 2 resetting (a reset
    /// holds the admin lock and may have deleted the I/O queues), bit 3
    /// releasing (a release on the kernel's request may have disabled the
    /// controller), and above
    /// [`STATE_GENERATION_SHIFT`] the reset generation, incremented by every
    /// controller reset once the controller is disabled (no DMA possible):
    /// queue pairs compare it with their own copy to learn that their
    /// commands are dead and their queues must be re-created.
    state: AtomicU64,
    /// Controller resets performed.
    resets: AtomicU64,
    /// I/O queue IDs in use (index = qid - 1).
    qids: Mutex<Vec<bool>>,
    /// Queue IDs whose queues may still exist on the controller (a deletion
    /// it refused or never answered): kept in use until the next reset
    /// disables the controller, since a Create with such an ID would fail.
    held_qids: Mutex<Vec<u16>>,
    /// Memory the device may still access (timed-out commands, queues whose
    /// deletion failed): released only after the controller is disabled.
    quarantine: Mutex<Vec<DmaPages>>,
    pub(crate) identify: IdentifyController,
    /// The NVM Command Set's per-command size limits (Identify CNS 06h,
    /// CSI 00h: VSL, WZSL, WUSL, DMRL, DMRSL, DMSL); all 0h (no limits)
    /// when the controller refuses that Identify with a status.
    pub(crate) nvm_limits: IdentifyControllerNvm,
    granted_io_queues: u16,
    /// Host Behavior Support LBAFEE was set (the controller reports
    /// Extended LBA Formats, CTRATT.ELBAS, and took the feature): set again
    /// after every reset.
    lbafee: bool,
    /// The Copy Descriptor Formats the driver enables in Host Behavior
    /// Support (CDFE, bytes 05:04): the cross-namespace formats 2h and 3h
    /// the controller reports in Identify Controller OCFS, where it took
    /// them; set again after every reset.
    driver_cdfe: u16,
    /// The Copy Descriptor Formats enabled now (CDFE as last set, by the
    /// driver or the application; 0 after a Controller Level Reset until
    /// it is set again): a cross-namespace Copy goes only in a format
    /// enabled here.
    cdfe: AtomicU16,
    /// The Host Behavior Support data structure (512 bytes) the application
    /// set last through `admin_passthrough` and the controller accepted:
    /// every reset sets it again (LBAFEE in it stays set where the driver
    /// set it: the passthrough refuses it clear). `None`: the driver's own
    /// (LBAFEE alone, where it set it), or none.
    hbs_by_application: Mutex<Option<Box<[u8; HBS_LEN]>>>,
    /// The Asynchronous Event Configuration value every reset sets again:
    /// the one set at bring-up to enable Namespace Attribute Notices, or the
    /// last one the application set (`set_features`, `admin_passthrough`);
    /// `1 << 32 | value`, 0 for none (the controller does not offer the
    /// notices, or refused them, and nobody set one).
    pub(crate) aec: AtomicU64,
    shadow: Option<ShadowBuffers>,
    /// Whether the controller took Doorbell Buffer Config at its last
    /// enable (bring-up or reset): a reset whose Doorbell Buffer Config is
    /// refused with a status (or that fails before it is answered) leaves
    /// the buffers allocated and this clear, and the queue pairs created or
    /// re-created after it ring MMIO doorbells only. A reset writes it under
    /// the admin lock (which it holds throughout) and `create_io_queues`
    /// reads it there, with the generation; bring-up sets it before anything
    /// else can see the controller, and `Controller::shadow_doorbells`
    /// reads it without the lock (a report, not a decision).
    shadow_on: AtomicBool,
    aer_target: u32,
    /// Released on the kernel's request (see `release_on_request`).
    removed: Arc<AtomicBool>,
    /// Set by every controller reset: the namespace handles are verified
    /// against Identify Namespace at the next
    /// [`Controller::poll_async_events`]. A reset leaves Namespace Attribute
    /// Notices off from CC.EN = 0 until Set Features sets them again, and a
    /// namespace changed in that window raises no event.
    pub(crate) namespaces_unverified: AtomicBool,
    /// Held from taking `namespaces_unverified` to the end of the check it
    /// asks for: a `Controller::reset` that finds the flag taken by a
    /// concurrent `poll_async_events` returns only once that check ended.
    pub(crate) namespace_check: Mutex<()>,
    /// Held while a Format NVM is sent and waited for
    /// (`Controller::format_nvm_run`): formats from several threads go one
    /// after the other.
    pub(crate) format_lock: Mutex<()>,
    /// Namespaces found attached by a check (not announced by the
    /// controller) and announced to the application since its last
    /// `refresh_namespaces`: announced once, not at every poll.
    pub(crate) attached_announced: Mutex<Vec<u32>>,
    /// Namespaces the last scan (bring-up, `refresh_namespaces`) found not
    /// ready (a transient Identify status) and has no handle for: every
    /// poll checks them until each is ready, then announces it.
    pub(crate) unready: Mutex<Vec<u32>>,
    /// Why a namespace notice may not come (notices off, an unread log):
    /// while any holds, every `poll_async_events` checks every handle.
    pub(crate) notice_gaps: crate::namespace_list::NoticeGaps,
}

/// The longest shutdown wait derived from RTD3E (Identify Controller) when
/// the caller set none.
const MAX_DEFAULT_SHUTDOWN: Duration = Duration::from_secs(60);

/// The shortest default bound on the shutdown wait (RTD3E not reported, or
/// shorter): what Linux waits by default (its `shutdown_timeout`, 5 s). A
/// bound that gives up early clears CC.EN in the middle of shutdown
/// processing — an unsafe shutdown for a drive still flushing a volatile
/// write cache — while a longer bound costs a healthy device nothing.
const MIN_DEFAULT_SHUTDOWN: Duration = Duration::from_secs(5);

/// How long a release on request waits for CSTS.RDY = 0 after CC.EN = 0
/// before it turns bus mastering off anyway (the removal waits on it).
const RELEASE_DISABLE_WAIT: Duration = Duration::from_millis(500);
/// How often the release watcher looks whether its controller is gone.
const RELEASE_WATCH_TICK: Duration = Duration::from_millis(100);

/// An NVMe controller brought up and ready for admin commands.
///
/// Generic over the [`Device`] it runs on: [`VfioNvme`] by default, or the
/// in-memory model in tests. `Controller` is `Send + Sync`; admin commands from
/// several threads serialise on the admin queue's mutex (the I/O path does not
/// touch it).
///
/// Dropping the last handle — the `Controller` and every queue pair made from
/// it, which share its state — or calling [`Controller::close`] shuts the
/// controller down: CC.SHN = normal, wait for CSTS.SHST = complete, then
/// CC.EN = 0, so no DMA happens after the process stops using the device.
/// A pair that outlives a dropped `Controller` keeps working until it goes.
pub struct Controller<D: Device = VfioNvme> {
    pub(crate) inner: Arc<Inner<D>>,
    /// The active namespaces, by ascending NSID; refreshed by Format NVM
    /// ([`Controller::format_nvm`], which takes `&mut self`).
    pub(crate) namespaces: Vec<Namespace>,
    /// Active namespaces the driver cannot use, with the reason (reported
    /// by [`Controller::namespace`]).
    pub(crate) unusable: Vec<(u32, String)>,
}

impl<D: Device> std::fmt::Debug for Controller<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("device", &self.inner.name)
            .field("model", &self.inner.identify.mn)
            .field("namespaces", &self.namespaces.len())
            .finish()
    }
}

impl Controller<VfioNvme> {
    /// Opens the NVMe controller at `pci_address` (e.g. `"0000:00:04.0"`), which
    /// must be bound to vfio-pci, and brings it up.
    ///
    /// Every setup problem is reported with its fix: a malformed address, no
    /// such device, a device that is not NVMe or is bound to another driver, an
    /// IOMMU that is off, a group that is not viable, missing hugepages.
    pub fn open(pci_address: &str, options: ControllerOptions) -> Result<Self> {
        options.check()?;
        let addr: PciAddress = pci_address.parse()?;
        let dev = VfioNvme::open(&addr, options.page_backing, &Sysfs::default())?;
        Controller::with_device(dev, options)
    }
}

impl<D: Device> Controller<D> {
    /// Brings up the controller behind `dev`.
    ///
    /// Options no controller can be run with (a timeout of zero) are
    /// refused with [`Error::InvalidArgument`] before the device is touched.
    pub fn with_device(dev: D, options: ControllerOptions) -> Result<Self> {
        options.check()?;
        let (inner, namespaces, unusable) = bring_up(dev, options)?;
        let inner = Arc::new(inner);
        if let Some(req) = inner.dev.release_request() {
            // Without the thread a removal request (unbind) would wait until
            // the application drops everything: refuse the open instead (the
            // controller is shut down as `inner` drops).
            watch_release_requests(Arc::downgrade(&inner), req, None).map_err(|source| {
                Error::ThreadSpawn {
                    device: inner.name.clone(),
                    what: "release-request watcher",
                    source,
                }
            })?;
        }
        Ok(Controller {
            inner,
            namespaces,
            unusable,
        })
    }

    /// The device name (PCI address, or the model's name).
    pub fn device_name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the memory the controller only reads — the admin SQ, I/O
    /// SQs, PRP Lists, SGL segments, Dataset Management and Copy ranges —
    /// is mapped without the device's write permission (docs/DESIGN.md,
    /// "DMA memory"). The driver takes read-write memory instead when
    /// read-only memory cannot be had (no free 2 MiB hugepage for its
    /// region, an IOMMU that refuses the mapping) rather than fail; this
    /// says when it did, how often and why. `upnvme identify` prints it.
    pub fn read_only_memory(&self) -> crate::ReadOnlyMemory {
        self.inner.dev.read_only_memory()
    }

    /// The device this controller runs on: its registers, and for
    /// [`VfioNvme`] its PCI configuration space.
    ///
    /// Only with the `raw` feature: a register write (ASQ, ACQ, CC, a
    /// doorbell) can point the device at memory the driver did not describe,
    /// which is outside the driver's safety argument (docs/DESIGN.md,
    /// "Escape hatches").
    #[cfg(feature = "raw")]
    pub fn device(&self) -> &D {
        &self.inner.dev
    }

    /// Controller Capabilities (CAP) as read at bring-up.
    pub fn cap(&self) -> Cap {
        self.inner.cap
    }

    /// Version (VS).
    pub fn version(&self) -> Vs {
        self.inner.vs
    }

    /// A pool of `count` DMA buffers of `len` bytes each, carved from one
    /// allocation (each buffer starts on a 4 KiB page). Get and put are
    /// O(1), take no lock and allocate nothing; see [`DmaPool`] for what reuse
    /// means for the data left in a buffer.
    pub fn dma_pool(&self, len: usize, count: usize) -> Result<DmaPool> {
        let total = DmaPool::slab_len(len, count).map_err(|e| match e {
            upnvme_dma::DmaError::InvalidAllocation(why) => Error::InvalidArgument(why),
            other => Error::Dma(other),
        })?;
        let slab = self.inner.dev.alloc_dma(total)?;
        Ok(DmaPool::new(slab, len, count)?)
    }

    /// Identify Controller data captured at bring-up.
    pub fn identify(&self) -> &IdentifyController {
        &self.inner.identify
    }

    /// The NVM Command Set's per-command size limits read at bring-up
    /// (Identify CNS 06h, CSI 00h; all 0h when the controller does not
    /// report them). Queue pairs refuse a Verify, Write Zeroes, Write
    /// Uncorrectable or Dataset Management command beyond them
    /// ([`crate::Reject::SizeLimit`]).
    pub fn nvm_limits(&self) -> IdentifyControllerNvm {
        self.inner.nvm_limits
    }

    /// The active namespaces found at bring-up (or read again by Format
    /// NVM and [`Controller::refresh_namespaces`]), by ascending NSID.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }

    /// The active namespaces the driver cannot use, each with why (an LBA
    /// format it has no code for, an Identify refused with a status, ...):
    /// [`Controller::namespace`] refuses them with
    /// [`Error::UnusableNamespace`], and [`Controller::format_nvm`] can make
    /// them usable. As (NSID, reason), in no particular order.
    pub fn unusable_namespaces(&self) -> &[(u32, String)] {
        &self.unusable
    }

    /// The active namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Result<&Namespace> {
        self.namespaces
            .iter()
            .find(|n| n.id() == nsid)
            .ok_or_else(|| match self.unusable.iter().find(|(n, _)| *n == nsid) {
                Some((_, reason)) => Error::UnusableNamespace {
                    device: self.inner.name.clone(),
                    nsid,
                    reason: reason.clone(),
                },
                None => {
                    // Active ones, usable or not.
                    let mut active: Vec<u32> = self
                        .namespaces
                        .iter()
                        .map(|n| n.id())
                        .chain(self.unusable.iter().map(|(n, _)| *n))
                        .collect();
                    active.sort_unstable();
                    Error::NoSuchNamespace {
                        device: self.inner.name.clone(),
                        nsid,
                        active,
                    }
                }
            })
    }

    /// How many I/O queue pairs the controller granted (Set Features, Number of
    /// Queues: min(NSQA, NCQA) + 1).
    pub fn granted_io_queues(&self) -> u16 {
        self.inner.granted_io_queues
    }

    /// The Copy Descriptor Formats enabled in the Host Behavior Support
    /// feature (FID 16h) as of now, CDFE: bit *n* enables Format *n*h.
    /// Formats 2h and 3h ([`crate::IoCommand::CrossNamespaceCopy`]) need it;
    /// the driver enables what Identify Controller OCFS reports at bring-up
    /// and after a reset, and follows an application's own Host Behavior
    /// Support structure. 0 when the controller refused it.
    pub fn copy_formats_enabled(&self) -> u16 {
        self.inner.copy_formats_enabled()
    }

    /// Largest data transfer of one I/O command in bytes: MDTS × the minimum
    /// memory page size, capped at 4 MiB (the queue pairs' per-command limit;
    /// also the value when MDTS is 0, "no limit"). Always `Some`.
    pub fn max_transfer_bytes(&self) -> Option<usize> {
        Some(
            self.inner
                .max_transfer()
                .unwrap_or(crate::options::MAX_TRANSFER_CAP)
                .min(crate::options::MAX_TRANSFER_CAP),
        )
    }

    /// What the controller offers for SGLs in NVM commands (Identify
    /// Controller SGLS bits 1:0): see [`crate::SglMode`] for how pairs use it.
    pub fn sgl_support(&self) -> upnvme_queues::sgl::SglSupport {
        self.inner.sgl_support()
    }

    /// Whether shadow doorbells are configured (Doorbell Buffer Config): the
    /// controller took the command at its last enable. A reset whose
    /// Doorbell Buffer Config the controller refuses turns them off, and
    /// the queue pairs then ring MMIO doorbells only (from their next
    /// command on; a later reset that the controller accepts it in turns
    /// them on again).
    pub fn shadow_doorbells(&self) -> bool {
        self.inner.shadow.is_some() && self.inner.shadow_on.load(Ordering::Relaxed)
    }

    /// The admin queue's entry count.
    pub fn admin_queue_entries(&self) -> u32 {
        self.inner.admin().map(|a| a.entries()).unwrap_or(0)
    }

    /// Reads CSTS now; an error if the controller is gone or fatally failed.
    pub fn status(&self) -> Result<Csts> {
        check_csts(&self.inner.dev, &self.inner.name)
    }

    /// The failure that put this controller out of service, if any.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Allocates zeroed DMA memory of at least `len` bytes (page granular).
    pub fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        Ok(self.inner.dev.alloc_dma(len)?)
    }

    /// Identify Controller (CNS 01h), read now.
    pub fn identify_controller(&self) -> Result<IdentifyController> {
        let data = self.inner.identify_raw(cns::CONTROLLER, 0)?;
        IdentifyController::parse(&data)
            .map_err(|e| self.inner.fault(format!("Identify Controller: {e}")))
    }

    /// Identify Namespace (CNS 00h) for `nsid`, read now.
    pub fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace> {
        let data = self.inner.identify_raw(cns::NAMESPACE, nsid)?;
        IdentifyNamespace::parse(&data)
            .map_err(|e| self.inner.fault(format!("Identify Namespace: {e}")))
    }

    /// Active Namespace ID list (CNS 02h) of NSIDs greater than `start`.
    pub fn active_namespace_ids(&self, start: u32) -> Result<Vec<u32>> {
        let data = self.inner.identify_raw(cns::ACTIVE_NSID_LIST, start)?;
        Ok(parse_ns_list(&data))
    }

    /// Raw Identify data for any CNS.
    pub fn identify_raw(&self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        self.inner.identify_raw(cns, nsid)
    }

    /// Get Features: returns completion dword 0. `sel` is the Select field
    /// (0 current, 1 default, 2 saved, 3 supported capabilities). A feature
    /// whose value is a data structure in memory (those
    /// [`upnvme_queues::sqe::feature::structure`] sizes: LBA Range Type,
    /// Autonomous Power State Transition, Host Memory Buffer, Timestamp,
    /// Predictable Latency Mode Config, Host Behavior Support, Performance
    /// Characteristics, FDP Events, Namespace Admin Label, the metadata
    /// features, Host Identifier) is refused with [`Error::InvalidArgument`]:
    /// this call has no data pointer, so the controller would write to IOVA
    /// 0; use [`Controller::admin_passthrough`] with the structure's length.
    pub fn get_features(&self, fid: u8, sel: u8, cdw11: u32) -> Result<u32> {
        // Select 3 (supported capabilities) returns dword 0 only.
        if sel != 3
            && let Some(what) = feature_data(fid, cdw11, false)
        {
            return Err(Error::InvalidArgument(format!(
                "Get Features (FID 0x{fid:02x}): {what}"
            )));
        }
        let sqe = Sqe::get_features(fid, sel, cdw11);
        let (cqe, _) = self
            .inner
            .execute(sqe, None, &format!("Get Features (FID 0x{fid:02x})"))?;
        Ok(cqe.dw0())
    }

    /// Set Features: returns completion dword 0. Refused with
    /// [`Error::InvalidArgument`]: Number of Queues (FID 07h), Host Memory
    /// Buffer (FID 0Dh) and a non-zero Keep Alive Timeout (FID 0Fh), as in
    /// [`Controller::admin_passthrough`], and the features whose value is a
    /// data structure in memory (see [`Controller::get_features`]). Waited
    /// for as [`Controller::admin_passthrough`]'s commands are: without
    /// holding the admin queue, except Asynchronous Event Configuration.
    pub fn set_features(&self, fid: u8, cdw11: u32, save: bool) -> Result<u32> {
        let sqe = Sqe::set_features(fid, cdw11, save);
        if let Some(why) = passthrough_refusal(&sqe) {
            return Err(Error::InvalidArgument(format!(
                "Set Features (FID 0x{fid:02x}): {why}"
            )));
        }
        if let Some(what) = feature_data(fid, cdw11, true) {
            return Err(Error::InvalidArgument(format!(
                "Set Features (FID 0x{fid:02x}): {what}"
            )));
        }
        let what = format!("Set Features (FID 0x{fid:02x})");
        let t = self.inner.admin_timeout;
        let (cqe, _) = self
            .inner
            .execute_for_application(sqe, None, None, &what, t, true)?;
        Ok(cqe.dw0())
    }

    /// Get Log Page: `len` bytes (a multiple of 4) of log `lid` for `nsid`
    /// (0xffff_ffff = controller-wide) from byte `offset` (a multiple of 4:
    /// LPOL/LPOU address dwords). On a controller without Extended Data for
    /// Get Log Page (Identify Controller LPA bit 2 clear), which has no Log
    /// Page Offset and a 12-bit Number of Dwords, a non-zero `offset` or a
    /// `len` above 16 KiB is refused ([`Error::InvalidArgument`]): such a
    /// controller would ignore the one and cut the other.
    pub fn get_log_page(&self, lid: u8, nsid: u32, len: usize, offset: u64) -> Result<Vec<u8>> {
        if len == 0 || !len.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "log page length {len} must be a non-zero multiple of 4"
            )));
        }
        if !offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "log page offset {offset} must be a multiple of 4 (the Log Page Offset is dword \
                 aligned)"
            )));
        }
        if !self.inner.identify.lpa_extended_data()
            && (offset != 0 || len > LOG_PAGE_BYTES_WITHOUT_EXTENDED_DATA)
        {
            return Err(Error::InvalidArgument(format!(
                "Get Log Page of {len} bytes from offset {offset}: the controller has no Extended \
                 Data for Get Log Page (Identify Controller LPA bit 2 clear), so no Log Page \
                 Offset and at most {LOG_PAGE_BYTES_WITHOUT_EXTENDED_DATA} bytes (a 12-bit \
                 Number of Dwords)"
            )));
        }
        let data = self.read_log_page(lid, nsid, len, offset)?;
        if self.inner.notice_gaps.log_read(lid) {
            // The Changed Namespace List went to the caller: what it named
            // is checked at the next poll.
            self.inner
                .namespaces_unverified
                .store(true, Ordering::Release);
        }
        Ok(data)
    }

    /// Get Log Page with Retain Asynchronous Event clear (a Notice masked
    /// for this log is re-armed), arguments checked by the caller.
    pub(crate) fn read_log_page(
        &self,
        lid: u8,
        nsid: u32,
        len: usize,
        offset: u64,
    ) -> Result<Vec<u8>> {
        let sqe = Sqe::get_log_page(lid, nsid, (len / 4) as u32, offset, false);
        let (_, data) =
            self.inner
                .execute(sqe, Some(len), &format!("Get Log Page (LID 0x{lid:02x})"))?;
        Ok(data)
    }

    /// The SMART / Health Information log (LID 02h), controller-wide.
    pub fn smart_log(&self) -> Result<SmartLog> {
        let data = self.get_log_page(log_id::SMART_HEALTH, 0xffff_ffff, 512, 0)?;
        SmartLog::parse(&data).map_err(|e| self.inner.fault(format!("SMART log: {e}")))
    }

    /// The Error Information log (LID 01h): up to `entries` entries (the
    /// controller keeps ELPE + 1).
    pub fn error_log(&self, entries: usize) -> Result<Vec<ErrorLogEntry>> {
        let max = self.inner.identify.elpe as usize + 1;
        let n = entries.clamp(1, max);
        let data = self.get_log_page(log_id::ERROR_INFO, 0xffff_ffff, n * 64, 0)?;
        Ok(upnvme_queues::parse_error_log(&data))
    }

    /// The Firmware Slot Information log (LID 03h).
    pub fn firmware_slot_log(&self) -> Result<FirmwareSlotLog> {
        let data = self.get_log_page(log_id::FIRMWARE_SLOT, 0xffff_ffff, 512, 0)?;
        FirmwareSlotLog::parse(&data)
            .map_err(|e| self.inner.fault(format!("firmware slot log: {e}")))
    }

    /// Polls the admin queue and returns the asynchronous events that arrived
    /// since the last call; completed Asynchronous Event Requests are re-posted.
    ///
    /// The controller masks an event type until the host reads the log page
    /// the event names ([`AsyncEvent::log_page`]) with Retain Asynchronous
    /// Event cleared, which [`Controller::get_log_page`] does.
    ///
    /// A Notice / Namespace Attribute Changed event
    /// ([`AsyncEvent::is_namespace_attribute_changed`]) is followed before
    /// it is returned: the Changed Namespace List (log 04h) is read (which
    /// re-arms the notice) and the handles of listed namespaces whose
    /// geometry or identity (NGUID, EUI64) changed, or that are gone, are
    /// retired; take new ones after
    /// [`Controller::refresh_namespaces`] (docs/io.md, "Namespaces changed
    /// by someone else"). An empty list (the log was read elsewhere, by a
    /// [`Controller::get_log_page`] of log 04h) or an unreadable one makes
    /// every handle checked, as does the first call after a controller reset
    /// (the reset turns the notices off until it sets them again), which
    /// also reads the Active Namespace ID list: a retired handle, or a
    /// namespace attached during the reset, comes out as a Namespace
    /// Attribute Changed event of the driver's own. Events
    /// the controller had posted when a reset began are kept and returned by
    /// the next call.
    ///
    /// Where no notice can come, every call checks every handle (Identify
    /// Namespace each, and the Active Namespace ID list) instead: the
    /// controller does not offer Namespace Attribute Notices or refused to
    /// turn them on (at bring-up or after the last reset); no Asynchronous
    /// Event Request is outstanding (the controller ended them for good);
    /// the Changed Namespace List could not be read (every call reads it
    /// again until it can: until then the controller masks Notices); the
    /// application turned the notices off (a Set Features Asynchronous Event
    /// Configuration without bit 8); or a Notice the controller reported —
    /// Firmware Activation Starting, say — names a log page no Get Log Page
    /// with RAE clear has read since (the controller masks every Notice, the
    /// namespace one included, until that read: [`Controller::get_log_page`]
    /// of [`AsyncEvent::log_page`], or an admin passthrough Get Log Page with
    /// RAE clear, ends it).
    pub fn poll_async_events(&self) -> Result<Vec<AsyncEvent>> {
        self.inner
            .with_admin(|dev, name, admin| {
                admin.reap(dev, name)?;
                if admin.aers_to_repost() > 0 {
                    admin.post_aers(dev, self.inner.aer_target)?;
                }
                // An AER the controller ended for good may have carried a
                // notice: check every handle once, as after a reset.
                // So may a Notice mask that just ended (a controller may drop
                // what it held meanwhile).
                if admin.take_aer_lost() | admin.take_notice_mask_ended() {
                    self.inner
                        .namespaces_unverified
                        .store(true, Ordering::Release);
                }
                // Taken only now: a failed re-post leaves them for the next
                // call (or, kept across a reset, for the one after it).
                Ok((
                    admin.take_events(),
                    admin.aers_outstanding() == 0 || admin.notice_masked(),
                ))
            })
            .map(|(mut events, unheard)| {
                let _check = self
                    .inner
                    .namespace_check
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // No request outstanding, a Notice's log unread, or a gap:
                // no namespace notice can come, so every handle is checked
                // at every call.
                let blind = unheard || self.inner.notice_gaps.any();
                let unverified = self
                    .inner
                    .namespaces_unverified
                    .swap(false, Ordering::AcqRel)
                    || blind;
                let announce = self.follow_namespace_changes(&events, unverified);
                // A change inside a reset (a namespace changed, gone or
                // attached) raised no notice: say so as the controller would
                // have, so that the application refreshes.
                if announce
                    && !events
                        .iter()
                        .any(AsyncEvent::is_namespace_attribute_changed)
                {
                    events.push(namespace_attribute_changed());
                }
                events
            })
    }

    /// Admin command passthrough: the caller's SQE with the driver's CID and
    /// data pointer. `data_len` bytes of data (0 for none) are transferred
    /// through a driver-owned buffer: for a command that writes to the host
    /// the data is returned; for one that reads from the host, pass it in
    /// `data_out` (with `data_len` 0 its length is the transfer; longer than
    /// a non-zero `data_len` is refused, shorter is padded with zeros). The data
    /// pointer (PRP1/PRP2, PSDT 00b) and the metadata pointer (MPTR, 0) are
    /// always the driver's: with no data both pointers are 0, whatever the
    /// SQE said, so the device never touches memory the driver did not
    /// describe. Returns the completion entry and the data.
    ///
    /// The data pointer describes exactly what the command moves. For the
    /// commands whose length the SQE gives (Identify: 4096 bytes; Get Log
    /// Page: (NUMD + 1) × 4; Firmware Image Download, Directive, Security
    /// Send / Receive, Get LBA Status, data-structure features) a shorter
    /// `data_len` is refused (below) and a longer one is cut to it: the data
    /// returned (and the part of `data_out` sent) is what the command moves.
    /// A controller moving two memory pages under a description of more
    /// would take PRP2, then a PRP List pointer, as its second data page
    /// (NVMe 2.0 §4.3.1). For other commands (vendor-specific) `data_len`
    /// must be exactly what the command moves.
    ///
    /// Refused with [`Error::InvalidArgument`] before anything is sent:
    /// the commands whose effect outlives the command itself on memory or
    /// on state the driver keeps — Create/Delete I/O Submission/Completion
    /// Queue (queues are [`Controller::io_queue_pair`]'s), Asynchronous Event
    /// Request (the driver keeps them posted: [`Controller::poll_async_events`]),
    /// Doorbell Buffer Config (the driver's shadow doorbells), Format NVM
    /// ([`Controller::format_nvm`], which retires the namespace's handles),
    /// Namespace Management and Namespace Attachment (a namespace changed
    /// under its handles would be read and written with its old geometry),
    /// Set Features Number of Queues (the driver sets it at bring-up and
    /// after every reset, and its queue pairs take queue IDs by what was
    /// granted), Set Features Host Memory Buffer and Controller Data Queue
    /// (NVMe 2.1, opcode 45h) (the device would use host memory named in the
    /// data for as long as it likes), and Set Features Keep Alive
    /// Timer with a non-zero KATO (the driver sends no Keep Alive; the timer
    /// would expire and fail the controller). Vendor-specific opcodes
    /// (C0h–FFh) are sent: their data pointer is the driver's, but what
    /// else they do is the vendor's. Set Features Host Behavior Support
    /// with LBAFEE (byte 2, bit 0) clear is refused where the driver set it
    /// (the namespaces' Extended LBA Formats are read with it).
    ///
    /// Features the driver sets again after a controller reset keep the
    /// application's value once the controller accepted it: Asynchronous
    /// Event Configuration and Host Behavior Support (the 512-byte
    /// structure as sent).
    ///
    /// An error status is returned as [`Error::Command`]. The wait is
    /// bounded by the controller's `admin_timeout`; a command that may take
    /// longer (Firmware Commit with activation, up to Identify Controller
    /// MTFA; a large vendor-specific transfer) takes
    /// [`Controller::admin_passthrough_with_timeout`].
    ///
    /// The wait does not hold the controller's admin queue: other threads'
    /// admin commands, a queue pair re-creating its queues and
    /// [`Controller::reset`] run meanwhile. A reset before the completion
    /// (another thread's, a pair's timeout recovery, the automatic one after
    /// a fatal status) ends the wait with [`Error::Io`] carrying
    /// [`crate::IoError::ControllerReset`]: the command may or may not have
    /// taken effect. Three commands are waited for under the admin queue's
    /// lock, because the driver records their completion: Set Features
    /// Asynchronous Event Configuration and Host Behavior Support, and Get
    /// Log Page with Retain Asynchronous Event (CDW10 bit 15) clear.
    /// Commands from many threads share the admin queue's command
    /// identifiers, less those the driver keeps (its event requests and
    /// two for its own commands): one that finds none free waits for one,
    /// up to the same bound, and is [`Error::AdminBusy`] (nothing sent, the
    /// controller fine) when none comes; once sent it has the whole bound
    /// for its completion.
    pub fn admin_passthrough(
        &self,
        sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.admin_passthrough_with_timeout(sqe, data_len, data_out, self.inner.admin_timeout)
    }

    /// [`Controller::admin_passthrough`] with its own bound on the wait
    /// instead of `admin_timeout`. A command that gets no answer within it
    /// marks the controller failed, as any admin timeout does
    /// ([`Controller::reset`] brings it back); its data buffer is kept until
    /// the command completes or the controller is disabled.
    pub fn admin_passthrough_with_timeout(
        &self,
        sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.inner
            .application_passthrough(sqe, data_len, data_out, timeout)
    }

    /// A handle for admin commands that does not borrow this controller
    /// (see [`AdminHandle`]).
    pub fn admin_handle(&self) -> AdminHandle<D> {
        AdminHandle::new(&self.inner)
    }

    /// [`Controller::admin_passthrough`] without its checks: any opcode,
    /// and without data the SQE's own PRP1/PRP2, PSDT and MPTR are sent as
    /// given (e.g. a queue's memory for Create I/O Completion Queue). Only
    /// with the `raw` feature (`upnvme-rawfloor` creates its queues this
    /// way).
    ///
    /// Outside the driver's safety argument (docs/DESIGN.md, "Escape
    /// hatches"): the device reads or writes whatever the pointers name for
    /// as long as the command, or a queue it created, lives; that memory
    /// must stay mapped and untouched meanwhile. Queues created here under
    /// IDs an [`crate::IoQueuePair`] uses break that pair; queues under
    /// other IDs are the caller's to delete before a reset or a close (which
    /// delete only the pairs' queues).
    #[cfg(feature = "raw")]
    pub fn admin_passthrough_raw(
        &self,
        sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
    ) -> Result<(Cqe, Vec<u8>)> {
        let len = passthrough_len(data_len, data_out)?;
        let what = format!("admin command 0x{:02x}", sqe.opcode());
        self.inner
            .execute_with(sqe, (len > 0).then_some(len), data_out, &what)
    }

    /// Resets the controller (disable, re-enable, re-create the admin state)
    /// and clears a failure. Queue pairs survive: each completes its in-flight
    /// commands once with [`crate::IoError::ControllerReset`] at its next call
    /// and re-creates its queues (see [`crate::IoQueuePair`]).
    ///
    /// Before it returns, the namespace handles are checked against Identify
    /// Namespace (a namespace changed during the reset raised no notice) and
    /// those whose geometry or identity changed are retired (a namespace attached
    /// during the reset is looked for too), as
    /// [`Controller::poll_async_events`] does after a reset a queue pair
    /// started. Should the controller fail during that check, the error is
    /// returned: `Ok` means the controller is usable.
    pub fn reset(&self) -> Result<()> {
        self.inner.reset()?;
        let _check = self
            .inner
            .namespace_check
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self
            .inner
            .namespaces_unverified
            .swap(false, Ordering::AcqRel)
            && self.follow_namespace_changes(&[], true)
        {
            // Handed out by the next `poll_async_events`.
            self.inner
                .admin()?
                .keep_event_once(namespace_attribute_changed());
        }
        // The check's admin commands may have failed the controller (no
        // answer, a protocol violation): then the reset did not leave it
        // usable, and says so.
        self.inner.check_usable()
    }

    /// How many controller resets happened (explicit and automatic).
    pub fn resets(&self) -> u64 {
        self.inner.resets.load(Ordering::Relaxed)
    }

    /// Shuts the controller down now (CC.SHN normal, wait CSTS.SHST complete,
    /// CC.EN = 0). Further calls on this controller or its queue pairs fail with
    /// [`Error::Closed`]. Dropping the controller does the same once its
    /// queue pairs are gone too (they share its state; while one lives, a
    /// dropped controller stays up for it).
    pub fn close(self) -> Result<()> {
        // A release on the kernel's request that cut the shutdown short
        // (BAR0 reads all ones after it) is named as such, as every other
        // call names it.
        self.inner
            .shutdown()
            .map_err(|e| self.inner.removal_named(e))
    }
}

/// What a queue pair may use of its controller (qpair/ reads no field of
/// `Inner` directly): the device, its name, CAP, the shadow doorbell
/// buffers, the instance number, the state word and generation, queue IDs,
/// queue creation, admin commands, failure, reset and quarantine.
impl<D: Device> Inner<D> {
    /// The device (registers and DMA memory).
    #[inline(always)]
    pub(crate) fn dev(&self) -> &D {
        &self.dev
    }

    /// The device name for messages.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Controller Capabilities as read at bring-up.
    pub(crate) fn cap(&self) -> Cap {
        self.cap
    }

    /// The shadow doorbell and EventIdx buffers, when they were allocated
    /// and the controller took Doorbell Buffer Config at bring-up (a later
    /// reset may have turned them off: `shadow_on`; each pair's `Doorbells`
    /// says whether it uses them).
    #[inline(always)]
    pub(crate) fn shadow(&self) -> Option<&ShadowBuffers> {
        self.shadow.as_ref()
    }

    /// The process-unique number namespace handles carry.
    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }
}

impl<D: Device> Inner<D> {
    pub(crate) fn admin(&self) -> Result<MutexGuard<'_, AdminQueue>> {
        self.admin.lock().map_err(|_| Error::ControllerFailed {
            device: self.name.clone(),
            reason: "admin queue lock poisoned".into(),
        })
    }

    /// Builds a [`Error::DeviceFault`] and marks the controller failed.
    pub(crate) fn fault(&self, what: String) -> Error {
        let e = Error::DeviceFault {
            device: self.name.clone(),
            what,
        };
        self.mark_failed(&e);
        e
    }

    pub(crate) fn mark_failed(&self, e: &Error) {
        if let Ok(mut f) = self.failure.lock()
            && f.is_none()
        {
            *f = Some(e.to_string());
        }
        self.state.fetch_or(STATE_FAILED, Ordering::AcqRel);
    }

    /// The kernel asked for the device back (VFIO device request: removal or
    /// unbind). Ends the controller's use of it at once, without waiting for
    /// the application: CC.EN = 0 while the controller still answers (up to
    /// [`RELEASE_DISABLE_WAIT`] for CSTS.RDY = 0), then the device's release
    /// (bus mastering off, BAR0 replaced by all ones, the VFIO device closed
    /// — which lets the kernel's removal finish), then a new generation: each
    /// queue pair ends its commands in flight exactly once with
    /// `IoError::ControllerRemoved`, with their buffers, at its next call —
    /// if DMA is known to have stopped (released, or CSTS.RDY = 0 read
    /// back); otherwise no new generation: nothing the device may still
    /// write is handed back.
    /// The admin lock is not taken (a caller may hold it in a long wait; it
    /// sees the all-ones registers and gives up).
    pub(crate) fn release_on_request(&self) {
        // From here to the new generation no queue pair writes a doorbell
        // (its one-load check fails): the CC.EN = 0 below deletes every
        // queue, and the device's release may take a while (closing a VFIO
        // device resets the function). A pair that wants to submit
        // meanwhile waits for the end (`wait_for_reset`).
        self.state.fetch_or(STATE_RELEASING, Ordering::AcqRel);
        // After the bit: whoever sees the flag and then waits for the
        // release's end (`wait_for_release`) finds the bit set, or cleared
        // by that end — never a release that has not marked itself yet.
        // SeqCst (a locked instruction on x86): the flag is visible to
        // others before the CC read below, as a reset's last look at it
        // after its CC.EN = 1 assumes.
        self.removed.store(true, Ordering::SeqCst);
        // A panic from here on (a device access, `Device::release`) would
        // leave "releasing" set and every submission waiting for its end.
        let _unwinding = ReleasingGuard(self);
        if let Ok(mut f) = self.failure.lock()
            && f.is_none()
        {
            *f = Some(
                Error::ControllerRemoved {
                    device: self.name.clone(),
                }
                .to_string(),
            );
        }
        // Whether the controller itself said it stopped: CSTS.RDY = 0 read
        // back (not all ones) with CC.EN = 0.
        let mut disabled = false;
        let csts = Csts(self.dev.read32(REG_CSTS));
        if !csts.is_all_ones() {
            let cc = Cc(self.dev.read32(REG_CC));
            if cc.en() {
                self.dev
                    .write32(REG_CC, cc.with_en(false).with_shn(Cc::SHN_NONE).0);
                disabled = wait_csts(
                    &self.dev,
                    &self.name,
                    RELEASE_DISABLE_WAIT,
                    "CSTS.RDY = 0 after CC.EN = 0 (release)",
                    None,
                    |c| !c.rdy(),
                )
                .is_ok();
            } else {
                disabled = !csts.rdy();
            }
        }
        let released = self.dev.release();
        // DMA has stopped if the device was released (bus mastering off or
        // the device file really closed) or the controller was disabled.
        let stopped = released || disabled;
        // Poisoned or not: dropping the pages unlocked would hand memory
        // the device may still write back to the allocator.
        let mut q = self
            .quarantine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stopped {
            q.clear();
        } else {
            // The device did not say it can no longer reach memory:
            // what it was given is never handed out again.
            std::mem::forget(std::mem::take(&mut *q));
        }
        drop(q);
        // Closed, failed and a new generation in one step: a queue pair that
        // sees the controller unusable also sees that its commands ended (and
        // delivers them, with their buffers) — never one without the other.
        // Unless DMA is not known to have stopped: then no new generation,
        // so the pairs do not hand back buffers (or free queue memory) the
        // device may still write; their commands stay in flight and their
        // memory is kept when they are dropped, as for any failed
        // controller.
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let s = (s & !STATE_RELEASING) | STATE_CLOSED | STATE_FAILED;
                Some(if stopped {
                    s.wrapping_add(1 << STATE_GENERATION_SHIFT)
                } else {
                    s
                })
            });
    }

    /// Whether the controller was released on the kernel's request.
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Whether `close()` (or the last drop) shut the controller down.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & STATE_CLOSED != 0
    }

    /// The error for a closed controller: [`Error::ControllerRemoved`] when
    /// the close was the kernel's release request (the application did not
    /// close it), else [`Error::Closed`].
    fn closed_error(&self) -> Error {
        if self.is_removed() {
            Error::ControllerRemoved {
                device: self.name.clone(),
            }
        } else {
            Error::Closed {
                device: self.name.clone(),
            }
        }
    }

    /// Cheap check for the I/O path: neither failed nor closed.
    #[inline]
    pub(crate) fn is_usable(&self) -> bool {
        self.state.load(Ordering::Acquire) & (STATE_CLOSED | STATE_FAILED) == 0
    }

    /// The state word (see `state`): equal to `generation <<
    /// STATE_GENERATION_SHIFT` exactly when the controller is usable and no
    /// reset happened since `generation` — the I/O path's one-load check.
    #[inline(always)]
    pub(crate) fn state(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// The reset generation.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> STATE_GENERATION_SHIFT
    }

    /// A reset or close disabled the controller: a new generation.
    fn bump_generation(&self) {
        self.state
            .fetch_add(1 << STATE_GENERATION_SHIFT, Ordering::AcqRel);
    }

    /// The error that explains why the controller is not usable.
    pub(crate) fn unusable_error(&self) -> Error {
        match self.check_usable() {
            Err(e) => e,
            Ok(()) => Error::ControllerFailed {
                device: self.name.clone(),
                reason: "the queue pair saw a device fault".into(),
            },
        }
    }

    /// The controller's SGL support (Identify Controller SGLS bits 1:0).
    pub(crate) fn sgl_support(&self) -> upnvme_queues::sgl::SglSupport {
        upnvme_queues::sgl::SglSupport::from_sgls(self.identify.sgls)
    }

    /// Identify Controller SGLS SDT (bits 15:8): the recommended maximum
    /// number of Data Block descriptors per command, `None` when 0.
    pub(crate) fn sgl_descriptor_threshold(&self) -> Option<u8> {
        upnvme_queues::sgl::descriptor_threshold(self.identify.sgls)
    }

    /// Identify Controller ONCS (Optional NVM Command Support).
    pub(crate) fn oncs(&self) -> u16 {
        self.identify.oncs
    }

    /// Identify Controller OCFS (Optional Copy Formats Supported).
    pub(crate) fn ocfs(&self) -> u16 {
        self.identify.ocfs
    }

    /// Host Behavior Support CDFE as set now: bit *n* enables Copy
    /// Descriptor Format *n*h (formats 2h–4h need it).
    pub(crate) fn copy_formats_enabled(&self) -> u16 {
        self.cdfe.load(Ordering::Acquire)
    }

    /// Largest transfer in bytes per command, `None` when MDTS = 0.
    pub(crate) fn max_transfer(&self) -> Option<usize> {
        mdts_limit(self.cap.min_page_size(), self.identify.mdts)
    }

    /// Takes a free I/O queue ID.
    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        let mut q = self.qids.lock().map_err(|_| Error::ControllerFailed {
            device: self.name.clone(),
            reason: "queue ID lock poisoned".into(),
        })?;
        match q.iter().position(|used| !used) {
            Some(i) => {
                q[i] = true;
                Ok(i as u16 + 1)
            }
            None => Err(Error::NoQueuesLeft {
                device: self.name.clone(),
                granted: self.granted_io_queues,
            }),
        }
    }

    /// Whether any I/O queue ID is taken: a queue pair exists (or its
    /// queues may still exist at the controller). A poisoned lock answers
    /// yes.
    pub(crate) fn io_queues_in_use(&self) -> bool {
        self.qids
            .lock()
            .map_or(true, |q| q.iter().any(|&used| used))
    }

    /// Returns an I/O queue ID.
    pub(crate) fn free_qid(&self, qid: u16) {
        if let Ok(mut q) = self.qids.lock()
            && let Some(u) = q.get_mut(qid as usize - 1)
        {
            *u = false;
        }
    }

    /// Keeps `qid` in use until the controller is next disabled: its queues
    /// may still exist (a Create I/O SQ failed and the Delete I/O CQ that
    /// should have undone the CQ failed too, or a pair's deletion failed).
    /// `generation` is the one the caller saw the queues in: if a reset has
    /// disabled the controller since, the queues are gone and the ID is free
    /// at once.
    pub(crate) fn hold_qid(&self, qid: u16, generation: u64) {
        // A poisoned lock keeps the ID in use: never handed out again.
        if let Ok(mut held) = self.held_qids.lock() {
            if self.generation() == generation {
                held.push(qid);
                return;
            }
        } else {
            return;
        }
        self.free_qid(qid);
    }

    /// A new generation after the controller was disabled, and the queue
    /// IDs held for queues that may have existed free again — in one step
    /// under the held-ID lock, so that `hold_qid` either sees the old
    /// generation and is drained here, or the new one and frees at once.
    fn bump_generation_after_disable(&self) {
        let held = self.held_qids.lock();
        self.bump_generation();
        if let Ok(mut held) = held {
            for qid in std::mem::take(&mut *held) {
                self.free_qid(qid);
            }
        }
    }

    /// Keeps memory alive until the controller is disabled.
    pub(crate) fn quarantine(&self, bufs: Vec<DmaPages>) {
        // Also when poisoned: dropping `bufs` here would free pages the
        // device may still write.
        self.quarantine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(bufs);
    }

    /// Create I/O Completion Queue `qid`, then Create I/O Submission Queue
    /// `qid` on it (deleting the CQ again if the SQ fails), under one hold of
    /// the admin lock; returns the reset generation read under that lock —
    /// the one the new queues belong to, since a reset (which holds the lock
    /// throughout) cannot come between — and whether that generation has
    /// shadow doorbells.
    pub(crate) fn create_io_queues(
        &self,
        cq: Sqe,
        sq: Sqe,
        qid: u16,
        when: &str,
    ) -> std::result::Result<Created, CreateFailure> {
        let t = self.admin_timeout;
        let mut cq_left = None;
        let mut during = None;
        self.with_admin(|dev, name, admin| {
            during = Some(self.generation());
            let what = format!("Create I/O Completion Queue {qid}{when}");
            let (cqe, _) = admin.execute(dev, name, cq, None, None, t, &what)?;
            succeeded(cqe, &what)?;
            let what = format!("Create I/O Submission Queue {qid}{when}");
            let created = admin
                .execute(dev, name, sq, None, None, t, &what)
                .and_then(|(cqe, _)| succeeded(cqe, &what));
            if let Err(e) = created {
                let what = format!("Delete I/O Completion Queue {qid} (undoing the CQ)");
                let deleted = admin
                    .execute(dev, name, Sqe::delete_io_cq(qid), None, None, t, &what)
                    .and_then(|(cqe, _)| succeeded(cqe, &what));
                if let Err(undo) = deleted {
                    // Read under the admin lock, which a reset holds
                    // throughout: the generation the CQ exists in.
                    cq_left = Some(self.generation());
                    // A deletion that got no answer (or a broken one) says
                    // more about the controller than the SQ's status: it is
                    // the error, so `with_admin` marks the controller
                    // failed as for any admin timeout.
                    if !matches!(undo, Error::Command { .. }) {
                        return Err(undo);
                    }
                }
                return Err(e);
            }
            Ok(Created {
                generation: self.generation(),
                shadow_on: self.shadow.is_some() && self.shadow_on.load(Ordering::Relaxed),
            })
        })
        .map_err(|error| CreateFailure {
            error,
            cq_left,
            during,
        })
    }

    /// Executes an admin command without data; an error status is an error.
    pub(crate) fn admin_command(&self, sqe: Sqe, what: &str) -> Result<Cqe> {
        self.execute(sqe, None, what).map(|(c, _)| c)
    }

    /// [`Inner::admin_command`] that waits for the admin lock only until
    /// `lock_by` (`None`: for as long as it takes): `Ok(None)` when another
    /// holder (an admin command, a reset, a Format NVM on a small admin
    /// queue) still had it then, and nothing was sent. The command itself
    /// is then waited for up to the admin timeout, so it ends by `lock_by`
    /// plus the admin timeout. For the timeout scan's Abort inside a
    /// blocking call, which must keep to the caller's timeout (std has no
    /// timed lock: `try_lock` every [`ADMIN_LOCK_POLL`]).
    pub(crate) fn admin_command_by(
        &self,
        sqe: Sqe,
        what: &str,
        lock_by: Option<Instant>,
    ) -> Result<Option<Cqe>> {
        let Some(lock_by) = lock_by else {
            return self.admin_command(sqe, what).map(Some);
        };
        self.check_usable()?;
        let mut admin = loop {
            match self.admin.try_lock() {
                Ok(admin) => break admin,
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    return Err(Error::ControllerFailed {
                        device: self.name.clone(),
                        reason: "admin queue lock poisoned".into(),
                    });
                }
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            let now = Instant::now();
            if now >= lock_by {
                return Ok(None);
            }
            std::thread::sleep(ADMIN_LOCK_POLL.min(lock_by - now));
        };
        // Again under the lock, as `with_admin`.
        self.check_usable()?;
        let r = admin.execute(
            &self.dev,
            &self.name,
            sqe,
            None,
            None,
            self.admin_timeout,
            what,
        );
        drop(admin);
        let (cqe, _) = self.settle(r)?;
        succeeded(cqe, what).map(Some)
    }

    /// Fails fast when the controller is closed or failed.
    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.is_removed() {
            return Err(Error::ControllerRemoved {
                device: self.name.clone(),
            });
        }
        if self.is_closed() {
            return Err(Error::Closed {
                device: self.name.clone(),
            });
        }
        if let Ok(f) = self.failure.lock()
            && let Some(reason) = f.as_ref()
        {
            return Err(Error::ControllerFailed {
                device: self.name.clone(),
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    /// Runs `f` on the admin queue; device-level failures mark the controller
    /// failed.
    fn with_admin<T>(&self, f: impl FnOnce(&D, &str, &mut AdminQueue) -> Result<T>) -> Result<T> {
        self.check_usable()?;
        let mut admin = self.admin()?;
        // Again under the lock: a close may have deleted the I/O queues and
        // released it while this caller waited (nothing may be created then).
        self.check_usable()?;
        let r = f(&self.dev, &self.name, &mut admin);
        drop(admin);
        self.settle(r)
    }

    /// [`Inner::with_admin`] for a command already in flight: runs `f`
    /// whatever state the controller is marked in (failed by a queue
    /// pair's fault, by another thread's timeout), because the command's
    /// completion, if it came, is its answer — as a waiter under the lock
    /// gets it. Its errors are settled as `with_admin`'s.
    fn with_admin_in_flight<T>(
        &self,
        f: impl FnOnce(&D, &str, &mut AdminQueue) -> Result<T>,
    ) -> Result<T> {
        let mut admin = self.admin()?;
        let r = f(&self.dev, &self.name, &mut admin);
        drop(admin);
        self.settle(r)
    }

    /// What an admin step's error means for the controller: a removal is
    /// named, a fatal status resets it, a fault or timeout marks it failed.
    fn settle<T>(&self, r: Result<T>) -> Result<T> {
        // All-ones registers from a release (the kernel asked for the
        // device back) are named as such.
        let r = r.map_err(|e| self.removal_named(e));
        if let Err(Error::ControllerFatal { .. }) = &r {
            // Automatic recovery: CSTS.CFS means the controller must be reset.
            // The command that saw it still fails; the next one may succeed.
            if self.reset().is_ok() {
                return r;
            }
        }
        if let Err(e) = &r
            && matches!(
                e,
                Error::DeviceFault { .. }
                    | Error::Timeout { .. }
                    | Error::ControllerGone { .. }
                    | Error::ControllerFatal { .. }
            )
        {
            self.mark_failed(e);
        }
        // The first caller learns what the later ones are told (failed
        // earlier, until a reset): an admin command without an answer
        // leaves the controller marked failed.
        if let Err(Error::Timeout { what, after }) = r {
            return Err(Error::Timeout {
                what: format!(
                    "{what}; the controller is now marked failed (Controller::reset brings it \
                     back)"
                ),
                after,
            });
        }
        r
    }

    pub(crate) fn execute(
        &self,
        sqe: Sqe,
        data_len: Option<usize>,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.execute_with(sqe, data_len, None, what)
    }

    /// Executes an admin command with an optional data buffer of `data_len`
    /// bytes (filled from `data_out` when given) and checks its status.
    fn execute_with(
        &self,
        sqe: Sqe,
        data_len: Option<usize>,
        data_out: Option<&[u8]>,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.execute_within(sqe, data_len, data_out, what, self.admin_timeout)
    }

    /// [`Inner::execute_with`] with its own timeout (Format NVM may take
    /// far longer than other admin commands).
    pub(crate) fn execute_within(
        &self,
        sqe: Sqe,
        data_len: Option<usize>,
        data_out: Option<&[u8]>,
        what: &str,
        timeout: Duration,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.execute_for_application(sqe, data_len, data_out, what, timeout, false)
    }

    /// A command sent and waited for without holding the admin lock in
    /// between (up to `timeout`): while a long command runs (Format NVM, a
    /// secure erase taking minutes, a Firmware Commit), other threads'
    /// admin commands — a queue pair re-creating its queues after a reset,
    /// an event poll — run. `data` is the command's data buffer and the PRP
    /// List page its PRP2 points to, if any (the SQE names them already):
    /// the admin queue keeps them while the device may use them, and the
    /// buffer comes back with the completion. The lock is taken for the
    /// submission and for each look at the admin CQ: looks follow each
    /// other (yielding in between) for the first [`DETACHED_SPIN`], so a
    /// quick command is not slowed down, then come every
    /// [`DETACHED_POLL`]; CSTS is read every 16th look. A controller reset
    /// meanwhile (another thread's, or an automatic one after a fatal
    /// status) ends the wait with [`crate::IoError::ControllerReset`]: the
    /// command may or may not have taken effect. No answer within
    /// `timeout` of its submission marks the controller failed, as any
    /// admin timeout. An application command (`own` false) takes an
    /// identifier only where [`AdminQueue::detached_room`] leaves the
    /// driver its own, waiting up to `timeout` for one ([`Error::AdminBusy`]);
    /// the driver's own command (`own`: Format NVM) takes one of those.
    pub(crate) fn execute_detached(
        &self,
        sqe: Sqe,
        data: Option<(DmaBuffer, Option<DmaBuffer>)>,
        what: &str,
        timeout: Duration,
        own: bool,
    ) -> Result<(Cqe, Option<DmaBuffer>)> {
        let start = Instant::now();
        let mut data = data.map_or((None, None), |(d, l)| (Some(d), l));
        let (ticket, sent) = loop {
            let started = self.with_admin(|dev, name, admin| {
                // The driver's own command (Format NVM: one at a time,
                // `Inner::format_lock`) takes one of the identifiers kept
                // for the driver, whatever the queue's size.
                let room = if own {
                    Room::Yes
                } else {
                    admin.detached_room()
                };
                if room == Room::NotNow {
                    return Ok(Start::Wait(admin.detached_in_flight(), data));
                }
                let (data, list) = data;
                if room == Room::Never {
                    // An admin queue too small to leave the driver its
                    // identifiers: waited for under the lock, as before.
                    return admin
                        .execute(dev, name, sqe, data, list, timeout, what)
                        .map(Start::Done);
                }
                admin
                    .start_detached(dev, name, sqe, data, list)
                    .map(Start::Ticket)
            })?;
            match started {
                // The bound of the completion runs from here: waiting for
                // an identifier did not count, as waiting for the lock
                // did not.
                Start::Ticket(t) => break (t, Instant::now()),
                Start::Done((cqe, buf)) => return Ok((succeeded(cqe, what)?, buf)),
                Start::Wait(outstanding, back) => {
                    data = back;
                    // Nothing was sent: the controller is not to blame.
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(Error::AdminBusy {
                            device: self.name.clone(),
                            what: what.to_string(),
                            outstanding,
                            after: waited,
                        });
                    }
                    std::thread::sleep(DETACHED_POLL);
                }
            }
        };
        // A reset ended it, or a close (whose disabling ends it the same
        // way): the close is named, since nothing will follow it.
        let ended = || {
            if self.is_closed() {
                self.closed_error()
            } else {
                Error::Io {
                    command: what.to_string(),
                    error: crate::IoError::ControllerReset,
                }
            }
        };
        let mut looks = 0u32;
        loop {
            if sent.elapsed() < DETACHED_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(DETACHED_POLL);
            }
            looks = looks.wrapping_add(1);
            // Not refused when something marked the controller failed
            // meanwhile: the command is in flight, and its completion is the
            // answer.
            let outcome = self.with_admin_in_flight(|dev, name, admin| {
                // CSTS is read before the reap below, so that whatever a
                // controller the release stopped posted before it stopped
                // is seen there; it answers no more after.
                let csts = looks.is_multiple_of(16).then(|| Csts(dev.read32(REG_CSTS)));
                // The CQ first: a completion there is the answer, whatever
                // CSTS says.
                admin.reap(dev, name)?;
                match admin.detached_outcome(ticket) {
                    Detached::Done(cqe, buf) => return Ok(Some((cqe, buf))),
                    Detached::Ended => return Err(ended()),
                    Detached::Pending => {}
                }
                if let Some(csts) = csts {
                    if admin.stopped_by_release(csts) {
                        return Err(Error::ControllerRemoved {
                            device: name.to_string(),
                        });
                    }
                    crate::admin::csts_alive(csts, name)?;
                }
                let waited = sent.elapsed();
                if waited >= timeout {
                    return Err(Error::Timeout {
                        what: format!("{what} to complete on the admin queue"),
                        after: waited,
                    });
                }
                Ok(None)
            });
            match outcome {
                Ok(Some((cqe, buf))) => return Ok((succeeded(cqe, what)?, buf)),
                Ok(None) => {}
                Err(e) => {
                    let Ok(mut admin) = self.admin() else {
                        return Err(e);
                    };
                    // After a fatal status `settle` reset the controller;
                    // that reset's reap may have taken the completion, as
                    // may a reap before a fault. So what became of the
                    // command decides: its completion, or the reset that
                    // ended it.
                    match admin.detached_outcome(ticket) {
                        Detached::Done(cqe, buf) => return Ok((succeeded(cqe, what)?, buf)),
                        Detached::Ended if matches!(e, Error::ControllerFatal { .. }) => {
                            return Err(ended());
                        }
                        Detached::Ended | Detached::Pending => {}
                    }
                    admin.abandon(ticket);
                    return Err(e);
                }
            }
        }
    }

    /// [`Controller::admin_passthrough_with_timeout`]'s work (also
    /// [`AdminHandle`]'s).
    pub(crate) fn application_passthrough(
        &self,
        mut sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(Cqe, Vec<u8>)> {
        if let Some(why) = passthrough_refusal(&sqe) {
            return Err(Error::InvalidArgument(format!(
                "admin command 0x{:02x} through admin_passthrough: {why}",
                sqe.opcode()
            )));
        }
        if timeout.is_zero() {
            // Sent and given up at once: the command would run on with its
            // memory quarantined and an identifier taken, its result lost.
            return Err(Error::InvalidArgument(format!(
                "admin command 0x{:02x} through admin_passthrough_with_timeout: a timeout of \
                 zero would give the command up as soon as it is sent; pass the time it may \
                 take (admin_passthrough uses ControllerOptions::admin_timeout)",
                sqe.opcode()
            )));
        }
        if sqe.opcode() == admin_op::GET_LOG_PAGE
            && !self.identify.lpa_extended_data()
            && (sqe.dw[10] >> 28 != 0
                || sqe.dw[11] & 0xffff != 0
                || sqe.dw[12] != 0
                || sqe.dw[13] != 0)
        {
            // Such a controller reads a 12-bit Number of Dwords (CDW10
            // bits 27:16) and no Log Page Offset: it would move fewer
            // bytes than the data pointer describes — two pages where a
            // PRP List was built would put the log into the list page —
            // or the log's start as the bytes asked for.
            return Err(Error::InvalidArgument(format!(
                "Get Log Page through admin_passthrough with NUMDL bits 15:12, NUMDU or \
                 LPOL/LPOU set (CDW10 0x{:08x}, CDW11 0x{:08x}, CDW12 0x{:08x}, CDW13 0x{:08x}): \
                 the controller has no Extended Data for Get Log Page (Identify Controller LPA \
                 bit 2 clear), so no Log Page Offset and at most 4096 dwords (a 12-bit Number \
                 of Dwords)",
                sqe.dw[10], sqe.dw[11], sqe.dw[12], sqe.dw[13]
            )));
        }
        if sqe.opcode() == admin_op::SET_FEATURES
            && sqe.dw[10] as u8 == feature::HOST_BEHAVIOR_SUPPORT
            && self.lbafee
            && data_out.is_none_or(|d| d.get(2).is_none_or(|b| b & 1 == 0))
        {
            // The handles' formats (the 64-bit guard's protection
            // information among them) were read with LBAFEE set: cleared
            // behind them, the controller would interpret them otherwise.
            return Err(Error::InvalidArgument(
                "Set Features Host Behavior Support through admin_passthrough with LBAFEE \
                 (byte 2, bit 0) clear: the driver enabled Extended LBA Formats (the controller \
                 reports CTRATT.ELBAS) and reads the namespaces' formats with it; keep byte 2 bit \
                 0 set"
                    .into(),
            ));
        }
        // Without data no pointer is the caller's either (with data,
        // `admin_data_buffer` fills them in).
        sqe.set_psdt(0);
        sqe.set_prp1(0);
        sqe.set_prp2(0);
        sqe.dw[4] = 0;
        sqe.dw[5] = 0;
        let len = passthrough_len(data_len, data_out)?;
        let (len, data_out) = match admin_transfer(&sqe) {
            Some((name, need)) if (len as u64) < need => {
                // A data pointer for fewer bytes than the command moves:
                // the controller would go past it — to IOVA 0 with no data
                // (an IOMMU fault, while the command completes with
                // success).
                return Err(Error::InvalidArgument(format!(
                    "admin command 0x{:02x} ({name}) moves {need} bytes through its data \
                     pointer, but the call describes {len}: pass data_len {need}",
                    sqe.opcode()
                )));
            }
            // More than the command moves: the data pointer describes what
            // it moves, no more. A PRP List for pages the command does not
            // use would be taken as a data page by a controller moving two
            // pages (the data landing in the list, the caller's second
            // page zeros).
            Some((_, need)) => {
                let need = need as usize;
                (need, data_out.map(|d| &d[..d.len().min(need)]))
            }
            None => (len, data_out),
        };
        let what = format!("admin command 0x{:02x}", sqe.opcode());
        let done = self.execute_for_application(
            sqe,
            (len > 0).then_some(len),
            data_out,
            &what,
            timeout,
            true,
        )?;
        // Get Log Page with Retain Asynchronous Event (CDW10 bit 15) clear of
        // the Changed Namespace List: what it named is checked at the next
        // poll.
        if sqe.opcode() == admin_op::GET_LOG_PAGE
            && sqe.dw[10] & (1 << 15) == 0
            && done.0.status().is_success()
            && self.notice_gaps.log_read(sqe.dw[10] as u8)
        {
            self.namespaces_unverified.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// [`Inner::execute_within`]; with `application`, a command the
    /// application sent (`set_features`, `admin_passthrough`): a Set
    /// Features Asynchronous Event Configuration or Host Behavior Support
    /// it completes is recorded under the admin lock, so that a reset on
    /// another thread restores either the value before it or this one,
    /// never the older value after this one took effect. Any other
    /// application command is waited for without holding the lock
    /// ([`Inner::execute_detached`]): it may run for long (a Firmware
    /// Commit, a Sanitize or Device Self-test start, a vendor's command),
    /// and the driver records nothing of its completion. A Get Log Page
    /// with Retain Asynchronous Event clear holds the lock too: the admin
    /// queue follows which Notice it re-arms (`AdminQueue::execute`).
    pub(crate) fn execute_for_application(
        &self,
        mut sqe: Sqe,
        data_len: Option<usize>,
        data_out: Option<&[u8]>,
        what: &str,
        timeout: Duration,
        application: bool,
    ) -> Result<(Cqe, Vec<u8>)> {
        let set_features = application && sqe.opcode() == admin_op::SET_FEATURES;
        let sets_aec = set_features && sqe.dw[10] as u8 == feature::ASYNC_EVENT_CONFIG;
        let sets_hbs = set_features && sqe.dw[10] as u8 == feature::HOST_BEHAVIOR_SUPPORT;
        let rearms_notice = sqe.opcode() == admin_op::GET_LOG_PAGE && sqe.dw[10] & (1 << 15) == 0;
        let detached = application && !sets_aec && !sets_hbs && !rearms_notice;
        let (buf, list) = match data_len {
            Some(len) => {
                let (buf, list) = admin_data_buffer(&self.dev, len, &mut sqe, self.mdts_bytes())?;
                if let Some(d) = data_out {
                    buf.write_bytes(0, d)?;
                }
                (Some(buf), list)
            }
            None => (None, None),
        };
        let (cqe, buf) = if detached {
            // Checked for its status inside.
            self.execute_detached(sqe, buf.map(|b| (b, list)), what, timeout, false)?
        } else {
            let (cqe, buf) = self.with_admin(|dev, name, admin| {
                let done = admin.execute(dev, name, sqe, buf, list, timeout, what)?;
                if sets_aec && done.0.status().is_success() {
                    self.aec_set_by_application(sqe.dw[11]);
                }
                if sets_hbs && done.0.status().is_success() {
                    // Under the admin lock, as the AEC: a reset running
                    // after this restores this value, not an older one.
                    self.hbs_set_by_application(data_out.unwrap_or(&[]));
                }
                Ok(done)
            })?;
            (succeeded(cqe, what)?, buf)
        };
        let data = match (buf, data_len) {
            (Some(b), Some(len)) => {
                let mut v = vec![0; len];
                b.read_bytes(0, &mut v)?;
                v
            }
            _ => Vec::new(),
        };
        Ok((cqe, data))
    }

    /// The application set Host Behavior Support to `data` (its first 512
    /// bytes, zero-padded as the transfer was): resets set it again, and
    /// its CDFE says which Copy Descriptor Formats are enabled.
    fn hbs_set_by_application(&self, data: &[u8]) {
        let mut hbs = Box::new([0u8; HBS_LEN]);
        let n = data.len().min(HBS_LEN);
        hbs[..n].copy_from_slice(&data[..n]);
        // The formats it enables are the controller's now (cleared ones
        // refuse a cross-namespace Copy in them before it is sent).
        self.cdfe.store(hbs_cdfe(&hbs[..]), Ordering::Release);
        *self
            .hbs_by_application
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hbs);
    }

    /// The Host Behavior Support structure the application set, if any.
    fn hbs_by_application(&self) -> Option<Box<[u8; HBS_LEN]>> {
        self.hbs_by_application
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Forgets the application's Host Behavior Support (refused after a
    /// reset: the controller's defaults hold).
    fn forget_hbs_by_application(&self) {
        *self
            .hbs_by_application
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    fn mdts_bytes(&self) -> usize {
        self.max_transfer().unwrap_or(usize::MAX)
    }

    /// Identify Namespace `nsid` as a handle of this controller; `Err` of
    /// why not for an inactive namespace or an unusable LBA format.
    pub(crate) fn namespace_handle(
        &self,
        nsid: u32,
    ) -> Result<std::result::Result<Namespace, String>> {
        let data = self.identify_raw(cns::NAMESPACE, nsid)?;
        let idns = IdentifyNamespace::parse(&data)
            .map_err(|e| self.fault(format!("Identify Namespace {nsid}: {e}")))?;
        if !idns.is_active() {
            return Ok(Err(
                "its Identify Namespace reports NSZE 0 (detached or deleted after the \
                 Active Namespace ID list was read); Controller::refresh_namespaces reads \
                 the list again"
                    .into(),
            ));
        }
        let elbaf = if self.identify.ctratt_elbas() {
            match self.elbaf_reported(nsid, idns.current_lba_format_index())? {
                Some(e) => e,
                // The guard's size (ELBAF.PIF) decides the tuple's size
                // and where the metadata transfers end: without it, PI on
                // this namespace cannot be described.
                None if idns.dps & 0x7 != 0 => {
                    return Ok(Err(
                        "it has protection information, and the controller reports Extended LBA \
                         Formats (CTRATT.ELBAS) but refused Identify CNS 05h, so the size of its \
                         guard (ELBAF.PIF) is unknown"
                            .into(),
                    ));
                }
                None => 0,
            }
        } else {
            0
        };
        if let Some(why) = Namespace::unusable_reason(&idns, elbaf) {
            return Ok(Err(why));
        }
        Ok(Namespace::from_identify_elbaf(nsid, idns, elbaf)
            .map(|ns| ns.adopt(self.instance))
            .ok_or_else(|| "its Identify Namespace data is unusable".to_string()))
    }

    /// The Extended LBA Format dword (ELBAF) of LBA format `index` of
    /// namespace `nsid`, from the I/O Command Set specific Identify
    /// Namespace data structure for the NVM Command Set (CNS 05h, CSI 00h):
    /// bytes 12 + 4 × index. A controller that refuses CNS 05h with a
    /// status has none to report: 0, the 16-bit guard without storage tags.
    pub(crate) fn elbaf(&self, nsid: u32, index: usize) -> Result<u32> {
        Ok(self.elbaf_reported(nsid, index)?.unwrap_or(0))
    }

    /// [`Inner::elbaf`], `None` when the controller refused CNS 05h. A
    /// transient status (`Status::is_transient`: the namespace not ready)
    /// is an error, not a refusal: the format is not known now.
    fn elbaf_reported(&self, nsid: u32, index: usize) -> Result<Option<u32>> {
        let data = match self.identify_raw(cns::CSI_NAMESPACE, nsid) {
            Ok(d) => d,
            Err(Error::Command { status, .. }) if !status.is_transient() => return Ok(None),
            Err(e) => return Err(e),
        };
        let at = 12 + 4 * index;
        Ok(Some(data.get(at..at + 4).map_or(0, |b| {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })))
    }

    /// Identify Namespace `nsid` (CNS 00h) parsed, whatever its LBA format:
    /// for a namespace the driver has no handle for (Format NVM of an
    /// unusable one). An inactive one is [`Error::NoSuchNamespace`].
    pub(crate) fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace> {
        let data = self.identify_raw(cns::NAMESPACE, nsid)?;
        let idns = IdentifyNamespace::parse(&data)
            .map_err(|e| self.fault(format!("Identify Namespace {nsid}: {e}")))?;
        if !idns.is_active() {
            // Which are active, for the error; one the list names although
            // its Identify reports NSZE 0 is not "inactive".
            let active = self.active_nsids().unwrap_or_default();
            if active.contains(&nsid) {
                return Err(Error::UnusableNamespace {
                    device: self.name.clone(),
                    nsid,
                    reason: "the Active Namespace ID list names it, but its Identify Namespace \
                             reports NSZE 0 (detached or deleted meanwhile, or the controller \
                             contradicts itself); Controller::refresh_namespaces reads both again"
                        .into(),
                });
            }
            return Err(Error::NoSuchNamespace {
                device: self.name.clone(),
                nsid,
                active,
            });
        }
        Ok(idns)
    }

    pub(crate) fn identify_raw(&self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        let sqe = Sqe::identify(cns, nsid, 0);
        let (_, data) = self.execute(
            sqe,
            Some(PAGE),
            &format!("Identify (CNS 0x{cns:02x}, NSID {nsid})"),
        )?;
        Ok(data)
    }

    /// Controller reset (NVMe 2.0 §3.7.2, Controller Level Reset by CC.EN):
    /// disable, then bring the controller back with a fresh admin queue, the
    /// same number of I/O queues, Doorbell Buffer Config and AERs.
    ///
    /// What queue pairs see: once the controller is disabled (no DMA can
    /// happen any more) the reset generation is bumped; at its next call each
    /// queue pair completes every command it had in flight exactly once with
    /// [`crate::IoError::ControllerReset`] (buffers returned), re-creates its
    /// I/O queues under the same queue ID and carries on.
    pub(crate) fn reset(&self) -> Result<()> {
        self.reset_with(self.admin_timeout, None).map(drop)
    }

    /// [`Inner::reset`] for a fatal status or an overdue command seen in
    /// reset generation `seen` (a queue pair's): nothing when a reset
    /// happened since — it already answered what was seen (a CSTS.CFS read
    /// while another thread's reset was disabling the controller must not
    /// reset the healthy controller it brought back). Decided under the
    /// admin lock, which a reset holds throughout.
    pub(crate) fn reset_unless_since(&self, seen: u64) -> Result<()> {
        self.reset_with(self.admin_timeout, Some(seen)).map(drop)
    }

    /// [`Inner::reset_unless_since`] for a controller that let a command
    /// time out even after an Abort: it may not complete the queue
    /// deletions either, so they get at most one second (the reset itself
    /// does not need them). `Ok(false)` when a reset since `seen` made
    /// this one unneeded (nothing was done).
    pub(crate) fn reset_after_timeout(&self, seen: u64) -> Result<bool> {
        self.reset_with(self.admin_timeout.min(Duration::from_secs(1)), Some(seen))
    }

    /// `Ok(true)` when this call reset the controller, `Ok(false)` when a
    /// reset since `seen` made it unneeded.
    fn reset_with(&self, deletion_budget: Duration, seen: Option<u64>) -> Result<bool> {
        // A release on the kernel's request under way counts as closed: the
        // reset must not enable the controller the release is giving back.
        if self.is_closed() || self.is_removed() {
            return Err(self.closed_error());
        }
        let mut admin = self.admin.lock().map_err(|_| Error::ControllerFailed {
            device: self.name.clone(),
            reason: "admin queue lock poisoned".into(),
        })?;
        // Again under the lock: a close or a release that began while this
        // caller waited for it must not find the controller enabled again
        // afterwards.
        if self.is_closed() || self.is_removed() {
            return Err(self.closed_error());
        }
        if seen.is_some_and(|g| g != self.generation()) {
            return Ok(false);
        }
        // From here to the end no queue pair writes a doorbell (its one-load
        // check fails): the deletions below remove its queues before CC.EN =
        // 0 and the new generation. A pair that wants to submit meanwhile
        // waits for the end (`wait_for_reset`).
        self.state.fetch_or(STATE_RESETTING, Ordering::AcqRel);
        // Cleared however the reset ends: a panic inside it (a `Device`
        // implementation's, or a bug) must not leave every other thread's
        // submission waiting for ever in `wait_for_reset`; it leaves the
        // controller failed instead.
        let resetting = ResettingGuard(self);
        let r = self
            .reset_locked(&mut admin, deletion_budget)
            .map_err(|e| self.removal_named(e));
        if let Err(e) = &r {
            self.mark_failed(e);
        }
        drop(resetting);
        r.map(|()| true)
    }

    /// `e`, or `ControllerRemoved` for the all-ones registers of a device
    /// the driver released on the kernel's request: say that, as every
    /// later call does, not "gone".
    ///
    /// Also a timeout, a fault or a fatal status seen once a release began:
    /// the release disabled the controller under the command (no answer
    /// comes), so "marked failed, reset it" would be the wrong advice.
    fn removal_named(&self, e: Error) -> Error {
        match e {
            Error::ControllerGone { .. }
            | Error::Timeout { .. }
            | Error::DeviceFault { .. }
            | Error::ControllerFatal { .. }
                if self.is_removed() =>
            {
                Error::ControllerRemoved {
                    device: self.name.clone(),
                }
            }
            e => e,
        }
    }

    /// Returns once no reset and no release on the kernel's request is under
    /// way (at once when none runs). Yields
    /// rather than taking the admin lock: once the reset ends, the lock may
    /// pass to a long admin command (a Format NVM), and a caller with
    /// nothing to re-create need not wait for it (a pair that must re-create
    /// its queues does wait: that takes the admin lock). Bounded by the
    /// reset or the release, whose every step has a timeout.
    pub(crate) fn wait_for_reset(&self) {
        while self.state() & (STATE_RESETTING | STATE_RELEASING) != 0 {
            std::thread::yield_now();
        }
    }

    /// When a release on the kernel's request has begun: returns once it is
    /// over (bounded by its steps: up to [`RELEASE_DISABLE_WAIT`], then
    /// `Device::release`), so that its outcome — a new generation that
    /// ends every command in flight, or closed and failed without one — is
    /// visible. At once when no release began.
    pub(crate) fn wait_for_release(&self) {
        if self.is_removed() {
            while self.state() & STATE_RELEASING != 0 {
                std::thread::yield_now();
            }
        }
    }

    fn reset_locked(&self, admin: &mut AdminQueue, deletion_budget: Duration) -> Result<()> {
        let dev = &self.dev;
        let name = self.name.as_str();
        // What the admin CQ holds is lost at CC.EN = 0: take the
        // asynchronous events it has first (a Namespace Attribute Changed
        // notice, a SMART warning), so that `poll_async_events` still hands
        // them out (and follows them) after the reset. A controller that
        // posts garbage here fails the reap: the reset goes on regardless.
        if !Csts(dev.read32(REG_CSTS)).is_all_ones() {
            let _ = admin.reap(dev, name);
        }
        self.delete_io_queues(admin, deletion_budget);
        disable(dev, name, self.ready_timeout)?;
        // CC.EN = 0 cleared Doorbell Buffer Config: off until this reset's
        // is taken (a reset that fails before then leaves it off).
        self.shadow_on.store(false, Ordering::Relaxed);
        // The controller is disabled: nothing it was doing can touch memory any
        // more. Release what was kept for it and tell the queue pairs.
        admin.forget_in_flight();
        if let Ok(mut q) = self.quarantine.lock() {
            q.clear();
        }
        self.bump_generation_after_disable();
        self.resets.fetch_add(1, Ordering::Relaxed);
        self.namespaces_unverified.store(true, Ordering::Release);
        // A release on the kernel's request that began during the deletions
        // or the disable: leave the controller disabled (the release does
        // not take the admin lock, so only this check keeps CC.EN = 1 away).
        if self.is_removed() {
            return Err(self.closed_error());
        }

        let fresh = enable_with_admin_queue(
            dev,
            name,
            self.cap,
            admin.entries(),
            self.ready_timeout,
            Some(&self.removed),
        )
        .map_err(|f| {
            if let Some(keep) = f.keep {
                self.quarantine(keep);
            }
            f.error
        })?;
        // Events reaped before the reset and not yet handed out
        // (`poll_async_events`) survive it.
        let events = admin.take_events();
        let detached = admin.take_detached();
        *admin = fresh;
        admin.share_removal(self.removed.clone());
        admin.keep_events(events);
        // So do the reset epoch (a detached command's waiter learns of the
        // reset from it) and completions its waiters have not taken yet.
        admin.keep_detached(detached);
        // A release that began after the check above (it takes no lock)
        // found the controller disabled and is letting the device go, and
        // this CC.EN = 1 enabled it again under the release (had the release
        // seen it enabled, its CC.EN = 0 would have come after ours). Disable
        // again at once and send nothing (the admin queue, which shares the
        // release flag, would refuse anyway).
        if self.is_removed() {
            let cc = Cc(dev.read32(REG_CC));
            if cc.en() && !Csts(dev.read32(REG_CSTS)).is_all_ones() {
                dev.write32(REG_CC, cc.with_en(false).with_shn(Cc::SHN_NONE).0);
            }
            return Err(self.closed_error());
        }
        let t = self.admin_timeout;
        // Same device? (A different serial number means something else now
        // sits at this address: refuse to carry on with the old state.)
        let mut sqe = Sqe::identify(cns::CONTROLLER, 0, 0);
        let (buf, _list) = admin_data_buffer(dev, PAGE, &mut sqe, PAGE)?;
        let (cqe, buf) =
            admin.execute(dev, name, sqe, Some(buf), None, t, "Identify Controller")?;
        succeeded(cqe, "Identify Controller (after reset)")?;
        let mut data = vec![0u8; PAGE];
        if let Some(b) = buf {
            b.read_bytes(0, &mut data)?;
        }
        let id = IdentifyController::parse(&data).map_err(|e| Error::DeviceFault {
            device: name.to_string(),
            what: format!("Identify Controller after reset: {e}"),
        })?;
        if id.sn != self.identify.sn {
            return Err(Error::DeviceFault {
                device: name.to_string(),
                what: format!(
                    "serial number changed across reset ({:?} -> {:?})",
                    self.identify.sn, id.sn
                ),
            });
        }
        let n = self.granted_io_queues.saturating_sub(1) as u32;
        let what = "Set Features (Number of Queues)";
        let (cqe, _) = admin.execute(
            dev,
            name,
            Sqe::set_features(feature::NUMBER_OF_QUEUES, (n << 16) | n, false),
            None,
            None,
            t,
            what,
        )?;
        let cqe = succeeded(cqe, what)?;
        let granted = (cqe.dw0() & 0xffff).min(cqe.dw0() >> 16) + 1;
        if granted < self.granted_io_queues as u32 {
            return Err(Error::DeviceFault {
                device: name.to_string(),
                what: format!(
                    "granted {granted} I/O queues after reset, {} before",
                    self.granted_io_queues
                ),
            });
        }
        // Host Behavior Support again (a Controller Level Reset sets it
        // back): the application's structure if it set one, else the
        // driver's (LBAFEE, CDFE) where it set one.
        self.cdfe.store(0, Ordering::Release);
        let by_application = self.hbs_by_application().map(|d| *d);
        let mut restored = false;
        if let Some(data) = by_application {
            let what = "Set Features (Host Behavior Support, the application's, after reset)";
            let mut sqe = host_behavior_sqe();
            let (buf, list) = admin_data_buffer(dev, HBS_LEN, &mut sqe, PAGE)?;
            buf.write_bytes(0, &data)?;
            let (cqe, _) = admin.execute(dev, name, sqe, Some(buf), list, t, what)?;
            restored = cqe.status().is_success();
            if restored {
                self.cdfe.store(hbs_cdfe(&data), Ordering::Release);
            }
            if !restored && cqe.status().dnr() {
                // Accepted before the reset, refused for good after it: the
                // controller's defaults hold now (the application's value
                // is forgotten; a refusal that may succeed when retried,
                // DNR clear, is tried again at the next reset). LBAFEE
                // alone below where the driver needs it.
                self.forget_hbs_by_application();
            }
        }
        if (self.lbafee || self.driver_cdfe != 0) && !restored {
            // As at bring-up, CDFE is optional: refused with a status, LBAFEE
            // alone where the driver set it (the handles' formats were read
            // with it: its refusal fails the reset), else none (a
            // cross-namespace Copy is refused until a later reset sets it).
            let mut tries = vec![(self.lbafee, self.driver_cdfe)];
            if self.lbafee && self.driver_cdfe != 0 {
                tries.push((true, 0));
            }
            for (lbafee, cdfe) in tries {
                let what = "Set Features (Host Behavior Support, the driver's)";
                let mut sqe = host_behavior_sqe();
                let (buf, list) = admin_data_buffer(dev, HBS_LEN, &mut sqe, PAGE)?;
                buf.write_bytes(0, &driver_hbs(lbafee, cdfe))?;
                let (cqe, _) = admin.execute(dev, name, sqe, Some(buf), list, t, what)?;
                if cqe.status().is_success() {
                    self.cdfe.store(cdfe, Ordering::Release);
                    break;
                }
                if lbafee && cdfe == 0 {
                    succeeded(cqe, what)?;
                }
            }
        }
        if let Some(aec) = self.aec_to_restore() {
            // Namespace Attribute Notices again (a Controller Level Reset
            // sets features back). Refused now: no notices, as for a
            // controller that never offered them.
            let what = "Set Features (Asynchronous Event Configuration, after reset)";
            let (cqe, _) = admin.execute(
                dev,
                name,
                Sqe::set_features(feature::ASYNC_EVENT_CONFIG, aec, false),
                None,
                None,
                t,
                what,
            )?;
            // A refusal leaves the notices off until a later reset sets
            // them: every poll then checks every handle.
            self.notice_gaps
                .set_off(!(cqe.status().is_success() && self.notices_on_with(aec)));
        }
        // CC.EN = 0 cleared every event mask.
        self.notice_gaps.reset();
        admin.event_masks_cleared();
        if let Some(s) = &self.shadow {
            // Atomic word stores: queue pairs on other threads may store
            // their own shadow doorbells at the same time.
            s.doorbells.zero()?;
            s.event_idx.zero()?;
            let what = "Doorbell Buffer Config (after reset)";
            let (cqe, _) = admin.execute(
                dev,
                name,
                Sqe::doorbell_buffer_config(s.doorbells.iova(), s.event_idx.iova()),
                None,
                None,
                t,
                what,
            )?;
            // Refused with a status (no answer is an error above): MMIO
            // doorbells only, as at a bring-up that is refused. Every queue
            // pair re-creates its queues after this reset and takes the
            // mode then (`create_io_queues` reads it under this lock), so
            // none keeps trusting an EventIdx the controller no longer
            // writes.
            self.shadow_on
                .store(cqe.status().is_success(), Ordering::Relaxed);
        }
        admin.post_aers(dev, self.aer_target)?;
        // Usable again.
        if let Ok(mut f) = self.failure.lock() {
            *f = None;
        }
        self.state.fetch_and(!STATE_FAILED, Ordering::AcqRel);
        Ok(())
    }

    /// Deletes every I/O queue before a reset or a shutdown, while the
    /// controller still works: Delete I/O Submission Queue for each queue ID in
    /// use, then Delete I/O Completion Queue for each (NVMe 2.0 §3.6.1 asks for
    /// this before CC.SHN; Linux does it before every reset too). Deleting an
    /// SQ stops the controller fetching from it and ends what it holds
    /// (completed, or Command Aborted due to SQ Deletion), so CC.EN = 0 then
    /// finds no queue with work left.
    ///
    /// Why not just CC.EN = 0: QEMU's hw/nvme (seen with 10.0.2) drains its
    /// block backends on CC.EN = 0 while the SQs still exist; a command it
    /// fetches during that drain is in flight when the queues are freed, and
    /// QEMU crashes (use after free in `nvme_rw_complete_cb`). A real device
    /// also gets the orderly end of its commands the spec describes.
    ///
    /// Best effort, within `budget` in total (one admin timeout, or less after
    /// a command timeout): a controller that is gone, fatally failed, not
    /// ready, or that does not answer a deletion in time is simply disabled.
    /// One the driver marked failed (a broken completion on one pair, an
    /// admin command without an answer) usually still runs, with other
    /// pairs' commands in its SQs — the order that crashes QEMU — so its
    /// queues are deleted too, within at most one second. A queue that does
    /// not exist at the controller (its pair re-creates queues lazily after
    /// a reset) answers Invalid Queue Identifier, which is fine.
    fn delete_io_queues(&self, admin: &mut AdminQueue, budget: Duration) {
        let csts = Csts(self.dev.read32(REG_CSTS));
        if csts.is_all_ones() || !csts.rdy() || csts.cfs() {
            return;
        }
        let budget = if self.state() & STATE_FAILED != 0 {
            budget.min(Duration::from_secs(1))
        } else {
            budget
        };
        let qids: Vec<u16> = match self.qids.lock() {
            Ok(q) => (1..)
                .zip(q.iter())
                .filter_map(|(qid, used)| used.then_some(qid))
                .collect(),
            Err(_) => return,
        };
        // Measured from a start, not a deadline: `Instant + Duration::MAX`
        // (a caller's "no bound" admin timeout) would overflow.
        let start = Instant::now();
        let deletions = qids
            .iter()
            .map(|&q| {
                (
                    Sqe::delete_io_sq(q),
                    "Delete I/O Submission Queue (before reset)",
                )
            })
            .chain(qids.iter().map(|&q| {
                (
                    Sqe::delete_io_cq(q),
                    "Delete I/O Completion Queue (before reset)",
                )
            }));
        for (sqe, what) in deletions {
            let left = budget.saturating_sub(start.elapsed());
            if left.is_zero()
                || admin
                    .execute(&self.dev, &self.name, sqe, None, None, left, what)
                    .is_err()
            {
                break;
            }
        }
    }

    /// Normal shutdown (NVMe 2.0 §3.6.1): CC.SHN = 01b, wait for CSTS.SHST =
    /// 10b within `shutdown_timeout` (default RTD3E clamped to 5–60 s), then
    /// CC.EN = 0 and wait CSTS.RDY = 0.
    pub(crate) fn shutdown(&self) -> Result<()> {
        if self.state.fetch_or(STATE_CLOSED, Ordering::AcqRel) & STATE_CLOSED != 0 {
            return Ok(());
        }
        // The admin lock is held to the end (and taken before CSTS is read:
        // a reset running now finishes first): a reset that waits for it
        // finds the controller closed and does nothing, instead of enabling
        // the controller again under the shutdown.
        let mut admin = self.admin.lock().ok();
        let csts = Csts(self.dev.read32(REG_CSTS));
        if csts.is_all_ones() {
            return Err(Error::ControllerGone {
                device: self.name.clone(),
            });
        }
        let mut result = Ok(());
        if csts.rdy() && !csts.cfs() {
            if let Some(admin) = admin.as_deref_mut() {
                self.delete_io_queues(admin, self.admin_timeout);
            }
            let cc = Cc(self.dev.read32(REG_CC));
            self.dev.write32(REG_CC, cc.with_shn(Cc::SHN_NORMAL).0);
            let timeout = self
                .options
                .shutdown_timeout
                .unwrap_or_else(|| default_shutdown_timeout(self.identify.rtd3e));
            result = wait_csts(
                &self.dev,
                &self.name,
                timeout,
                "CSTS.SHST = shutdown complete",
                Some(&self.removed),
                |c| c.shst() == Csts::SHST_COMPLETE,
            );
        }
        let disabled = disable(&self.dev, &self.name, self.ready_timeout);
        if disabled.is_ok() {
            if let Some(admin) = admin.as_deref_mut() {
                admin.forget_in_flight();
            }
            if let Ok(mut q) = self.quarantine.lock() {
                q.clear();
            }
            // Queue pairs still alive complete their in-flight commands once
            // (ControllerFailed, buffers returned) at their next call.
            self.bump_generation();
        }
        result.and(disabled)
    }
}

/// Clears `STATE_RESETTING` when dropped; when dropped by a panic's unwind,
/// marks the controller failed first (the reset did not finish, so the
/// controller's state is unknown; the panic also poisoned the admin lock,
/// so no later reset runs: the controller must be opened again).
struct ResettingGuard<'a, D: Device>(&'a Inner<D>);

impl<D: Device> Drop for ResettingGuard<'_, D> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.mark_failed(&Error::ControllerFailed {
                device: self.0.name.clone(),
                reason: "a reset panicked before it finished, so the controller's state is \
                         unknown: open it again"
                    .into(),
            });
        }
        self.0.state.fetch_and(!STATE_RESETTING, Ordering::AcqRel);
    }
}

/// Armed through `Inner::release_on_request`: when dropped by a panic's
/// unwind, marks the controller closed and failed and clears
/// `STATE_RELEASING` — without a new generation, since whether DMA stopped
/// is unknown (the pairs hand back no buffer the device may still write) —
/// so that submissions waiting for the release's end (`wait_for_reset`) are
/// refused instead of waiting for ever. On the normal path the release's
/// last state update has cleared the bit already, and this does nothing.
struct ReleasingGuard<'a, D: Device>(&'a Inner<D>);

impl<D: Device> Drop for ReleasingGuard<'_, D> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .state
                .fetch_or(STATE_CLOSED | STATE_FAILED, Ordering::AcqRel);
            self.0.state.fetch_and(!STATE_RELEASING, Ordering::AcqRel);
        }
    }
}

/// Waits on the device's release request from a thread of its own, so a
/// removal completes even while the application is not polling: when it
/// fires, releases the controller (if anything still holds it, closed or
/// not). The thread holds
/// only a weak reference between ticks, so it never keeps the controller
/// alive, and ends within a tick once the controller is gone.
/// `stack`: the thread's stack size (`None`: Rust's default). Fails only
/// when the system refuses the thread.
fn watch_release_requests<D: Device>(
    inner: std::sync::Weak<Inner<D>>,
    req: Arc<dyn crate::device::ReleaseRequest>,
    stack: Option<usize>,
) -> std::io::Result<()> {
    let mut builder = std::thread::Builder::new().name("upnvme-release".into());
    if let Some(n) = stack {
        builder = builder.stack_size(n);
    }
    builder
        .spawn(move || {
            loop {
                if inner.strong_count() == 0 {
                    return;
                }
                if req.wait(RELEASE_WATCH_TICK) {
                    // Closed or not: a closed controller whose queue pairs
                    // are still alive keeps the device file open, and the
                    // kernel's removal waits on it.
                    if let Some(i) = inner.upgrade() {
                        i.release_on_request();
                    }
                    return;
                }
            }
        })
        .map(drop)
}

impl<D: Device> Drop for Inner<D> {
    fn drop(&mut self) {
        // Whatever the shutdown says (a `close` that failed earlier makes
        // this one return at once), the memory the fields' drops free — the
        // admin queue, the quarantine — may still be in use unless CSTS
        // says the controller is disabled (RDY = 0). All ones is no proof (a
        // BAR revoked by clearing Memory Space Enable reads all ones while
        // Bus Master Enable may still be set). Otherwise release the device
        // first; one that cannot say its DMA stopped keeps that memory,
        // leaked rather than handed out again.
        let _ = self.shutdown();
        let csts = Csts(self.dev.read32(REG_CSTS));
        if (!csts.is_all_ones() && !csts.rdy()) || self.dev.release() {
            return;
        }
        // Poisoned or not: the fields' drops would free this memory.
        let q = self
            .quarantine
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::forget(std::mem::take(q));
        self.admin
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .leak_memory();
    }
}

/// A Notice / Namespace Attribute Changed event (log 04h), for a change
/// the driver found without one.
fn namespace_attribute_changed() -> AsyncEvent {
    AsyncEvent::from_dw0(2 | 0x04 << 16)
}

/// How [`Inner::execute_detached`]'s start went (under the admin lock).
enum Start {
    /// Sent; its completion is looked for without the lock.
    Ticket(crate::admin::Ticket),
    /// Sent and waited for under the lock (an admin queue too small to
    /// share).
    Done((Cqe, Option<DmaBuffer>)),
    /// Not sent: this many other detached commands hold the identifiers it
    /// could take. Its data buffer and PRP List page come back.
    Wait(u32, (Option<DmaBuffer>, Option<DmaBuffer>)),
}

/// The longest Get Log Page of a controller without Extended Data for Get
/// Log Page (LPA bit 2 clear): NUMD is CDW10 bits 27:16, 4096 dwords.
const LOG_PAGE_BYTES_WITHOUT_EXTENDED_DATA: usize = 4096 * 4;

/// How often [`Inner::execute_detached`] looks at the admin CQ once
/// [`DETACHED_SPIN`] has passed.
const DETACHED_POLL: Duration = Duration::from_micros(200);

/// How often [`Inner::admin_command_by`] tries the admin lock while another
/// holds it.
const ADMIN_LOCK_POLL: Duration = Duration::from_micros(200);

/// How long [`Inner::execute_detached`] looks at the admin CQ without
/// sleeping in between: most admin commands complete within it.
const DETACHED_SPIN: Duration = Duration::from_millis(1);

/// The completion of `what`, or [`Error::Command`] with its status when that
/// is not Successful Completion.
fn succeeded(cqe: Cqe, what: &str) -> Result<Cqe> {
    if cqe.status().is_success() {
        Ok(cqe)
    } else {
        Err(Error::Command {
            command: what.to_string(),
            status: cqe.status(),
        })
    }
}

/// Bytes of the Host Behavior Support data structure (NVMe 2.0, Set
/// Features FID 16h).
const HBS_LEN: usize = 512;

/// The Copy Descriptor Formats a host enables in Host Behavior Support
/// CDFE (NVMe 2.1): 2h and 3h, the cross-namespace formats (bits 2 and 3).
const CDFE_CROSS_NAMESPACE: u16 = 0b1100;

/// The driver's Host Behavior Support structure: LBAFEE (byte 2, bit 0) as
/// `lbafee`, CDFE (bytes 05:04) `cdfe`, everything else (ACRE, ETDAS, ...)
/// clear.
fn driver_hbs(lbafee: bool, cdfe: u16) -> [u8; HBS_LEN] {
    let mut b = [0u8; HBS_LEN];
    b[2] = u8::from(lbafee);
    b[4..6].copy_from_slice(&cdfe.to_le_bytes());
    b
}

/// CDFE (bytes 05:04) of a Host Behavior Support structure.
fn hbs_cdfe(hbs: &[u8]) -> u16 {
    match hbs.get(4..6) {
        Some(b) => u16::from_le_bytes([b[0], b[1]]),
        None => 0,
    }
}

/// Set Features, Host Behavior Support, not saved (the 512-byte structure
/// in the data buffer).
fn host_behavior_sqe() -> Sqe {
    Sqe::set_features(feature::HOST_BEHAVIOR_SUPPORT, 0, false)
}

/// Allocates a data buffer for an admin command and fills in its PRPs
/// (NVMe 2.0 §4.3.1): one page → PRP1; two → PRP2 is the second page; more →
/// PRP2 points to a PRP list (one list page, up to 513 pages of data).
fn admin_data_buffer<D: Device>(
    dev: &D,
    len: usize,
    sqe: &mut Sqe,
    mdts: usize,
) -> Result<(DmaBuffer, Option<DmaBuffer>)> {
    let pages = len.div_ceil(PAGE);
    if len > mdts || pages > 513 {
        return Err(Error::InvalidArgument(format!(
            "admin data of {len} bytes exceeds the transfer limit ({} bytes)",
            mdts.min(513 * PAGE)
        )));
    }
    let buf = dev.alloc_dma(len)?;
    // PRPs (PSDT 00b), whatever the caller's SQE said: PRP2 too (a
    // one-page transfer's PRP2 is 0, not a pointer left in the SQE) and no
    // metadata pointer.
    sqe.set_psdt(0);
    sqe.set_prp1(buf.iova());
    sqe.set_prp2(0);
    sqe.dw[4] = 0;
    sqe.dw[5] = 0;
    let list = match pages {
        1 => None,
        2 => {
            sqe.set_prp2(buf.iova() + PAGE as u64);
            None
        }
        _ => {
            let list = dev.alloc_dma_device_read_only(PAGE)?;
            for i in 1..pages {
                list.write_u64((i - 1) * 8, buf.iova() + (i * PAGE) as u64)?;
            }
            sqe.set_prp2(list.iova());
            Some(list)
        }
    };
    Ok((buf, list))
}

/// Waits until `done(CSTS)` holds, at most `timeout`; all ones → gone, CFS →
/// fatal, `removed` set → `ControllerRemoved`. Polls without sleeping for
/// the first few reads (fast controllers), then sleeps 100 us between reads.
///
/// `removed` is the controller's release flag for a wait that a release on
/// the kernel's request must end (a reset's or a close's): the release
/// writes CC.EN = 0 and, on a device that cannot be released
/// (`Device::release` false), leaves the registers live — CSTS.RDY = 1 or
/// CSTS.SHST would then never come and the wait would last its whole bound.
/// `None` for bring-up (no release is watched yet) and the release itself.
pub(crate) fn wait_csts<D: Device>(
    dev: &D,
    name: &str,
    timeout: Duration,
    what: &str,
    removed: Option<&AtomicBool>,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    poll_csts(dev, name, timeout, what, true, removed, done)
}

/// [`wait_csts`], with CSTS.CFS ending the wait as `ControllerFatal` only
/// when `cfs_is_fatal`.
fn poll_csts<D: Device>(
    dev: &D,
    name: &str,
    timeout: Duration,
    what: &str,
    cfs_is_fatal: bool,
    removed: Option<&AtomicBool>,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut reads = 0u32;
    loop {
        let csts = Csts(dev.read32(REG_CSTS));
        if csts.is_all_ones() {
            return Err(Error::ControllerGone {
                device: name.to_string(),
            });
        }
        if done(csts) {
            return Ok(());
        }
        if cfs_is_fatal && csts.cfs() {
            return Err(Error::ControllerFatal {
                device: name.to_string(),
            });
        }
        if removed.is_some_and(|r| r.load(Ordering::Acquire)) {
            return Err(Error::ControllerRemoved {
                device: name.to_string(),
            });
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::Timeout {
                what: format!("{what} on {name}"),
                after: waited,
            });
        }
        reads += 1;
        if reads > 16 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// CC.EN = 0 and wait for CSTS.RDY = 0 (CFS does not stop a disable: disabling
/// is how a fatally failed controller is reset). A release does not end
/// this wait: the release disables the controller too, so CSTS.RDY = 0
/// comes regardless, and what was given to the controller is freed only
/// once it is seen.
pub(crate) fn disable<D: Device>(dev: &D, name: &str, timeout: Duration) -> Result<()> {
    let cc = Cc(dev.read32(REG_CC));
    let csts = Csts(dev.read32(REG_CSTS));
    if csts.is_all_ones() {
        return Err(Error::ControllerGone {
            device: name.to_string(),
        });
    }
    if cc.en() && !csts.rdy() && !csts.cfs() {
        // §3.5.1: wait for RDY to match EN before changing EN; if it never does,
        // disable anyway. CC.EN read back as 0 ends the wait too: someone
        // else (a release on the kernel's request) disabled the controller
        // meanwhile, and RDY = 1 will not come.
        let _ = wait_csts(
            dev,
            name,
            timeout,
            "CSTS.RDY = 1 before disabling",
            None,
            |c| c.rdy() || !Cc(dev.read32(REG_CC)).en(),
        );
    }
    let cc = Cc(dev.read32(REG_CC));
    if cc.en() {
        dev.write32(REG_CC, cc.with_en(false).with_shn(Cc::SHN_NONE).0);
    }
    // CFS does not end this wait: a fatally failed controller still clears RDY.
    poll_csts(
        dev,
        name,
        timeout,
        "CSTS.RDY = 0 after CC.EN = 0",
        false,
        None,
        |c| !c.rdy(),
    )
}

/// The ready waits' bound when the caller gave none: CAP.TO, or CRTO.CRWMT
/// when the controller reports Controller Ready With Media Support
/// (CAP.CRMS.CRWMS) and CRWMT is longer. NVMe 2.0 caps CAP.TO at FFh
/// (127.5 s) for such a controller, so a slow one (media spin-up, a large
/// recovery) may need the longer CRWMT; upnvme leaves CC.CRIME clear, so
/// CRWMT (not CRIMT) is the time that applies. It bounds the wait for
/// CSTS.RDY = 0 too, where CAP.TO would do: only a bound, never a delay.
fn default_ready_timeout<D: Device>(dev: &D, cap: Cap) -> Duration {
    let mut ms = cap.timeout_ms();
    if cap.crwms() {
        ms = ms.max(Crto(dev.read32(REG_CRTO)).crwmt_ms());
    }
    Duration::from_millis(ms)
}

/// The transfer limit MDTS encodes (2^MDTS units of CAP.MPSMIN pages), `None`
/// for 0 (no limit). A value too large for the address space also means "no
/// limit" (`1 << 52` pages would otherwise wrap to 0 — a device's odd MDTS must
/// not turn into a zero transfer limit).
pub(crate) fn mdts_limit(min_page: usize, mdts: u8) -> Option<usize> {
    if mdts == 0 || u32::from(mdts) + min_page.trailing_zeros() >= usize::BITS - 1 {
        return None;
    }
    Some(min_page << mdts)
}

/// Allocates a fresh admin queue, programs AQA/ASQ/ACQ, writes CC (CSS = NVM,
/// MPS = 4 KiB, AMS = round robin, IOSQES = 6, IOCQES = 4, EN = 1) and waits for
/// CSTS.RDY = 1. The controller must be disabled. `removed`: as for
/// [`wait_csts`] (a reset's enable: a release's CC.EN = 0 means CSTS.RDY = 1
/// never comes).
fn enable_with_admin_queue<D: Device>(
    dev: &D,
    name: &str,
    cap: Cap,
    entries: u32,
    ready_timeout: Duration,
    removed: Option<&AtomicBool>,
) -> std::result::Result<AdminQueue, EnableFailure> {
    let admin = AdminQueue::new(dev, entries, cap.dstrd())
        .map_err(|error| EnableFailure { error, keep: None })?;
    dev.write32(REG_AQA, aqa(entries, entries));
    dev.write64(REG_ASQ, admin.sq_iova());
    dev.write64(REG_ACQ, admin.cq_iova());
    let cc = Cc::new()
        .with_css(Cc::CSS_NVM)
        .with_mps(0)
        .with_ams(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_en(true);
    dev.write32(REG_CC, cc.0);
    if let Err(e) = wait_csts(
        dev,
        name,
        ready_timeout,
        "CSTS.RDY = 1 after CC.EN = 1",
        removed,
        |c| c.rdy(),
    ) {
        // CC.EN = 1 with ASQ/ACQ on this queue's memory: the controller may
        // yet become ready and use it. Disabled, it cannot, and the memory
        // goes; if it cannot be disabled either, the memory is kept. (After
        // a release: if the release writes CC.EN = 0, the disable's wait
        // for CSTS.RDY = 1 ends when it reads that back; if the release
        // wrote nothing — the controller was disabled when it looked,
        // before this CC.EN = 1 — this disable is the one that counts, and
        // waits for RDY = 1 first as §3.5.1 asks, up to `ready_timeout`.)
        let keep = match disable(dev, name, ready_timeout) {
            Ok(()) => None,
            Err(_) => Some(admin.into_pages()),
        };
        return Err(EnableFailure { error: e, keep });
    }
    Ok(admin)
}

/// I/O queues created by `Inner::create_io_queues`.
pub(crate) struct Created {
    /// The reset generation they exist in.
    pub(crate) generation: u64,
    /// Whether Doorbell Buffer Config is active in that generation: the
    /// queues' doorbells go through the shadow buffers (read under the
    /// admin lock with the generation, so the two belong together).
    pub(crate) shadow_on: bool,
}

/// Why Create I/O CQ + SQ failed, and whether the CQ may still exist (the
/// SQ was refused and deleting the CQ again failed too): its memory must
/// then stay out of use, and its queue ID too (`Inner::hold_qid`).
pub(crate) struct CreateFailure {
    /// The error of the Create that failed.
    pub(crate) error: Error,
    /// The CQ was created and could not be deleted again: `Some` of the
    /// reset generation it exists in.
    pub(crate) cq_left: Option<u64>,
    /// The reset generation the commands were sent in (read under the
    /// admin lock, which a reset holds throughout); `None` when none was
    /// sent (the controller was not usable).
    pub(crate) during: Option<u64>,
}

/// Why enabling the controller failed, and the admin queue memory it may
/// still use (`Some` when it could not be disabled again).
struct EnableFailure {
    error: Error,
    keep: Option<Vec<DmaPages>>,
}

/// Runs the bring-up sequence.
/// What bring-up hands the controller: its state, the namespaces it can use,
/// and those it cannot (with why).
type BroughtUp<D> = (Inner<D>, Vec<Namespace>, Vec<(u32, String)>);

fn bring_up<D: Device>(dev: D, options: ControllerOptions) -> Result<BroughtUp<D>> {
    let name = dev.name();
    let cap = Cap(dev.read64(REG_CAP));
    if cap.0 == u64::MAX {
        return Err(Error::ControllerGone { device: name });
    }
    let unsupported = |what: String| Error::Unsupported {
        device: name.clone(),
        what,
    };
    if cap.css() & 1 == 0 {
        return Err(unsupported(format!(
            "CAP.CSS 0x{:02x} lacks the NVM command set",
            cap.css()
        )));
    }
    if cap.min_page_size() > PAGE {
        return Err(unsupported(format!(
            "CAP.MPSMIN requires {}-byte memory pages; upnvme uses 4 KiB",
            cap.min_page_size()
        )));
    }
    let ready_timeout = options
        .ready_timeout
        .unwrap_or_else(|| default_ready_timeout(&dev, cap));
    let admin_timeout = options
        .admin_timeout
        .unwrap_or(Duration::from_millis(cap.timeout_ms()).max(Duration::from_secs(5)));
    let vs = Vs(dev.read32(REG_VS));
    let step_err = |step: BringupStep, e: Error| match e {
        Error::Timeout { what, after } => Error::Timeout {
            what: format!("{what} (bring-up step {step:?})"),
            after,
        },
        other => other,
    };

    // Disable.
    disable(&dev, &name, ready_timeout).map_err(|e| step_err(BringupStep::Disable, e))?;

    // The admin queue's doorbells (queue 0, CAP.DSTRD apart) must lie in
    // BAR0: writes beyond it reach nothing, and the admin queue would stall.
    if cq_head_doorbell(0, cap.dstrd()) + 4 > dev.bar_len() {
        return Err(unsupported(format!(
            "the admin queue's doorbells (CAP.DSTRD {}) lie beyond BAR0 ({} bytes)",
            cap.dstrd(),
            dev.bar_len()
        )));
    }

    // Configure the admin queue, enable.
    // CAP.MQES is 0-based and at least 1h (two entries): 0h is a register
    // value no controller may report, not the caller's queue size.
    if cap.mqes() == 0 {
        return Err(Error::DeviceFault {
            device: name.clone(),
            what: "CAP.MQES is 0h (a maximum queue size of one entry; the specification \
                   requires at least 1h): the controller's registers are not usable — \
                   check that the PCI function is an NVMe controller and that its BAR0 \
                   is mapped, or reset the device"
                .into(),
        });
    }
    let entries = options
        .admin_queue_entries
        .clamp(2, 4096)
        .min(cap.max_queue_entries());
    let mut admin = match enable_with_admin_queue(&dev, &name, cap, entries, ready_timeout, None) {
        Ok(a) => a,
        Err(f) => {
            // The controller was disabled again (ASQ/ACQ point at memory
            // that is about to be freed). If it could not be, the device is
            // released (VFIO: its file closed, which stops its DMA) and the
            // admin queue's pages freed after that; a device that cannot
            // say its DMA stopped keeps them, leaked rather than handed out
            // again. (Leaking them unconditionally kept the VFIO container
            // open: every later open of the device in this process failed
            // with EBUSY.)
            if let Some(keep) = f.keep {
                if dev.release() {
                    drop(keep);
                } else {
                    std::mem::forget(keep);
                }
            }
            return Err(step_err(BringupStep::Enable, f.error));
        }
    };

    // From here on the admin queue works; build the controller and let it run
    // the remaining steps as admin commands (its Drop disables the controller
    // if a step fails).
    let placeholder = IdentifyController::parse(&[0u8; PAGE])
        .map_err(|e| Error::InvalidArgument(format!("identify layout: {e}")))?;
    admin.post_aers(&dev, 0)?;
    let removed = Arc::new(AtomicBool::new(false));
    admin.share_removal(removed.clone());
    let mut inner = Inner {
        instance: crate::namespace::next_controller_instance(),
        dev,
        name: name.clone(),
        cap,
        vs,
        options,
        admin: Mutex::new(admin),
        admin_timeout,
        ready_timeout,
        failure: Mutex::new(None),
        state: AtomicU64::new(0),
        resets: AtomicU64::new(0),
        qids: Mutex::new(Vec::new()),
        held_qids: Mutex::new(Vec::new()),
        quarantine: Mutex::new(Vec::new()),
        identify: placeholder,
        nvm_limits: IdentifyControllerNvm::default(),
        granted_io_queues: 0,
        lbafee: false,
        driver_cdfe: 0,
        cdfe: AtomicU16::new(0),
        hbs_by_application: Mutex::new(None),
        aec: AtomicU64::new(0),
        shadow: None,
        shadow_on: AtomicBool::new(false),
        aer_target: 0,
        removed,
        namespaces_unverified: AtomicBool::new(false),
        notice_gaps: Default::default(),
        namespace_check: Mutex::new(()),
        format_lock: Mutex::new(()),
        attached_announced: Mutex::new(Vec::new()),
        unready: Mutex::new(Vec::new()),
    };

    // Identify Controller.
    let data = inner.identify_raw(cns::CONTROLLER, 0)?;
    let id = IdentifyController::parse(&data)
        .map_err(|e| inner.fault(format!("Identify Controller: {e}")))?;
    if id.sqes & 0x0f > 6 || (id.sqes >> 4) < 6 || id.cqes & 0x0f > 4 || (id.cqes >> 4) < 4 {
        return Err(unsupported(format!(
            "SQES 0x{:02x} / CQES 0x{:02x} do not allow 64-byte SQEs and 16-byte CQEs",
            id.sqes, id.cqes
        )));
    }
    inner.identify = id;
    // The NVM Command Set's size limits (Verify, Write Zeroes, Write
    // Uncorrectable, Dataset Management). Below VS 1.2 the CNS field may be
    // narrower than 06h (one bit in 1.0, two in 1.1) and a controller may
    // answer another structure with success, whose bytes would read as
    // limits: not asked then, as Linux does. Controllers before NVMe 2.0
    // may refuse it with a status: no limits then. No answer at all fails
    // bring-up like any other admin command.
    inner.nvm_limits = if (inner.vs.major(), inner.vs.minor()) < (1, 2) {
        IdentifyControllerNvm::default()
    } else {
        match inner.identify_raw(cns::CSI_CONTROLLER, 0) {
            Ok(data) => IdentifyControllerNvm::parse(&data),
            Err(Error::Command { .. }) => IdentifyControllerNvm::default(),
            Err(e) => return Err(e),
        }
    };

    // Set Features, Number of Queues (FID 07h): both counts are 0-based.
    let want = inner.options.io_queues.clamp(1, 0xfffe) - 1;
    let (cqe, _) = inner.execute(
        Sqe::set_features(
            feature::NUMBER_OF_QUEUES,
            ((want as u32) << 16) | want as u32,
            false,
        ),
        None,
        "Set Features (Number of Queues)",
    )?;
    let nsqa = cqe.dw0() & 0xffff;
    let ncqa = cqe.dw0() >> 16;
    inner.granted_io_queues = (nsqa.min(ncqa) + 1).min(want as u32 + 1) as u16;
    if let Ok(mut q) = inner.qids.lock() {
        *q = vec![false; inner.granted_io_queues as usize];
    }

    // Host Behavior Support (FID 16h):
    // - LBA Format Extension Enable, when the controller has Extended LBA
    //   Formats (CTRATT.ELBAS): without it a controller refuses I/O to a
    //   namespace formatted with a 32- or 64-bit guard (NVM Command Set 1.0,
    //   "Extended LBA Formats");
    // - Copy Descriptor Formats Enable (CDFE) for the cross-namespace Copy
    //   formats 2h and 3h the controller reports in OCFS: without it a
    //   controller fails such a Copy with Invalid Field (NVMe 2.1).
    // Refused with a status, the driver tries LBAFEE alone (a controller
    // that does not know CDFE), then carries on without: namespaces of a
    // wide guard then fail their commands with that controller's status,
    // and a cross-namespace Copy is refused before it is sent.
    let lbafee = inner.identify.ctratt_elbas();
    let cdfe = inner.identify.ocfs & CDFE_CROSS_NAMESPACE;
    let mut tries = vec![(lbafee, cdfe)];
    if lbafee && cdfe != 0 {
        tries.push((true, 0));
    }
    for (lbafee, cdfe) in tries.into_iter().filter(|&(l, c)| l || c != 0) {
        let what = "Set Features (Host Behavior Support, the driver's: LBAFEE, CDFE)";
        let hbs = driver_hbs(lbafee, cdfe);
        match inner.execute_with(host_behavior_sqe(), Some(HBS_LEN), Some(&hbs), what) {
            Ok(_) => {
                inner.lbafee = lbafee;
                inner.driver_cdfe = cdfe;
                inner.cdfe.store(cdfe, Ordering::Release);
                break;
            }
            Err(Error::Command { .. }) => {}
            Err(e) => return Err(e),
        }
    }

    // Namespace Attribute Notices, when offered (namespace_list.rs), before
    // the namespaces are identified (as Linux does): a namespace changed
    // after this raises a notice the first AER delivers, and one changed
    // before it is read as it is now. The other order left a change between
    // the scan and the notices unnoticed, with a handle of the old geometry.
    let aec = inner.enable_namespace_notices()?;
    if let Some(v) = aec {
        inner.aec.store(1 << 32 | u64::from(v), Ordering::Release);
    }
    inner.notice_gaps.set_off(aec.is_none());
    // Identify namespaces.
    let crate::namespace_list::Scanned {
        namespaces,
        unusable,
        unready,
    } = inner.scan_namespaces()?;
    inner.note_unready(unready);

    // Doorbell Buffer Config (admin 7Ch), when OACS bit 8 says so. Shadow
    // doorbells only save MMIO writes: when their buffers cannot be had
    // (their size follows CAP.DSTRD and the queues granted) or the
    // controller refuses the command with a status, the queues use MMIO
    // doorbells (`Controller::shadow_doorbells` says which). No answer at
    // all is a controller failure like any other.
    if inner.options.shadow_doorbells && inner.identify.oacs_doorbell_buffer_config() {
        let stride = 4usize << cap.dstrd();
        let len = ((inner.granted_io_queues as usize + 1) * 2 * stride).max(PAGE);
        let buffers = inner
            .dev
            .alloc_dma(len)
            .and_then(|d| Ok((d, inner.dev.alloc_dma(len)?)));
        if let Ok((doorbells, event_idx)) = buffers {
            match inner.execute(
                Sqe::doorbell_buffer_config(doorbells.iova(), event_idx.iova()),
                None,
                "Doorbell Buffer Config",
            ) {
                Ok(_) => {
                    inner.shadow_on.store(true, Ordering::Relaxed);
                    inner.shadow = Some(ShadowBuffers {
                        doorbells: SharedWords::new(doorbells),
                        event_idx: SharedWords::new(event_idx),
                    });
                }
                Err(Error::Command { .. }) => {}
                Err(e) => {
                    // No answer: the controller may have taken the command
                    // and write EventIdx values into these buffers until it
                    // is disabled (by `inner`'s drop, after these locals').
                    inner.quarantine(vec![doorbells.into_pages(), event_idx.into_pages()]);
                    return Err(e);
                }
            }
        }
    }

    // Asynchronous Event Requests: up to AERL + 1 outstanding.
    inner.aer_target = (inner.options.async_events as u32).min(inner.identify.aerl as u32 + 1);
    let target = inner.aer_target;
    inner.with_admin(|dev, _, admin| admin.post_aers(dev, target))?;
    Ok((inner, namespaces, unusable))
}

/// The bound on the shutdown wait when the caller sets none: Identify
/// Controller RTD3E (RTD3 Entry Latency, microseconds; 0h: not reported),
/// at least [`MIN_DEFAULT_SHUTDOWN`] and at most [`MAX_DEFAULT_SHUTDOWN`]
/// (Linux's clamp): a device reporting hours would make every drop hang
/// that long.
fn default_shutdown_timeout(rtd3e_us: u32) -> Duration {
    Duration::from_micros(u64::from(rtd3e_us)).clamp(MIN_DEFAULT_SHUTDOWN, MAX_DEFAULT_SHUTDOWN)
}

/// What `upnvme list` shows about a controller without opening it.
pub fn list_controllers() -> Result<Vec<upnvme_dma::pci::PciFunction>> {
    Ok(Sysfs::default().nvme_controllers()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NeverRequested;

    impl crate::device::ReleaseRequest for NeverRequested {
        fn wait(&self, timeout: Duration) -> bool {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            false
        }
    }

    /// A watcher the system refuses is an error the open returns (it was
    /// dropped, and the controller went on without hot-removal handling),
    /// and the error says what to do.
    #[test]
    fn a_refused_release_watcher_is_an_error() {
        let gone = std::sync::Weak::<Inner<crate::VfioNvme>>::new();
        // A stack no system maps: the spawn fails.
        let e = watch_release_requests(gone.clone(), Arc::new(NeverRequested), Some(1 << 62))
            .expect_err("a 4 EiB stack was mapped");
        let e = Error::ThreadSpawn {
            device: "0000:00:04.0".into(),
            what: "release-request watcher",
            source: e,
        };
        let msg = e.to_string();
        assert!(
            msg.contains("release-request watcher") && msg.contains("ulimit -u"),
            "{msg}"
        );
        // The default stack: started (and it ends at once, the controller
        // being gone).
        watch_release_requests(gone, Arc::new(NeverRequested), None).unwrap();
    }
}

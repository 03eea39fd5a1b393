//! Controllers (`upnvme_ctrl`): options, open and close, namespace geometry,
//! asynchronous events, the namespace list's refresh and admin commands
//! (`upnvme_ctrl_admin_passthru`).

use std::collections::VecDeque;
use std::ffi::{c_char, c_int};
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use crate::status::{UPNVME_OK, fail_error};

use upnvme::{
    AsyncEvent, Controller, ControllerOptions, Cqe, Device, FormatNvm, Namespace, NamespaceChanges,
    PageBacking, SecureErase, Sqe,
};

/// Options of `upnvme_ctrl_open`. Fill with `upnvme_ctrl_opts_default(&o)`
/// (a header inline: `upnvme_ctrl_opts_init(&o, sizeof o)`), then
/// change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_ctrl_opts {
    /// `sizeof(struct upnvme_ctrl_opts)` as the caller's header has it, set by
    /// `upnvme_ctrl_opts_init` / `upnvme_ctrl_opts_default`
    /// (lets later versions add fields; a struct with `size` below 4 is
    /// refused with `UPNVME_EINVAL`).
    pub size: u32,
    /// Back DMA memory with 4 KiB pages instead of 2 MiB hugepages.
    pub no_hugepages: bool,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller
    /// offers them (default false: MMIO doorbells only; see
    /// `ControllerOptions::shadow_doorbells` for when the buffer pays).
    pub shadow_doorbells: bool,
    /// I/O queue pairs to ask the controller for (Set Features Number of
    /// Queues); 0 = the library's default.
    pub io_queues: u16,
    /// Bound on each admin command in milliseconds; 0 = derived from CAP.TO.
    pub admin_timeout_ms: u32,
}

impl Default for upnvme_ctrl_opts {
    fn default() -> Self {
        let d = ControllerOptions::default();
        upnvme_ctrl_opts {
            size: std::mem::size_of::<upnvme_ctrl_opts>() as u32,
            no_hugepages: false,
            shadow_doorbells: d.shadow_doorbells,
            io_queues: 0,
            admin_timeout_ms: 0,
        }
    }
}

// SAFETY: the two `bool` fields are listed; the others are integers.
unsafe impl crate::status::CallerOptions for upnvme_ctrl_opts {
    const BOOLS: &'static [usize] = &[
        std::mem::offset_of!(upnvme_ctrl_opts, no_hugepages),
        std::mem::offset_of!(upnvme_ctrl_opts, shadow_doorbells),
    ];
}

impl upnvme_ctrl_opts {
    /// The library's options for these.
    pub(crate) fn to_options(self) -> ControllerOptions {
        let mut o = ControllerOptions::default();
        if self.no_hugepages {
            o.page_backing = PageBacking::Small4K;
        }
        o.shadow_doorbells = self.shadow_doorbells;
        if self.io_queues != 0 {
            o.io_queues = self.io_queues;
        }
        if self.admin_timeout_ms != 0 {
            o.admin_timeout = Some(Duration::from_millis(u64::from(self.admin_timeout_ms)));
        }
        o
    }
}

/// An admin command for `upnvme_ctrl_admin_passthru`: the Submission Queue
/// Entry's fields the caller chooses (NVMe 2.0 §4.2, "Submission Queue
/// Entry"). The library fills in the Command Identifier, PSDT and the data
/// pointer (PRP1/PRP2, from its own DMA memory) and sends MPTR as 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_admin_cmd {
    /// Opcode (CDW0 bits 7:0); its bits 1:0 give the data direction.
    pub opcode: u8,
    /// Reserved: 0.
    pub rsvd: [u8; 3],
    /// Namespace Identifier (NSID).
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Command dword 10.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
    /// Bound on the wait in milliseconds; 0 = the controller's admin
    /// timeout (`upnvme_ctrl_opts.admin_timeout_ms`).
    pub timeout_ms: u32,
}

impl upnvme_admin_cmd {
    /// The Submission Queue Entry these fields make.
    fn sqe(&self) -> Sqe {
        Sqe::passthrough(
            self.opcode,
            self.nsid,
            [self.cdw2, self.cdw3],
            [
                self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
            ],
        )
    }
}

/// What `upnvme_ctrl_format_nvm` is to do: Format NVM's CDW10 fields
/// (NVM Command Set Specification, "Format NVM command"), as nvme-cli's
/// `format` takes them. All zero: LBA format 0, metadata in a separate
/// buffer, no protection information, no secure erase, the admin timeout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_format {
    /// LBA format index (Identify Namespace LBAF; `upnvme identify -H`
    /// lists them).
    pub lbaf: u8,
    /// MSET: 1 = metadata at the end of each block (extended LBA), 0 = a
    /// separate metadata buffer.
    pub mset: u8,
    /// PI: protection information type 0 (none) to 3.
    pub pi: u8,
    /// PIL: 1 = the PI tuple in the first 8 metadata bytes, 0 = the last 8.
    pub pil: u8,
    /// SES: 0 no secure erase, 1 user data erase, 2 cryptographic erase.
    pub ses: u8,
    /// Reserved: 0.
    pub rsvd: [u8; 3],
    /// Bound on the wait in milliseconds; 0 = 600 s, as `upnvme format`
    /// and nvme-cli (a secure erase of a large device takes minutes). No
    /// answer within it leaves the controller failed until
    /// `upnvme_ctrl_reset`.
    pub timeout_ms: u32,
}

/// The wait of a Format NVM whose `timeout_ms` is 0.
const FORMAT_DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

impl upnvme_format {
    /// The library's request, or why these fields are out of range.
    fn to_format(self) -> upnvme::Result<FormatNvm> {
        let bad = |what: String| Err(upnvme::Error::InvalidArgument(what));
        if self.rsvd != [0; 3] {
            return bad("upnvme_format: rsvd must be 0 (initialise the struct with {0})".into());
        }
        if self.mset > 1 || self.pil > 1 {
            return bad(format!(
                "upnvme_format: mset {} and pil {} must each be 0 or 1",
                self.mset, self.pil
            ));
        }
        if self.pi > 3 {
            return bad(format!(
                "upnvme_format: pi {} is not a protection information type (0 to 3)",
                self.pi
            ));
        }
        let secure_erase = match self.ses {
            0 => SecureErase::None,
            1 => SecureErase::UserData,
            2 => SecureErase::Cryptographic,
            n => {
                return bad(format!(
                    "upnvme_format: ses {n} is not a Secure Erase Setting (0 none, 1 user data, \
                     2 cryptographic)"
                ));
            }
        };
        Ok(FormatNvm {
            lbaf: self.lbaf,
            extended: self.mset == 1,
            pi_type: self.pi,
            pi_first: self.pil == 1,
            secure_erase,
            timeout: Some(match self.timeout_ms {
                0 => FORMAT_DEFAULT_TIMEOUT,
                ms => Duration::from_millis(u64::from(ms)),
            }),
        })
    }
}

/// How an admin command of `upnvme_ctrl_admin_passthru` completed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_admin_cpl {
    /// Completion dword 0 (command specific: a Get Features value, Set
    /// Features' result); 0 when the command failed.
    pub dw0: u32,
    /// Completion dword 1.
    pub dw1: u32,
    /// Status Code Type (0 and `sc` 0 on success; set when the call returns
    /// `UPNVME_EIO`).
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry: do not send the command again as it is.
    pub dnr: bool,
    /// Command Retry Delay (CRD, 0–3): as `upnvme_cpl.crd`.
    pub crd: u8,
}

/// What a namespace is (Identify Namespace, current LBA format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_ns_info {
    /// Namespace ID (NSID).
    pub nsid: u32,
    /// Bytes per logical block (2^LBADS).
    pub lba_size: u32,
    /// Namespace Size (NSZE) in logical blocks.
    pub blocks: u64,
    /// NSZE × LBA size.
    pub size_bytes: u64,
    /// Metadata bytes per block (LBAF.MS). When it is not 0, `upnvme_read`,
    /// `upnvme_write`, `upnvme_compare`, `upnvme_read_flags` and
    /// `upnvme_write_flags` are refused with `UPNVME_ENOTSUP` (their buffers
    /// carry data only): use `upnvme_read_ext` and the other `_ext`
    /// functions, which take a metadata buffer and protection fields.
    pub metadata_size: u16,
    /// FLBAS bit 4: metadata at the end of each block (extended LBA).
    pub metadata_extended: bool,
    /// DPS bits 2:0: protection information type (0 = none).
    pub pi_type: u8,
    /// DLFEAT, Deallocate Logical Block Features: bits 2:0 what a
    /// deallocated block reads as (`UPNVME_DLFEAT_READS_ZEROES`: all
    /// zeroes; 010b all ones; 000b not reported), bit 3 Write Zeroes can
    /// deallocate. (It took the padding after `pi_type`: no field moved.)
    pub dlfeat: u8,
    /// DPS bit 3: the protection information tuple is the first bytes of
    /// each block's metadata (else the last). False without protection
    /// information. (In the padding after `dlfeat`, as `pi_guard_bits`:
    /// no field moved and the struct's size is unchanged; a library built
    /// before them writes unspecified padding bytes there.)
    pub pi_first: bool,
    /// The guard size of the protection information in bits (ELBAF.PIF):
    /// 16 (an 8-byte tuple, CRC-16), 32 (CRC-32C, 16 bytes; the library
    /// refuses protection fields on it) or 64 (CRC-64, 16 bytes); 0
    /// without protection information.
    pub pi_guard_bits: u8,
}

/// Identify Namespace DLFEAT bits 2:0 = 001b (`info.dlfeat & 7`): a
/// deallocated block (`upnvme_deallocate`) reads as all zeroes.
pub const UPNVME_DLFEAT_READS_ZEROES: u8 = 1;

/// Identify Controller ONCS bit 0: Compare.
pub const UPNVME_ONCS_COMPARE: u16 = 1 << 0;
/// Identify Controller ONCS bit 1: Write Uncorrectable.
pub const UPNVME_ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
/// Identify Controller ONCS bit 2: Dataset Management (`upnvme_deallocate`;
/// without it the call is refused with `UPNVME_ENOTSUP`).
pub const UPNVME_ONCS_DSM: u16 = 1 << 2;
/// Identify Controller ONCS bit 3: Write Zeroes (`upnvme_write_zeroes`;
/// without it the call is refused with `UPNVME_ENOTSUP`).
pub const UPNVME_ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// Identify Controller ONCS bit 4: the Save field of Set Features and the
/// Select field of Get Features.
pub const UPNVME_ONCS_SAVE_SELECT: u16 = 1 << 4;
/// Identify Controller ONCS bit 5: reservations.
pub const UPNVME_ONCS_RESERVATIONS: u16 = 1 << 5;
/// Identify Controller ONCS bit 6: the Timestamp feature.
pub const UPNVME_ONCS_TIMESTAMP: u16 = 1 << 6;
/// Identify Controller ONCS bit 7: Verify.
pub const UPNVME_ONCS_VERIFY: u16 = 1 << 7;
/// Identify Controller ONCS bit 8: Copy.
pub const UPNVME_ONCS_COPY: u16 = 1 << 8;
/// Identify Controller VWC bit 0: a volatile write cache is present. Without
/// it a write is durable when it completes, and `upnvme_flush` (Flush, a
/// mandatory command) completes successfully having nothing to do.
pub const UPNVME_VWC_PRESENT: u8 = 1 << 0;

/// What a controller is and what it supports: Identify Controller as the
/// library read it when it opened the controller (the data its queue pairs
/// check commands against: a command whose ONCS bit is clear is refused
/// with `UPNVME_ENOTSUP`, nothing sent). Filled by `upnvme_ctrl_get_info`.
///
/// Size-versioned like the options structs: the library writes at most the
/// caller's `sizeof` and sets `size` to the bytes it wrote, so a field is
/// filled when `offsetof(field) + sizeof(field) <= size`
/// (`UPNVME_CTRL_INFO_HAS(&info, field)`); later versions add fields at the
/// end only, and bytes past `size` are left as they were.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_ctrl_info {
    /// The bytes the library filled (set by `upnvme_ctrl_get_info`).
    pub size: u32,
    /// VID, PCI Vendor ID.
    pub vid: u16,
    /// SSVID, PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// CNTLID, Controller ID.
    pub cntlid: u16,
    /// OACS, Optional Admin Command Support.
    pub oacs: u16,
    /// ONCS, Optional NVM Command Support: `UPNVME_ONCS_*` bits.
    pub oncs: u16,
    /// VWC, Volatile Write Cache: `UPNVME_VWC_PRESENT` (bit 0); bits 2:1
    /// tell whether Flush takes the broadcast NSID.
    pub vwc: u8,
    /// Reserved, 0.
    pub rsvd15: u8,
    /// VER, the NVMe version (major in bits 31:16, minor 15:8, tertiary
    /// 7:0); 0 when the controller does not report it.
    pub ver: u32,
    /// NN, Number of Namespaces: the largest NSID the controller supports.
    pub nn: u32,
    /// SGLS, SGL Support (bits 1:0 non-zero: SGLs for NVM commands).
    pub sgls: u32,
    /// I/O queue pairs the controller granted (Set Features, Number of
    /// Queues): at most this many `upnvme_qpair_create` at once.
    pub io_queues: u16,
    /// Reserved, 0.
    pub rsvd30: u16,
    /// SN, Serial Number: ASCII, trailing spaces removed, NUL-terminated.
    pub sn: [c_char; 21],
    /// MN, Model Number: as `sn`.
    pub mn: [c_char; 41],
    /// FR, Firmware Revision (at bring-up): as `sn`.
    pub fr: [c_char; 9],
    /// CRDT1..CRDT3, Command Retry Delay Times in 100 ms units: a failed
    /// completion's `crd` 1–3 asks the host to wait `crdt[crd - 1]` × 100 ms
    /// before sending the command again.
    pub crdt: [u16; 3],
    /// Reserved, 0: the previous version's tail padding (its `sizeof` was
    /// 112, which an older library writes whole), so no later field lies
    /// where an older library's padding bytes land.
    pub rsvd110: u16,
    /// OCFS, Optional Copy Formats Supported: bit *n* set, the controller
    /// supports Copy Descriptor Format *n*h (`upnvme_copy`: 0h/1h within a
    /// namespace, 2h/3h across namespaces; 0 leaves formats 0h/1h
    /// unrestricted).
    pub ocfs: u16,
    /// CDFE, the Copy Descriptor Formats enabled in the Host Behavior
    /// Support feature as of this call (bit *n*: Format *n*h): formats 2h
    /// and 3h need it, and the library enables what OCFS reports at
    /// bring-up and after a reset. A cross-namespace `upnvme_copy` goes
    /// where `ocfs & cdfe` has bit 2 (16-bit guard or no protection
    /// information) or 3 (32- or 64-bit guard).
    pub cdfe: u16,
}

impl Default for upnvme_ctrl_info {
    fn default() -> Self {
        upnvme_ctrl_info {
            size: std::mem::size_of::<upnvme_ctrl_info>() as u32,
            vid: 0,
            ssvid: 0,
            cntlid: 0,
            oacs: 0,
            oncs: 0,
            vwc: 0,
            rsvd15: 0,
            ver: 0,
            nn: 0,
            sgls: 0,
            io_queues: 0,
            rsvd30: 0,
            sn: [0; 21],
            mn: [0; 41],
            fr: [0; 9],
            crdt: [0; 3],
            rsvd110: 0,
            ocfs: 0,
            cdfe: 0,
        }
    }
}

// SAFETY: no `bool` field; every field is an integer or an array of them.
unsafe impl crate::status::CallerOptions for upnvme_ctrl_info {
    const BOOLS: &'static [usize] = &[];
}

/// `s` as a NUL-terminated C string of at most `N - 1` bytes, cut at a
/// character boundary.
fn c_string<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    let mut end = s.len().min(N.saturating_sub(1));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    for (d, &b) in out.iter_mut().zip(&s.as_bytes()[..end]) {
        *d = b as c_char;
    }
    out
}

/// An asynchronous event (`upnvme_ctrl_poll_async_events`): the
/// Asynchronous Event Request's completion Dword 0, decoded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct upnvme_async_event {
    /// Asynchronous Event Type (0 error, 1 SMART / Health, 2 notice, 6 I/O
    /// command specific, 7 vendor specific).
    pub event_type: u8,
    /// Asynchronous Event Information (for a notice, 0: Namespace Attribute
    /// Changed — call `upnvme_ctrl_refresh_namespaces`).
    pub event_info: u8,
    /// The log page that tells more (and whose read re-arms the event).
    pub log_page: u8,
    /// Reserved, 0.
    pub reserved: u8,
}

impl From<AsyncEvent> for upnvme_async_event {
    fn from(e: AsyncEvent) -> Self {
        upnvme_async_event {
            event_type: e.event_type,
            event_info: e.event_info,
            log_page: e.log_page,
            reserved: 0,
        }
    }
}

/// The controller's namespace handles as of its last refresh, shared with
/// its queue pairs: a pair that meets a retired handle takes the current
/// ones from here.
pub(crate) type SharedNamespaces = Arc<Mutex<Vec<Namespace>>>;

/// A controller, generic over its device so the host tests can run the C
/// API's logic on the in-memory model.
pub struct Ctrl<D: Device> {
    /// The controller (`None` only once taken by close). Read-locked by
    /// every call on the handle, write-locked by the namespace refresh
    /// (`Controller::refresh_namespaces` replaces the controller's list)
    /// and the end of a Format NVM (`Controller::format_nvm_finish`):
    /// the handle may be shared by threads for every call but close.
    ctrl: RwLock<Option<Controller<D>>>,
    pub(crate) nss: SharedNamespaces,
    /// Events polled but not yet handed out (more than the caller's array
    /// took).
    events: Mutex<VecDeque<AsyncEvent>>,
    /// Held through a whole Format NVM (see `Ctrl::format_nvm`), and by a
    /// namespace refresh before it asks for the write lock (`Ctrl::refresh`).
    format: Mutex<()>,
}

impl<D: Device> Ctrl<D> {
    /// Wraps an open controller.
    pub fn new(c: Controller<D>) -> Ctrl<D> {
        Ctrl {
            nss: Arc::new(Mutex::new(c.namespaces().to_vec())),
            ctrl: RwLock::new(Some(c)),
            events: Mutex::new(VecDeque::new()),
            format: Mutex::new(()),
        }
    }

    /// Fills `out` with the asynchronous events that arrived (polling the
    /// admin queue when fewer than `out.len()` are kept from before);
    /// returns how many. A Namespace Attribute Changed notice has already
    /// retired the handles whose namespace changed when it is returned.
    pub(crate) fn poll_events(&self, out: &mut [upnvme_async_event]) -> upnvme::Result<usize> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        let mut kept = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < out.len() {
            match c.poll_async_events() {
                Ok(new) => kept.extend(new),
                // What was kept is handed out; the error comes next time.
                Err(e) if kept.is_empty() => return Err(e),
                Err(_) => {}
            }
        }
        let n = kept.len().min(out.len());
        for (dst, e) in out.iter_mut().zip(kept.drain(..n)) {
            *dst = e.into();
        }
        Ok(n)
    }

    /// Get Log Page with Retain Asynchronous Event clear
    /// (`Controller::get_log_page`).
    pub(crate) fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        len: usize,
        offset: u64,
    ) -> upnvme::Result<Vec<u8>> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        c.get_log_page(lid, nsid, len, offset)
    }

    /// An admin command through `Controller::admin_passthrough_with_timeout`
    /// (bounded by `timeout`, else the controller's admin timeout), moving
    /// `data` in the direction the opcode's bits 1:0 give (NVMe 2.0 §5,
    /// "Opcodes for Admin Commands": 01b host to controller, 10b
    /// controller to host, 11b both); `data` must be empty for 00b.
    pub(crate) fn admin_passthru(
        &self,
        cmd: &upnvme_admin_cmd,
        data: &mut Vec<u8>,
        timeout: Option<Duration>,
    ) -> upnvme::Result<Cqe> {
        // The handle's lock only for taking an admin handle: the wait (a
        // Firmware Commit may take minutes) holds nothing, so a refresh or
        // format queued for the write lock does not hold other calls up
        // behind this one.
        let Some(admin) = self.get().map(|c| c.admin_handle()) else {
            return Err(closed());
        };
        if cmd.rsvd != [0; 3] {
            return Err(upnvme::Error::InvalidArgument(
                "upnvme_admin_cmd: rsvd must be 0 (initialise the struct with {0})".into(),
            ));
        }
        let direction = cmd.opcode & 0b11;
        if direction == 0 && !data.is_empty() {
            return Err(upnvme::Error::InvalidArgument(format!(
                "admin command 0x{:02x}: its opcode's bits 1:0 are 00b (no data transfer), but \
                 data_len is {}: pass NULL and 0, or the opcode of a command that moves data",
                cmd.opcode,
                data.len()
            )));
        }
        let sqe = cmd.sqe();
        let out = (direction & 1 != 0).then_some(data.as_slice());
        let (cqe, back) = match timeout {
            Some(t) => admin.admin_passthrough_with_timeout(sqe, data.len(), out, t)?,
            None => admin.admin_passthrough(sqe, data.len(), out)?,
        };
        if direction & 2 != 0 {
            // What the command moved, no more: the caller's bytes past it
            // are left as they were.
            let n = back.len().min(data.len());
            data[..n].copy_from_slice(&back[..n]);
            data.truncate(n);
        }
        Ok(cqe)
    }

    /// Format NVM of namespace `nsid` (`Controller::format_nvm`); the
    /// namespaces were read again whatever the outcome, and the queue pairs
    /// use the new handles from their next submission. The command is sent
    /// and waited for under the handle's read lock
    /// (`Controller::format_nvm_run`), so other calls on the handle go on
    /// while it runs; only reading the namespaces again
    /// (`Controller::format_nvm_finish`) takes the write lock, which waits
    /// for the calls in progress. Formats from several threads run one
    /// after the other, each to its end (`format`), so that none holds the
    /// read lock through another's wait.
    pub(crate) fn format_nvm(&self, nsid: u32, f: &upnvme_format) -> upnvme::Result<()> {
        let format = f.to_format()?;
        let _one = self.format.lock().unwrap_or_else(PoisonError::into_inner);
        let run = {
            let Some(c) = self.get() else {
                return Err(closed());
            };
            c.format_nvm_run(nsid, &format)
        };
        let mut guard = self.ctrl.write().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = guard.as_mut() else {
            return Err(closed());
        };
        let r = c.format_nvm_finish(run);
        *self.nss.lock().unwrap_or_else(PoisonError::into_inner) = c.namespaces().to_vec();
        r.map(drop)
    }

    /// Resets the controller (`Controller::reset`): a failed controller is
    /// usable again; queue pairs re-create their queues at their next call.
    pub(crate) fn reset(&self) -> upnvme::Result<()> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        c.reset()
    }

    /// `upnvme_ctrl_admin_passthru` past its pointer checks: the command
    /// bounded by `cmd.timeout_ms` (0: the admin timeout), `cpl` filled
    /// (dwords 0 and 1 on success, the status on `UPNVME_EIO`), the return
    /// code with the last error recorded.
    pub(crate) fn admin_passthru_c(
        &self,
        cmd: &upnvme_admin_cmd,
        data: &mut Vec<u8>,
        cpl: &mut upnvme_admin_cpl,
    ) -> c_int {
        let timeout =
            (cmd.timeout_ms != 0).then(|| Duration::from_millis(u64::from(cmd.timeout_ms)));
        *cpl = upnvme_admin_cpl::default();
        match self.admin_passthru(cmd, data, timeout) {
            Ok(cqe) => {
                cpl.dw0 = cqe.dw0();
                cpl.dw1 = cqe.dw[1];
                UPNVME_OK
            }
            Err(e) => {
                if let upnvme::Error::Command { status, .. } = &e {
                    cpl.sct = status.sct();
                    cpl.sc = status.sc();
                    cpl.dnr = status.dnr();
                    cpl.crd = status.crd();
                }
                fail_error(&e)
            }
        }
    }

    /// Reads the namespace list again (`Controller::refresh_namespaces`)
    /// and shares the new handles with the queue pairs. Waits for the calls
    /// in progress on this handle (a write lock; an admin passthrough does
    /// not hold the handle while it waits).
    pub(crate) fn refresh(&self) -> upnvme::Result<NamespaceChanges> {
        // After a format in progress, not queued as a writer behind its read
        // lock: std's `RwLock` admits no reader while a writer waits, so
        // every other call on the handle would wait for the whole format.
        let _format = self.format.lock().unwrap_or_else(PoisonError::into_inner);
        let mut guard = self.ctrl.write().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = guard.as_mut() else {
            return Err(closed());
        };
        let changes = c.refresh_namespaces()?;
        *self.nss.lock().unwrap_or_else(PoisonError::into_inner) = c.namespaces().to_vec();
        Ok(changes)
    }

    /// The controller, read-locked for as long as the returned value
    /// lives; `None` after close.
    pub(crate) fn get(&self) -> Option<CtrlRef<'_, D>> {
        let guard = self.ctrl.read().unwrap_or_else(PoisonError::into_inner);
        guard.is_some().then_some(CtrlRef(guard))
    }

    /// The controller itself, for close.
    pub(crate) fn into_controller(self) -> Option<Controller<D>> {
        self.ctrl
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What the controller is and supports (Identify Controller from
    /// bring-up, which the queue pairs check commands against).
    pub(crate) fn info(&self) -> upnvme::Result<upnvme_ctrl_info> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        let id = c.identify();
        Ok(upnvme_ctrl_info {
            vid: id.vid,
            ssvid: id.ssvid,
            cntlid: id.cntlid,
            oacs: id.oacs,
            oncs: id.oncs,
            vwc: id.vwc,
            ver: id.ver,
            nn: id.nn,
            sgls: id.sgls,
            io_queues: c.granted_io_queues(),
            sn: c_string(&id.sn),
            mn: c_string(&id.mn),
            fr: c_string(&id.fr),
            crdt: id.crdt,
            ocfs: id.ocfs,
            cdfe: c.copy_formats_enabled(),
            ..upnvme_ctrl_info::default()
        })
    }

    /// Geometry of namespace `nsid`.
    pub(crate) fn ns_info(&self, nsid: u32) -> upnvme::Result<upnvme_ns_info> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        let ns = c.namespace(nsid)?;
        let layout = ns.metadata_layout();
        Ok(upnvme_ns_info {
            nsid,
            lba_size: ns.lba_size(),
            blocks: ns.lba_count(),
            size_bytes: ns.size_bytes(),
            metadata_size: ns.metadata_size(),
            metadata_extended: layout.is_some_and(|l| l.extended),
            pi_type: layout.map_or(0, |l| l.pi_type),
            dlfeat: ns.identify().dlfeat,
            pi_first: layout.is_some_and(|l| l.pi_type != 0 && l.pi_first),
            pi_guard_bits: layout
                .filter(|l| l.pi_type != 0)
                .map_or(0, |l| l.pif.guard_bits() as u8),
        })
    }
}

/// A read-locked controller of a handle: [`Ctrl::get`] makes one only when
/// the controller is there, and nothing takes it out while the lock is
/// held (close consumes the handle; the refresh's write lock waits).
pub(crate) struct CtrlRef<'a, D: Device>(RwLockReadGuard<'a, Option<Controller<D>>>);

impl<D: Device> Deref for CtrlRef<'_, D> {
    type Target = Controller<D>;

    fn deref(&self) -> &Controller<D> {
        match self.0.as_ref() {
            Some(c) => c,
            // `Ctrl::get` checked it under this same read lock.
            None => unreachable!("a CtrlRef is only made for a present controller"),
        }
    }
}

/// The error for a handle whose controller was closed.
fn closed() -> upnvme::Error {
    upnvme::Error::InvalidArgument("the controller is closed".into())
}

//! Queue pairs (`upnvme_qpair`): options, commands with a completion callback
//! and argument (as SPDK's `spdk_nvme_ns_cmd_read` cb_fn/cb_arg), and
//! `process_completions`, whose callbacks may submit on the same pair.
//!
//! Re-entrancy: the completion loop takes one completion at a time
//! ([`IoQueuePair::next_completion`]) and holds no Rust reference to the pair
//! while the C callback runs, so the callback may call any function on the
//! pair — submit, process completions again — except destroy
//! (`UPNVME_EBUSY`).

use std::ffi::{c_int, c_void};
use std::time::Duration;

use upnvme::{
    Completion, CopyRange, CopySource, Device, DsmRange, IoCommand, IoData, IoFlags, IoQueuePair,
    Namespace, Protection, QueuePairOptions, Reject, SqAnnounce,
};

use crate::buf::upnvme_buf;
use crate::ctrl::SharedNamespaces;
use crate::status::{
    UPNVME_EAGAIN, UPNVME_EBUSY, UPNVME_EINVAL, UPNVME_ENODEV, UPNVME_OK, error_code, fail,
    fail_fixed, io_error_code, reject_code,
};

/// Options of `upnvme_qpair_create`. Fill with `upnvme_qpair_opts_default(&o)`
/// (a header inline: `upnvme_qpair_opts_init(&o, sizeof o)`),
/// then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_qpair_opts {
    /// `sizeof(struct upnvme_qpair_opts)` as the caller's header has it, set
    /// by `upnvme_qpair_opts_init` / `upnvme_qpair_opts_default`
    /// (a struct with `size` below 4 is refused with `UPNVME_EINVAL`).
    pub size: u32,
    /// Submission queue entries (2..=CAP.MQES+1); 0 = the default (up to 256).
    /// At most `entries - 1` commands are in flight.
    pub entries: u32,
    /// Let the shadow doorbell EventIdx skip MMIO writes (default true; only
    /// with a controller opened with `upnvme_ctrl_opts.shadow_doorbells`,
    /// which is off by default).
    pub shadow_doorbells: bool,
    /// Reap right after each doorbell (default false; exists to be measured).
    pub reap_on_submit: bool,
    /// Abort a command not completed after this many milliseconds (then
    /// reset the controller if it still does not complete); 0 = the default,
    /// `UINT32_MAX` = never.
    pub command_timeout_ms: u32,
    /// How queued commands are announced to the controller (the SQ Tail
    /// doorbell, or its shadow and EventIdx): false (the default) is the
    /// library's default (`SqAnnounce::DEEP`: each batch once, when the pair
    /// rings, while at most 64 commands are in flight; each command as it
    /// is queued from 65 on); true announces every command as it is queued
    /// (`SqAnnounce::EachCommand`). Both need shadow doorbells (the
    /// controller's and this pair's `shadow_doorbells`); with MMIO doorbells
    /// every batch is announced once, when the pair rings. docs/benchmarks.md, "SQ announcement", has the
    /// measurements. Added after `command_timeout_ms`: a caller whose `size`
    /// ends before it gets the default.
    pub sq_announce_each_command: bool,
    /// Delay the SQ doorbell (SPDK's `delay_cmd_submit`): `upnvme_read`,
    /// `upnvme_write` and the other submissions write their command into
    /// the SQ without the doorbell; one doorbell write then announces all
    /// of them — `upnvme_qpair_ring`, or `upnvme_qpair_process_completions`,
    /// which rings what is waiting before it reaps and, at its end, what its
    /// callbacks submitted. Default false: each submission rings. Added
    /// after `sq_announce_each_command`, in what was the struct's tail
    /// padding: a program built against the header of that time has a
    /// `size` of 20 too, so this byte is read from its padding — zero
    /// (the default) when `upnvme_qpair_opts_init` or
    /// `upnvme_qpair_opts_default` filled the struct, as documented, and its
    /// fields were then set one by one; such a program that filled the
    /// struct any other way must be rebuilt. (Fields added from now on
    /// start at or past offset 20, the struct's `sizeof`, so `size` tells
    /// them apart.)
    pub delay_doorbell: bool,
}

impl Default for upnvme_qpair_opts {
    fn default() -> Self {
        let d = QueuePairOptions::default();
        upnvme_qpair_opts {
            size: std::mem::size_of::<upnvme_qpair_opts>() as u32,
            entries: 0,
            shadow_doorbells: d.shadow_doorbells,
            reap_on_submit: d.reap_on_submit,
            command_timeout_ms: 0,
            sq_announce_each_command: d.sq_announce == SqAnnounce::EachCommand,
            delay_doorbell: false,
        }
    }
}

// SAFETY: the four `bool` fields are listed; the others are integers.
unsafe impl crate::status::CallerOptions for upnvme_qpair_opts {
    const BOOLS: &'static [usize] = &[
        std::mem::offset_of!(upnvme_qpair_opts, shadow_doorbells),
        std::mem::offset_of!(upnvme_qpair_opts, reap_on_submit),
        std::mem::offset_of!(upnvme_qpair_opts, sq_announce_each_command),
        std::mem::offset_of!(upnvme_qpair_opts, delay_doorbell),
    ];
}

impl upnvme_qpair_opts {
    /// The library's options for these.
    pub(crate) fn to_options(self) -> QueuePairOptions {
        let mut o = QueuePairOptions::default();
        if self.entries != 0 {
            o.entries = Some(self.entries);
        }
        o.shadow_doorbells = self.shadow_doorbells;
        o.reap_on_submit = self.reap_on_submit;
        if self.sq_announce_each_command {
            o.sq_announce = SqAnnounce::EachCommand;
        }
        match self.command_timeout_ms {
            0 => {}
            u32::MAX => o.command_timeout = None,
            ms => o.command_timeout = Some(Duration::from_millis(u64::from(ms))),
        }
        o
    }
}

/// One completed command, as the callback sees it (valid during the call).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_cpl {
    /// `UPNVME_OK`, or why the command failed: `UPNVME_EIO` (an NVMe error
    /// status, in `sct`/`sc`), `UPNVME_ENODEV` (the controller failed),
    /// `UPNVME_ECANCELED` (ended by a reset), `UPNVME_ETIMEDOUT`.
    pub status: c_int,
    /// Status Code Type of the completion (0 when `status` is not `UPNVME_EIO`).
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry: do not send the command again as it is.
    pub dnr: bool,
    /// Command Retry Delay (CRD, 0–3) of a failed completion (with
    /// `UPNVME_EIO`): 0 retry at once, 1–3 wait CRDT1–CRDT3 × 100 ms
    /// (`upnvme_ctrl_info.crdt`). Non-zero only when the application set
    /// ACRE in the Host Behavior Support feature (FID 16h).
    pub crd: u8,
    /// Completion dword 0 (command specific).
    pub dw0: u32,
    /// The command's buffer handle (null for commands without one), owned by
    /// the application again.
    pub buf: *mut upnvme_buf,
    /// The command's separate metadata buffer handle (`upnvme_io_ext.md`;
    /// null without one), owned by the application again. Added after
    /// `buf`: a program built against a header without it reads the fields
    /// before it only. A program built with it should read it only for
    /// commands submitted through an `_ext` function: a library older than
    /// this field (which has no `_ext` functions) does not write it.
    pub md: *mut upnvme_buf,
}

/// A completion callback: `cb_arg` as given at submission, `cpl` valid for
/// the duration of the call.
pub type upnvme_cmd_cb = Option<unsafe extern "C" fn(cb_arg: *mut c_void, cpl: *const upnvme_cpl)>;

/// One Dataset Management range (`upnvme_deallocate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_range {
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks (1-based).
    pub blocks: u32,
}

/// One source range of `upnvme_copy` (a Copy command's Source Range entry).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_copy_range {
    /// Starting LBA in the source namespace.
    pub slba: u64,
    /// Number of logical blocks (1-based, at most 65536).
    pub blocks: u32,
    /// The source namespace (SNSID): 0 or the destination's NSID for the
    /// destination namespace itself, else another active namespace of the
    /// controller (a cross-namespace Copy, Copy Descriptor Format 2h/3h).
    pub snsid: u32,
}

/// An I/O command for `upnvme_io_passthru` (nvme-cli's `io-passthru`
/// fields): the library keeps the opcode, Command Dwords 2–3 and 10–15, and
/// sets the CID, the data pointer and NSID (from `nsid`, which must be an
/// active namespace); fused commands and MPTR are not expressible.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_io_cmd {
    /// Opcode (CDW0 bits 7:0).
    pub opcode: u8,
    /// Reserved: 0.
    pub rsvd: [u8; 3],
    /// Namespace Identifier (NSID): an active namespace of the controller.
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
}

/// What the `_ext` functions (`upnvme_read_ext`, ...) add to a command:
/// CDW12's flags, a separate metadata buffer, and End-to-end Data
/// Protection fields (NVM Command Set Specification, "Protection
/// Information Field" and Command Dwords 12, 14 and 15 of Read, Write,
/// Compare, Verify and Write Zeroes). Zero it and set `size`
/// (`struct upnvme_io_ext e = { .size = sizeof e };`). Later versions only
/// add fields at the end; a library reads at most its own version's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_io_ext {
    /// `sizeof(struct upnvme_io_ext)` as the caller's header has it. A
    /// `size` below this first version's (32 bytes on 64-bit targets) is
    /// refused with `UPNVME_EINVAL` (it is no version's size: read as far
    /// as it says, it could end inside a field).
    pub size: u32,
    /// `UPNVME_IO_FUA`, `UPNVME_IO_LIMITED_RETRY`, or 0.
    pub flags: u32,
    /// The separate metadata buffer (MPTR) for a namespace whose metadata
    /// is not part of each block (`upnvme_ns_info.metadata_extended`
    /// false): at least `blocks × metadata_size` bytes, held by the command
    /// until its callback (`upnvme_cpl.md`), like the data buffer. NULL
    /// otherwise: on an extended-LBA namespace the data buffer carries each
    /// block's metadata after its data (`blocks × (lba_size +
    /// metadata_size)` bytes).
    pub md: *mut upnvme_buf,
    /// `UPNVME_PI_*` bits: PRACT, the PRCHK checks, and whether `ref_tag`
    /// is given; 0 sends no protection fields (PRINFO 0).
    pub pi: u32,
    /// The (expected) Logical Block Application Tag (CDW15 bits 15:0).
    pub app_tag: u16,
    /// Which application tag bits are checked (CDW15 bits 31:16).
    pub app_tag_mask: u16,
    /// The (expected) Initial Logical Block Reference Tag, with
    /// `UPNVME_PI_REF_TAG`; without it, the command's starting LBA (which
    /// Type 1 requires).
    pub ref_tag: u64,
}

impl Default for upnvme_io_ext {
    fn default() -> Self {
        upnvme_io_ext {
            size: std::mem::size_of::<upnvme_io_ext>() as u32,
            flags: 0,
            md: std::ptr::null_mut(),
            pi: 0,
            app_tag: 0,
            app_tag_mask: 0,
            ref_tag: 0,
        }
    }
}

// SAFETY: no `bool` field; the others are integers and a raw pointer, valid
// for any bit pattern.
unsafe impl crate::status::CallerOptions for upnvme_io_ext {
    const BOOLS: &'static [usize] = &[];
}

/// `upnvme_io_ext.pi` bit: PRACT (CDW12 bit 29), Protection Information
/// Action — on a write the controller generates each block's protection
/// information (with 8- or 16-byte metadata that is only the tuple, the
/// host sends data only); on a read it checks it and, for such metadata,
/// strips it (the buffer gets data only).
pub const UPNVME_PI_PRACT: u32 = 1 << 0;
/// `upnvme_io_ext.pi` bit: PRCHK bit 2, check each block's Guard.
pub const UPNVME_PI_CHECK_GUARD: u32 = 1 << 1;
/// `upnvme_io_ext.pi` bit: PRCHK bit 1, check the Application Tag under
/// `app_tag_mask`.
pub const UPNVME_PI_CHECK_APP_TAG: u32 = 1 << 2;
/// `upnvme_io_ext.pi` bit: PRCHK bit 0, check the Reference Tag.
pub const UPNVME_PI_CHECK_REF_TAG: u32 = 1 << 3;
/// `upnvme_io_ext.pi` bit: `ref_tag` holds the (expected) initial
/// reference tag; without it the command's starting LBA is used.
pub const UPNVME_PI_REF_TAG: u32 = 1 << 4;

impl upnvme_io_ext {
    /// The protection fields these bits and tags ask for (`None` for `pi`
    /// 0), or a refusal naming an unknown bit.
    pub(crate) fn protection(&self) -> Result<Option<Protection>, String> {
        const KNOWN: u32 = UPNVME_PI_PRACT
            | UPNVME_PI_CHECK_GUARD
            | UPNVME_PI_CHECK_APP_TAG
            | UPNVME_PI_CHECK_REF_TAG
            | UPNVME_PI_REF_TAG;
        let pi = self.pi;
        if pi & !KNOWN != 0 {
            return Err(format!(
                "upnvme_io_ext.pi 0x{pi:x}: bits other than the UPNVME_PI_* ones (0x1f) are \
                 not defined; nothing was sent"
            ));
        }
        Ok((pi != 0).then_some(Protection {
            pract: pi & UPNVME_PI_PRACT != 0,
            check_guard: pi & UPNVME_PI_CHECK_GUARD != 0,
            check_app_tag: pi & UPNVME_PI_CHECK_APP_TAG != 0,
            check_ref_tag: pi & UPNVME_PI_CHECK_REF_TAG != 0,
            ref_tag: (pi & UPNVME_PI_REF_TAG != 0).then_some(self.ref_tag),
            app_tag: self.app_tag,
            app_tag_mask: self.app_tag_mask,
        }))
    }
}

/// A command of the C API (the namespace is given by NSID beside it).
#[derive(Clone, Copy, Debug)]
pub enum Cmd<'a> {
    /// Read (opcode 02h) into the buffer.
    Read {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
    },
    /// Write (opcode 01h) from the buffer.
    Write {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
    },
    /// Compare (opcode 05h) with the buffer.
    Compare {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
    },
    /// Verify (opcode 0Ch).
    Verify {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
    },
    /// Write Uncorrectable (opcode 04h).
    WriteUncorrectable {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
    },
    /// Flush (opcode 00h).
    Flush,
    /// Any I/O command (`upnvme_io_passthru`): the buffer, when given,
    /// carries `data_len` bytes.
    Raw {
        /// The command (NSID is set from the namespace).
        sqe: upnvme::Sqe,
        /// Bytes the data pointer describes (0: none).
        data_len: usize,
    },
    /// Write Zeroes (opcode 08h).
    WriteZeroes {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1-based).
        blocks: u32,
        /// DEAC.
        deallocate: bool,
    },
    /// Dataset Management (opcode 09h), Attribute – Deallocate.
    Deallocate {
        /// The ranges.
        ranges: &'a [upnvme_range],
    },
    /// Copy (opcode 19h): the source ranges, in order, to consecutive
    /// blocks from `sdlba`.
    Copy {
        /// Starting Destination LBA (SDLBA).
        sdlba: u64,
        /// The source ranges.
        ranges: &'a [upnvme_copy_range],
    },
}

/// Most source ranges one Copy carries from the C API: what the library
/// sends in one command (its entries fill one 4 KiB page: 128 of 32 bytes).
const MAX_COPY_RANGES: usize = 128;

/// What a command in flight calls back.
#[derive(Clone, Copy)]
struct Ctx {
    cb: upnvme_cmd_cb,
    arg: *mut c_void,
    buf: *mut upnvme_buf,
    /// The separate metadata buffer's handle (null: none).
    md: *mut upnvme_buf,
}

impl Ctx {
    /// Settles both handles of a command that ended without handing its
    /// memory back (the driver keeps it while the device might still use
    /// it).
    ///
    /// # Safety
    /// Each non-null handle was live at submission and is in flight (so it
    /// cannot have been freed: `upnvme_buf_free`, `upnvme_pool_put` and
    /// `upnvme_buf_split` refuse a handle in flight); no reference to it is
    /// live.
    unsafe fn settle_kept(&self) {
        for h in [self.buf, self.md] {
            if !h.is_null() {
                // SAFETY: the caller's contract.
                unsafe { (*h).settle(None) };
            }
        }
    }
}

/// What a command carries beside its buffer: CDW12's flags, a separate
/// metadata buffer and the protection fields (`upnvme_io_ext`), and
/// whether the caller asked through a function that handles metadata.
#[derive(Clone, Copy, Debug)]
pub struct Ext {
    /// FUA / Limited Retry.
    pub flags: IoFlags,
    /// The separate metadata buffer's handle (null: none).
    pub md: *mut upnvme_buf,
    /// PRACT, PRCHK and the tags (None: PRINFO 0, no tags).
    pub protection: Option<Protection>,
    /// The caller used an `_ext` function: a namespace with metadata is the
    /// library's to check (the plain functions refuse it outright, as they
    /// always have: their buffers carry data only).
    pub metadata_aware: bool,
}

impl Ext {
    /// No flags, no metadata, no protection fields: the plain functions.
    pub const PLAIN: Ext = Ext {
        flags: IoFlags::NONE,
        md: std::ptr::null_mut(),
        protection: None,
        metadata_aware: false,
    };

    /// Only `flags` (the `_flags` functions).
    pub fn flags(flags: IoFlags) -> Ext {
        Ext {
            flags,
            ..Ext::PLAIN
        }
    }
}

/// Armed while `submit` holds a handle's buffer outside both the handle and
/// the library's answer: if a panic unwinds through it (the guard at the ABI
/// turns it into `UPNVME_EINTERNAL`), the handle is settled without memory —
/// not in flight, no data pointer — so it can still be freed, and nothing
/// points at a buffer the unwinding may have released or the device may
/// still use.
pub(crate) struct Unwound(pub(crate) [*mut upnvme_buf; 2]);

impl Drop for Unwound {
    fn drop(&mut self) {
        for h in self.0 {
            if !h.is_null() {
                // SAFETY: armed only with live handles whose buffers
                // `submit` took; no reference to a handle is live while the
                // guard drops (`submit`'s references ended with the takes).
                unsafe { (*h).settle(None) };
            }
        }
    }
}

/// A queue pair, generic over its device (see `Ctrl`).
pub struct Qpair<D: Device> {
    /// The library's pair.
    pub qp: IoQueuePair<D>,
    /// The controller's handles as of the last look at `shared`.
    nss: Vec<Namespace>,
    /// The controller's handles as of its last refresh.
    shared: SharedNamespaces,
    /// The command of each tracking slot: `Some` from its submission until
    /// its callback is taken (a slot is on `free` exactly when it is `None`
    /// and no submission holds it).
    ctxs: Vec<Option<Ctx>>,
    free: Vec<u32>,
    /// Callbacks running now (nested when a callback processes completions).
    depth: u32,
    /// Being destroyed with commands that can never complete: their
    /// callbacks run now, and the pair takes no more work.
    ending: bool,
    /// A submission unwound (an internal error, turned into
    /// `UPNVME_EINTERNAL` by the entry point) between taking a tracking
    /// slot and recording its command — whether the library queued that
    /// command is unknown — or the library unwound while reaping, when a
    /// completion may have left the CQ without reaching its callback: the
    /// pair takes no more work and destroy drops it without waiting for its
    /// commands.
    poisoned: bool,
    /// Submissions queue without the doorbell
    /// (`upnvme_qpair_opts.delay_doorbell`); `upnvme_qpair_ring` and the end
    /// of `process_completions` ring.
    delay_doorbell: bool,
}

const NO_CTX: Ctx = Ctx {
    cb: None,
    arg: std::ptr::null_mut(),
    buf: std::ptr::null_mut(),
    md: std::ptr::null_mut(),
};

impl<D: Device> Qpair<D> {
    /// Wraps `qp`; `shared` are its controller's namespaces (`Ctrl::nss`).
    pub(crate) fn new(qp: IoQueuePair<D>, shared: SharedNamespaces) -> Qpair<D> {
        // The pair's depth, plus the completions one reap hands over before
        // their callbacks run: their slots are still held then, while the
        // library already takes new commands in their place (a callback's
        // resubmission). A callback that reaps again (nested) may need more:
        // the table grows then, once.
        let depth = qp.max_depth() as usize + REAP_BATCH;
        let nss = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Qpair {
            qp,
            nss,
            shared,
            ctxs: vec![None; depth],
            free: (0..depth as u32).rev().collect(),
            depth: 0,
            ending: false,
            poisoned: false,
            delay_doorbell: false,
        }
    }

    /// Sets whether submissions delay the doorbell
    /// (`upnvme_qpair_opts.delay_doorbell`).
    pub(crate) fn set_delay_doorbell(&mut self, on: bool) {
        self.delay_doorbell = on;
    }

    /// Announces every command submitted without its doorbell (one SQ tail
    /// write); nothing to do otherwise.
    ///
    /// # Safety
    /// As [`Qpair::process_completions`].
    pub unsafe fn ring(this: *mut Self) -> c_int {
        // SAFETY: live, this thread's; no callback runs inside this block.
        let me = unsafe { &mut *this };
        if me.poisoned {
            return poisoned();
        }
        // Commands of a pair being destroyed end there; a refused ring
        // (the controller reset or failed) ends its commands with that
        // outcome, reported by the next `process_completions`. Poisoned
        // while the library rings, as for a submission: should it unwind
        // (an internal error), the doorbell may not have reached the
        // device and the queued commands may never complete, so the pair
        // takes no more work and destroy does not wait for them.
        me.poisoned = true;
        me.qp.ring();
        me.poisoned = false;
        UPNVME_OK
    }

    /// Commands submitted through this API whose callback has not run yet:
    /// in flight at the controller, or completed and parked by the library
    /// (after a reset or close, an opportunistic reap, a partial reap) —
    /// which the library's `in_flight` does not count.
    pub(crate) fn outstanding(&self) -> u32 {
        self.ctxs.len().saturating_sub(self.free.len()) as u32
    }

    /// A poisoned pair's end at destroy: dropped as it is — the library
    /// ends its commands (keeping any memory the device may still reach);
    /// their callbacks do not run. Their buffer handles come back empty
    /// (not in flight, no memory), so the caller can free them.
    fn drop_poisoned(&mut self) {
        for ctx in self.ctxs.iter_mut().filter_map(Option::take) {
            // SAFETY: the handles were live at submission and cannot have
            // been freed while in flight; one slot holds them (slots are
            // taken once); no callback runs.
            unsafe { ctx.settle_kept() };
        }
    }

    /// Marks the pair as an unwound submission does (tests).
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
    }

    /// Whether a callback of this pair is running (destroy is refused then).
    pub(crate) fn in_callback(&self) -> bool {
        self.depth > 0
    }

    /// Readies the pair for destroy: `UPNVME_OK` when it may be freed now.
    /// With commands in flight it first delivers what is ready; what is
    /// still in flight then can complete later (`UPNVME_EBUSY`: process
    /// completions and retry) unless the controller cannot take commands
    /// any more (failed, closed, or the device is gone). Those commands
    /// would never complete, so each ends here, once: its callback runs
    /// with `UPNVME_ENODEV`, and its buffer handles (data and metadata)
    /// come back without their buffers (the driver keeps the memory while
    /// the device might still reach it; the handles are freed with
    /// `upnvme_buf_free`). The pair refuses submissions while these
    /// callbacks run.
    ///
    /// # Safety
    /// As [`Qpair::process_completions`].
    pub unsafe fn end_for_destroy(this: *mut Self) -> c_int {
        // SAFETY: live, this thread's; no callback runs inside this block.
        let me = unsafe { &mut *this };
        if me.in_callback() {
            return fail(
                UPNVME_EBUSY,
                "a queue pair cannot be destroyed from its own callback",
            );
        }
        if me.poisoned {
            me.drop_poisoned();
            return UPNVME_OK;
        }
        if me.outstanding() == 0 {
            return UPNVME_OK;
        }
        // Until a call delivers nothing: a call that delivers what was
        // already reaped (parked by `reap_on_submit`, a reset or a close)
        // returns that count and keeps the error for the next call, so one
        // call could take a pair whose device is gone for one whose commands
        // may still complete. Bounded: a callback may resubmit, so at most
        // one round per command slot and one more.
        let mut rc = 0;
        // SAFETY: as above.
        let rounds = unsafe { &*this }.ctxs.len() + 1;
        for _ in 0..rounds {
            // Without recording its error: a destroy that succeeds leaves
            // the caller's last error message as it was.
            // SAFETY: as above (no reference to the pair is held across it).
            rc = unsafe { Self::deliver(this, 0, false) };
            // SAFETY: as above.
            if rc <= 0 || unsafe { &*this }.outstanding() == 0 {
                break;
            }
        }
        // SAFETY: as above.
        let me = unsafe { &mut *this };
        if me.poisoned {
            // A callback's call unwound during the rounds.
            me.drop_poisoned();
            return UPNVME_OK;
        }
        let left = me.outstanding();
        if left == 0 {
            return UPNVME_OK;
        }
        if rc != UPNVME_ENODEV {
            return fail(
                UPNVME_EBUSY,
                format!("{left} command(s) in flight: process completions until none is left"),
            );
        }
        me.ending = true;
        let mut ended = Vec::new();
        for (i, c) in me.ctxs.iter_mut().enumerate() {
            if let Some(ctx) = c.take() {
                ended.push((i as u32, ctx));
            }
        }
        me.depth += 1;
        for (slot, ctx) in ended {
            // Released right before its own callback: until then the command
            // counts in `upnvme_qpair_in_flight` ("whose callback has not run
            // yet"); `ending` refuses submissions meanwhile.
            // SAFETY: as above; no callback runs now.
            unsafe { (*this).free.push(slot) };
            // Settled right before its own callback, not before the
            // first: until then the handles are in flight, so an earlier
            // callback cannot free them (`upnvme_buf_free` refuses) and
            // leave this callback a dangling pointer.
            // SAFETY: the handles were live at submission and cannot be
            // freed while in flight.
            unsafe { ctx.settle_kept() };
            let cpl = upnvme_cpl {
                status: UPNVME_ENODEV,
                sct: 0,
                sc: 0,
                dnr: false,
                crd: 0,
                dw0: 0,
                buf: ctx.buf,
                md: ctx.md,
            };
            if let Some(cb) = ctx.cb {
                // SAFETY: a C function pointer given at submission, called
                // once with its own argument; no reference to the pair is
                // held (the callback may call into it: it is refused).
                unsafe { cb(ctx.arg, &cpl) };
            }
        }
        // SAFETY: as above; the callbacks have returned.
        unsafe { (*this).depth -= 1 };
        UPNVME_OK
    }

    /// Submits `cmd` on namespace `nsid`; `buf` is required for Read and
    /// Write and moves into the command until its completion.
    ///
    /// # Safety
    /// `buf` is null or a live handle from this library.
    pub unsafe fn submit(
        &mut self,
        nsid: u32,
        cmd: Cmd<'_>,
        buf: *mut upnvme_buf,
        cb: upnvme_cmd_cb,
        arg: *mut c_void,
    ) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { self.submit_with(nsid, cmd, Ext::PLAIN, buf, cb, arg) }
    }

    /// [`Qpair::submit`] with what `ext` adds: per-command flags (CDW12
    /// FUA, LR), a separate metadata buffer (MPTR) and protection fields;
    /// the library refuses each where the command or the namespace's
    /// format has no place for it.
    ///
    /// # Safety
    /// `buf` and `ext.md` are each null or a live handle from this library.
    pub unsafe fn submit_with(
        &mut self,
        nsid: u32,
        cmd: Cmd<'_>,
        ext: Ext,
        buf: *mut upnvme_buf,
        cb: upnvme_cmd_cb,
        arg: *mut c_void,
    ) -> c_int {
        if self.ending {
            return fail(
                UPNVME_ENODEV,
                "the queue pair is being destroyed: its controller cannot take commands",
            );
        }
        if self.poisoned {
            return poisoned();
        }
        // A handle a namespace change retired (or a namespace listed only
        // since): take the controller's current ones, which
        // `upnvme_ctrl_refresh_namespaces` keeps (one load on the way).
        if !self.nss.iter().any(|n| n.id() == nsid && !n.is_stale()) {
            self.nss = self
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
        }
        if !self.nss.iter().any(|n| n.id() == nsid) {
            return fail(
                UPNVME_EINVAL,
                format!("namespace {nsid} is not an active namespace of this controller"),
            );
        }
        if let Cmd::Deallocate { ranges } = cmd
            && ranges.is_empty()
        {
            return fail(
                UPNVME_EINVAL,
                "Dataset Management with 0 ranges: must be at least 1".to_string(),
            );
        }
        // A Copy's source namespaces, each resolved like `nsid` (the list
        // was refreshed above when `nsid` needed it; a source retired or
        // listed only since gets one more look, once per command). Every
        // source is checked after that look, against the list the command
        // is built from: one checked before it may be gone from the new
        // list (another thread's refresh meanwhile), and the command must
        // not go with that range read from another namespace.
        if let Cmd::Copy { ranges, .. } = cmd {
            let snsid = |r: &upnvme_copy_range| if r.snsid == 0 { nsid } else { r.snsid };
            if ranges.iter().any(|r| {
                let s = snsid(r);
                !self.nss.iter().any(|n| n.id() == s && !n.is_stale())
            }) {
                self.nss = self
                    .shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
            }
            for (i, r) in ranges.iter().enumerate() {
                let snsid = snsid(r);
                if !self.nss.iter().any(|n| n.id() == snsid) {
                    return fail(
                        UPNVME_EINVAL,
                        format!(
                            "Copy source range {i}: namespace {snsid} (snsid) is not an active \
                             namespace of this controller"
                        ),
                    );
                }
            }
        }
        let Some(ns) = self.nss.iter().find(|n| n.id() == nsid) else {
            // Checked above; the list only changes where a source needed a
            // refresh, and a refresh that dropped `nsid` lands here.
            return fail(
                UPNVME_EINVAL,
                format!("namespace {nsid} is not an active namespace of this controller"),
            );
        };
        let plain = matches!(
            cmd,
            Cmd::Read { .. } | Cmd::Write { .. } | Cmd::Compare { .. }
        );
        // A raw command holds a buffer when it is given one (its own
        // function refuses a data length without one and the reverse).
        let data = plain || matches!(cmd, Cmd::Raw { .. }) && !buf.is_null();
        if plain && ns.metadata_size() != 0 && !ext.metadata_aware {
            return fail(
                crate::status::UPNVME_ENOTSUP,
                format!(
                    "namespace {nsid} has metadata ({} bytes per block): this function moves \
                     data only; use its _ext form (upnvme_read_ext, upnvme_write_ext, \
                     upnvme_compare_ext), which takes the metadata and protection fields",
                    ns.metadata_size()
                ),
            );
        }
        // SAFETY: `buf` is null or a live handle (the caller's contract); no
        // other reference to it exists while this function runs (handles
        // are used by one thread, like the pair).
        let handle = unsafe { buf.as_mut() };
        let mut buffer = None;
        let mut kept = std::ptr::null_mut();
        let mut unwound = Unwound([std::ptr::null_mut(); 2]);
        if !ext.md.is_null() && ext.md == buf {
            return fail(
                UPNVME_EINVAL,
                "the metadata buffer (md) is the data buffer's handle: pass two buffers",
            );
        }
        // Checked (not taken) before the data buffer is taken, so that a
        // refusal here leaves both handles as they were.
        // SAFETY: `ext.md` is null or a live handle (the caller's
        // contract), not `buf` (above); no other reference to it exists
        // while this function runs.
        if let Some(m) = unsafe { ext.md.as_ref() } {
            if let Some((code, why)) = m.busy() {
                return fail(code, why);
            }
            if m.buf.is_none() {
                return fail(
                    UPNVME_EINVAL,
                    "the metadata buffer was kept by the driver when its last command ended \
                     (the device might still have used it); free it and use another",
                );
            }
        }
        if data {
            let Some(h) = handle else {
                return fail(
                    UPNVME_EINVAL,
                    "Read, Write and Compare need a buffer (buf is NULL)",
                );
            };
            if let Some((code, why)) = h.busy() {
                return fail(code, why);
            }
            let Some(b) = h.buf.take() else {
                return fail(
                    UPNVME_EINVAL,
                    "the buffer was kept by the driver when its last command ended \
                     (the device might still have used it); free it and use another",
                );
            };
            buffer = Some(b);
            kept = buf;
            unwound.0[0] = buf;
        }
        let mut md_buffer = None;
        // SAFETY: as above.
        if let Some(m) = unsafe { ext.md.as_mut() } {
            md_buffer = m.buf.take();
            unwound.0[1] = ext.md;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.ctxs.push(None);
                self.ctxs.len() as u32 - 1
            }
        };
        // Cleared below; stays set if the submission unwinds.
        self.poisoned = true;
        let delay = self.delay_doorbell;
        // Whatever `ext` adds goes to the library, which refuses it where
        // the command or the namespace's format has no place for it.
        let mut send = |qp: &mut IoQueuePair<D>, cmd: IoCommand<'_>, buffer, tag| {
            let mut io = IoData::from(buffer).flags(ext.flags);
            if let Some(m) = md_buffer.take() {
                io = io.metadata(m);
            }
            if let Some(p) = ext.protection {
                io = io.protection(p);
            }
            if delay {
                qp.queue_io(cmd, io, tag)
            } else {
                qp.submit_io(cmd, io, tag)
            }
        };
        let result = match cmd {
            Cmd::Read { slba, blocks } => send(
                &mut self.qp,
                IoCommand::Read { ns, slba, blocks },
                buffer,
                u64::from(slot),
            ),
            Cmd::Write { slba, blocks } => send(
                &mut self.qp,
                IoCommand::Write { ns, slba, blocks },
                buffer,
                u64::from(slot),
            ),
            Cmd::Compare { slba, blocks } => send(
                &mut self.qp,
                IoCommand::Compare { ns, slba, blocks },
                buffer,
                u64::from(slot),
            ),
            Cmd::Verify { slba, blocks } => send(
                &mut self.qp,
                IoCommand::Verify { ns, slba, blocks },
                buffer,
                u64::from(slot),
            ),
            Cmd::WriteUncorrectable { slba, blocks } => send(
                &mut self.qp,
                IoCommand::WriteUncorrectable { ns, slba, blocks },
                buffer,
                u64::from(slot),
            ),
            Cmd::Raw { sqe, data_len } => send(
                &mut self.qp,
                IoCommand::Raw {
                    ns,
                    sqe: &sqe,
                    data_len,
                },
                buffer,
                u64::from(slot),
            ),
            Cmd::Flush => send(
                &mut self.qp,
                IoCommand::Flush { ns },
                buffer,
                u64::from(slot),
            ),
            Cmd::WriteZeroes {
                slba,
                blocks,
                deallocate,
            } => send(
                &mut self.qp,
                IoCommand::WriteZeroes {
                    ns,
                    slba,
                    blocks,
                    deallocate,
                },
                buffer,
                u64::from(slot),
            ),
            Cmd::Deallocate { ranges: r } => {
                // Only Dataset Management pays for the range list (copied
                // into the slots' pages by the library before this returns):
                // on the stack up to the 256 one command carries, else on
                // the heap (the library sends more as several commands).
                let range = |s: &upnvme_range| DsmRange {
                    cattr: 0,
                    nlb: s.blocks,
                    slba: s.slba,
                };
                let mut one = [DsmRange::default(); 256];
                let many: Vec<DsmRange>;
                let ranges: &[DsmRange] = if r.len() <= one.len() {
                    for (d, s) in one.iter_mut().zip(r) {
                        *d = range(s);
                    }
                    &one[..r.len()]
                } else {
                    many = r.iter().map(range).collect();
                    &many
                };
                let cmd = IoCommand::Deallocate { ns, ranges };
                send(&mut self.qp, cmd, buffer, u64::from(slot))
            }
            Cmd::Copy { sdlba, ranges: r } => {
                // Each source's handle, in this very list (checked above,
                // and nothing changes the list in between); a range of `ns`
                // itself (SNSID 0 or `nsid`) stays a same-namespace Copy
                // (Format 0h/1h, which needs no Host Behavior Support)
                // unless another namespace is in the list too. On the stack
                // up to what one command carries; more go to the library on
                // the heap, which refuses them with the limit.
                let nss = &self.nss;
                let source = |s: &upnvme_copy_range| {
                    let snsid = if s.snsid == 0 { nsid } else { s.snsid };
                    nss.iter().find(|n| n.id() == snsid).map(|n| CopySource {
                        ns: n,
                        slba: s.slba,
                        blocks: s.blocks,
                    })
                };
                let cross = r.iter().any(|s| s.snsid != 0 && s.snsid != nsid);
                if cross {
                    let blank = CopySource {
                        ns,
                        slba: 0,
                        blocks: 0,
                    };
                    let mut one = [blank; MAX_COPY_RANGES];
                    let many: Option<Vec<CopySource<'_>>>;
                    let sources: Option<&[CopySource<'_>]> = if r.len() <= one.len() {
                        let mut all = true;
                        for (d, s) in one.iter_mut().zip(r) {
                            match source(s) {
                                Some(x) => *d = x,
                                None => all = false,
                            }
                        }
                        all.then_some(&one[..r.len()])
                    } else {
                        many = r.iter().map(source).collect();
                        many.as_deref()
                    };
                    match sources {
                        Some(sources) => {
                            let cmd = IoCommand::CrossNamespaceCopy { ns, sdlba, sources };
                            send(&mut self.qp, cmd, buffer, u64::from(slot))
                        }
                        // A source not in the list the command is built
                        // from: refused as the handle it would have been
                        // (the pre-check above makes this unreachable; it
                        // is here so that no range is ever read from
                        // another namespace than the one it names).
                        None => Err(upnvme::Rejected {
                            reason: Reject::StaleNamespace {
                                nsid: r
                                    .iter()
                                    .find(|s| source(s).is_none())
                                    .map_or(nsid, |s| s.snsid),
                            },
                            buffer,
                            segments: None,
                            metadata: md_buffer.take(),
                        }),
                    }
                } else {
                    let range = |s: &upnvme_copy_range| CopyRange {
                        slba: s.slba,
                        blocks: s.blocks,
                    };
                    let mut one = [CopyRange::default(); MAX_COPY_RANGES];
                    let many: Vec<CopyRange>;
                    let ranges: &[CopyRange] = if r.len() <= one.len() {
                        for (d, s) in one.iter_mut().zip(r) {
                            *d = range(s);
                        }
                        &one[..r.len()]
                    } else {
                        many = r.iter().map(range).collect();
                        &many
                    };
                    let cmd = IoCommand::Copy { ns, sdlba, ranges };
                    send(&mut self.qp, cmd, buffer, u64::from(slot))
                }
            }
        };
        // The buffer is the command's now, or back in the refusal: no
        // unwinding left to guard against.
        unwound.0 = [std::ptr::null_mut(); 2];
        self.poisoned = false;
        match result {
            Ok(()) => {
                if !kept.is_null() {
                    // In flight only once the command holds the buffer: a
                    // panic between the take above and here leaves the
                    // handle without memory but not in flight, so it can
                    // still be freed.
                    // SAFETY: `kept` is `buf`, live (see above); the
                    // reference taken above is no longer used.
                    unsafe { (*kept).inflight = true };
                }
                if !ext.md.is_null() {
                    // SAFETY: `ext.md` is live (see above); no reference to
                    // it is held now.
                    unsafe { (*ext.md).inflight = true };
                }
                self.ctxs[slot as usize] = Some(Ctx {
                    cb,
                    arg,
                    buf: kept,
                    md: ext.md,
                });
                UPNVME_OK
            }
            Err(r) => {
                self.free.push(slot);
                if !kept.is_null() {
                    // SAFETY: `kept` is `buf`, live (see above); the
                    // reference taken above is no longer used.
                    let h = unsafe { &mut *kept };
                    h.settle(r.buffer);
                }
                if !ext.md.is_null() {
                    // SAFETY: `ext.md` is live (see above); no reference to
                    // it is held now.
                    unsafe { (*ext.md).settle(r.metadata) };
                }
                if r.reason == Reject::QueueFull {
                    // Back-pressure, a normal step of a submission loop:
                    // recorded without allocating.
                    return fail_fixed(
                        UPNVME_EAGAIN,
                        c"the I/O queue is full: reap completions \
                          (upnvme_qpair_process_completions) before submitting more",
                    );
                }
                fail(reject_code(r.reason), self.qp.describe(r.reason))
            }
        }
    }

    /// Ends `c`'s command on the C side: its slot freed, its buffer handle
    /// settled; returns what its callback gets.
    fn settle(&mut self, c: Completion) -> (Ctx, upnvme_cpl) {
        let slot = c.tag as usize;
        // A tag whose slot holds no command (only a library bug could
        // deliver one) runs no callback and frees nothing, so no slot is
        // ever free twice.
        let ctx = match self.ctxs.get_mut(slot).and_then(Option::take) {
            Some(ctx) => {
                self.free.push(slot as u32);
                ctx
            }
            None => NO_CTX,
        };
        if !ctx.buf.is_null() {
            // SAFETY: the handle was live at submission and cannot be freed
            // while in flight (`upnvme_buf_free` refuses).
            let h = unsafe { &mut *ctx.buf };
            h.settle(c.buffer);
        }
        if !ctx.md.is_null() {
            // SAFETY: as for the buffer.
            unsafe { (*ctx.md).settle(c.metadata) };
        }
        let (status, sct, sc, dnr, crd) = match &c.result {
            Ok(_) => (UPNVME_OK, 0, 0, false, 0),
            Err(e @ upnvme::IoError::Status(s))
            | Err(e @ upnvme::IoError::Protection { status: s, .. }) => {
                (io_error_code(e), s.sct(), s.sc(), s.dnr(), s.crd())
            }
            Err(e) => (io_error_code(e), 0, 0, false, 0),
        };
        let cpl = upnvme_cpl {
            status,
            sct,
            sc,
            dnr,
            crd,
            dw0: *c.result.as_ref().unwrap_or(&0),
            buf: ctx.buf,
            md: ctx.md,
        };
        (ctx, cpl)
    }

    /// Delivers up to `max` completions (0: all that are ready, at most the
    /// pair's depth) to their callbacks; returns how many, or a negative
    /// code.
    ///
    /// # Safety
    /// `this` is a live pair, used by this thread only. No reference to it
    /// is held while a callback runs, so callbacks may call back into the
    /// pair through their own pointer.
    pub unsafe fn process_completions(this: *mut Self, max: u32) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { Self::deliver(this, max, true) }
    }

    /// [`Qpair::process_completions`]; `record`: whether an error it
    /// returns is recorded as the thread's last error.
    ///
    /// # Safety
    /// As [`Qpair::process_completions`].
    unsafe fn deliver(this: *mut Self, max: u32, record: bool) -> c_int {
        // SAFETY: live, this thread's.
        if unsafe { (*this).poisoned } {
            return poisoned();
        }
        // SAFETY: live, this thread's.
        if unsafe { (*this).ending } {
            return fail(
                UPNVME_ENODEV,
                "the queue pair is being destroyed: its controller cannot take commands",
            );
        }
        // 0: every ready one, but at most the pair's depth in one call (as
        // SPDK caps it): callbacks that resubmit on a fast device would
        // otherwise keep finding one more.
        let max = match max {
            // SAFETY: live, this thread's; no callback runs yet.
            0 => unsafe { (*this).qp.max_depth() }.max(1),
            m => m,
        };
        // Reaped in batches on a pair that delays its doorbell, so the
        // callbacks' submissions go out with one doorbell per batch (each
        // reap announces what waits first); one at a time otherwise.
        // SAFETY: live, this thread's; no callback runs yet.
        let batch = if unsafe { (*this).delay_doorbell } {
            REAP_BATCH
        } else {
            1
        };
        // Emptied by each round's `take`s.
        let mut got: [Option<Completion>; REAP_BATCH] = [const { None }; REAP_BATCH];
        let mut n: u32 = 0;
        // A call a callback made may have poisoned the pair (it unwound):
        // no more reaps then, and no doorbell (below).
        // SAFETY: live, this thread's; no callback runs now.
        while n < max && !unsafe { (*this).poisoned } {
            let mut k = 0;
            let reaped = {
                // SAFETY: `this` is live and no other reference to it exists
                // now (callbacks run outside this block).
                let me = unsafe { &mut *this };
                // Poisoned while the library reaps: should it unwind (an
                // internal error), a completion may have been taken from
                // the CQ without its callback, so the pair takes no more
                // work and destroy does not wait for that command forever.
                // Only this reap's own mark is taken back afterwards.
                let before = me.poisoned;
                me.poisoned = true;
                let want = (max - n).min(batch as u32);
                let r = me.qp.process_completions(want, |_, c| {
                    if let Some(slot) = got.get_mut(k) {
                        *slot = Some(c);
                        k += 1;
                    }
                });
                me.poisoned = before;
                r
            };
            match reaped {
                Ok(_) if k == 0 => break,
                Ok(_) => {}
                // Callbacks ran (or are about to, for what this call
                // reaped): their count is the answer, so the caller knows
                // which commands ended; the error (a failed, closed or
                // released controller) is the next call's.
                Err(_) if n > 0 || k > 0 => {}
                Err(e) if record => return fail(poll_error_code(&e), &e),
                Err(e) => return poll_error_code(&e),
            }
            for c in got.iter_mut().take(k).filter_map(Option::take) {
                let (ctx, cpl) = {
                    // SAFETY: `this` is live and no other reference to it
                    // exists now (callbacks run outside this block).
                    let me = unsafe { &mut *this };
                    let done = me.settle(c);
                    me.depth += 1;
                    done
                };
                if let Some(cb) = ctx.cb {
                    // SAFETY: a C function pointer given at submission,
                    // called with its own argument and a completion valid
                    // for the call.
                    unsafe { cb(ctx.arg, &cpl) };
                }
                // SAFETY: as above; the callback has returned.
                unsafe { (*this).depth -= 1 };
                n += 1;
            }
            if reaped.is_err() || n >= c_int::MAX as u32 {
                break;
            }
        }
        // SAFETY: live, this thread's; the callbacks have returned.
        let me = unsafe { &mut *this };
        if me.delay_doorbell && !me.poisoned {
            // What the callbacks submitted goes out now, with one doorbell
            // write (SPDK's delay_cmd_submit rings at the same point).
            me.qp.ring();
        }
        n as c_int
    }
}

/// Completions one reap takes on a pair that delays its doorbell (their
/// callbacks then run, and what they submit goes out with the next reap's
/// doorbell): SPDK's batch is the pair's depth; 32 keeps the array on the
/// stack small.
const REAP_BATCH: usize = 32;

/// The code of a failed reap: [`error_code`], but for an NVMe status of an
/// admin command the pair sent for itself — a Create I/O CQ or SQ refused
/// after a controller reset, before the rate limit's wait turns the same
/// refusal into `Error::QueuesNotRecreated` — which is `UPNVME_ENODEV` as
/// that is: the pair cannot take commands now (the message says why and
/// when it tries again). `UPNVME_EIO` is a completion's NVMe status, and no
/// completion comes with this code. So is a wait of the pair's own
/// recovery that timed out — a reset it started (CSTS.RDY, an admin
/// command of the reset) or a re-creation without an answer: each leaves
/// the controller marked failed, which is what `UPNVME_ENODEV` says
/// (`UPNVME_ETIMEDOUT` is a command's or a caller's wait; a destroy takes
/// only `UPNVME_ENODEV` for commands that can no longer complete).
pub(crate) fn poll_error_code(e: &upnvme::Error) -> c_int {
    match e {
        upnvme::Error::Command { .. } | upnvme::Error::Timeout { .. } => UPNVME_ENODEV,
        e => error_code(e),
    }
}

/// The refusal of a pair poisoned by an internal error (see `Qpair::poisoned`).
fn poisoned() -> c_int {
    fail(
        crate::status::UPNVME_EINTERNAL,
        "the queue pair is unusable after an internal error in an earlier call (see that \
         call's message); destroy it (its commands' callbacks will not run)",
    )
}

//! The library's typed errors. Setup errors say what is wrong and how to fix
//! it; device errors say which command failed with which NVMe status.

use std::time::Duration;

use upnvme_dma::{DmaBuffer, DmaError};
use upnvme_queues::Status;

/// Everything that can go wrong in upnvme.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening the device or getting DMA memory failed (VFIO, sysfs, hugepages).
    #[error(transparent)]
    Dma(#[from] DmaError),

    /// The controller completed a command with an error status.
    #[error("{command} failed with NVMe status: {status}")]
    Command {
        /// The command, by spec name (e.g. "Identify (CNS 0x01)").
        command: String,
        /// The decoded status field of the completion queue entry.
        status: Status,
    },

    /// An I/O command ended without an NVMe status: ended by a reset, timed
    /// out, or abandoned with a failed controller.
    #[error("{command} did not complete: {error}")]
    Io {
        /// The command, by spec name.
        command: String,
        /// How it ended.
        error: IoError,
    },

    /// A wait exceeded its bound (a register state change or a command).
    #[error("timed out after {} ms waiting for {what}", .after.as_millis())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },

    /// The application's own admin commands, sent from many threads at
    /// once, held every admin command identifier it may take (the driver
    /// keeps some for itself) for as long as this one's bound: nothing was
    /// sent, and the controller is fine.
    #[error(
        "{what} on controller {device} was not sent: no admin command identifier \
         became free within {} ms ({outstanding} other admin commands of the application are \
         outstanding); the controller is fine: retry, or send fewer at once",
        .after.as_millis()
    )]
    AdminBusy {
        /// The device name.
        device: String,
        /// The command ("admin command 0x06").
        what: String,
        /// The application's admin commands outstanding.
        outstanding: u32,
        /// How long it waited.
        after: Duration,
    },

    /// Register reads return all ones: the device was removed or fell off the bus.
    #[error(
        "controller {device} is gone (register reads return all ones): hot-removed, reset by someone else, or its PCI link is down; if the link comes back (a recovered PCIe error) Controller::reset re-initialises it, otherwise drop the controller with its queue pairs and DMA memory and open it again once the device is back (`upnvme setup status` lists it)"
    )]
    ControllerGone {
        /// The device name (PCI address).
        device: String,
    },

    /// The kernel asked for the device back (VFIO device request: the device
    /// is being removed, or vfio-pci unbound) and the driver released it:
    /// DMA stopped, every command in flight ended with
    /// [`IoError::ControllerRemoved`], the device closed.
    #[error(
        "controller {device} was released because the kernel asked for it (device removal or vfio-pci unbind); open it again once it is back (`upnvme setup bind`)"
    )]
    ControllerRemoved {
        /// The device name (PCI address).
        device: String,
    },

    /// CSTS.CFS is set: the controller hit a fatal error and must be reset.
    #[error(
        "controller {device} reports Controller Fatal Status (CSTS.CFS); it must be reset (after an admin command the driver has reset it already; otherwise Controller::reset does)"
    )]
    ControllerFatal {
        /// The device name (PCI address).
        device: String,
    },

    /// The device violated the protocol (unknown or stale CID, duplicate
    /// completion, SQ head out of range, ...). The controller is marked failed.
    #[error(
        "controller {device} misbehaved: {what}; the controller is marked failed (Controller::reset brings it back)"
    )]
    DeviceFault {
        /// The device name.
        device: String,
        /// What it did.
        what: String,
    },

    /// An earlier fault or timeout left the controller failed; reset it.
    #[error(
        "controller {device} has failed earlier ({reason}) and accepts no more commands until Controller::reset"
    )]
    ControllerFailed {
        /// The device name.
        device: String,
        /// The first failure.
        reason: String,
    },

    /// After a controller reset, this queue pair could not create its
    /// queues again (Create I/O Completion Queue or Create I/O Submission
    /// Queue failed). The pair stays usable: the next submit or poll after
    /// `retry_in` tries again (at once for the first few failures, then
    /// after waits that double up to 100 ms), and a new reset starts over.
    #[error(
        "I/O queue pair {qid} of {device} has no queues since a controller reset: re-creating them failed {failures} time(s) in a row (last: {cause}); the next submit or poll tries again{}",
        if retry_in.is_zero() { String::new() } else { format!(" after {} ms", retry_in.as_millis().max(1)) }
    )]
    QueuesNotRecreated {
        /// The device name.
        device: String,
        /// The queue pair's queue ID.
        qid: u16,
        /// Failed re-creations in a row.
        failures: u32,
        /// Why the last one failed.
        cause: String,
        /// How long until the next try is made (zero: at the next call).
        retry_in: Duration,
    },

    /// The controller was closed.
    #[error("controller {device} is closed")]
    Closed {
        /// The device name.
        device: String,
    },

    /// The controller lacks something upnvme needs.
    #[error("controller {device} is not supported: {what}")]
    Unsupported {
        /// The device name.
        device: String,
        /// What is missing.
        what: String,
    },

    /// The queue pair has as many commands in flight as it can hold; reap
    /// completions and retry. Returned at once, never blocks.
    #[error(
        "I/O queue {qid} is full: reap completions (process_completions) before submitting more"
    )]
    QueueFull {
        /// The queue ID.
        qid: u16,
    },

    /// Every I/O queue the controller granted is in use.
    #[error(
        "controller {device} has no I/O queue left: all {granted} granted queue pairs are in use (ask for more with ControllerOptions::io_queues, or drop a queue pair)"
    )]
    NoQueuesLeft {
        /// The device name.
        device: String,
        /// How many the controller granted.
        granted: u16,
    },

    /// A thread the library needs could not be started (the process is out
    /// of threads or memory).
    #[error(
        "could not start the {what} thread on {device}: {source}; the process is out of threads or memory: raise its limits (ulimit -u, /proc/sys/kernel/threads-max) or end threads it no longer needs, then open the controller again"
    )]
    ThreadSpawn {
        /// The device name.
        device: String,
        /// What the thread does.
        what: &'static str,
        /// Why the system refused it.
        source: std::io::Error,
    },

    /// The caller passed something invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A queue pair refused a command (see [`Reject`]): from
    /// [`crate::IoQueuePair::describe`] and the blocking helpers, so the
    /// reason stays typed (a [`Reject::SizeLimit`] carries the `max` to
    /// split at). It reads "invalid argument: …" when the caller passed
    /// something wrong ([`Reject::is_invalid_argument`]), "command refused:
    /// …" when the controller or the driver lacks what the command needs.
    #[error("{} {}", rejected_prefix(*.0), .0)]
    Rejected(Reject),

    /// The namespace is active but the driver cannot use it (an LBA format
    /// it has no code for, Identify refused with a status).
    #[error("namespace {nsid} on {device} is active but upnvme cannot use it: {reason}")]
    UnusableNamespace {
        /// The device name.
        device: String,
        /// The namespace asked for.
        nsid: u32,
        /// Why, and what to do about it.
        reason: String,
    },

    /// No namespace with this ID is active on the controller.
    #[error("namespace {nsid} is not active on {device} (active: {active:?})")]
    NoSuchNamespace {
        /// The device name.
        device: String,
        /// The namespace asked for.
        nsid: u32,
        /// The active namespace IDs.
        active: Vec<u32>,
    },
}

/// Shorthand for `Result<T, upnvme::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a command did not succeed (the error half of a [`crate::Completion`]'s
/// result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoError {
    /// The controller completed the command with an error status.
    Status(Status),
    /// The command was abandoned because the controller failed or was disabled;
    /// the device can no longer access its buffer.
    ControllerFailed,
    /// The controller was reset while the command was in flight; the command may
    /// or may not have taken effect. The device can no longer access its buffer.
    ControllerReset,
    /// The command exceeded the queue pair's `command_timeout` and was aborted
    /// (Abort command) or ended by a controller reset.
    TimedOut,
    /// The kernel asked for the controller back (removal or unbind) and the
    /// driver released it; the device can no longer access the buffer.
    ControllerRemoved,
    /// The queue pair was closed ([`crate::IoQueuePair::close`]) before the
    /// command completed; the controller confirmed the queues' deletion, so
    /// it can no longer access the buffer. The command may or may not have
    /// taken effect.
    QueueDeleted,
    /// An End-to-end Data Protection check failed (Media and Data Integrity
    /// Errors: End-to-end Guard Check Error 82h, Application Tag Check Error
    /// 83h, Reference Tag Check Error 84h): the block's protection
    /// information does not match its data or the command's expected tags.
    Protection {
        /// Which field of the PI tuple did not match.
        check: PiCheck,
        /// The completion's status, as posted.
        status: Status,
    },
}

/// The field of a Protection Information tuple whose check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PiCheck {
    /// The Guard (CRC-16 of the block's data): the data or the guard was
    /// corrupted.
    Guard,
    /// The Application Tag, under the command's mask.
    ApplicationTag,
    /// The Reference Tag (Type 1: the block's LBA; Type 2: the command's
    /// initial tag plus the block's index).
    ReferenceTag,
}

impl PiCheck {
    /// The check a status reports, if it is one of the three End-to-end
    /// check errors (SCT 2h, SC 82h..84h).
    pub fn from_status(status: Status) -> Option<PiCheck> {
        if status.sct() != upnvme_queues::status::sct::MEDIA {
            return None;
        }
        match status.sc() {
            0x82 => Some(PiCheck::Guard),
            0x83 => Some(PiCheck::ApplicationTag),
            0x84 => Some(PiCheck::ReferenceTag),
            _ => None,
        }
    }
}

impl std::fmt::Display for PiCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PiCheck::Guard => "guard",
            PiCheck::ApplicationTag => "application tag",
            PiCheck::ReferenceTag => "reference tag",
        })
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoError::Status(s) => write!(f, "NVMe status: {s}"),
            IoError::ControllerFailed => {
                f.write_str("abandoned: the controller failed and was disabled")
            }
            IoError::ControllerReset => f.write_str("ended by a controller reset while in flight"),
            IoError::TimedOut => f.write_str("timed out (aborted or ended by a controller reset)"),
            IoError::ControllerRemoved => f.write_str(
                "ended: the kernel asked for the controller back (removal or unbind) and it was released",
            ),
            IoError::QueueDeleted => f.write_str(
                "ended: its queue pair was closed before it completed (it may or may not have taken effect)",
            ),
            IoError::Protection { check, status } => write!(
                f,
                "end-to-end protection check failed: the {check} of a block does not match \
                 ({status})"
            ),
        }
    }
}

impl std::error::Error for IoError {}

/// Which of the NVM Command Set's per-command size limits (Identify CNS
/// 06h, CSI 00h) a command is beyond ([`Reject::SizeLimit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NvmLimit {
    /// VSL: the data (and interleaved metadata) a Verify covers.
    Verify,
    /// WZSL: the data (and interleaved metadata) a Write Zeroes covers.
    WriteZeroes,
    /// WUSL: the data (and interleaved metadata) a Write Uncorrectable
    /// covers.
    WriteUncorrectable,
    /// DMRL: ranges per Dataset Management command.
    DsmRanges,
    /// DMRSL: logical blocks per Dataset Management range.
    DsmRangeBlocks,
    /// DMSL: logical blocks in all ranges of one Dataset Management command.
    DsmBlocks,
    /// MSSRL (Identify Namespace): logical blocks per Copy source range.
    CopyRangeBlocks,
    /// MCL (Identify Namespace): logical blocks in all source ranges of one
    /// Copy.
    CopyBlocks,
}

/// The command whose range count is refused ([`Reject::RangeCount`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeCommand {
    /// Dataset Management: CDW10.NR is 8 bits, 0-based — 1..=256 ranges of
    /// 16 bytes, one page.
    DatasetManagement,
    /// Copy: as many source range entries as fill the one list page the
    /// pair keeps per command — 1..=128 of Descriptor Format 0h (32 bytes,
    /// a 16-bit guard format), 1..=102 of Format 1h (40 bytes, a 32- or
    /// 64-bit guard format) — and no more than the namespace's MSRC allows
    /// (Identify Namespace byte 80, 0-based).
    Copy,
}

impl RangeCommand {
    /// The command's name as the NVM Command Set specification spells it.
    pub fn name(self) -> &'static str {
        match self {
            RangeCommand::DatasetManagement => "Dataset Management",
            RangeCommand::Copy => "Copy",
        }
    }
}

/// The first words of [`Error::Rejected`]'s text.
fn rejected_prefix(r: Reject) -> &'static str {
    if r.is_invalid_argument() {
        "invalid argument:"
    } else {
        "command refused:"
    }
}

impl Reject {
    /// True when the caller passed something wrong (a range, a length, a
    /// buffer, a flag); false for [`Reject::QueueFull`] (try again after a
    /// reap), [`Reject::Unusable`] (the pair or controller cannot take
    /// commands) and what this controller or the driver does not offer
    /// ([`Reject::Unsupported`], [`Reject::MetadataFormat`],
    /// [`Reject::NotDescribable`]).
    pub fn is_invalid_argument(&self) -> bool {
        !matches!(
            self,
            Reject::QueueFull
                | Reject::Unusable
                | Reject::Unsupported { .. }
                | Reject::CopyFormat { .. }
                | Reject::MetadataFormat(_)
                | Reject::NotDescribable
        )
    }
}

/// Why a queue pair refused to submit a command: the hot path's error, a
/// few bytes (no string is built, nothing is allocated). Nothing reached the
/// device. [`crate::IoQueuePair::describe`] turns it into the descriptive
/// [`Error`] (for [`Reject::Unusable`], the controller's own explanation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reject {
    /// As many commands are in flight (or reaped but not yet delivered) as
    /// the pair holds: reap completions, then retry.
    QueueFull,
    /// The controller (or this pair, after a device fault) is failed, closed
    /// or gone; [`crate::IoQueuePair::describe`] says which.
    Unusable,
    /// The namespace handle belongs to another controller.
    ForeignNamespace,
    /// A buffer of the command (data, a vector segment or metadata) is
    /// mapped for another controller: its IOVA means something else, or
    /// nothing, to this one.
    ForeignBuffer,
    /// The namespace was formatted (Format NVM), or changed or removed by
    /// someone else (a Namespace Attribute Changed notice), since the handle
    /// was taken: its geometry no longer holds.
    StaleNamespace {
        /// The namespace's NSID.
        nsid: u32,
    },
    /// The command moves data but no buffer came with it.
    NoBuffer,
    /// The block count is 0 or above 65536 (CDW12.NLB is 16 bits, 0-based),
    /// for a command the pair cannot split: a Read, Write, Compare, Verify,
    /// Write Zeroes or Write Uncorrectable above 65536 blocks is otherwise
    /// split into commands of at most 65536 (up to the pair's depth of them).
    BlockCount {
        /// The count asked for.
        blocks: u32,
    },
    /// The LBA range runs past the end of the namespace (NSZE).
    LbaRange,
    /// The buffer is smaller than the transfer.
    BufferTooSmall {
        /// Bytes the transfer needs.
        need: u64,
    },
    /// The transfer exceeds the controller's MDTS (or the pair's 4 MiB cap)
    /// and the pair cannot split it: a raw command, more pieces than the
    /// pair's depth, or a logical block larger than MDTS. (A Read, Write or
    /// Compare above MDTS — one buffer, a slice or a vector — is otherwise
    /// split into several commands with one completion.)
    TransferTooLarge {
        /// Bytes of the transfer.
        bytes: u64,
    },
    /// A Dataset Management carries 1..=256 ranges, a Copy 1..=128. (A
    /// Deallocate, or a Dataset Management without Integral Dataset
    /// attributes, of more than 256 ranges is split by the pair into
    /// several commands; this is its refusal only when more than the
    /// pair's depth of them would be needed.)
    RangeCount {
        /// Which command.
        command: RangeCommand,
        /// Ranges passed.
        ranges: u32,
        /// The most it takes.
        max: u32,
    },
    /// The command is beyond one of the controller's NVM Command Set size
    /// limits ([`crate::Controller::nvm_limits`], Identify CNS 06h) or the
    /// namespace's Copy limits (Identify Namespace MSSRL, MCL): submit it in
    /// parts of at most `max`. (A Verify, Write Zeroes or Write
    /// Uncorrectable beyond VSL, WZSL or WUSL, and a Deallocate or a
    /// Dataset Management without Integral Dataset attributes beyond DMRL,
    /// DMRSL or DMSL, is split by the pair into parts within it; this is
    /// its refusal only when more parts than the pair's depth would be
    /// needed.)
    SizeLimit {
        /// Which limit.
        limit: NvmLimit,
        /// The most the limit allows: logical blocks of this namespace, or
        /// ranges for [`NvmLimit::DsmRanges`].
        max: u64,
    },
    /// The data (or metadata) does not start dword aligned — a piece of
    /// `DmaBuffer::split` or a slice offset that is not a multiple of 4 —
    /// which PRP1 and MPTR require.
    Misaligned,
    /// The namespace's metadata format is one the driver cannot describe a
    /// transfer for (protection information with fewer metadata bytes per
    /// block than its tuple: 8, or 16 with a 64-bit guard), so the data
    /// command is never sent.
    MetadataFormat(crate::namespace::MetadataLayout),
    /// The namespace keeps metadata in a separate buffer (FLBAS bit 4
    /// clear) and the command transfers it: pass a metadata buffer
    /// ([`crate::IoData::metadata`]) of at least `need` bytes (blocks × MS).
    MetadataBuffer {
        /// Bytes the metadata of the transfer needs.
        need: u64,
    },
    /// A metadata buffer came with a command that transfers none through
    /// MPTR: a namespace without metadata, an extended-LBA format (the
    /// metadata travels inside the data buffer), PRACT on a format whose
    /// metadata is only the PI tuple (8 bytes, 16 with a 64-bit guard: the
    /// controller inserts and strips it), or a command without data.
    MetadataNotApplicable,
    /// Protection information fields ([`crate::IoData::protection`]) that do
    /// not apply: the reason.
    ProtectionNotApplicable(&'static str),
    /// The slice ([`crate::IoData::slice`]) does not lie inside its buffer,
    /// or is empty.
    SliceOutOfBounds {
        /// Offset of the slice.
        offset: u64,
        /// Length of the slice.
        len: u64,
        /// Length of the buffer.
        size: u64,
    },
    /// Neither PRPs nor an SGL can describe the memory: a vector whose inner
    /// boundaries are not all page aligned (or a buffer not dword aligned)
    /// on a controller without SGL support (Identify Controller SGLS bits
    /// 1:0 = 00b), with [`crate::SglMode::Never`], or against an SGL
    /// alignment requirement (SGLS = 10b: dword-aligned addresses and
    /// lengths). A pair with no free slot says this rather than
    /// [`Reject::QueueFull`] for a vector it knows no slot would help (no
    /// SGL usable and PRPs cannot describe it).
    NotDescribable,
    /// The vector has more segments than the command's preallocated list
    /// pages hold.
    TooManySegments {
        /// Segments the transfer uses.
        segments: u32,
    },
    /// The controller does not advertise the command (Identify Controller
    /// ONCS), so it is not sent.
    Unsupported {
        /// The command's name.
        command: &'static str,
    },
    /// A Copy whose namespace format needs a Copy Descriptor Format the
    /// controller does not report in Identify Controller OCFS (Optional Copy
    /// Formats Supported): Format 0h with a 16-bit guard or no protection
    /// information, 1h with a 32- or 64-bit guard; for a cross-namespace
    /// Copy 2h and 3h, which must also be enabled (Host Behavior Support
    /// CDFE). Not sent.
    CopyFormat {
        /// The Descriptor Format the namespace's format needs (0 to 3).
        format: u8,
    },
    /// FUA or Limited Retry on a command whose CDW12 has no such bits.
    FlagsNotApplicable,
    /// A raw command ([`crate::IoCommand::Raw`]) the driver cannot send as
    /// built: the reason.
    RawCommand(&'static str),
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Reject::QueueFull => f.write_str(
                "the I/O queue is full: reap completions (process_completions) before submitting more",
            ),
            Reject::Unusable => f.write_str(
                "the controller or queue pair is failed, closed or gone (IoQueuePair::describe says which)",
            ),
            Reject::ForeignNamespace => f.write_str(
                "the namespace handle belongs to another controller: take it from this pair's controller",
            ),
            Reject::ForeignBuffer => f.write_str(
                "a buffer of the command is mapped for another controller (each controller has \
                 its own IOMMU mappings): allocate it from this pair's controller (alloc_dma, \
                 dma_pool, register_memory)",
            ),
            Reject::StaleNamespace { nsid } => write!(
                f,
                "namespace {nsid} was formatted or changed since this handle was taken (Format \
                 NVM, or a Namespace Attribute Changed notice): take a new one with \
                 Controller::namespace({nsid}), after Controller::refresh_namespaces() for a \
                 change made elsewhere"
            ),
            Reject::NoBuffer => f.write_str("the command needs a data buffer"),
            Reject::BlockCount { blocks: 0 } => f.write_str("block count 0: must be 1..=65536"),
            Reject::BlockCount { blocks } => write!(
                f,
                "block count {blocks}: one command carries 1..=65536 (a Read, Write, Compare, \
                 Verify, Write Zeroes or Write Uncorrectable above that is split, into at most \
                 the queue pair's depth of commands)"
            ),
            Reject::LbaRange => f.write_str("the LBA range is outside the namespace (NSZE)"),
            Reject::BufferTooSmall { need } => {
                write!(f, "the transfer needs {need} bytes; the buffer is smaller")
            }
            Reject::TransferTooLarge { bytes } => write!(
                f,
                "a transfer of {bytes} bytes exceeds the maximum per command (MDTS, at most 4 MiB) and cannot be split into at most queue-depth commands of whole blocks (raw commands are never split); submit it in parts"
            ),
            Reject::RangeCount {
                command,
                ranges,
                max,
            } => {
                write!(f, "{} with {ranges} ranges: must be 1..={max}", command.name())?;
                if command == RangeCommand::DatasetManagement && ranges > max {
                    f.write_str(
                        " per command; more go as several commands (at most the queue pair's \
                         depth of them) unless Integral Dataset attributes (IDR, IDW) are set",
                    )?;
                }
                Ok(())
            }
            Reject::SizeLimit { limit, max } => {
                const NVM_CTRL: &str = "Identify Controller, NVM Command Set";
                const NS: &str = "Identify Namespace";
                let (what, structure, field, unit) = match limit {
                    NvmLimit::Verify => ("a Verify", NVM_CTRL, "VSL", "blocks per command"),
                    NvmLimit::WriteZeroes => {
                        ("a Write Zeroes", NVM_CTRL, "WZSL", "blocks per command")
                    }
                    NvmLimit::WriteUncorrectable => {
                        ("a Write Uncorrectable", NVM_CTRL, "WUSL", "blocks per command")
                    }
                    NvmLimit::DsmRanges => {
                        ("Dataset Management", NVM_CTRL, "DMRL", "ranges per command")
                    }
                    NvmLimit::DsmRangeBlocks => (
                        "a Dataset Management range",
                        NVM_CTRL,
                        "DMRSL",
                        "blocks per range",
                    ),
                    NvmLimit::DsmBlocks => (
                        "Dataset Management",
                        NVM_CTRL,
                        "DMSL",
                        "blocks in all ranges of a command",
                    ),
                    NvmLimit::CopyRangeBlocks => {
                        ("a Copy source range", NS, "MSSRL", "blocks per range")
                    }
                    NvmLimit::CopyBlocks => (
                        "a Copy",
                        NS,
                        "MCL",
                        "blocks in all source ranges of a command",
                    ),
                };
                write!(
                    f,
                    "{what} beyond the controller's limit ({structure}, {field}): at most {max} \
                     {unit}; submit it in parts"
                )
            }
            Reject::Misaligned => f.write_str(
                "the data does not start dword aligned (the buffer's IOVA, e.g. a piece of \
                 DmaBuffer::split at an odd offset, plus any slice offset), which PRP1 and MPTR \
                 require: split buffers and start slices at multiples of 4 bytes",
            ),
            Reject::SliceOutOfBounds { offset, len, size } => write!(
                f,
                "the slice of {len} bytes at offset {offset} does not lie inside its buffer of \
                 {size} bytes (a slice needs 1 or more bytes inside the buffer)"
            ),
            Reject::NotDescribable => f.write_str(
                "the memory cannot be described to this controller: PRPs need a dword-aligned \
                 start and page-aligned inner boundaries between segments, and SGLs are not \
                 supported (Identify Controller SGLS), disabled (SglMode::Never) or require \
                 dword-aligned segment addresses and lengths",
            ),
            Reject::TooManySegments { segments } => write!(
                f,
                "the vector's {segments} segments need more list descriptors than a command \
                 holds: merge segments or split the transfer"
            ),
            Reject::Unsupported { command } => write!(
                f,
                "the controller does not support {command} (Identify Controller ONCS); nothing \
                 was sent"
            ),
            Reject::CopyFormat { format } if format < 2 => write!(
                f,
                "the controller does not support Copy Descriptor Format {format}h (Identify \
                 Controller OCFS bit {format} clear), which this namespace's format needs (0h: \
                 a 16-bit guard or no protection information; 1h: a 32- or 64-bit guard); \
                 nothing was sent"
            ),
            Reject::CopyFormat { format } => write!(
                f,
                "a cross-namespace Copy to this namespace needs Copy Descriptor Format \
                 {format}h (2h: a 16-bit guard or no protection information; 3h: a 32- or \
                 64-bit guard), which the controller does not report (Identify Controller OCFS \
                 bit {format} clear) or has not enabled (Host Behavior Support CDFE bit \
                 {format} clear: the driver sets it at bring-up and after every reset where OCFS \
                 reports the format, unless the controller refuses it then; a Host Behavior \
                 Support the application set without it clears it); nothing was sent"
            ),
            Reject::FlagsNotApplicable => f.write_str(
                "FUA and Limited Retry apply to Read, Write, Compare, Write Zeroes, Verify and \
                 Copy only",
            ),
            Reject::RawCommand(why) => write!(f, "the raw command cannot be sent: it has {why}"),
            Reject::MetadataFormat(layout) => write!(
                f,
                "the namespace's LBA format ({layout}) carries protection information in fewer \
                 than {} metadata bytes, which no transfer can describe: select another LBA format \
                 with Format NVM (`upnvme format`)",
                layout.pif.tuple_size()
            ),
            Reject::MetadataBuffer { need } => write!(
                f,
                "the namespace keeps metadata in a separate buffer: pass one of at least {need} \
                 bytes (blocks × metadata size) with IoData::metadata"
            ),
            Reject::MetadataNotApplicable => f.write_str(
                "a metadata buffer came with a command that transfers no separate metadata (no \
                 metadata in the format, extended LBA where metadata travels in the data buffer, \
                 PRACT where the metadata is only the PI tuple (8 bytes, 16 with a 64-bit guard), \
                 or a command without data): leave it out",
            ),
            Reject::ProtectionNotApplicable(why) => {
                write!(f, "protection information does not apply: {why}")
            }
        }
    }
}

impl std::error::Error for Reject {}

/// A command a queue pair refused, with its memory handed back.
#[derive(Debug)]
pub struct Rejected {
    /// Why.
    pub reason: Reject,
    /// The buffer passed with the command.
    pub buffer: Option<DmaBuffer>,
    /// The vector passed with the command ([`crate::IoData::vectored`]).
    pub segments: Option<crate::IoVec>,
    /// The metadata buffer passed with the command
    /// ([`crate::IoData::metadata`]).
    pub metadata: Option<DmaBuffer>,
}

impl Rejected {
    /// A refusal handing back the command's memory.
    #[inline(always)]
    pub(crate) fn with_memory(
        reason: Reject,
        buffer: Option<DmaBuffer>,
        segments: Option<crate::IoVec>,
        metadata: Option<DmaBuffer>,
    ) -> Rejected {
        Rejected {
            reason,
            buffer,
            segments,
            metadata,
        }
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reason.fmt(f)
    }
}

impl std::error::Error for Rejected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Error {
        Error::Rejected(r.reason)
    }
}

/// A blocking call that failed, with the buffer handed back whenever the
/// device is done with it.
#[derive(Debug)]
pub struct IoFailure {
    /// What went wrong.
    pub error: Error,
    /// The buffer passed with the command, when the device is done with it
    /// (`None` only when the device may still access it, e.g. after a timeout).
    pub buffer: Option<DmaBuffer>,
}

impl std::fmt::Display for IoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for IoFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<IoFailure> for Error {
    fn from(r: IoFailure) -> Error {
        r.error
    }
}

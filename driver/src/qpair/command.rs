//! What an application submits ([`IoCommand`]) and what it gets back
//! ([`Completion`]).

use upnvme_dma::DmaBuffer;
use upnvme_queues::{DsmRange, Sqe};

use crate::error::IoError;
use crate::namespace::Namespace;

/// An NVM command set I/O command (NVM Command Set Specification 1.0, §3).
///
/// Block counts are 1-based here (the driver encodes the spec's 0-based NLB).
/// Data commands transfer `blocks × LBA size` bytes from/to the buffer passed
/// with the command, which must be at least that large. Every command names
/// its namespace by handle ([`Namespace`], from `Controller::namespace`):
/// NSID, size and LBA shift come with it, nothing is looked up.
#[derive(Clone, Copy, Debug)]
pub enum IoCommand<'a> {
    /// Read (opcode 02h): device → buffer.
    Read {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA (SLBA).
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Write (opcode 01h): buffer → device.
    Write {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Compare (opcode 05h): the device compares the buffer with the blocks;
    /// a mismatch completes with Compare Failure.
    Compare {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Flush (opcode 00h): commit volatile write cache contents.
    Flush {
        /// The namespace.
        ns: &'a Namespace,
    },
    /// Write Zeroes (opcode 08h), optionally deallocating (DEAC). Above the
    /// controller's WZSL or 65536 blocks the pair sends it as several
    /// commands within them and completes it once (split.rs).
    WriteZeroes {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
        /// Set DEAC: the blocks may be deallocated.
        deallocate: bool,
    },
    /// Dataset Management (opcode 09h) with the Attribute – Deallocate bit
    /// (trim) for up to 256 ranges.
    Deallocate {
        /// The namespace.
        ns: &'a Namespace,
        /// The ranges (each: starting LBA and 1-based block count).
        ranges: &'a [DsmRange],
    },
    /// Dataset Management (opcode 09h) with any attributes (CDW11: Integral
    /// Dataset for Read, for Write, Deallocate) and each range's Context
    /// Attributes, for up to 256 ranges of up to 2^32 - 1 blocks each.
    DatasetManagement {
        /// The namespace.
        ns: &'a Namespace,
        /// The ranges (starting LBA, 1-based 32-bit block count, context
        /// attributes).
        ranges: &'a [DsmRange],
        /// CDW11's attributes.
        attributes: DsmAttributes,
    },
    /// Verify (opcode 0Ch, ONCS bit 7): the controller reads and checks the
    /// blocks (and their protection information) without transferring data.
    /// Above VSL or 65536 blocks it goes as several commands, completed once.
    Verify {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Write Uncorrectable (opcode 04h, ONCS bit 1): marks the blocks
    /// invalid; reading them fails (Unrecovered Read Error) until they are
    /// written again. Above WUSL or 65536 blocks it goes as several
    /// commands, completed once.
    WriteUncorrectable {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Copy (opcode 19h, ONCS bit 8), Source Range Entries Format 0: copies
    /// the source ranges, in order, to consecutive blocks from `sdlba` in the
    /// same namespace (Simple Copy). The ranges go in the command's list
    /// page, no buffer is needed.
    Copy {
        /// The namespace.
        ns: &'a Namespace,
        /// Starting Destination LBA (SDLBA).
        sdlba: u64,
        /// The source ranges (1..=128 where the namespace has a 16-bit guard
        /// or no protection information, Format 0h's 32-byte entries;
        /// 1..=102 with a 32- or 64-bit guard, Format 1h's 40-byte ones: the
        /// entries fill one 4 KiB page), each 1..=65536 blocks, within the
        /// namespace's Identify Namespace MSRC, MSSRL and MCL (refused with
        /// [`crate::Reject::RangeCount`] / [`crate::Reject::SizeLimit`]
        /// beyond them).
        ranges: &'a [CopyRange],
    },
    /// Copy (opcode 19h) with Copy Descriptor Format 2h or 3h: a
    /// cross-namespace copy (NVM Command Set Specification, "Copy command";
    /// NVMe 2.1): each source range names its namespace (SNSID), which may
    /// be another namespace of this controller or `ns` itself; the ranges
    /// are copied, in order, to consecutive blocks from `sdlba` in `ns`.
    /// The driver sends Format 2h (32-byte entries) where `ns` has a 16-bit
    /// guard (or no protection information) and Format 3h (40 bytes) where
    /// it has a 32- or 64-bit guard; the controller must report that format
    /// in Identify Controller OCFS and the driver enables it at bring-up
    /// (Set Features Host Behavior Support, CDFE), else the command is
    /// refused with [`crate::Reject::CopyFormat`]. MSRC and MCL are `ns`'s,
    /// MSSRL the source namespace's. Whether two namespaces' formats can be
    /// copied between (same LBA data size; metadata and protection
    /// information as the spec's "Incompatible Namespace or Format" rules
    /// say) is the controller's to decide: it fails the command with that
    /// status otherwise.
    CrossNamespaceCopy {
        /// The destination namespace.
        ns: &'a Namespace,
        /// Starting Destination LBA (SDLBA).
        sdlba: u64,
        /// The source ranges (1..=128 with Format 2h's 32-byte entries,
        /// 1..=102 with Format 3h's 40-byte ones: the entries fill one 4 KiB
        /// page; at most `ns`'s MSRC + 1), each 1..=65536 blocks of its
        /// namespace and within that namespace's MSSRL, handles of this
        /// controller's namespaces.
        sources: &'a [CopySource<'a>],
    },
    /// Any I/O command, built by the caller (vendor commands, commands the
    /// driver has no variant for). The driver keeps the opcode, CDW2..3 and
    /// CDW10..15 of `sqe`, sets NSID from `ns`, the CID, and the data pointer
    /// for the memory passed with the command; fused commands and a
    /// non-zero MPTR are refused, since the driver could not describe them.
    /// For Read, Write, Compare, Dataset Management, Copy (formats 0h–3h)
    /// and the Reservation commands `data_len` must cover what the SQE
    /// transfers (and a separate-metadata format needs the metadata
    /// buffer), and the data pointer describes exactly that; any other
    /// opcode gets a data pointer for `data_len` bytes (0: none) and must
    /// move exactly that many — with PRPs, a command that moves two memory
    /// pages under a description of more would take the PRP List page as
    /// its second data page (NVMe 2.0 §4.3.1).
    Raw {
        /// The namespace (NSID).
        ns: &'a Namespace,
        /// The command as built by the caller.
        sqe: &'a Sqe,
        /// Bytes the command transfers through its data pointer (at least;
        /// see above).
        data_len: usize,
    },
}

/// Dataset Management CDW11 attributes (NVM Command Set Specification,
/// "Dataset Management command").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsmAttributes {
    /// IDR (bit 0), Attribute – Integral Dataset for Read.
    pub integral_read: bool,
    /// IDW (bit 1), Attribute – Integral Dataset for Write.
    pub integral_write: bool,
    /// AD (bit 2), Attribute – Deallocate.
    pub deallocate: bool,
}

impl DsmAttributes {
    /// The CDW11 value.
    pub fn cdw11(self) -> u32 {
        u32::from(self.integral_read)
            | u32::from(self.integral_write) << 1
            | u32::from(self.deallocate) << 2
    }
}

/// One Copy source range (NVM Command Set Specification, "Copy command",
/// Source Range Entries Copy Descriptor Formats 0h and 1h). The driver
/// sends Format 0h (32-byte entries) on a namespace whose LBA format has
/// the 16-bit guard protection information format (ELBAF.PIF 00b, every
/// format of a controller without Extended LBA Formats) and Format 1h
/// (40-byte entries) on one with a 32- or 64-bit guard format: a controller
/// refuses the other pairing with Invalid Format. SLBA and NLB sit at the
/// same offsets in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyRange {
    /// Starting LBA (bytes 15:08).
    pub slba: u64,
    /// Number of logical blocks, 1-based (bytes 17:16 hold it 0-based).
    pub blocks: u32,
}

impl CopyRange {
    /// Size of one Format 0h entry.
    pub const SIZE: usize = 32;
    /// Size of one Format 1h entry.
    pub const SIZE_FORMAT_1: usize = 40;

    /// The entry's 32-byte little-endian Format 0h image (tags and masks
    /// zero).
    pub fn to_le_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[8..16].copy_from_slice(&self.slba.to_le_bytes());
        let nlb = self.blocks.clamp(1, 65536) - 1;
        out[16..18].copy_from_slice(&(nlb as u16).to_le_bytes());
        out
    }

    /// The entry's 40-byte little-endian Format 1h image: SLBA (bytes
    /// 15:08) and NLB (bytes 17:16, 0-based) as in Format 0h; the expected
    /// storage and reference tag (bytes 35:26), application tag and mask
    /// (bytes 39:36) zero.
    pub fn to_le_bytes_format_1(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        out[..32].copy_from_slice(&self.to_le_bytes());
        out
    }
}

/// One source range of a cross-namespace Copy
/// ([`IoCommand::CrossNamespaceCopy`]): Copy Descriptor Formats 2h and 3h
/// (NVM Command Set Specification, "Copy command"), whose entries are those
/// of Formats 0h and 1h with the Source Namespace Identifier (SNSID, bytes
/// 03:00) filled in; Source Options and the expected tags are zero.
#[derive(Clone, Copy, Debug)]
pub struct CopySource<'a> {
    /// The namespace the blocks are read from (SNSID): a handle of the
    /// destination's controller.
    pub ns: &'a Namespace,
    /// Starting LBA in `ns` (bytes 15:08).
    pub slba: u64,
    /// Number of logical blocks, 1-based (bytes 17:16 hold it 0-based).
    pub blocks: u32,
}

impl CopySource<'_> {
    /// The entry's 32-byte little-endian Format 2h image.
    pub fn to_le_bytes_format_2(&self) -> [u8; 32] {
        let mut out = self.range().to_le_bytes();
        out[..4].copy_from_slice(&self.ns.id().to_le_bytes());
        out
    }

    /// The entry's 40-byte little-endian Format 3h image.
    pub fn to_le_bytes_format_3(&self) -> [u8; 40] {
        let mut out = self.range().to_le_bytes_format_1();
        out[..4].copy_from_slice(&self.ns.id().to_le_bytes());
        out
    }

    /// SLBA and NLB as a same-namespace range.
    pub fn range(&self) -> CopyRange {
        CopyRange {
            slba: self.slba,
            blocks: self.blocks,
        }
    }
}

/// Per-command options that CDW12 carries for Read, Write, Compare, Write
/// Zeroes, Verify and Copy (NVM Command Set Specification): set them with
/// [`crate::IoData::flags`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoFlags {
    /// FUA (CDW12 bit 30), Force Unit Access: a write reaches non-volatile
    /// media before it completes; a read comes from non-volatile media.
    pub fua: bool,
    /// LR (CDW12 bit 31), Limited Retry: the controller applies limited
    /// retry efforts before failing.
    pub limited_retry: bool,
}

impl IoFlags {
    /// No flag.
    pub const NONE: IoFlags = IoFlags {
        fua: false,
        limited_retry: false,
    };
    /// Force Unit Access only.
    pub const FUA: IoFlags = IoFlags {
        fua: true,
        limited_retry: false,
    };

    /// The CDW12 bits.
    #[inline(always)]
    pub fn cdw12(self) -> u32 {
        u32::from(self.fua) << 30 | u32::from(self.limited_retry) << 31
    }
}

/// End-to-end Data Protection for one command (NVM Command Set
/// Specification, "Protection Information Field" and "Command Dword 14/15"
/// of Read, Write, Compare, Verify and Write Zeroes), on a namespace
/// formatted with protection information (Identify Namespace DPS bits 2:0
/// non-zero): set it with [`crate::IoData::protection`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Protection {
    /// PRACT (CDW12 bit 29), Protection Information Action: on a write the
    /// controller generates each block's PI tuple (the host sends none when
    /// the metadata is exactly the 8-byte tuple); on a read it checks and,
    /// for 8-byte metadata, strips it.
    pub pract: bool,
    /// PRCHK bit 2 (CDW12 bit 28): check each block's Guard (CRC-16 or
    /// CRC-64).
    pub check_guard: bool,
    /// PRCHK bit 1 (CDW12 bit 27): check the Application Tag under
    /// `app_tag_mask`.
    pub check_app_tag: bool,
    /// PRCHK bit 0 (CDW12 bit 26): check the Reference Tag.
    pub check_ref_tag: bool,
    /// The (expected) Initial Logical Block Reference Tag, ILBRT on writes
    /// and EILBRT on reads: CDW14 (with a 64-bit guard, bits 47:32 in CDW3);
    /// the block at index i carries tag + i (Types 1 and 2). `None`: the
    /// lower 32 bits of SLBA (16-bit guard) or the lower 48 (64-bit guard),
    /// which Type 1 requires: on Type 1 any other tag is refused
    /// ([`crate::Reject::ProtectionNotApplicable`]). A tag wider than the
    /// format's is refused.
    pub ref_tag: Option<u64>,
    /// CDW15 bits 15:0: the (expected) Logical Block Application Tag.
    pub app_tag: u16,
    /// CDW15 bits 31:16: which bits of the Application Tag are checked.
    pub app_tag_mask: u16,
}

impl Protection {
    /// PRACT with every check: the controller generates PI on writes and
    /// checks (and strips, for 8-byte metadata) it on reads.
    pub const PRACT: Protection = Protection {
        pract: true,
        check_guard: true,
        check_app_tag: false,
        check_ref_tag: true,
        ref_tag: None,
        app_tag: 0,
        app_tag_mask: 0,
    };

    /// The host supplies PI in the metadata; the controller checks guard
    /// and reference tag.
    pub const CHECK: Protection = Protection {
        pract: false,
        ..Protection::PRACT
    };

    /// The PRINFO field (bits 3:0: PRACT, PRCHK guard / application tag /
    /// reference tag).
    pub fn prinfo(&self) -> u8 {
        use upnvme_queues::pi::{PRACT, PRCHK_APP_TAG, PRCHK_GUARD, PRCHK_REF_TAG};
        (if self.pract { PRACT } else { 0 })
            | (if self.check_guard { PRCHK_GUARD } else { 0 })
            | (if self.check_app_tag { PRCHK_APP_TAG } else { 0 })
            | (if self.check_ref_tag { PRCHK_REF_TAG } else { 0 })
    }

    /// Any PRCHK bit set.
    pub fn checks(&self) -> bool {
        self.check_guard || self.check_app_tag || self.check_ref_tag
    }
}

impl IoCommand<'_> {
    /// The namespace the command addresses.
    #[inline(always)]
    pub fn namespace(&self) -> &Namespace {
        match *self {
            IoCommand::Read { ns, .. }
            | IoCommand::Write { ns, .. }
            | IoCommand::Compare { ns, .. }
            | IoCommand::Flush { ns }
            | IoCommand::WriteZeroes { ns, .. }
            | IoCommand::Deallocate { ns, .. }
            | IoCommand::DatasetManagement { ns, .. }
            | IoCommand::Verify { ns, .. }
            | IoCommand::WriteUncorrectable { ns, .. }
            | IoCommand::Copy { ns, .. }
            | IoCommand::CrossNamespaceCopy { ns, .. }
            | IoCommand::Raw { ns, .. } => ns,
        }
    }

    /// The NSID of the namespace the command addresses.
    pub fn nsid(&self) -> u32 {
        self.namespace().id()
    }

    /// The spec's name of the command.
    pub fn name(&self) -> &'static str {
        match self {
            IoCommand::Read { .. } => "Read",
            IoCommand::Write { .. } => "Write",
            IoCommand::Compare { .. } => "Compare",
            IoCommand::Flush { .. } => "Flush",
            IoCommand::WriteZeroes { .. } => "Write Zeroes",
            IoCommand::Deallocate { .. } | IoCommand::DatasetManagement { .. } => {
                "Dataset Management"
            }
            IoCommand::Verify { .. } => "Verify",
            IoCommand::WriteUncorrectable { .. } => "Write Uncorrectable",
            IoCommand::Copy { .. } | IoCommand::CrossNamespaceCopy { .. } => "Copy",
            IoCommand::Raw { .. } => "I/O command (raw)",
        }
    }

    /// Whether the command moves data through a host buffer.
    pub fn transfers_data(&self) -> bool {
        match self {
            IoCommand::Read { .. } | IoCommand::Write { .. } | IoCommand::Compare { .. } => true,
            IoCommand::Raw { data_len, .. } => *data_len > 0,
            _ => false,
        }
    }
}

/// The result of one command, handed to its owner exactly once.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag from submission.
    pub tag: u64,
    /// `Ok(dw0)` (completion dword 0, command specific) or why it failed.
    pub result: Result<u32, IoError>,
    /// The command's buffer, back in the caller's hands: the device is done
    /// with it.
    pub buffer: Option<DmaBuffer>,
    /// The command's vector ([`crate::IoData::vectored`]), back likewise.
    pub segments: Option<crate::IoVec>,
    /// The command's separate metadata buffer ([`crate::IoData::metadata`]),
    /// back likewise.
    pub metadata: Option<DmaBuffer>,
}

impl Completion {
    /// True when the command succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

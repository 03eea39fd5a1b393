//! What an application submits ([`IoCommand`]) and what it gets back
//! ([`Completion`]).

use upnvme_dma::DmaBuffer;
use upnvme_queues::DsmRange;

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
    /// Write Zeroes (opcode 08h), optionally deallocating (DEAC).
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
            | IoCommand::Deallocate { ns, .. } => ns,
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
            IoCommand::Deallocate { .. } => "Dataset Management",
        }
    }

    /// Whether the command moves data through a host buffer.
    pub fn transfers_data(&self) -> bool {
        matches!(
            self,
            IoCommand::Read { .. } | IoCommand::Write { .. } | IoCommand::Compare { .. }
        )
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
}

impl Completion {
    /// True when the command succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

//! What an application submits ([`IoCommand`]) and what it gets back
//! ([`Completion`]).

use upnvme_dma::DmaBuffer;
use upnvme_queues::{DsmRange, Status};

use crate::error::Error;

/// An NVM command set I/O command (NVM Command Set Specification 1.0, §3).
///
/// Block counts are 1-based here (the driver encodes the spec's 0-based NLB).
/// Data commands transfer `blocks × LBA size` bytes from/to the buffer passed
/// with the command, which must be at least that large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoCommand<'a> {
    /// Read (opcode 02h): device → buffer.
    Read {
        /// Namespace ID.
        nsid: u32,
        /// Starting LBA (SLBA).
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Write (opcode 01h): buffer → device.
    Write {
        /// Namespace ID.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Compare (opcode 05h): the device compares the buffer with the blocks;
    /// a mismatch completes with Compare Failure.
    Compare {
        /// Namespace ID.
        nsid: u32,
        /// Starting LBA.
        slba: u64,
        /// Number of logical blocks (1-based).
        blocks: u32,
    },
    /// Flush (opcode 00h): commit volatile write cache contents.
    Flush {
        /// Namespace ID.
        nsid: u32,
    },
    /// Write Zeroes (opcode 08h), optionally deallocating (DEAC).
    WriteZeroes {
        /// Namespace ID.
        nsid: u32,
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
        /// Namespace ID.
        nsid: u32,
        /// The ranges (each: starting LBA and 1-based block count).
        ranges: &'a [DsmRange],
    },
}

impl IoCommand<'_> {
    /// The namespace the command addresses.
    pub fn nsid(&self) -> u32 {
        match *self {
            IoCommand::Read { nsid, .. }
            | IoCommand::Write { nsid, .. }
            | IoCommand::Compare { nsid, .. }
            | IoCommand::Flush { nsid }
            | IoCommand::WriteZeroes { nsid, .. }
            | IoCommand::Deallocate { nsid, .. } => nsid,
        }
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

/// Why a command did not succeed.
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
        }
    }
}

impl std::error::Error for IoError {}

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
}

impl Completion {
    /// True when the command succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// A command that was not accepted, or a blocking call that failed, with the
/// buffer handed back whenever the device is done with it.
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

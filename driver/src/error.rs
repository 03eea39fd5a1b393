//! The library's typed errors. Setup errors say what is wrong and how to fix
//! it; device errors say which command failed with which NVMe status.

use std::time::Duration;

use upnvme_dma::DmaError;
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
        error: crate::qpair::IoError,
    },

    /// A wait exceeded its bound (a register state change or a command).
    #[error("timed out after {} ms waiting for {what}", .after.as_millis())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },

    /// Register reads return all ones: the device was removed or fell off the bus.
    #[error(
        "controller {device} is gone (register reads return all ones): hot-removed, reset by someone else, or its PCI link is down"
    )]
    ControllerGone {
        /// The device name (PCI address).
        device: String,
    },

    /// CSTS.CFS is set: the controller hit a fatal error and must be reset.
    #[error("controller {device} reports Controller Fatal Status (CSTS.CFS); it must be reset")]
    ControllerFatal {
        /// The device name (PCI address).
        device: String,
    },

    /// The device violated the protocol (unknown or stale CID, duplicate
    /// completion, SQ head out of range, ...). The controller is marked failed.
    #[error("controller {device} misbehaved: {what}; the controller is marked failed")]
    DeviceFault {
        /// The device name.
        device: String,
        /// What it did.
        what: String,
    },

    /// An earlier fault or timeout left the controller failed; reset it.
    #[error("controller {device} has failed earlier ({reason}) and accepts no more commands")]
    ControllerFailed {
        /// The device name.
        device: String,
        /// The first failure.
        reason: String,
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

    /// The caller passed something invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

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

//! # upnvme: a userspace, polled NVMe PCIe driver
//!
//! VFIO maps the controller's BAR0 and hugepage DMA memory into the process;
//! the driver brings the controller up, talks to it over the admin queue, and
//! gives every core its own interrupt-less I/O queue pair.
//!
//! ```no_run
//! use upnvme::{Controller, ControllerOptions};
//! let ctrl = Controller::open("0000:00:04.0", ControllerOptions::default())?;
//! println!("{} {} ({} namespaces)", ctrl.identify().mn, ctrl.identify().sn, ctrl.namespaces().len());
//! let smart = ctrl.smart_log()?;
//! println!("temperature {} K", smart.temperature_kelvin);
//! ctrl.close()?;
//! # Ok::<(), upnvme::Error>(())
//! ```
//!
//! Crate map: [`device`] (the register + DMA abstraction and its VFIO
//! implementation), [`controller`] (bring-up, admin commands, shutdown,
//! reset, release on the kernel's request), [`format`](mod@format) (Format NVM), [`hotplug`] (controllers
//! appearing and disappearing), [`namespace`] (namespace handles), [`qpair`] (I/O queue pairs: submission, completion, recovery),
//! [`options`], [`error`], [`memory`] (application-owned memory registered
//! for DMA: [`Controller::register_memory`]).

// Transfer sizes (blocks x LBA size, up to 65536 x 2^31 bytes) and IOVA
// arithmetic are done in `usize` on the I/O path: a 32-bit target would
// wrap them, and the device would move more than the driver described.
const _: () = assert!(usize::BITS == 64, "upnvme supports 64-bit targets only");

mod admin;
pub mod controller;
pub mod device;
pub mod error;
pub mod format;
pub mod hotplug;
pub mod memory;
pub mod namespace;
pub mod namespace_list;
pub mod options;
pub mod passthrough;
pub mod qpair;

pub use controller::{BringupStep, Controller, ShadowBuffers, list_controllers};
pub use device::{Device, ReadOnlyMemory, ReleaseRequest, VfioNvme};
pub use error::{
    Error, IoError, IoFailure, NvmLimit, PiCheck, RangeCommand, Reject, Rejected, Result,
};
pub use format::{FormatNvm, FormatNvmRun, SecureErase};
pub use hotplug::{HotplugEvent, Watcher, watch};
pub use namespace::{MetadataLayout, Namespace};
pub use namespace_list::NamespaceChanges;
pub use options::ControllerOptions;
pub use options::MAX_TRANSFER_CAP;
pub use passthrough::AdminHandle;
pub use qpair::{
    BLOCKING_TAG, Backoff, Completion, CopyRange, CopySource, CqHeadPolicy, DsmAttributes,
    IoCommand, IoData, IoFlags, IoQueuePair, IoSegment, IoVec, Protection, QueuePairOptions,
    QueueStats, SegmentOutOfBounds, SglMode, SqAnnounce,
};
pub use upnvme_dma as dma;
pub use upnvme_dma::memmap2;
pub use upnvme_dma::{
    CarveError, RegisterError, RegisterFailure, RegisteredMemory, UnregisterError,
};
pub use upnvme_dma::{DmaBuffer, DmaPool, NotFromThisPool, PageBacking, PciAddress};
pub use upnvme_queues as queues;
pub use upnvme_queues::pi;
pub use upnvme_queues::sgl::SglSupport;
pub use upnvme_queues::{AsyncEvent, Cqe, DsmRange, Sqe, Status};

/// The README's Rust examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// docs/io.md's examples, compiled likewise.
#[cfg(doctest)]
#[doc = include_str!("../../docs/io.md")]
pub struct IoDocDoctests;

/// docs/memory.md's examples, compiled likewise.
#[cfg(doctest)]
#[doc = include_str!("../../docs/memory.md")]
pub struct MemoryDocDoctests;

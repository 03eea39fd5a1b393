//! # upnvme-tests: the in-memory NVMe controller model and the guest test suite
//!
//! The library half of this package is [`model`]: an NVMe controller that lives
//! in process memory and implements [`upnvme::Device`]. The driver talks to it
//! exactly as it talks to a VFIO-mapped controller — registers through
//! `read32`/`write32`, commands through submission queue entries it writes into
//! DMA memory, completions that the model writes back into the completion queue
//! memory — so host-side tests run the driver's real code paths.
//!
//! The model is also a checker. It decodes submission queue entries, PRP lists
//! and doorbell values with its own code (independent of the driver's parsers),
//! enforces the doorbell rules of the NVMe Base Specification 2.0 (SQyTDBL,
//! CQyHDBL, "Full Queue", Phase Tag) and records every violation instead of
//! panicking, and it injects the faults QEMU cannot produce: lost, late,
//! duplicated or corrupted completions, fatal status, surprise removal.
//!
//! The guest integration tests (run inside QEMU by `cargo xtask test`) live in
//! `guest/` and are built only with the `guest` feature.

pub mod model;

pub use model::{
    CqState, Fault, Match, ModelConfig, ModelController, NamespaceConfig, NvmLimitsConfig, SqState,
    Status,
};

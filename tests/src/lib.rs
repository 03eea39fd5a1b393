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

/// The controller options host tests bring a driver up on the model with:
/// 4 KiB pages (the model's DMA memory is ordinary memory), MMIO doorbells
/// (the library's default; every doorbell is a register write the model,
/// or a device wrapped around it, sees at once), and 2 s bounds on CSTS.RDY,
/// admin commands and the shutdown, so that a test meeting a hang fails
/// instead of waiting for the defaults.
pub fn host_options() -> upnvme::ControllerOptions {
    upnvme::ControllerOptions {
        page_backing: upnvme::PageBacking::Small4K,
        shadow_doorbells: false,
        ready_timeout: Some(std::time::Duration::from_secs(2)),
        admin_timeout: Some(std::time::Duration::from_secs(2)),
        shutdown_timeout: Some(std::time::Duration::from_secs(2)),
        ..Default::default()
    }
}

//! Per-controller options. No global knobs: two controllers in one process can
//! be configured differently.

use std::time::Duration;

use upnvme_dma::PageBacking;

use crate::error::{Error, Result};

/// Largest transfer per command a queue pair sends, whatever MDTS allows
/// (a larger read or write is split by the pair into commands of at most
/// this and MDTS; the PRP list pages for one are preallocated per tracker).
pub const MAX_TRANSFER_CAP: usize = 4 << 20;

/// How to open and bring up a controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin submission/completion queue entries (2..=4096, capped by CAP.MQES+1).
    pub admin_queue_entries: u32,
    /// How many I/O queue pairs to ask for with Set Features Number of Queues;
    /// the controller may grant fewer (see `Controller::granted_io_queues`).
    pub io_queues: u16,
    /// Use shadow doorbells (the Doorbell Buffer Config admin command, when
    /// Identify Controller OACS bit 8 advertises it): doorbell values go to a
    /// host memory page the controller reads, and an MMIO write is made only
    /// when the controller's EventIdx asks for one. Off by default.
    ///
    /// The buffer exists for virtual controllers, where an MMIO write is a
    /// costly VM exit. Under QEMU's emulated controller with an emulated
    /// IOMMU (this project's test bed, TCG) it costs more than it saves: the
    /// controller reads the shadow SQ tail and CQ head and writes both
    /// EventIdx values per command, each a DMA through the IOMMU, and at QD1
    /// the EventIdx still asks for an MMIO write per command. Measured in
    /// two boots (docs/benchmarks.md, "Twenty-sixth session"), MMIO
    /// doorbells alone were ahead at every depth from 1 to 128 (QD1 p50
    /// ~7 µs in every round against ~22 µs; QD2–128 3–10% more IOPS). Turn it
    /// on where an MMIO write costs a VM exit that the buffer's memory
    /// accesses do not (a KVM guest with a paravirtual controller); measure
    /// both there.
    pub shadow_doorbells: bool,
    /// Asynchronous Event Requests to keep outstanding (capped by AERL+1; 0 =
    /// none: no namespace notice can come then, and every
    /// `Controller::poll_async_events` checks every namespace handle with
    /// Identify Namespace instead).
    pub async_events: u8,
    /// Bound on each admin command; `None` derives it from CAP.TO (at least 5 s).
    /// `Some(Duration::ZERO)` is refused ([`Error::InvalidArgument`]), as
    /// for the two bounds below: no wait could end in time.
    pub admin_timeout: Option<Duration>,
    /// Bound on the controller-ready waits; `None` uses CAP.TO as the spec says, or CRTO.CRWMT when the
    /// controller reports CAP.CRMS.CRWMS and CRWMT is longer (NVMe 2.0).
    pub ready_timeout: Option<Duration>,
    /// Bound on the shutdown wait (CC.SHN until CSTS.SHST reports shutdown
    /// complete); `None` uses Identify Controller RTD3E clamped to 5–60 s,
    /// as Linux does (5 s when RTD3E is not reported).
    pub shutdown_timeout: Option<Duration>,
    /// What backs DMA memory.
    pub page_backing: PageBacking,
}

impl ControllerOptions {
    /// Refuses what no controller can be run with, before the device is
    /// touched: a bound of zero on a wait (`Some(Duration::ZERO)`). The
    /// counts are requests and are clamped instead (docs/bad-input.md).
    pub(crate) fn check(&self) -> Result<()> {
        let bounds = [
            (
                "admin_timeout",
                self.admin_timeout,
                "every admin command would time out before the controller could answer",
                "None for max(CAP.TO, 5 s)",
            ),
            (
                "ready_timeout",
                self.ready_timeout,
                "bring-up and every reset would time out before CSTS.RDY could change",
                "None for CAP.TO",
            ),
            (
                "shutdown_timeout",
                self.shutdown_timeout,
                "close would disable the controller without waiting for its shutdown, and data \
                 in its volatile write cache could be lost",
                "None for RTD3E clamped to 5-60 s",
            ),
        ];
        for (name, bound, why, default) in bounds {
            if bound == Some(Duration::ZERO) {
                return Err(Error::InvalidArgument(format!(
                    "ControllerOptions::{name} of 0: {why}; pass {default}, or a positive duration"
                )));
            }
        }
        Ok(())
    }
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: false,
            async_events: 4,
            admin_timeout: None,
            ready_timeout: None,
            shutdown_timeout: None,
            page_backing: PageBacking::Huge2M,
        }
    }
}

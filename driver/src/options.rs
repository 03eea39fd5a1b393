//! Per-controller options. No global knobs: two controllers in one process can
//! be configured differently.

use std::time::Duration;

use upnvme_dma::PageBacking;

/// Largest transfer per command a queue pair accepts, whatever MDTS allows
/// (larger I/Os are split by the caller; the PRP list pages for it are
/// preallocated per tracker).
pub const MAX_TRANSFER_CAP: usize = 4 << 20;

/// How to open and bring up a controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin submission/completion queue entries (2..=4096, capped by CAP.MQES+1).
    pub admin_queue_entries: u32,
    /// How many I/O queue pairs to ask for with Set Features Number of Queues;
    /// the controller may grant fewer (see `Controller::granted_io_queues`).
    pub io_queues: u16,
    /// Use shadow doorbells (Doorbell Buffer Config) when OACS advertises them.
    pub shadow_doorbells: bool,
    /// Asynchronous Event Requests to keep outstanding (capped by AERL+1; 0 = none).
    pub async_events: u8,
    /// Bound on each admin command; `None` derives it from CAP.TO (at least 5 s).
    pub admin_timeout: Option<Duration>,
    /// Bound on the controller-ready waits; `None` uses CAP.TO as the spec says, or CRTO.CRWMT when the
    /// controller reports CAP.CRMS.CRWMS and CRWMT is longer (NVMe 2.0).
    pub ready_timeout: Option<Duration>,
    /// Bound on the shutdown wait; `None` uses RTD3E when reported (clamped to
    /// 500 ms..=60 s), else CAP.TO.
    pub shutdown_timeout: Option<Duration>,
    /// What backs DMA memory.
    pub page_backing: PageBacking,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: true,
            async_events: 4,
            admin_timeout: None,
            ready_timeout: None,
            shutdown_timeout: None,
            page_backing: PageBacking::Huge2M,
        }
    }
}

//! What a queue pair can be told: every tunable is per pair (no global knobs).

use std::time::Duration;

use super::doorbell::CqHeadPolicy;

/// How blocking helpers wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Empty polls spent spinning (no PAUSE, no clock read per poll) before
    /// backing off.
    pub spin_polls: u32,
    /// After that: `None` yields the CPU between polls; `Some(d)` sleeps `d`
    /// (and then checks the clock, the timeout and CSTS after every sleep).
    pub sleep: Option<Duration>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin_polls: 200_000,
            sleep: None,
        }
    }
}

/// When a data command's Data Pointer is a Scatter Gather List (NVMe Base
/// Specification 2.0, §4.3.2) rather than PRPs (§4.3.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SglMode {
    /// PRP1/PRP2 for a contiguous transfer within two memory pages (no
    /// list to write or fetch); beyond that, and for vectors, an SGL when
    /// the controller supports SGLs (Identify Controller SGLS) — one Data
    /// Block descriptor instead of a PRP List, measured 5–39 % faster for
    /// 64–128 KiB transfers under QEMU (docs/benchmarks.md, "PRP or SGL"),
    /// and what spdk_nvme_perf does on such controllers — and PRPs where
    /// SGLs are not offered or cannot describe the memory. A vector of more
    /// pieces than the controller's SGL Descriptor Threshold (Identify
    /// Controller SGLS SDT, when not 0) goes as PRPs where they can
    /// describe it.
    #[default]
    Auto,
    /// An SGL for every data transfer of the application's memory (one
    /// Data Block descriptor for a contiguous buffer). The driver's own
    /// range lists (Dataset Management ranges, Copy source ranges: one list
    /// page) still go in PRP1, as the specification allows. Creating the
    /// pair fails on a controller without SGL support.
    Always,
    /// PRPs only (PRP Lists beyond two pages): what they cannot describe is
    /// refused ([`crate::Reject::NotDescribable`]).
    Never,
}

/// When the SQ tail of queued commands is announced to the controller, with
/// shadow doorbells and the EventIdx in use (`QueuePairOptions::shadow_doorbells`
/// on a controller with Doorbell Buffer Config). Without them every
/// announcement is an MMIO write, and `queue` never announces.
///
/// The default is [`SqAnnounce::DEEP`]: per batch up to 64 commands in
/// flight, each command at once from 65 on. Measured under QEMU 10.0.2
/// (docs/benchmarks.md, "SQ announcement"): per batch beat each command at
/// QD4–8 (up to 1.7x, 2026-12-02); on 2026-12-03 each command beat per batch
/// at QD64–128 by 10–16%; on 2026-12-05 per batch beat each command at
/// QD32 by 15–20% in two boots (a threshold of 32 made a full 32-deep
/// pipeline announce each resubmission alone), and in three later boots
/// the same at QD48 (+10–14%) and QD64 (+7–9%), level at QD96–128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqAnnounce {
    /// `queue` announces each command at once (shadow tail, fence, EventIdx
    /// check; an MMIO write when the EventIdx asks for one), so a controller
    /// still working through the SQ can pick it up before `ring`.
    EachCommand,
    /// `queue` only writes the SQE; `ring` (and `submit`) announce the whole
    /// batch with one shadow tail update, written over MMIO too when the
    /// EventIdx asks for it.
    Batch,
    /// Per batch while fewer than `in_flight` commands are in flight, each
    /// command at once (as [`SqAnnounce::EachCommand`]) from `in_flight` on,
    /// counting the command being queued: a controller with a deep queue is
    /// still working through the SQ and picks new entries up early, while at
    /// a shallow depth one announcement per batch serves the whole batch.
    /// `in_flight: 0` or `1` is [`SqAnnounce::EachCommand`].
    WhenDeep {
        /// Commands in flight (this one included) from which each command
        /// is announced at once.
        in_flight: u16,
    },
}

impl Default for SqAnnounce {
    fn default() -> Self {
        SqAnnounce::DEEP
    }
}

impl SqAnnounce {
    /// [`SqAnnounce::WhenDeep`] from 65 commands in flight (beyond a full
    /// 64-deep pipeline): the default.
    pub const DEEP: SqAnnounce = SqAnnounce::WhenDeep { in_flight: 65 };

    /// Announce a command at once when fewer than this many of the `usable`
    /// tracker slots are free after it took its own (0: never; `u32::MAX`:
    /// always).
    pub(crate) fn free_below(self, usable: u32) -> u32 {
        match self {
            SqAnnounce::Batch => 0,
            SqAnnounce::EachCommand => u32::MAX,
            SqAnnounce::WhenDeep { in_flight } => {
                // in flight = usable - free >= n  <=>  free < usable - n + 1.
                match usable.checked_sub(u32::from(in_flight.max(1))) {
                    Some(f) => f.saturating_add(1),
                    None => 0,
                }
            }
        }
    }
}

/// Options of one I/O queue pair. No global knobs: every pair can differ.
#[derive(Clone, Debug)]
pub struct QueuePairOptions {
    /// Submission queue entries (2..=CAP.MQES+1; others are refused with
    /// [`crate::Error::InvalidArgument`]). `None`: min(256, (CAP.MQES+1)/2).
    /// At most `entries - 1` commands (and at most 4096) are in flight, and
    /// fewer with a smaller CQ (see `cq_entries`).
    pub entries: Option<u32>,
    /// Completion queue entries (2..=CAP.MQES+1, as `entries`). `None`:
    /// twice the SQ, capped at CAP.MQES+1 — the slack is what lets the CQ
    /// head doorbell be moderated. A CQ smaller than the SQ is allowed, and
    /// then bounds the pair's depth: at most `cq_entries - 1` commands are
    /// in flight ([`crate::IoQueuePair::max_depth`] says the depth a pair
    /// got).
    pub cq_entries: Option<u32>,
    /// Let the shadow doorbell EventIdx skip MMIO writes (when the controller
    /// has Doorbell Buffer Config active, which is off by default:
    /// `ControllerOptions::shadow_doorbells`). Off: every doorbell update is
    /// also written over MMIO. Without the buffer this option changes
    /// nothing: every doorbell is an MMIO write, one per batch at `ring`.
    pub shadow_doorbells: bool,
    /// After ringing the SQ doorbell (and the bookkeeping), reap whatever is
    /// ready. Off by default; exists to be measured.
    pub reap_on_submit: bool,
    /// When the CQ head doorbell is written.
    pub cq_head_policy: CqHeadPolicy,
    /// How blocking helpers wait.
    pub backoff: Backoff,
    /// A command not completed after this long is aborted (Abort admin
    /// command); if it still has not completed after another `command_timeout`,
    /// the controller is reset. Checked by a scan every 1024 polls (no clock
    /// read per I/O): a command is stamped by the first scan after its
    /// submission, so it times out up to two scan intervals late, never
    /// early. It then completes exactly once with
    /// [`crate::IoError::TimedOut`]. `None` disables command timeouts;
    /// `Some(Duration::ZERO)` is refused ([`crate::Error::InvalidArgument`]):
    /// it would abort every command the first scan finds in flight.
    pub command_timeout: Option<Duration>,
    /// PRPs or SGLs for data transfers.
    pub sgl: SglMode,
    /// When queued commands are announced with shadow doorbells (see
    /// [`SqAnnounce`]; docs/benchmarks.md, "SQ announcement", has the
    /// measurements behind the default).
    pub sq_announce: SqAnnounce,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            entries: None,
            cq_entries: None,
            shadow_doorbells: true,
            reap_on_submit: false,
            cq_head_policy: CqHeadPolicy::default(),
            backoff: Backoff::default(),
            command_timeout: Some(Duration::from_secs(30)),
            sgl: SglMode::Auto,
            sq_announce: SqAnnounce::default(),
        }
    }
}

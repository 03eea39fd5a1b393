//! Doorbell writes and the CQ head moderation rule — the doorbell economy.
//!
//! Under emulation every MMIO doorbell write is a VM exit that takes the
//! emulator's global lock, and on real hardware it is a posted PCIe write that
//! is still not free. This module decides when a doorbell must be written and
//! writes it through the cheapest correct path:
//!
//! * **SQ tail**: once per submit batch, only if the tail moved. With shadow
//!   doorbells (Doorbell Buffer Config) the tail goes to the shadow buffer and
//!   an MMIO write happens only when the controller's EventIdx asks for it.
//!   With `SqAnnounce::Batch` `ring` announces the whole batch with one
//!   shadow update and one EventIdx check; with `SqAnnounce::EachCommand`
//!   `queue` announces each command at once (shadow store, fence, EventIdx
//!   check), so a controller still working through the SQ can pick it up
//!   before `ring`; the default, `SqAnnounce::DEEP`, is per batch up to 64
//!   commands in flight and each command from 65 on. Measured under QEMU
//!   10.0.2 (docs/benchmarks.md, "SQ announcement"): the same MMIO writes per
//!   I/O either way, but on 2026-12-02 per batch 65.6k against 38.6k IOPS at
//!   QD4 and 99.1k against 62.3k at QD8 (medians of three interleaved
//!   rounds), while on 2026-12-03 each command was ahead at QD64–128 (116.4k
//!   / 109.9k against 100.0k / 100.1k) and a threshold of 32 at 111.6k /
//!   124.8k; on 2026-12-05 per batch was ahead at QD32 (219k / 224k against
//!   180k each command and 190k with the threshold at 32), hence 33; later
//!   that day per batch was ahead at QD48–64 too (three boots: QD64 248–263k
//!   against 233–244k with the threshold at 33) and level at QD96–128,
//!   hence 65.
//! * **CQ head**: written (to the shadow buffer and/or MMIO) only when it is *due*:
//!   with `CqHeadPolicy::Adaptive` when the entries consumed since the last
//!   write (`U`) exceed `cq_entries - 1 - max_depth`, or when a configured batch
//!   is reached; with `CqHeadPolicy::EveryReap` after every reap that consumed
//!   something.
//!
//! Safety argument for the adaptive rule (NVMe 2.0 §3.3.1.2: the controller must
//! never find the CQ full while it has a completion to post, and a full CQ is
//! one whose tail + 1 equals the head the host last wrote): the controller
//! counts as occupied the `U` entries we consumed but did not announce plus the
//! completions it may still post, at most the `O` commands in flight. The queue
//! pair never lets `O` exceed `max_depth` (submission refuses beyond it), and
//! after every reap `U ≤ cq_entries - 1 - max_depth` (else the head is written
//! and `U` = 0). During a reap `U + O` is constant (each reaped entry moves from
//! `O` to `U`). So `U + O ≤ cq_entries - 1` always: the CQ never appears full.
//! Going idle is not a reason to write: at QD1 every completion leaves the
//! queue idle, and the rule above already bounds what the controller needs.
//!
//! Ordering: when both are due, the SQ tail is written first (the device can
//! start on new work while we finish), which the rule allows because it budgets
//! for the submissions already counted in `O`.

use upnvme_dma::SharedWords;
use upnvme_queues::need_mmio;

use super::stats::QueueStats;
use crate::device::Device;

/// When the CQ head doorbell is written. With shadow doorbells the same rule
/// decides when the shadow value is updated (QEMU sets the CQ EventIdx to the
/// head it last saw, so an update per reap would cost an MMIO write per reap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqHeadPolicy {
    /// Only when the controller's free-CQ budget requires it, or when `batch`
    /// entries were consumed since the last write (0 = no batch limit).
    Adaptive {
        /// Write at least every `batch` consumed entries (0: only when due).
        batch: u32,
    },
    /// After every reap that consumed at least one entry.
    EveryReap,
}

impl Default for CqHeadPolicy {
    fn default() -> Self {
        CqHeadPolicy::Adaptive { batch: 0 }
    }
}

/// Where one queue's doorbells live.
#[derive(Debug)]
pub(crate) struct Doorbells {
    /// Offset of the SQ y Tail Doorbell in BAR0.
    pub sq_db: usize,
    /// Offset of the CQ y Head Doorbell in BAR0.
    pub cq_db: usize,
    /// Offsets into the shadow doorbell / EventIdx buffers when Doorbell Buffer
    /// Config is active on the controller.
    pub shadow: Option<ShadowSlots>,
    /// This queue's offsets into the shadow buffers when the controller has
    /// them, active or not: `shadow` is this while the controller's current
    /// generation took Doorbell Buffer Config, `None` after a reset that it
    /// refused (set at every creation of the queues).
    pub slots: Option<ShadowSlots>,
    /// Skip MMIO writes the EventIdx says are unnecessary. When false (the queue
    /// pair's `shadow_doorbells` option is off) the shadow value is still kept
    /// current — a controller with Doorbell Buffer Config active reads it — but
    /// every update is also written over MMIO.
    pub use_event_idx: bool,
    /// SQ tail last written (shadow `old` value).
    pub last_sq: u16,
    /// CQ head last written (shadow `old` value).
    pub last_cq: u16,
}

/// Byte offsets of one queue's entries in the shadow and EventIdx buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShadowSlots {
    pub sq: usize,
    pub cq: usize,
}

impl Doorbells {
    /// Announces SQ tail `tail`.
    #[inline(always)]
    pub fn ring_sq<D: Device>(
        &mut self,
        dev: &D,
        shadow: Option<(&SharedWords, &SharedWords)>,
        tail: u16,
        stats: &mut QueueStats,
    ) {
        if self.shadow.is_none() {
            // MMIO only: no shadow `old` value to keep. (The counter first:
            // after the call it was merged with the shadow path's and cost
            // an offset in a register.)
            stats.sq_doorbell_mmio += 1;
            dev.write32(self.sq_db, tail as u32);
            return;
        }
        let old = self.last_sq;
        self.last_sq = tail;
        match (self.shadow, shadow) {
            (Some(slots), Some((db, ei))) => {
                if update_shadow(db, ei, slots.sq, tail, old) || !self.use_event_idx {
                    dev.write32(self.sq_db, tail as u32);
                    stats.sq_doorbell_mmio += 1;
                } else {
                    stats.mmio_skipped_by_event_idx += 1;
                }
                stats.sq_shadow_updates += 1;
            }
            _ => {
                dev.write32(self.sq_db, tail as u32);
                stats.sq_doorbell_mmio += 1;
            }
        }
    }

    /// Announces CQ head `head`.
    #[inline]
    pub fn ring_cq<D: Device>(
        &mut self,
        dev: &D,
        shadow: Option<(&SharedWords, &SharedWords)>,
        head: u16,
        stats: &mut QueueStats,
    ) {
        let old = self.last_cq;
        self.last_cq = head;
        match (self.shadow, shadow) {
            (Some(slots), Some((db, ei))) => {
                if update_shadow(db, ei, slots.cq, head, old) || !self.use_event_idx {
                    dev.write32(self.cq_db, head as u32);
                    stats.cq_doorbell_mmio += 1;
                } else {
                    stats.mmio_skipped_by_event_idx += 1;
                }
                stats.cq_shadow_updates += 1;
            }
            _ => {
                dev.write32(self.cq_db, head as u32);
                stats.cq_doorbell_mmio += 1;
            }
        }
    }
}

/// Writes `new` to the shadow doorbell at `off` and says whether the EventIdx
/// requires an MMIO write as well (NVMe 2.0 §5.8 Doorbell Buffer Config).
///
/// Ordering: the queue entries were stored before this (release store of the
/// shadow value), and the shadow value is globally visible before the EventIdx
/// is read (full fence) — otherwise the controller could read the old shadow
/// value after we read an old EventIdx, and both sides would wait.
///
/// The offsets were checked against the buffers when the queue pair was
/// created (create.rs writes both slots there), so neither access can fail.
/// Should one fail anyway, the answer is "write the MMIO doorbell" — the
/// best left, not a guarantee: with Doorbell Buffer Config active QEMU
/// takes the tail from the shadow buffer when it processes the queue, so an
/// MMIO write cannot stand in for a shadow store that did not happen.
#[inline]
fn update_shadow(db: &SharedWords, ei: &SharedWords, off: usize, new: u16, old: u16) -> bool {
    if db.store_release_u32(off, new as u32).is_err() {
        return true;
    }
    upnvme_dma::barrier::dma_mb();
    match ei.load_u32(off) {
        Ok(event_idx) => need_mmio(event_idx as u16, new, old),
        Err(_) => true,
    }
}

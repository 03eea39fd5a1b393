//! Shadow doorbell arithmetic (NVMe Base Specification 2.0, "Doorbell
//! Buffer Config command" and the Shadow Doorbell / EventIdx buffers it
//! configures; intended for emulated controllers).
//!
//! With Doorbell Buffer Config, the host writes new SQ tail / CQ head values
//! into the Shadow Doorbell buffer (host memory) and performs the MMIO
//! doorbell write only when the controller's EventIdx for that queue says it
//! is waiting for it. Both buffers mirror the doorbell register layout
//! without the 1000h base: the entry for SQ `y` tail is at byte offset
//! `(2y) * (4 << CAP.DSTRD)` and for CQ `y` head at `(2y + 1) * (4 << CAP.DSTRD)`.

use crate::regs::doorbell_stride;

/// Whether a doorbell update from `old` to `new` must also be written to the
/// MMIO doorbell, given the controller's EventIdx `event_idx`.
///
/// True exactly when `event_idx` lies in the half-open window `[old, new)`
/// of values passed by this update (all arithmetic mod 2^16), i.e. the
/// controller asked to be notified once the doorbell moves past
/// `event_idx`. This is the virtio `vring_need_event` test:
/// `(new - event_idx - 1) < (new - old)` in wrapping `u16` arithmetic. With
/// `new == old` it is always false.
///
/// Ordering (done by the driver): store the shadow doorbell, full fence, then
/// read EventIdx, so the controller cannot miss the update.
#[inline]
pub fn need_mmio(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Byte offset of SQ `qid`'s tail entry in the Shadow Doorbell and EventIdx
/// buffers: `(2 * qid) * (4 << CAP.DSTRD)`.
#[inline]
pub fn sq_tail_offset(qid: u16, dstrd: u8) -> usize {
    2 * usize::from(qid) * doorbell_stride(dstrd)
}

/// Byte offset of CQ `qid`'s head entry in the Shadow Doorbell and EventIdx
/// buffers: `(2 * qid + 1) * (4 << CAP.DSTRD)`.
#[inline]
pub fn cq_head_offset(qid: u16, dstrd: u8) -> usize {
    (2 * usize::from(qid) + 1) * doorbell_stride(dstrd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        // Controller waits for the doorbell to pass 5.
        assert!(need_mmio(5, 6, 5));
        assert!(need_mmio(5, 10, 0));
        assert!(!need_mmio(5, 5, 0)); // did not pass 5 yet
        assert!(!need_mmio(5, 9, 6)); // already passed before
        assert!(!need_mmio(5, 7, 7)); // no movement
        // Wrap: old = 65534, new = 2 passes 65535, 0 and 1.
        assert!(need_mmio(65535, 2, 65534));
        assert!(need_mmio(0, 2, 65534));
        assert!(need_mmio(1, 2, 65534));
        assert!(!need_mmio(2, 2, 65534));
        assert!(!need_mmio(65533, 2, 65534));
    }

    #[test]
    fn offsets() {
        assert_eq!(sq_tail_offset(0, 0), 0);
        assert_eq!(cq_head_offset(0, 0), 4);
        assert_eq!(sq_tail_offset(1, 0), 8);
        assert_eq!(cq_head_offset(1, 1), 24);
    }
}

//! Property tests: the shadow doorbell "need MMIO?" test against a
//! brute-force walk over the values an update passes.

mod common;

use proptest::prelude::*;
use upnvme_queues::need_mmio;

/// True if moving the doorbell from `old` to `new` (forward, mod 2^16) passes
/// `event_idx`, i.e. event_idx is one of old, old+1, ..., new-1.
fn reference(event_idx: u16, new: u16, old: u16) -> bool {
    let steps = new.wrapping_sub(old);
    (0..steps).any(|k| old.wrapping_add(k) == event_idx)
}

proptest! {
    #![proptest_config(common::config(2048))]

    #[test]
    fn matches_reference(event_idx: u16, old: u16, step in 0u16..2048) {
        let new = old.wrapping_add(step);
        prop_assert_eq!(need_mmio(event_idx, new, old), reference(event_idx, new, old));
    }

    /// Near the wrap point, where naive comparisons break.
    #[test]
    fn wrap_safe(off in 0u16..64, step in 0u16..128, ev_off in 0u16..256) {
        let old = 0u16.wrapping_sub(off);
        let new = old.wrapping_add(step);
        let event_idx = 0u16.wrapping_sub(128).wrapping_add(ev_off);
        prop_assert_eq!(need_mmio(event_idx, new, old), reference(event_idx, new, old));
    }

    /// With the event index at the previous value, every forward step notifies.
    #[test]
    fn event_at_old_always_notifies(old: u16, step in 1u16..=u16::MAX) {
        prop_assert!(need_mmio(old, old.wrapping_add(step), old));
    }
}

/// Exhaustive over a small ring of values (a scaled-down u16): every
/// combination in a window straddling the wrap.
#[test]
fn exhaustive_near_wrap() {
    let span: u16 = if cfg!(miri) { 6 } else { 40 };
    let base = 0u16.wrapping_sub(span / 2);
    for a in 0..span {
        for b in 0..span {
            for c in 0..span {
                let (ev, old) = (base.wrapping_add(a), base.wrapping_add(b));
                let new = old.wrapping_add(c);
                assert_eq!(
                    need_mmio(ev, new, old),
                    reference(ev, new, old),
                    "ev {ev} new {new} old {old}"
                );
            }
        }
    }
}

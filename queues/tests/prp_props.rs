//! Property tests: PRPs built for a transfer describe every byte of it
//! exactly once, as decoded by a controller-side walker, including page
//! offsets, page crossings and chained PRP lists.

mod common;

use proptest::prelude::*;
use std::collections::HashMap;
use upnvme_queues::prp::{
    self, PrpError, PrpLayout, PrpSegment, build_contiguous, build_list, decode, list_pages,
    list_slots, plan, prp_pages, prp_pair_4k,
};

fn page_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(4096usize), Just(8192), Just(65536)]
}

/// Checks that `segs` tile `[iova, iova + len)` in order with no gap or overlap.
fn assert_tiles(
    segs: &[PrpSegment],
    iova: u64,
    len: usize,
    ps: usize,
) -> Result<(), TestCaseError> {
    let mut at = iova;
    let mut total = 0usize;
    for (i, s) in segs.iter().enumerate() {
        prop_assert_eq!(s.iova, at, "segment {} starts at the wrong address", i);
        prop_assert!(s.len > 0);
        if i > 0 {
            prop_assert_eq!(s.iova % ps as u64, 0);
        }
        // No segment crosses a page boundary.
        prop_assert!((s.iova % ps as u64) as usize + s.len <= ps);
        at += s.len as u64;
        total += s.len;
    }
    prop_assert_eq!(total, len);
    prop_assert_eq!(segs.len(), prp_pages(iova, len, ps));
    Ok(())
}

proptest! {
    #![proptest_config(common::config(256))]

    /// Contiguous buffers: any dword-aligned offset, lengths up to ~3 list
    /// pages of entries so that chaining is exercised.
    #[test]
    fn contiguous_coverage(
        ps in page_size(),
        page in 1u64..1_000_000,
        dword in 0u64..1024,
        len in 1usize..common::scale(3 * 512 * 4096 + 10_000),
        list_base_page in 2_000_000u64..3_000_000,
    ) {
        let iova = page * ps as u64 + (dword * 4) % ps as u64;
        let list_base = list_base_page * ps as u64;
        let entries = prp_pages(iova, len, ps).saturating_sub(1);
        let mut list = vec![0u64; list_slots(entries, ps)];
        let p = build_contiguous(iova, len, ps, &mut list, |i| list_base + (i * ps) as u64).unwrap();
        prop_assert_eq!(p.prp1, iova);
        match plan(iova, len, ps).unwrap() {
            PrpLayout::One { .. } => prop_assert_eq!((p.prp2, p.list_len), (0, 0)),
            PrpLayout::Two { prp2, .. } => {
                prop_assert_eq!(p.prp2, prp2);
                prop_assert_eq!(p.list_len, 0);
            }
            PrpLayout::List { list_entries, .. } => {
                prop_assert_eq!(list_entries, entries);
                prop_assert_eq!(p.prp2, list_base);
                prop_assert_eq!(p.list_len, list_slots(entries, ps));
                prop_assert!(list_pages(entries, ps) * ps / 8 >= p.list_len);
            }
        }
        // The list buffer is laid out exactly as the contiguous list memory.
        let mem: HashMap<u64, u64> = list[..p.list_len]
            .iter()
            .enumerate()
            .map(|(j, &v)| (list_base + 8 * j as u64, v))
            .collect();
        let segs = decode(p.prp1, p.prp2, len, ps, |a| mem.get(&a).copied()).unwrap();
        assert_tiles(&segs, iova, len, ps)?;
    }

    /// Scattered data pages and a list that starts at an offset inside its
    /// page and continues in non-adjacent list pages: the decoded pages are
    /// exactly the input pages, in order.
    #[test]
    fn scattered_pages_and_offset_list(
        ps in page_size(),
        pages in prop::collection::vec(1u64..1_000_000, 1..common::scale(1500)),
        first_off in 0usize..1024,
        last_len in 1usize..4096,
        list_off_slots in 0u64..512,
    ) {
        let ps64 = ps as u64;
        let first_off = (first_off * 4) % ps;
        let data_pages: Vec<u64> = pages.iter().map(|p| p * ps64).collect();
        let prp1 = 7_000_000 * ps64 + first_off as u64;
        let len = (ps - first_off) + (data_pages.len() - 1) * ps + last_len.min(ps);
        // List page i lives at a scattered address; page 0 at an offset.
        let list_page_iova = |i: usize| -> u64 {
            let base = (9_000_000 + 3 * i as u64) * ps64;
            if i == 0 { base + (list_off_slots * 8) % ps64 } else { base }
        };
        let mut out = vec![0u64; data_pages.len() * 2 + 8];
        let n = build_list(data_pages.iter().copied(), &mut out, ps, list_page_iova).unwrap();
        // Map the flat `out` onto the list pages: each holds slots to its page end.
        let mut mem = HashMap::new();
        let (mut page, mut addr) = (0usize, list_page_iova(0));
        for &v in &out[..n] {
            mem.insert(addr, v);
            addr += 8;
            if addr % ps64 == 0 {
                page += 1;
                addr = list_page_iova(page);
            }
        }
        let prp2 = if data_pages.len() == 1 { data_pages[0] } else { list_page_iova(0) };
        let segs = decode(prp1, prp2, len, ps, |a| mem.get(&a).copied()).unwrap();
        prop_assert_eq!(segs.len(), data_pages.len() + 1);
        prop_assert_eq!(segs[0].iova, prp1);
        for (s, &p) in segs[1..].iter().zip(&data_pages) {
            prop_assert_eq!(s.iova, p);
        }
        prop_assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), len);
    }

    /// Arbitrary inputs never panic; errors are typed.
    #[test]
    fn garbage_inputs_do_not_panic(
        iova: u64,
        len in 0usize..common::scale(1 << 24),
        ps_shift in 0u32..40,
        prp2: u64,
        entry: u64,
    ) {
        let ps = 1usize << ps_shift;
        let _ = prp_pages(iova, len, ps);
        let _ = prp_pages(iova, len, ps + 1);
        let r = plan(iova, len, ps);
        if let Err(e) = r {
            let _ = e.to_string();
        }
        let mut list = vec![0u64; 16];
        let _ = build_contiguous(iova, len, ps, &mut list, |i| entry.wrapping_add(i as u64));
        let r = decode(iova, prp2, len, ps, |a| Some(a ^ entry));
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = prp::data_pages(iova, len, ps).take(4).count();
    }
}

#[test]
fn list_too_small_is_reported() {
    let mut list = vec![0u64; 3];
    let r = build_contiguous(0x1000, 10 * 4096, 4096, &mut list, |i| {
        0x100_0000 + i as u64 * 4096
    });
    assert_eq!(r, Err(PrpError::ListTooSmall { available: 3 }));
}

proptest! {
    #![proptest_config(common::config(2048))]

    /// The 4 KiB fast path agrees with `plan` wherever it answers, and
    /// answers for every valid one- or two-page transfer.
    #[test]
    fn prp_pair_4k_agrees_with_plan(
        iova in prop_oneof![0u64..0x10_0000, (u64::MAX - 0x3000)..=u64::MAX],
        len in 0usize..0x3000,
    ) {
        let fast = prp_pair_4k(iova, len);
        match plan(iova, len, 4096) {
            Ok(PrpLayout::One { prp1 }) => prop_assert_eq!(fast, Some((prp1, 0))),
            Ok(PrpLayout::Two { prp1, prp2 }) => prop_assert_eq!(fast, Some((prp1, prp2))),
            Ok(PrpLayout::List { .. }) | Err(_) => prop_assert_eq!(fast, None),
        }
    }
}

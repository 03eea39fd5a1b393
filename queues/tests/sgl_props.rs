//! Property tests: an SGL built for any list of pieces (any count up to
//! several chained list pages, any lengths and byte offsets) decodes, as a
//! controller walks it, to exactly those pieces in order; a hostile SGL
//! never makes the decoder loop or read more than the transfer needs.

mod common;

use proptest::prelude::*;
use std::collections::HashMap;
use upnvme_queues::sgl::{self, DESCRIPTOR_SIZE, Descriptor, SglSupport};

fn page_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(4096usize), Just(8192), Just(65536)]
}

proptest! {
    #![proptest_config(common::config(256))]

    #[test]
    fn built_lists_decode_to_the_pieces(
        ps in page_size(),
        raw in proptest::collection::vec((0u64..1 << 40, 1usize..100_000), 1..700),
        list_base_page in 1u64 << 30..(1u64 << 31),
        dword in any::<bool>(),
    ) {
        let support = if dword { SglSupport::DwordAligned } else { SglSupport::Unaligned };
        let pieces: Vec<(u64, usize)> = raw
            .iter()
            .map(|&(a, l)| if dword { (a & !3, (l + 3) & !3) } else { (a, l) })
            .collect();
        let len: usize = pieces.iter().map(|p| p.1).sum();
        let slots = sgl::list_slots(pieces.len(), ps);
        let mut out = vec![0u64; 2 * slots];
        let page = |i: usize| (list_base_page + i as u64) * ps as u64;
        let (sgl1, used) =
            sgl::build(pieces.iter().copied(), pieces.len(), support, &mut out, ps, page).unwrap();
        prop_assert_eq!(used, slots);
        let per_page = ps / DESCRIPTOR_SIZE;
        let mem: HashMap<u64, [u64; 2]> = (0..used)
            .map(|s| {
                let at = page(s / per_page) + ((s % per_page) * DESCRIPTOR_SIZE) as u64;
                (at, [out[2 * s], out[2 * s + 1]])
            })
            .collect();
        let got = sgl::decode(sgl1, len, |a| mem.get(&a).copied()).unwrap();
        prop_assert_eq!(got, pieces);
    }

    #[test]
    fn hostile_lists_terminate(
        table in proptest::collection::vec((any::<u64>(), any::<u64>()), 1..64),
        sgl1 in (any::<u64>(), any::<u64>()),
        len in 1usize..1 << 20,
    ) {
        // Descriptors read from a small table indexed by address: loops,
        // bad types and wrong lengths all come back as errors.
        let mut reads = 0usize;
        let r = sgl::decode(Descriptor::from_qwords([sgl1.0, sgl1.1]), len, |a| {
            reads += 1;
            let (x, y) = table[(a as usize / 16) % table.len()];
            Some([x, y])
        });
        if let Ok(pieces) = &r {
            prop_assert_eq!(pieces.iter().map(|p| p.1).sum::<usize>(), len);
        }
        // Every Data Block read moves a byte (or is one of a bounded number
        // of empty ones), every Segment read is a hop, and hops are bounded
        // by the length: the walk is linear in the transfer.
        prop_assert!(
            reads <= 2 * len + sgl::MAX_EMPTY_DATA_BLOCKS + 2,
            "{} reads for {} bytes ({:?})", reads, len, r
        );
    }
}

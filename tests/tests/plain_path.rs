//! The plain Read/Write path (driver/src/qpair/plain.rs) against the general
//! one (driver/src/qpair/submit.rs), on the model with and without SGL
//! support: for slices of a buffer at many offsets (dword aligned or not)
//! and lengths (short of, at and past the buffer's end; one to three memory
//! pages; crossing page boundaries), a Read (the plain path) and a Compare
//! (the general path, the same checks) of the same memory are refused for
//! the same reason or both complete, and a completed Read holds exactly the
//! media's bytes. Refusals hand the buffer back and leave nothing in flight.

mod common;

use common::{assert_clean, buffer_with, config_one_ns, pattern, run_io, setup};
use upnvme::{IoCommand, IoData, IoFlags, QueuePairOptions};
use upnvme_tests::ModelConfig;

/// 512-byte blocks: up to 17 blocks (8.5 KiB) per command.
const LBA: usize = 512;
/// The buffer every slice is cut from: three memory pages.
const BUF: usize = 3 * 4096;

#[test]
fn plain_and_general_paths_agree_on_every_slice() {
    for sgls in [0u32, 1] {
        let (m, c) = setup(ModelConfig {
            sgls,
            oncs: ModelConfig::ONCS_COMPARE,
            ..config_one_ns(LBA as u32, 4096)
        });
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let media = pattern(u64::from(sgls) + 1, 64 * LBA);
        run_io(
            &mut qp,
            IoCommand::Write {
                ns: &ns,
                slba: 0,
                blocks: 64,
            },
            IoData::buffer(buffer_with(&c, &media)),
        );
        let (mut completed, mut refused) = (0, 0);
        for offset in [
            0usize,
            4,
            100,
            511,
            2048,
            4092,
            4094,
            4096,
            8188,
            BUF,
            BUF + 4,
        ] {
            for limit in [usize::MAX, 0, 512, 1024, 4096, 4100, 8192, BUF] {
                for blocks in [1u32, 2, 8, 9, 16, 17] {
                    let slba = 5;
                    let read = IoCommand::Read {
                        ns: &ns,
                        slba,
                        blocks,
                    };
                    let compare = IoCommand::Compare {
                        ns: &ns,
                        slba,
                        blocks,
                    };
                    let buf = c.alloc_dma(BUF).unwrap();
                    let plain = qp.submit_io(read, IoData::slice(buf, offset, limit), 1);
                    // The Compare's memory holds the media's bytes where
                    // the slice is: it must compare equal.
                    let bytes = blocks as usize * LBA;
                    let start = slba as usize * LBA;
                    let mut image = vec![0u8; BUF];
                    if offset + bytes <= BUF {
                        image[offset..offset + bytes].copy_from_slice(&media[start..start + bytes]);
                    }
                    let buf = buffer_with(&c, &image);
                    let general = qp.submit_io(compare, IoData::slice(buf, offset, limit), 2);
                    let case = format!("sgls {sgls} offset {offset} limit {limit} blocks {blocks}");
                    match (plain, general) {
                        (Err(p), Err(g)) => {
                            assert_eq!(p.reason, g.reason, "{case}");
                            assert_eq!(p.buffer.map(|b| b.len()), Some(BUF), "{case}");
                            assert_eq!(qp.in_flight(), 0, "{case}");
                            refused += 1;
                        }
                        (Ok(()), Ok(())) => {
                            let mut back = Vec::new();
                            while back.len() < 2 {
                                qp.process_completions(u32::MAX, |_, c| back.push(c))
                                    .unwrap();
                            }
                            back.sort_by_key(|c| c.tag);
                            let r = &back[0];
                            assert!(r.result.is_ok(), "{case}: {:?}", r.result);
                            let mut got = vec![0u8; bytes];
                            let b = r.buffer.as_ref().unwrap();
                            b.read_bytes(offset, &mut got).unwrap();
                            assert!(got == media[start..start + bytes], "{case}: data");
                            assert!(
                                back[1].result.is_ok(),
                                "{case}: compare {:?}",
                                back[1].result
                            );
                            completed += 1;
                        }
                        (p, g) => panic!(
                            "{case}: the paths disagree: read {:?}, compare {:?}",
                            p.err().map(|r| r.reason),
                            g.err().map(|r| r.reason)
                        ),
                    }
                }
            }
        }
        // Both outcomes were exercised.
        assert!(completed > 50 && refused > 50, "{completed} / {refused}");
        assert_clean(&m);
        // FUA on the plain path reaches CDW12 bit 30 (the flags travel
        // with it, not only with the general path).
        let buf = c.alloc_dma(LBA).unwrap();
        let io = IoData::buffer(buf).flags(IoFlags::FUA);
        let done = run_io(
            &mut qp,
            IoCommand::Write {
                ns: &ns,
                slba: 70,
                blocks: 1,
            },
            io,
        );
        assert!(done.result.is_ok());
        let (_, raw) = *m
            .recent_commands()
            .iter()
            .rev()
            .find(|(q, _)| *q != 0)
            .unwrap();
        assert_eq!(
            u32::from_le_bytes([raw[48], raw[49], raw[50], raw[51]]),
            1 << 30
        );
    }
}

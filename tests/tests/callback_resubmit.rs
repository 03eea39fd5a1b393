//! Submitting from inside the completion callback keeps the CQ-space
//! argument true: at full depth, with no CQ slack (CQ = SQ) and with slack,
//! with and without shadow doorbells, under every CQ head policy, the model
//! never finds its CQ full (it records a violation when it does), every
//! command completes exactly once, and the data is what was written.

mod common;

use common::{assert_clean, config_one_ns, open, opts};
use upnvme::{ControllerOptions, CqHeadPolicy, IoCommand, QueuePairOptions};
use upnvme_tests::ModelController;

#[test]
fn resubmitting_callbacks_never_overrun_the_cq() {
    for shadow in [false, true] {
        for (sq, cq) in [(8u32, 8u32), (8, 12), (16, 32)] {
            for policy in [
                CqHeadPolicy::Adaptive { batch: 0 },
                CqHeadPolicy::Adaptive { batch: 3 },
                CqHeadPolicy::EveryReap,
            ] {
                let m = ModelController::new(config_one_ns(512, 1024));
                let c = open(
                    &m,
                    ControllerOptions {
                        shadow_doorbells: shadow,
                        ..opts()
                    },
                );
                let ns = c.namespace(1).unwrap().clone();
                let mut qp = c
                    .io_queue_pair(QueuePairOptions {
                        entries: Some(sq),
                        cq_entries: Some(cq),
                        cq_head_policy: policy,
                        ..Default::default()
                    })
                    .unwrap();
                let depth = qp.max_depth() as u64;
                // Writes first, each resubmitted as a read of its block from
                // the callback; each read as the next write.
                for tag in 0..depth {
                    let b = c.alloc_dma(512).unwrap();
                    b.fill(0, 512, tag as u8).unwrap();
                    qp.submit(
                        IoCommand::Write {
                            ns: &ns,
                            slba: tag,
                            blocks: 1,
                        },
                        Some(b),
                        tag,
                    )
                    .unwrap();
                }
                let total = 40 * depth;
                let (mut done, mut issued, mut bad) = (0u64, depth, 0u64);
                let mut home = 0u64;
                let start = std::time::Instant::now();
                while home < depth {
                    assert!(
                        start.elapsed() < std::time::Duration::from_secs(10),
                        "stalled"
                    );
                    qp.process_completions(u32::MAX, |qp, cpl| {
                        assert!(cpl.is_ok(), "{:?}", cpl.result);
                        done += 1;
                        let b = cpl.buffer.unwrap();
                        let (round, slot) = (cpl.tag / depth, cpl.tag % depth);
                        if round % 2 == 1
                            && b.to_vec()[..512] != [(round - 1) as u8 ^ slot as u8; 512]
                        {
                            bad += 1;
                        }
                        if issued >= total {
                            home += 1;
                            return;
                        }
                        let next = (round + 1) * depth + slot;
                        let cmd = if (round + 1) % 2 == 1 {
                            IoCommand::Read {
                                ns: &ns,
                                slba: slot,
                                blocks: 1,
                            }
                        } else {
                            b.fill(0, 512, (round + 1) as u8 ^ slot as u8).unwrap();
                            IoCommand::Write {
                                ns: &ns,
                                slba: slot,
                                blocks: 1,
                            }
                        };
                        qp.submit(cmd, Some(b), next).unwrap();
                        issued += 1;
                    })
                    .unwrap();
                }
                assert_eq!(bad, 0, "shadow {shadow} sq {sq} cq {cq} {policy:?}");
                assert_eq!(done, total, "exactly once");
                assert_eq!(qp.stats().completions, total);
                drop(qp);
                c.close().unwrap();
                assert_clean(&m);
            }
        }
    }
}

//! Split commands (driver/src/qpair/split.rs) under a misbehaving or failing
//! controller: a child held (Abort, then a reset), lost, duplicated, or cut
//! by a fatal status; blocking splits; close with children out; vectors and
//! separate metadata under timeouts; resets from another thread every
//! millisecond under a closed loop of splits. Each command ends exactly once
//! with all of its memory. (From the thirty-sixth session's review of the
//! split and recovery paths.)

mod common;

use std::time::{Duration, Instant};

use common::{T, open, opts, setup};
use upnvme::{Completion, IoCommand, IoData, IoError, IoQueuePair, QueuePairOptions};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig};

const BS: usize = 512;
const PER: u32 = 16;

fn cfg() -> ModelConfig {
    ModelConfig {
        mdts: 1,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: 4096,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

fn read(ns: &upnvme::Namespace, slba: u64, blocks: u32) -> IoCommand<'_> {
    IoCommand::Read { ns, slba, blocks }
}

fn poll_for(
    qp: &mut IoQueuePair<ModelController>,
    n: usize,
    limit: Duration,
) -> (Vec<Completion>, Option<upnvme::Error>) {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n && start.elapsed() < limit {
        if let Err(e) = qp.process_completions(u32::MAX, |_, c| out.push(c)) {
            return (out, Some(e));
        }
    }
    (out, None)
}

fn tmo(ms: u64) -> QueuePairOptions {
    QueuePairOptions {
        entries: Some(16),
        command_timeout: Some(Duration::from_millis(ms)),
        ..Default::default()
    }
}

/// One child of a split of three is held by the device: after the command
/// timeout the child gets an Abort, ends with Command Abort Requested, and
/// the split completes once as TimedOut with its buffer.
#[test]
fn split_child_timeout_aborts_and_completes_once() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(30)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].tag, 5);
    assert_eq!(got[0].result, Err(IoError::TimedOut));
    assert!(got[0].buffer.is_some());
    assert_eq!(qp.in_flight(), 0);
    eprintln!("stats {:?}", qp.stats());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// A lost child (the device never posts it): Abort ("not aborted"), then a
/// reset after the second timeout; the split ends once as TimedOut.
#[test]
fn split_child_lost_resets_and_completes_once() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(30)).unwrap();
    m.inject(Fault::DropCompletion(Match::Nth(m.commands_fetched() + 1)));
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].result, Err(IoError::TimedOut));
    assert!(got[0].buffer.is_some());
    assert_eq!(c.resets(), 1);
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    // The pair works again, with a split.
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.read_blocking(&ns, 0, 3 * PER, buf, T).unwrap();
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// CSTS.CFS when the second child is fetched: the polled path resets, and
/// the split ends once with ControllerReset, buffer back.
#[test]
fn split_fatal_mid_children_resets_and_completes_once() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::FatalOn(Match::Nth(m.commands_fetched() + 1)));
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].result, Err(IoError::ControllerReset));
    assert!(got[0].buffer.is_some());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// A duplicated child completion: DeviceFault, buffer kept; a reset then
/// ends the split once with its buffer.
#[test]
fn split_child_duplicate_fails_then_reset_ends_it_once() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::DuplicateCompletion(Match::Nth(m.commands_fetched())));
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 2),
        doorbells: None,
    });
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_millis(200));
    assert!(got.is_empty(), "{got:?}");
    assert!(
        matches!(err, Some(upnvme::Error::DeviceFault { .. })),
        "{err:?}"
    );
    c.reset().unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(2));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].result, Err(IoError::ControllerReset));
    assert!(got[0].buffer.is_some());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    let _ = m.take_violations();
}

/// A blocking split whose middle child is held: the command timeout (30 ms)
/// aborts it inside the wait, and the call returns TimedOut with the buffer.
#[test]
fn blocking_split_with_a_held_child_times_out_with_its_buffer() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(30)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    let r = qp.read_blocking(&ns, 0, 3 * PER, buf, Duration::from_secs(5));
    let f = r.unwrap_err();
    assert!(
        matches!(
            f.error,
            upnvme::Error::Io {
                error: IoError::TimedOut,
                ..
            }
        ),
        "{:?}",
        f.error
    );
    assert!(f.buffer.is_some());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// A blocking split whose child is lost: Abort, then reset inside the
/// wait; the call returns with the buffer.
#[test]
fn blocking_split_with_a_lost_child_resets_with_its_buffer() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(30)).unwrap();
    m.inject(Fault::DropCompletion(Match::Nth(m.commands_fetched() + 2)));
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    let r = qp.read_blocking(&ns, 0, 3 * PER, buf, Duration::from_secs(5));
    let f = r.unwrap_err();
    assert!(
        matches!(
            f.error,
            upnvme::Error::Io {
                error: IoError::TimedOut,
                ..
            }
        ),
        "{:?}",
        f.error
    );
    assert!(f.buffer.is_some());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// Close with a split whose children are held and another lost: every
/// command once, buffers back.
#[test]
fn close_with_split_children_held_and_lost() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(1000)).unwrap();
    let n0 = m.commands_fetched();
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(n0),
        doorbells: None,
    });
    m.inject(Fault::DropCompletion(Match::Nth(n0 + 1)));
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns, 100, 8), Some(buf), 6).unwrap();
    let out = qp.close(Duration::from_millis(30));
    let mut tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, vec![5, 6], "{out:?}");
    assert!(out.iter().all(|c| c.buffer.is_some()));
    eprintln!(
        "{:?}",
        out.iter().map(|c| (c.tag, c.result)).collect::<Vec<_>>()
    );
    drop(c);
    common::assert_clean(&m);
}

fn md_cfg() -> ModelConfig {
    ModelConfig {
        mdts: 1,
        sgls: 1,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: 4096,
            ms: 16,
            extended: false,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

fn vec_of(c: &upnvme::Controller<ModelController>, total: usize) -> (upnvme::IoVec, usize) {
    let mut v = upnvme::IoVec::new();
    let mut at = 0;
    let mut n = 0;
    for len in [3000usize, 5000, 700, 9000, 4].iter().cycle() {
        if at == total {
            break;
        }
        let len = (*len).min(total - at);
        v.push(c.alloc_dma(len).unwrap(), 0, len).unwrap();
        at += len;
        n += 1;
    }
    (v, n)
}

/// A vectored (SGL, cut inside segments) split with a separate metadata
/// buffer: one child held (Abort -> TimedOut), one lost (reset). Every
/// segment and the metadata buffer come back once.
#[test]
fn vectored_metadata_split_under_timeouts_returns_all_memory_once() {
    let (m, c) = setup(md_cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(tmo(30)).unwrap();
    let blocks = 3 * PER + 7;
    for round in 0..2 {
        let n0 = m.commands_fetched();
        if round == 0 {
            m.inject(Fault::DelayCompletion {
                on: Match::Nth(n0 + 2),
                doorbells: None,
            });
        } else {
            m.inject(Fault::DropCompletion(Match::Nth(n0 + 1)));
        }
        let (v, nseg) = vec_of(&c, blocks as usize * BS);
        let md = c.alloc_dma(blocks as usize * 16).unwrap();
        qp.submit_io(read(&ns, 0, blocks), IoData::vectored(v).metadata(md), 9)
            .unwrap();
        let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].result, Err(IoError::TimedOut), "round {round}");
        assert_eq!(got[0].segments.as_ref().map(|v| v.len()), Some(nseg));
        assert!(got[0].metadata.is_some());
        assert!(got[0].buffer.is_none());
        let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(50));
        assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    }
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// A blocking split whose second child meets CSTS.CFS (no command
/// timeout): the wait's CSTS check resets, and the call returns
/// ControllerReset with the buffer, well before its timeout.
#[test]
fn blocking_split_fatal_mid_children_returns_with_buffer() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::FatalOn(Match::Nth(m.commands_fetched() + 1)));
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    let t0 = Instant::now();
    let f = qp
        .read_blocking(&ns, 0, 3 * PER, buf, Duration::from_secs(10))
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            f.error,
            upnvme::Error::Io {
                error: IoError::ControllerReset,
                ..
            }
        ),
        "{:?}",
        f.error
    );
    assert!(f.buffer.is_some());
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(50));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

/// Stats: a poll that consumes only entries of split children whose command
/// is not complete yet delivers nothing, and counts as idle, as
/// `QueueStats::idle_polls` says; the entries count as completions.
#[test]
fn a_poll_that_consumes_only_split_children_delivers_nothing_and_counts_as_idle() {
    let (m, c) = setup(cfg());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Children 0 and 2 complete at once; child 1 is held.
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER), Some(buf), 5).unwrap();
    let before = qp.stats();
    let n = qp
        .process_completions(u32::MAX, |_, _| panic!("nothing yet"))
        .unwrap();
    assert_eq!(n, 0);
    let after = qp.stats();
    assert_eq!(after.completions - before.completions, 2, "two CQEs reaped");
    assert_eq!(after.idle_polls - before.idle_polls, 1, "{after:?}");
    m.release_delayed();
    let (done, err) = poll_for(&mut qp, 1, Duration::from_secs(1));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(done.len(), 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    drop(qp);
    drop(c);
    common::assert_clean(&m);
}

#[test]
fn concurrent_resets_with_splits_end_every_command_once() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    let m = ModelController::new(cfg());
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(32),
            ..Default::default()
        })
        .unwrap();
    let stop = AtomicBool::new(false);
    let total = 20_000u64;
    let resets = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                let _ = c.reset();
                n += 1;
            }
            n
        });
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        let depth = 8usize;
        let mut pool: Vec<_> = (0..depth)
            .map(|_| c.alloc_dma(3 * PER as usize * BS).unwrap())
            .collect();
        let mut results: HashMap<u64, Result<u32, IoError>> = HashMap::new();
        let mut next = 0u64;
        let start = Instant::now();
        while next < total || pool.len() < depth {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "stalled: next {next} back {} pool {} in flight {}",
                results.len(),
                pool.len(),
                qp.in_flight()
            );
            while next < total
                && let Some(buf) = pool.pop()
            {
                let blocks = if next.is_multiple_of(3) {
                    2 * PER + 3
                } else {
                    3 * PER
                };
                let cmd = IoCommand::Write {
                    ns: &ns,
                    slba: (next % 64) * 48,
                    blocks,
                };
                match qp.submit(cmd, Some(buf), next) {
                    Ok(()) => next += 1,
                    Err(r) => {
                        pool.push(r.buffer.expect("refused buffer back"));
                        break;
                    }
                }
            }
            if next.is_multiple_of(97) {
                let b = c.alloc_dma(3 * PER as usize * BS).unwrap();
                match qp.read_blocking(&ns, 0, 3 * PER, b, T) {
                    Ok(_) => {}
                    Err(f) => {
                        let resetish = matches!(
                            f.error,
                            upnvme::Error::Io {
                                error: IoError::ControllerReset,
                                ..
                            }
                        );
                        assert!(
                            f.buffer.is_some() || !resetish,
                            "blocking split failed without its buffer: {:?}",
                            f.error
                        );
                    }
                }
            }
            let r = qp.process_completions(u32::MAX, |_, cpl| {
                assert_ne!(
                    cpl.tag,
                    upnvme::BLOCKING_TAG,
                    "late blocking completion {:?}",
                    cpl.result
                );
                pool.push(cpl.buffer.expect("every completion returns its buffer"));
                assert!(
                    results.insert(cpl.tag, cpl.result).is_none(),
                    "twice: {}",
                    cpl.tag
                );
            });
            if let Err(e) = r {
                // A re-creation racing a reset may fail once; go on.
                eprintln!("process_completions: {e}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(results.len() as u64, total);
        h.join().unwrap()
    });
    eprintln!("{resets} resets");
    drop(qp);
    c.close().unwrap();
}

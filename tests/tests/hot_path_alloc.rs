//! "The hot path allocates nothing and takes no lock" (design invariant),
//! measured: a counting global allocator counts the heap allocations the
//! test thread makes outside the device (the model's own work inside
//! register accesses is excluded through the [`common::Spy`] device) while a
//! warmed-up queue pair runs submit / queue / ring / process_completions.

mod common;

use upnvme_dma::alloc_count::{CountingAllocator, count};

use common::{Spy, assert_clean, config_one_ns, opts};
use upnvme::{
    Controller, ControllerOptions, CqHeadPolicy, IoCommand, IoQueuePair, Namespace,
    QueuePairOptions, Reject,
};
use upnvme_tests::{Fault, Match, ModelController};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Heap allocations the driver made on this thread while running `f` (the
/// model's own work inside device calls is excluded by [`Spy`]).
fn allocations(f: impl FnOnce()) -> u64 {
    count(f).1
}

fn setup(
    shadow: bool,
    opts_qp: QueuePairOptions,
) -> (ModelController, Controller<Spy>, IoQueuePair<Spy>) {
    let m = ModelController::new(config_one_ns(512, 1024));
    let c = Controller::with_device(
        Spy::new(m.clone()),
        ControllerOptions {
            shadow_doorbells: shadow,
            ..opts()
        },
    )
    .unwrap();
    let qp = c.io_queue_pair(opts_qp).unwrap();
    (m, c, qp)
}

fn read(ns: &Namespace, i: u64) -> IoCommand<'_> {
    IoCommand::Read {
        ns,
        slba: i % 1024,
        blocks: 1,
    }
}

#[test]
fn counting_allocator_sees_driver_allocations() {
    // The meter works: a driver call that does allocate (the descriptive
    // error of a refusal builds a message) is counted.
    let (m, c, mut qp) = setup(false, QueuePairOptions::default());
    let ns = c.namespace(1).unwrap().clone();
    // The refusal itself is the hot path's error: it allocates nothing.
    let (r, n) = count(|| qp.submit(read(&ns, 0), None, 0));
    let f = r.expect_err("a Read without a buffer is refused");
    assert_eq!(f.reason, Reject::NoBuffer);
    assert!(f.buffer.is_none());
    assert_eq!(n, 0, "a refused submit allocates nothing");
    // Its description stays typed; the text, built when shown, allocates.
    let (e, n) = count(|| qp.describe(f.reason));
    assert!(
        matches!(&e, upnvme::Error::Rejected(Reject::NoBuffer)),
        "{e:?}"
    );
    assert_eq!(n, 0, "a typed error allocates nothing");
    let (text, n) = count(|| e.to_string());
    assert!(
        text.starts_with("invalid argument:") && text.contains("buffer"),
        "{text}"
    );
    assert!(n > 0, "an error message allocates");
    drop(e);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn submit_and_reap_allocate_nothing() {
    for shadow in [false, true] {
        for policy in [CqHeadPolicy::Adaptive { batch: 0 }, CqHeadPolicy::EveryReap] {
            let (m, c, mut qp) = setup(
                shadow,
                QueuePairOptions {
                    entries: Some(16),
                    cq_head_policy: policy,
                    ..Default::default()
                },
            );
            let ns = c.namespace(1).unwrap().clone();
            let mut bufs: Vec<Option<upnvme::DmaBuffer>> =
                (0..8).map(|_| Some(c.alloc_dma(512).unwrap())).collect();
            let mut run = |qp: &mut IoQueuePair<Spy>, rounds: u64| {
                for r in 0..rounds {
                    for (i, b) in bufs.iter_mut().enumerate() {
                        qp.queue(read(&ns, r * 8 + i as u64), b.take(), i as u64)
                            .unwrap();
                    }
                    qp.ring();
                    let mut done = 0;
                    while done < 8 {
                        done += qp
                            .process_completions(3, |_, cpl| {
                                bufs[cpl.tag as usize] = cpl.buffer;
                            })
                            .unwrap();
                    }
                    // QD1 through submit as well.
                    qp.submit(read(&ns, r), bufs[0].take(), 0).unwrap();
                    while qp
                        .process_completions(1, |_, cpl| bufs[0] = cpl.buffer)
                        .unwrap()
                        == 0
                    {}
                }
            };
            run(&mut qp, 4); // warm-up
            let n = allocations(|| run(&mut qp, 50));
            assert_eq!(
                n, 0,
                "shadow {shadow} {policy:?}: allocations on the hot path"
            );
            drop(qp);
            drop(c);
            assert_clean(&m);
        }
    }
}

/// The command timeout scan runs every 1024 polls while commands are in
/// flight (the default 30 s timeout): it must not allocate either.
#[test]
fn the_periodic_timeout_scan_allocates_nothing() {
    let (m, c, mut qp) = setup(
        false,
        QueuePairOptions {
            entries: Some(16),
            ..Default::default()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    // Four reads the model holds back: they stay in flight while the pair
    // polls an empty CQ, so the scans find (and stamp) them.
    for i in 0..4u64 {
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(qp.qid()),
            doorbells: None,
        });
        qp.submit(read(&ns, i), Some(c.alloc_dma(512).unwrap()), i)
            .unwrap();
    }
    assert_eq!(qp.in_flight(), 4);
    // 2100 empty polls: two scans in the window.
    let n = allocations(|| {
        for _ in 0..2100 {
            assert_eq!(qp.process_completions(8, |_, _| {}).unwrap(), 0);
        }
    });
    assert_eq!(n, 0, "allocations in the timeout scan");
    m.release_delayed();
    let mut done = 0;
    while done < 4 {
        done += qp.process_completions(8, |_, _| {}).unwrap();
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn reap_on_submit_allocates_nothing_even_without_processing() {
    let (m, c, mut qp) = setup(
        false,
        QueuePairOptions {
            entries: Some(4),
            reap_on_submit: true,
            ..Default::default()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    assert_eq!(qp.max_depth(), 3);
    // Warm up (one-time lazy initialisation, e.g. clock calibration).
    let b = c.alloc_dma(512).unwrap();
    qp.submit(read(&ns, 0), Some(b), 0).unwrap();
    qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    let bufs: Vec<upnvme::DmaBuffer> = (0..64).map(|_| c.alloc_dma(512).unwrap()).collect();
    // The caller keeps submitting without calling process_completions: each
    // submit reaps earlier completions into the pair's ready list, freeing
    // their tracker slots. Either QueueFull must stop the caller at
    // max_depth undelivered commands, or nothing may allocate.
    let mut accepted = 0u64;
    let mut left = bufs.into_iter();
    let mut refused = None;
    let n = allocations(|| {
        for (i, b) in left.by_ref().enumerate() {
            match qp.submit(read(&ns, i as u64), Some(b), 1 + i as u64) {
                Ok(()) => accepted += 1,
                Err(f) => {
                    assert_eq!(f.reason, Reject::QueueFull);
                    // Dropping DMA memory is the allocator's business, not
                    // the hot path's: keep it for later.
                    refused = Some(f);
                    break;
                }
            }
        }
    });
    drop((left, refused));
    assert!(
        n == 0 && accepted <= 3,
        "{accepted} commands accepted with max_depth 3, {n} allocations"
    );
    let mut got = 0;
    qp.process_completions(u32::MAX, |_, _| got += 1).unwrap();
    assert_eq!(got, accepted);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// `DmaPool`: get and put allocate nothing, exhaustion is `None`, a buffer
/// from elsewhere is refused and handed back, and pool buffers carry I/O
/// through a queue pair (submitting from the completion callback) and come
/// back to the pool with their data (no zeroing on reuse).
#[test]
fn dma_pool_get_put_allocate_nothing_and_carry_io() {
    let (m, c, mut qp) = setup(false, QueuePairOptions::default());
    let ns = c.namespace(1).unwrap().clone();
    let mut pool = c.dma_pool(512, 4).unwrap();
    assert_eq!(
        (pool.capacity(), pool.available(), pool.buffer_len()),
        (4, 4, 512)
    );
    let mut held: Vec<upnvme::DmaBuffer> = Vec::with_capacity(8);
    let n = allocations(|| {
        for _ in 0..100 {
            while let Some(b) = pool.get() {
                held.push(b);
            }
            assert!(pool.get().is_none(), "exhausted");
            while let Some(b) = held.pop() {
                pool.put(b).unwrap();
            }
        }
    });
    assert_eq!(n, 0, "get and put allocate nothing");
    assert_eq!(pool.available(), 4);
    // A buffer that is not the pool's is refused, and handed back.
    let other = c.alloc_dma(512).unwrap();
    let iova = other.iova();
    let back = pool.put(other).unwrap_err();
    assert_eq!(back.0.iova(), iova);
    // Writes from pool buffers, resubmitted from the callback as reads of
    // the same blocks: the data comes back, and stays in the buffer.
    for i in 0..4u64 {
        let b = pool.get().unwrap();
        b.fill(0, 512, 0x40 + i as u8).unwrap();
        qp.submit(
            IoCommand::Write {
                ns: &ns,
                slba: 100 + i,
                blocks: 1,
            },
            Some(b),
            i,
        )
        .unwrap();
    }
    let (mut reads_done, mut writes_done) = (0, 0);
    let start = std::time::Instant::now();
    while reads_done < 4 {
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        qp.process_completions(u32::MAX, |qp, cpl| {
            assert!(cpl.is_ok(), "{:?}", cpl.result);
            let b = cpl.buffer.unwrap();
            if writes_done < 4 && cpl.tag < 100 {
                writes_done += 1;
                b.fill(0, 512, 0).unwrap();
                qp.submit(read(&ns, 100 + cpl.tag), Some(b), 100 + cpl.tag)
                    .unwrap();
            } else {
                assert_eq!(b.to_vec(), vec![0x40 + (cpl.tag - 100) as u8; 512]);
                reads_done += 1;
                pool.put(b).unwrap();
            }
        })
        .unwrap();
    }
    assert_eq!(pool.available(), 4);
    let mut seen = Vec::new();
    while let Some(b) = pool.get() {
        seen.push(b.to_vec()[0]);
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![0x40, 0x41, 0x42, 0x43], "reuse does not zero");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

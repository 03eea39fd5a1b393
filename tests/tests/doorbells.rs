//! Doorbell economy (issue 8) measured on the model's MMIO doorbell counters:
//! with shadow doorbells off, the adaptive CQ-head policy at QD1 writes the CQ
//! head about once per `cq_slack + 1` I/Os (not once per I/O); a batch limit
//! bounds that; `EveryReap` writes once per reap batch that consumed entries;
//! one SQ tail write per batch of queued commands; a due SQ tail is written
//! before a due CQ head; shadow-doorbell mode moderates the CQ head the same
//! way and writes MMIO only when the EventIdx asks; and the queue pair's
//! `QueueStats` agree with what the device counted.

mod common;

use common::{Access, Spy, T, assert_clean, config_one_ns, opts, reg};
use upnvme::{
    Completion, Controller, ControllerOptions, CqHeadPolicy, Device, IoCommand, IoQueuePair,
    QueuePairOptions, QueueStats, SqAnnounce,
};
use upnvme_tests::ModelController;

const BS: usize = 512;

fn controller(shadow: bool) -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(config_one_ns(BS as u32, 1024));
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            shadow_doorbells: shadow,
            ..opts()
        },
    )
    .unwrap();
    (m, c)
}

fn pair<D: Device>(c: &Controller<D>, sq: u32, cq: u32, policy: CqHeadPolicy) -> IoQueuePair<D> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(sq),
        cq_entries: Some(cq),
        shadow_doorbells: false,
        cq_head_policy: policy,
        ..Default::default()
    })
    .unwrap()
}

/// `n` reads at queue depth 1 through submit + process_completions.
fn qd1<D: Device>(qp: &mut IoQueuePair<D>, c: &Controller<D>, n: u64) {
    let ns = c.namespace(1).unwrap().clone();
    let mut buf = Some(c.alloc_dma(BS).unwrap());
    for i in 0..n {
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: i % 1024,
                blocks: 1,
            },
            buf.take(),
            i,
        )
        .unwrap();
        let mut got = 0;
        while got == 0 {
            got = qp
                .process_completions(1, |_, cpl| {
                    assert_eq!(cpl.tag, i);
                    buf = cpl.buffer;
                })
                .unwrap();
        }
    }
}

fn assert_stats_match(m: &ModelController, qid: u16, st: &QueueStats) {
    let (sq, cq) = m.doorbell_writes(qid);
    assert_eq!(st.sq_doorbell_mmio, sq, "SQ MMIO: driver vs device");
    assert_eq!(st.cq_doorbell_mmio, cq, "CQ MMIO: driver vs device");
}

#[test]
fn adaptive_qd1_writes_cq_head_once_per_slack() {
    let (m, c) = controller(false);
    // SQ 16, CQ 32: max_depth 15, cq_slack = 32 - 1 - 15 = 16.
    let mut qp = pair(&c, 16, 32, CqHeadPolicy::Adaptive { batch: 0 });
    assert_eq!(qp.max_depth(), 15);
    let n = 340u64;
    qd1(&mut qp, &c, n);
    let (sq, cq) = m.doorbell_writes(qp.qid());
    assert_eq!(sq, n, "one SQ tail write per I/O at QD1");
    assert_eq!(cq, n / 17, "one CQ head write per cq_slack + 1 completions");
    assert!(cq * 10 < n, "far fewer CQ writes than I/Os");
    let st = qp.stats();
    assert_stats_match(&m, qp.qid(), &st);
    assert_eq!(st.submissions, n);
    assert_eq!(st.completions, n);
    assert_eq!(st.cq_doorbell_skipped, n - cq);
    assert_eq!(
        st.idle_polls, 0,
        "the model completes inside the doorbell write"
    );
    assert_eq!(st.polls, n);
    assert!(st.mmio_per_io() < 1.1, "{}", st.mmio_per_io());
    assert_eq!(st.sq_shadow_updates + st.cq_shadow_updates, 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn adaptive_default_sizes_qd1() {
    let (m, c) = controller(false);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            shadow_doorbells: false,
            ..Default::default()
        })
        .unwrap();
    // Default: SQ 256, CQ 512 → max_depth 255, slack 256.
    assert_eq!((qp.sq_entries(), qp.cq_entries()), (256, 512));
    let n = 1000;
    qd1(&mut qp, &c, n);
    let (_, cq) = m.doorbell_writes(qp.qid());
    assert_eq!(cq, n / 257);
    assert_stats_match(&m, qp.qid(), &qp.stats());
    // The blocking helpers follow the same rule.
    qp.reset_stats();
    let mut buf = c.alloc_dma(BS).unwrap();
    for i in 0..300 {
        buf = qp.read_blocking(&ns, i, 1, buf, T).unwrap();
    }
    let st = qp.stats();
    assert!(st.cq_doorbell_mmio <= 2, "{st:?}");
    assert_eq!(st.sq_doorbell_mmio, 300);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn adaptive_batch_limit() {
    let (m, c) = controller(false);
    let mut qp = pair(&c, 16, 64, CqHeadPolicy::Adaptive { batch: 4 });
    let n = 200;
    qd1(&mut qp, &c, n);
    let (_, cq) = m.doorbell_writes(qp.qid());
    assert_eq!(cq, n / 4, "a CQ head write every 4 consumed entries");
    assert_stats_match(&m, qp.qid(), &qp.stats());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn every_reap_writes_once_per_reap_batch() {
    let (m, c) = controller(false);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, 16, 32, CqHeadPolicy::EveryReap);
    let n = 100;
    qd1(&mut qp, &c, n);
    assert_eq!(
        m.doorbell_writes(qp.qid()),
        (n, n),
        "QD1: one batch per I/O"
    );
    // Batches of 8: queue 8, ring once, reap all in one call.
    let qid = qp.qid();
    let (sq0, cq0) = m.doorbell_writes(qid);
    for round in 0..10u64 {
        for i in 0..8 {
            let buf = c.alloc_dma(BS).unwrap();
            qp.queue(
                IoCommand::Read {
                    ns: &ns,
                    slba: i,
                    blocks: 1,
                },
                Some(buf),
                round * 8 + i,
            )
            .unwrap();
        }
        qp.ring();
        let n = qp.process_completions(u32::MAX, |_, _| {}).unwrap();
        assert_eq!(n, 8);
        // An empty poll writes nothing.
        assert_eq!(qp.process_completions(u32::MAX, |_, _| {}).unwrap(), 0);
    }
    assert_eq!(m.doorbell_writes(qid), (sq0 + 10, cq0 + 10));
    // Reaping a batch in pieces: one CQ write per call that consumed entries.
    for i in 0..8 {
        let buf = c.alloc_dma(BS).unwrap();
        qp.queue(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(buf),
            1000 + i,
        )
        .unwrap();
    }
    qp.ring();
    for _ in 0..4 {
        assert_eq!(qp.process_completions(2, |_, _| {}).unwrap(), 2);
    }
    assert_eq!(m.doorbell_writes(qid), (sq0 + 11, cq0 + 14));
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    assert_eq!(st.cq_doorbell_skipped, 0);
    assert!(st.idle_polls >= 10);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// `EveryReap` writes the CQ head after every reap that consumed entries;
/// when a resubmission from the callback already wrote it (no CQ slack: the
/// CQ head goes out before each submission), the reap's own write is
/// unnecessary and is not counted as skipped by moderation.
#[test]
fn every_reap_with_no_slack_resubmitting_from_the_callback() {
    let (m, c) = controller(false);
    let ns = c.namespace(1).unwrap().clone();
    // 16 SQ and 16 CQ entries: 15 in flight at most, CQ slack 0.
    let mut qp = pair(&c, 16, 16, CqHeadPolicy::EveryReap);
    let qid = qp.qid();
    let read = |slba| IoCommand::Read {
        ns: &ns,
        slba,
        blocks: 1,
    };
    qp.submit(read(0), Some(c.alloc_dma(BS).unwrap()), 0)
        .unwrap();
    let n = 50u64;
    let mut next = 1u64;
    while next <= n {
        let got = qp
            .process_completions(1, |qp, cpl| {
                assert_eq!(cpl.tag, next - 1);
                assert!(cpl.result.is_ok());
                if next < n {
                    qp.submit(read(next % 1024), cpl.buffer, next).unwrap();
                }
                next += 1;
            })
            .unwrap();
        assert!(got <= 1);
    }
    assert_eq!(qp.in_flight(), 0);
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    assert_eq!(st.cq_doorbell_skipped, 0, "{st:?}");
    // Each resubmission wrote the CQ head first (49), the last reap (no
    // resubmission) once more.
    let (_, cq) = m.doorbell_writes(qid);
    assert_eq!(cq, n);
    assert_clean(&m);
}

#[test]
fn queue_depth_32_writes_few_doorbells_per_io() {
    let (m, c) = controller(false);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            shadow_doorbells: false,
            ..Default::default()
        })
        .unwrap();
    let mut bufs: Vec<_> = (0..32).map(|_| Some(c.alloc_dma(BS).unwrap())).collect();
    let mut free: Vec<usize> = (0..32).collect();
    let mut done = 0u64;
    let mut next = 0u64;
    let n = 3200u64;
    while done < n {
        while next < n && !free.is_empty() {
            let slot = free.pop().unwrap();
            qp.queue(
                IoCommand::Read {
                    ns: &ns,
                    slba: next % 1024,
                    blocks: 1,
                },
                bufs[slot].take(),
                slot as u64,
            )
            .unwrap();
            next += 1;
        }
        qp.ring();
        done += u64::from(
            qp.process_completions(u32::MAX, |_, cpl| {
                bufs[cpl.tag as usize] = cpl.buffer;
                free.push(cpl.tag as usize);
            })
            .unwrap(),
        );
    }
    let st = qp.stats();
    assert_stats_match(&m, qp.qid(), &st);
    assert!(
        st.mmio_per_io() <= 0.1,
        "{} MMIO writes per I/O at QD32 ({st:?})",
        st.mmio_per_io()
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn due_sq_tail_is_written_before_due_cq_head() {
    let m = ModelController::new(config_one_ns(BS as u32, 1024));
    let spy = Spy::new(m.clone());
    let c = Controller::with_device(
        spy.clone(),
        ControllerOptions {
            shadow_doorbells: false,
            ..opts()
        },
    )
    .unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, 8, 8, CqHeadPolicy::EveryReap);
    let qid = qp.qid() as usize;
    let (sq_db, cq_db) = (reg::DOORBELLS + 8 * qid, reg::DOORBELLS + 8 * qid + 4);
    // Commands completed but not reaped, and new commands queued: the next
    // process_completions has both an SQ tail and a CQ head to write.
    for i in 0..3u64 {
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(c.alloc_dma(BS).unwrap()),
            i,
        )
        .unwrap();
    }
    for i in 3..5u64 {
        qp.queue(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(c.alloc_dma(BS).unwrap()),
            i,
        )
        .unwrap();
    }
    spy.clear();
    let n = qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    assert!(n >= 3);
    let writes: Vec<usize> = spy
        .log()
        .iter()
        .filter_map(|a| match a {
            Access::W32(o, _) if *o == sq_db || *o == cq_db => Some(*o),
            _ => None,
        })
        .collect();
    assert_eq!(writes, vec![sq_db, cq_db], "SQ tail first, then CQ head");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn shadow_doorbells_keep_the_buffer_current() {
    let (m, c) = controller(true);
    assert!(c.shadow_doorbells());
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            cq_entries: Some(32),
            shadow_doorbells: true,
            ..Default::default()
        })
        .unwrap();
    assert!(qp.shadow_doorbells());
    let qid = qp.qid();
    let n = 100;
    qd1(&mut qp, &c, n);
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    // Every tail update goes to the shadow buffer; CQ head updates follow
    // the moderation rule (slack 16: one per 17 completions) there too ...
    assert_eq!(st.sq_shadow_updates, n);
    assert_eq!(st.cq_shadow_updates, n / 17);
    // ... and MMIO writes happen only when the EventIdx asks for them.
    assert_eq!(
        st.sq_doorbell_mmio + st.cq_doorbell_mmio + st.mmio_skipped_by_event_idx,
        st.sq_shadow_updates + st.cq_shadow_updates
    );
    // The controller's view (read from the shadow buffer) is current.
    let sq = m.sq_state(qid).unwrap();
    let cq = m.cq_state(qid).unwrap();
    assert_eq!(sq.tail, (n % 16) as u32);
    assert_eq!(sq.head, sq.tail);
    m.process_shadow();
    assert_eq!(m.cq_state(qid).unwrap().head, ((n / 17 * 17) % 32) as u32);
    assert_eq!(cq.backlog, 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn shadow_buffer_with_event_index_off_still_writes_mmio() {
    let (m, c) = controller(true);
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            cq_entries: Some(32),
            shadow_doorbells: false,
            cq_head_policy: CqHeadPolicy::Adaptive { batch: 0 },
            ..Default::default()
        })
        .unwrap();
    let n = 170;
    qd1(&mut qp, &c, n);
    let st = qp.stats();
    assert_stats_match(&m, qp.qid(), &st);
    assert_eq!(st.mmio_skipped_by_event_idx, 0);
    assert_eq!(st.sq_doorbell_mmio, n);
    // The adaptive policy still moderates the CQ head.
    assert_eq!(st.cq_doorbell_mmio, n / 17);
    // Shadow values are kept current for the controller.
    assert_eq!(st.sq_shadow_updates, st.sq_doorbell_mmio);
    assert_eq!(st.cq_shadow_updates, st.cq_doorbell_mmio);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn admin_queue_never_uses_shadow_doorbells() {
    let (m, c) = controller(true);
    let (sq0, cq0) = m.doorbell_writes(0);
    for _ in 0..10 {
        c.get_features(0x07, 0, 0).unwrap();
    }
    assert_eq!(m.doorbell_writes(0), (sq0 + 10, cq0 + 10));
    drop(c);
    assert_clean(&m);
}

#[test]
fn no_doorbell_without_work() {
    let (m, c) = controller(false);
    let mut qp = pair(&c, 8, 16, CqHeadPolicy::Adaptive { batch: 0 });
    let before = m.doorbell_writes(qp.qid());
    for _ in 0..100 {
        assert_eq!(qp.process_completions(8, |_, _| {}).unwrap(), 0);
        qp.ring();
    }
    assert_eq!(m.doorbell_writes(qp.qid()), before);
    let st = qp.stats();
    assert_eq!((st.polls, st.idle_polls), (100, 100));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// `polls` counts every poll across the periodic work's countdown (1024
/// polls) and across `reset_stats` in the middle of a period.
#[test]
fn polls_are_counted_across_periods_and_resets() {
    let (m, c) = controller(false);
    let mut qp = pair(&c, 8, 16, CqHeadPolicy::Adaptive { batch: 0 });
    for _ in 0..1500 {
        qp.process_completions(8, |_, _| {}).unwrap();
    }
    assert_eq!(qp.stats().polls, 1500);
    qp.reset_stats();
    assert_eq!(qp.stats().polls, 0);
    for _ in 0..2100 {
        qp.process_completions(8, |_, _| {}).unwrap();
    }
    let st = qp.stats();
    assert_eq!((st.polls, st.idle_polls), (2100, 2100));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A 16/32-entry pair whose EventIdx may skip MMIO writes, announcing each
/// queued command at once (`SqAnnounce::EachCommand`).
fn event_idx_pair<D: Device>(c: &Controller<D>) -> IoQueuePair<D> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(16),
        cq_entries: Some(32),
        shadow_doorbells: true,
        sq_announce: SqAnnounce::EachCommand,
        ..Default::default()
    })
    .unwrap()
}

/// The default announcement (`SqAnnounce::DEEP`; a 16-entry pair is never
/// 32 deep, so per batch, as `SqAnnounce::Batch`) with the EventIdx in use:
/// `queue` only writes SQEs, `ring` announces the batch with one shadow tail
/// update, written over MMIO when the EventIdx asks (the first batch), and
/// skipped when the controller has not caught up with the tail it last saw
/// (its EventIdx lags: a polling controller picks the batch up from the
/// shadow buffer).
#[test]
fn the_default_announces_each_batch_once() {
    assert_eq!(QueuePairOptions::default().sq_announce, SqAnnounce::DEEP);
    assert_eq!(SqAnnounce::DEEP, SqAnnounce::WhenDeep { in_flight: 65 });
    let (m, c) = controller(true);
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            cq_entries: Some(32),
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    m.freeze_event_idx(true);
    for i in 0..5u64 {
        queue_read(&mut qp, &c, i);
    }
    let st = qp.stats();
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (0, 0));
    assert_eq!(m.doorbell_writes(qid).0, 0);
    assert_eq!(
        m.sq_state(qid).unwrap().tail,
        0,
        "nothing announced before ring"
    );
    qp.ring();
    let st = qp.stats();
    // EventIdx 0, tail 0 -> 5: passes it, one MMIO write.
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (1, 1));
    assert_eq!(m.sq_state(qid).unwrap().tail, 5);
    for i in 5..8u64 {
        queue_read(&mut qp, &c, i);
    }
    qp.ring();
    let st = qp.stats();
    // Tail 5 -> 8 with the EventIdx still at 0: the controller asked for
    // nothing; the shadow buffer has the tail.
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (2, 1));
    assert_eq!(st.mmio_skipped_by_event_idx, 1);
    assert_eq!(m.sq_state(qid).unwrap().tail, 5);
    m.process_shadow();
    assert_eq!(m.sq_state(qid).unwrap().tail, 8);
    m.freeze_event_idx(false);
    assert_eq!(ok_tags(&reap_n(&mut qp, 8)), (0..8).collect::<Vec<_>>());
    assert_stats_match(&m, qid, &qp.stats());
    assert_eq!(qp.stats().submissions, 8);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Queues (without `ring`) a one-block read of LBA `i` with tag `i`.
fn queue_read<D: Device>(qp: &mut IoQueuePair<D>, c: &Controller<D>, i: u64) {
    let ns = c.namespace(1).unwrap().clone();
    let b = c.alloc_dma(BS).unwrap();
    qp.queue(
        IoCommand::Read {
            ns: &ns,
            slba: i,
            blocks: 1,
        },
        Some(b),
        i,
    )
    .unwrap();
}

/// Reaps until `n` completions arrived (or `T` passed); sorted by tag.
fn reap_n<D: Device>(qp: &mut IoQueuePair<D>, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < n && start.elapsed() < T {
        qp.process_completions(u32::MAX, |_, cpl| got.push(cpl))
            .unwrap();
    }
    got.sort_by_key(|c| c.tag);
    got
}

/// The tags of `got`, each of which must have succeeded.
fn ok_tags(got: &[Completion]) -> Vec<u64> {
    got.iter()
        .map(|cpl| {
            assert!(cpl.is_ok(), "{:?}", cpl.result);
            cpl.tag
        })
        .collect()
}

/// With the EventIdx in use, `queue` announces each command at once (shadow
/// update, EventIdx check, MMIO only when the controller asks): the
/// controller has all three before `ring`, which has nothing left to write.
/// The model processes synchronously and moves its EventIdx to every tail it
/// saw, so each command asks for an MMIO write, exactly as the protocol says.
#[test]
fn queue_announces_at_once_with_the_event_index() {
    let (m, c) = controller(true);
    let mut qp = event_idx_pair(&c);
    let qid = qp.qid();
    for i in 0..3u64 {
        queue_read(&mut qp, &c, i);
        let st = qp.stats();
        assert_eq!(st.sq_shadow_updates, i + 1);
        assert_eq!(m.sq_state(qid).unwrap().tail, i as u32 + 1);
    }
    let before = qp.stats();
    qp.ring();
    let st = qp.stats();
    assert_eq!(st.sq_shadow_updates, before.sq_shadow_updates);
    assert_eq!(st.sq_doorbell_mmio, before.sq_doorbell_mmio);
    assert_eq!(st.submissions, 3);
    assert_eq!(ok_tags(&reap_n(&mut qp, 3)), [0, 1, 2]);
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    // The model completes each command at its MMIO write and moves its
    // EventIdx to the tail it saw: every check asked for a write.
    assert_eq!(st.sq_shadow_updates, 3);
    assert_eq!(st.sq_doorbell_mmio, 3);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// `SqAnnounce::WhenDeep { in_flight: 4 }`: the first three queued commands
/// wait for `ring` (per batch), the fourth and every one after it while four
/// or more are in flight is announced as it is queued; once completions
/// bring the depth below four, queuing is per batch again.
#[test]
fn when_deep_announces_at_once_only_from_its_depth() {
    let (m, c) = controller(true);
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            cq_entries: Some(32),
            sq_announce: SqAnnounce::WhenDeep { in_flight: 4 },
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    m.freeze_event_idx(true);
    for i in 0..3u64 {
        queue_read(&mut qp, &c, i);
    }
    assert_eq!(
        qp.stats().sq_shadow_updates,
        0,
        "below the depth: per batch"
    );
    assert_eq!(m.sq_state(qid).unwrap().tail, 0);
    queue_read(&mut qp, &c, 3);
    // In flight 4: this one announced the tail (0 -> 4, past EventIdx 0).
    let st = qp.stats();
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (1, 1));
    assert_eq!(m.sq_state(qid).unwrap().tail, 4);
    queue_read(&mut qp, &c, 4);
    let st = qp.stats();
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (2, 1));
    assert_eq!(st.mmio_skipped_by_event_idx, 1);
    qp.ring();
    assert_eq!(
        qp.stats().sq_shadow_updates,
        2,
        "ring found it all announced"
    );
    m.process_shadow();
    m.freeze_event_idx(false);
    assert_eq!(ok_tags(&reap_n(&mut qp, 5)), [0, 1, 2, 3, 4]);
    // Idle again: below the depth, queuing waits for ring.
    queue_read(&mut qp, &c, 5);
    assert_eq!(qp.stats().sq_shadow_updates, 2);
    qp.ring();
    assert_eq!(qp.stats().sq_shadow_updates, 3);
    // (The model's EventIdx stayed where the freeze left it, so this tail
    // went to the shadow buffer only: a polling controller picks it up.)
    m.process_shadow();
    assert_eq!(ok_tags(&reap_n(&mut qp, 1)), [5]);
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    assert_eq!(st.submissions, 6);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// The same with a controller that is still working (its EventIdx lags):
/// after the first command's MMIO write, the EventIdx checks of the others
/// find nothing to write, a polling controller picks them up from the shadow
/// buffer, and every command completes once with its SQ head accepted.
#[test]
fn queue_skips_mmio_while_the_controller_has_not_caught_up() {
    let (m, c) = controller(true);
    let mut qp = event_idx_pair(&c);
    let qid = qp.qid();
    m.freeze_event_idx(true);
    for i in 0..5u64 {
        queue_read(&mut qp, &c, i);
    }
    let st = qp.stats();
    assert_eq!(st.sq_shadow_updates, 5);
    // EventIdx 0: only the first tail (1) passes it.
    assert_eq!(st.sq_doorbell_mmio, 1);
    assert_eq!(st.mmio_skipped_by_event_idx, 4);
    assert_eq!(m.doorbell_writes(qid).0, 1);
    // The first was processed at its MMIO write; the rest wait for a poll.
    assert_eq!(m.sq_state(qid).unwrap().tail, 1);
    m.process_shadow();
    assert_eq!(m.sq_state(qid).unwrap().tail, 5);
    m.freeze_event_idx(false);
    assert_eq!(ok_tags(&reap_n(&mut qp, 5)), [0, 1, 2, 3, 4]);
    let st = qp.stats();
    assert_stats_match(&m, qid, &st);
    assert_eq!(st.sq_doorbell_mmio, 1, "ring had nothing left: {st:?}");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Commands announced through the shadow buffer only (no MMIO write yet, the
/// controller not caught up) when the controller is reset: each ends exactly
/// once, with ControllerReset and its buffer, and the pair works afterwards.
#[test]
fn commands_announced_early_end_once_at_a_reset() {
    let (m, c) = controller(true);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = event_idx_pair(&c);
    m.freeze_event_idx(true);
    for i in 0..3u64 {
        queue_read(&mut qp, &c, i);
    }
    assert_eq!(qp.stats().mmio_skipped_by_event_idx, 2);
    m.freeze_event_idx(false);
    c.reset().unwrap();
    let got = reap_n(&mut qp, 3);
    assert_eq!(got.iter().map(|c| c.tag).collect::<Vec<_>>(), [0, 1, 2]);
    for cpl in &got {
        assert_eq!(cpl.result, Err(upnvme::IoError::ControllerReset), "{cpl:?}");
        assert!(cpl.buffer.is_some());
    }
    // Nothing more, and the re-created queues work.
    assert_eq!(qp.process_completions(u32::MAX, |_, _| {}).unwrap(), 0);
    let b = qp
        .read_blocking(&ns, 0, 1, c.alloc_dma(BS).unwrap(), T)
        .unwrap();
    drop(b);
    drop(got);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Without the EventIdx (or without Doorbell Buffer Config) nothing is
/// published before `ring`: the controller sees queued commands only when the
/// batch is rung, with one MMIO write.
#[test]
fn queue_publishes_nothing_early_without_the_event_index() {
    for ctrl_shadow in [true, false] {
        let (m, c) = controller(ctrl_shadow);
        let mut qp = pair(&c, 16, 32, CqHeadPolicy::default());
        let qid = qp.qid();
        for i in 0..3u64 {
            queue_read(&mut qp, &c, i);
        }
        m.process_shadow();
        assert_eq!(m.sq_state(qid).unwrap().tail, 0, "shadow {ctrl_shadow}");
        qp.ring();
        assert_eq!(m.doorbell_writes(qid).0, 1);
        assert_eq!(reap_n(&mut qp, 3).len(), 3);
        let st = qp.stats();
        assert_stats_match(&m, qid, &st);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

//! Doorbell rules, the CQ-full rule, phase tags on wrap, shadow doorbells.

use upnvme::Device;

use super::{Host, Sqe, rw};
use crate::model::{ModelConfig, Status};

#[test]
fn cq_full_is_a_violation_and_the_completion_waits() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 4);
    let flush = || Sqe::new(0x00).nsid(1);
    for _ in 0..3 {
        io.push(flush());
    }
    io.ring_sq(&h.m);
    // Three completions fill the 4-entry CQ (one slot always stays empty).
    let got: Vec<_> = std::iter::from_fn(|| io.poll()).collect();
    assert_eq!(got.len(), 3);
    assert!(h.m.violations().is_empty());
    // The host never tells the controller: the next completion cannot post.
    let cid = io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    assert_eq!(h.m.cq_state(1).unwrap().backlog, 1);
    let v = h.m.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("CQ 1 full"), "{v:?}");
    // Releasing the slots posts it.
    io.ring_cq(&h.m);
    let c = io.poll().expect("posted once the head moved");
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    io.ring_cq(&h.m);
    assert_eq!(h.m.cq_state(1).unwrap().backlog, 0);
    h.assert_clean();
}

#[test]
fn phase_flips_on_every_wrap() {
    for size in 2..=5u32 {
        let mut h = Host::new();
        let mut io = h.create_pair(1, size);
        for n in 0..3 * size {
            let cid = io.push(Sqe::new(0x00).nsid(1));
            io.ring_sq(&h.m);
            let slot = n % size;
            let raw = io.peek(slot);
            let expected_phase = (n / size) % 2 == 0;
            assert_eq!(raw.phase, expected_phase, "size {size} entry {n}");
            assert_eq!(raw.cid, cid);
            assert_eq!(u32::from(raw.sqhd), (n + 1) % size);
            let c = io.poll().unwrap();
            assert_eq!(c.cid, cid);
            io.ring_cq(&h.m);
        }
        assert!(!h.m.cq_state(1).unwrap().phase, "three wraps");
        h.assert_clean();
    }
}

#[test]
fn doorbell_rule_violations_are_recorded_and_ignored() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    let m = h.m.clone();
    m.write32(io.sq_doorbell(), 8);
    assert!(m.take_violations()[0].contains("beyond the queue size"));
    m.write32(io.cq_doorbell(), 9);
    assert!(m.take_violations()[0].contains("beyond the queue size"));
    // Releasing CQ entries that were never posted.
    m.write32(io.cq_doorbell(), 2);
    assert!(m.take_violations()[0].contains("not yet posted"));
    m.write32(io.sq_doorbell(), 0x1_0000);
    assert!(m.take_violations()[0].contains("reserved"));
    // Queue 5 does not exist.
    m.write32(0x1000 + 10 * 4, 1);
    assert!(m.take_violations()[0].contains("does not exist"));
    assert_eq!(m.sq_state(1).unwrap().tail, 0, "invalid writes ignored");
    // A CID reused while its command is still held.
    m.inject(crate::model::Fault::DelayCompletion {
        on: crate::model::Match::Queue(1),
        doorbells: None,
    });
    io.push_cid(Sqe::new(0x00).nsid(1), 42);
    io.ring_sq(&m);
    io.push_cid(Sqe::new(0x00).nsid(1), 42);
    io.ring_sq(&m);
    assert!(m.take_violations()[0].contains("reused"));
    // Every MMIO write was counted.
    assert_eq!(m.doorbell_writes(1), (4, 2));
    assert_eq!(m.doorbell_writes(5), (1, 0));
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn doorbell_stride_from_cap_dstrd() {
    let cfg = ModelConfig {
        dstrd: 2,
        ..ModelConfig::default()
    };
    let mut h = Host::with(cfg);
    assert_eq!(h.m.read64(0) >> 32 & 0xf, 2);
    let mut io = h.create_pair(3, 4);
    assert_eq!(io.sq_doorbell(), 0x1000 + 6 * 16);
    let c = io.call(&h.m, Sqe::new(0x00).nsid(1));
    assert_eq!(c.status, Status::SUCCESS);
    // Writes between doorbells are not doorbells.
    h.m.write32(0x1004, 1);
    assert!(h.m.take_violations()[0].contains("not a doorbell"));
    h.assert_clean();
}

#[test]
fn shadow_doorbells_and_event_index() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    let db = h.buffer(4096);
    let ei = h.buffer(4096);
    let c = h.admin(Sqe::new(0x7c).prp1(db.iova()).prp2(ei.iova()));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.m.shadow_config(), Some((db.iova(), ei.iova())));
    let (sq_slot, cq_slot) = (2 * 4, 3 * 4);

    // A device that polls the shadow buffer needs no MMIO at all.
    let buf = h.buffer(4096);
    let cid = io.push(rw(0x01, 0, 1, buf.iova(), 0));
    db.store_release_u32(sq_slot, io.tail).unwrap();
    assert!(io.poll().is_none());
    h.m.process_shadow();
    let c = io.poll().expect("processed from the shadow tail");
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    assert_eq!(ei.read_u32(sq_slot).unwrap(), 1, "EventIdx = tail consumed");
    assert_eq!(h.m.doorbell_writes(1), (0, 0));

    // Shadow CQ head, then shadow SQ tail and one MMIO write: the model reads
    // both and moves the CQ EventIdx to the head it saw.
    db.store_release_u32(cq_slot, io.head).unwrap();
    io.push(Sqe::new(0x00).nsid(1));
    db.store_release_u32(sq_slot, io.tail).unwrap();
    io.ring_sq(&h.m);
    assert!(io.poll().is_some());
    assert_eq!(ei.read_u32(cq_slot).unwrap(), 1);
    assert_eq!(ei.read_u32(sq_slot).unwrap(), 2);
    assert_eq!(h.m.cq_state(1).unwrap().head, 1);
    assert_eq!(h.m.doorbell_writes(1), (1, 0));

    // An MMIO write the shadow buffer does not agree with is recorded (and
    // the shadow value wins, as in QEMU).
    io.push(Sqe::new(0x00).nsid(1));
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    let v = h.m.take_violations();
    assert!(
        v[0].contains("shadow doorbell must be updated first"),
        "{v:?}"
    );
    db.store_release_u32(sq_slot, io.tail).unwrap();
    h.m.process_shadow();
    assert!(io.poll().is_some());

    // The admin queue keeps using MMIO doorbells.
    let c = h.admin(Sqe::new(0x0a).cdw(10, 0x07));
    assert_eq!(c.status, Status::SUCCESS);

    // A bad shadow value is a violation like a bad MMIO value.
    db.store_release_u32(sq_slot, 99).unwrap();
    h.m.process_shadow();
    assert!(h.m.take_violations()[0].contains("shadow"));
    h.assert_clean();

    // Reset forgets the configuration.
    h.m.write32(0x14, 0);
    assert_eq!(h.m.shadow_config(), None);
}

#[test]
fn doorbell_buffer_config_rules() {
    let mut h = Host::new();
    let page = h.buffer(8192);
    let c = h.admin(
        Sqe::new(0x7c)
            .prp1(page.iova() + 8)
            .prp2(page.iova() + 4096),
    );
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    let c = h.admin(Sqe::new(0x7c).prp1(page.iova()));
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    let cfg = ModelConfig {
        oacs_dbbc: false,
        ..ModelConfig::default()
    };
    let mut h = Host::with(cfg);
    let c = h.admin(Sqe::new(0x7c).prp1(page.iova()).prp2(page.iova() + 4096));
    assert_eq!(c.status, Status::INVALID_OPCODE.with_dnr());
    h.assert_clean();
}

//! Simulation: the ring, phase and CID pieces driven together against a toy
//! controller that fetches SQEs, completes them in random order, and posts
//! CQEs with Phase Tags into a completion queue it never overruns. Property:
//! under any interleaving of submit / device / reap / doorbell steps, every
//! submitted command completes exactly once, and no device-reported value
//! is rejected (the controller is well behaved here).

mod common;

use proptest::prelude::*;
use std::collections::HashMap;
use upnvme_queues::{CidTable, CqRing, Cqe, SqRing, Sqe, Status};

#[derive(Clone, Debug)]
enum Step {
    Submit(u8),
    Fetch,
    Complete(usize),
    Reap(u8),
    CqDoorbell,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u8..6).prop_map(Step::Submit),
        2 => Just(Step::Fetch),
        4 => any::<usize>().prop_map(Step::Complete),
        2 => (1u8..8).prop_map(Step::Reap),
        1 => Just(Step::CqDoorbell),
    ]
}

/// The toy controller: sees only queue memory and doorbell values.
struct Device {
    sq_mem: Vec<Sqe>,
    cq_mem: Vec<Cqe>,
    sq_head: u32,
    sq_tail_db: u32,
    cq_tail: u32,
    cq_head_db: u32,
    phase: bool,
    fetched: Vec<u16>,
}

impl Device {
    fn fetch(&mut self) {
        let n = self.sq_mem.len() as u32;
        while self.sq_head != self.sq_tail_db {
            self.fetched.push(self.sq_mem[self.sq_head as usize].cid());
            self.sq_head = (self.sq_head + 1) % n;
        }
    }

    /// Posts a completion for fetched[i] unless the CQ is full.
    fn complete(&mut self, i: usize) -> bool {
        let n = self.cq_mem.len() as u32;
        if self.fetched.is_empty() || (self.cq_tail + 1) % n == self.cq_head_db {
            return false;
        }
        let cid = self.fetched.swap_remove(i % self.fetched.len());
        self.cq_mem[self.cq_tail as usize] = Cqe::new(
            u32::from(cid),
            self.sq_head as u16,
            1,
            cid,
            self.phase,
            Status::SUCCESS,
        );
        self.cq_tail += 1;
        if self.cq_tail == n {
            self.cq_tail = 0;
            self.phase = !self.phase;
        }
        true
    }
}

struct Host {
    sq: SqRing,
    cq: CqRing,
    cids: CidTable,
    /// slot -> tag of the request in that tracker slot.
    trackers: Vec<Option<u64>>,
    next_tag: u64,
    completed: HashMap<u64, u32>,
}

impl Host {
    fn submit(&mut self, dev: &mut Device, k: u8) {
        for _ in 0..k {
            if self.sq.is_full() {
                break;
            }
            let Some(cid) = self.cids.alloc() else { break };
            let slot = self.sq.push().unwrap();
            let mut sqe = Sqe::read(1, self.next_tag, 1);
            sqe.set_cid(cid.value);
            dev.sq_mem[usize::from(slot)] = sqe;
            assert!(
                self.trackers[usize::from(cid.slot)]
                    .replace(self.next_tag)
                    .is_none()
            );
            self.next_tag += 1;
        }
        if let Some(tail) = self.sq.commit() {
            dev.sq_tail_db = u32::from(tail);
        }
    }

    fn reap(&mut self, dev: &mut Device, max: u8) {
        for _ in 0..max {
            let cqe = dev.cq_mem[usize::from(self.cq.head())];
            if !self.cq.is_new(cqe.phase()) {
                break;
            }
            self.sq.update_head(cqe.sqhd()).expect("valid sqhd");
            let slot = self.cids.complete(cqe.cid()).expect("valid cid");
            let tag = self.trackers[usize::from(slot)]
                .take()
                .expect("tracker in use");
            *self.completed.entry(tag).or_default() += 1;
            self.cq.advance();
        }
    }

    fn cq_doorbell(&mut self, dev: &mut Device) {
        if let Some(head) = self.cq.commit() {
            dev.cq_head_db = u32::from(head);
        }
    }
}

/// Runs one interleaving. With `due_policy` the host writes the CQ head
/// doorbell only when [`CqRing::head_doorbell_due`] says so (never on a
/// `CqDoorbell` step), and the controller must then never find the CQ full.
fn run(sq_n: u32, cq_n: u32, steps: Vec<Step>, due_policy: bool) -> Result<(), TestCaseError> {
    // At most cq_n - 1 commands in flight, so the controller can always
    // post every completion once the host has reaped and rung the doorbell.
    let slots = (sq_n - 1).min(cq_n - 1) as u16;
    let mut dev = Device {
        sq_mem: vec![Sqe::default(); sq_n as usize],
        cq_mem: vec![Cqe::default(); cq_n as usize],
        sq_head: 0,
        sq_tail_db: 0,
        cq_tail: 0,
        cq_head_db: 0,
        phase: true,
        fetched: Vec::new(),
    };
    let mut host = Host {
        sq: SqRing::new(sq_n).unwrap(),
        cq: CqRing::new(cq_n).unwrap(),
        cids: CidTable::new(slots),
        trackers: vec![None; usize::from(slots)],
        next_tag: 0,
        completed: HashMap::new(),
    };
    for s in steps {
        match s {
            Step::Submit(k) => host.submit(&mut dev, k),
            Step::Fetch => dev.fetch(),
            Step::Complete(i) => {
                let had_work = !dev.fetched.is_empty();
                let posted = dev.complete(i);
                if due_policy {
                    prop_assert_eq!(posted, had_work, "controller found the CQ full");
                }
            }
            Step::Reap(k) => {
                host.reap(&mut dev, k);
                if due_policy && host.cq.head_doorbell_due(u32::from(slots)) {
                    host.cq_doorbell(&mut dev);
                }
            }
            Step::CqDoorbell if !due_policy => host.cq_doorbell(&mut dev),
            Step::CqDoorbell => {}
        }
    }
    // Drain: the device finishes everything, the host reaps everything.
    let mut rounds = 0;
    while host.cids.in_flight() > 0 {
        dev.fetch();
        while dev.complete(0) {}
        host.reap(&mut dev, u8::MAX);
        host.cq_doorbell(&mut dev);
        rounds += 1;
        prop_assert!(rounds < 10_000, "no progress: lost completion");
    }
    prop_assert_eq!(host.completed.len() as u64, host.next_tag);
    prop_assert!(host.completed.values().all(|&c| c == 1));
    prop_assert!(host.sq.is_empty());
    prop_assert!(host.trackers.iter().all(Option::is_none));
    Ok(())
}

proptest! {
    #![proptest_config(common::config(256))]

    #[test]
    fn exactly_one_completion_per_command(
        sq_n in 2u32..=40,
        cq_n in 2u32..=40,
        steps in prop::collection::vec(step(), 0..common::scale(600)),
    ) {
        run(sq_n, cq_n, steps, false)?;
    }

    #[test]
    fn lazy_cq_doorbell_never_stalls_the_controller(
        sq_n in 2u32..=40,
        cq_n in 2u32..=80,
        steps in prop::collection::vec(step(), 0..common::scale(600)),
    ) {
        run(sq_n, cq_n, steps, true)?;
    }
}

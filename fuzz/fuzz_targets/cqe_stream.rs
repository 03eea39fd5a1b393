//! `cqe_stream`: an I/O queue pair on the in-memory controller model, driven
//! by a sequence of actions decoded from the fuzzer's bytes — submissions
//! (valid and invalid), batches, reaps, blocking calls with tiny timeouts,
//! hand-made completion queue entries (arbitrary 16 bytes, or plausible ones
//! built from the CIDs of commands in flight with random corruptions), the
//! model's one-shot faults, admin traffic, controller resets and queue pair
//! re-creation.
//!
//! Invariants checked after every action:
//! - no panic (libFuzzer reports it), no hang (libFuzzer's `-timeout`; every
//!   loop here is bounded and every wait has a tiny bound);
//! - every completion tag is delivered at most once, with the buffer it was
//!   submitted with, and a buffer is never handed out while the harness
//!   already owns it;
//! - a refused command hands its buffer straight back; the pair never has
//!   more commands in flight than its depth;
//! - `DeviceFault` leaves the controller failed; while it is failed (and was
//!   not reset) every call errors and no doorbell is written;
//! - at the end, a controller reset completes every command still in flight,
//!   so each submitted command was delivered exactly once; and the model saw
//!   no DMA to unmapped memory.

#![no_main]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use upnvme::{
    BLOCKING_TAG, Completion, Controller, CqHeadPolicy, DmaBuffer, DsmRange, Error, IoCommand,
    IoQueuePair, Namespace, QueuePairOptions, Rejected,
};
use upnvme_fuzz::{Reader, options};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

/// Blocks in the fuzzed namespace: small, so random LBAs often fall outside.
const NS_BLOCKS: u64 = 256;
/// Most buffers the harness keeps at once.
const MAX_BUFFERS: usize = 48;
/// Most actions per input (every action is bounded, so is the whole run).
const MAX_ACTIONS: usize = 400;

type Ctrl = Controller<ModelController>;
type Pair = IoQueuePair<ModelController>;

/// Who owns what: the harness's bookkeeping of tags and buffers.
#[derive(Default)]
struct Books {
    next_tag: u64,
    /// Tag → IOVA of the buffer submitted with it (None: no buffer).
    outstanding: HashMap<u64, Option<u64>>,
    /// Tags already delivered.
    delivered: HashSet<u64>,
    /// IOVAs of buffers blocking calls left with the driver (timed out).
    blocking: HashSet<u64>,
    /// IOVAs of the buffers the harness owns right now.
    owned: HashSet<u64>,
    /// The buffers themselves.
    pool: Vec<DmaBuffer>,
}

impl Books {
    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// A buffer comes (back) into the harness's hands.
    fn take_back(&mut self, buf: DmaBuffer) {
        let iova = buf.iova();
        assert!(
            self.owned.insert(iova),
            "buffer {iova:#x} handed out while the harness already owns it"
        );
        if self.pool.len() < MAX_BUFFERS {
            self.pool.push(buf);
        } else {
            self.owned.remove(&iova);
        }
    }

    /// A buffer goes to the driver.
    fn give(&mut self, buf: &DmaBuffer) {
        assert!(self.owned.remove(&buf.iova()));
    }

    /// A buffer from the pool (or a new one) of at least `len` bytes, or one
    /// that is deliberately too small when `small`.
    fn buffer(&mut self, c: &Ctrl, len: usize, small: bool) -> Option<DmaBuffer> {
        let pos = self
            .pool
            .iter()
            .position(|b| if small { b.len() < len } else { b.len() >= len });
        match pos {
            Some(i) => {
                let b = self.pool.swap_remove(i);
                Some(b)
            }
            None => {
                let want = if small { (len / 2).max(1) } else { len };
                let b = c.alloc_dma(want).ok()?;
                if small && b.len() >= len {
                    // Page granular: cannot make it smaller. Use it anyway.
                }
                assert!(self.owned.insert(b.iova()), "allocator reused a live IOVA");
                Some(b)
            }
        }
    }

    /// A completion from `process_completions` (or a blocking call's
    /// completion delivered later).
    fn deliver(&mut self, c: Completion) {
        if c.tag == BLOCKING_TAG {
            let buf = c
                .buffer
                .expect("a blocking command's late completion carries its buffer");
            assert!(
                self.blocking.remove(&buf.iova()),
                "late blocking completion with buffer {:#x} the driver did not hold",
                buf.iova()
            );
            self.take_back(buf);
            return;
        }
        assert!(
            !self.delivered.contains(&c.tag),
            "tag {} delivered twice",
            c.tag
        );
        let Some(expected) = self.outstanding.remove(&c.tag) else {
            panic!("tag {} was never submitted", c.tag);
        };
        self.delivered.insert(c.tag);
        assert_eq!(
            c.buffer.as_ref().map(|b| b.iova()),
            expected,
            "tag {} came back with another buffer",
            c.tag
        );
        if let Some(b) = c.buffer {
            self.take_back(b);
        }
    }

    /// Forgets the commands of a dropped queue pair (they never complete).
    fn forget_in_flight(&mut self) {
        self.outstanding.clear();
        self.blocking.clear();
    }
}

/// What one action did, for the failed-controller invariant.
enum Outcome {
    Refused,
    Accepted,
    Delivered(u32),
    NotAnIoCall,
}

/// The namespace handles commands name: the controller's own (NSID 1), and
/// handles it never handed out, which every queue pair must refuse before
/// looking at anything else.
struct Handles {
    /// NSID 1, from the controller.
    ns: Namespace,
    /// Built from NSID 1's Identify data but not adopted by the controller:
    /// NSIDs 0, 0xffff_ffff and 2 (not active), NSID 1 itself, and NSID 1
    /// claiming a namespace 16 times larger (LBAs past the real end).
    strays: [Namespace; 5],
}

impl Handles {
    fn of(c: &Ctrl) -> Handles {
        let ns = c.namespace(1).expect("namespace 1").clone();
        let stray = |nsid, nsze| {
            let mut id = ns.identify().clone();
            id.nsze = nsze;
            Namespace::from_identify(nsid, id).expect("a usable LBA format")
        };
        let blocks = ns.lba_count();
        let strays = [
            stray(0, blocks),
            stray(0xffff_ffff, blocks),
            stray(2, blocks),
            stray(1, blocks),
            stray(1, blocks * 16),
        ];
        Handles { ns, strays }
    }
}

fn command<'a>(
    r: &mut Reader<'_>,
    lba_size: u32,
    handles: &'a Handles,
    ranges: &'a [DsmRange],
) -> IoCommand<'a> {
    let ns = match r.below(8) {
        0 => &handles.strays[r.below(handles.strays.len() as u32) as usize],
        1 => &handles.strays[0],
        2 => &handles.strays[1],
        _ => &handles.ns,
    };
    let slba = match r.below(8) {
        0 => r.u64(),
        1 => NS_BLOCKS - 1,
        2 => u64::MAX,
        _ => u64::from(r.below(NS_BLOCKS as u32)),
    };
    let blocks = match r.below(8) {
        0 => r.u32(),
        1 => 0,
        2 => 8192 / lba_size + 1,
        _ => 1 + r.below(8192 / lba_size),
    };
    match r.below(8) {
        0..=2 => IoCommand::Read { ns, slba, blocks },
        3 | 4 => IoCommand::Write { ns, slba, blocks },
        5 => IoCommand::Compare { ns, slba, blocks },
        6 => match r.below(3) {
            0 => IoCommand::Flush { ns },
            1 => IoCommand::WriteZeroes {
                ns,
                slba,
                blocks,
                deallocate: r.bool(),
            },
            _ => IoCommand::Deallocate { ns, ranges },
        },
        _ => IoCommand::Deallocate { ns, ranges },
    }
}

fn dsm_ranges(r: &mut Reader<'_>) -> Vec<DsmRange> {
    let n = match r.below(8) {
        0 => 0,
        1 => 257,
        2 => 256,
        _ => 1 + r.below(4) as usize,
    };
    (0..n)
        .map(|i| DsmRange {
            cattr: 0,
            nlb: if i == 0 { 1 + r.below(16) } else { 1 },
            slba: u64::from(r.below(NS_BLOCKS as u32 + 4)),
        })
        .collect()
}

fn pair_options(r: &mut Reader<'_>) -> QueuePairOptions {
    let entries = match r.below(8) {
        0 => None,
        1 => Some(2),
        2 => Some(3),
        3 => Some(r.u32() % 70),
        4 => Some(64),
        _ => Some(4 + r.below(13)),
    };
    let cq_entries = match r.below(4) {
        0 => entries.map(|e| e.saturating_mul(2)),
        1 => entries,
        2 => Some(2 + r.below(40)),
        _ => None,
    };
    QueuePairOptions {
        entries,
        cq_entries,
        shadow_doorbells: r.bool(),
        reap_on_submit: r.bool(),
        cq_head_policy: if r.bool() {
            CqHeadPolicy::EveryReap
        } else {
            CqHeadPolicy::Adaptive { batch: r.below(8) }
        },
        command_timeout: match r.below(8) {
            0 => Some(Duration::from_micros(u64::from(r.below(200)))),
            _ => None,
        },
        ..Default::default()
    }
}

fn fault(r: &mut Reader<'_>, qid: u16) -> Fault {
    let on = match r.below(8) {
        0 => Match::Next,
        1 => Match::Nth(u64::from(r.below(64))),
        _ => Match::Queue(qid),
    };
    match r.below(16) {
        0 | 1 => Fault::DropCompletion(on),
        2..=4 => Fault::DelayCompletion {
            on,
            doorbells: if r.bool() { None } else { Some(r.below(4)) },
        },
        5 | 6 => Fault::DuplicateCompletion(on),
        7 | 8 => Fault::CorruptCid { on, xor: r.u16() },
        9 => Fault::BadSqHead { on, sqhd: r.u16() },
        10 => Fault::WrongPhase(on),
        11 | 12 => Fault::Status {
            on,
            status: Status::new(r.below(8) as u8, r.u8()),
        },
        13 => Fault::FatalOn(on),
        14 => Fault::UnplugOn(Match::Queue(qid)),
        _ => Fault::Status {
            on,
            status: Status::ABORT_REQUESTED,
        },
    }
}

/// A hand-made completion: arbitrary dwords, or a plausible entry for a
/// command the model fetched on `qid`, with an optional corruption.
fn forged_cqe(r: &mut Reader<'_>, m: &ModelController, qid: u16) -> [u32; 4] {
    if r.below(4) == 0 {
        return [r.u32(), r.u32(), r.u32(), r.u32()];
    }
    let seen: Vec<u16> = m
        .commands_seen()
        .iter()
        .rev()
        .filter(|&&(sq, _, _)| sq == qid)
        .map(|&(_, _, cid)| cid)
        .take(8)
        .collect();
    let cid = match seen.len() {
        0 => r.u16() & 0x3f,
        n => seen[r.below(n as u32) as usize],
    };
    let sqhd = m.sq_state(qid).map_or(0, |s| s.head) as u16;
    let status: u32 = match r.below(8) {
        0 => u32::from(r.u16()) & 0x7fff,
        1 => 0x07, // Command Abort Requested
        _ => 0,
    };
    let mut dw0 = 0;
    let mut dw2 = u32::from(qid) << 16 | u32::from(sqhd);
    let mut dw3 = u32::from(cid) | status << 17;
    match r.below(10) {
        0 => dw3 ^= u32::from(r.u16()),
        1 => dw2 = u32::from(qid) << 16 | u32::from(sqhd.wrapping_add(1 + r.u8() as u16)),
        2 => dw2 ^= u32::from(r.u16()) << 16,
        3 => dw3 ^= 1 << (r.below(16)),
        4 => dw0 = r.u32(),
        _ => {}
    }
    [dw0, 0, dw2, dw3]
}

struct Harness {
    m: ModelController,
    c: Ctrl,
    qp: Option<Pair>,
    books: Books,
    handles: Handles,
    lba_size: u32,
}

impl Harness {
    /// Handles the result of a refused or accepted submission.
    fn submitted(&mut self, r: Result<(), Rejected>, tag: u64, iova: Option<u64>) -> Outcome {
        match r {
            Ok(()) => {
                self.books.outstanding.insert(tag, iova);
                Outcome::Accepted
            }
            Err(f) => {
                assert_eq!(
                    f.buffer.as_ref().map(|b| b.iova()),
                    iova,
                    "a refused command must hand its buffer back: {:?}",
                    f.reason
                );
                if let Some(b) = f.buffer {
                    self.books.take_back(b);
                }
                Outcome::Refused
            }
        }
    }

    fn process(&mut self, max: u32) -> Outcome {
        let Some(qp) = self.qp.as_mut() else {
            return Outcome::NotAnIoCall;
        };
        let mut got = Vec::new();
        let res = qp.process_completions(max, |_, c| got.push(c));
        let n = got.len() as u32;
        for c in got {
            self.books.deliver(c);
        }
        match res {
            Ok(k) => {
                assert_eq!(k, n, "process_completions count");
                assert!(k <= max, "delivered {k} > max {max}");
                Outcome::Delivered(k)
            }
            Err(e) => {
                // Completions validated before the bad entry were delivered
                // (once); the error reports what came after them.
                check_fault(&self.c, &e);
                Outcome::Refused
            }
        }
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        let failed_before = self.c.failure().is_some();
        let resets_before = self.c.resets();
        let doorbells_before = self.m.total_doorbell_writes();
        let action = r.below(20);
        let outcome = match action {
            // Submit one command (ring at once) or queue it (ring later).
            0..=4 => self.submit(r, action == 4),
            5 => match self.qp.as_mut() {
                Some(qp) => {
                    qp.ring();
                    Outcome::NotAnIoCall
                }
                None => Outcome::NotAnIoCall,
            },
            6 | 7 => {
                let max = match r.below(4) {
                    0 => 0,
                    1 => u32::MAX,
                    _ => 1 + r.below(8),
                };
                self.process(max)
            }
            8 => self.blocking(r),
            9..=11 => {
                let qid = match self.qp.as_ref() {
                    Some(qp) if r.below(16) != 0 => qp.qid(),
                    _ => r.below(3) as u16,
                };
                let dwords = forged_cqe(r, &self.m, qid);
                let _ = self.m.post_raw_completion(qid, dwords);
                Outcome::NotAnIoCall
            }
            12 | 13 => {
                if self.m.pending_faults().len() < 8 {
                    let qid = self.qp.as_ref().map_or(1, |q| q.qid());
                    self.m.inject(fault(r, qid));
                }
                Outcome::NotAnIoCall
            }
            14 => {
                self.m.release_delayed();
                Outcome::NotAnIoCall
            }
            15 => {
                let r = self.c.reset();
                if r.is_ok() {
                    assert!(self.c.failure().is_none(), "failed after a good reset");
                }
                return;
            }
            16 => {
                let res = match r.below(3) {
                    0 => self.c.get_features(0x07, 0, 0).map(|_| ()),
                    1 => self.c.poll_async_events().map(|_| ()),
                    _ => {
                        self.m.raise_async_event(r.below(8) as u8, r.u8(), r.u8());
                        return;
                    }
                };
                match res {
                    Ok(()) => Outcome::Accepted,
                    Err(e) => {
                        check_fault(&self.c, &e);
                        Outcome::Refused
                    }
                }
            }
            17 => {
                // Drop the pair (its commands are abandoned) and make a new one.
                if r.below(4) == 0 {
                    self.qp = None;
                    self.books.forget_in_flight();
                    let opts = pair_options(r);
                    match self.c.io_queue_pair(opts) {
                        Ok(qp) => self.qp = Some(qp),
                        Err(e) => check_fault(&self.c, &e),
                    }
                }
                return;
            }
            _ => self.process(u32::MAX),
        };
        // After a reset, the pair re-creates its queues before it writes to
        // them: no doorbell for a queue that does not exist.
        let stale: Vec<String> = self
            .m
            .take_violations()
            .into_iter()
            .filter(|v| v.contains("does not exist"))
            .collect();
        // Was KNOWN-6 (first submission after a reset) and KNOWN-7 (`ring`
        // of commands queued before a reset); both fixed.
        assert!(
            stale.is_empty(),
            "doorbell for a deleted queue (action {action}): {stale:?}"
        );
        // No more commands in flight than the pair has slots.
        if let Some(qp) = self.qp.as_ref() {
            assert!(
                qp.in_flight() <= qp.max_depth(),
                "{} commands in flight, depth {} (action {action})",
                qp.in_flight(),
                qp.max_depth()
            );
        }
        if failed_before && self.c.resets() == resets_before {
            // A failed controller refuses everything until it is reset.
            match outcome {
                Outcome::Accepted => panic!("action {action} accepted by a failed controller"),
                Outcome::Delivered(0) => {
                    panic!("process_completions returned Ok(0) on a failed controller")
                }
                _ => {}
            }
            assert_eq!(
                self.m.total_doorbell_writes(),
                doorbells_before,
                "doorbell written to a failed controller (action {action})"
            );
        }
    }

    fn submit(&mut self, r: &mut Reader<'_>, queue_only: bool) -> Outcome {
        if self.qp.is_none() {
            return Outcome::NotAnIoCall;
        }
        let ranges = dsm_ranges(r);
        let cmd = command(r, self.lba_size, &self.handles, &ranges);
        let len = match cmd {
            IoCommand::Read { blocks, .. }
            | IoCommand::Write { blocks, .. }
            | IoCommand::Compare { blocks, .. } => {
                (blocks.min(1 << 20) as usize).max(1) * self.lba_size as usize
            }
            _ => 4096,
        };
        let buffer = match r.below(8) {
            0 => None,
            1 => self.books.buffer(&self.c, len.min(1 << 16), true),
            _ if len > 1 << 16 => self.books.buffer(&self.c, 4096, false),
            _ => self.books.buffer(&self.c, len, false),
        };
        let iova = buffer.as_ref().map(|b| b.iova());
        if let Some(b) = &buffer {
            self.books.give(b);
        }
        let tag = self.books.tag();
        let Some(qp) = self.qp.as_mut() else {
            return Outcome::NotAnIoCall;
        };
        let res = if queue_only {
            qp.queue(cmd, buffer, tag)
        } else {
            qp.submit(cmd, buffer, tag)
        };
        if let Err(f) = &res {
            check_fault(&self.c, &qp.describe(f.reason));
        }
        self.submitted(res, tag, iova)
    }

    fn blocking(&mut self, r: &mut Reader<'_>) -> Outcome {
        if self.qp.is_none() {
            return Outcome::NotAnIoCall;
        }
        let slba = u64::from(r.below(NS_BLOCKS as u32 + 2));
        let blocks = 1 + r.below(2);
        let write = r.bool();
        let timeout = Duration::from_micros(u64::from(r.below(4)) * 100);
        let Some(buf) = self
            .books
            .buffer(&self.c, (blocks * self.lba_size) as usize, false)
        else {
            return Outcome::NotAnIoCall;
        };
        let iova = buf.iova();
        self.books.give(&buf);
        let Some(qp) = self.qp.as_mut() else {
            return Outcome::NotAnIoCall;
        };
        let res = if write {
            qp.write_blocking(&self.handles.ns, slba, blocks, buf, timeout)
        } else {
            qp.read_blocking(&self.handles.ns, slba, blocks, buf, timeout)
        };
        match res {
            Ok(b) => {
                assert_eq!(b.iova(), iova, "blocking call returned another buffer");
                self.books.take_back(b);
                Outcome::Accepted
            }
            Err(f) => {
                check_fault(&self.c, &f.error);
                match f.buffer {
                    Some(b) => {
                        assert_eq!(b.iova(), iova, "blocking call returned another buffer");
                        self.books.take_back(b);
                    }
                    // The device may still own it: the driver keeps it until
                    // its completion or a reset.
                    None => {
                        self.books.blocking.insert(iova);
                    }
                }
                Outcome::Refused
            }
        }
    }

    /// End of input: reset (if the device is still there) and collect every
    /// command still in flight: each must complete exactly once.
    fn finish(mut self) {
        self.m.clear_faults();
        if self.qp.is_some() && !self.m.is_unplugged() && self.c.reset().is_ok() {
            let _ = self.process(u32::MAX);
            let _ = self.process(u32::MAX);
            assert!(
                self.books.outstanding.is_empty(),
                "commands never completed after a reset: {:?}",
                self.books.outstanding
            );
            assert!(
                self.books.blocking.is_empty(),
                "blocking commands never completed after a reset: {:?}",
                self.books.blocking
            );
            assert_eq!(self.qp.as_ref().map(|q| q.in_flight()), Some(0));
        }
        drop(self.qp.take());
        let m = self.m.clone();
        let _ = self.c.close();
        assert_eq!(m.dma_faults(), 0, "DMA faults: {:?}", m.dma_fault_log());
    }
}

/// A device fault always leaves the controller failed.
fn check_fault(c: &Ctrl, e: &Error) {
    if matches!(e, Error::DeviceFault { .. }) {
        assert!(
            c.failure().is_some(),
            "DeviceFault without a failed controller: {e}"
        );
    }
    // Every error renders (Display must not panic).
    let _ = e.to_string();
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let lba_size = if r.bool() { 4096 } else { 512 };
    let cfg = ModelConfig {
        mdts: match r.below(4) {
            0 => 0,
            1 => 1,
            _ => 5,
        },
        mqes: 2 + r.below(128) as u16,
        max_ioqpairs: 1 + r.below(4) as u16,
        oacs_dbbc: r.bool(),
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size,
            blocks: NS_BLOCKS,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    };
    let m = ModelController::new(cfg);
    let mut o = options();
    // Admin commands whose completion a fault holds back cost this much.
    o.admin_timeout = Some(Duration::from_millis(5));
    o.io_queues = 1 + r.below(4) as u16;
    o.shadow_doorbells = r.bool();
    o.async_events = r.below(5) as u8;
    o.admin_queue_entries = 2 + r.below(31);
    let c = match Controller::with_device(m.clone(), o) {
        Ok(c) => c,
        Err(e) => panic!("bring-up on a healthy model failed: {e}"),
    };
    let opts = pair_options(&mut r);
    let qp = match c.io_queue_pair(opts) {
        Ok(qp) => Some(qp),
        Err(Error::InvalidArgument(_)) => None,
        Err(e) => panic!("queue pair on a healthy model failed: {e}"),
    };
    let handles = Handles::of(&c);
    let mut h = Harness {
        m,
        c,
        qp,
        books: Books::default(),
        handles,
        lba_size,
    };
    let mut steps = 0;
    while !r.is_empty() && steps < MAX_ACTIONS {
        h.step(&mut r);
        steps += 1;
    }
    h.finish();
});

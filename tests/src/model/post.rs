//! Completion delivery: the fault plan (drop, delay, duplicate, corrupt),
//! the Full Queue rule (a completion due while the host has not released a
//! slot waits in the queue's backlog and is recorded as a violation), and
//! writing completion queue entries with their Phase Tag (NVMe Base
//! Specification 2.0, "Completion Queue Entry"). Asynchronous events
//! complete outstanding Asynchronous Event Requests (§5.2) here too.

use super::command::{CQE_SIZE, CqeWords};
use super::state::{Completion, Held, Pending, State};
use super::status::Status;

impl State {
    /// Posts delayed completions whose doorbell count has come.
    pub(super) fn release_due(&mut self) {
        let now = self.stats.doorbell_total;
        if !self
            .held
            .iter()
            .any(|h| h.release_at.is_some_and(|t| t <= now))
        {
            return;
        }
        let (due, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.release_at.is_some_and(|t| t <= now));
        self.held = keep;
        for h in due {
            self.post(h.c);
        }
    }

    /// Posts every delayed completion now; returns how many.
    pub(super) fn release_all_delayed(&mut self) -> usize {
        if self.gone || self.fatal {
            return 0;
        }
        let held = std::mem::take(&mut self.held);
        let n = held.len();
        for h in held {
            self.post(h.c);
        }
        n
    }

    /// Hands a completion to the fault plan: drop, hold, or post.
    pub(super) fn deliver(&mut self, c: Completion) {
        if c.plan.drop {
            self.dropped.push((c.sqid, c.cid));
        } else if let Some(k) = c.plan.delay {
            let release_at = k.map(|k| self.stats.doorbell_total + u64::from(k));
            self.held.push(Held { c, release_at });
        } else {
            self.post(c);
        }
    }

    /// Posts a completion (and its injected duplicate), or holds it in the
    /// CQ backlog when the queue is full.
    pub(super) fn post(&mut self, c: Completion) {
        let mods = c.plan.post_mods();
        self.post_entry(Pending {
            c,
            mods,
            counts: true,
        });
        if c.plan.duplicate {
            self.post_entry(Pending {
                c,
                mods,
                counts: false,
            });
        }
    }

    fn post_entry(&mut self, p: Pending) {
        let cqid = p.c.cqid;
        let Some(cq) = self.cqs.get_mut(&cqid) else {
            return;
        };
        if cq.backlog.is_empty() && !cq.is_full() {
            self.write_cqe(cqid, p);
            return;
        }
        if !p.counts {
            return;
        }
        let (head, tail, size) = (cq.head, cq.tail, cq.size);
        cq.backlog.push_back(p);
        self.violation(format!(
            "CQ {cqid} full: completion of SQ {} CID {:#06x} due but the host has not released a slot (head {head}, tail {tail}, {size} entries); held until the head doorbell moves",
            p.c.sqid, p.c.cid
        ));
    }

    pub(super) fn flush_backlog(&mut self, cqid: u16) {
        loop {
            let Some(cq) = self.cqs.get_mut(&cqid) else {
                return;
            };
            if cq.is_full() {
                return;
            }
            let Some(p) = cq.backlog.pop_front() else {
                return;
            };
            self.write_cqe(cqid, p);
        }
    }

    /// Writes one CQE into the next slot of CQ `cqid`.
    fn write_cqe(&mut self, cqid: u16, p: Pending) {
        let sqhd = match p.mods.sqhd {
            Some(h) => h,
            None => self
                .sqs
                .get(&p.c.sqid)
                .map_or(p.c.sqhd_hint, |s| s.frozen_head.unwrap_or(s.head))
                as u16,
        };
        let words = CqeWords {
            dw0: p.c.dw0,
            dw1: 0,
            sqhd,
            sqid: p.c.sqid,
            cid: p.c.cid ^ p.mods.cid_xor,
            status: p.c.status.0,
        };
        let dwords = [words.dw0, words.dw1, words.dw2(), words.dw3(false)];
        self.write_slot(cqid, dwords, p.mods.wrong_phase);
    }

    /// Writes `dwords` into the next slot of CQ `cqid` with the queue's
    /// Phase Tag (inverted if `wrong_phase`) in dword 3 bit 16, and advances
    /// the tail. Dwords 0-2 are written first, dword 3 last with release
    /// ordering, so a host that sees the new phase sees the whole entry.
    fn write_slot(&mut self, cqid: u16, dwords: [u32; 4], wrong_phase: bool) {
        let Some(cq) = self.cqs.get_mut(&cqid) else {
            return;
        };
        let at = cq
            .base
            .wrapping_add(u64::from(cq.tail).wrapping_mul(CQE_SIZE));
        let phase = cq.phase != wrong_phase;
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        let [dw0, dw1, dw2, dw3] = dwords;
        let mut head = [0u8; 12];
        head[0..4].copy_from_slice(&dw0.to_le_bytes());
        head[4..8].copy_from_slice(&dw1.to_le_bytes());
        head[8..12].copy_from_slice(&dw2.to_le_bytes());
        let dw3 = (dw3 & !(1 << 16)) | u32::from(phase) << 16;
        let r = self
            .mem
            .write(at, &head)
            .and_then(|()| self.mem.write_u32_release(at.wrapping_add(12), dw3));
        if let Err(f) = r {
            self.dma_fault(f, &format!("CQ {cqid} entry post"));
        }
    }

    /// Posts a caller-built completion queue entry into CQ `cqid` (the
    /// Phase Tag is set to the queue's current phase); false when the queue
    /// does not exist, is full or has a backlog, or the controller is failed
    /// or gone.
    pub(super) fn post_raw(&mut self, cqid: u16, dwords: [u32; 4]) -> bool {
        if self.gone || self.fatal {
            return false;
        }
        match self.cqs.get(&cqid) {
            Some(cq) if !cq.is_full() && cq.backlog.is_empty() => {
                self.write_slot(cqid, dwords, false);
                true
            }
            _ => false,
        }
    }

    /// Queues `event` (dword 0) and completes outstanding Asynchronous Event
    /// Requests with the queued events whose type is not masked.
    pub(super) fn async_event(&mut self, event: u32) {
        if self.gone || self.fatal {
            return;
        }
        self.events.push_back(event);
        self.process_aers();
    }

    /// The first queued event whose type is not masked, taken from the queue
    /// and its type masked (until its log page is read, or a reset).
    pub(super) fn take_unmasked_event(&mut self) -> Option<u32> {
        let i = self
            .events
            .iter()
            .position(|e| self.aer_masked & (1 << (e & 7)) == 0)?;
        let event = self.events.remove(i)?;
        self.aer_masked |= 1 << (event & 7);
        Some(event)
    }

    /// Completes outstanding Asynchronous Event Requests with the queued
    /// events that are not masked (NVMe 2.0 §5.2: an event type is masked
    /// once reported, until the host reads its log page with RAE clear).
    pub(super) fn process_aers(&mut self) {
        while !self.aers.is_empty() && self.cqs.contains_key(&0) {
            let Some(event) = self.take_unmasked_event() else {
                return;
            };
            let aer = self.aers.remove(0);
            self.deliver(Completion {
                sqid: 0,
                cqid: 0,
                cid: aer.cid,
                dw0: event,
                sqhd_hint: 0,
                status: Status::SUCCESS,
                plan: aer.plan,
            });
        }
    }
}

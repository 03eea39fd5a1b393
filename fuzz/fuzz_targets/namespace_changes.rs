//! `namespace_changes`: namespaces changed under the driver's handles by
//! someone else (another host formats, resizes, deletes, creates one again
//! with the same or another NGUID), announced or not (the Changed Namespace
//! List entry, the Namespace Attribute Changed notice, each present or
//! missing; the list overflowing; spurious entries and notices), mixed with
//! the driver's own calls (`poll_async_events`, `refresh_namespaces`,
//! `namespace`, `reset`, `format_nvm`, the application's own Get Log Page and
//! Asynchronous Event Configuration), I/O on old and new handles through one
//! queue pair, and faults on the admin commands that follow the changes
//! (Get Log Page and Identify failing with transient or final statuses,
//! getting no answer, hostile Identify data).
//!
//! The oracle is the driver's documented guarantee (docs/DESIGN.md, the
//! namespace changes and "Notice gaps" paragraphs), checked against the
//! model's namespaces as they are now:
//! - after a `refresh_namespaces` or a `reset` that returned `Ok` (no fault
//!   used, no hostile Identify data in place), every handle whose namespace
//!   changed in a way that matters (size, LBA size, metadata size or
//!   layout, PI, NGUID, or gone) is stale, and a submission on it is refused
//!   with `Reject::StaleNamespace` without reaching the model; after such a
//!   refresh `namespace(nsid)` has the model's geometry (or
//!   `NoSuchNamespace`), and what it reported added / removed / changed is
//!   consistent with the model;
//! - after a `poll_async_events` that read the Changed Namespace List, the
//!   same for every namespace that list named (every one when it was empty
//!   or overflowed); after one that re-read the Active Namespace ID list (a
//!   full check: after a reset, or in a notice gap), for every handle;
//! - a change the controller announced properly (listed and, with notices
//!   on, noticed) is followed within three polls once the faults are gone
//!   (checked at the end);
//! - a handle taken while it matched the model, whose namespace nothing
//!   touched since (no change, no fault used, no Format NVM, no hostile
//!   data), is never stale, and its commands succeed;
//! - a submission on a stale handle is always refused; every accepted
//!   command completes exactly once with its buffers; no panic, no hang,
//!   no DMA fault, no host protocol violation in the model.

#![no_main]

use std::collections::{HashMap, HashSet};

use libfuzzer_sys::fuzz_target;
use upnvme::{
    Controller, ControllerOptions, DmaBuffer, Error, FormatNvm, IoCommand, IoData, IoQueuePair,
    Namespace, QueuePairOptions, Reject, SecureErase,
};
use upnvme_fuzz::{Reader, options};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

/// NSIDs 1..=NSIDS exist (NN); the namespaces come and go among them.
const NSIDS: u32 = 4;
/// Most actions per input.
const MAX_ACTIONS: usize = 160;
/// Most handles the harness holds at once.
const MAX_HELD: usize = 12;
/// Bytes of each data buffer: two blocks of 4096 + 64 bytes of metadata.
const BUF_LEN: usize = 3 * 4096;

type Ctrl = Controller<ModelController>;
type Pair = IoQueuePair<ModelController>;

/// Namespace Not Ready (transient without DNR).
const NOT_READY: Status = Status::new(0, 0x82);
/// Command Interrupted (transient without DNR).
const INTERRUPTED: Status = Status::new(0, 0x21);

/// A handle the harness holds, with what had touched its namespace when it
/// was taken (`None`: it did not match the model then, so nothing is
/// promised about it).
struct Held {
    ns: Namespace,
    touch: Option<(u64, u64)>,
}

/// An accepted command.
struct InFlight {
    buf: u64,
    md: Option<u64>,
    /// It must succeed, unless something dirtied the controller or its
    /// namespace meanwhile (`dirt`, `epoch` as when it was submitted), or a
    /// reset ended it (the controller's reset count when it was submitted:
    /// a fatal status set before the submission is acted on by a later call,
    /// which resets and ends the commands in flight with ControllerReset).
    expect_ok: Option<(u64, u32, u64, u64)>,
    /// Sent on a current handle of a namespace that had changed (the
    /// driver not told yet: the window no notice closes): the model may
    /// see it move the old geometry's transfer (a DMA fault, a violation).
    old_geometry: bool,
}

struct Harness {
    m: ModelController,
    c: Ctrl,
    qp: Option<Pair>,
    held: Vec<Held>,
    /// Per NSID: bumped by whatever may legitimately retire its handles.
    epoch: [u64; NSIDS as usize + 1],
    /// Bumped by whatever may retire any handle (a fault used, the Active
    /// Namespace ID list overridden).
    global: u64,
    /// Bumped by whatever may fail an I/O command (a fault used, a reset,
    /// a Format NVM).
    dirt: u64,
    /// Per NSID: its last change was not announced properly (or hostile
    /// Identify data was in place): only a refresh or a reset must find it.
    quiet: [bool; NSIDS as usize + 1],
    /// Identify overrides in place: (CNS, NSID).
    overrides: HashSet<(u8, u32)>,
    pending_faults: usize,
    fna_all: bool,
    next_tag: u64,
    in_flight: HashMap<u64, InFlight>,
    pool: Vec<DmaBuffer>,
    md_pool: Vec<DmaBuffer>,
    owned: HashSet<u64>,
    /// DMA faults the model counted from commands sent with an old geometry.
    dma_faults_allowed: u64,
    /// A command with an old geometry was accepted during this action.
    old_geometry_sent: bool,
}

/// Whether handle `h` still describes the model's namespace `cfg` for I/O:
/// the fields `Namespace::same_namespace` compares.
fn matches_model(h: &Namespace, cfg: Option<&NamespaceConfig>) -> bool {
    let Some(cfg) = cfg else {
        return false;
    };
    let id = h.identify();
    let layout_same = cfg.ms == 0
        || ((id.flbas & 0x10 != 0) == cfg.extended
            && id.dps & 7 == cfg.pi_type
            && (id.dps & 8 != 0) == cfg.pi_first);
    h.lba_count() == cfg.blocks
        && h.lba_size() == cfg.lba_size
        && h.metadata_size() == cfg.ms
        && layout_same
        && id.nguid == cfg.nguid
}

fn ns_config(r: &mut Reader<'_>, nsid: u32, current: Option<NamespaceConfig>) -> NamespaceConfig {
    let base = current.unwrap_or(NamespaceConfig {
        nsid,
        lba_size: 512,
        blocks: 64,
        nguid: [nsid as u8; 16],
        ..NamespaceConfig::default()
    });
    let kind = r.below(8);
    let mut cfg = base;
    match kind {
        // Same geometry; identity from below.
        0 => {}
        // Resize.
        1 => cfg.blocks = 16 + u64::from(r.below(240)),
        // Another LBA size.
        2 => cfg.lba_size = if cfg.lba_size == 512 { 4096 } else { 512 },
        // Metadata / PI.
        3 | 4 => {
            cfg.ms = [0, 8, 16, 64][r.below(4) as usize];
            cfg.extended = r.bool();
            cfg.pi_type = if cfg.ms >= 8 { r.below(4) as u8 } else { 0 };
            cfg.pi_first = cfg.pi_type != 0 && r.bool();
        }
        // Anything.
        _ => {
            cfg.lba_size = if r.bool() { 512 } else { 4096 };
            cfg.blocks = 16 + u64::from(r.below(240));
            cfg.ms = [0, 0, 8, 16][r.below(4) as usize];
            cfg.extended = cfg.ms != 0 && r.bool();
            cfg.pi_type = if cfg.ms >= 8 { r.below(4) as u8 } else { 0 };
            cfg.pi_first = cfg.pi_type != 0 && r.bool();
        }
    }
    // Identity: kept (the same namespace, or created again with the same
    // NGUID), another, or none reported.
    match r.below(4) {
        0 => cfg.nguid = [r.u8(); 16],
        1 => cfg.nguid = [0; 16],
        _ => {}
    }
    cfg.nsid = nsid;
    cfg
}

impl Harness {
    fn truth(&self, nsid: u32) -> Option<NamespaceConfig> {
        self.m.namespace_config(nsid)
    }

    fn touch(&self, nsid: u32) -> (u64, u64) {
        (
            self.global,
            self.epoch.get(nsid as usize).copied().unwrap_or(0),
        )
    }

    fn bump(&mut self, nsid: u32) {
        if let Some(e) = self.epoch.get_mut(nsid as usize) {
            *e += 1;
        }
    }

    /// Faults the model used since the last look: each may retire any
    /// handle and fail any command.
    fn faults_used(&mut self) -> bool {
        let now = self.m.pending_faults().len();
        let used = now < self.pending_faults;
        self.pending_faults = now;
        if used {
            self.global += 1;
            self.dirt += 1;
        }
        used
    }

    fn hostile(&self) -> bool {
        !self.overrides.is_empty()
    }

    /// Every handle the harness or the controller holds.
    fn all_handles(&self) -> Vec<Namespace> {
        let mut v: Vec<Namespace> = self.held.iter().map(|h| h.ns.clone()).collect();
        v.extend(self.c.namespaces().iter().cloned());
        v
    }

    /// The driver has been told about the namespaces in `nsids` (all with
    /// `None`): every handle of one that changed in a way that matters is
    /// stale and refused.
    fn assert_told(&mut self, nsids: Option<&[u32]>, what: &str) {
        for h in self.all_handles() {
            if nsids.is_some_and(|l| !l.contains(&h.id())) {
                continue;
            }
            let cfg = self.truth(h.id());
            if !matches_model(&h, cfg.as_ref()) {
                assert!(
                    h.is_stale(),
                    "{what}: handle of namespace {} ({} blocks of {} + {} bytes, NGUID {:02x?}) \
                     not retired; the model has {cfg:?}",
                    h.id(),
                    h.lba_count(),
                    h.lba_size(),
                    h.metadata_size(),
                    &h.identify().nguid[..2],
                );
                self.probe_refused(&h, what);
            }
        }
    }

    /// A submission on stale handle `h` is refused before the model sees
    /// anything.
    fn probe_refused(&mut self, h: &Namespace, what: &str) {
        if self.qp.is_none() || self.c.failure().is_some() {
            return;
        }
        let Some(buf) = self.buffer() else { return };
        let iova = buf.iova();
        self.owned.remove(&iova);
        let fetched = self.m.commands_fetched();
        let tag = self.tag();
        let qp = self.qp.as_mut().expect("a pair");
        let res = qp.submit_io(
            IoCommand::Read {
                ns: h,
                slba: 0,
                blocks: 1,
            },
            IoData::buffer(buf),
            tag,
        );
        match res {
            Ok(()) => panic!("{what}: a Read on stale namespace {} was accepted", h.id()),
            Err(f) => {
                assert!(
                    matches!(f.reason, Reject::StaleNamespace { nsid } if nsid == h.id())
                        || self.c.failure().is_some(),
                    "{what}: stale namespace {} refused with {:?}",
                    h.id(),
                    f.reason
                );
                let b = f.buffer.expect("a refused command hands its buffer back");
                assert_eq!(b.iova(), iova);
                self.take_back(b);
            }
        }
        assert_eq!(
            self.io_fetched_since(fetched),
            0,
            "{what}: a refused command reached the model"
        );
    }

    /// A handle taken while it matched the model and whose namespace nothing
    /// touched since is not stale.
    fn assert_untouched_current(&self, when: &str) {
        for h in &self.held {
            if let Some(t) = h.touch
                && t == self.touch(h.ns.id())
            {
                assert!(
                    !h.ns.is_stale(),
                    "{when}: handle of namespace {} retired though nothing touched it",
                    h.ns.id()
                );
            }
        }
    }

    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    fn buffer(&mut self) -> Option<DmaBuffer> {
        if let Some(b) = self.pool.pop() {
            return Some(b);
        }
        let b = self.c.alloc_dma(BUF_LEN).ok()?;
        assert!(self.owned.insert(b.iova()), "allocator reused a live IOVA");
        Some(b)
    }

    fn md_buffer(&mut self) -> Option<DmaBuffer> {
        if let Some(b) = self.md_pool.pop() {
            return Some(b);
        }
        let b = self.c.alloc_dma(4096).ok()?;
        assert!(self.owned.insert(b.iova()), "allocator reused a live IOVA");
        Some(b)
    }

    /// A buffer comes (back) into the harness's hands.
    fn take_back(&mut self, b: DmaBuffer) {
        assert!(
            self.owned.insert(b.iova()),
            "buffer {:#x} handed out while the harness holds it",
            b.iova()
        );
        if b.len() == BUF_LEN {
            self.pool.push(b);
        } else {
            self.md_pool.push(b);
        }
    }

    /// I/O commands the model fetched since `commands_fetched` was `before`.
    fn io_fetched_since(&self, before: u64) -> usize {
        let n = (self.m.commands_fetched() - before) as usize;
        let recent = self.m.recent_commands();
        let n = n.min(recent.len());
        recent[recent.len() - n..]
            .iter()
            .filter(|(q, _)| *q != 0)
            .count()
    }

    fn reap(&mut self, max: u32) {
        let Some(qp) = self.qp.as_mut() else { return };
        let mut got = Vec::new();
        let res = qp.process_completions(max, |_, c| got.push(c));
        if let Ok(k) = res {
            assert_eq!(k as usize, got.len());
        }
        self.faults_used();
        for c in got {
            let f = self
                .in_flight
                .remove(&c.tag)
                .unwrap_or_else(|| panic!("tag {} completed twice or never submitted", c.tag));
            let b = c.buffer.expect("the buffer comes back");
            assert_eq!(
                b.iova(),
                f.buf,
                "tag {} came back with another buffer",
                c.tag
            );
            self.take_back(b);
            assert_eq!(c.metadata.as_ref().map(|m| m.iova()), f.md);
            if let Some(m) = c.metadata {
                self.take_back(m);
            }
            if let Some((dirt, nsid, epoch, resets)) = f.expect_ok
                && dirt == self.dirt
                && epoch == self.epoch[nsid as usize]
                && resets == self.c.resets()
            {
                assert!(
                    c.result.is_ok(),
                    "a command on unchanged namespace {nsid} failed: {:?}",
                    c.result
                );
            }
        }
    }

    /// Read or Write of one or two blocks on handle `h`.
    fn submit(&mut self, r: &mut Reader<'_>, h: Namespace, touch: Option<(u64, u64)>) {
        if self.qp.is_none() {
            return;
        }
        let Some(buf) = self.buffer() else { return };
        let blocks = 1 + r.below(2);
        let slba = if h.lba_count() > 2 {
            u64::from(r.u16()) % (h.lba_count() - 1)
        } else {
            0
        };
        let per_block = h.lba_size() as usize
            + if h.identify().flbas & 0x10 != 0 {
                h.metadata_size() as usize
            } else {
                0
            };
        let len = (blocks as usize * per_block).min(BUF_LEN);
        let separate_md = h.metadata_size() != 0 && h.identify().flbas & 0x10 == 0;
        let md = if separate_md { self.md_buffer() } else { None };
        let (buf_iova, md_iova) = (buf.iova(), md.as_ref().map(|m| m.iova()));
        self.owned.remove(&buf_iova);
        if let Some(i) = md_iova {
            self.owned.remove(&i);
        }
        let mut io = IoData::slice(buf, 0, len);
        if let Some(m) = md {
            io = io.metadata(m);
        }
        let cmd = if r.bool() {
            IoCommand::Read {
                ns: &h,
                slba,
                blocks,
            }
        } else {
            IoCommand::Write {
                ns: &h,
                slba,
                blocks,
            }
        };
        let stale = h.is_stale();
        if debug() {
            eprintln!(
                "submit on namespace {} ({} blocks of {} + {}, stale {stale}); the model has {:?}",
                h.id(),
                h.lba_count(),
                h.lba_size(),
                h.metadata_size(),
                self.truth(h.id())
            );
        }
        let fetched = self.m.commands_fetched();
        let tag = self.tag();
        let qp = self.qp.as_mut().expect("a pair");
        let res = qp.submit_io(cmd, io, tag);
        let failed = self.c.failure().is_some();
        self.faults_used();
        match res {
            Ok(()) => {
                assert!(
                    !stale,
                    "a command on stale namespace {} was accepted",
                    h.id()
                );
                let unchanged = touch.is_some_and(|t| t == self.touch(h.id()))
                    && h.metadata_size() == 0
                    && slba + u64::from(blocks) <= h.lba_count();
                let old_geometry = !matches_model(&h, self.truth(h.id()).as_ref());
                self.old_geometry_sent |= old_geometry;
                self.in_flight.insert(
                    tag,
                    InFlight {
                        buf: buf_iova,
                        md: md_iova,
                        old_geometry,
                        expect_ok: unchanged.then(|| {
                            (
                                self.dirt,
                                h.id(),
                                self.epoch[h.id() as usize],
                                self.c.resets(),
                            )
                        }),
                    },
                );
            }
            Err(f) => {
                if debug() {
                    eprintln!("  refused: {:?}", qp_describe(self.qp.as_ref(), f.reason));
                }
                // A pair that cannot take commands (its queues not
                // re-created after a reset, the controller not marked failed:
                // "the next submit tries again") refuses before it looks at
                // the handle; nothing is sent either way (checked below).
                if stale && !failed {
                    assert!(
                        matches!(f.reason, Reject::StaleNamespace { .. } | Reject::Unusable),
                        "stale namespace {} refused with {:?}",
                        h.id(),
                        f.reason
                    );
                }
                if !stale {
                    assert!(
                        !matches!(f.reason, Reject::StaleNamespace { .. }),
                        "current handle of namespace {} refused as stale",
                        h.id()
                    );
                }
                if stale {
                    assert_eq!(
                        self.io_fetched_since(fetched),
                        0,
                        "a refused command on a stale handle reached the model"
                    );
                }
                let b = f.buffer.expect("a refused command hands its buffer back");
                assert_eq!(b.iova(), buf_iova);
                self.take_back(b);
                assert_eq!(f.metadata.as_ref().map(|m| m.iova()), md_iova);
                if let Some(m) = f.metadata {
                    self.take_back(m);
                }
            }
        }
    }

    fn take_handle(&mut self, nsid: u32) {
        let Ok(ns) = self.c.namespace(nsid) else {
            return;
        };
        let ns = ns.clone();
        let touch =
            (!ns.is_stale() && !self.hostile() && matches_model(&ns, self.truth(nsid).as_ref()))
                .then(|| self.touch(nsid));
        if self.held.len() >= MAX_HELD {
            self.held.remove(0);
        }
        self.held.push(Held { ns, touch });
    }

    fn poll(&mut self, what: &str) -> bool {
        let listed = self.m.changed_namespace_list();
        let before = self.m.commands_fetched();
        let resets = self.c.resets();
        let res = self.c.poll_async_events();
        let used = self.faults_used();
        let sent = (self.m.commands_fetched() - before) as usize;
        let Ok(_events) = res else { return false };
        // A fatal status met during the check resets the controller and
        // cuts the check (the next poll checks every handle): no promise.
        if used || self.hostile() || self.c.failure().is_some() || self.c.resets() != resets {
            return true;
        }
        let recent = self.m.recent_commands();
        if sent > recent.len() {
            return true;
        }
        if debug() {
            eprintln!(
                "  poll: {:?}, resets {}, failure {:?}",
                _events,
                self.c.resets(),
                self.c.failure()
            );
            for (q, sqe) in &recent[recent.len() - sent..] {
                eprintln!(
                    "  poll sent: SQ {q} opcode {:#04x} NSID {} CDW10 {:#x}",
                    sqe[0],
                    u32::from_le_bytes([sqe[4], sqe[5], sqe[6], sqe[7]]),
                    u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]])
                );
            }
        }
        let mut read_list = false;
        let mut full = false;
        for (q, sqe) in &recent[recent.len() - sent..] {
            let cdw10 = u32::from_le_bytes([sqe[40], sqe[41], sqe[42], sqe[43]]);
            if *q == 0 && sqe[0] == 0x02 && cdw10 & 0xff == 0x04 {
                read_list = true;
            }
            if *q == 0 && sqe[0] == 0x06 && cdw10 & 0xff == 0x02 {
                full = true;
            }
        }
        if full {
            self.assert_told(None, &format!("{what} (a full check)"));
        } else if read_list {
            match listed {
                Some(ids) if !ids.is_empty() => {
                    self.assert_told(Some(&ids), &format!("{what} (list {ids:?})"))
                }
                _ => self.assert_told(None, &format!("{what} (list empty or overflowed)")),
            }
        }
        true
    }

    fn refresh(&mut self) {
        // Handles current before, and whether they still matched the model.
        let before: Vec<(u32, bool)> = self
            .c
            .namespaces()
            .iter()
            .filter(|h| !h.is_stale())
            .map(|h| (h.id(), matches_model(h, self.truth(h.id()).as_ref())))
            .collect();
        let res = self.c.refresh_namespaces();
        let used = self.faults_used();
        let Ok(changes) = res else { return };
        if used || self.hostile() {
            return;
        }
        self.assert_told(None, "refresh_namespaces");
        // A namespace the model formatted to fewer bytes than one block has
        // NSZE 0 (as QEMU's would): the driver calls it unusable, as it
        // calls a detached one, and lists it neither added nor kept.
        let empty = |h: &Self, nsid: u32| h.truth(nsid).is_some_and(|c| c.blocks == 0);
        let usable = |h: &Self, nsid: u32| h.truth(nsid).filter(|c| c.blocks != 0);
        for nsid in 1..=NSIDS {
            match (usable(self, nsid), self.c.namespace(nsid)) {
                (Some(cfg), Ok(h)) => {
                    assert!(
                        matches_model(h, Some(&cfg)) && !h.is_stale(),
                        "after a refresh, namespace({nsid}) says {} blocks of {} + {} (stale {}), \
                         the model {cfg:?}",
                        h.lba_count(),
                        h.lba_size(),
                        h.metadata_size(),
                        h.is_stale()
                    );
                }
                (Some(cfg), Err(e)) => {
                    panic!("after a refresh, namespace({nsid}) failed ({e}); the model has {cfg:?}")
                }
                (None, Ok(h)) => panic!(
                    "after a refresh, namespace({nsid}) gives a handle (stale {}) of a namespace \
                     the model does not have",
                    h.is_stale()
                ),
                (None, Err(e)) => assert!(
                    matches!(e, Error::NoSuchNamespace { .. })
                        || (empty(self, nsid) && matches!(e, Error::UnusableNamespace { .. })),
                    "namespace({nsid}) of a detached namespace: {e}"
                ),
            }
        }
        for n in &changes.added {
            assert!(
                usable(self, *n).is_some(),
                "added {n}, which the model lacks"
            );
        }
        for n in &changes.removed {
            assert!(
                usable(self, *n).is_none(),
                "removed {n}, which the model has"
            );
        }
        for (n, matched) in before {
            if !matched {
                assert!(
                    changes.changed.contains(&n) || changes.removed.contains(&n),
                    "namespace {n} changed but the refresh reported {changes:?}"
                );
            }
        }
        self.quiet = Default::default();
    }

    fn reset(&mut self) {
        self.dirt += 1;
        let res = self.c.reset();
        let used = self.faults_used();
        if res.is_ok() {
            assert!(self.c.failure().is_none(), "failed after a good reset");
            if !used && !self.hostile() {
                self.assert_told(None, "reset");
                self.quiet = Default::default();
            }
        }
    }

    fn change(&mut self, r: &mut Reader<'_>) {
        let nsid = 1 + r.below(NSIDS);
        let current = self.truth(nsid);
        let cfg = if current.is_some() && r.below(4) == 0 {
            None
        } else {
            Some(ns_config(r, nsid, current))
        };
        let (listed, notice) = match r.below(8) {
            0 => (false, true),
            1 => (true, false),
            2 => (false, false),
            _ => (true, true),
        };
        self.m
            .change_namespace_unannounced(nsid, cfg, listed, notice);
        // (The model drops its Identify override only when it formats an
        // attached namespace.)
        if self.overrides.remove(&(0, nsid)) {
            self.m.set_identify_data(0, nsid, None);
        }
        self.bump(nsid);
        self.quiet[nsid as usize] = !(listed && notice);
    }

    fn fault(&mut self, r: &mut Reader<'_>) {
        if self.pending_faults >= 3 {
            return;
        }
        let on = match r.below(5) {
            0 => Match::Opcode {
                qid: 0,
                opcode: 0x02,
            },
            1 => Match::Opcode {
                qid: 0,
                opcode: 0x06,
            },
            2 => Match::Identify { cns: 2, nsid: 0 },
            _ => Match::Identify {
                cns: 0,
                nsid: 1 + r.below(NSIDS),
            },
        };
        let fault = match r.below(8) {
            0 => Fault::DropCompletion(on),
            1 => Fault::FatalOn(on),
            2 => Fault::Status {
                on,
                status: NOT_READY,
            },
            3 => Fault::Status {
                on,
                status: INTERRUPTED,
            },
            4 => Fault::Status {
                on,
                status: Status::INVALID_FIELD.with_dnr(),
            },
            5 => Fault::Status {
                on,
                status: Status::INVALID_NAMESPACE.with_dnr(),
            },
            _ => Fault::Status {
                on,
                status: Status::INTERNAL_ERROR,
            },
        };
        self.m.inject(fault);
        self.pending_faults = self.m.pending_faults().len();
    }

    fn hostile_identify(&mut self, r: &mut Reader<'_>) {
        self.global += 1;
        match r.below(4) {
            0 => {
                // The Active Namespace ID list names other NSIDs.
                let mut page = Vec::new();
                for _ in 0..r.below(6) {
                    page.extend_from_slice(&(r.below(NSIDS + 2)).to_le_bytes());
                }
                self.m.set_identify_data(2, 0, Some(page));
                self.overrides.insert((2, 0));
                self.quiet = [true; NSIDS as usize + 1];
            }
            1 => {
                for (cns, nsid) in self.overrides.drain() {
                    self.m.set_identify_data(cns, nsid, None);
                }
                self.quiet = [true; NSIDS as usize + 1];
            }
            _ => {
                // Identify Namespace says something else than the namespace is.
                let nsid = 1 + r.below(NSIDS);
                let mut page = vec![0u8; 384];
                page[..8].copy_from_slice(&u64::from(r.below(300)).to_le_bytes());
                page.copy_within(..8, 8);
                page[25] = r.below(16) as u8; // NLBAF
                page[26] = r.u8(); // FLBAS
                page[29] = r.u8() & 0xf; // DPS
                page[104] = r.u8(); // NGUID
                for i in 0..4 {
                    let ms = [0u16, 8, 16, 64][r.below(4) as usize];
                    let lbads = [9u8, 12, 0, 40][r.below(4) as usize];
                    let at = 128 + 4 * i;
                    page[at..at + 2].copy_from_slice(&ms.to_le_bytes());
                    page[at + 2] = lbads;
                }
                if r.below(4) == 0 {
                    let at = r.below(384) as usize;
                    page[at] = r.u8();
                }
                self.m.set_identify_data(0, nsid, Some(page));
                self.overrides.insert((0, nsid));
                self.bump(nsid);
                self.quiet[nsid as usize] = true;
            }
        }
    }

    fn format(&mut self, r: &mut Reader<'_>) {
        let nsid = 1 + r.below(NSIDS);
        let lbaf = r.below(9) as u8;
        let pi_type = if r.below(3) == 0 { r.below(4) as u8 } else { 0 };
        let fmt = FormatNvm {
            lbaf,
            extended: r.bool(),
            pi_type,
            pi_first: r.bool(),
            secure_erase: SecureErase::None,
            timeout: None,
        };
        let before: Vec<Namespace> = self
            .all_handles()
            .into_iter()
            .filter(|h| self.fna_all || h.id() == nsid)
            .collect();
        if self.fna_all {
            for n in 1..=NSIDS {
                self.bump(n);
            }
        } else {
            self.bump(nsid);
        }
        self.dirt += 1;
        let fetched = self.m.commands_fetched();
        let res = self.c.format_nvm(nsid, &fmt);
        // Whether the Format NVM reached the controller: a refusal before it
        // (the checks, or an unusable namespace's Identify on a controller
        // that failed earlier) changed nothing, and may leave the handles
        // current.
        let sent = self
            .m
            .commands_seen()
            .iter()
            .skip(usize::try_from(fetched).unwrap_or(usize::MAX))
            .any(|&(sq, opcode, _)| sq == 0 && opcode == 0x80);
        if debug() {
            eprintln!("  format {nsid}: {res:?}");
        }
        let used = self.faults_used();
        if matches!(res, Err(Error::InvalidArgument(_))) || self.truth(nsid).is_none() {
            return;
        }
        if let Err(Error::NoSuchNamespace { .. } | Error::UnusableNamespace { .. }) = res {
            return;
        }
        for h in before {
            if sent && (h.id() == nsid || self.fna_all) {
                assert!(
                    h.is_stale(),
                    "a handle of namespace {} taken before Format NVM ({res:?}) is current",
                    h.id()
                );
            }
        }
        if let Ok(ns) = &res
            && !used
            && !self.hostile()
        {
            let cfg = self.truth(nsid);
            assert!(
                matches_model(ns, cfg.as_ref()) && !ns.is_stale(),
                "Format NVM's handle of {nsid}: {} blocks of {} + {}; the model {cfg:?}",
                ns.lba_count(),
                ns.lba_size(),
                ns.metadata_size()
            );
        }
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        let action = r.below(24);
        if debug() {
            eprintln!("action {action}");
        }
        match action {
            0..=3 => self.change(r),
            4 => self.m.raise_async_event(2, 0x00, 0x04),
            5 => match r.below(3) {
                // Firmware Activation Starting (masks every Notice until log
                // 03h is read) or a SMART / Health event.
                0 => self.m.raise_async_event(2, 0x01, 0x03),
                1 => self.m.raise_async_event(1, 0x00, 0x02),
                _ => {
                    // The Changed Namespace List overflows (or names NSIDs
                    // that are not attached).
                    let n = if r.bool() { 1025 } else { 1 + r.below(4) };
                    for k in 0..n {
                        let nsid = if n > 4 { 100 + k } else { NSIDS + 1 + k };
                        self.m.change_namespace_unannounced(nsid, None, true, false);
                    }
                    if r.bool() {
                        self.m.raise_async_event(2, 0x00, 0x04);
                    }
                }
            },
            6..=8 => {
                self.poll("poll_async_events");
            }
            9 | 10 => self.refresh(),
            11 => self.reset(),
            12 | 13 => {
                let nsid = 1 + r.below(NSIDS);
                self.take_handle(nsid);
            }
            14..=16 => {
                let (ns, touch) = match r.below(3) {
                    0 => {
                        let all = self.c.namespaces();
                        if all.is_empty() {
                            return;
                        }
                        let ns = all[r.below(all.len() as u32) as usize].clone();
                        (ns, None)
                    }
                    _ => {
                        if self.held.is_empty() {
                            return;
                        }
                        let h = &self.held[r.below(self.held.len() as u32) as usize];
                        (h.ns.clone(), h.touch)
                    }
                };
                self.submit(r, ns, touch);
            }
            17 | 18 => self.reap(u32::MAX),
            19 => self.fault(r),
            20 => self.hostile_identify(r),
            21 => self.format(r),
            22 => {
                let res = match r.below(3) {
                    // The application reads the Changed Namespace List itself.
                    0 => self.c.get_log_page(0x04, 0xffff_ffff, 4096, 0).map(|_| ()),
                    1 => self.c.get_log_page(0x03, 0xffff_ffff, 512, 0).map(|_| ()),
                    // Asynchronous Event Configuration with or without the
                    // Namespace Attribute Notices.
                    _ => {
                        let aec = if r.bool() { 0x100 } else { 0 };
                        self.c.set_features(0x0b, aec, false).map(|_| ())
                    }
                };
                let _ = res;
                self.faults_used();
            }
            _ => {
                // A controller fatal error (the pair's next call resets).
                if r.below(4) == 0 {
                    if debug() {
                        eprintln!("  fatal");
                    }
                    self.m.set_fatal();
                    self.dirt += 1;
                    self.global += 1;
                }
            }
        }
        self.faults_used();
        self.assert_untouched_current(&format!("action {action}"));
        self.check_model(&format!("action {action}"));
    }

    /// No DMA fault, no host protocol violation — but from a command sent
    /// with a namespace's old geometry before the driver was told of the
    /// change (docs/DESIGN.md: what no notice can close).
    fn check_model(&mut self, when: &str) {
        let window = std::mem::take(&mut self.old_geometry_sent)
            || self.in_flight.values().any(|f| f.old_geometry);
        if window {
            self.dma_faults_allowed = self.m.dma_faults();
            self.m.take_violations();
        }
        let v = self.m.violations();
        assert!(v.is_empty(), "model violations after {when}: {v:?}");
        assert_eq!(
            self.m.dma_faults(),
            self.dma_faults_allowed,
            "DMA fault after {when}: {:?}",
            self.m.dma_fault_log()
        );
    }

    /// The faults go, the driver polls three times and refreshes: every
    /// announced change is followed; then every command ends once.
    fn finish(&mut self) {
        self.m.clear_faults();
        self.pending_faults = 0;
        if !self.overrides.is_empty() {
            for (cns, nsid) in self.overrides.drain() {
                self.m.set_identify_data(cns, nsid, None);
            }
            self.quiet = [true; NSIDS as usize + 1];
            self.global += 1;
        }
        if self.c.failure().is_some() || self.m.csts() & 2 != 0 {
            self.reset();
        }
        let mut polled = 0;
        for _ in 0..3 {
            if self.poll("final poll") {
                polled += 1;
            }
        }
        if polled == 3 && self.c.failure().is_none() {
            for h in self.all_handles() {
                let cfg = self.truth(h.id());
                if !self.quiet[h.id() as usize] && !matches_model(&h, cfg.as_ref()) {
                    assert!(
                        h.is_stale(),
                        "namespace {}'s change was announced (listed, noticed) but three polls \
                         left its handle current ({} blocks of {} + {}, the model {cfg:?})",
                        h.id(),
                        h.lba_count(),
                        h.lba_size(),
                        h.metadata_size()
                    );
                }
            }
        }
        self.refresh();
        self.reap(u32::MAX);
        // A reset ends every command still in flight, once.
        if !self.in_flight.is_empty() && self.qp.is_some() {
            self.reset();
            for _ in 0..4 {
                self.reap(u32::MAX);
            }
            assert!(
                self.in_flight.is_empty(),
                "{} commands never completed",
                self.in_flight.len()
            );
        }
        self.check_model("the end");
    }
}

/// `UPNVME_FUZZ_DEBUG=1`: print the actions.
fn debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var("UPNVME_FUZZ_DEBUG").is_ok_and(|v| v == "1"))
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    // NN is 4: namespace 4 exists at first so that it is counted.
    let mut namespaces = Vec::new();
    let present = r.u8() | 0x08;
    for nsid in 1..=NSIDS {
        if present & (1 << (nsid - 1)) != 0 {
            namespaces.push(ns_config(&mut r, nsid, None));
        }
    }
    let fna_all = r.below(8) == 0;
    let cfg = ModelConfig {
        namespaces,
        fna: u8::from(fna_all),
        ..ModelConfig::default()
    };
    let Ok(m) = ModelController::try_new(cfg) else {
        return;
    };
    if present & 0x08 == 0 || r.below(4) == 0 {
        m.change_namespace(4, None);
    }
    let opts = ControllerOptions {
        async_events: [4, 1, 1, 0][r.below(4) as usize],
        ..options()
    };
    let c = match Controller::with_device(m.clone(), opts) {
        Ok(c) => c,
        Err(e) => panic!("bring-up on a healthy model failed: {e}"),
    };
    let qp = c.io_queue_pair(QueuePairOptions::default()).ok();
    let mut h = Harness {
        m,
        c,
        qp,
        held: Vec::new(),
        epoch: Default::default(),
        global: 0,
        dirt: 0,
        quiet: Default::default(),
        overrides: HashSet::new(),
        pending_faults: 0,
        fna_all,
        next_tag: 0,
        in_flight: HashMap::new(),
        pool: Vec::new(),
        md_pool: Vec::new(),
        owned: HashSet::new(),
        dma_faults_allowed: 0,
        old_geometry_sent: false,
    };
    for _ in 0..MAX_ACTIONS {
        if r.is_empty() {
            break;
        }
        h.step(&mut r);
    }
    h.finish();
});

fn qp_describe(qp: Option<&upnvme::IoQueuePair<ModelController>>, r: Reject) -> String {
    qp.map(|q| q.describe(r).to_string()).unwrap_or_default()
}

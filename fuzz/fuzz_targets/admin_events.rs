//! `admin_events`: the admin side of the driver against a hostile in-memory
//! controller. Actions decoded from the fuzzer's bytes: admin passthrough
//! (any opcode — the refused ones included — with or without data, data
//! lengths short, exact and long, timeouts of 0–300 µs, the admin timeout or
//! longer, through the controller or an [`AdminHandle`]); Get Log Page (Error
//! Information, SMART / Health, Firmware Slot, Changed Namespace List, any
//! LID, lengths and offsets good and bad); Get / Set Features; Identify;
//! Abort of commands the model fetched (I/O, admin, Asynchronous Event
//! Requests) or of made-up CIDs; `poll_async_events` and the model's
//! asynchronous events; controller resets; the model's one-shot faults on
//! the admin queue (dropped, delayed, duplicated completions, corrupt CID,
//! bad SQ head, wrong phase, error statuses, fatal status, unplug) and on
//! the I/O queue; a fatal status set at any time — interleaved with Reads
//! and Writes on one I/O queue pair (a command timeout from the input, so
//! that its recovery sends Aborts and resets) and reaps.
//!
//! Checked after every action:
//! - no panic, no hang (every loop here is bounded; libFuzzer's `-timeout`
//!   catches a driver that spins), and every call returns within its bound
//!   (its timeout, twice for an application command that may wait for a
//!   command identifier first, plus what a reset inside it may take, plus
//!   slack);
//! - a refused call (`InvalidArgument`) sent nothing to the model; the
//!   refused passthrough opcodes and a timeout of zero are refused;
//! - `DeviceFault` and `Timeout` leave the controller failed; while it is
//!   failed (and not reset) every call errors and writes no doorbell; a
//!   controller the model made fatal errors at the next admin command;
//!   `Ok` from `reset` leaves it usable;
//! - with no fault consumed since the last reset and none pending, the
//!   driver's admin calls that are valid for the model succeed;
//! - no application admin command is refused with `AdminBusy` (one thread:
//!   no other application command can hold an identifier) while the driver
//!   has not been fooled about a command identifier;
//! - an event `poll_async_events` returns was raised by the harness (or is
//!   the driver's own Namespace Attribute Changed), and no event is returned
//!   more often than it was raised (unless a corrupt CID made a completion
//!   look like one);
//! - every I/O tag is delivered at most once, with its buffer; a refused
//!   command hands its buffer back;
//! - the model saw no DMA to unmapped memory and no host protocol violation
//!   (but those a device fault causes: a full CQ after a duplicate or
//!   wrong-phase entry, a CID the controller still holds reused after a
//!   corrupt CID made the driver complete the wrong command).
//!
//! At the end (faults gone): the controller is reset if it failed; then the
//! admin queue runs its full depth of application commands at once — one
//! thread per command identifier the driver leaves to the application
//! (entries − 1, less two for its own commands, less its Asynchronous Event
//! Requests), each held by the model until all are in — and a command of the
//! driver's own beside them: no identifier leaked. A last reset then
//! delivers every I/O command still in flight exactly once.

#![no_main]

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use upnvme::{
    AdminHandle, Controller, DmaBuffer, Error, IoCommand, IoQueuePair, Namespace, QueuePairOptions,
    Sqe,
};
use upnvme_fuzz::{Reader, options};
use upnvme_tests::{
    Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status as ModelStatus,
};

/// Most actions per input.
const MAX_ACTIONS: usize = 200;
/// Blocks of the one namespace (512-byte LBAs).
const NS_BLOCKS: u64 = 64;
/// Most faults pending at once.
const MAX_PENDING_FAULTS: usize = 4;
/// What a call may take beyond its bounds: scheduling on a loaded machine
/// under ASan (a call of 100 µs was seen to take 980 ms with two other
/// fuzzers and a build sharing two cores). Still far below libFuzzer's 10 s
/// hang limit and far above the admin timeouts used here (2–5 ms; 20 ms for a
/// passthrough): a wait that ignored its bound (the 5 s default admin
/// timeout, say) is caught.
const SLACK: Duration = Duration::from_secs(3);
/// Bound of each application command in the end-of-run full-depth check.
const DEPTH_TIMEOUT: Duration = Duration::from_secs(1);

type Ctrl = Controller<ModelController>;
type Pair = IoQueuePair<ModelController>;
/// What an admin passthrough returns.
type PassthroughResult = upnvme::error::Result<(upnvme::Cqe, Vec<u8>)>;

/// Admin opcodes `admin_passthrough` refuses (the driver owns them), with
/// their CDW10 where that decides (Set Features of Number of Queues and Host
/// Memory Buffer; Keep Alive Timer with a non-zero KATO is CDW11).
const REFUSED: [(u8, u32); 13] = [
    (0x00, 0),    // Delete I/O SQ
    (0x01, 0),    // Create I/O SQ
    (0x04, 0),    // Delete I/O CQ
    (0x05, 0),    // Create I/O CQ
    (0x0c, 0),    // Asynchronous Event Request
    (0x7c, 0),    // Doorbell Buffer Config
    (0x45, 0),    // Controller Data Queue
    (0x80, 0),    // Format NVM
    (0x0d, 0),    // Namespace Management
    (0x15, 0),    // Namespace Attachment
    (0x09, 0x07), // Set Features, Number of Queues
    (0x09, 0x0d), // Set Features, Host Memory Buffer
    (0x09, 0x0f), // Set Features, Keep Alive Timer (with CDW11 non-zero)
];

/// Whether `admin_passthrough` refuses opcode `op` with these CDW10 and
/// CDW11 (the driver's own commands, `passthrough_refusal`).
fn refused(op: u8, cdw10: u32, cdw11: u32) -> bool {
    match op {
        0x09 => match cdw10 & 0xff {
            0x07 | 0x0d => true,
            0x0f => cdw11 != 0,
            _ => false,
        },
        _ => REFUSED.iter().any(|&(o, _)| o == op && o != 0x09),
    }
}

/// What one admin call is expected to do, for the checks after it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Valid for the model: succeeds on a clean, usable controller.
    Ok,
    /// Refused before anything is sent (`InvalidArgument`).
    Refused,
    /// Anything (the model may refuse it with a status).
    Any,
}

/// An admin call's outcome, reduced to what the checks look at.
struct Outcome {
    res: Result<(), Error>,
    /// Its bound: the timeout it was given (or the admin timeout).
    timeout: Duration,
    /// It may wait for a command identifier first (an application command
    /// waited for without the admin lock), then for its completion.
    detached: bool,
    expect: Expect,
    /// A call that sends a command (not `poll_async_events`, which only
    /// reaps): on a fatal controller it must fail.
    sends: bool,
}

struct Harness {
    m: ModelController,
    c: Ctrl,
    handle: AdminHandle<ModelController>,
    qp: Option<Pair>,
    ns: Namespace,
    admin_timeout: Duration,
    ready_timeout: Duration,
    /// Command identifiers of the admin queue (entries − 1).
    slots: u32,
    /// Asynchronous Event Requests the driver keeps posted on a fresh queue:
    /// min(async_events, AERL + 1, slots − 2).
    aers: u32,
    // I/O bookkeeping.
    next_tag: u64,
    in_flight: HashMap<u64, u64>,
    delivered: HashSet<u64>,
    pool: Vec<DmaBuffer>,
    owned: HashSet<u64>,
    // Fault bookkeeping.
    /// The model's pending faults after the last look.
    pending: Vec<Fault>,
    /// A fault was consumed since the last good reset.
    tainted: bool,
    /// A corrupt CID was consumed since the last good reset: the driver may
    /// have completed the wrong command, and reused an identifier the
    /// controller still holds.
    cid_confused: bool,
    /// A corrupt CID was ever consumed: an event may be a completion taken
    /// for an AER's (kept across resets by the driver).
    events_untrusted: bool,
    /// A duplicate or wrong-phase completion was ever consumed: the model
    /// may find a CQ full.
    cq_overfilled: bool,
    /// A fault that may hit an Asynchronous Event Request was injected
    /// since the last good reset (or is still pending): the driver may hold
    /// an AER's identifier the controller forgot.
    aer_maybe_hit: bool,
    /// Events raised and not yet returned, by completion dword 0.
    raised: HashMap<u32, u32>,
}

/// Whether `f` may hit an Asynchronous Event Request (or anything on the
/// admin queue the harness does not wait for).
fn wild(f: &Fault) -> bool {
    let on = match *f {
        Fault::DropCompletion(m)
        | Fault::DuplicateCompletion(m)
        | Fault::WrongPhase(m)
        | Fault::FatalOn(m)
        | Fault::RewriteSqe(m)
        | Fault::UnplugOn(m) => m,
        Fault::DelayCompletion { on, .. }
        | Fault::CorruptCid { on, .. }
        | Fault::BadSqHead { on, .. }
        | Fault::Status { on, .. }
        | Fault::ChangeNamespaceOn { on, .. } => on,
        Fault::NeverReady | Fault::Wedged | Fault::NeverShutdownComplete => return false,
    };
    matches!(
        on,
        Match::Next
            | Match::Queue(0)
            | Match::Nth(_)
            | Match::Opcode {
                qid: 0,
                opcode: 0x0c
            }
    )
}

/// `before` less `after`, as multisets: the faults consumed in between.
fn consumed(before: &[Fault], after: &[Fault]) -> Vec<Fault> {
    let mut left: Vec<Fault> = after.to_vec();
    let mut gone = Vec::new();
    for f in before {
        match left.iter().position(|g| g == f) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => gone.push(*f),
        }
    }
    gone
}

fn model_status(r: &mut Reader<'_>) -> ModelStatus {
    match r.below(8) {
        0 => ModelStatus::INVALID_FIELD.with_dnr(),
        1 => ModelStatus::INTERNAL_ERROR,
        2 => ModelStatus::ABORT_REQUESTED,
        3 => ModelStatus::AER_LIMIT_EXCEEDED,
        4 => ModelStatus::INVALID_LOG_PAGE.with_dnr(),
        5 => ModelStatus::new(r.below(8) as u8, r.u8()).with_dnr(),
        _ => ModelStatus::new(r.below(8) as u8, r.u8()),
    }
}

impl Harness {
    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// The bound of a call: its timeout (twice when it may first wait for
    /// an identifier), a reset it may run (after a fatal status: deletions,
    /// disable, enable, its admin commands, the namespace check), and slack.
    fn bound(&self, timeout: Duration, detached: bool) -> Duration {
        let waits = if detached { 2 } else { 1 };
        timeout * waits + self.admin_timeout * 16 + self.ready_timeout * 2 + SLACK
    }

    /// Looks at the faults the model consumed since the last look; returns
    /// them.
    fn faults_used(&mut self) -> Vec<Fault> {
        let now = self.m.pending_faults();
        let gone = consumed(&self.pending, &now);
        for &f in &gone {
            if debug() {
                eprintln!("  consumed {f:?}");
            }
            self.tainted = true;
            match f {
                Fault::CorruptCid { .. } => {
                    self.cid_confused = true;
                    self.events_untrusted = true;
                }
                Fault::DuplicateCompletion(_) | Fault::WrongPhase(_) => self.cq_overfilled = true,
                // A success status forced on an Asynchronous Event Request
                // completes it as an event (dword 0 zero: Error status,
                // Write to Invalid Doorbell Register) the harness did not
                // raise.
                Fault::Status { status, .. } if status.0 & 0x7ff == 0 && wild(&f) => {
                    self.events_untrusted = true;
                }
                _ => {}
            }
        }
        self.pending = now;
        gone
    }

    /// The controller was reset (by the harness or inside a call) and is
    /// usable: what faults left behind is gone with the old admin queue, but
    /// for `used`, the faults consumed during the call (they may have hit
    /// the reset's own commands, its Asynchronous Event Requests among them)
    /// and those still pending.
    fn after_good_reset(&mut self, used: &[Fault]) {
        self.tainted = !self.pending.is_empty() || !used.is_empty();
        self.cid_confused = used.iter().any(|f| matches!(f, Fault::CorruptCid { .. }));
        self.aer_maybe_hit = self.pending.iter().chain(used).any(wild);
    }

    /// Whether nothing that could make a valid admin call fail is in play.
    fn clean(&self) -> bool {
        !self.tainted
            && self.pending.is_empty()
            && self.c.failure().is_none()
            && self.m.csts() & 2 == 0
            && !self.m.is_unplugged()
    }

    /// Runs admin call `call` and checks what every admin call promises.
    fn admin(&mut self, what: &str, call: impl FnOnce(&mut Harness) -> Outcome) {
        let failed_before = self.c.failure().is_some();
        let fatal_before = self.m.csts() & 2 != 0 || self.m.is_unplugged();
        let clean_before = self.clean();
        let resets_before = self.c.resets();
        let fetched_before = self.m.commands_fetched();
        let doorbells_before = self.m.total_doorbell_writes();
        let start = Instant::now();
        let out = call(self);
        let took = start.elapsed();
        let used = self.faults_used();
        if debug() {
            eprintln!("  {what}: {:?} in {took:?}", out.res);
        }
        let bound = self.bound(out.timeout, out.detached);
        assert!(
            took <= bound,
            "{what} took {took:?}, more than its bound {bound:?}: {:?}",
            out.res
        );
        let reset_inside = self.c.resets() != resets_before;
        match &out.res {
            Ok(()) => {
                assert!(
                    out.expect != Expect::Refused,
                    "{what}: accepted, but it must be refused"
                );
                assert!(
                    !failed_before || reset_inside,
                    "{what}: Ok from a failed controller"
                );
                assert!(
                    !(fatal_before && out.sends),
                    "{what}: Ok from a controller with CSTS.CFS set (or unplugged)"
                );
            }
            Err(e) => {
                let _ = e.to_string();
                match e {
                    Error::InvalidArgument(why) => {
                        assert!(
                            out.expect != Expect::Ok,
                            "{what}: a valid call refused: {why}"
                        );
                        assert_eq!(
                            self.m.commands_fetched(),
                            fetched_before,
                            "{what}: refused ({why}) but a command reached the model"
                        );
                    }
                    Error::DeviceFault { .. } | Error::Timeout { .. } => {
                        assert!(
                            self.c.failure().is_some(),
                            "{what}: {e} without a failed controller"
                        );
                    }
                    Error::AdminBusy { .. } => {
                        assert!(
                            self.cid_confused,
                            "{what}: AdminBusy with no other application command in flight: \
                             an admin command identifier leaked ({e})"
                        );
                    }
                    _ => {}
                }
                if out.expect == Expect::Refused {
                    assert!(
                        matches!(e, Error::InvalidArgument(_)) || failed_before,
                        "{what}: refused with {e}, not InvalidArgument"
                    );
                }
                if out.expect == Expect::Ok
                    && clean_before
                    && !matches!(e, Error::InvalidArgument(_))
                {
                    panic!("{what}: failed on a clean controller: {e}");
                }
            }
        }
        if failed_before && !reset_inside {
            assert_eq!(
                self.m.total_doorbell_writes(),
                doorbells_before,
                "{what}: doorbell written on a failed controller"
            );
        }
        if reset_inside && self.c.failure().is_none() {
            self.after_good_reset(&used);
        }
    }

    /// An SQE for the passthrough, with the data length it needs.
    fn passthrough_sqe(&mut self, r: &mut Reader<'_>) -> (Sqe, usize, Expect) {
        let mut cdw = [0u32; 6];
        match r.below(12) {
            // Identify: CNS 00h/01h/02h/05h or any.
            0 | 1 => {
                let cns = [0u32, 1, 2, 5, r.u8().into()][r.below(5) as usize];
                let nsid = [0u32, 1, 2, 0xffff_ffff][r.below(4) as usize];
                cdw[0] = cns;
                let known = (cns == 1 && nsid == 0)
                    || (cns == 0 && nsid == 1)
                    || (cns == 2 && nsid < 0xffff_fffe);
                let sqe = Sqe::passthrough(0x06, nsid, [0, 0], cdw);
                let len = match r.below(4) {
                    0 => r.below(4096) as usize,
                    1 => 8192,
                    _ => 4096,
                };
                let expect = if len < 4096 {
                    Expect::Refused
                } else if known {
                    Expect::Ok
                } else {
                    Expect::Any
                };
                (sqe, len, expect)
            }
            // Get Log Page: LID 01h-04h or any, NUMD, RAE, offset.
            2 | 3 => {
                let lid = [1u32, 2, 3, 4, r.u8().into()][r.below(5) as usize];
                let numd = match r.below(4) {
                    0 => r.u16() as u32,
                    1 => 1023,
                    _ => 127,
                };
                let rae = r.bool();
                cdw[0] = lid | u32::from(rae) << 15 | (numd & 0xffff) << 16;
                cdw[1] = numd >> 16;
                if r.below(8) == 0 {
                    cdw[2] = r.u32() & !3;
                }
                let need = (numd as usize + 1) * 4;
                let len = match r.below(4) {
                    0 => r.below(need as u32 + 8) as usize,
                    1 => need + 4096,
                    _ => need,
                };
                let expect = if len < need {
                    Expect::Refused
                } else if (1..=4).contains(&lid) && cdw[2] == 0 && need <= 4096 {
                    Expect::Ok
                } else {
                    Expect::Any
                };
                (
                    Sqe::passthrough(0x02, 0xffff_ffff, [0, 0], cdw),
                    len,
                    expect,
                )
            }
            // Get Features.
            4 | 5 => {
                let fid = [0x07u32, 0x0b, 0x04, 0x06, r.u8().into()][r.below(5) as usize];
                let sel = r.below(8);
                cdw[0] = fid | sel << 8;
                let expect = if [0x07, 0x0b, 0x04, 0x06].contains(&fid) && sel < 4 {
                    Expect::Ok
                } else {
                    Expect::Any
                };
                let len = if r.below(4) == 0 { 4096 } else { 0 };
                (Sqe::passthrough(0x0a, 0, [0, 0], cdw), len, expect)
            }
            // Set Features: Asynchronous Event Configuration, Temperature
            // Threshold, Host Behavior Support (with its structure), any.
            6 => {
                let fid = [0x0bu32, 0x04, 0x16, r.u8().into()][r.below(4) as usize];
                cdw[0] = fid;
                cdw[1] = match fid {
                    0x0b => [0x100, 0, 0x1ff][r.below(3) as usize],
                    0x04 => r.u16().into(),
                    _ => r.u32(),
                };
                let len = if fid == 0x16 { 512 } else { 0 };
                let expect = match fid {
                    0x0b | 0x04 => Expect::Ok,
                    0x07 | 0x0d => Expect::Refused,
                    0x0f if cdw[1] != 0 => Expect::Refused,
                    _ => Expect::Any,
                };
                (Sqe::passthrough(0x09, 0, [0, 0], cdw), len, expect)
            }
            // The opcodes the driver keeps for itself.
            7 => {
                let (op, fid) = REFUSED[r.below(REFUSED.len() as u32) as usize];
                cdw[0] = fid | r.u32() & !0xff;
                cdw[1] = r.u32() | 1;
                let len = [0, 4096][r.below(2) as usize];
                (
                    Sqe::passthrough(op, r.u32(), [0, 0], cdw),
                    len,
                    Expect::Refused,
                )
            }
            // Keep Alive (Invalid Opcode on the model), vendor-specific, any.
            _ => {
                let op = match r.below(3) {
                    0 => 0x18,
                    1 => 0xc0 | r.below(64) as u8,
                    _ => r.u8(),
                };
                for d in cdw.iter_mut() {
                    if r.bool() {
                        *d = r.u32();
                    }
                }
                let len = match r.below(4) {
                    0 => r.below(3 * 4096) as usize,
                    1 => 4096,
                    _ => 0,
                };
                let expect = if refused(op, cdw[0], cdw[1]) {
                    Expect::Refused
                } else {
                    Expect::Any
                };
                (
                    Sqe::passthrough(op, r.u32(), [r.u32(), r.u32()], cdw),
                    len,
                    expect,
                )
            }
        }
    }

    fn passthrough(&mut self, r: &mut Reader<'_>) {
        let (mut sqe, data_len, mut expect) = self.passthrough_sqe(r);
        // Whatever the caller puts in the pointers is not sent.
        if r.below(4) == 0 {
            sqe.set_prp1(r.u64());
            sqe.set_prp2(r.u64());
            sqe.set_psdt(r.below(4) as u8);
        }
        let data_out: Option<Vec<u8>> = match r.below(4) {
            0 => Some(r.bytes(data_len.max(1)).to_vec()),
            _ => None,
        };
        if let Some(d) = &data_out
            && data_len != 0
            && d.len() > data_len
        {
            expect = Expect::Refused;
        }
        let timeout = match r.below(8) {
            0 => Some(Duration::ZERO),
            1..=3 => Some(Duration::from_micros(u64::from(r.below(301)))),
            4 => Some(Duration::from_millis(1 + u64::from(r.below(20)))),
            _ => None,
        };
        if timeout == Some(Duration::ZERO) {
            expect = Expect::Refused;
        }
        // A command given less than a millisecond may be given up before a
        // look at the CQ (a descheduled thread): not promised to succeed.
        if timeout.is_some_and(|t| t < Duration::from_millis(1)) && expect == Expect::Ok {
            expect = Expect::Any;
        }
        let through_handle = r.bool();
        let op = sqe.opcode();
        let what = format!(
            "admin passthrough opcode {op:#04x} cdw10 {:#x} ({data_len} bytes, timeout \
             {timeout:?}, handle {through_handle})",
            sqe.cdw(10)
        );
        self.admin(&what, |h| {
            let out = data_out.as_deref();
            let res = match (timeout, through_handle) {
                (None, false) => h.c.admin_passthrough(sqe, data_len, out),
                (None, true) => h.handle.admin_passthrough(sqe, data_len, out),
                (Some(t), false) => h.c.admin_passthrough_with_timeout(sqe, data_len, out, t),
                (Some(t), true) => h
                    .handle
                    .admin_passthrough_with_timeout(sqe, data_len, out, t),
            };
            let res = res.map(|(cqe, data)| {
                assert!(
                    cqe.status().is_success(),
                    "passthrough Ok with status {:?}",
                    cqe.status()
                );
                // The data is what the command moves: the length asked for,
                // cut to what the SQE says it moves.
                let want = data_out
                    .as_ref()
                    .map_or(data_len, |d| if data_len == 0 { d.len() } else { data_len });
                let moved = match op {
                    0x06 => Some(4096),
                    0x02 => {
                        let numd =
                            (sqe.cdw(10) >> 16) as usize | (sqe.cdw(11) as usize & 0xffff) << 16;
                        Some((numd + 1) * 4)
                    }
                    0x0a | 0x08 | 0x18 | 0xc0..=0xff => Some(want),
                    _ => None,
                };
                if let Some(moved) = moved {
                    assert_eq!(
                        data.len(),
                        want.min(moved),
                        "passthrough opcode {op:#04x} returned {} bytes",
                        data.len()
                    );
                }
            });
            Outcome {
                res,
                timeout: timeout.unwrap_or(h.admin_timeout),
                detached: true,
                expect,
                sends: true,
            }
        });
    }

    fn log_page(&mut self, r: &mut Reader<'_>) {
        let t = self.admin_timeout;
        let kind = r.below(6);
        let entries = r.below(8) as usize;
        let lid = [1u8, 2, 3, 4, r.u8()][r.below(5) as usize];
        let len = match r.below(4) {
            0 => r.below(9000) as usize,
            1 => 4096,
            _ => 512,
        };
        let offset = if r.below(4) == 0 {
            u64::from(r.u16())
        } else {
            0
        };
        let what = match kind {
            0 => "smart_log".to_string(),
            1 => format!("error_log({entries})"),
            2 => "firmware_slot_log".to_string(),
            _ => format!("get_log_page({lid:#x}, {len}, {offset})"),
        };
        self.admin(&what, |h| {
            let (res, expect) = match kind {
                0 => (h.c.smart_log().map(|_| ()), Expect::Ok),
                1 => (h.c.error_log(entries).map(|_| ()), Expect::Ok),
                2 => (h.c.firmware_slot_log().map(|_| ()), Expect::Ok),
                _ => {
                    let expect = if len == 0 || len % 4 != 0 || offset % 4 != 0 {
                        Expect::Refused
                    } else if (1..=4).contains(&lid) && offset == 0 && len <= 4096 {
                        Expect::Ok
                    } else {
                        Expect::Any
                    };
                    let res = h.c.get_log_page(lid, 0xffff_ffff, len, offset).map(|d| {
                        assert_eq!(d.len(), len, "Get Log Page returned {} bytes", d.len())
                    });
                    (res, expect)
                }
            };
            Outcome {
                res,
                timeout: t,
                detached: false,
                expect,
                sends: true,
            }
        });
    }

    fn features(&mut self, r: &mut Reader<'_>) {
        let t = self.admin_timeout;
        if r.bool() {
            let fid = [0x07u8, 0x0b, 0x04, 0x06, 0x16, r.u8()][r.below(6) as usize];
            let sel = r.below(5) as u8;
            let cdw11 = if r.bool() { r.u32() & 0x3f_ffff } else { 0 };
            let data_structure = fid == 0x16 && sel != 3;
            let expect = if data_structure {
                Expect::Refused
            } else if [0x07, 0x0b, 0x06].contains(&fid) && sel < 4 {
                Expect::Ok
            } else {
                Expect::Any
            };
            self.admin(&format!("get_features({fid:#x}, {sel}, {cdw11:#x})"), |h| {
                Outcome {
                    res: h.c.get_features(fid, sel, cdw11).map(|_| ()),
                    timeout: t,
                    detached: false,
                    expect,
                    sends: true,
                }
            });
        } else {
            let fid = [0x0bu8, 0x04, 0x07, 0x0d, 0x0f, 0x16, r.u8()][r.below(7) as usize];
            let cdw11 = match fid {
                0x0b => [0x100, 0, 0x1ff, r.u32()][r.below(4) as usize],
                0x04 => u32::from(r.u16()),
                _ => r.u32() | u32::from(r.bool()),
            };
            let save = r.below(4) == 0;
            let expect = match fid {
                0x07 | 0x0d | 0x16 => Expect::Refused,
                0x0f if cdw11 != 0 => Expect::Refused,
                0x0b | 0x04 if !save => Expect::Ok,
                _ => Expect::Any,
            };
            self.admin(
                &format!("set_features({fid:#x}, {cdw11:#x}, {save})"),
                |h| Outcome {
                    res: h.c.set_features(fid, cdw11, save).map(|_| ()),
                    timeout: t,
                    detached: true,
                    expect,
                    sends: true,
                },
            );
        }
    }

    fn identify(&mut self, r: &mut Reader<'_>) {
        let t = self.admin_timeout;
        let kind = r.below(4);
        let nsid = [1u32, 0, 2, 0xffff_ffff, r.u32()][r.below(5) as usize];
        let cns = [0u8, 1, 2, 5, r.u8()][r.below(5) as usize];
        let start = [0u32, 1, r.u32()][r.below(3) as usize];
        self.admin(
            &format!("identify kind {kind} nsid {nsid:#x} cns {cns}"),
            |h| {
                let (res, expect) = match kind {
                    0 => (h.c.identify_controller().map(|_| ()), Expect::Ok),
                    1 => (
                        h.c.identify_namespace(nsid).map(|_| ()),
                        if nsid == 1 { Expect::Ok } else { Expect::Any },
                    ),
                    2 => (
                        h.c.active_namespace_ids(start).map(|_| ()),
                        if start < 0xffff_fffe {
                            Expect::Ok
                        } else {
                            Expect::Any
                        },
                    ),
                    _ => (
                        h.c.identify_raw(cns, nsid).map(|d| {
                            assert_eq!(d.len(), 4096, "Identify returned {} bytes", d.len())
                        }),
                        Expect::Any,
                    ),
                };
                Outcome {
                    res,
                    timeout: t,
                    detached: false,
                    expect,
                    sends: true,
                }
            },
        );
    }

    /// Abort (through the passthrough) of a command the model fetched, an
    /// AER or a made-up CID.
    fn abort(&mut self, r: &mut Reader<'_>) {
        let seen = self.m.commands_seen();
        let recent: Vec<(u16, u16)> = seen
            .iter()
            .rev()
            .take(16)
            .map(|&(q, _, cid)| (q, cid))
            .collect();
        let (sqid, cid) = match (r.below(4), recent.len()) {
            (0, _) | (_, 0) => (r.below(3) as u16, r.u16()),
            (_, n) => recent[r.below(n as u32) as usize],
        };
        let sqe = Sqe::abort(sqid, cid);
        let t = self.admin_timeout;
        self.admin(&format!("Abort (SQ {sqid}, CID {cid:#06x})"), |h| Outcome {
            res: h.c.admin_passthrough(sqe, 0, None).map(|_| ()),
            timeout: t,
            detached: true,
            expect: Expect::Ok,
            sends: true,
        });
    }

    fn poll(&mut self) {
        let t = self.admin_timeout;
        let mut events = Vec::new();
        self.admin("poll_async_events", |h| {
            let res = h.c.poll_async_events().map(|e| events = e);
            Outcome {
                res,
                timeout: t,
                detached: false,
                expect: Expect::Ok,
                sends: false,
            }
        });
        for e in events {
            let dw0 = e.to_dw0();
            if debug() {
                eprintln!("  event {dw0:#08x}");
            }
            match self.raised.get_mut(&dw0) {
                Some(n) if *n > 0 => *n -= 1,
                _ => assert!(
                    e.is_namespace_attribute_changed() || self.events_untrusted,
                    "poll_async_events returned event {dw0:#08x} ({e:?}), which was not raised \
                     (or not that often)"
                ),
            }
        }
    }

    fn raise(&mut self, r: &mut Reader<'_>) {
        let (ty, info, lid) = match r.below(6) {
            0 => (1, 0x00, 0x02),
            1 => (2, 0x00, 0x04),
            2 => (2, 0x01, 0x03),
            3 => (0, r.below(8) as u8, 0x01),
            _ => (r.below(8) as u8, r.u8(), r.u8()),
        };
        self.m.raise_async_event(ty, info, lid);
        let dw0 = u32::from(ty & 7) | u32::from(info) << 8 | u32::from(lid) << 16;
        *self.raised.entry(dw0).or_default() += 1;
    }

    fn admin_fault(&mut self, r: &mut Reader<'_>) {
        if self.pending.len() >= MAX_PENDING_FAULTS {
            return;
        }
        let on = match r.below(12) {
            0 => Match::Queue(0),
            1 => Match::Next,
            2 => Match::Nth(self.m.commands_fetched() + u64::from(r.below(8))),
            3 => Match::Opcode {
                qid: 0,
                opcode: 0x0c,
            },
            4 => Match::Identify {
                cns: [0, 1, 2][r.below(3) as usize],
                nsid: r.below(2),
            },
            5 => Match::SetFeatures {
                fid: [0x0b, 0x07, 0x04][r.below(3) as usize],
            },
            _ => Match::Opcode {
                qid: 0,
                opcode: [0x06, 0x02, 0x0a, 0x09, 0x08, 0x18, 0xc0][r.below(7) as usize],
            },
        };
        let fault = match r.below(20) {
            0 | 1 => Fault::DropCompletion(on),
            2..=4 => Fault::DelayCompletion {
                on,
                doorbells: if r.bool() { None } else { Some(r.below(4)) },
            },
            5 | 6 => Fault::DuplicateCompletion(on),
            7 | 8 => Fault::CorruptCid {
                on,
                xor: if r.bool() { 1 << r.below(16) } else { r.u16() },
            },
            9 | 10 => Fault::BadSqHead {
                on,
                sqhd: if r.bool() {
                    r.below(40) as u16
                } else {
                    r.u16()
                },
            },
            11 => Fault::WrongPhase(on),
            12..=15 => Fault::Status {
                on,
                status: model_status(r),
            },
            16 | 17 => Fault::FatalOn(on),
            18 if r.below(4) == 0 => Fault::UnplugOn(on),
            _ => Fault::Status {
                on,
                status: ModelStatus::INTERNAL_ERROR,
            },
        };
        if debug() {
            eprintln!("  inject {fault:?}");
        }
        if wild(&fault) {
            self.aer_maybe_hit = true;
        }
        self.m.inject(fault);
        self.pending = self.m.pending_faults();
    }

    fn io_fault(&mut self, r: &mut Reader<'_>) {
        if self.pending.len() >= MAX_PENDING_FAULTS {
            return;
        }
        let Some(qid) = self.qp.as_ref().map(|q| q.qid()) else {
            return;
        };
        let on = Match::Queue(qid);
        let fault = match r.below(4) {
            0 => Fault::DropCompletion(on),
            1 => Fault::Status {
                on,
                status: model_status(r),
            },
            _ => Fault::DelayCompletion {
                on,
                doorbells: if r.bool() { None } else { Some(r.below(8)) },
            },
        };
        if debug() {
            eprintln!("  inject {fault:?}");
        }
        self.m.inject(fault);
        self.pending = self.m.pending_faults();
    }

    fn reset(&mut self) {
        let failed_before = self.c.failure().is_some();
        let t = self.admin_timeout;
        let start = Instant::now();
        let res = self.c.reset();
        let took = start.elapsed();
        let used = self.faults_used();
        if debug() {
            eprintln!("  reset: {res:?} in {took:?}");
        }
        let bound = self.bound(t, false);
        assert!(took <= bound, "reset took {took:?}, bound {bound:?}");
        match res {
            Ok(()) => {
                assert!(self.c.failure().is_none(), "failed after a good reset");
                self.after_good_reset(&used);
            }
            Err(e) => {
                let _ = e.to_string();
                assert!(
                    self.c.failure().is_some() || self.m.is_unplugged(),
                    "a failed reset ({e}) left the controller marked usable (it was failed \
                     before: {failed_before})"
                );
            }
        }
    }

    // ----- I/O ----------------------------------------------------------

    fn take_back(&mut self, b: DmaBuffer) {
        assert!(
            self.owned.insert(b.iova()),
            "buffer {:#x} handed out while the harness holds it",
            b.iova()
        );
        self.pool.push(b);
    }

    fn submit(&mut self, r: &mut Reader<'_>) {
        if self.qp.is_none() {
            return;
        }
        let b = match self.pool.pop() {
            Some(b) => b,
            None => match self.c.alloc_dma(4096) {
                Ok(b) => {
                    assert!(self.owned.insert(b.iova()), "allocator reused a live IOVA");
                    b
                }
                Err(_) => return,
            },
        };
        let iova = b.iova();
        self.owned.remove(&iova);
        let slba = u64::from(r.below(NS_BLOCKS as u32));
        let blocks = 1 + r.below(2).min((NS_BLOCKS - slba - 1) as u32);
        let ns = self.ns.clone();
        let cmd = if r.bool() {
            IoCommand::Read {
                ns: &ns,
                slba,
                blocks,
            }
        } else {
            IoCommand::Write {
                ns: &ns,
                slba,
                blocks,
            }
        };
        let tag = self.tag();
        let failed_before = self.c.failure().is_some();
        let resets_before = self.c.resets();
        let doorbells_before = self.m.total_doorbell_writes();
        let start = Instant::now();
        let qp = self.qp.as_mut().expect("a pair");
        let res = qp.submit(cmd, Some(b), tag);
        let took = start.elapsed();
        self.faults_used();
        if failed_before && self.c.resets() == resets_before {
            assert!(res.is_err(), "a submission accepted by a failed controller");
            assert_eq!(
                self.m.total_doorbell_writes(),
                doorbells_before,
                "a submission rang a doorbell of a failed controller"
            );
        }
        let bound = self.bound(self.admin_timeout * 2, false);
        assert!(took <= bound, "submit took {took:?}, bound {bound:?}");
        match res {
            Ok(()) => {
                self.in_flight.insert(tag, iova);
            }
            Err(f) => {
                let b = f.buffer.expect("a refused command hands its buffer back");
                assert_eq!(b.iova(), iova, "refused with another buffer");
                self.take_back(b);
            }
        }
    }

    fn reap(&mut self) {
        let Some(qp) = self.qp.as_mut() else { return };
        let mut got = Vec::new();
        let start = Instant::now();
        let res = qp.process_completions(u32::MAX, |_, c| got.push(c));
        let took = start.elapsed();
        if let Some(qp) = self.qp.as_ref() {
            assert!(
                qp.in_flight() <= qp.max_depth(),
                "{} commands in flight, depth {}",
                qp.in_flight(),
                qp.max_depth()
            );
        }
        self.faults_used();
        let bound = self.bound(self.admin_timeout * 3, false);
        assert!(
            took <= bound,
            "process_completions took {took:?}, bound {bound:?}"
        );
        if let Ok(k) = res {
            assert_eq!(k as usize, got.len(), "process_completions count");
        }
        if let Err(e) = &res
            && matches!(e, Error::DeviceFault { .. })
        {
            assert!(
                self.c.failure().is_some(),
                "{e} without a failed controller"
            );
        }
        for c in got {
            assert!(
                self.delivered.insert(c.tag),
                "tag {} delivered twice",
                c.tag
            );
            let iova = self
                .in_flight
                .remove(&c.tag)
                .unwrap_or_else(|| panic!("tag {} was never submitted", c.tag));
            let b = c.buffer.expect("a completion carries its buffer");
            assert_eq!(
                b.iova(),
                iova,
                "tag {} came back with another buffer",
                c.tag
            );
            self.take_back(b);
        }
    }

    // ----- checks ---------------------------------------------------------

    fn check_model(&mut self, when: &str) {
        assert_eq!(
            self.m.dma_faults(),
            0,
            "DMA fault after {when}: {:?}",
            self.m.dma_fault_log()
        );
        let bad: Vec<String> = self
            .m
            .take_violations()
            .into_iter()
            .filter(|v| !(self.cq_overfilled && v.contains(" full: ")))
            .filter(|v| !(self.cid_confused && v.contains("reused while")))
            .collect();
        assert!(bad.is_empty(), "model violations after {when}: {bad:?}");
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        // A failed controller refuses everything until a reset: reset it
        // often, so that the input goes on exercising a working one.
        if self.c.failure().is_some() && r.below(3) == 0 {
            self.reset();
        }
        let action = r.below(26);
        if debug() {
            eprintln!("action {action}");
        }
        match action {
            0..=4 => self.passthrough(r),
            5 | 6 => self.log_page(r),
            7 => self.features(r),
            8 => self.identify(r),
            9 => self.abort(r),
            10 | 11 => self.poll(),
            12 => self.raise(r),
            13 | 14 => self.admin_fault(r),
            15 => self.io_fault(r),
            16 => self.reset(),
            17 => {
                self.m.release_delayed();
            }
            18 => match r.below(16) {
                0 => self.m.unplug(),
                1..=4 => self.m.set_fatal(),
                _ => {}
            },
            19..=21 => self.submit(r),
            22 | 23 => self.reap(),
            _ => {
                // The model's faults may also be consumed by the admin
                // commands of a reap's recovery: a reap, then a poll.
                self.reap();
                self.poll();
            }
        }
        if self.m.is_unplugged() || self.m.csts() & 2 != 0 {
            self.tainted = true;
        }
        self.check_model(&format!("action {action}"));
    }

    /// Every application command identifier at once, plus one of the
    /// driver's own: none leaked.
    fn full_depth(&mut self) {
        let n = self.slots.saturating_sub(2 + self.aers);
        if debug() {
            eprintln!(
                "full depth: {n} application commands ({} slots, {} AERs)",
                self.slots, self.aers
            );
        }
        let get_features = Sqe::get_features(0x07, 0, 0);
        if n == 0 {
            // An admin queue too small to leave the application an
            // identifier beside the driver's: waited for under the lock.
            let r = self
                .c
                .admin_passthrough_with_timeout(get_features, 0, None, DEPTH_TIMEOUT);
            assert!(r.is_ok(), "the one command on a small admin queue: {r:?}");
            return;
        }
        let base = self.m.delayed_completions();
        let handle = self.handle.clone();
        let m = self.m.clone();
        let c = &self.c;
        std::thread::scope(|s| {
            let mut threads: Vec<std::thread::ScopedJoinHandle<'_, PassthroughResult>> = Vec::new();
            for i in 0..n {
                // One delay per command, injected before it is sent (a
                // fault applies to the first command it matches).
                m.inject(Fault::DelayCompletion {
                    on: Match::Opcode {
                        qid: 0,
                        opcode: 0x0a,
                    },
                    doorbells: None,
                });
                let h = handle.clone();
                let t = s.spawn(move || {
                    h.admin_passthrough_with_timeout(get_features, 0, None, DEPTH_TIMEOUT)
                });
                let deadline = Instant::now() + DEPTH_TIMEOUT;
                while m.delayed_completions() < base + i as usize + 1 {
                    if t.is_finished() || Instant::now() > deadline {
                        m.clear_faults();
                        m.release_delayed();
                        let r = t.join();
                        for t in threads {
                            let _ = t.join();
                        }
                        panic!(
                            "application admin command {} of {n} (admin queue of {} \
                             identifiers, {} AERs) did not reach the controller: {r:?}; an \
                             admin command identifier leaked",
                            i + 1,
                            self.slots,
                            self.aers
                        );
                    }
                    std::thread::yield_now();
                }
                threads.push(t);
            }
            // The driver's own command takes one of the two identifiers it
            // keeps.
            let own = c.get_features(0x07, 0, 0);
            m.release_delayed();
            let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
            assert!(
                own.is_ok(),
                "a driver command beside {n} application commands: {own:?}"
            );
            for (i, r) in results.into_iter().enumerate() {
                match r {
                    Ok(Ok(_)) => {}
                    other => panic!("application admin command {} of {n}: {other:?}", i + 1),
                }
            }
        });
        self.pending = self.m.pending_faults();
    }

    fn finish(&mut self) {
        self.m.clear_faults();
        self.pending.clear();
        if self.m.is_unplugged() {
            // Nothing more can come back; what did was checked.
            self.reap();
            self.check_model("the end");
            return;
        }
        self.m.release_delayed();
        self.reap();
        for round in 0..2 {
            if self.c.failure().is_some() || self.m.csts() & 2 != 0 || self.aer_maybe_hit {
                self.reset();
                assert!(
                    self.c.failure().is_none(),
                    "the reset at the end (faults gone) failed: {:?}",
                    self.c.failure()
                );
            }
            self.poll();
            self.poll();
            if self.c.failure().is_none() {
                break;
            }
            assert!(round == 0, "the controller fails without faults");
        }
        self.check_model("the final polls");
        self.full_depth();
        self.check_model("the full-depth check");
        // A reset ends every I/O command still in flight, once.
        self.reap();
        if self.qp.is_some() {
            self.reset();
            assert!(self.c.failure().is_none(), "the last reset failed");
            for _ in 0..4 {
                self.reap();
            }
            assert!(
                self.in_flight.is_empty(),
                "I/O commands never completed after the last reset: {:?}",
                self.in_flight.keys().collect::<Vec<_>>()
            );
        }
        self.check_model("the end");
    }
}

/// `UPNVME_FUZZ_DEBUG=1`: print the actions and each call's result.
fn debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var("UPNVME_FUZZ_DEBUG").is_ok_and(|v| v == "1"))
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let aerl = r.below(8) as u8;
    let cfg = ModelConfig {
        aerl,
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: NS_BLOCKS,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    };
    let m = ModelController::new(cfg);
    let mut o = options();
    let admin_timeout = Duration::from_millis(2 + u64::from(r.below(4)));
    o.admin_timeout = Some(admin_timeout);
    o.io_queues = 1;
    o.async_events = r.below(9) as u8;
    o.admin_queue_entries = 2 + r.below(31);
    let ready_timeout = o.ready_timeout.unwrap_or(Duration::from_millis(50));
    let async_events = u32::from(o.async_events);
    let c = match Controller::with_device(m.clone(), o) {
        Ok(c) => c,
        Err(e) => panic!("bring-up on a healthy model failed: {e}"),
    };
    let slots = c.admin_queue_entries() - 1;
    let aers = async_events
        .min(u32::from(aerl) + 1)
        .min(slots.saturating_sub(2));
    let qopts = QueuePairOptions {
        entries: Some(2 + r.below(15)),
        command_timeout: match r.below(4) {
            0 => Some(Duration::from_micros(100 + u64::from(r.below(2000)))),
            _ => None,
        },
        ..Default::default()
    };
    let qp = match c.io_queue_pair(qopts) {
        Ok(qp) => Some(qp),
        Err(e) => panic!("queue pair on a healthy model failed: {e}"),
    };
    let ns = c.namespace(1).expect("namespace 1").clone();
    let handle = c.admin_handle();
    let mut h = Harness {
        m,
        c,
        handle,
        qp,
        ns,
        admin_timeout,
        ready_timeout,
        slots,
        aers,
        next_tag: 0,
        in_flight: HashMap::new(),
        delivered: HashSet::new(),
        pool: Vec::new(),
        owned: HashSet::new(),
        pending: Vec::new(),
        tainted: false,
        cid_confused: false,
        events_untrusted: false,
        cq_overfilled: false,
        aer_maybe_hit: false,
        raised: HashMap::new(),
    };
    h.check_model("bring-up");
    for _ in 0..MAX_ACTIONS {
        if r.is_empty() {
            break;
        }
        h.step(&mut r);
    }
    h.finish();
});

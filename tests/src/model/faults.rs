//! Fault injection: the misbehaviour of a controller that QEMU cannot be made
//! to show — lost, late, duplicated or corrupted completions, fatal status,
//! surprise removal. Faults are one-shot: each injected [`Fault`] applies once
//! and is then consumed.
//!
//! Faults that fill completion queue slots the host cannot account for
//! ([`Fault::DuplicateCompletion`], [`Fault::WrongPhase`],
//! [`ModelController::post_raw_completion`](super::ModelController::post_raw_completion))
//! can make a later completion find the queue full; the "CQ full" violation
//! recorded then is a consequence of the fault, and tests that inject them
//! should inspect [`ModelController::take_violations`](super::ModelController::take_violations)
//! rather than require it to be empty.

use super::status::Status;

/// Which command a command fault applies to. Matched when the model fetches
/// a command from a submission queue; the first injected fault that matches
/// is consumed (every matching fault applies, each once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// The next command fetched from any submission queue, admin included.
    Next,
    /// The next command fetched from submission queue `qid`.
    Queue(u16),
    /// The next command with opcode `opcode` fetched from submission queue
    /// `qid` (admin opcodes on queue 0, I/O opcodes on the others).
    Opcode {
        /// Submission queue identifier.
        qid: u16,
        /// Command opcode (CDW0 bits 07:00).
        opcode: u8,
    },
    /// The `n + 1`-th command the model fetches since it was created (index
    /// `n` of [`ModelController::commands_seen`](super::ModelController::commands_seen);
    /// [`ModelController::commands_fetched`](super::ModelController::commands_fetched)
    /// is the index of the next one).
    Nth(u64),
    /// The next Identify (admin opcode 06h) with CDW10.CNS `cns` for
    /// namespace `nsid`: singles out one namespace's Identify.
    Identify {
        /// CDW10 bits 07:00.
        cns: u8,
        /// The command's NSID.
        nsid: u32,
    },
    /// The next Set Features (admin opcode 09h) of feature `fid` (CDW10
    /// bits 07:00): singles out one feature among those a reset sets.
    SetFeatures {
        /// Feature Identifier.
        fid: u8,
    },
}

impl Match {
    fn matches(&self, qid: u16, cmd: &super::command::Command, index: u64) -> bool {
        let opcode = cmd.opcode();
        match *self {
            Match::Next => true,
            Match::Queue(q) => q == qid,
            Match::Opcode { qid: q, opcode: o } => q == qid && o == opcode,
            Match::Nth(n) => n == index,
            Match::Identify { cns, nsid } => {
                qid == 0
                    && opcode == 0x06
                    && cmd.cdw(10) & 0xff == u32::from(cns)
                    && cmd.nsid() == nsid
            }
            Match::SetFeatures { fid } => {
                qid == 0 && opcode == 0x09 && cmd.cdw(10) & 0xff == u32::from(fid)
            }
        }
    }
}

/// A one-shot fault for [`ModelController::inject`](super::ModelController::inject).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The matched command executes (its data moves) but its completion is
    /// never posted: the controller lost it. An Abort for it reports "not
    /// aborted" (dword 0 bit 0 = 1); only a controller reset (CC.EN 1→0)
    /// forgets it.
    DropCompletion(Match),
    /// The matched command executes but its completion is held back: it is
    /// posted by [`ModelController::release_delayed`](super::ModelController::release_delayed),
    /// or after `doorbells` further doorbell writes when that is `Some`. An
    /// Abort for it completes it with Command Abort Requested; deleting its
    /// SQ completes it with Command Aborted due to SQ Deletion.
    DelayCompletion {
        /// The command to delay.
        on: Match,
        /// Release after this many further MMIO doorbell writes (any queue).
        doorbells: Option<u32>,
    },
    /// The completion of the matched command is posted twice (the copy only
    /// if the completion queue has room for it).
    DuplicateCompletion(Match),
    /// The completion of the matched command carries `cid ^ xor` as its
    /// Command Identifier (flip the generation bits for a stale CID, the slot
    /// bits for an unknown one).
    CorruptCid {
        /// The command whose completion is corrupted.
        on: Match,
        /// Bits to flip in the CID.
        xor: u16,
    },
    /// When the matched command is fetched, the device writes its SQ slot
    /// back with the Command Identifier inverted (a device rewriting the
    /// commands it is given), then executes the command as fetched. The
    /// write lands only where the SQ is mapped for device writes; where it is
    /// mapped read-only it is a DMA fault and the slot is unchanged.
    RewriteSqe(Match),
    /// The completion of the matched command reports `sqhd` as its SQ Head
    /// Pointer (use a value ≥ the queue size for "out of range").
    BadSqHead {
        /// The command whose completion is corrupted.
        on: Match,
        /// The SQ head to report.
        sqhd: u16,
    },
    /// The completion of the matched command is written with the inverted
    /// Phase Tag (it looks like a stale entry to the host).
    WrongPhase(Match),
    /// The matched command is not executed (no data moves) and completes with
    /// `status`.
    Status {
        /// The command to fail.
        on: Match,
        /// The status to report.
        status: Status,
    },
    /// When the matched command is fetched the controller hits a fatal error:
    /// CSTS.CFS is set, that command and every later one stay without
    /// completion until the host resets the controller.
    FatalOn(Match),
    /// When the matched command is fetched the device disappears, as
    /// [`ModelController::unplug`](super::ModelController::unplug).
    UnplugOn(Match),
    /// When the matched command is fetched, someone else changes namespace
    /// `nsid` first, as [`ModelController::change_namespace`](super::ModelController::change_namespace)
    /// (`to: None` detaches it); the command then executes as usual. Lets
    /// a test change a namespace at one exact point of the host's sequence
    /// (during a reset, before Namespace Attribute Notices are on again).
    ChangeNamespaceOn {
        /// The command before which the namespace changes.
        on: Match,
        /// The namespace.
        nsid: u32,
        /// Its new configuration.
        to: Option<super::NamespaceConfig>,
    },
    /// The next CC.EN 0→1 transition never sets CSTS.RDY.
    NeverReady,
    /// The next CC.EN 0→1 transition does not set CSTS.RDY by itself; the
    /// host's next CC write sets it instead (and is otherwise ignored), and
    /// from then on CSTS.RDY stays 1 whatever CC says: a controller that
    /// keeps running on the admin queue it was given and can be neither
    /// brought up nor disabled again.
    Wedged,
    /// The next shutdown notification (CC.SHN) never reaches CSTS.SHST
    /// "shutdown processing complete".
    NeverShutdownComplete,
}

impl Fault {
    fn command_match(&self) -> Option<Match> {
        match *self {
            Fault::DropCompletion(m)
            | Fault::DuplicateCompletion(m)
            | Fault::WrongPhase(m)
            | Fault::FatalOn(m)
            | Fault::RewriteSqe(m)
            | Fault::UnplugOn(m) => Some(m),
            Fault::DelayCompletion { on, .. }
            | Fault::CorruptCid { on, .. }
            | Fault::BadSqHead { on, .. }
            | Fault::Status { on, .. }
            | Fault::ChangeNamespaceOn { on, .. } => Some(on),
            Fault::NeverReady | Fault::Wedged | Fault::NeverShutdownComplete => None,
        }
    }
}

/// What faults do to one command's completion, gathered when it is fetched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Never post it.
    pub drop: bool,
    /// Hold it: `Some(None)` until released, `Some(Some(k))` for k doorbells.
    pub delay: Option<Option<u32>>,
    /// Post it twice.
    pub duplicate: bool,
    /// XOR applied to the CID.
    pub cid_xor: u16,
    /// SQ head to report instead of the real one.
    pub sqhd: Option<u16>,
    /// Invert the phase tag.
    pub wrong_phase: bool,
    /// Skip execution and complete with this status.
    pub status: Option<Status>,
    /// Set CSTS.CFS and stop.
    pub fatal: bool,
    /// Unplug and stop.
    pub unplug: bool,
    /// Change this namespace (NSID, new configuration) before executing.
    pub change_namespace: Option<(u32, Option<super::NamespaceConfig>)>,
    /// Write the fetched SQE back into its slot with its CID inverted.
    pub rewrite_sqe: bool,
}

impl Plan {
    /// Modifications that apply when the entry is written to the CQ.
    pub fn post_mods(&self) -> PostMods {
        PostMods {
            cid_xor: self.cid_xor,
            sqhd: self.sqhd,
            wrong_phase: self.wrong_phase,
        }
    }
}

/// Corruptions applied when a completion is written into the CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PostMods {
    /// XOR applied to the CID.
    pub cid_xor: u16,
    /// SQ head to report instead of the real one.
    pub sqhd: Option<u16>,
    /// Invert the phase tag.
    pub wrong_phase: bool,
}

/// The injected faults not yet consumed.
#[derive(Debug, Default)]
pub(crate) struct FaultQueue {
    faults: Vec<Fault>,
}

impl FaultQueue {
    /// Adds a one-shot fault.
    pub fn push(&mut self, fault: Fault) {
        self.faults.push(fault);
    }

    /// Removes every fault.
    pub fn clear(&mut self) {
        self.faults.clear();
    }

    /// Faults not yet consumed, in injection order.
    pub fn pending(&self) -> Vec<Fault> {
        self.faults.clone()
    }

    /// Consumes a controller-level fault equal to `fault`, if injected.
    pub fn take(&mut self, fault: Fault) -> bool {
        match self.faults.iter().position(|f| *f == fault) {
            Some(i) => {
                self.faults.remove(i);
                true
            }
            None => false,
        }
    }

    /// Consumes every command fault matching the command and returns the
    /// combined plan for it.
    pub fn plan_for(&mut self, qid: u16, cmd: &super::command::Command, index: u64) -> Plan {
        let mut plan = Plan::default();
        self.faults.retain(|f| {
            let Some(m) = f.command_match() else {
                return true;
            };
            if !m.matches(qid, cmd, index) {
                return true;
            }
            match *f {
                Fault::DropCompletion(_) => plan.drop = true,
                Fault::DelayCompletion { doorbells, .. } => plan.delay = Some(doorbells),
                Fault::DuplicateCompletion(_) => plan.duplicate = true,
                Fault::CorruptCid { xor, .. } => plan.cid_xor ^= xor,
                Fault::BadSqHead { sqhd, .. } => plan.sqhd = Some(sqhd),
                Fault::WrongPhase(_) => plan.wrong_phase = true,
                Fault::Status { status, .. } => plan.status = Some(status),
                Fault::FatalOn(_) => plan.fatal = true,
                Fault::UnplugOn(_) => plan.unplug = true,
                Fault::RewriteSqe(_) => plan.rewrite_sqe = true,
                Fault::ChangeNamespaceOn { nsid, to, .. } => {
                    plan.change_namespace = Some((nsid, to));
                }
                Fault::NeverReady | Fault::Wedged | Fault::NeverShutdownComplete => {
                    return true;
                }
            }
            false
        });
        plan
    }
}

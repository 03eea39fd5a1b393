//! The controller register file (NVMe Base Specification 2.0, §3.1.3
//! "Controller Properties"): CAP, VS, INTMS/INTMC, CC, CSTS, NSSR, AQA, ASQ,
//! ACQ, and the CC.EN / CC.SHN state machine ("Controller
//! Initialization", "Shutdown Processing", "Controller Reset").

use super::faults::Fault;
use super::state::{CompQueue, State, SubQueue};

/// Offset of CAP (Controller Capabilities, 64 bit).
pub(crate) const CAP: usize = 0x00;
/// Offset of VS (Version).
pub(crate) const VS: usize = 0x08;
/// Offset of INTMS (Interrupt Mask Set).
pub(crate) const INTMS: usize = 0x0c;
/// Offset of INTMC (Interrupt Mask Clear).
pub(crate) const INTMC: usize = 0x10;
/// Offset of CC (Controller Configuration).
pub(crate) const CC: usize = 0x14;
/// Offset of CSTS (Controller Status).
pub(crate) const CSTS: usize = 0x1c;
/// Offset of NSSR (NVM Subsystem Reset).
pub(crate) const NSSR: usize = 0x20;
/// Offset of AQA (Admin Queue Attributes).
pub(crate) const AQA: usize = 0x24;
/// Offset of ASQ (Admin Submission Queue Base Address, 64 bit).
pub(crate) const ASQ: usize = 0x28;
/// Offset of ACQ (Admin Completion Queue Base Address, 64 bit).
pub(crate) const ACQ: usize = 0x30;
/// Offset of CRTO (Controller Ready Timeouts, NVMe 2.0).
pub(crate) const CRTO: usize = 0x68;
/// Offset of SQ0TDBL, the first doorbell.
pub(crate) const DOORBELLS: usize = 0x1000;

/// VS value: NVMe 1.4.0 (what QEMU reports).
pub(crate) const VERSION: u32 = 0x0001_0400;
/// CAP.MPSMAX reported: 2^(12+4) = 64 KiB pages.
const MPSMAX: u32 = 4;
/// CSTS.SHST 01b: shutdown processing occurring.
const SHST_OCCURRING: u32 = 1;
/// CSTS.SHST 10b: shutdown processing complete.
const SHST_COMPLETE: u32 = 2;
/// CC bits that must not change while CC.EN = 1: CSS, MPS, AMS, IOSQES, IOCQES.
const CC_CONFIG_MASK: u32 = 0x00ff_3ff0;

/// Register values and the pending CSTS transitions.
#[derive(Clone, Debug, Default)]
pub(crate) struct Regs {
    /// CC as last written.
    pub cc: u32,
    /// AQA as last written.
    pub aqa: u32,
    /// ASQ as last written.
    pub asq: u64,
    /// ACQ as last written.
    pub acq: u64,
    /// INTMS/INTMC mask.
    pub intms: u32,
    /// CSTS.RDY as the host currently sees it.
    pub rdy: bool,
    /// A pending CSTS.RDY change: (new value, CSTS reads still to go).
    pub pending_rdy: Option<(bool, u32)>,
    /// CSTS.SHST.
    pub shst: u32,
    /// CSTS reads before SHST goes from "occurring" to "complete"; `None`
    /// with SHST "occurring" means never.
    pub pending_shst: Option<u32>,
    /// Memory page size latched from CC.MPS at enable.
    pub page: u64,
    /// [`Fault::Wedged`] took effect at CC.EN 0→1: CC writes are ignored
    /// from then on, except that the first sets CSTS.RDY.
    pub wedged: bool,
}

impl Regs {
    /// Memory page size in bytes (CC.MPS latched at enable; 4 KiB before).
    pub fn page_size(&self) -> u64 {
        if self.page == 0 { 4096 } else { self.page }
    }
}

impl State {
    /// CAP as the model reports it: MQES, CQR = 1, AMS = 0, TO,
    /// DSTRD, NSSRS = 0, CSS bit 0 (NVM command set), MPSMIN = 0, MPSMAX = 4,
    /// CRMS.CRWMS when [`crate::ModelConfig::crwmt`] is set.
    pub fn cap(&self) -> u64 {
        u64::from(self.cfg.mqes)
            | 1 << 16
            | u64::from(self.cfg.cap_to) << 24
            | u64::from(self.cfg.dstrd & 0xf) << 32
            | 1 << 37
            | u64::from(MPSMAX) << 52
            | u64::from(self.cfg.crwmt.is_some()) << 59
    }

    /// CSTS without side effects: RDY (bit 0), CFS (bit 1), SHST (bits 3:2).
    pub fn csts_peek(&self) -> u32 {
        u32::from(self.regs.rdy) | u32::from(self.fatal) << 1 | (self.regs.shst & 3) << 2
    }

    /// A host read of CSTS: advances pending RDY / SHST transitions.
    fn read_csts(&mut self) -> u32 {
        match self.regs.pending_rdy {
            Some((v, 0)) => {
                self.regs.rdy = v;
                self.regs.pending_rdy = None;
            }
            Some((v, n)) => self.regs.pending_rdy = Some((v, n - 1)),
            None => {}
        }
        match self.regs.pending_shst {
            Some(0) => {
                self.regs.shst = SHST_COMPLETE;
                self.regs.pending_shst = None;
            }
            Some(n) => self.regs.pending_shst = Some(n - 1),
            None => {}
        }
        self.csts_peek()
    }

    /// Host read of a 32-bit register. Unaligned or out-of-range reads
    /// return all ones (and are recorded); doorbells read as 0.
    pub fn read32(&mut self, offset: usize) -> u32 {
        if self.gone {
            return u32::MAX;
        }
        if !offset.is_multiple_of(4) || offset.checked_add(4).is_none_or(|e| e > self.cfg.bar_len) {
            self.violation(format!(
                "32-bit register read at invalid offset {offset:#x}"
            ));
            return u32::MAX;
        }
        let cap = self.cap();
        match offset {
            CAP => cap as u32,
            0x04 => (cap >> 32) as u32,
            VS => VERSION,
            INTMS | INTMC => self.regs.intms,
            CC => self.regs.cc,
            CSTS => self.read_csts(),
            AQA => self.regs.aqa,
            ASQ => self.regs.asq as u32,
            0x2c => (self.regs.asq >> 32) as u32,
            ACQ => self.regs.acq as u32,
            0x34 => (self.regs.acq >> 32) as u32,
            CRTO => u32::from(self.cfg.crwmt.unwrap_or(0)),
            _ => 0,
        }
    }

    /// Host read of a 64-bit register (two 32-bit reads, low first).
    pub fn read64(&mut self, offset: usize) -> u64 {
        if self.gone {
            return u64::MAX;
        }
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|e| e > self.cfg.bar_len) {
            self.violation(format!(
                "64-bit register read at invalid offset {offset:#x}"
            ));
            return u64::MAX;
        }
        let lo = self.read32(offset);
        let hi = self.read32(offset + 4);
        u64::from(lo) | u64::from(hi) << 32
    }

    /// Host write of a 32-bit register or doorbell.
    pub fn write32(&mut self, offset: usize, value: u32) {
        if self.gone {
            return;
        }
        if !offset.is_multiple_of(4) || offset.checked_add(4).is_none_or(|e| e > self.cfg.bar_len) {
            self.violation(format!(
                "32-bit register write of {value:#x} at invalid offset {offset:#x}"
            ));
            return;
        }
        match offset {
            CAP | 0x04 | VS | CSTS => self.violation(format!(
                "write of {value:#x} to read-only register at {offset:#x}"
            )),
            INTMS => self.regs.intms |= value,
            INTMC => self.regs.intms &= !value,
            CC => self.write_cc(value),
            // CAP.NSSRS = 0: NVM Subsystem Reset is not supported; writes
            // have no effect.
            NSSR => {}
            AQA => self.regs.aqa = value,
            ASQ => self.regs.asq = (self.regs.asq & !0xffff_ffff) | u64::from(value),
            0x2c => self.regs.asq = (self.regs.asq & 0xffff_ffff) | u64::from(value) << 32,
            ACQ => self.regs.acq = (self.regs.acq & !0xffff_ffff) | u64::from(value),
            0x34 => self.regs.acq = (self.regs.acq & 0xffff_ffff) | u64::from(value) << 32,
            o if o >= DOORBELLS => self.doorbell(o, value),
            _ => {}
        }
    }

    /// Host write of a 64-bit register (two 32-bit writes, low first).
    /// Doorbells are 32-bit registers: a 64-bit write to them is recorded and
    /// ignored.
    pub fn write64(&mut self, offset: usize, value: u64) {
        if self.gone {
            return;
        }
        if !offset.is_multiple_of(8)
            || offset >= DOORBELLS
            || offset.checked_add(8).is_none_or(|e| e > self.cfg.bar_len)
        {
            self.violation(format!(
                "64-bit register write of {value:#x} at invalid offset {offset:#x}"
            ));
            return;
        }
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }

    /// CC write: EN and SHN transitions.
    fn write_cc(&mut self, value: u32) {
        if self.regs.wedged {
            // Wedged: the first CC write after the enable makes it ready,
            // and nothing written to CC changes anything any more.
            self.regs.rdy = true;
            self.regs.pending_rdy = None;
            return;
        }
        let old = self.regs.cc;
        self.regs.cc = value;
        let (was, now) = (old & 1 != 0, value & 1 != 0);
        match (was, now) {
            (false, true) => self.enable(),
            (true, false) => self.disable(),
            (true, true) if (old ^ value) & CC_CONFIG_MASK != 0 => self.violation(format!(
                "CC changed from {old:#x} to {value:#x} while CC.EN = 1 (CSS, MPS, AMS, IOSQES and IOCQES may change only while disabled)"
            )),
            _ => {}
        }
        let (old_shn, shn) = ((old >> 14) & 3, (value >> 14) & 3);
        if shn != 0 && old_shn == 0 {
            self.shutdown();
        } else if shn == 0 && old_shn != 0 {
            // As QEMU: clearing CC.SHN clears CSTS.SHST.
            self.regs.shst = 0;
            self.regs.pending_shst = None;
        }
    }

    fn set_rdy_later(&mut self, value: bool) {
        if self.cfg.ready_delay_reads == 0 {
            self.regs.rdy = value;
            self.regs.pending_rdy = None;
        } else {
            self.regs.pending_rdy = Some((value, self.cfg.ready_delay_reads));
        }
    }

    /// CC.EN 0→1: check the admin queue setup as QEMU does, latch it, and
    /// become ready ("Controller Initialization"). A configuration the controller cannot run sets
    /// CSTS.CFS instead, and is recorded.
    fn enable(&mut self) {
        // NVMe 2.0 §3.5.2: after CC.EN = 0 the host waits for CSTS.RDY = 0
        // before setting CC.EN again.
        if self.regs.rdy || matches!(self.regs.pending_rdy, Some((false, _))) {
            self.violation(
                "CC.EN set to 1 before CSTS.RDY returned to 0 after the last CC.EN = 0".into(),
            );
        }
        self.health.power_cycles += 1;
        let cc = self.regs.cc;
        let mps = (cc >> 7) & 0xf;
        let page = 4096u64 << mps.min(MPSMAX);
        let asqs = (self.regs.aqa & 0xfff) + 1;
        let acqs = ((self.regs.aqa >> 16) & 0xfff) + 1;
        let (asq, acq) = (self.regs.asq, self.regs.acq);
        let problem = if mps > MPSMAX {
            Some(format!("CC.MPS {mps} above CAP.MPSMAX {MPSMAX}"))
        } else if (cc >> 4) & 7 != 0 && (cc >> 4) & 7 != 6 && (cc >> 4) & 7 != 7 {
            Some(format!("CC.CSS {} not supported", (cc >> 4) & 7))
        } else if (cc >> 16) & 0xf != 6 {
            Some(format!(
                "CC.IOSQES {} (must be 6: 64-byte entries)",
                (cc >> 16) & 0xf
            ))
        } else if (cc >> 20) & 0xf != 4 {
            Some(format!(
                "CC.IOCQES {} (must be 4: 16-byte entries)",
                (cc >> 20) & 0xf
            ))
        } else if asqs < 2 || acqs < 2 {
            Some(format!(
                "AQA {:#x}: admin queues need at least 2 entries",
                self.regs.aqa
            ))
        } else if asq == 0 || asq % page != 0 || acq == 0 || acq % page != 0 {
            Some(format!(
                "ASQ {asq:#x} / ACQ {acq:#x} must be non-zero and memory-page aligned"
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            self.violation(format!(
                "CC.EN set with an invalid configuration: {p}; controller fatal"
            ));
            self.fatal = true;
            return;
        }
        self.regs.page = page;
        self.shut_down = false;
        self.drop_queues();
        self.sqs.insert(
            0,
            SubQueue {
                base: asq,
                size: asqs,
                head: 0,
                tail: 0,
                frozen_head: None,
                cqid: 0,
            },
        );
        self.cqs.insert(0, CompQueue::new(acq, acqs, true));
        if self.faults.take(Fault::Wedged) {
            self.regs.pending_rdy = None;
            self.regs.rdy = false;
            self.regs.wedged = true;
        } else if self.faults.take(Fault::NeverReady) {
            self.regs.pending_rdy = None;
            self.regs.rdy = false;
        } else {
            self.set_rdy_later(true);
        }
    }

    /// CC.EN 1→0: Controller Reset. Every queue and every command in
    /// flight is forgotten, features return to their defaults, CSTS.CFS
    /// clears, and CSTS.RDY follows.
    fn disable(&mut self) {
        // CC.EN: clearing it from 1 to 0 while CSTS.RDY is 0 has undefined
        // results. A controller still on its way to ready (not one that
        // never gets there, which the host gives up on after CAP.TO).
        if !self.regs.rdy && matches!(self.regs.pending_rdy, Some((true, _))) {
            self.violation(
                "CC.EN cleared to 0 before CSTS.RDY became 1 after the last CC.EN = 1".into(),
            );
        }
        if !self.shut_down {
            self.health.unsafe_shutdowns += 1;
        }
        self.drop_queues();
        self.events.clear();
        // Every event type unmasked again (as QEMU's reset clears its mask).
        self.aer_masked = 0;
        self.ns_notice_masked = false;
        self.queues_created = false;
        self.features = Default::default();
        self.fatal = false;
        self.shut_down = false;
        if self.regs.rdy {
            self.set_rdy_later(false);
        } else {
            // Never ready (or not yet): CSTS.RDY already reads 0, and the
            // host may set CC.EN again.
            self.regs.pending_rdy = None;
        }
    }

    /// CC.SHN 00b→01b/10b ("Shutdown Processing"): the controller stops, forgets its queues
    /// (as QEMU does) and reports SHST "complete", possibly after some CSTS
    /// reads, or never with [`Fault::NeverShutdownComplete`].
    fn shutdown(&mut self) {
        self.drop_queues();
        self.shut_down = true;
        if self.faults.take(Fault::NeverShutdownComplete) {
            self.regs.shst = SHST_OCCURRING;
            self.regs.pending_shst = None;
        } else if self.cfg.shutdown_delay_reads == 0 {
            self.regs.shst = SHST_COMPLETE;
            self.regs.pending_shst = None;
        } else {
            self.regs.shst = SHST_OCCURRING;
            self.regs.pending_shst = Some(self.cfg.shutdown_delay_reads);
        }
    }
}

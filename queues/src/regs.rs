//! Controller registers (NVMe Base Specification 2.0, §3.1 "Register Definition").
//!
//! Each register is a plain newtype over its raw little-endian value as read
//! from BAR0; accessors decode the fields named in the specification. Nothing
//! here touches memory: the `dma` crate performs the volatile MMIO accesses and
//! hands the raw values to these types.

use core::fmt;

/// Offset of CAP, Controller Capabilities (64 bit, §3.1.3.1).
pub const REG_CAP: usize = 0x00;
/// Offset of VS, Version (32 bit, §3.1.3.2).
pub const REG_VS: usize = 0x08;
/// Offset of INTMS, Interrupt Mask Set (32 bit, §3.1.3.3).
pub const REG_INTMS: usize = 0x0c;
/// Offset of INTMC, Interrupt Mask Clear (32 bit, §3.1.3.4).
pub const REG_INTMC: usize = 0x10;
/// Offset of CC, Controller Configuration (32 bit, §3.1.3.5).
pub const REG_CC: usize = 0x14;
/// Offset of CSTS, Controller Status (32 bit, §3.1.3.6).
pub const REG_CSTS: usize = 0x1c;
/// Offset of NSSR, NVM Subsystem Reset (32 bit, §3.1.3.7).
pub const REG_NSSR: usize = 0x20;
/// Offset of AQA, Admin Queue Attributes (32 bit, §3.1.3.8).
pub const REG_AQA: usize = 0x24;
/// Offset of ASQ, Admin Submission Queue Base Address (64 bit, §3.1.3.9).
pub const REG_ASQ: usize = 0x28;
/// Offset of ACQ, Admin Completion Queue Base Address (64 bit, §3.1.3.10).
pub const REG_ACQ: usize = 0x30;
/// Offset of CMBLOC, Controller Memory Buffer Location (32 bit, §3.1.3.11).
pub const REG_CMBLOC: usize = 0x38;
/// Offset of CMBSZ, Controller Memory Buffer Size (32 bit, §3.1.3.12).
pub const REG_CMBSZ: usize = 0x3c;
/// Offset of CRTO, Controller Ready Timeouts (32 bit, NVMe 2.0 §3.1.3.13;
/// present when CAP.CRMS is non-zero).
pub const REG_CRTO: usize = 0x68;
/// Offset of the first doorbell register, SQ0TDBL (Submission Queue 0 Tail
/// Doorbell, §3.1.3.22).
pub const DOORBELL_BASE: usize = 0x1000;

/// Extracts `width` bits of `v` starting at bit `lo`.
#[inline]
const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

/// Extracts `width` bits of `v` starting at bit `lo`.
#[inline]
const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

/// Returns `v` with the `width`-bit field at bit `lo` replaced by `field`
/// (extra high bits of `field` are discarded).
#[inline]
const fn set_bits32(v: u32, lo: u32, width: u32, field: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

/// CAP — Controller Capabilities (§3.1.3.1), the raw 64-bit register value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// CAP.MQES (bits 15:0), Maximum Queue Entries Supported, **0-based** as in
    /// the register (a value of 1 means 2 entries). See [`Cap::max_queue_entries`].
    pub fn mqes(&self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }

    /// CAP.CQR (bit 16), Contiguous Queues Required.
    pub fn cqr(&self) -> bool {
        bits64(self.0, 16, 1) != 0
    }

    /// CAP.AMS (bits 18:17), Arbitration Mechanism Supported.
    pub fn ams(&self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }

    /// CAP.TO (bits 31:24), Timeout: worst-case time to wait for CSTS.RDY to
    /// change after CC.EN changes, in 500 ms units. See [`Cap::timeout_ms`].
    pub fn to(&self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }

    /// CAP.DSTRD (bits 35:32), Doorbell Stride: doorbells are `4 << DSTRD`
    /// bytes apart.
    pub fn dstrd(&self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }

    /// CAP.NSSRS (bit 36), NVM Subsystem Reset Supported.
    pub fn nssrs(&self) -> bool {
        bits64(self.0, 36, 1) != 0
    }

    /// CAP.CSS (bits 44:37), Command Sets Supported (bit 0 of the field: NVM
    /// Command Set; bit 6: one or more I/O Command Sets; bit 7: no I/O
    /// Command Set, admin only).
    pub fn css(&self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }

    /// CAP.BPS (bit 45), Boot Partition Support.
    pub fn bps(&self) -> bool {
        bits64(self.0, 45, 1) != 0
    }

    /// CAP.MPSMIN (bits 51:48), Memory Page Size Minimum: `2^(12 + MPSMIN)` bytes.
    pub fn mpsmin(&self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }

    /// CAP.MPSMAX (bits 55:52), Memory Page Size Maximum: `2^(12 + MPSMAX)` bytes.
    pub fn mpsmax(&self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }

    /// CAP.PMRS (bit 56), Persistent Memory Region Supported.
    pub fn pmrs(&self) -> bool {
        bits64(self.0, 56, 1) != 0
    }

    /// CAP.CMBS (bit 57), Controller Memory Buffer Supported.
    pub fn cmbs(&self) -> bool {
        bits64(self.0, 57, 1) != 0
    }

    /// CAP.CRMS.CRWMS (bit 59), Controller Ready With Media Support: the
    /// controller reports in CRTO.CRWMT how long CSTS.RDY may take after
    /// CC.EN = 1 (with CC.CRIME = 0), which may exceed what CAP.TO can
    /// express (CAP.TO is then the lower of FFh and CRWMT).
    pub fn crwms(&self) -> bool {
        bits64(self.0, 59, 1) != 0
    }

    /// CAP.CRMS.CRIMS (bit 60), Controller Ready Independent of Media
    /// Support (CC.CRIME may be set; upnvme leaves it clear).
    pub fn crims(&self) -> bool {
        bits64(self.0, 60, 1) != 0
    }

    /// The CAP.TO timeout in milliseconds (`TO * 500`), but never less than
    /// 500 ms so that a controller reporting TO = 0 still gets a bounded,
    /// non-zero wait.
    pub fn timeout_ms(&self) -> u64 {
        (u64::from(self.to()) * 500).max(500)
    }

    /// CAP.MQES + 1: the largest number of entries an I/O queue may have
    /// (1..=65536; the specification requires at least 2).
    pub fn max_queue_entries(&self) -> u32 {
        u32::from(self.mqes()) + 1
    }

    /// Smallest memory page size the controller supports, `2^(12 + CAP.MPSMIN)` bytes.
    pub fn min_page_size(&self) -> usize {
        1usize << (12 + u32::from(self.mpsmin()))
    }

    /// Largest memory page size the controller supports, `2^(12 + CAP.MPSMAX)` bytes.
    pub fn max_page_size(&self) -> usize {
        1usize << (12 + u32::from(self.mpsmax()))
    }
}

/// CRTO — Controller Ready Timeouts (NVMe 2.0 §3.1.3.13), the raw 32-bit
/// register value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crto(pub u32);

impl Crto {
    /// CRTO.CRWMT (bits 15:0), Controller Ready With Media Timeout, in
    /// 500 ms units: the worst-case wait for CSTS.RDY = 1 after CC.EN = 1
    /// when CC.CRIME = 0.
    pub fn crwmt(&self) -> u16 {
        bits32(self.0, 0, 16) as u16
    }

    /// CRTO.CRIMT (bits 31:16), Controller Ready Independent of Media
    /// Timeout, in 500 ms units (the wait when CC.CRIME = 1).
    pub fn crimt(&self) -> u16 {
        bits32(self.0, 16, 16) as u16
    }

    /// CRTO.CRWMT in milliseconds (`CRWMT * 500`; 0 when not reported).
    pub fn crwmt_ms(&self) -> u64 {
        u64::from(self.crwmt()) * 500
    }
}

/// VS — Version (§3.1.3.2), the raw 32-bit register value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Vs(pub u32);

impl Vs {
    /// VS.MJR (bits 31:16), Major Version Number.
    pub fn major(&self) -> u16 {
        bits32(self.0, 16, 16) as u16
    }

    /// VS.MNR (bits 15:8), Minor Version Number.
    pub fn minor(&self) -> u8 {
        bits32(self.0, 8, 8) as u8
    }

    /// VS.TER (bits 7:0), Tertiary Version Number.
    pub fn tertiary(&self) -> u8 {
        bits32(self.0, 0, 8) as u8
    }
}

impl fmt::Display for Vs {
    /// Formats as `major.minor.tertiary`, e.g. `1.4.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

/// CC — Controller Configuration (§3.1.3.5), the raw 32-bit register value,
/// with builder-style setters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    /// CC.SHN value 00b: no notification, no effect.
    pub const SHN_NONE: u8 = 0;
    /// CC.SHN value 01b: normal shutdown notification.
    pub const SHN_NORMAL: u8 = 1;
    /// CC.SHN value 10b: abrupt shutdown notification.
    pub const SHN_ABRUPT: u8 = 2;
    /// CC.CSS value 000b: NVM Command Set.
    pub const CSS_NVM: u8 = 0;
    /// CC.CSS value 110b: all supported I/O Command Sets.
    pub const CSS_ALL_IO: u8 = 6;
    /// CC.CSS value 111b: Admin Command Set only.
    pub const CSS_ADMIN_ONLY: u8 = 7;

    /// An all-zero CC (controller disabled, every field 0).
    pub const fn new() -> Cc {
        Cc(0)
    }

    /// CC.EN (bit 0), Enable.
    pub fn en(&self) -> bool {
        bits32(self.0, 0, 1) != 0
    }

    /// Returns a copy with CC.EN set to `en`.
    pub fn with_en(self, en: bool) -> Self {
        Cc(set_bits32(self.0, 0, 1, u32::from(en)))
    }

    /// CC.CSS (bits 6:4), I/O Command Set Selected.
    pub fn css(&self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }

    /// Returns a copy with CC.CSS set to `css` (3 bits).
    pub fn with_css(self, css: u8) -> Self {
        Cc(set_bits32(self.0, 4, 3, u32::from(css)))
    }

    /// CC.MPS (bits 10:7), Memory Page Size: `2^(12 + MPS)` bytes.
    pub fn mps(&self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }

    /// Returns a copy with CC.MPS set to `mps` (4 bits).
    pub fn with_mps(self, mps: u8) -> Self {
        Cc(set_bits32(self.0, 7, 4, u32::from(mps)))
    }

    /// CC.AMS (bits 13:11), Arbitration Mechanism Selected.
    pub fn ams(&self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }

    /// Returns a copy with CC.AMS set to `ams` (3 bits).
    pub fn with_ams(self, ams: u8) -> Self {
        Cc(set_bits32(self.0, 11, 3, u32::from(ams)))
    }

    /// CC.SHN (bits 15:14), Shutdown Notification (see `Cc::SHN_*`).
    pub fn shn(&self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }

    /// Returns a copy with CC.SHN set to `shn` (2 bits).
    pub fn with_shn(self, shn: u8) -> Self {
        Cc(set_bits32(self.0, 14, 2, u32::from(shn)))
    }

    /// CC.IOSQES (bits 19:16), I/O Submission Queue Entry Size as a power of
    /// two (6 for the 64-byte SQE).
    pub fn iosqes(&self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }

    /// Returns a copy with CC.IOSQES set to `iosqes` (4 bits).
    pub fn with_iosqes(self, iosqes: u8) -> Self {
        Cc(set_bits32(self.0, 16, 4, u32::from(iosqes)))
    }

    /// CC.IOCQES (bits 23:20), I/O Completion Queue Entry Size as a power of
    /// two (4 for the 16-byte CQE).
    pub fn iocqes(&self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }

    /// Returns a copy with CC.IOCQES set to `iocqes` (4 bits).
    pub fn with_iocqes(self, iocqes: u8) -> Self {
        Cc(set_bits32(self.0, 20, 4, u32::from(iocqes)))
    }

    /// CC.CRIME (bit 24), Controller Ready Independent of Media Enable.
    pub fn crime(&self) -> bool {
        bits32(self.0, 24, 1) != 0
    }
}

/// CSTS — Controller Status (§3.1.3.6), the raw 32-bit register value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// CSTS.SHST value 00b: normal operation, no shutdown requested.
    pub const SHST_NORMAL: u8 = 0;
    /// CSTS.SHST value 01b: shutdown processing occurring.
    pub const SHST_OCCURRING: u8 = 1;
    /// CSTS.SHST value 10b: shutdown processing complete.
    pub const SHST_COMPLETE: u8 = 2;

    /// CSTS.RDY (bit 0), Ready.
    pub fn rdy(&self) -> bool {
        bits32(self.0, 0, 1) != 0
    }

    /// CSTS.CFS (bit 1), Controller Fatal Status.
    pub fn cfs(&self) -> bool {
        bits32(self.0, 1, 1) != 0
    }

    /// CSTS.SHST (bits 3:2), Shutdown Status (see `Csts::SHST_*`).
    pub fn shst(&self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }

    /// CSTS.NSSRO (bit 4), NVM Subsystem Reset Occurred.
    pub fn nssro(&self) -> bool {
        bits32(self.0, 4, 1) != 0
    }

    /// CSTS.PP (bit 5), Processing Paused.
    pub fn pp(&self) -> bool {
        bits32(self.0, 5, 1) != 0
    }

    /// CSTS.ST (bit 6), Shutdown Type.
    pub fn st(&self) -> bool {
        bits32(self.0, 6, 1) != 0
    }

    /// True when CSTS reads as `0xffff_ffff`: the PCIe read was not answered
    /// (device removed, link down, or BAR unmapped). Every other field is then
    /// meaningless, so check this before [`Csts::cfs`] or [`Csts::rdy`].
    pub fn is_all_ones(&self) -> bool {
        self.0 == 0xffff_ffff
    }
}

/// Encodes AQA — Admin Queue Attributes (§3.1.3.8): ASQS (bits 11:0) and ACQS
/// (bits 27:16) are **0-based** sizes, so this takes 1-based entry counts and
/// subtracts one. Counts are expected in 2..=4096; larger values are truncated
/// to the 12-bit fields and 0 is treated as 1, so validate before calling.
pub fn aqa(asqs_entries: u32, acqs_entries: u32) -> u32 {
    let asqs = asqs_entries.saturating_sub(1) & 0xfff;
    let acqs = acqs_entries.saturating_sub(1) & 0xfff;
    asqs | (acqs << 16)
}

/// Stride between doorbell registers in bytes, `4 << CAP.DSTRD` (only the 4
/// low bits of `dstrd` are used, as in the register).
#[inline]
pub fn doorbell_stride(dstrd: u8) -> usize {
    4usize << (dstrd & 0xf)
}

/// BAR0 offset of SQyTDBL, the Submission Queue `qid` Tail Doorbell
/// (§3.1.3.22): `0x1000 + (2 * qid) * (4 << CAP.DSTRD)`.
#[inline]
pub fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * usize::from(qid)) * doorbell_stride(dstrd)
}

/// BAR0 offset of CQyHDBL, the Completion Queue `qid` Head Doorbell
/// (§3.1.3.23): `0x1000 + (2 * qid + 1) * (4 << CAP.DSTRD)`.
#[inline]
pub fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * usize::from(qid) + 1) * doorbell_stride(dstrd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_fields() {
        // QEMU-like CAP: MQES=2047, CQR=1, AMS=0, TO=15, DSTRD=0, NSSRS=1,
        // CSS=0xc1 (NVM + I/O sets + admin only bit), MPSMIN=0, MPSMAX=4, CMBS=1.
        let raw: u64 =
            2047 | (1 << 16) | (15 << 24) | (1 << 36) | (0xc1 << 37) | (4 << 52) | (1 << 57);
        let cap = Cap(raw);
        assert_eq!(cap.mqes(), 2047);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 15);
        assert_eq!(cap.timeout_ms(), 7500);
        assert_eq!(cap.dstrd(), 0);
        assert!(cap.nssrs());
        assert_eq!(cap.css(), 0xc1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
        assert_eq!(cap.min_page_size(), 4096);
        assert_eq!(cap.max_page_size(), 65536);
        assert!(cap.cmbs());
        assert!(!cap.pmrs());
        assert!(!cap.crwms() && !cap.crims());
        // CRMS = 01b (bit 59: CRWMS only), then both.
        assert!(Cap(raw | 1 << 59).crwms() && !Cap(raw | 1 << 59).crims());
        assert!(Cap(raw | 3 << 59).crims());
    }

    #[test]
    fn crto_fields() {
        // CRIMT = 2 (1 s), CRWMT = 600 (300 s: more than CAP.TO's 127.5 s).
        let crto = Crto(2 << 16 | 600);
        assert_eq!(crto.crwmt(), 600);
        assert_eq!(crto.crimt(), 2);
        assert_eq!(crto.crwmt_ms(), 300_000);
        assert_eq!(Crto(u32::MAX).crwmt_ms(), 65_535 * 500);
    }

    #[test]
    fn cap_extremes_do_not_panic() {
        let cap = Cap(u64::MAX);
        assert_eq!(cap.max_queue_entries(), 65536);
        assert_eq!(cap.timeout_ms(), 255 * 500);
        assert_eq!(cap.min_page_size(), 1 << 27);
        assert_eq!(Cap(0).timeout_ms(), 500);
        assert_eq!(Cap(0).max_queue_entries(), 1);
    }

    #[test]
    fn vs_display() {
        assert_eq!(Vs(0x0001_0400).to_string(), "1.4.0");
        assert_eq!(Vs(0x0002_0001).to_string(), "2.0.1");
        assert_eq!(Vs(0x0001_0400).major(), 1);
        assert_eq!(Vs(0x0001_0400).minor(), 4);
    }

    #[test]
    fn cc_builder() {
        let cc = Cc::new()
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(Cc::CSS_NVM)
            .with_en(true);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        let sd = cc.with_shn(Cc::SHN_NORMAL);
        assert_eq!(sd.shn(), Cc::SHN_NORMAL);
        assert_eq!(sd.0, 0x0046_4001);
        assert!(!sd.with_en(false).en());
        // Oversized values are masked to the field, not spilled.
        assert_eq!(Cc::new().with_shn(0xff).0, 0x0000_c000);
        assert_eq!(Cc::new().with_mps(2).mps(), 2);
        assert_eq!(Cc::new().with_ams(1).ams(), 1);
    }

    #[test]
    fn csts_fields() {
        let c = Csts(0b10_1001);
        assert!(c.rdy());
        assert!(!c.cfs());
        assert_eq!(c.shst(), Csts::SHST_COMPLETE);
        assert!(c.pp());
        assert!(!c.nssro());
        assert!(Csts(0xffff_ffff).is_all_ones());
        assert!(!Csts(3).is_all_ones());
        assert!(Csts(2).cfs());
    }

    #[test]
    fn aqa_is_zero_based() {
        assert_eq!(aqa(32, 32), 0x001f_001f);
        assert_eq!(aqa(4096, 2), 0x0001_0fff);
        assert_eq!(aqa(0, 0), 0);
    }

    #[test]
    fn doorbells() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100c);
        assert_eq!(sq_tail_doorbell(1, 1), 0x1010);
        assert_eq!(cq_head_doorbell(3, 2), 0x1000 + 7 * 16);
        // Largest inputs stay in range on 64-bit targets and do not panic.
        let _ = cq_head_doorbell(u16::MAX, u8::MAX);
    }
}

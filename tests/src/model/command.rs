//! The model's own decoder of submission queue entries (NVMe Base
//! Specification 2.0, "Submission Queue Entry" / "Common Command Format") and
//! encoder of completion queue entries ("Completion Queue Entry").
//!
//! Deliberately independent of the driver's structures: the model reads the
//! raw bytes at the offsets the specification gives, so a layout bug in the
//! driver shows up as a wrong command, not as two identical mistakes.

/// Size of a submission queue entry (CC.IOSQES = 6, admin queue fixed).
pub(crate) const SQE_SIZE: u64 = 64;
/// Size of a completion queue entry (CC.IOCQES = 4, admin queue fixed).
pub(crate) const CQE_SIZE: u64 = 16;

/// Admin command opcodes (§5 "Admin Command Set").
pub(crate) mod admin_op {
    /// Delete I/O Submission Queue (§5.7).
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue (§5.5).
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page (§5.16).
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue (§5.6).
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue (§5.4).
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify (§5.17).
    pub const IDENTIFY: u8 = 0x06;
    /// Abort (§5.1).
    pub const ABORT: u8 = 0x08;
    /// Set Features (§5.27).
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features (§5.15).
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request (§5.2).
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Format NVM (NVM Command Set Specification, "Format NVM command").
    pub const FORMAT_NVM: u8 = 0x80;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Doorbell Buffer Config (§5.8).
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
}

/// NVM command set I/O opcodes (NVM Command Set Specification 1.0).
pub(crate) mod io_op {
    /// Flush (Base Specification, I/O commands).
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// Verify.
    pub const VERIFY: u8 = 0x0c;
    /// Copy.
    pub const COPY: u8 = 0x19;
}

/// One submission queue entry as raw bytes, with field accessors.
#[derive(Clone, Copy)]
pub(crate) struct Command {
    raw: [u8; 64],
}

#[inline]
fn le16(b: &[u8; 64], o: usize) -> u16 {
    match b.get(o..o + 2) {
        Some(&[a, c]) => u16::from_le_bytes([a, c]),
        _ => 0,
    }
}

#[inline]
fn le32(b: &[u8; 64], o: usize) -> u32 {
    match b.get(o..o + 4) {
        Some(&[a, c, d, e]) => u32::from_le_bytes([a, c, d, e]),
        _ => 0,
    }
}

impl Command {
    /// The 64 bytes as fetched.
    pub fn raw(&self) -> &[u8; 64] {
        &self.raw
    }

    /// Wraps the 64 bytes fetched from a submission queue slot.
    pub fn new(raw: [u8; 64]) -> Self {
        Command { raw }
    }

    /// CDW0 bits 07:00, OPC (Opcode).
    pub fn opcode(&self) -> u8 {
        self.raw[0]
    }

    /// CDW0 bits 09:08, FUSE (Fused Operation).
    pub fn fuse(&self) -> u8 {
        self.raw[1] & 0x3
    }

    /// CDW0 bits 15:14, PSDT (PRP or SGL for Data Transfer).
    pub fn psdt(&self) -> u8 {
        self.raw[1] >> 6
    }

    /// CDW0 bits 31:16, CID (Command Identifier).
    pub fn cid(&self) -> u16 {
        le16(&self.raw, 2)
    }

    /// Bytes 07:04, NSID (Namespace Identifier).
    pub fn nsid(&self) -> u32 {
        le32(&self.raw, 4)
    }

    /// Bytes 31:24, DPTR.PRP1 (PRP Entry 1).
    pub fn prp1(&self) -> u64 {
        u64::from(le32(&self.raw, 24)) | u64::from(le32(&self.raw, 28)) << 32
    }

    /// Bytes 39:32, DPTR.PRP2 (PRP Entry 2).
    pub fn prp2(&self) -> u64 {
        u64::from(le32(&self.raw, 32)) | u64::from(le32(&self.raw, 36)) << 32
    }

    /// Bytes 23:16, MPTR (Metadata Pointer).
    pub fn mptr(&self) -> u64 {
        u64::from(le32(&self.raw, 16)) | u64::from(le32(&self.raw, 20)) << 32
    }

    /// Command Dword `n` (2, 3 and 10..=15; other values read 0).
    pub fn cdw(&self, n: usize) -> u32 {
        match n {
            2 | 3 => le32(&self.raw, 8 + (n - 2) * 4),
            10..=15 => le32(&self.raw, 40 + (n - 10) * 4),
            _ => 0,
        }
    }

    /// CDW10 and CDW11 as one 64-bit value (SLBA of I/O commands).
    pub fn cdw10_11(&self) -> u64 {
        u64::from(self.cdw(10)) | u64::from(self.cdw(11)) << 32
    }
}

/// The dwords of a completion queue entry before the phase tag is added
/// ("Completion Queue Entry", Common Completion Queue Entry Layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CqeWords {
    /// DW0, command specific.
    pub dw0: u32,
    /// DW1, command specific.
    pub dw1: u32,
    /// DW2 bits 15:00, SQHD (SQ Head Pointer).
    pub sqhd: u16,
    /// DW2 bits 31:16, SQID (SQ Identifier).
    pub sqid: u16,
    /// DW3 bits 15:00, CID (Command Identifier).
    pub cid: u16,
    /// DW3 bits 31:17, Status Field.
    pub status: u16,
}

impl CqeWords {
    /// DW2 as posted.
    pub fn dw2(&self) -> u32 {
        u32::from(self.sqhd) | u32::from(self.sqid) << 16
    }

    /// DW3: CID, P (Phase Tag, bit 16) and Status Field.
    pub fn dw3(&self, phase: bool) -> u32 {
        u32::from(self.cid) | u32::from(phase) << 16 | u32::from(self.status & 0x7fff) << 17
    }
}

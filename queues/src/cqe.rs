//! Completion Queue Entry (NVMe Base Specification 2.0, §4.6 "Completion
//! Queue Entry"): 16 bytes, the last dword carrying the Phase Tag that tells
//! the host the entry is new.
//!
//! Layout of the four dwords:
//! - DW0, DW1: command specific;
//! - DW2: SQHD (bits 15:0, SQ Head Pointer) and SQID (bits 31:16);
//! - DW3: CID (bits 15:0), P (bit 16, Phase Tag), Status Field (bits 31:17).

use crate::status::Status;

/// Size in bytes of a Submission Queue Entry (CC.IOSQES = 6).
pub const SQE_SIZE: usize = 64;
/// Size in bytes of a Completion Queue Entry (CC.IOCQES = 4).
pub const CQE_SIZE: usize = 16;

/// A 16-byte Completion Queue Entry as four dwords in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Dwords 0..=3.
    pub dw: [u32; 4],
}

const _: () = assert!(core::mem::size_of::<Cqe>() == CQE_SIZE);

impl Cqe {
    /// Dword 0, command specific (e.g. Set Features – Number of Queues result,
    /// Asynchronous Event information).
    pub fn dw0(&self) -> u32 {
        self.dw[0]
    }

    /// Dword 1, command specific.
    pub fn dw1(&self) -> u32 {
        self.dw[1]
    }

    /// DW2.SQHD (bits 15:0), SQ Head Pointer: the submission queue slot the
    /// controller will fetch next. Untrusted: validate with
    /// [`crate::SqRing::update_head`].
    pub fn sqhd(&self) -> u16 {
        self.dw[2] as u16
    }

    /// DW2.SQID (bits 31:16), SQ Identifier the command was submitted to.
    pub fn sqid(&self) -> u16 {
        (self.dw[2] >> 16) as u16
    }

    /// DW3.CID (bits 15:0), Command Identifier. Untrusted: validate with
    /// [`crate::CidTable::complete`].
    pub fn cid(&self) -> u16 {
        self.dw[3] as u16
    }

    /// DW3.P (bit 16), Phase Tag.
    pub fn phase(&self) -> bool {
        Cqe::phase_of_dw3(self.dw[3])
    }

    /// DW3 bits 31:17, the Status Field without the Phase Tag.
    pub fn status(&self) -> Status {
        Status::from_dw3(self.dw[3])
    }

    /// The Phase Tag of a raw DW3 value (bit 16): the poll loop loads DW3 with
    /// acquire ordering and tests this before reading the rest of the entry.
    #[inline]
    pub fn phase_of_dw3(dw3: u32) -> bool {
        dw3 & (1 << 16) != 0
    }

    /// Decodes the 16-byte little-endian image of an entry.
    pub fn from_le_bytes(bytes: &[u8; 16]) -> Cqe {
        let mut dw = [0u32; 4];
        for (d, c) in dw.iter_mut().zip(bytes.chunks_exact(4)) {
            *d = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Cqe { dw }
    }

    /// The 16-byte little-endian image of the entry (used by controller models).
    pub fn to_le_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (c, d) in out.chunks_exact_mut(4).zip(self.dw.iter()) {
            c.copy_from_slice(&d.to_le_bytes());
        }
        out
    }

    /// Assembles an entry from its fields (used by controller models and tests).
    pub fn new(dw0: u32, sqhd: u16, sqid: u16, cid: u16, phase: bool, status: Status) -> Cqe {
        Cqe {
            dw: [
                dw0,
                0,
                u32::from(sqhd) | (u32::from(sqid) << 16),
                u32::from(cid) | (u32::from(phase) << 16) | (u32::from(status.0 & 0x7fff) << 17),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_at_spec_offsets() {
        // Bytes 8-9 SQHD, 10-11 SQID, 12-13 CID, 14-15 phase + status.
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        b[8..10].copy_from_slice(&5u16.to_le_bytes());
        b[10..12].copy_from_slice(&1u16.to_le_bytes());
        b[12..14].copy_from_slice(&0x1234u16.to_le_bytes());
        // Status: DNR=1, SCT=0, SC=0x02; phase = 1.
        let sf: u16 = (1 << 14) | 0x02;
        b[14..16].copy_from_slice(&((sf << 1) | 1).to_le_bytes());
        let c = Cqe::from_le_bytes(&b);
        assert_eq!(c.dw0(), 0xdead_beef);
        assert_eq!(c.sqhd(), 5);
        assert_eq!(c.sqid(), 1);
        assert_eq!(c.cid(), 0x1234);
        assert!(c.phase());
        assert_eq!(c.status(), Status(sf));
        assert!(c.status().dnr());
        assert_eq!(c.status().sc(), 0x02);
        assert_eq!(c.to_le_bytes(), b);
        assert_eq!(Cqe::new(0xdead_beef, 5, 1, 0x1234, true, Status(sf)), c);
    }

    #[test]
    fn phase_only() {
        let c = Cqe::new(0, 0, 0, 0, true, Status::SUCCESS);
        assert!(c.phase());
        assert!(c.status().is_success());
        assert!(!Cqe::default().phase());
    }
}

//! End-to-end Data Protection (NVM Command Set Specification 1.0, §5.2
//! "End-to-end Data Protection"): the 8-byte Protection Information tuple
//! with a 16-bit guard (Guard, Application Tag, Reference Tag, big-endian
//! on the medium), its CRC-16 guard, and the PRINFO field of Read, Write,
//! Compare, Verify and Write Zeroes (CDW12 bits 29:26).

use crc::{CRC_16_T10_DIF, Crc};

/// Bytes of one Protection Information tuple with a 16-bit guard.
pub const PI_TUPLE_SIZE: usize = 8;

/// PRINFO bit 3 (CDW12 bit 29), PRACT, Protection Information Action: on a
/// write the controller generates the PI, on a read it strips it (when the
/// metadata is exactly the 8-byte tuple) after checking.
pub const PRACT: u8 = 1 << 3;
/// PRINFO bit 2 (CDW12 bit 28), PRCHK: check the Guard field.
pub const PRCHK_GUARD: u8 = 1 << 2;
/// PRINFO bit 1 (CDW12 bit 27), PRCHK: check the Application Tag.
pub const PRCHK_APP_TAG: u8 = 1 << 1;
/// PRINFO bit 0 (CDW12 bit 26), PRCHK: check the Reference Tag.
pub const PRCHK_REF_TAG: u8 = 1 << 0;
/// Where PRINFO sits in CDW12.
pub const PRINFO_SHIFT: u32 = 26;

const T10DIF: Crc<u16> = Crc::<u16>::new(&CRC_16_T10_DIF);

/// The Guard of a block: the CRC-16 of the T10 DIF polynomial (8BB7h,
/// initial value 0, no reflection) over the block's data and, when the PI
/// sits in the last 8 bytes of the metadata (DPS bit 3 clear), over the
/// metadata bytes before it: pass those as `metadata_before_pi`.
pub fn guard(data: &[u8], metadata_before_pi: &[u8]) -> u16 {
    let mut d = T10DIF.digest();
    d.update(data);
    d.update(metadata_before_pi);
    d.finalize()
}

/// One Protection Information tuple (16-bit guard format).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PiTuple {
    /// Guard: CRC-16 of the block's data (see [`guard`]).
    pub guard: u16,
    /// Application Tag. FFFFh disables checking of the block for Type 1
    /// and 2 (with a Reference Tag of FFFFFFFFh also for Type 3).
    pub app_tag: u16,
    /// Reference Tag: for Type 1 the lower 32 bits of the block's LBA, for
    /// Type 2 the command's initial tag plus the block's index; Type 3
    /// leaves it to the application.
    pub ref_tag: u32,
}

impl PiTuple {
    /// The tuple as it sits in metadata (big-endian fields).
    pub fn to_bytes(self) -> [u8; PI_TUPLE_SIZE] {
        let mut b = [0u8; PI_TUPLE_SIZE];
        b[0..2].copy_from_slice(&self.guard.to_be_bytes());
        b[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
        b[4..8].copy_from_slice(&self.ref_tag.to_be_bytes());
        b
    }

    /// Parses a tuple from its 8 bytes.
    pub fn from_bytes(b: [u8; PI_TUPLE_SIZE]) -> PiTuple {
        PiTuple {
            guard: u16::from_be_bytes([b[0], b[1]]),
            app_tag: u16::from_be_bytes([b[2], b[3]]),
            ref_tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// What a namespace's current LBA format says about PI (Identify Namespace
/// LBAF.LBADS, LBAF.MS, DPS): enough to build or check tuples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiFormat {
    /// Data bytes per logical block.
    pub lba_size: usize,
    /// Metadata bytes per logical block (LBAF.MS), at least 8 with PI.
    pub ms: usize,
    /// DPS bit 3: the tuple is the first 8 metadata bytes (else the last 8).
    pub first: bool,
    /// DPS bits 2:0: the PI type, 1 to 3.
    pub pi_type: u8,
}

impl PiFormat {
    /// Where the tuple sits in a block's metadata; `None` when MS is below 8.
    pub fn tuple_offset(&self) -> Option<usize> {
        let last = self.ms.checked_sub(PI_TUPLE_SIZE)?;
        Some(if self.first { 0 } else { last })
    }

    /// The tuple a block's data and metadata should carry.
    fn tuple_for(&self, data: &[u8], md: &[u8], at: usize, app_tag: u16, ref_tag: u32) -> PiTuple {
        let before = if self.first { &[][..] } else { &md[..at] };
        PiTuple {
            guard: guard(data, before),
            app_tag,
            ref_tag,
        }
    }

    /// The reference tag of the block after one tagged `tag`.
    fn next_tag(&self, tag: u32) -> u32 {
        if self.pi_type == 3 {
            tag
        } else {
            tag.wrapping_add(1)
        }
    }

    /// Fills the PI tuple of every block of a transfer, as a host does
    /// before a write with PRACT clear: `data` holds whole blocks, `metadata`
    /// their MS bytes each (separate metadata buffer). The reference tag
    /// starts at `ref_tag` and counts up per block unless the type is 3.
    /// Returns false when the sizes do not match the format.
    pub fn protect(&self, data: &[u8], metadata: &mut [u8], app_tag: u16, ref_tag: u32) -> bool {
        let Some(at) = self.tuple_offset() else {
            return false;
        };
        let (bs, ms) = (self.lba_size, self.ms);
        if bs == 0 || data.len() % bs != 0 || metadata.len() != data.len() / bs * ms {
            return false;
        }
        let mut tag = ref_tag;
        for (block, md) in data.chunks_exact(bs).zip(metadata.chunks_exact_mut(ms)) {
            let t = self.tuple_for(block, md, at, app_tag, tag);
            md[at..at + PI_TUPLE_SIZE].copy_from_slice(&t.to_bytes());
            tag = self.next_tag(tag);
        }
        true
    }

    /// [`PiFormat::protect`] for an extended-LBA buffer: blocks of
    /// `lba_size + ms` bytes, each block's metadata right after its data.
    pub fn protect_extended(&self, buf: &mut [u8], app_tag: u16, ref_tag: u32) -> bool {
        let Some(at) = self.tuple_offset() else {
            return false;
        };
        let stride = self.lba_size + self.ms;
        if self.lba_size == 0 || buf.len() % stride != 0 {
            return false;
        }
        let mut tag = ref_tag;
        for block in buf.chunks_exact_mut(stride) {
            let (data, md) = block.split_at_mut(self.lba_size);
            let t = self.tuple_for(data, md, at, app_tag, tag);
            md[at..at + PI_TUPLE_SIZE].copy_from_slice(&t.to_bytes());
            tag = self.next_tag(tag);
        }
        true
    }

    /// The tuple in one block's metadata.
    pub fn tuple(&self, md: &[u8]) -> Option<PiTuple> {
        let at = self.tuple_offset()?;
        let b: [u8; PI_TUPLE_SIZE] = md.get(at..at + PI_TUPLE_SIZE)?.try_into().ok()?;
        Some(PiTuple::from_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_is_the_t10_dif_crc() {
        // The CRC catalogue's check value for CRC-16/T10-DIF.
        assert_eq!(guard(b"123456789", &[]), 0xd0db);
        // Split input gives the same CRC as the whole.
        assert_eq!(guard(b"12345", b"6789"), 0xd0db);
        // A zero block has guard 0 (initial value 0, no final XOR).
        assert_eq!(guard(&[0u8; 4096], &[]), 0);
    }

    #[test]
    fn tuples_round_trip_big_endian() {
        let t = PiTuple {
            guard: 0x1234,
            app_tag: 0xabcd,
            ref_tag: 0x0102_0304,
        };
        assert_eq!(t.to_bytes(), [0x12, 0x34, 0xab, 0xcd, 1, 2, 3, 4]);
        assert_eq!(PiTuple::from_bytes(t.to_bytes()), t);
    }

    #[test]
    fn protect_fills_each_block_and_counts_the_reference_tag() {
        let data: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
        let f = PiFormat {
            lba_size: 512,
            ms: 16,
            first: false,
            pi_type: 1,
        };
        let mut md = vec![0xeeu8; 2 * 16];
        assert!(f.protect(&data, &mut md, 7, 100));
        for (i, m) in md.chunks_exact(16).enumerate() {
            let t = f.tuple(m).unwrap();
            assert_eq!(t.ref_tag, 100 + i as u32);
            assert_eq!(t.app_tag, 7);
            assert_eq!(t.guard, guard(&data[i * 512..(i + 1) * 512], &m[..8]));
        }
        // Type 3 keeps the tag; PI first covers no metadata.
        let f3 = PiFormat {
            ms: 8,
            first: true,
            pi_type: 3,
            ..f
        };
        let mut md8 = vec![0u8; 16];
        assert!(f3.protect(&data, &mut md8, 0, 9));
        assert_eq!(f3.tuple(&md8[8..]).unwrap().ref_tag, 9);
        assert_eq!(f3.tuple(&md8[8..]).unwrap().guard, guard(&data[512..], &[]));
        // The extended layout gives the same tuples.
        let mut ext = Vec::new();
        for b in data.chunks_exact(512) {
            ext.extend_from_slice(b);
            ext.extend_from_slice(&[0xee; 16]);
        }
        assert!(f.protect_extended(&mut ext, 7, 100));
        assert_eq!(&ext[512..528], &md[..16]);
        assert_eq!(&ext[528 + 512..], &md[16..]);
        // Sizes that do not match are refused.
        assert!(!f.protect(&data, &mut md[..8], 0, 0));
        let small = PiFormat { ms: 4, ..f };
        assert!(!small.protect(&data, &mut md, 0, 0));
        assert!(!f.protect_extended(&mut ext[..100], 0, 0));
    }
}

//! End-to-end Data Protection (NVM Command Set Specification 1.0, §5.2
//! "End-to-end Data Protection"): the Protection Information tuple with a
//! 16-bit guard (8 bytes: Guard, Application Tag, Reference Tag) or a 64-bit
//! guard (16 bytes: Guard, Application Tag, 48-bit Reference Tag; NVMe 2.0,
//! the Extended LBA Formats of TP4068), big-endian on the medium, their
//! guard CRCs, and the PRINFO field of Read, Write, Compare, Verify and Write
//! Zeroes (CDW12 bits 29:26).

use crc::{CRC_16_T10_DIF, CRC_64_NVME, Crc};

/// Bytes of one Protection Information tuple with a 16-bit guard.
pub const PI_TUPLE_SIZE: usize = 8;
/// Bytes of one Protection Information tuple with a 32- or 64-bit guard.
pub const PI_TUPLE_SIZE_EXTENDED: usize = 16;

/// PRINFO bit 3 (CDW12 bit 29), PRACT, Protection Information Action: on a
/// write the controller generates the PI, on a read it strips it (when the
/// metadata is exactly the PI tuple) after checking.
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
const NVME64: Crc<u64> = Crc::<u64>::new(&CRC_64_NVME);

/// Protection Information Format (PIF): the guard size of an LBA format,
/// from bits 8:7 of its Extended LBA Format dword (ELBAF) in the I/O
/// Command Set specific Identify Namespace data structure for the NVM
/// Command Set (CNS 05h). Formats of controllers without Extended LBA
/// Formats (Identify Controller CTRATT.ELBAS clear) are all 16-bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pif {
    /// 00b: 16-bit guard (CRC-16 T10 DIF), 32-bit reference tag, 8-byte
    /// tuple.
    #[default]
    Guard16,
    /// 01b: 32-bit guard (CRC-32C), 16-byte tuple. Reported, not built or
    /// checked by this crate.
    Guard32,
    /// 10b: 64-bit guard (CRC-64 NVMe), 48-bit storage and reference space,
    /// 16-byte tuple.
    Guard64,
}

impl Pif {
    /// PIF from ELBAF bits 8:7; `None` for the reserved 11b.
    pub fn from_elbaf(elbaf: u32) -> Option<Pif> {
        match (elbaf >> 7) & 0x3 {
            0 => Some(Pif::Guard16),
            1 => Some(Pif::Guard32),
            2 => Some(Pif::Guard64),
            _ => None,
        }
    }

    /// Bytes of one tuple in this format.
    pub fn tuple_size(self) -> usize {
        match self {
            Pif::Guard16 => PI_TUPLE_SIZE,
            Pif::Guard32 | Pif::Guard64 => PI_TUPLE_SIZE_EXTENDED,
        }
    }

    /// The largest reference tag of the format without storage tags (STS
    /// 0): 32 bits for the 16-bit guard, 48 for the 64-bit one, and the low
    /// 64 of the 80-bit space of the 32-bit guard (what a `u64` holds).
    pub fn ref_tag_max(self) -> u64 {
        match self {
            Pif::Guard16 => u64::from(u32::MAX),
            Pif::Guard32 => u64::MAX,
            Pif::Guard64 => (1 << 48) - 1,
        }
    }

    /// The guard size in bits.
    pub fn guard_bits(self) -> u32 {
        match self {
            Pif::Guard16 => 16,
            Pif::Guard32 => 32,
            Pif::Guard64 => 64,
        }
    }
}

/// The Guard of a block with a 16-bit guard: the CRC-16 of the T10 DIF
/// polynomial (8BB7h, initial value 0, no reflection) over the block's data
/// and, when the PI sits in the last bytes of the metadata (DPS bit 3
/// clear), over the metadata bytes before it: pass those as
/// `metadata_before_pi`.
pub fn guard(data: &[u8], metadata_before_pi: &[u8]) -> u16 {
    let mut d = T10DIF.digest();
    d.update(data);
    d.update(metadata_before_pi);
    d.finalize()
}

/// The Guard of a block with a 64-bit guard: the CRC-64 of the NVM Command
/// Set's polynomial (AD93D23594C93659h, initial value and final XOR all
/// ones, reflected), over the same bytes as [`guard`].
pub fn guard64(data: &[u8], metadata_before_pi: &[u8]) -> u64 {
    let mut d = NVME64.digest();
    d.update(data);
    d.update(metadata_before_pi);
    d.finalize()
}

/// One Protection Information tuple (16- or 64-bit guard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PiTuple {
    /// Guard: CRC-16 or CRC-64 of the block's data (see [`guard`],
    /// [`guard64`]).
    pub guard: u64,
    /// Application Tag. FFFFh disables checking of the block for Type 1
    /// and 2 (with an all-ones Reference Tag also for Type 3).
    pub app_tag: u16,
    /// Reference Tag: for Type 1 the lower 32 (16-bit guard) or 48 (64-bit
    /// guard) bits of the block's LBA, for Type 2 the command's initial tag
    /// plus the block's index; Type 3 leaves it to the application.
    pub ref_tag: u64,
}

impl PiTuple {
    /// Writes the tuple in format `pif` into `out` (its first
    /// `pif.tuple_size()` bytes, big-endian fields); false when `out` is too
    /// short, a field does not fit the format, or the format is the 32-bit
    /// guard.
    pub fn encode(self, pif: Pif, out: &mut [u8]) -> bool {
        let Some(out) = out.get_mut(..pif.tuple_size()) else {
            return false;
        };
        if self.ref_tag > pif.ref_tag_max() {
            return false;
        }
        match pif {
            Pif::Guard16 => {
                let Ok(g) = u16::try_from(self.guard) else {
                    return false;
                };
                out[0..2].copy_from_slice(&g.to_be_bytes());
                out[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
                out[4..8].copy_from_slice(&(self.ref_tag as u32).to_be_bytes());
            }
            Pif::Guard64 => {
                out[0..8].copy_from_slice(&self.guard.to_be_bytes());
                out[8..10].copy_from_slice(&self.app_tag.to_be_bytes());
                out[10..16].copy_from_slice(&self.ref_tag.to_be_bytes()[2..]);
            }
            Pif::Guard32 => return false,
        }
        true
    }

    /// Parses a tuple in format `pif` from the start of `b`; `None` when
    /// `b` is too short or the format is the 32-bit guard.
    pub fn decode(pif: Pif, b: &[u8]) -> Option<PiTuple> {
        let b = b.get(..pif.tuple_size())?;
        match pif {
            Pif::Guard16 => Some(PiTuple {
                guard: u64::from(u16::from_be_bytes([b[0], b[1]])),
                app_tag: u16::from_be_bytes([b[2], b[3]]),
                ref_tag: u64::from(u32::from_be_bytes([b[4], b[5], b[6], b[7]])),
            }),
            Pif::Guard64 => {
                let mut g = [0u8; 8];
                g.copy_from_slice(&b[0..8]);
                let mut r = [0u8; 8];
                r[2..].copy_from_slice(&b[10..16]);
                Some(PiTuple {
                    guard: u64::from_be_bytes(g),
                    app_tag: u16::from_be_bytes([b[8], b[9]]),
                    ref_tag: u64::from_be_bytes(r),
                })
            }
            Pif::Guard32 => None,
        }
    }
}

/// What a namespace's current LBA format says about PI (Identify Namespace
/// LBAF.LBADS, LBAF.MS, DPS, and ELBAF.PIF): enough to build or check
/// tuples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiFormat {
    /// Data bytes per logical block.
    pub lba_size: usize,
    /// Metadata bytes per logical block (LBAF.MS), at least the tuple size
    /// with PI.
    pub ms: usize,
    /// DPS bit 3: the tuple is the first bytes of the metadata (else the
    /// last).
    pub first: bool,
    /// DPS bits 2:0: the PI type, 1 to 3.
    pub pi_type: u8,
    /// The guard size (ELBAF.PIF).
    pub pif: Pif,
}

impl PiFormat {
    /// Where the tuple sits in a block's metadata; `None` when MS is below
    /// the tuple size.
    pub fn tuple_offset(&self) -> Option<usize> {
        let last = self.ms.checked_sub(self.pif.tuple_size())?;
        Some(if self.first { 0 } else { last })
    }

    /// The guard over a block's data and the metadata bytes before its
    /// tuple, in this format's width.
    pub fn guard_of(&self, data: &[u8], metadata_before_pi: &[u8]) -> u64 {
        match self.pif {
            Pif::Guard64 => guard64(data, metadata_before_pi),
            _ => u64::from(guard(data, metadata_before_pi)),
        }
    }

    /// The reference tag of the block after one tagged `tag` (Types 1 and
    /// 2 count, wrapping within the tag's width; Type 3 keeps it).
    fn next_tag(&self, tag: u64) -> u64 {
        if self.pi_type == 3 {
            tag
        } else {
            tag.wrapping_add(1) & self.pif.ref_tag_max()
        }
    }

    /// Whether this crate can build and check the format's tuples.
    fn usable(&self, ref_tag: u64) -> Option<usize> {
        if self.pif == Pif::Guard32 || ref_tag > self.pif.ref_tag_max() || self.lba_size == 0 {
            return None;
        }
        self.tuple_offset()
    }

    /// Fills the PI tuple of every block of a transfer, as a host does
    /// before a write with PRACT clear: `data` holds whole blocks, `metadata`
    /// their MS bytes each (separate metadata buffer). The reference tag
    /// starts at `ref_tag` and counts up per block unless the type is 3.
    /// Returns false when the sizes do not match the format, the tag does
    /// not fit it, or the format has a 32-bit guard.
    pub fn protect(&self, data: &[u8], metadata: &mut [u8], app_tag: u16, ref_tag: u64) -> bool {
        let Some(at) = self.usable(ref_tag) else {
            return false;
        };
        let (bs, ms) = (self.lba_size, self.ms);
        // Checked: the fields are public, so absurd sizes must not wrap.
        if !data.len().is_multiple_of(bs)
            || (data.len() / bs).checked_mul(ms) != Some(metadata.len())
        {
            return false;
        }
        let mut tag = ref_tag;
        for (block, md) in data.chunks_exact(bs).zip(metadata.chunks_exact_mut(ms)) {
            self.fill(block, md, at, app_tag, tag);
            tag = self.next_tag(tag);
        }
        true
    }

    /// [`PiFormat::protect`] for an extended-LBA buffer: blocks of
    /// `lba_size + ms` bytes, each block's metadata right after its data.
    pub fn protect_extended(&self, buf: &mut [u8], app_tag: u16, ref_tag: u64) -> bool {
        let Some(at) = self.usable(ref_tag) else {
            return false;
        };
        let Some(stride) = self.lba_size.checked_add(self.ms) else {
            return false;
        };
        if !buf.len().is_multiple_of(stride) {
            return false;
        }
        let mut tag = ref_tag;
        for block in buf.chunks_exact_mut(stride) {
            let (data, md) = block.split_at_mut(self.lba_size);
            self.fill(data, md, at, app_tag, tag);
            tag = self.next_tag(tag);
        }
        true
    }

    /// Writes one block's tuple at `at` of its metadata.
    fn fill(&self, data: &[u8], md: &mut [u8], at: usize, app_tag: u16, ref_tag: u64) {
        let before = if self.first { &[][..] } else { &md[..at] };
        let t = PiTuple {
            guard: self.guard_of(data, before),
            app_tag,
            ref_tag,
        };
        // Cannot fail: the tuple fits `md` (at + tuple size <= MS), the tag
        // was checked against the format's width and the guard is of its
        // width.
        t.encode(self.pif, &mut md[at..]);
    }

    /// The tuple in one block's metadata.
    pub fn tuple(&self, md: &[u8]) -> Option<PiTuple> {
        let at = self.tuple_offset()?;
        PiTuple::decode(self.pif, md.get(at..)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields are public: sizes whose sum or product overflows are
    /// refused (false), never a panic or a wrapped size that "protects"
    /// nothing (a review found both).
    #[test]
    fn absurd_sizes_are_refused_not_wrapped() {
        let f = |lba_size, ms| PiFormat {
            lba_size,
            ms,
            first: false,
            pi_type: 1,
            pif: Pif::Guard16,
        };
        let mut buf = vec![0u8; 32];
        assert!(!f(usize::MAX - 14, 16).protect_extended(&mut buf, 0, 0));
        assert!(!f(1, 1 << (usize::BITS - 1)).protect(&[0u8; 2], &mut [], 0, 0));
    }

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
    fn guard64_is_the_nvme_crc64() {
        // The CRC catalogue's check value for CRC-64/NVME.
        assert_eq!(guard64(b"123456789", &[]), 0xae8b_1486_0a79_9888);
        assert_eq!(guard64(b"1234", b"56789"), 0xae8b_1486_0a79_9888);
        // Unlike the CRC-16, a zero block does not have guard 0.
        assert_ne!(guard64(&[0u8; 4096], &[]), 0);
    }

    #[test]
    fn tuples_round_trip_big_endian() {
        let t = PiTuple {
            guard: 0x1234,
            app_tag: 0xabcd,
            ref_tag: 0x0102_0304,
        };
        let mut b = [0u8; 8];
        assert!(t.encode(Pif::Guard16, &mut b));
        assert_eq!(b, [0x12, 0x34, 0xab, 0xcd, 1, 2, 3, 4]);
        assert_eq!(PiTuple::decode(Pif::Guard16, &b), Some(t));
        let t64 = PiTuple {
            guard: 0x0102_0304_0506_0708,
            app_tag: 0xabcd,
            ref_tag: 0x0a0b_0c0d_0e0f,
        };
        let mut b = [0u8; 16];
        assert!(t64.encode(Pif::Guard64, &mut b));
        assert_eq!(
            b,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0xab, 0xcd, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f
            ]
        );
        assert_eq!(PiTuple::decode(Pif::Guard64, &b), Some(t64));
        // What does not fit the format is refused.
        assert!(!t64.encode(Pif::Guard16, &mut [0u8; 8]));
        assert!(!t.encode(Pif::Guard64, &mut [0u8; 8]));
        let wide = PiTuple {
            ref_tag: 1 << 48,
            ..t64
        };
        assert!(!wide.encode(Pif::Guard64, &mut b));
        assert!(!t.encode(Pif::Guard32, &mut b));
        assert_eq!(PiTuple::decode(Pif::Guard32, &b), None);
    }

    #[test]
    fn pif_comes_from_elbaf_bits_8_7() {
        assert_eq!(Pif::from_elbaf(0), Some(Pif::Guard16));
        assert_eq!(Pif::from_elbaf(1 << 7 | 0x7f), Some(Pif::Guard32));
        assert_eq!(Pif::from_elbaf(2 << 7), Some(Pif::Guard64));
        assert_eq!(Pif::from_elbaf(3 << 7), None);
        assert_eq!(Pif::Guard64.tuple_size(), 16);
        assert_eq!(Pif::Guard16.tuple_size(), 8);
    }

    #[test]
    fn protect_with_a_64_bit_guard_fills_16_byte_tuples_and_wraps_at_48_bits() {
        let data: Vec<u8> = (0..1024u32).map(|i| (i * 3) as u8).collect();
        let f = PiFormat {
            lba_size: 512,
            ms: 24,
            first: false,
            pi_type: 1,
            pif: Pif::Guard64,
        };
        let mut md = vec![0x11u8; 2 * 24];
        let top = (1u64 << 48) - 1;
        assert!(f.protect(&data, &mut md, 0x77, top));
        let t0 = f.tuple(&md[..24]).unwrap();
        let t1 = f.tuple(&md[24..]).unwrap();
        assert_eq!((t0.ref_tag, t1.ref_tag), (top, 0));
        assert_eq!(t0.app_tag, 0x77);
        assert_eq!(t0.guard, guard64(&data[..512], &md[..8]));
        assert_eq!(t1.guard, guard64(&data[512..], &md[24..32]));
        // The extended layout gives the same bytes.
        let mut ext = Vec::new();
        for b in data.chunks_exact(512) {
            ext.extend_from_slice(b);
            ext.extend_from_slice(&[0x11; 24]);
        }
        assert!(f.protect_extended(&mut ext, 0x77, top));
        assert_eq!(&ext[512..536], &md[..24]);
        // A tag beyond 48 bits, metadata below 16 bytes, a 32-bit guard:
        // refused.
        assert!(!f.protect(&data, &mut md, 0, 1 << 48));
        let small = PiFormat { ms: 8, ..f };
        assert!(!small.protect(&data, &mut [0u8; 16], 0, 0));
        let g32 = PiFormat {
            pif: Pif::Guard32,
            ..f
        };
        assert!(!g32.protect(&data, &mut md, 0, 0));
    }

    #[test]
    fn protect_fills_each_block_and_counts_the_reference_tag() {
        let data: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
        let f = PiFormat {
            lba_size: 512,
            ms: 16,
            first: false,
            pi_type: 1,
            pif: Pif::Guard16,
        };
        let mut md = vec![0xeeu8; 2 * 16];
        assert!(f.protect(&data, &mut md, 7, 100));
        for (i, m) in md.chunks_exact(16).enumerate() {
            let t = f.tuple(m).unwrap();
            assert_eq!(t.ref_tag, 100 + i as u64);
            assert_eq!(t.app_tag, 7);
            assert_eq!(
                t.guard,
                u64::from(guard(&data[i * 512..(i + 1) * 512], &m[..8]))
            );
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
        assert_eq!(
            f3.tuple(&md8[8..]).unwrap().guard,
            u64::from(guard(&data[512..], &[]))
        );
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

//! Scatter Gather Lists (NVMe Base Specification 2.0, §4.3.2 "Scatter
//! Gather List (SGL)").
//!
//! An SGL descriptor is 16 bytes: Address (bytes 7:0), Length (bytes 11:8),
//! reserved bytes 14:12 and the SGL Identifier (byte 15: Descriptor Type in
//! bits 7:4, Sub Type in bits 3:0; sub type 0h means "Address"). The
//! command's DPTR holds the first descriptor, SGL1, and CDW0.PSDT says that
//! it is an SGL ([`PSDT_SGL_MPTR_ADDRESS`]).
//!
//! The layouts built here:
//! - one contiguous piece: SGL1 is a **Data Block** descriptor;
//! - several pieces that fit one list page: SGL1 is a **Last Segment**
//!   descriptor pointing at the Data Block descriptors;
//! - more: SGL1 is a **Segment** descriptor; every full list page holds
//!   `page / 16 - 1` Data Block descriptors followed by a Segment (or, for the
//!   final page, Last Segment) descriptor pointing at the next page.
//!
//! Everything is pure arithmetic over IOVAs; [`decode`] is the device's view
//! (for models and property tests).

use core::fmt;

/// Size of one SGL descriptor in bytes.
pub const DESCRIPTOR_SIZE: usize = 16;

/// CDW0.PSDT (bits 15:14) value "SGLs are used for this transfer; MPTR holds
/// the address of a contiguous metadata buffer" (01b), already shifted into
/// place for CDW0.
pub const PSDT_SGL_MPTR_ADDRESS: u32 = 0b01 << 14;

/// SGL Descriptor Type (SGL Identifier bits 7:4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorType {
    /// 0h: Data Block, a piece of data.
    DataBlock,
    /// 1h: Bit Bucket, data to discard (reads only).
    BitBucket,
    /// 2h: Segment, points to the next list segment.
    Segment,
    /// 3h: Last Segment, points to the final list segment.
    LastSegment,
    /// Any other SGL Identifier byte (Keyed and Transport Data Blocks are
    /// for fabrics; a non-zero Sub Type is not an address).
    Other(u8),
}

impl DescriptorType {
    /// The SGL Identifier byte (type in bits 7:4, Sub Type 0h "Address").
    fn identifier(self) -> u8 {
        match self {
            DescriptorType::DataBlock => 0x00,
            DescriptorType::BitBucket => 0x10,
            DescriptorType::Segment => 0x20,
            DescriptorType::LastSegment => 0x30,
            DescriptorType::Other(b) => b,
        }
    }

    fn from_identifier(b: u8) -> DescriptorType {
        match b {
            0x00 => DescriptorType::DataBlock,
            0x10 => DescriptorType::BitBucket,
            0x20 => DescriptorType::Segment,
            0x30 => DescriptorType::LastSegment,
            b => DescriptorType::Other(b),
        }
    }
}

/// One SGL descriptor, in the two little-endian qwords it occupies in memory
/// (or in DPTR, CDW6..CDW9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Bytes 7:0: Address.
    pub address: u64,
    /// Bytes 11:8: Length in bytes.
    pub length: u32,
    /// Descriptor Type (byte 15, bits 7:4); the Sub Type is 0h (Address).
    pub kind: DescriptorType,
}

impl Descriptor {
    /// A Data Block descriptor for `length` bytes at `address`.
    pub const fn data_block(address: u64, length: u32) -> Descriptor {
        Descriptor {
            address,
            length,
            kind: DescriptorType::DataBlock,
        }
    }

    /// The two qwords: `[address, length | identifier << 56]`.
    pub fn to_qwords(self) -> [u64; 2] {
        [
            self.address,
            u64::from(self.length) | u64::from(self.kind.identifier()) << 56,
        ]
    }

    /// The descriptor stored as `qwords`.
    pub fn from_qwords(q: [u64; 2]) -> Descriptor {
        Descriptor {
            address: q[0],
            length: q[1] as u32,
            kind: DescriptorType::from_identifier((q[1] >> 56) as u8),
        }
    }
}

/// What Identify Controller SGLS (bits 1:0, SGL Support) allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglSupport {
    /// 00b: the controller does not support SGLs for NVM commands.
    None,
    /// 01b: supported, no alignment or granularity requirement.
    Unaligned,
    /// 10b: supported; Data Block addresses and lengths must be dword
    /// aligned.
    DwordAligned,
}

impl SglSupport {
    /// Decodes SGLS bits 1:0 (11b is reserved: treated as not supported).
    pub fn from_sgls(sgls: u32) -> SglSupport {
        match sgls & 0b11 {
            0b01 => SglSupport::Unaligned,
            0b10 => SglSupport::DwordAligned,
            _ => SglSupport::None,
        }
    }

    /// True unless [`SglSupport::None`].
    pub fn supported(self) -> bool {
        self != SglSupport::None
    }
}

/// Identify Controller SGLS bits 15:8, SGL Descriptor Threshold (SDT): the
/// recommended maximum number of Data Block (and non-empty Bit Bucket)
/// descriptors in one command — beyond it, the controller's performance
/// may be reduced (NVMe Base Specification 2.1, §4.3.2). `None` when the
/// field is 0 (no threshold reported).
pub fn descriptor_threshold(sgls: u32) -> Option<u8> {
    match (sgls >> 8) as u8 {
        0 => None,
        n => Some(n),
    }
}

/// Errors from building or decoding an SGL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglError {
    /// No data, or a piece of zero bytes.
    ZeroLength,
    /// A piece longer than a descriptor's 32-bit Length.
    PieceTooLong(usize),
    /// A piece's address or length breaks the controller's dword alignment
    /// requirement (SGLS 10b).
    Unaligned(u64),
    /// `address + length` wraps the 64-bit address space.
    Overflow,
    /// A list page (an SGL segment) that is not qword aligned: "an SGL
    /// segment is a Qword aligned data structure" (NVMe 2.0 §4.3.2).
    SegmentUnaligned(u64),
    /// The list needs more descriptor slots than the caller's memory holds.
    ListTooSmall {
        /// Descriptor slots available.
        available: usize,
    },
    /// While decoding: a descriptor could not be read.
    MissingDescriptor(u64),
    /// While decoding: a descriptor type that may not appear where it is.
    BadDescriptor(u64),
    /// While decoding: the segments chain more often than the list could
    /// need (a loop).
    ChainLoop,
    /// While decoding: the descriptors describe fewer bytes than the
    /// transfer, or more than it; while building: more pieces than `count`.
    LengthMismatch,
}

impl fmt::Display for SglError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SglError::ZeroLength => f.write_str("SGL piece of zero bytes"),
            SglError::PieceTooLong(n) => write!(f, "SGL piece of {n} bytes exceeds 4 GiB - 1"),
            SglError::Unaligned(a) => write!(
                f,
                "SGL Data Block {a:#x} breaks the controller's dword alignment and granularity \
                 requirement (SGLS bits 1:0 = 10b)"
            ),
            SglError::Overflow => f.write_str("SGL piece wraps the 64-bit address space"),
            SglError::SegmentUnaligned(a) => {
                write!(f, "SGL segment at {a:#x} is not qword aligned")
            }
            SglError::ListTooSmall { available } => write!(
                f,
                "the SGL needs more than the {available} descriptor slots of the command's list \
                 pages: use fewer segments"
            ),
            SglError::MissingDescriptor(a) => write!(f, "SGL descriptor at {a:#x} is unreadable"),
            SglError::BadDescriptor(a) => {
                write!(f, "SGL descriptor at {a:#x} has a type not allowed there")
            }
            SglError::ChainLoop => f.write_str("SGL segments chain in a loop"),
            SglError::LengthMismatch => {
                f.write_str("the SGL describes a length other than the transfer's")
            }
        }
    }
}

impl std::error::Error for SglError {}

/// Descriptor slots a list of `pieces` Data Blocks occupies in list pages
/// of `page_size` bytes (page-aligned pages): 0 for one piece (SGL1 holds
/// it), else the pieces plus one Segment/Last Segment descriptor per extra
/// page.
pub fn list_slots(pieces: usize, page_size: usize) -> usize {
    let per_page = page_size / DESCRIPTOR_SIZE;
    if pieces <= 1 || per_page < 2 {
        0
    } else if pieces <= per_page {
        pieces
    } else {
        pieces + list_pages(pieces, page_size) - 1
    }
}

/// List pages a list of `pieces` Data Blocks needs (0 for one piece).
pub fn list_pages(pieces: usize, page_size: usize) -> usize {
    let per_page = page_size / DESCRIPTOR_SIZE;
    if pieces <= 1 || per_page < 2 {
        0
    } else if pieces <= per_page {
        1
    } else {
        // p pages hold p * (per_page - 1) + 1 Data Blocks.
        (pieces - 1).div_ceil(per_page - 1)
    }
}

/// Most Data Blocks `pages` list pages of `page_size` bytes can hold (1, the
/// SGL1 descriptor alone, when a page cannot hold two descriptors;
/// saturating for absurd counts).
pub fn max_pieces(pages: usize, page_size: usize) -> usize {
    let per_page = page_size / DESCRIPTOR_SIZE;
    if pages == 0 || per_page < 2 {
        return 1;
    }
    pages.saturating_mul(per_page - 1).saturating_add(1)
}

fn check_piece(iova: u64, len: usize, support: SglSupport) -> Result<u32, SglError> {
    if len == 0 {
        return Err(SglError::ZeroLength);
    }
    let l = u32::try_from(len).map_err(|_| SglError::PieceTooLong(len))?;
    iova.checked_add(len as u64 - 1).ok_or(SglError::Overflow)?;
    if support == SglSupport::DwordAligned && (iova | len as u64) & 3 != 0 {
        return Err(SglError::Unaligned(iova));
    }
    Ok(l)
}

/// Builds the SGL for `pieces` (IOVA, length) in transfer order and returns
/// SGL1, the descriptor for the command's DPTR.
///
/// - `count`: the number of pieces; an iterator that yields fewer or more
///   is [`SglError::ZeroLength`] or [`SglError::LengthMismatch`] (the
///   list would not describe the transfer);
/// - `out`: descriptor memory as a flat array of qwords, two per slot: list
///   page 0's slots, then page 1's (`page_size / 16` slots per page);
/// - `list_page_iova(i)`: the IOVA of list page `i` (page aligned; one that
///   is not even qword aligned is [`SglError::SegmentUnaligned`], since
///   an SGL segment is a qword-aligned structure).
///
/// One piece needs no list. No allocation.
pub fn build<I, F>(
    pieces: I,
    count: usize,
    support: SglSupport,
    out: &mut [u64],
    page_size: usize,
    mut list_page_iova: F,
) -> Result<(Descriptor, usize), SglError>
where
    I: IntoIterator<Item = (u64, usize)>,
    F: FnMut(usize) -> u64,
{
    let mut it = pieces.into_iter();
    if count <= 1 {
        let (iova, len) = it.next().ok_or(SglError::ZeroLength)?;
        let l = check_piece(iova, len, support)?;
        if it.next().is_some() {
            return Err(SglError::LengthMismatch);
        }
        return Ok((Descriptor::data_block(iova, l), 0));
    }
    let per_page = page_size / DESCRIPTOR_SIZE;
    let slots = list_slots(count, page_size);
    let available = out.len() / 2;
    if slots > available || per_page < 2 {
        return Err(SglError::ListTooSmall { available });
    }
    let pages = list_pages(count, page_size);
    // The descriptor pointing at list page `p` (holding the rest).
    let pointer = |p: usize, iova: u64, left: usize| {
        if iova & 7 != 0 {
            return Err(SglError::SegmentUnaligned(iova));
        }
        let in_page = if p + 1 == pages { left } else { per_page };
        Ok(Descriptor {
            address: iova,
            length: (in_page * DESCRIPTOR_SIZE) as u32,
            kind: if p + 1 == pages {
                DescriptorType::LastSegment
            } else {
                DescriptorType::Segment
            },
        })
    };
    let sgl1 = pointer(0, list_page_iova(0), count)?;
    let mut slot = 0usize;
    let mut left = count;
    for p in 0..pages {
        let data_here = if p + 1 == pages { left } else { per_page - 1 };
        for _ in 0..data_here {
            let (iova, len) = it.next().ok_or(SglError::ZeroLength)?;
            let l = check_piece(iova, len, support)?;
            let q = Descriptor::data_block(iova, l).to_qwords();
            out[2 * slot] = q[0];
            out[2 * slot + 1] = q[1];
            slot += 1;
        }
        left -= data_here;
        if p + 1 < pages {
            let q = pointer(p + 1, list_page_iova(p + 1), left)?.to_qwords();
            out[2 * slot] = q[0];
            out[2 * slot + 1] = q[1];
            slot += 1;
        }
    }
    if it.next().is_some() {
        return Err(SglError::LengthMismatch);
    }
    Ok((sgl1, slot))
}

/// One contiguous piece of a transfer as the controller sees it.
pub type Piece = (u64, usize);

/// Most zero-length Data Blocks [`decode`] accepts in one SGL.
pub const MAX_EMPTY_DATA_BLOCKS: usize = 1024;

/// Walks SGL1 (and the segments through `read_desc`, which returns the two
/// qwords stored at an IOVA) the way a controller does, returning the data
/// pieces in transfer order; they must add up to `len`. Validates every
/// input, including chain loops: at most `2 * len +`
/// [`MAX_EMPTY_DATA_BLOCKS`]` + 2` descriptors are read, whatever the list.
pub fn decode<F>(sgl1: Descriptor, len: usize, mut read_desc: F) -> Result<Vec<Piece>, SglError>
where
    F: FnMut(u64) -> Option<[u64; 2]>,
{
    let mut out = Vec::new();
    let mut total = 0usize;
    // Zero-length Data Blocks are allowed but move nothing: a bounded number
    // of them, so that a hostile list cannot make the walk read descriptors
    // without end (every other Data Block consumes at least one byte).
    let mut empty = 0usize;
    let mut push = |d: Descriptor, out: &mut Vec<Piece>| -> Result<(), SglError> {
        if d.length == 0 {
            empty += 1;
            return if empty > MAX_EMPTY_DATA_BLOCKS {
                Err(SglError::BadDescriptor(d.address))
            } else {
                Ok(())
            };
        }
        total = total
            .checked_add(d.length as usize)
            .ok_or(SglError::Overflow)?;
        if total > len {
            return Err(SglError::LengthMismatch);
        }
        out.push((d.address, d.length as usize));
        Ok(())
    };
    let mut seg = match sgl1.kind {
        DescriptorType::DataBlock => {
            push(sgl1, &mut out)?;
            return if out.iter().map(|p| p.1).sum::<usize>() == len {
                Ok(out)
            } else {
                Err(SglError::LengthMismatch)
            };
        }
        DescriptorType::Segment | DescriptorType::LastSegment => sgl1,
        _ => return Err(SglError::BadDescriptor(0)),
    };
    let mut hops = 0usize;
    loop {
        if seg.length == 0 || !(seg.length as usize).is_multiple_of(DESCRIPTOR_SIZE) {
            return Err(SglError::BadDescriptor(seg.address));
        }
        if seg.address & 7 != 0 {
            return Err(SglError::SegmentUnaligned(seg.address));
        }
        hops += 1;
        if hops > len.max(1) {
            return Err(SglError::ChainLoop);
        }
        let n = seg.length as usize / DESCRIPTOR_SIZE;
        let last_segment = seg.kind == DescriptorType::LastSegment;
        let mut next = None;
        for i in 0..n {
            let at = seg
                .address
                .checked_add((i * DESCRIPTOR_SIZE) as u64)
                .ok_or(SglError::Overflow)?;
            let d = Descriptor::from_qwords(read_desc(at).ok_or(SglError::MissingDescriptor(at))?);
            match d.kind {
                DescriptorType::DataBlock => push(d, &mut out)?,
                DescriptorType::Segment | DescriptorType::LastSegment
                    if !last_segment && i + 1 == n =>
                {
                    next = Some(d)
                }
                _ => return Err(SglError::BadDescriptor(at)),
            }
        }
        match next {
            Some(d) => seg = d,
            None if last_segment => break,
            None => return Err(SglError::BadDescriptor(seg.address)),
        }
    }
    if out.iter().map(|p| p.1).sum::<usize>() != len {
        return Err(SglError::LengthMismatch);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const PS: usize = 4096;

    fn mem_of(
        out: &[u64],
        slots: usize,
        page_iova: impl Fn(usize) -> u64,
    ) -> HashMap<u64, [u64; 2]> {
        let per_page = PS / DESCRIPTOR_SIZE;
        (0..slots)
            .map(|s| {
                let at = page_iova(s / per_page) + ((s % per_page) * DESCRIPTOR_SIZE) as u64;
                (at, [out[2 * s], out[2 * s + 1]])
            })
            .collect()
    }

    #[test]
    fn descriptor_encoding() {
        let d = Descriptor::data_block(0x1234_5678_9abc, 0x1000);
        assert_eq!(d.to_qwords(), [0x1234_5678_9abc, 0x1000]);
        let s = Descriptor {
            address: 0x2000,
            length: 32,
            kind: DescriptorType::LastSegment,
        };
        assert_eq!(s.to_qwords(), [0x2000, 32 | 0x30 << 56]);
        assert_eq!(Descriptor::from_qwords(s.to_qwords()), s);
        // A non-zero Sub Type is not an Address descriptor.
        assert!(matches!(
            Descriptor::from_qwords([0, 1 << 56]).kind,
            DescriptorType::Other(_)
        ));
    }

    #[test]
    fn support_field() {
        assert_eq!(SglSupport::from_sgls(0), SglSupport::None);
        assert_eq!(SglSupport::from_sgls(0x0010_0001), SglSupport::Unaligned);
        assert_eq!(SglSupport::from_sgls(2), SglSupport::DwordAligned);
        assert_eq!(SglSupport::from_sgls(3), SglSupport::None);
        assert_eq!(descriptor_threshold(0x0010_0001), None);
        assert_eq!(descriptor_threshold(0x0001_2002), Some(0x20));
        assert_eq!(descriptor_threshold(0xffff_ff01), Some(0xff));
    }

    #[test]
    fn one_piece_is_a_data_block() {
        let mut out = [0u64; 0];
        let (d, n) = build([(0x1003, 5)], 1, SglSupport::Unaligned, &mut out, PS, |_| 0).unwrap();
        assert_eq!((d, n), (Descriptor::data_block(0x1003, 5), 0));
        assert_eq!(
            build(
                [(0x1003, 5)],
                1,
                SglSupport::DwordAligned,
                &mut out,
                PS,
                |_| 0
            ),
            Err(SglError::Unaligned(0x1003))
        );
        assert_eq!(decode(d, 5, |_| None), Ok(vec![(0x1003, 5)]));
        assert_eq!(decode(d, 6, |_| None), Err(SglError::LengthMismatch));
    }

    #[test]
    fn lists_round_trip_through_decode() {
        for count in [2usize, 3, 255, 256, 257, 511, 512, 600] {
            let pieces: Vec<(u64, usize)> = (0..count)
                .map(|i| {
                    (
                        0x100_0000 + (i as u64) * 0x3000 + 4 * (i as u64 % 3),
                        512 + 4 * i,
                    )
                })
                .collect();
            let len: usize = pieces.iter().map(|p| p.1).sum();
            let mut out = vec![0u64; 2 * 1024];
            let page = |i: usize| 0x8000_0000 + (i as u64) * 0x1000;
            let (sgl1, slots) = build(
                pieces.iter().copied(),
                count,
                SglSupport::DwordAligned,
                &mut out,
                PS,
                page,
            )
            .unwrap();
            assert_eq!(slots, list_slots(count, PS), "{count}");
            let mem = mem_of(&out, slots, page);
            let got = decode(sgl1, len, |a| mem.get(&a).copied()).unwrap();
            assert_eq!(got, pieces, "{count}");
        }
    }

    #[test]
    fn page_counts() {
        assert_eq!(list_pages(1, PS), 0);
        assert_eq!(list_pages(256, PS), 1);
        assert_eq!(list_pages(257, PS), 2);
        assert_eq!(list_pages(511, PS), 2);
        assert_eq!(list_pages(512, PS), 3);
        assert_eq!(max_pieces(1, PS), 256);
        assert_eq!(max_pieces(2, PS), 511);
        // No panic or wrap on sizes that cannot hold a list, or absurd counts.
        assert_eq!(max_pieces(0, PS), 1);
        assert_eq!(max_pieces(3, 0), 1);
        assert_eq!(max_pieces(3, 16), 1);
        assert_eq!(max_pieces(usize::MAX, PS), usize::MAX);
        assert_eq!(list_slots(257, PS), 258);
    }

    #[test]
    fn build_refusals() {
        let mut out = vec![0u64; 4];
        assert_eq!(
            build(
                [(0, 8), (8, 8), (16, 8)],
                3,
                SglSupport::Unaligned,
                &mut out,
                PS,
                |_| 0
            ),
            Err(SglError::ListTooSmall { available: 2 })
        );
        assert_eq!(
            build(
                [(0, 8), (8, 0)],
                2,
                SglSupport::Unaligned,
                &mut out,
                PS,
                |_| 0
            ),
            Err(SglError::ZeroLength)
        );
        assert_eq!(
            build(
                [(u64::MAX - 3, 8)],
                1,
                SglSupport::Unaligned,
                &mut out,
                PS,
                |_| 0
            ),
            Err(SglError::Overflow)
        );
        // A count that does not match the pieces: the list would describe
        // fewer bytes than the transfer (or fail at a missing piece).
        let mut out = vec![0u64; 64];
        let three = [(0x1000, 8), (0x2000, 8), (0x3000, 8)];
        for count in [1, 2] {
            assert_eq!(
                build(three, count, SglSupport::Unaligned, &mut out, PS, |_| 0),
                Err(SglError::LengthMismatch),
                "count {count}"
            );
        }
        assert_eq!(
            build(three, 4, SglSupport::Unaligned, &mut out, PS, |_| 0),
            Err(SglError::ZeroLength)
        );
        assert!(build(three, 3, SglSupport::Unaligned, &mut out, PS, |_| 0).is_ok());
    }

    /// An SGL segment is a qword-aligned structure (NVMe 2.0 §4.3.2): the
    /// builder refuses a list page that is not, and the device's walk a
    /// (Last) Segment descriptor pointing at one; 8 bytes into a page is
    /// fine.
    #[test]
    fn segments_are_qword_aligned() {
        let pieces = [(0x1000u64, 8usize), (0x2000, 8), (0x3000, 8)];
        let mut out = vec![0u64; 2 * 512];
        for base in [0x9004u64, 0x9001] {
            assert_eq!(
                build(pieces, 3, SglSupport::Unaligned, &mut out, PS, |_| base),
                Err(SglError::SegmentUnaligned(base))
            );
        }
        // 300 pieces: list page 1 is the one off a qword.
        let many: Vec<(u64, usize)> = (0..300u64).map(|i| (i << 12, 8)).collect();
        assert_eq!(
            build(
                many.iter().copied(),
                300,
                SglSupport::Unaligned,
                &mut out,
                PS,
                |i| { 0x10_0000 + (i as u64) * 0x1004 }
            ),
            Err(SglError::SegmentUnaligned(0x10_1004))
        );
        let (sgl1, n) = build(pieces, 3, SglSupport::Unaligned, &mut out, PS, |_| 0x9008).unwrap();
        assert_eq!(sgl1.address, 0x9008);
        let mem: HashMap<u64, [u64; 2]> = (0..n)
            .map(|s| (0x9008 + 16 * s as u64, [out[2 * s], out[2 * s + 1]]))
            .collect();
        assert_eq!(
            decode(sgl1, 24, |a| mem.get(&a).copied()),
            Ok(pieces.to_vec())
        );
        // The same segment 4 bytes further on.
        let shifted = Descriptor {
            address: 0x900c,
            ..sgl1
        };
        let mem4: HashMap<u64, [u64; 2]> = mem.iter().map(|(a, d)| (a + 4, *d)).collect();
        assert_eq!(
            decode(shifted, 24, |a| mem4.get(&a).copied()),
            Err(SglError::SegmentUnaligned(0x900c))
        );
    }

    #[test]
    fn decode_rejects_hostile_lists() {
        let seg = Descriptor {
            address: 0x5000,
            length: 16,
            kind: DescriptorType::Segment,
        };
        // A Segment that points at itself.
        let looped = seg.to_qwords();
        assert_eq!(
            decode(seg, 4096, |_| Some(looped)),
            Err(SglError::ChainLoop)
        );
        // Unreadable.
        assert_eq!(
            decode(seg, 4096, |_| None),
            Err(SglError::MissingDescriptor(0x5000))
        );
        // A Last Segment holding a Segment descriptor.
        let last = Descriptor {
            kind: DescriptorType::LastSegment,
            ..seg
        };
        assert_eq!(
            decode(last, 4096, |_| Some(seg.to_qwords())),
            Err(SglError::BadDescriptor(0x5000))
        );
        // A length that is not a multiple of 16.
        let odd = Descriptor { length: 24, ..last };
        assert_eq!(
            decode(odd, 8, |_| None),
            Err(SglError::BadDescriptor(0x5000))
        );
        // More data than the transfer.
        let big = Descriptor::data_block(0x1000, 64).to_qwords();
        assert_eq!(
            decode(last, 32, |_| Some(big)),
            Err(SglError::LengthMismatch)
        );
    }
}

//! The memory of a data command: one buffer, a slice of one, or a vector of
//! segments ([`IoVec`]), and optionally a separate metadata buffer.
//!
//! Whatever memory goes in with a command comes back whole with its
//! completion (or its refusal): [`crate::Completion::buffer`],
//! [`crate::Completion::segments`], [`crate::Completion::metadata`].

use upnvme_dma::DmaBuffer;

use super::command::{IoFlags, Protection};

/// One piece of a vectored transfer: `len` bytes at `offset` of `buffer`.
#[derive(Debug)]
pub struct IoSegment {
    buffer: DmaBuffer,
    offset: usize,
    len: usize,
}

impl IoSegment {
    /// The buffer the segment lies in.
    pub fn buffer(&self) -> &DmaBuffer {
        &self.buffer
    }

    /// Where the segment starts in its buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: segments are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment's first byte on the bus.
    pub(crate) fn iova(&self) -> u64 {
        self.buffer.iova() + self.offset as u64
    }

    /// The buffer, handed back.
    pub fn into_buffer(self) -> DmaBuffer {
        self.buffer
    }
}

/// A segment that does not fit its buffer, handed back by [`IoVec::push`].
#[derive(Debug, thiserror::Error)]
#[error(
    "segment of {len} bytes at offset {offset} does not fit the buffer of {size} bytes \
     (a segment needs 1 or more bytes inside its buffer)"
)]
pub struct SegmentOutOfBounds {
    /// The buffer, back in the caller's hands.
    pub buffer: DmaBuffer,
    /// The offset asked for.
    pub offset: usize,
    /// The length asked for.
    pub len: usize,
    /// The buffer's length.
    pub size: usize,
}

/// An owned scatter/gather vector: the segments of one command's data, in
/// transfer order, each a byte range of a [`DmaBuffer`] the vector owns
/// while the command runs.
///
/// How the driver describes it to the controller (Data Pointer, NVMe Base
/// Specification 2.0 §4.3): a PRP List when every inner boundary is
/// page-aligned (each segment but the first starts on a 4 KiB page, each but
/// the last ends on one, the first starts dword aligned), otherwise an SGL
/// when the controller supports SGLs (Identify Controller SGLS), and a
/// [`crate::Reject::NotDescribable`] refusal when neither can.
///
/// The vector comes back with the command's completion; `clear` or
/// [`IoVec::drain`] then keeps its capacity, so a vector reused for every
/// command allocates only when it is made and when it first grows. The
/// handle is one pointer, so commands without a vector pay one null word
/// for the possibility.
#[derive(Debug, Default)]
pub struct IoVec {
    // Boxed on purpose: `Option<IoVec>` in every tracker and completion is
    // one word (a `Vec` would be three, moved and checked on every I/O).
    #[allow(clippy::box_collection)]
    segs: Box<Vec<IoSegment>>,
}

impl IoVec {
    /// An empty vector.
    pub fn new() -> IoVec {
        IoVec::default()
    }

    /// An empty vector with room for `n` segments.
    pub fn with_capacity(n: usize) -> IoVec {
        IoVec {
            segs: Box::new(Vec::with_capacity(n)),
        }
    }

    /// Appends `len` bytes at `offset` of `buffer`. A range outside the
    /// buffer (or of 0 bytes) is refused with the buffer handed back.
    pub fn push(
        &mut self,
        buffer: DmaBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), Box<SegmentOutOfBounds>> {
        let size = buffer.len();
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Box::new(SegmentOutOfBounds {
                buffer,
                offset,
                len,
                size,
            }));
        }
        self.segs.push(IoSegment {
            buffer,
            offset,
            len,
        });
        Ok(())
    }

    /// Appends the whole of `buffer`.
    pub fn push_buffer(&mut self, buffer: DmaBuffer) {
        let len = buffer.len();
        self.segs.push(IoSegment {
            buffer,
            offset: 0,
            len,
        });
    }

    /// The segments, in transfer order.
    pub fn segments(&self) -> &[IoSegment] {
        &self.segs
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// True without segments.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Bytes over all segments.
    pub fn total_len(&self) -> usize {
        self.segs.iter().map(|s| s.len).sum()
    }

    /// Removes every segment, handing back their buffers in order; the
    /// vector keeps its capacity.
    pub fn drain(&mut self) -> impl Iterator<Item = DmaBuffer> + '_ {
        self.segs.drain(..).map(|s| s.buffer)
    }

    /// Removes every segment, dropping their buffers; keeps the capacity.
    pub fn clear(&mut self) {
        self.segs.clear();
    }

    /// The buffers, in order.
    pub fn into_buffers(self) -> Vec<DmaBuffer> {
        self.segs.into_iter().map(|s| s.buffer).collect()
    }

    /// The (IOVA, length) pieces of the `bytes` bytes that start `offset`
    /// bytes into the vector (from 0, or for a split's child: split.rs).
    pub(crate) fn pieces_at(
        &self,
        offset: usize,
        bytes: usize,
    ) -> impl Iterator<Item = (u64, usize)> + Clone + '_ {
        let mut skip = offset;
        let mut left = bytes;
        self.segs.iter().filter_map(move |s| {
            if skip >= s.len {
                skip -= s.len;
                return None;
            }
            if left == 0 {
                return None;
            }
            let start = std::mem::take(&mut skip);
            let n = (s.len - start).min(left);
            left -= n;
            Some((s.iova() + start as u64, n))
        })
    }
}

/// What a command transfers through: see the constructors. Plain
/// [`crate::IoQueuePair::submit`] takes `Option<DmaBuffer>`, which is
/// `IoData::from`; [`crate::IoQueuePair::submit_io`] takes this.
#[derive(Debug, Default)]
pub struct IoData {
    pub(crate) buffer: Option<DmaBuffer>,
    /// Where the data starts in `buffer`.
    pub(crate) offset: usize,
    /// Bytes of `buffer` from `offset` the data may use (`usize::MAX`: to
    /// the end of the buffer).
    pub(crate) limit: usize,
    pub(crate) segments: Option<IoVec>,
    /// FUA / Limited Retry.
    pub(crate) flags: IoFlags,
    /// The separate metadata buffer (MPTR).
    pub(crate) metadata: Option<DmaBuffer>,
    /// End-to-end protection fields.
    pub(crate) protection: Option<Protection>,
}

impl IoData {
    /// No memory (Flush, Write Zeroes, ...).
    pub fn none() -> IoData {
        IoData::default()
    }

    /// The whole of `buffer`, from its first byte.
    pub fn buffer(buffer: DmaBuffer) -> IoData {
        IoData {
            buffer: Some(buffer),
            limit: usize::MAX,
            ..IoData::default()
        }
    }

    /// `len` bytes at `offset` of `buffer` (the transfer must fit them; the
    /// offset must be dword aligned for PRPs, and with a controller that asks
    /// for dword-aligned SGLs). The whole buffer comes back with the
    /// completion.
    pub fn slice(buffer: DmaBuffer, offset: usize, len: usize) -> IoData {
        IoData {
            buffer: Some(buffer),
            offset,
            // `usize::MAX` is the whole buffer's marker (`IoData::buffer`):
            // a slice that long cannot lie inside any buffer, and is refused
            // as one (`Reject::SliceOutOfBounds`).
            limit: len.min(usize::MAX - 1),
            ..IoData::default()
        }
    }

    /// The segments of `vec`, in order.
    pub fn vectored(vec: IoVec) -> IoData {
        IoData {
            segments: Some(vec),
            ..IoData::default()
        }
    }

    /// The same memory, with the command's CDW12 flags (Force Unit Access,
    /// Limited Retry). Commands without those bits (Flush, Dataset
    /// Management, Write Uncorrectable, raw) refuse flags
    /// ([`crate::Reject::FlagsNotApplicable`]).
    pub fn flags(self, flags: IoFlags) -> IoData {
        IoData { flags, ..self }
    }

    /// The same memory, with a separate metadata buffer (MPTR, NVMe Base
    /// Specification 2.0 "Metadata Pointer") for a namespace whose format
    /// keeps metadata apart from the data (Identify Namespace FLBAS bit 4
    /// clear): `blocks × MS` bytes from its first byte, one contiguous,
    /// dword-aligned region. It comes back as
    /// [`crate::Completion::metadata`].
    pub fn metadata(self, metadata: DmaBuffer) -> IoData {
        IoData {
            metadata: Some(metadata),
            ..self
        }
    }

    /// The same memory, with End-to-end Data Protection fields (PRACT,
    /// PRCHK, expected tags) for a namespace formatted with protection
    /// information.
    pub fn protection(self, protection: Protection) -> IoData {
        IoData {
            protection: Some(protection),
            ..self
        }
    }
}

impl From<Option<DmaBuffer>> for IoData {
    #[inline(always)]
    fn from(buffer: Option<DmaBuffer>) -> IoData {
        IoData {
            buffer,
            offset: 0,
            limit: usize::MAX,
            segments: None,
            flags: IoFlags::NONE,
            metadata: None,
            protection: None,
        }
    }
}

impl From<DmaBuffer> for IoData {
    fn from(buffer: DmaBuffer) -> IoData {
        IoData::buffer(buffer)
    }
}

impl From<IoVec> for IoData {
    fn from(vec: IoVec) -> IoData {
        IoData::vectored(vec)
    }
}

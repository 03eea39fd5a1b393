//! Command identifiers: tracker slot | generation bits.
//!
//! The NVMe Base Specification 2.0 (§4.2, CDW0.CID "Command Identifier")
//! only requires a CID to be unique among the commands outstanding on one
//! submission queue. upnvme encodes in it the index of the tracker slot
//! holding the request (so completion lookup is an array index) and, in the
//! remaining upper bits, a per-slot generation counter bumped every time the
//! slot is released. A completion carrying a CID for a slot that is not in
//! flight, or with an old generation (a stale or duplicated completion from a
//! misbehaving device), is detected instead of completing the wrong request.
//!
//! Encoding: with `slot_bits` the number of bits that write `slots`
//! (`floor(log2(slots)) + 1`, so the all-ones slot index is never a usable
//! slot), `cid = (generation << slot_bits) | slot`; the generation has
//! `16 - slot_bits` bits (at least 3, since `slots <= 4096`) and wraps.
//! The value `0xFFFF` (all slot bits set) is therefore never handed out, with
//! no test when a generation wraps: the Error Information log uses it to
//! mean "not associated with a command".

use core::fmt;

/// Largest number of slots a [`CidTable`] supports.
pub const MAX_SLOTS: u16 = 4096;

/// A command identifier handed out by [`CidTable::alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cid {
    /// The value for CDW0.CID.
    pub value: u16,
    /// The tracker slot index encoded in the low bits of `value`.
    pub slot: u16,
}

/// A device-reported (or caller-supplied) CID that does not match a command
/// in flight. From the device this is a controller fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CidError {
    /// The slot bits of this CID name no slot of the table.
    UnknownSlot(u16),
    /// The slot is valid but has no command in flight (e.g. a duplicate
    /// completion of a command already completed). For [`CidTable::cancel`]
    /// the payload is the slot index.
    NotInFlight(u16),
    /// The slot is in flight, but for a later command: the CID carries an old
    /// generation (a stale completion).
    StaleGeneration {
        /// The CID reported.
        cid: u16,
        /// The CID of the command currently in flight in that slot.
        expected: u16,
    },
}

impl fmt::Display for CidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CidError::UnknownSlot(cid) => {
                write!(f, "command identifier {cid:#06x} names no tracker slot")
            }
            CidError::NotInFlight(cid) => write!(
                f,
                "command identifier {cid:#06x} has no command in flight (duplicate or \
                 spurious completion)"
            ),
            CidError::StaleGeneration { cid, expected } => write!(
                f,
                "command identifier {cid:#06x} is stale: the slot now holds {expected:#06x}"
            ),
        }
    }
}

impl std::error::Error for CidError {}

/// Fixed table of tracker slots with per-slot generations, an O(1) free
/// stack, and a value of the caller's per slot (the driver keeps its
/// trackers here: tag, buffer, timeout state). All memory is allocated in
/// [`CidTable::new`]; `alloc`, `complete` and `cancel` never allocate.
///
/// Each slot keeps one word: the CID in flight in it, or `FREE` (1_0000h) plus the
/// CID it hands out next, so allocation is a pop and a copy, checking a
/// completion is one load and one compare, and the release one store; the
/// generation is the CID's upper bits. The slot of any CID is `cid & mask`;
/// a slot index at or beyond the requested count names no slot.
#[derive(Clone, Debug)]
pub struct CidTable<T = ()> {
    slots: Box<[Slot<T>]>,
    /// Stack of free slot indices; capacity == usable slots, so pushes never
    /// reallocate.
    free: Vec<u16>,
    /// Usable slots (those ever handed out).
    usable: u16,
    slot_mask: u16,
    /// [`FREE`] + `1 << slot_bits` (what the generation adds to a CID):
    /// what a release adds to the CID to make the slot's free word.
    free_step: u32,
    slot_bits: u32,
}

/// A slot's CID word and the caller's value.
#[derive(Clone, Copy, Debug)]
struct Slot<T> {
    /// In flight: the CID, widened. Free: at least [`FREE`] (so no CID
    /// equals it: a completion is checked with one compare), and the low 16
    /// bits are the CID the slot hands out next.
    cid: u32,
    value: T,
}

/// `Slot::cid` of a free slot is this or more: outside the 16-bit CID range.
const FREE: u32 = 0x1_0000;

/// True when a slot's CID word says the slot is free (see [`Slot::cid`]).
#[inline(always)]
fn is_free(word: u32) -> bool {
    word >= FREE
}

/// Why `cid` names no command in flight.
#[cold]
#[inline(never)]
fn mismatch<T>(slots: &[Slot<T>], usable: u16, mask: u16, cid: u16) -> CidError {
    let slot = cid & mask;
    match slots.get(usize::from(slot)) {
        None => CidError::UnknownSlot(cid),
        Some(_) if slot >= usable => CidError::UnknownSlot(cid),
        Some(s) if is_free(s.cid) => CidError::NotInFlight(cid),
        Some(s) => CidError::StaleGeneration {
            cid,
            expected: s.cid as u16,
        },
    }
}

impl<T: Default> CidTable<T> {
    /// A table of `slots` slots, all free, all at generation 0, each with
    /// `T::default()`. `slots` is clamped to 1..=[`MAX_SLOTS`] (4096).
    pub fn new(slots: u16) -> CidTable<T> {
        let slots = slots.clamp(1, MAX_SLOTS);
        // The bits that write `slots` itself: the largest slot index
        // (`slots - 1`) is below `slot_mask`, so 0xFFFF (slot bits all set)
        // is no CID of a usable slot at any generation.
        let slot_bits = 16 - slots.leading_zeros();
        let slot_mask = ((1u32 << slot_bits) - 1) as u16;
        debug_assert!(slots <= slot_mask);
        // Pop order: slot 0 first.
        let mut free = Vec::with_capacity(usize::from(slots));
        free.extend((0..slots).rev());
        CidTable {
            // Generation 0: the next CID is the slot index.
            slots: (0..slots)
                .map(|i| Slot {
                    cid: FREE + u32::from(i),
                    value: T::default(),
                })
                .collect(),
            free,
            usable: slots,
            slot_mask,
            free_step: FREE + (1u32 << slot_bits),
            slot_bits,
        }
    }
}

impl<T> CidTable<T> {
    /// Number of slots.
    pub fn slots(&self) -> u16 {
        self.usable
    }

    /// Number of low CID bits that hold the slot index.
    pub fn slot_bits(&self) -> u32 {
        self.slot_bits
    }

    /// Number of free slots (`usable - in_flight`).
    #[inline(always)]
    pub fn free_slots(&self) -> u32 {
        self.free.len() as u32
    }

    /// Number of usable slots (the most commands in flight at once).
    #[inline]
    pub fn usable(&self) -> u32 {
        u32::from(self.usable)
    }

    /// Number of commands in flight.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        u32::from(self.usable) - self.free.len() as u32
    }

    /// The slot index encoded in `cid` (may name a slot that is never handed
    /// out for hostile input; [`CidTable::complete`] checks).
    #[inline]
    pub fn slot_of(&self, cid: u16) -> u16 {
        cid & self.slot_mask
    }

    /// The CID word of a slot freed from `cid`: [`FREE`] plus the next CID,
    /// the generation (upper bits) plus one — its low 16 bits, wrapping
    /// (the sum may carry into bit 17: still free). Never 0xFFFF: the slot
    /// bits stay those of a usable slot.
    #[inline(always)]
    fn freed(&self, cid: u16) -> u32 {
        u32::from(cid) + self.free_step
    }

    /// Allocates a free slot and returns its CID, or `None` when every slot is
    /// in flight. O(1).
    #[inline(always)]
    pub fn alloc(&mut self) -> Option<Cid> {
        self.alloc_mut().map(|(c, _)| c)
    }

    /// As [`CidTable::alloc`], with the slot's value to fill in.
    #[inline(always)]
    pub fn alloc_mut(&mut self) -> Option<(Cid, &mut T)> {
        let slot = self.free.pop()?;
        let s = self.slots.get_mut(usize::from(slot))?;
        // Free: the low 16 bits are the slot's next CID.
        let value = s.cid as u16;
        s.cid = u32::from(value);
        Some((Cid { value, slot }, &mut s.value))
    }

    /// Checks that `cid` is the CID of a command in flight, without releasing
    /// it; returns its slot.
    #[inline]
    pub fn validate(&self, cid: u16) -> Result<u16, CidError> {
        let slot = cid & self.slot_mask;
        match self.slots.get(usize::from(slot)) {
            Some(s) if s.cid == u32::from(cid) => Ok(slot),
            _ => Err(self.mismatch(cid)),
        }
    }

    #[cold]
    #[inline(never)]
    fn mismatch(&self, cid: u16) -> CidError {
        mismatch(&self.slots, self.usable, self.slot_mask, cid)
    }

    /// Completes the command with this CID: checks it (see
    /// [`CidTable::validate`]), frees its slot and bumps the slot's
    /// generation. Returns the slot.
    #[inline]
    pub fn complete(&mut self, cid: u16) -> Result<u16, CidError> {
        self.complete_mut(cid).map(|(slot, _)| slot)
    }

    /// As [`CidTable::complete`], with the slot's value (to take what the
    /// command held). One load and compare for the check, one store for the
    /// release, one push onto the free stack.
    #[inline(always)]
    pub fn complete_mut(&mut self, cid: u16) -> Result<(u16, &mut T), CidError> {
        let slot = cid & self.slot_mask;
        let freed = self.freed(cid);
        let i = usize::from(slot);
        if i >= self.slots.len() || self.slots[i].cid != u32::from(cid) {
            return Err(mismatch(&self.slots, self.usable, self.slot_mask, cid));
        }
        let s = &mut self.slots[i];
        s.cid = freed;
        // Cannot reallocate: at most `usable` entries are ever free.
        self.free.push(slot);
        Ok((slot, &mut s.value))
    }

    /// As [`CidTable::complete_mut`], but only when `accept` takes the
    /// slot's value as well: a completion the caller refuses for a reason
    /// of its own (the reap: a command not yet announced) leaves the slot
    /// in flight, and the answer is `None` then as for a CID that does not
    /// match (the caller explains which, off the hot path).
    #[inline(always)]
    pub fn complete_mut_if(
        &mut self,
        cid: u16,
        accept: impl FnOnce(&T) -> bool,
    ) -> Option<(u16, &mut T)> {
        let slot = cid & self.slot_mask;
        let freed = self.freed(cid);
        let s = self.slots.get_mut(usize::from(slot))?;
        if s.cid != u32::from(cid) || !accept(&s.value) {
            return None;
        }
        s.cid = freed;
        // Cannot reallocate: at most `usable` entries are ever free.
        self.free.push(slot);
        Some((slot, &mut s.value))
    }

    #[inline]
    fn release(&mut self, slot: u16) {
        let i = usize::from(slot);
        self.slots[i].cid = self.freed(self.slots[i].cid as u16);
        // Cannot reallocate: at most `usable` entries are ever free.
        self.free.push(slot);
    }

    /// Frees an in-flight slot whose command was abandoned (only legitimate
    /// once the controller has been disabled, so no completion can arrive
    /// and no DMA can touch its buffers), or one just allocated that was
    /// never submitted. Bumps the generation, so a late completion for it
    /// would be reported as stale or not in flight.
    pub fn cancel(&mut self, slot: u16) -> Result<(), CidError> {
        match self.slots.get(usize::from(slot)) {
            None => Err(CidError::UnknownSlot(slot)),
            Some(_) if slot >= self.usable => Err(CidError::UnknownSlot(slot)),
            Some(s) if is_free(s.cid) => Err(CidError::NotInFlight(slot)),
            Some(_) => {
                self.release(slot);
                Ok(())
            }
        }
    }

    /// True if `slot` has a command in flight.
    pub fn is_in_flight(&self, slot: u16) -> bool {
        self.slots
            .get(usize::from(slot))
            .is_some_and(|s| !is_free(s.cid))
    }

    /// The CID of the command in flight in `slot` (e.g. for an Abort command),
    /// or `None` if the slot is free or out of range.
    pub fn cid_of(&self, slot: u16) -> Option<u16> {
        self.slots
            .get(usize::from(slot))
            .filter(|s| !is_free(s.cid))
            .map(|s| s.cid as u16)
    }

    /// The value of `slot` (free or in flight), `None` out of range.
    #[inline]
    pub fn get(&self, slot: u16) -> Option<&T> {
        self.slots.get(usize::from(slot)).map(|s| &s.value)
    }

    /// The value of `slot` (free or in flight), `None` out of range.
    #[inline]
    pub fn get_mut(&mut self, slot: u16) -> Option<&mut T> {
        self.slots.get_mut(usize::from(slot)).map(|s| &mut s.value)
    }

    /// Iterates over the slots that have a command in flight, in slot order.
    pub fn in_flight_slots(&self) -> impl Iterator<Item = u16> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !is_free(s.cid))
            .map(|(i, _)| i as u16)
    }

    /// Every slot's value, in slot order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.slots.iter_mut().map(|s| &mut s.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding() {
        // The bits that write the slot count: a power of two takes one bit
        // more than its largest index needs (the all-ones slot is never
        // usable, so 0xFFFF is never a CID).
        let t: CidTable = CidTable::new(256);
        assert_eq!(t.slot_bits(), 9);
        assert_eq!(CidTable::<()>::new(255).slot_bits(), 8);
        assert_eq!(CidTable::<()>::new(257).slot_bits(), 9);
        assert_eq!(CidTable::<()>::new(1).slot_bits(), 1);
        assert_eq!(CidTable::<()>::new(2).slot_bits(), 2);
        assert_eq!(CidTable::<()>::new(3).slot_bits(), 2);
        assert_eq!(CidTable::<()>::new(4095).slot_bits(), 12);
        assert_eq!(CidTable::<()>::new(4096).slot_bits(), 13);
        assert_eq!(CidTable::<()>::new(60000).slots(), 4096);
        assert_eq!(CidTable::<()>::new(0).slots(), 1);
    }

    #[test]
    fn alloc_complete_generation() {
        let mut t: CidTable = CidTable::new(4);
        let a = t.alloc().unwrap();
        assert_eq!(a, Cid { value: 0, slot: 0 });
        let b = t.alloc().unwrap();
        assert_eq!(b.slot, 1);
        assert_eq!(t.in_flight(), 2);
        assert_eq!(t.complete(a.value), Ok(0));
        // Duplicate completion.
        assert_eq!(t.complete(a.value), Err(CidError::NotInFlight(0)));
        let c = t.alloc().unwrap();
        assert_eq!(c.slot, 0);
        // 4 slots: 3 slot bits (slots 4..7 are never handed out).
        assert_eq!(c.value, 1 << 3);
        // Stale completion of the previous command in slot 0.
        assert_eq!(
            t.complete(a.value),
            Err(CidError::StaleGeneration {
                cid: 0,
                expected: 8
            })
        );
        // Slot bits naming a slot beyond the count.
        assert_eq!(t.complete(5), Err(CidError::UnknownSlot(5)));
        // A 3-slot table has 2 slot bits, so slot bits 0b11 name no slot.
        let mut u: CidTable = CidTable::new(3);
        assert_eq!(u.complete(3), Err(CidError::UnknownSlot(3)));
        assert_eq!(t.cid_of(0), Some(8));
        assert_eq!(t.cid_of(2), None);
        assert_eq!(t.in_flight_slots().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(t.complete(c.value), Ok(0));
        assert_eq!(t.complete(b.value), Ok(1));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn exhaustion() {
        let mut t: CidTable = CidTable::new(3);
        assert!(t.alloc().is_some());
        assert!(t.alloc().is_some());
        assert!(t.alloc().is_some());
        assert!(t.alloc().is_none());
        assert_eq!(t.in_flight(), 3);
    }

    #[test]
    fn cancel() {
        let mut t: CidTable = CidTable::new(2);
        let a = t.alloc().unwrap();
        assert_eq!(t.cancel(1), Err(CidError::NotInFlight(1)));
        assert_eq!(t.cancel(7), Err(CidError::UnknownSlot(7)));
        t.cancel(a.slot).unwrap();
        assert_eq!(t.in_flight(), 0);
        // A late completion for the cancelled command is rejected.
        assert!(t.complete(a.value).is_err());
    }

    #[test]
    fn a_completion_for_ffff_is_refused() {
        for slots in [1, 2, 255, 256, 4095, 4096] {
            let mut t: CidTable = CidTable::new(slots);
            // 0xFFFF has every slot bit set: a slot beyond the count.
            assert_eq!(t.complete(0xffff), Err(CidError::UnknownSlot(0xffff)));
            let all: Vec<Cid> = (0..slots).map(|_| t.alloc().unwrap()).collect();
            assert!(all.iter().all(|c| c.value != 0xffff));
            assert_eq!(t.complete(0xffff), Err(CidError::UnknownSlot(0xffff)));
            assert_eq!(
                t.validate(0xffff).map(|_| ()),
                Err(t.complete(0xffff).unwrap_err())
            );
            assert_eq!(t.in_flight(), u32::from(slots));
        }
    }

    #[test]
    fn never_hands_out_ffff() {
        let mut t: CidTable = CidTable::new(4096);
        // Drive slot 4095 through all 8 generations (13 slot bits), 5 times.
        let all: Vec<Cid> = (0..4096).map(|_| t.alloc().unwrap()).collect();
        for c in &all[..4095] {
            t.complete(c.value).unwrap();
        }
        let mut last = all[4095];
        for _ in 0..40 {
            assert_ne!(last.value, 0xffff);
            assert_eq!(last.slot, 4095);
            t.complete(last.value).unwrap();
            // Drain the other free slots so 4095 is reused: it is on top (LIFO).
            last = t.alloc().unwrap();
        }
    }

    #[test]
    fn single_slot_table() {
        let mut t: CidTable = CidTable::new(1);
        let rounds = if cfg!(miri) { 300 } else { 70000u32 };
        for i in 0..rounds {
            let c = t.alloc().unwrap();
            assert_eq!(c.slot, 0);
            assert_ne!(c.value, 0xffff);
            // One slot bit (slot 1 is never handed out): CIDs 0, 2, 4, ...
            if i < 0x8000 {
                assert_eq!(u32::from(c.value), 2 * i);
            }
            assert_eq!(t.complete(c.value), Ok(0));
        }
    }

    #[test]
    fn a_refused_completion_leaves_the_command_in_flight() {
        let mut t: CidTable<u32> = CidTable::new(4);
        let (a, v) = t.alloc_mut().unwrap();
        *v = 7;
        let b = t.alloc().unwrap();
        let free = t.free_slots();
        // The caller refuses A's completion: nothing changes.
        assert!(t.complete_mut_if(a.value, |v| *v != 7).is_none());
        assert_eq!(t.validate(a.value), Ok(a.slot), "still in flight");
        assert_eq!(t.free_slots(), free, "free stack untouched");
        assert_eq!(t.in_flight(), 2);
        // A CID that does not match is refused before `accept` is asked.
        assert!(
            t.complete_mut_if(a.value ^ 0x100, |_| panic!("asked for a wrong CID"))
                .is_none()
        );
        assert!(t.complete_mut_if(0xffff, |_| true).is_none());
        // Accepted: completed once, like `complete_mut`.
        let (slot, v) = t.complete_mut_if(a.value, |v| *v == 7).unwrap();
        assert_eq!((slot, *v), (a.slot, 7));
        assert_eq!(t.free_slots(), free + 1);
        assert!(t.complete_mut_if(a.value, |_| true).is_none(), "only once");
        assert_eq!(t.complete(b.value), Ok(b.slot));
    }
}

//! Tests of the model itself, driven through [`Device`] with hand-built
//! submission queue entries: a minimal host written from the specification,
//! independent of the driver.

mod bringup;
mod doorbells;
mod faults;
mod hostile;
mod io;
mod mapper;
mod spec_strictness;

use upnvme::Device;
use upnvme_dma::DmaBuffer;

use super::{ModelConfig, ModelController, Status};

/// A submission queue entry under construction (Common Command Format).
#[derive(Clone, Copy)]
pub(super) struct Sqe {
    raw: [u8; 64],
}

impl Sqe {
    pub fn new(opcode: u8) -> Self {
        let mut raw = [0u8; 64];
        raw[0] = opcode;
        Sqe { raw }
    }
    fn put32(mut self, off: usize, v: u32) -> Self {
        self.raw[off..off + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Opcode (CDW0 bits 7:0).
    pub fn opcode(mut self, op: u8) -> Self {
        self.raw[0] = op;
        self
    }
    /// Raw little-endian qword at byte `off`.
    pub fn put64(self, off: usize, v: u64) -> Self {
        self.put32(off, v as u32).put32(off + 4, (v >> 32) as u32)
    }
    pub fn nsid(self, nsid: u32) -> Self {
        self.put32(4, nsid)
    }
    pub fn prp1(self, p: u64) -> Self {
        self.put64(24, p)
    }
    pub fn prp2(self, p: u64) -> Self {
        self.put64(32, p)
    }
    pub fn cdw(self, n: usize, v: u32) -> Self {
        self.put32(40 + (n - 10) * 4, v)
    }
    /// CDW0 bits 15:8: FUSE (9:8) and PSDT (15:14).
    pub fn flags(mut self, b: u8) -> Self {
        self.raw[1] = b;
        self
    }
    pub fn slba(self, lba: u64) -> Self {
        self.put64(40, lba)
    }
    fn cid(mut self, cid: u16) -> Self {
        self.raw[2..4].copy_from_slice(&cid.to_le_bytes());
        self
    }
}

/// A completion queue entry as read back (Common Completion Queue Entry Layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cqe {
    pub dw0: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub phase: bool,
    pub status: Status,
}

/// One submission/completion queue pair as a host sees it.
pub(super) struct Ring {
    pub qid: u16,
    pub size: u32,
    pub sq: DmaBuffer,
    pub cq: DmaBuffer,
    pub tail: u32,
    pub head: u32,
    pub phase: bool,
    pub next_cid: u16,
    stride: usize,
}

impl Ring {
    fn new(m: &ModelController, qid: u16, size: u32) -> Ring {
        let stride = 4usize << m.config().dstrd;
        Ring {
            qid,
            size,
            sq: m.alloc_dma(size as usize * 64).unwrap(),
            cq: m.alloc_dma(size as usize * 16).unwrap(),
            tail: 0,
            head: 0,
            phase: true,
            next_cid: 0,
            stride,
        }
    }

    pub fn sq_doorbell(&self) -> usize {
        0x1000 + 2 * usize::from(self.qid) * self.stride
    }

    pub fn cq_doorbell(&self) -> usize {
        self.sq_doorbell() + self.stride
    }

    /// Writes the entry at the tail with a fresh CID; no doorbell.
    pub fn push(&mut self, sqe: Sqe) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        self.push_cid(sqe, cid);
        cid
    }

    pub fn push_cid(&mut self, sqe: Sqe, cid: u16) {
        let sqe = sqe.cid(cid);
        self.sq
            .write_bytes(self.tail as usize * 64, &sqe.raw)
            .unwrap();
        self.tail = (self.tail + 1) % self.size;
    }

    pub fn ring_sq(&self, m: &ModelController) {
        m.write32(self.sq_doorbell(), self.tail);
    }

    pub fn ring_cq(&self, m: &ModelController) {
        m.write32(self.cq_doorbell(), self.head);
    }

    /// The entry at the CQ head as raw words, whatever its phase.
    pub fn peek(&self, slot: u32) -> Cqe {
        let off = slot as usize * 16;
        let dw3 = self.cq.load_acquire_u32(off + 12).unwrap();
        let dw2 = self.cq.read_u32(off + 8).unwrap();
        Cqe {
            dw0: self.cq.read_u32(off).unwrap(),
            sqhd: dw2 as u16,
            sqid: (dw2 >> 16) as u16,
            cid: dw3 as u16,
            phase: dw3 & (1 << 16) != 0,
            status: Status::from_dw3(dw3),
        }
    }

    /// Takes the next completion if its phase says it is new (no doorbell).
    pub fn poll(&mut self) -> Option<Cqe> {
        let c = self.peek(self.head);
        if c.phase != self.phase {
            return None;
        }
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
        Some(c)
    }

    /// Submits one command, rings, reaps its completion, rings the CQ head.
    pub fn call(&mut self, m: &ModelController, sqe: Sqe) -> Cqe {
        let cid = self.push(sqe);
        self.ring_sq(m);
        let c = self.poll().expect("no completion posted");
        self.ring_cq(m);
        assert_eq!(c.cid, cid);
        assert_eq!(c.sqid, self.qid);
        c
    }
}

/// A host with an enabled controller and an admin queue pair.
pub(super) struct Host {
    pub m: ModelController,
    pub admin: Ring,
}

/// CC value the tests enable with: IOSQES 6, IOCQES 4, MPS 0, CSS NVM, EN.
pub(super) const CC_ENABLE: u32 = 0x0046_0001;

impl Host {
    pub fn new() -> Host {
        Host::with(ModelConfig::default())
    }

    pub fn with(cfg: ModelConfig) -> Host {
        let m = ModelController::new(cfg);
        let admin = Ring::new(&m, 0, 16);
        m.write32(0x24, 15 | 15 << 16);
        m.write64(0x28, admin.sq.iova());
        m.write64(0x30, admin.cq.iova());
        m.write32(0x14, CC_ENABLE);
        assert!((0..100).any(|_| m.read32(0x1c) & 1 == 1), "CSTS.RDY");
        Host { m, admin }
    }

    pub fn admin(&mut self, sqe: Sqe) -> Cqe {
        self.admin.call(&self.m, sqe)
    }

    /// Creates I/O CQ and SQ `qid` with `entries` entries each (IEN = 0).
    pub fn create_pair(&mut self, qid: u16, entries: u32) -> Ring {
        let ring = Ring::new(&self.m, qid, entries);
        let qsize = (entries - 1) << 16;
        let c = self.admin(
            Sqe::new(0x05)
                .prp1(ring.cq.iova())
                .cdw(10, qsize | u32::from(qid))
                .cdw(11, 1),
        );
        assert_eq!(c.status, Status::SUCCESS, "create CQ");
        let c = self.admin(
            Sqe::new(0x01)
                .prp1(ring.sq.iova())
                .cdw(10, qsize | u32::from(qid))
                .cdw(11, 1 | u32::from(qid) << 16),
        );
        assert_eq!(c.status, Status::SUCCESS, "create SQ");
        ring
    }

    pub fn buffer(&self, len: usize) -> DmaBuffer {
        self.m.alloc_dma(len).unwrap()
    }

    /// Asserts the run was clean: no violations, no DMA faults.
    pub fn assert_clean(&self) {
        assert_eq!(self.m.violations(), Vec::<String>::new());
        assert_eq!(self.m.dma_faults(), 0, "{:?}", self.m.dma_fault_log());
    }
}

/// A Read (0x02) or Write (0x01) of `nlb` blocks at `lba` on namespace 1.
pub(super) fn rw(opcode: u8, lba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
    Sqe::new(opcode)
        .nsid(1)
        .slba(lba)
        .cdw(12, nlb - 1)
        .prp1(prp1)
        .prp2(prp2)
}

/// Deterministic test pattern.
pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

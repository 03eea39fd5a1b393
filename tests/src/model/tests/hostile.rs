//! A hostile host: random register writes, random doorbell values, random
//! command bytes with PRPs into mapped and unmapped memory, random faults.
//! The model must record what is wrong and never panic.

use upnvme::Device;

use super::{CC_ENABLE, Host, Ring, Sqe};
use crate::model::{Fault, Match, ModelConfig, Status};

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random 64 bytes, with opcode, PRPs and dwords biased toward values that
/// reach deep into command handling.
fn random_sqe(rng: &mut Rng, buf: u64, admin: bool) -> Sqe {
    let mut sqe = Sqe::new(0);
    for i in 0..8 {
        sqe = sqe.put64(i * 8, rng.next());
    }
    let opcodes: &[u8] = if admin {
        &[
            0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a, 0x0c, 0x18, 0x7c,
        ]
    } else {
        &[0x00, 0x01, 0x02, 0x05, 0x08, 0x09]
    };
    if rng.below(8) != 0 {
        sqe = sqe.opcode(opcodes[rng.below(opcodes.len() as u64) as usize]);
        sqe = sqe.flags(0);
    }
    if rng.below(4) != 0 {
        sqe = sqe.nsid(rng.below(3) as u32);
    }
    match rng.below(4) {
        0 | 1 => {
            let off = (rng.below(4) * 4096 + rng.below(2) * rng.below(4096)) & !3;
            sqe = sqe.prp1(buf + off).prp2(buf + 4096 * (1 + rng.below(3)));
        }
        // Page-aligned but unmapped: reaches the DMA itself.
        2 => sqe = sqe.prp1(rng.next() & !0xfff).prp2(rng.next() & !0xfff),
        _ => {}
    }
    if rng.below(2) == 0 {
        // Small CDW10/11/12 values: queue ids, sizes, LBAs, block counts.
        sqe = sqe
            .cdw(10, (rng.below(8) as u32) << 16 | rng.below(8) as u32)
            .cdw(11, (rng.below(4) as u32) << 16 | rng.below(4) as u32)
            .cdw(12, rng.below(40) as u32);
    }
    sqe
}

/// Resets and re-enables the controller, then recreates I/O queue pair 1.
fn reenable(h: &mut Host) -> Ring {
    let m = h.m.clone();
    m.clear_faults();
    enable(&m, &mut h.admin);
    assert!((0..10).any(|_| m.read32(0x1c) & 1 == 1), "ready again");
    h.create_pair(1, 8)
}

fn enable(m: &crate::model::ModelController, admin: &mut Ring) {
    m.write32(0x14, 0);
    admin.tail = 0;
    admin.head = 0;
    admin.phase = true;
    admin.cq.fill(0, admin.cq.len(), 0).unwrap();
    m.write32(0x24, (admin.size - 1) | (admin.size - 1) << 16);
    m.write64(0x28, admin.sq.iova());
    m.write64(0x30, admin.cq.iova());
    m.write32(0x14, CC_ENABLE);
    let _ = m.read32(0x1c);
}

#[test]
fn random_host_never_panics_the_model() {
    for seed in 1..=4u64 {
        let cfg = ModelConfig {
            max_ioqpairs: 4,
            mqes: 63,
            ready_delay_reads: (seed % 2) as u32,
            ..ModelConfig::default()
        };
        let mut h = Host::with(cfg);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let data = h.buffer(5 * 4096);
        let m = h.m.clone();
        let mut io = h.create_pair(1, 8);
        for _ in 0..20_000 {
            match rng.below(16) {
                0..=5 => {
                    let sqe = random_sqe(&mut rng, data.iova(), true);
                    h.admin.push(sqe);
                    h.admin.ring_sq(&m);
                }
                6..=8 => {
                    let sqe = random_sqe(&mut rng, data.iova(), false);
                    io.push(sqe);
                    io.ring_sq(&m);
                }
                9 => {
                    // Reap (or pretend to) and release CQ slots.
                    while h.admin.poll().is_some() {}
                    while io.poll().is_some() {}
                    if rng.below(4) != 0 {
                        h.admin.ring_cq(&m);
                        io.ring_cq(&m);
                    }
                }
                10 => {
                    let off = match rng.below(3) {
                        0 => rng.below(0x40) as usize,
                        1 => 0x1000 + rng.below(0x60) as usize,
                        _ => rng.below(0x5000) as usize,
                    };
                    let v = if rng.below(2) == 0 {
                        rng.below(20) as u32
                    } else {
                        rng.next() as u32
                    };
                    if off & 0x3f == 0x14 && rng.below(4) != 0 {
                        continue; // keep the controller enabled most of the time
                    }
                    m.write32(off, v);
                }
                11 => {
                    let off = rng.below(0x4010) as usize;
                    let _ = m.read32(off);
                    let _ = m.read64(off);
                }
                12 => io = reenable(&mut h),
                13 => {
                    let on = match rng.below(4) {
                        0 => Match::Next,
                        1 => Match::Queue(rng.below(3) as u16),
                        2 => Match::Opcode {
                            qid: 1,
                            opcode: rng.below(3) as u8,
                        },
                        _ => Match::Nth(m.commands_fetched() + rng.below(5)),
                    };
                    let fault = match rng.below(7) {
                        0 => Fault::DropCompletion(on),
                        1 => Fault::DelayCompletion {
                            on,
                            doorbells: Some(rng.below(4) as u32),
                        },
                        2 => Fault::DuplicateCompletion(on),
                        3 => Fault::CorruptCid { on, xor: 0x8001 },
                        4 => Fault::BadSqHead { on, sqhd: 0xfff },
                        5 => Fault::WrongPhase(on),
                        _ => Fault::Status {
                            on,
                            status: Status::INTERNAL_ERROR,
                        },
                    };
                    m.inject(fault);
                }
                14 => {
                    m.raise_async_event(rng.below(8) as u8, 1, 2);
                    m.release_delayed();
                    m.process_shadow();
                }
                _ => {
                    let dwords = [0, 0, rng.next() as u32, rng.next() as u32];
                    m.post_raw_completion(rng.below(3) as u16, dwords);
                    if rng.below(64) == 0 {
                        m.set_fatal();
                    }
                }
            }
        }
        assert!(
            m.commands_fetched() > 1000,
            "the random host did reach the model"
        );
        // Everything wrong was recorded, not panicked on.
        assert!(m.dma_faults() > 0, "the random host did reach DMA");
        let _ = m.take_violations();
    }
}

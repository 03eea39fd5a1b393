//! # upnvme-queues
//!
//! The pure half of upnvme: everything about NVMe that is arithmetic or data
//! layout, with no memory-mapped I/O, no DMA memory and no `unsafe`. The
//! `dma` crate owns the device and its memory; the `upnvme` driver crate
//! combines both. Keeping this crate pure makes it testable on any host (and
//! under Miri), and lets the in-memory controller model in `tests/` speak the
//! same structures as the driver.
//!
//! References are to the NVM Express Base Specification 2.0 and the NVM
//! Command Set Specification 1.0.
//!
//! | module | contents |
//! |---|---|
//! | [`regs`] | controller registers CAP, VS, CC, CSTS, AQA and doorbell offsets |
//! | [`sqe`] | the 64-byte Submission Queue Entry, opcodes and command builders |
//! | [`cqe`] | the 16-byte Completion Queue Entry |
//! | [`status`] | the Status Field and the specification's status names |
//! | [`ring`] | SQ tail/head and CQ head/phase state for any queue size 2..=65536 |
//! | [`cid`] | command identifiers = tracker slot + generation, stale/duplicate detection |
//! | [`prp`] | PRP entries and (chained) PRP lists; a device-side decoder |
//! | [`sgl`] | SGL descriptors, (chained) SGL segments, SGLS support; a device-side decoder |
//! | [`shadow`] | Doorbell Buffer Config event-index arithmetic |
//! | [`identify`] | Identify Controller / Namespace / namespace list parsers |
//! | [`log`] | SMART / Health, Error Information and Firmware Slot log parsers |
//! | [`aer`] | Asynchronous Event Request completion decoding |
//!
//! Everything reported by the device (CQE fields, Identify data, log pages)
//! is untrusted input: parsers and validators return typed errors and never
//! panic.
//!
//! ## One command's life, as the driver uses these pieces
//!
//! ```
//! use upnvme_queues::{CidTable, CqRing, Cqe, Sqe, SqRing, Status, prp};
//!
//! let mut sq = SqRing::new(64)?;
//! let mut cq = CqRing::new(64)?;
//! let mut cids: CidTable = CidTable::new(63);
//!
//! // Submit: tracker slot + CID, SQE built in the tail slot, PRPs filled.
//! let cid = cids.alloc().expect("a free tracker");
//! let slot = sq.push().expect("queue not full");
//! let mut sqe = Sqe::read(1, 0, 8); // 8 blocks of 512 B from LBA 0
//! sqe.set_cid(cid.value);
//! let mut list = [0u64; 512]; // the tracker's PRP list page
//! let p = prp::build_contiguous(0x10_0000, 4096, 4096, &mut list, |_| 0x20_0000)?;
//! sqe.set_prp1(p.prp1);
//! sqe.set_prp2(p.prp2);
//! // ... copy sqe.to_le_bytes() into SQ slot `slot`, fence, then:
//! let tail = sq.commit().expect("tail moved"); // write to the SQ tail doorbell
//! assert_eq!((slot, tail), (0, 1));
//!
//! // Reap: the controller posted this entry at the CQ head.
//! let cqe = Cqe::new(0, 1, 1, cid.value, true, Status::SUCCESS);
//! assert!(cq.is_new(cqe.phase()));
//! sq.update_head(cqe.sqhd())?; // untrusted: validated against the window
//! let done = cids.complete(cqe.cid())?; // untrusted: slot + generation checked
//! assert_eq!(done, cid.slot);
//! cq.advance();
//! assert_eq!(cq.commit(), Some(1)); // value for the CQ head doorbell, when due
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bytes;

pub mod aer;
pub mod cid;
pub mod cqe;
pub mod identify;
pub mod log;
pub mod pi;
pub mod prp;
pub mod regs;
pub mod ring;
pub mod sgl;
pub mod shadow;
pub mod sqe;
pub mod status;

pub use aer::AsyncEvent;
pub use cid::{Cid, CidError, CidTable};
pub use cqe::{CQE_SIZE, Cqe, SQE_SIZE};
pub use identify::{
    IdentifyController, IdentifyControllerNvm, IdentifyError, IdentifyNamespace, LbaFormat,
    parse_ns_list,
};
pub use log::{ErrorLogEntry, FirmwareSlotLog, LogError, SmartLog, parse_error_log};
pub use prp::{PrpError, PrpLayout, Prps};
pub use regs::{Cap, Cc, Csts, Vs};
pub use ring::{CqRing, RingError, SqRing};
pub use shadow::need_mmio;
pub use sqe::{DsmRange, Sqe, cns, feature, log_id, opcode};
pub use status::Status;

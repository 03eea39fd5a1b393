//! The Status Field of a completion queue entry (NVMe Base Specification 2.0,
//! "Status Field Definition").

use std::fmt;

/// The 15-bit Status Field of a completion queue entry as the model posts it
/// in CQE dword 3 bits 31:17: SC (bits 7:0), SCT (bits 10:8), CRD (bits
/// 12:11), M (bit 13), DNR (bit 14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

impl Status {
    /// Status Code Type 0h: Generic Command Status.
    pub const SCT_GENERIC: u8 = 0;
    /// Status Code Type 1h: Command Specific Status.
    pub const SCT_COMMAND_SPECIFIC: u8 = 1;
    /// Status Code Type 2h: Media and Data Integrity Errors.
    pub const SCT_MEDIA: u8 = 2;

    /// Generic 00h: Successful Completion.
    pub const SUCCESS: Status = Status::new(0, 0x00);
    /// Generic 01h: Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::new(0, 0x01);
    /// Generic 02h: Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::new(0, 0x02);
    /// Generic 03h: Command ID Conflict.
    pub const CID_CONFLICT: Status = Status::new(0, 0x03);
    /// Generic 04h: Data Transfer Error (the model's answer to a DMA fault).
    pub const DATA_TRANSFER_ERROR: Status = Status::new(0, 0x04);
    /// Generic 06h: Internal Error.
    pub const INTERNAL_ERROR: Status = Status::new(0, 0x06);
    /// Generic 07h: Command Abort Requested (the target of an Abort command).
    pub const ABORT_REQUESTED: Status = Status::new(0, 0x07);
    /// Generic 08h: Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Status = Status::new(0, 0x08);
    /// Generic 0Bh: Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::new(0, 0x0b);
    /// Generic 0Ch: Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(0, 0x0c);
    /// Generic 13h: PRP Offset Invalid.
    pub const PRP_OFFSET_INVALID: Status = Status::new(0, 0x13);
    /// Generic (NVM command set) 80h: LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status::new(0, 0x80);
    /// Command Specific 00h: Completion Queue Invalid (Create I/O SQ).
    pub const CQ_INVALID: Status = Status::new(1, 0x00);
    /// Command Specific 01h: Invalid Queue Identifier.
    pub const INVALID_QID: Status = Status::new(1, 0x01);
    /// Command Specific 02h: Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Status = Status::new(1, 0x02);
    /// Command Specific 05h: Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT_EXCEEDED: Status = Status::new(1, 0x05);
    /// Command Specific 08h: Invalid Interrupt Vector (Create I/O CQ).
    pub const INVALID_INTERRUPT_VECTOR: Status = Status::new(1, 0x08);
    /// Command Specific 09h: Invalid Log Page.
    pub const INVALID_LOG_PAGE: Status = Status::new(1, 0x09);
    /// Command Specific 0Ch: Invalid Queue Deletion (Delete I/O CQ while an
    /// SQ still uses it).
    pub const INVALID_QUEUE_DELETION: Status = Status::new(1, 0x0c);
    /// Command Specific 0Dh: Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(1, 0x0d);
    /// Command Specific 0Eh: Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::new(1, 0x0e);
    /// Media and Data Integrity 85h: Compare Failure.
    pub const COMPARE_FAILURE: Status = Status::new(2, 0x85);

    /// A status with Status Code Type `sct` (3 bits) and Status Code `sc`.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status((((sct & 7) as u16) << 8) | sc as u16)
    }

    /// The Status Field as found in bits 31:17 of CQE dword 3.
    pub const fn from_dw3(dw3: u32) -> Status {
        Status(((dw3 >> 17) & 0x7fff) as u16)
    }

    /// A copy with DNR (Do Not Retry, bit 14) set.
    pub const fn with_dnr(self) -> Status {
        Status(self.0 | 1 << 14)
    }

    /// A copy without DNR and More: the code that identifies the condition.
    pub const fn code_only(self) -> Status {
        Status(self.0 & 0x07ff)
    }

    /// SC, Status Code (bits 7:0).
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }

    /// SCT, Status Code Type (bits 10:8).
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }

    /// DNR, Do Not Retry (bit 14).
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// True for Successful Completion (SCT 0, SC 0), whatever DNR/M say.
    pub const fn is_success(self) -> bool {
        self.0 & 0x07ff == 0
    }

    /// True when `self` and `other` name the same condition (SCT and SC),
    /// ignoring DNR, More and CRD.
    pub const fn same_code(self, other: Status) -> bool {
        self.0 & 0x07ff == other.0 & 0x07ff
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SCT {:#x} SC {:#04x}", self.sct(), self.sc())?;
        if self.dnr() {
            f.write_str(" DNR")?;
        }
        Ok(())
    }
}

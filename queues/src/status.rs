//! The Completion Queue Entry Status Field (NVMe Base Specification 2.0,
//! §4.6.1 "Status Field Definition") with the specification's names for
//! status code types and status codes.

use core::fmt;

/// Status Code Type values (Status Field bits 10:8 here; CQE DW3 bits 27:25).
pub mod sct {
    /// Generic Command Status.
    pub const GENERIC: u8 = 0x0;
    /// Command Specific Status.
    pub const COMMAND_SPECIFIC: u8 = 0x1;
    /// Media and Data Integrity Errors.
    pub const MEDIA: u8 = 0x2;
    /// Path Related Status.
    pub const PATH: u8 = 0x3;
    /// Vendor Specific.
    pub const VENDOR: u8 = 0x7;
}

/// Frequently tested status codes, grouped by status code type.
pub mod sc {
    /// Generic Command Status codes (SCT 0h).
    pub mod generic {
        /// Successful Completion.
        pub const SUCCESS: u8 = 0x00;
        /// Invalid Command Opcode.
        pub const INVALID_OPCODE: u8 = 0x01;
        /// Invalid Field in Command.
        pub const INVALID_FIELD: u8 = 0x02;
        /// Command ID Conflict.
        pub const CID_CONFLICT: u8 = 0x03;
        /// Data Transfer Error.
        pub const DATA_TRANSFER_ERROR: u8 = 0x04;
        /// Internal Error.
        pub const INTERNAL_ERROR: u8 = 0x06;
        /// Command Abort Requested.
        pub const ABORT_REQUESTED: u8 = 0x07;
        /// Command Aborted due to SQ Deletion.
        pub const ABORTED_SQ_DELETION: u8 = 0x08;
        /// Invalid Namespace or Format.
        pub const INVALID_NAMESPACE: u8 = 0x0b;
        /// PRP Offset Invalid.
        pub const PRP_OFFSET_INVALID: u8 = 0x13;
        /// LBA Out of Range.
        pub const LBA_OUT_OF_RANGE: u8 = 0x80;
        /// Capacity Exceeded.
        pub const CAPACITY_EXCEEDED: u8 = 0x81;
        /// Command Interrupted.
        pub const COMMAND_INTERRUPTED: u8 = 0x21;
        /// Namespace Not Ready.
        pub const NAMESPACE_NOT_READY: u8 = 0x82;
    }
    /// Path Related Status codes (SCT 3h).
    pub mod path {
        /// Asymmetric Access Inaccessible.
        pub const ANA_INACCESSIBLE: u8 = 0x02;
        /// Asymmetric Access Transition.
        pub const ANA_TRANSITION: u8 = 0x03;
    }
    /// Command Specific Status codes (SCT 1h).
    pub mod command_specific {
        /// Completion Queue Invalid.
        pub const CQ_INVALID: u8 = 0x00;
        /// Invalid Queue Identifier.
        pub const INVALID_QID: u8 = 0x01;
        /// Invalid Queue Size.
        pub const INVALID_QUEUE_SIZE: u8 = 0x02;
        /// Asynchronous Event Request Limit Exceeded.
        pub const AER_LIMIT_EXCEEDED: u8 = 0x05;
        /// Invalid Log Page.
        pub const INVALID_LOG_PAGE: u8 = 0x09;
        /// Invalid Queue Deletion.
        pub const INVALID_QUEUE_DELETION: u8 = 0x0c;
    }
    /// Media and Data Integrity Errors (SCT 2h).
    pub mod media {
        /// Write Fault.
        pub const WRITE_FAULT: u8 = 0x80;
        /// Unrecovered Read Error.
        pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
        /// Compare Failure.
        pub const COMPARE_FAILURE: u8 = 0x85;
        /// Access Denied.
        pub const ACCESS_DENIED: u8 = 0x86;
        /// Deallocated or Unwritten Logical Block.
        pub const DEALLOCATED_OR_UNWRITTEN: u8 = 0x87;
    }
}

/// The 15-bit Status Field of a completion (CQE DW3 bits 31:17), **without**
/// the Phase Tag: bits 7:0 SC (Status Code), 10:8 SCT (Status Code Type),
/// 12:11 CRD (Command Retry Delay), 13 M (More), 14 DNR (Do Not Retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

impl Status {
    /// Successful Completion (SCT 0h, SC 00h).
    pub const SUCCESS: Status = Status(0);

    /// Builds a status from SCT and SC with CRD, M and DNR clear.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status((((sct & 0x7) as u16) << 8) | sc as u16)
    }

    /// Returns a copy with DNR (Do Not Retry) set to `dnr`.
    pub const fn with_dnr(self, dnr: bool) -> Status {
        Status((self.0 & !(1 << 14)) | ((dnr as u16) << 14))
    }

    /// Returns a copy with M (More) set to `more`.
    pub const fn with_more(self, more: bool) -> Status {
        Status((self.0 & !(1 << 13)) | ((more as u16) << 13))
    }

    /// Extracts the Status Field from a raw CQE DW3: `(dw3 >> 17) & 0x7fff`.
    pub const fn from_dw3(dw3: u32) -> Status {
        Status(((dw3 >> 17) & 0x7fff) as u16)
    }

    /// SC (bits 7:0), Status Code.
    pub fn sc(&self) -> u8 {
        self.0 as u8
    }

    /// SCT (bits 10:8), Status Code Type (see [`sct`]).
    pub fn sct(&self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// CRD (bits 12:11), Command Retry Delay: 0 = none, 1..=3 select
    /// Identify Controller CRDT1..CRDT3 (units of 100 ms).
    pub fn crd(&self) -> u8 {
        ((self.0 >> 11) & 0x3) as u8
    }

    /// M (bit 13), More: further information is in the Error Information log.
    pub fn more(&self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// DNR (bit 14), Do Not Retry: the same command is expected to fail again.
    pub fn dnr(&self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// True for Successful Completion (SCT 0h and SC 00h; CRD/M/DNR ignored).
    #[inline]
    pub fn is_success(&self) -> bool {
        // SCT (10:8) = 0 and SC (7:0) = 0: one mask.
        const _: () = assert!(sct::GENERIC == 0 && sc::generic::SUCCESS == 0);
        self.0 & 0x7ff == 0
    }

    /// True for a status that says the namespace is passing through a
    /// state, not what it is, with DNR clear (a retry may succeed):
    /// Namespace Not Ready (another host's Format NVM or Sanitize, a
    /// namespace still coming up), Command Interrupted, and the Path Related
    /// Asymmetric Access Transition.
    pub fn is_transient(&self) -> bool {
        !self.dnr()
            && matches!(
                (self.sct(), self.sc()),
                (sct::GENERIC, sc::generic::NAMESPACE_NOT_READY)
                    | (sct::GENERIC, sc::generic::COMMAND_INTERRUPTED)
                    | (sct::PATH, sc::path::ANA_TRANSITION)
            )
    }

    /// True for the Generic Command Status "LBA Out of Range".
    pub fn is_lba_out_of_range(&self) -> bool {
        self.sct() == sct::GENERIC && self.sc() == sc::generic::LBA_OUT_OF_RANGE
    }

    /// True for the Media and Data Integrity Error "Compare Failure".
    pub fn is_compare_failure(&self) -> bool {
        self.sct() == sct::MEDIA && self.sc() == sc::media::COMPARE_FAILURE
    }

    /// The specification's name for the Status Code Type.
    pub fn sct_name(&self) -> &'static str {
        match self.sct() {
            0 => "Generic Command Status",
            1 => "Command Specific Status",
            2 => "Media and Data Integrity Errors",
            3 => "Path Related Status",
            7 => "Vendor Specific",
            _ => "Reserved",
        }
    }

    /// The specification's name for the status code within its type, or
    /// `"Unknown Status"`. NVM Command Set specific codes (80h..BFh) use the
    /// NVM Command Set (and Zoned Namespace) names.
    pub fn name(&self) -> &'static str {
        let name = match self.sct() {
            0 => generic_name(self.sc()),
            1 => command_specific_name(self.sc()),
            2 => media_name(self.sc()),
            3 => path_name(self.sc()),
            7 => Some("Vendor Specific"),
            _ => None,
        };
        name.unwrap_or("Unknown Status")
    }
}

/// Generic Command Status values (Base 2.0 "Generic Command Status Values";
/// 80h..84h from the NVM Command Set Specification).
fn generic_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Successful Completion",
        0x01 => "Invalid Command Opcode",
        0x02 => "Invalid Field in Command",
        0x03 => "Command ID Conflict",
        0x04 => "Data Transfer Error",
        0x05 => "Commands Aborted due to Power Loss Notification",
        0x06 => "Internal Error",
        0x07 => "Command Abort Requested",
        0x08 => "Command Aborted due to SQ Deletion",
        0x09 => "Command Aborted due to Failed Fused Command",
        0x0a => "Command Aborted due to Missing Fused Command",
        0x0b => "Invalid Namespace or Format",
        0x0c => "Command Sequence Error",
        0x0d => "Invalid SGL Segment Descriptor",
        0x0e => "Invalid Number of SGL Descriptors",
        0x0f => "Data SGL Length Invalid",
        0x10 => "Metadata SGL Length Invalid",
        0x11 => "SGL Descriptor Type Invalid",
        0x12 => "Invalid Use of Controller Memory Buffer",
        0x13 => "PRP Offset Invalid",
        0x14 => "Atomic Write Unit Exceeded",
        0x15 => "Operation Denied",
        0x16 => "SGL Offset Invalid",
        0x18 => "Host Identifier Inconsistent Format",
        0x19 => "Keep Alive Timer Expired",
        0x1a => "Keep Alive Timeout Invalid",
        0x1b => "Command Aborted due to Preempt and Abort",
        0x1c => "Sanitize Failed",
        0x1d => "Sanitize In Progress",
        0x1e => "SGL Data Block Granularity Invalid",
        0x1f => "Command Not Supported for Queue in CMB",
        0x20 => "Namespace is Write Protected",
        0x21 => "Command Interrupted",
        0x22 => "Transient Transport Error",
        0x23 => "Command Prohibited by Command and Feature Lockdown",
        0x24 => "Admin Command Media Not Ready",
        0x80 => "LBA Out of Range",
        0x81 => "Capacity Exceeded",
        0x82 => "Namespace Not Ready",
        0x83 => "Reservation Conflict",
        0x84 => "Format In Progress",
        _ => return None,
    })
}

/// Command Specific Status values (Base 2.0 "Command Specific Status
/// Values"; 80h..83h and B8h..BFh from the NVM and Zoned Namespace Command
/// Set Specifications).
fn command_specific_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Completion Queue Invalid",
        0x01 => "Invalid Queue Identifier",
        0x02 => "Invalid Queue Size",
        0x03 => "Abort Command Limit Exceeded",
        0x05 => "Asynchronous Event Request Limit Exceeded",
        0x06 => "Invalid Firmware Slot",
        0x07 => "Invalid Firmware Image",
        0x08 => "Invalid Interrupt Vector",
        0x09 => "Invalid Log Page",
        0x0a => "Invalid Format",
        0x0b => "Firmware Activation Requires Conventional Reset",
        0x0c => "Invalid Queue Deletion",
        0x0d => "Feature Identifier Not Saveable",
        0x0e => "Feature Not Changeable",
        0x0f => "Feature Not Namespace Specific",
        0x10 => "Firmware Activation Requires NVM Subsystem Reset",
        0x11 => "Firmware Activation Requires Controller Level Reset",
        0x12 => "Firmware Activation Requires Maximum Time Violation",
        0x13 => "Firmware Activation Prohibited",
        0x14 => "Overlapping Range",
        0x15 => "Namespace Insufficient Capacity",
        0x16 => "Namespace Identifier Unavailable",
        0x18 => "Namespace Already Attached",
        0x19 => "Namespace Is Private",
        0x1a => "Namespace Not Attached",
        0x1b => "Thin Provisioning Not Supported",
        0x1c => "Controller List Invalid",
        0x1d => "Device Self-test In Progress",
        0x1e => "Boot Partition Write Prohibited",
        0x1f => "Invalid Controller Identifier",
        0x20 => "Invalid Secondary Controller State",
        0x21 => "Invalid Number of Controller Resources",
        0x22 => "Invalid Resource Identifier",
        0x23 => "Sanitize Prohibited While Persistent Memory Region is Enabled",
        0x24 => "ANA Group Identifier Invalid",
        0x25 => "ANA Attach Failed",
        0x26 => "Insufficient Capacity",
        0x27 => "Namespace Attachment Limit Exceeded",
        0x28 => "Prohibition of Command Execution Not Supported",
        0x29 => "I/O Command Set Not Supported",
        0x2a => "I/O Command Set Not Enabled",
        0x2b => "I/O Command Set Combination Rejected",
        0x2c => "Invalid I/O Command Set",
        0x2d => "Identifier Unavailable",
        0x80 => "Conflicting Attributes",
        0x81 => "Invalid Protection Information",
        0x82 => "Attempted Write to Read Only Range",
        0x83 => "Command Size Limit Exceeded",
        0xb8 => "Zoned Boundary Error",
        0xb9 => "Zone Is Full",
        0xba => "Zone Is Read Only",
        0xbb => "Zone Is Offline",
        0xbc => "Zone Invalid Write",
        0xbd => "Too Many Active Zones",
        0xbe => "Too Many Open Zones",
        0xbf => "Invalid Zone State Transition",
        _ => return None,
    })
}

/// Media and Data Integrity Errors values (Base 2.0 "Media and Data Integrity
/// Error Values"; 80h..88h are NVM Command Set specific).
fn media_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x80 => "Write Fault",
        0x81 => "Unrecovered Read Error",
        0x82 => "End-to-end Guard Check Error",
        0x83 => "End-to-end Application Tag Check Error",
        0x84 => "End-to-end Reference Tag Check Error",
        0x85 => "Compare Failure",
        0x86 => "Access Denied",
        0x87 => "Deallocated or Unwritten Logical Block",
        0x88 => "End-to-End Storage Tag Check Error",
        _ => return None,
    })
}

/// Path Related Status values (Base 2.0 "Path Related Status Values").
fn path_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Internal Path Error",
        0x01 => "Asymmetric Access Persistent Loss",
        0x02 => "Asymmetric Access Inaccessible",
        0x03 => "Asymmetric Access Transition",
        0x60 => "Controller Pathing Error",
        0x70 => "Host Pathing Error",
        0x71 => "Command Aborted By Host",
        _ => return None,
    })
}

impl fmt::Display for Status {
    /// Formats as the status name followed by the raw fields, e.g.
    /// `Invalid Field in Command (sct 0x0, sc 0x02, dnr)`; `more` and
    /// `crd N` are appended when set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sct 0x{:x}, sc 0x{:02x}",
            self.name(),
            self.sct(),
            self.sc()
        )?;
        if self.crd() != 0 {
            write!(f, ", crd {}", self.crd())?;
        }
        if self.more() {
            f.write_str(", more")?;
        }
        if self.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_layout() {
        let s = Status::from_dw3(0xffff_ffff);
        assert_eq!(s.0, 0x7fff);
        assert_eq!(s.sc(), 0xff);
        assert_eq!(s.sct(), 7);
        assert_eq!(s.crd(), 3);
        assert!(s.more());
        assert!(s.dnr());
        // Phase bit alone is not part of the status.
        assert_eq!(Status::from_dw3(1 << 16), Status::SUCCESS);
        let s = Status::new(sct::MEDIA, sc::media::COMPARE_FAILURE);
        assert_eq!(s.0, 0x285);
        assert!(s.is_compare_failure());
        assert!(!s.is_success());
        assert!(Status::new(0, 0x80).is_lba_out_of_range());
        // CRD/M/DNR do not change success.
        assert!(Status(0x7800).is_success());
    }

    #[test]
    fn names() {
        assert_eq!(Status::new(0, 0x02).name(), "Invalid Field in Command");
        assert_eq!(Status::new(0, 0x80).name(), "LBA Out of Range");
        assert_eq!(Status::new(1, 0x01).name(), "Invalid Queue Identifier");
        assert_eq!(Status::new(1, 0x80).name(), "Conflicting Attributes");
        assert_eq!(Status::new(2, 0x85).name(), "Compare Failure");
        assert_eq!(Status::new(2, 0x00).name(), "Unknown Status");
        assert_eq!(Status::new(3, 0x71).name(), "Command Aborted By Host");
        assert_eq!(Status::new(5, 0x00).name(), "Unknown Status");
        assert_eq!(Status::new(5, 0x00).sct_name(), "Reserved");
        assert_eq!(Status::new(7, 0x10).sct_name(), "Vendor Specific");
        assert_eq!(
            Status::new(2, 0).sct_name(),
            "Media and Data Integrity Errors"
        );
    }

    #[test]
    fn transient() {
        assert!(Status::new(0, 0x82).is_transient());
        assert!(Status::new(0, 0x21).is_transient());
        assert!(Status::new(3, 0x03).is_transient());
        assert!(!Status::new(0, 0x82).with_dnr(true).is_transient());
        assert!(
            !Status::new(3, 0x02).is_transient(),
            "inaccessible is a state"
        );
        assert!(!Status::new(0, 0x0b).is_transient());
        assert!(!Status::new(0, 0x06).is_transient());
        assert!(!Status::SUCCESS.is_transient());
        assert_eq!(Status::new(3, 0x03).name(), "Asymmetric Access Transition");
    }

    #[test]
    fn display() {
        let s = Status::new(0, 0x02).with_dnr(true);
        assert_eq!(
            s.to_string(),
            "Invalid Field in Command (sct 0x0, sc 0x02, dnr)"
        );
        let s = Status::new(2, 0x81).with_more(true);
        assert_eq!(
            s.to_string(),
            "Unrecovered Read Error (sct 0x2, sc 0x81, more)"
        );
        assert_eq!(
            Status::SUCCESS.to_string(),
            "Successful Completion (sct 0x0, sc 0x00)"
        );
        assert_eq!(
            Status(1 << 11).to_string(),
            "Successful Completion (sct 0x0, sc 0x00, crd 1)"
        );
    }

    #[test]
    fn every_value_has_a_name() {
        let step = if cfg!(miri) { 97 } else { 1 };
        for v in (0..=0x7fffu16).step_by(step) {
            let s = Status(v);
            assert!(!s.name().is_empty());
            assert!(!s.sct_name().is_empty());
            let _ = s.to_string();
        }
    }
}

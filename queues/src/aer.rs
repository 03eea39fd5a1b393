//! Asynchronous events (NVMe Base Specification 2.0, "Asynchronous Event
//! Request command": completion queue entry Dword 0 and the "Asynchronous
//! Event Information" tables for each event type).
//!
//! Completion Dword 0 of an Asynchronous Event Request: bits 2:0 Asynchronous
//! Event Type, bits 15:8 Asynchronous Event Information, bits 23:16 Log Page
//! Identifier (the log to read, with RAE clear, to re-arm the event).

use core::fmt;

/// Asynchronous Event Type values.
pub mod event_type {
    /// Error status.
    pub const ERROR: u8 = 0;
    /// SMART / Health status.
    pub const SMART_HEALTH: u8 = 1;
    /// Notice.
    pub const NOTICE: u8 = 2;
    /// Immediate.
    pub const IMMEDIATE: u8 = 3;
    /// One-Shot.
    pub const ONE_SHOT: u8 = 4;
    /// I/O Command specific status.
    pub const IO_COMMAND_SPECIFIC: u8 = 6;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// Notice event information values (event type 2h).
pub mod notice {
    /// Namespace Attribute Changed (log 04h, Changed Namespace List).
    pub const NAMESPACE_ATTRIBUTE_CHANGED: u8 = 0x00;
    /// Firmware Activation Starting.
    pub const FIRMWARE_ACTIVATION_STARTING: u8 = 0x01;
    /// Telemetry Log Changed.
    pub const TELEMETRY_LOG_CHANGED: u8 = 0x02;
    /// Asymmetric Namespace Access Change.
    pub const ANA_CHANGE: u8 = 0x03;
}

/// A decoded Asynchronous Event Request completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// Asynchronous Event Type (Dword 0 bits 2:0; see [`event_type`]).
    pub event_type: u8,
    /// Asynchronous Event Information (Dword 0 bits 15:8).
    pub event_info: u8,
    /// Log Page Identifier (Dword 0 bits 23:16).
    pub log_page: u8,
}

impl AsyncEvent {
    /// Decodes completion Dword 0.
    pub fn from_dw0(dw0: u32) -> AsyncEvent {
        AsyncEvent {
            event_type: (dw0 & 0x7) as u8,
            event_info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }

    /// Notice / Namespace Attribute Changed: the Changed Namespace List
    /// (log 04h) names the namespaces whose Identify data changed.
    pub fn is_namespace_attribute_changed(&self) -> bool {
        self.event_type == event_type::NOTICE
            && self.event_info == notice::NAMESPACE_ATTRIBUTE_CHANGED
    }

    /// Encodes completion Dword 0 (used by controller models).
    pub fn to_dw0(&self) -> u32 {
        u32::from(self.event_type & 0x7)
            | (u32::from(self.event_info) << 8)
            | (u32::from(self.log_page) << 16)
    }

    /// The specification's name for the event type.
    pub fn type_name(&self) -> &'static str {
        match self.event_type {
            event_type::ERROR => "Error status",
            event_type::SMART_HEALTH => "SMART / Health status",
            event_type::NOTICE => "Notice",
            event_type::IMMEDIATE => "Immediate",
            event_type::ONE_SHOT => "One-Shot",
            event_type::IO_COMMAND_SPECIFIC => "I/O Command specific status",
            event_type::VENDOR => "Vendor specific",
            _ => "Reserved",
        }
    }

    /// The specification's name for the event information within its type,
    /// or `None` when not known.
    pub fn info_name(&self) -> Option<&'static str> {
        Some(match (self.event_type, self.event_info) {
            (event_type::ERROR, 0x00) => "Write to Invalid Doorbell Register",
            (event_type::ERROR, 0x01) => "Invalid Doorbell Write Value",
            (event_type::ERROR, 0x02) => "Diagnostic Failure",
            (event_type::ERROR, 0x03) => "Persistent Internal Error",
            (event_type::ERROR, 0x04) => "Transient Internal Error",
            (event_type::ERROR, 0x05) => "Firmware Image Load Error",
            (event_type::SMART_HEALTH, 0x00) => "NVM subsystem Reliability",
            (event_type::SMART_HEALTH, 0x01) => "Temperature Threshold",
            (event_type::SMART_HEALTH, 0x02) => "Spare Below Threshold",
            (event_type::NOTICE, 0x00) => "Namespace Attribute Changed",
            (event_type::NOTICE, 0x01) => "Firmware Activation Starting",
            (event_type::NOTICE, 0x02) => "Telemetry Log Changed",
            (event_type::NOTICE, 0x03) => "Asymmetric Namespace Access Change",
            (event_type::NOTICE, 0x04) => "Predictable Latency Event Aggregate Log Change",
            (event_type::NOTICE, 0x05) => "LBA Status Information Alert",
            (event_type::NOTICE, 0x06) => "Endurance Group Event Aggregate Log Page Change",
            (event_type::NOTICE, 0x07) => "Normal NVM Subsystem Shutdown",
            (event_type::NOTICE, 0xf0) => "Discovery Log Page Change",
            (event_type::IMMEDIATE, 0x00) => "Normal NVM Subsystem Shutdown",
            (event_type::IO_COMMAND_SPECIFIC, 0x00) => "Reservation Log Page Available",
            (event_type::IO_COMMAND_SPECIFIC, 0x01) => "Sanitize Operation Completed",
            (event_type::IO_COMMAND_SPECIFIC, 0x02) => {
                "Sanitize Operation Completed With Unexpected Deallocation"
            }
            _ => return None,
        })
    }
}

impl fmt::Display for AsyncEvent {
    /// E.g. `Notice: Namespace Attribute Changed (log page 0x04)`; unknown
    /// information is shown as `info 0x..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info_name() {
            Some(name) => write!(f, "{}: {}", self.type_name(), name)?,
            None => write!(f, "{}: info 0x{:02x}", self.type_name(), self.event_info)?,
        }
        write!(f, " (log page 0x{:02x})", self.log_page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_and_display() {
        let e = AsyncEvent::from_dw0(0x0004_0002);
        assert_eq!(e.event_type, event_type::NOTICE);
        assert_eq!(e.event_info, notice::NAMESPACE_ATTRIBUTE_CHANGED);
        assert_eq!(e.log_page, 0x04);
        assert_eq!(
            e.to_string(),
            "Notice: Namespace Attribute Changed (log page 0x04)"
        );
        assert_eq!(e.to_dw0(), 0x0004_0002);
        let s = AsyncEvent::from_dw0(0x0002_0101);
        assert_eq!(
            s.to_string(),
            "SMART / Health status: Temperature Threshold (log page 0x02)"
        );
        let v = AsyncEvent::from_dw0(0xff00_ab07);
        assert_eq!(v.to_string(), "Vendor specific: info 0xab (log page 0x00)");
        assert_eq!(AsyncEvent::from_dw0(5).type_name(), "Reserved");
        assert_eq!(
            AsyncEvent::from_dw0(0x0001_0000).to_string(),
            "Error status: Write to Invalid Doorbell Register (log page 0x01)"
        );
    }
}

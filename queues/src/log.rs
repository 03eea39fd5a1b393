//! Log page parsers (NVMe Base Specification 2.0, §5.16.1 "Log Page
//! Identifiers": Error Information (01h), SMART / Health Information (02h),
//! Firmware Slot Information (03h)).
//!
//! Parsers never panic: a buffer shorter than the structure is a typed error.

use crate::bytes::{le16, le32, le64, le128, put, put_string, string, u8_at};
use crate::status::Status;
use core::fmt;

/// Errors from log page parsers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogError {
    /// The buffer is shorter than the log page structure.
    Short {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes supplied.
        got: usize,
    },
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LogError::Short { needed, got } => write!(
                f,
                "log page data too short: {got} bytes, the structure is {needed} bytes"
            ),
        }
    }
}

impl std::error::Error for LogError {}

fn need(buf: &[u8], needed: usize) -> Result<(), LogError> {
    if buf.len() < needed {
        Err(LogError::Short {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// SMART / Health Information log page (LID 02h, 512 bytes; Base 2.0 "SMART /
/// Health Information Log Page"). Counters are 128-bit as in the specification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmartLog {
    /// Critical Warning (byte 0): bit 0 spare below threshold, 1 temperature,
    /// 2 reliability degraded, 3 read only, 4 volatile backup failed, 5 PMR read only.
    pub critical_warning: u8,
    /// Composite Temperature in kelvin (bytes 2:1).
    pub temperature_kelvin: u16,
    /// Available Spare, percent (byte 3).
    pub avail_spare: u8,
    /// Available Spare Threshold, percent (byte 4).
    pub spare_thresh: u8,
    /// Percentage Used (byte 5; may exceed 100).
    pub percent_used: u8,
    /// Endurance Group Critical Warning Summary (byte 6).
    pub endu_grp_crit_warn: u8,
    /// Data Units Read, thousands of 512-byte units (bytes 47:32).
    pub data_units_read: u128,
    /// Data Units Written, thousands of 512-byte units (bytes 63:48).
    pub data_units_written: u128,
    /// Host Read Commands (bytes 79:64).
    pub host_read_commands: u128,
    /// Host Write Commands (bytes 95:80).
    pub host_write_commands: u128,
    /// Controller Busy Time, minutes (bytes 111:96).
    pub ctrl_busy_time: u128,
    /// Power Cycles (bytes 127:112).
    pub power_cycles: u128,
    /// Power On Hours (bytes 143:128).
    pub power_on_hours: u128,
    /// Unsafe Shutdowns (bytes 159:144).
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors (bytes 175:160).
    pub media_errors: u128,
    /// Number of Error Information Log Entries (bytes 191:176).
    pub num_err_log_entries: u128,
    /// Warning Composite Temperature Time, minutes (bytes 195:192).
    pub warning_temp_time: u32,
    /// Critical Composite Temperature Time, minutes (bytes 199:196).
    pub critical_comp_time: u32,
    /// Temperature Sensor 1..8 in kelvin, 0 = not implemented (bytes 215:200).
    pub temp_sensors: [u16; 8],
    /// Thermal Management Temperature 1 Transition Count (bytes 219:216).
    pub thm_temp1_trans_count: u32,
    /// Thermal Management Temperature 2 Transition Count (bytes 223:220).
    pub thm_temp2_trans_count: u32,
    /// Total Time For Thermal Management Temperature 1, seconds (bytes 227:224).
    pub thm_temp1_total_time: u32,
    /// Total Time For Thermal Management Temperature 2, seconds (bytes 231:228).
    pub thm_temp2_total_time: u32,
}

impl SmartLog {
    /// Size of the log page.
    pub const SIZE: usize = 512;

    /// Parses the 512-byte SMART / Health Information log page.
    pub fn parse(buf: &[u8]) -> Result<Self, LogError> {
        need(buf, Self::SIZE)?;
        let mut temp_sensors = [0u16; 8];
        for (i, t) in temp_sensors.iter_mut().enumerate() {
            *t = le16(buf, 200 + 2 * i);
        }
        Ok(SmartLog {
            critical_warning: u8_at(buf, 0),
            temperature_kelvin: le16(buf, 1),
            avail_spare: u8_at(buf, 3),
            spare_thresh: u8_at(buf, 4),
            percent_used: u8_at(buf, 5),
            endu_grp_crit_warn: u8_at(buf, 6),
            data_units_read: le128(buf, 32),
            data_units_written: le128(buf, 48),
            host_read_commands: le128(buf, 64),
            host_write_commands: le128(buf, 80),
            ctrl_busy_time: le128(buf, 96),
            power_cycles: le128(buf, 112),
            power_on_hours: le128(buf, 128),
            unsafe_shutdowns: le128(buf, 144),
            media_errors: le128(buf, 160),
            num_err_log_entries: le128(buf, 176),
            warning_temp_time: le32(buf, 192),
            critical_comp_time: le32(buf, 196),
            temp_sensors,
            thm_temp1_trans_count: le32(buf, 216),
            thm_temp2_trans_count: le32(buf, 220),
            thm_temp1_total_time: le32(buf, 224),
            thm_temp2_total_time: le32(buf, 228),
        })
    }

    /// Encodes the log page into 512 bytes (used by controller models).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::SIZE];
        b[0] = self.critical_warning;
        put(&mut b, 1, &self.temperature_kelvin.to_le_bytes());
        b[3] = self.avail_spare;
        b[4] = self.spare_thresh;
        b[5] = self.percent_used;
        b[6] = self.endu_grp_crit_warn;
        let counters = [
            self.data_units_read,
            self.data_units_written,
            self.host_read_commands,
            self.host_write_commands,
            self.ctrl_busy_time,
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.num_err_log_entries,
        ];
        for (i, c) in counters.iter().enumerate() {
            put(&mut b, 32 + 16 * i, &c.to_le_bytes());
        }
        put(&mut b, 192, &self.warning_temp_time.to_le_bytes());
        put(&mut b, 196, &self.critical_comp_time.to_le_bytes());
        for (i, t) in self.temp_sensors.iter().enumerate() {
            put(&mut b, 200 + 2 * i, &t.to_le_bytes());
        }
        put(&mut b, 216, &self.thm_temp1_trans_count.to_le_bytes());
        put(&mut b, 220, &self.thm_temp2_trans_count.to_le_bytes());
        put(&mut b, 224, &self.thm_temp1_total_time.to_le_bytes());
        put(&mut b, 228, &self.thm_temp2_total_time.to_le_bytes());
        b
    }

    /// Composite Temperature in degrees Celsius (kelvin − 273).
    pub fn temperature_celsius(&self) -> i32 {
        i32::from(self.temperature_kelvin) - 273
    }
}

/// One Error Information Log Entry (LID 01h, 64 bytes each; Base 2.0 "Error
/// Information Log Entry Data Structure").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorLogEntry {
    /// Error Count, unique and increasing; 0 marks an unused entry (bytes 7:0).
    pub error_count: u64,
    /// Submission Queue ID, FFFFh if not command related (bytes 9:8).
    pub sqid: u16,
    /// Command ID, FFFFh if not command related (bytes 11:10).
    pub cid: u16,
    /// Status Field as in the CQE: bits 15:1 status, bit 0 Phase Tag (bytes 13:12).
    pub status: u16,
    /// Parameter Error Location: byte (bits 7:0) and bit (bits 10:8) of the
    /// command field in error (bytes 15:14).
    pub param_error_location: u16,
    /// LBA of the first failing block (bytes 23:16).
    pub lba: u64,
    /// Namespace (bytes 27:24).
    pub nsid: u32,
    /// Vendor Specific Information Available: log page ID, 0 = none (byte 28).
    pub vs: u8,
    /// Transport Type (byte 29).
    pub trtype: u8,
    /// Command Set Indicator (byte 30).
    pub csi: u8,
    /// Opcode of the failed command (byte 31; defined by NVMe 2.1, reserved
    /// and zero in earlier revisions).
    pub opcode: u8,
    /// Command Specific Information (bytes 39:32).
    pub cmd_specific_info: u64,
    /// Transport Type Specific Information (bytes 41:40).
    pub trtype_specific_info: u16,
    /// Log Page Version (byte 63).
    pub log_page_version: u8,
}

impl ErrorLogEntry {
    /// Size of one entry.
    pub const SIZE: usize = 64;

    /// Parses one 64-byte entry.
    pub fn parse(buf: &[u8]) -> Result<Self, LogError> {
        need(buf, Self::SIZE)?;
        Ok(ErrorLogEntry {
            error_count: le64(buf, 0),
            sqid: le16(buf, 8),
            cid: le16(buf, 10),
            status: le16(buf, 12),
            param_error_location: le16(buf, 14),
            lba: le64(buf, 16),
            nsid: le32(buf, 24),
            vs: u8_at(buf, 28),
            trtype: u8_at(buf, 29),
            csi: u8_at(buf, 30),
            opcode: u8_at(buf, 31),
            cmd_specific_info: le64(buf, 32),
            trtype_specific_info: le16(buf, 40),
            log_page_version: u8_at(buf, 63),
        })
    }

    /// Encodes the entry into 64 bytes (used by controller models).
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        put(&mut b, 0, &self.error_count.to_le_bytes());
        put(&mut b, 8, &self.sqid.to_le_bytes());
        put(&mut b, 10, &self.cid.to_le_bytes());
        put(&mut b, 12, &self.status.to_le_bytes());
        put(&mut b, 14, &self.param_error_location.to_le_bytes());
        put(&mut b, 16, &self.lba.to_le_bytes());
        put(&mut b, 24, &self.nsid.to_le_bytes());
        b[28] = self.vs;
        b[29] = self.trtype;
        b[30] = self.csi;
        b[31] = self.opcode;
        put(&mut b, 32, &self.cmd_specific_info.to_le_bytes());
        put(&mut b, 40, &self.trtype_specific_info.to_le_bytes());
        b[63] = self.log_page_version;
        b
    }

    /// The Status Field without the Phase Tag, decoded.
    pub fn status_field(&self) -> Status {
        Status(self.status >> 1)
    }
}

/// Parses an Error Information log: every complete 64-byte entry whose Error
/// Count is non-zero (zero marks an unused entry), in log order (most recent
/// first). Trailing partial entries are ignored.
pub fn parse_error_log(buf: &[u8]) -> Vec<ErrorLogEntry> {
    buf.chunks_exact(ErrorLogEntry::SIZE)
        .filter_map(|c| ErrorLogEntry::parse(c).ok())
        .filter(|e| e.error_count != 0)
        .collect()
}

/// Firmware Slot Information log page (LID 03h, 512 bytes; Base 2.0
/// "Firmware Slot Information Log Page").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirmwareSlotLog {
    /// AFI, Active Firmware Info (byte 0): bits 2:0 active slot, bits 6:4 slot
    /// activated at the next reset (0 = none).
    pub afi: u8,
    /// FRS1..FRS7, Firmware Revision for Slot 1..7 (8 ASCII bytes each from
    /// byte 8); empty for an unused slot.
    pub frs: [String; 7],
}

impl FirmwareSlotLog {
    /// Size of the log page.
    pub const SIZE: usize = 512;
    /// Bytes actually carrying fields (AFI and FRS1..FRS7).
    pub const USED: usize = 64;

    /// Parses the Firmware Slot Information log page; only the first 64 bytes
    /// are needed.
    pub fn parse(buf: &[u8]) -> Result<Self, LogError> {
        need(buf, Self::USED)?;
        Ok(FirmwareSlotLog {
            afi: u8_at(buf, 0),
            frs: core::array::from_fn(|i| string(buf, 8 + 8 * i, 8)),
        })
    }

    /// Encodes the log page into 512 bytes (used by controller models).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::SIZE];
        b[0] = self.afi;
        for (i, s) in self.frs.iter().enumerate() {
            if !s.is_empty() {
                put_string(&mut b, 8 + 8 * i, 8, s, b' ');
            }
        }
        b
    }

    /// AFI bits 2:0: the slot (1..=7) the running firmware came from.
    pub fn active_slot(&self) -> u8 {
        self.afi & 0x7
    }

    /// AFI bits 6:4: the slot activated at the next reset, 0 if none.
    pub fn next_slot(&self) -> u8 {
        (self.afi >> 4) & 0x7
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_fields_at_spec_offsets() {
        let mut b = vec![0u8; 512];
        b[0] = 0x04; // Critical Warning @0
        b[1..3].copy_from_slice(&310u16.to_le_bytes()); // Composite Temperature @1
        b[3] = 100; // Available Spare @3
        b[4] = 10; // Threshold @4
        b[5] = 3; // Percentage Used @5
        b[32..48].copy_from_slice(&1234u128.to_le_bytes()); // Data Units Read @32
        b[48..64].copy_from_slice(&(u128::MAX - 1).to_le_bytes()); // Written @48
        b[112..128].copy_from_slice(&7u128.to_le_bytes()); // Power Cycles @112
        b[128..144].copy_from_slice(&99u128.to_le_bytes()); // Power On Hours @128
        b[176..192].copy_from_slice(&2u128.to_le_bytes()); // Error Log Entries @176
        b[192..196].copy_from_slice(&5u32.to_le_bytes()); // Warning Temp Time @192
        b[202..204].copy_from_slice(&300u16.to_le_bytes()); // Temp Sensor 2 @202
        let s = SmartLog::parse(&b).unwrap();
        assert_eq!(s.critical_warning, 4);
        assert_eq!(s.temperature_kelvin, 310);
        assert_eq!(s.temperature_celsius(), 37);
        assert_eq!(
            (s.avail_spare, s.spare_thresh, s.percent_used),
            (100, 10, 3)
        );
        assert_eq!(s.data_units_read, 1234);
        assert_eq!(s.data_units_written, u128::MAX - 1);
        assert_eq!(s.power_cycles, 7);
        assert_eq!(s.power_on_hours, 99);
        assert_eq!(s.num_err_log_entries, 2);
        assert_eq!(s.warning_temp_time, 5);
        assert_eq!(s.temp_sensors[1], 300);
        assert_eq!(SmartLog::parse(&s.to_bytes()).unwrap(), s);
        assert_eq!(
            SmartLog::parse(&b[..511]),
            Err(LogError::Short {
                needed: 512,
                got: 511
            })
        );
    }

    #[test]
    fn error_log() {
        let e = ErrorLogEntry {
            error_count: 3,
            sqid: 1,
            cid: 0x0102,
            status: (0x4281 << 1) | 1, // DNR, media, Unrecovered Read Error
            param_error_location: 0xffff,
            lba: 0x1234,
            nsid: 1,
            vs: 0,
            trtype: 0,
            csi: 0,
            opcode: 0x02,
            cmd_specific_info: 9,
            trtype_specific_info: 0,
            log_page_version: 1,
        };
        let mut buf = vec![0u8; 64 * 3 + 10];
        buf[..64].copy_from_slice(&e.to_bytes());
        // Entry 1 unused (error count 0), entry 2 valid, trailing junk ignored.
        let mut e2 = e;
        e2.error_count = 1;
        buf[128..192].copy_from_slice(&e2.to_bytes());
        let v = parse_error_log(&buf);
        assert_eq!(v, vec![e, e2]);
        assert_eq!(v[0].status_field().name(), "Unrecovered Read Error");
        assert!(v[0].status_field().dnr());
        // Offsets: SQID @8, CID @10, status @12, LBA @16, NSID @24.
        assert_eq!(&buf[8..10], &[1, 0]);
        assert_eq!(&buf[10..12], &[2, 1]);
        assert_eq!(&buf[16..18], &[0x34, 0x12]);
        assert_eq!(buf[24], 1);
        assert!(ErrorLogEntry::parse(&buf[..10]).is_err());
        assert!(parse_error_log(&[]).is_empty());
    }

    #[test]
    fn firmware_slots() {
        let mut b = vec![0u8; 512];
        b[0] = 0x21; // active slot 1, next slot 2
        b[8..16].copy_from_slice(b"1.0     "); // FRS1 @8
        b[16..24].copy_from_slice(b"2.0-rc1 "); // FRS2 @16
        let f = FirmwareSlotLog::parse(&b).unwrap();
        assert_eq!(f.active_slot(), 1);
        assert_eq!(f.next_slot(), 2);
        assert_eq!(f.frs[0], "1.0");
        assert_eq!(f.frs[1], "2.0-rc1");
        assert_eq!(f.frs[6], "");
        assert_eq!(FirmwareSlotLog::parse(&f.to_bytes()).unwrap(), f);
        assert!(FirmwareSlotLog::parse(&b[..63]).is_err());
    }
}

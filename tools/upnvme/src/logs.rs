//! `upnvme error-log` and `upnvme fw-log`: the Error Information log
//! (Log Identifier 01h) and the Firmware Slot Information log (Log
//! Identifier 03h) decoded, as nvme-cli's `error-log` / `fw-log` (NVMe Base
//! Specification 2.0, "Error Information Log Entry Data Structure" and
//! "Firmware Slot Information Log Page"). The library parses the pages
//! (`upnvme::queues::log`); this module reads them with Retain Asynchronous
//! Event clear (as `Controller::get_log_page` does: an Error or Firmware
//! Activation event masked for the log is re-armed) and turns them into
//! text or JSON. Pure functions over the parsed structures, so a page of
//! garbage decodes (into garbage) without panicking.

use anyhow::Result;
use serde_json::{Value, json};
use upnvme::queues::{ErrorLogEntry, FirmwareSlotLog, log_id};

use crate::DeviceArgs;
use crate::rw::number;

/// The flags of `upnvme error-log`.
#[derive(clap::Args, Debug)]
pub struct ErrorLogArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Entries to read, 1 to 256 (default: all the controller keeps,
    /// Identify Controller ELPE + 1; more than that are not read).
    #[arg(short = 'e', long = "log-entries", value_parser = log_entries)]
    entries: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The flags of `upnvme fw-log`.
#[derive(clap::Args, Debug)]
pub struct FwLogArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `--log-entries`: 1 to 256 (ELPE is a byte, 0's based), decimal or
/// 0x-prefixed hex.
fn log_entries(s: &str) -> std::result::Result<usize, String> {
    let n = number::<usize>(s)?;
    if (1..=256).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n}: a controller keeps 1 to 256 entries (Identify Controller ELPE + 1)"
        ))
    }
}

/// How many entries one Get Log Page reads: `asked` (default: all
/// ELPE + 1), at most ELPE + 1 and at most what one transfer moves
/// (`max_transfer` bytes; the most recent entries come first).
fn entries_to_read(asked: Option<usize>, elpe: u8, max_transfer: usize) -> usize {
    let keeps = usize::from(elpe) + 1;
    asked
        .unwrap_or(keeps)
        .min(keeps)
        .min(max_transfer / ErrorLogEntry::SIZE)
        .max(1)
}

/// The entries of an Error Information log in use, each with its position
/// in the page: an Error Count of 0h marks an entry that is not valid
/// (Base 2.0, "Error Count"), so it is skipped, as nvme-cli skips empty
/// entries. A partial entry at the end is ignored.
fn entries_in_use(page: &[u8]) -> Vec<(usize, ErrorLogEntry)> {
    page.chunks_exact(ErrorLogEntry::SIZE)
        .enumerate()
        .filter_map(|(i, c)| ErrorLogEntry::parse(c).ok().map(|e| (i, e)))
        .filter(|(_, e)| e.error_count != 0)
        .collect()
}

/// Runs `upnvme error-log`.
pub fn error_log(a: &ErrorLogArgs) -> Result<()> {
    let c = a.dev.open()?;
    let elpe = c.identify().elpe;
    let device = c.device_name().to_string();
    let n = entries_to_read(
        a.entries,
        elpe,
        c.max_transfer_bytes().unwrap_or(usize::MAX),
    );
    // Retain Asynchronous Event clear, as the library's error_log.
    let r = c.get_log_page(log_id::ERROR_INFO, 0xffff_ffff, n * ErrorLogEntry::SIZE, 0);
    let closed = c.close();
    let page = r?;
    let log = ErrorLog {
        device,
        elpe,
        read: n,
        entries: entries_in_use(&page),
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&log.json())?);
    } else {
        out!("{}", log.text());
    }
    Ok(closed?)
}

/// What `error-log` shows.
struct ErrorLog {
    device: String,
    /// Identify Controller ELPE (Error Log Page Entries, 0's based).
    elpe: u8,
    /// Entries read.
    read: usize,
    /// The entries in use, with their positions.
    entries: Vec<(usize, ErrorLogEntry)>,
}

/// Parameter Error Location (bytes 15:14) in words: bits 7:0 the byte of
/// the command, bits 10:8 the bit within it; FFFFh when the error is not
/// specific to a field of the command.
fn parameter_error_location(pel: u16) -> (Option<(u8, u8)>, String) {
    if pel == 0xffff {
        return (None, "not specific to a command field".into());
    }
    let byte = (pel & 0xff) as u8;
    let bit = ((pel >> 8) & 0x7) as u8;
    let mut s = format!("byte {byte}, bit {bit}");
    if pel & 0xf800 != 0 {
        s.push_str(&format!(", reserved bits {:#06x}", pel & 0xf800));
    }
    (Some((byte, bit)), s)
}

/// Transport Type (byte 29; the TRTYPE values of the Discovery Log Page
/// Entry, NVMe over Fabrics): 0h when the error is not transport related.
fn transport_type(t: u8) -> &'static str {
    match t {
        0x00 => "not transport related",
        0x01 => "RDMA Transport",
        0x02 => "Fibre Channel Transport",
        0x03 => "TCP Transport",
        0xfe => "Intra-host Transport",
        _ => "reserved",
    }
}

/// Vendor Specific Information Available (byte 28): 0h none, else the log
/// page that holds it.
fn vendor_specific(vs: u8) -> String {
    if vs == 0 {
        "none".into()
    } else {
        format!("in log page 0x{vs:02x}")
    }
}

/// A Submission Queue ID or Command ID: FFFFh when the error is not
/// associated with a command.
fn id_or_not_command(v: u16, hex: bool) -> String {
    match (v, hex) {
        (0xffff, _) => "0xffff (not associated with a command)".into(),
        (v, true) => format!("0x{v:04x}"),
        (v, false) => v.to_string(),
    }
}

/// The Status Field (bytes 13:12, bits 15:1; bit 0 the Phase Tag) in
/// words: its name, SCT, SC, CRD, More and DNR.
fn status_words(e: &ErrorLogEntry) -> String {
    let s = e.status_field();
    format!(
        "0x{:04x}: {} (SCT 0x{:x} {}, SC 0x{:02x}, CRD {}, More {}, DNR {})",
        s.0,
        s.name(),
        s.sct(),
        s.sct_name(),
        s.sc(),
        s.crd(),
        u8::from(s.more()),
        u8::from(s.dnr())
    )
}

impl ErrorLog {
    fn header(&self) -> String {
        format!(
            "Error Information log of {}: {} entries read (Identify Controller ELPE {}: the \
             controller keeps {}), {} in use",
            self.device,
            self.read,
            self.elpe,
            usize::from(self.elpe) + 1,
            self.entries.len()
        )
    }

    /// The text: a header line, then each entry in use, one field a line.
    fn text(&self) -> String {
        let mut t = format!("{}\n", self.header());
        for (i, e) in &self.entries {
            t.push_str(&format!("Entry[{i:2}]\n"));
            let mut line =
                |name: &str, value: String| t.push_str(&format!("  {name:<20}: {value}\n"));
            line("error_count", e.error_count.to_string());
            line("sqid", id_or_not_command(e.sqid, false));
            line("cmdid", id_or_not_command(e.cid, true));
            line("status_field", status_words(e));
            line("phase_tag", (e.status & 1).to_string());
            let (_, pel) = parameter_error_location(e.param_error_location);
            line(
                "parm_error_location",
                format!("0x{:04x} ({pel})", e.param_error_location),
            );
            line("lba", e.lba.to_string());
            line("nsid", format!("0x{:x}", e.nsid));
            line("vs", format!("0x{:02x} ({})", e.vs, vendor_specific(e.vs)));
            line(
                "trtype",
                format!("0x{:02x} ({})", e.trtype, transport_type(e.trtype)),
            );
            line("csi", e.csi.to_string());
            line("opcode", format!("0x{:02x}", e.opcode));
            line("cs", format!("0x{:016x}", e.cmd_specific_info));
            line(
                "trtype_spec_info",
                format!("0x{:04x}", e.trtype_specific_info),
            );
            line("log_page_version", e.log_page_version.to_string());
        }
        t
    }

    /// The JSON document (keys in docs/setup.md, "Troubleshooting the
    /// device").
    fn json(&self) -> Value {
        let entries: Vec<Value> = self
            .entries
            .iter()
            .map(|(i, e)| {
                let s = e.status_field();
                let (at, _) = parameter_error_location(e.param_error_location);
                json!({
                    "index": i,
                    "error_count": e.error_count,
                    "sqid": e.sqid,
                    "cmdid": e.cid,
                    "status_field": s.0,
                    "phase_tag": e.status & 1,
                    "status": {
                        "name": s.name(),
                        "sct": s.sct(),
                        "sct_name": s.sct_name(),
                        "sc": s.sc(),
                        "crd": s.crd(),
                        "more": s.more(),
                        "dnr": s.dnr(),
                    },
                    "parm_error_location": e.param_error_location,
                    "parm_error_byte": at.map(|(byte, _)| byte),
                    "parm_error_bit": at.map(|(_, bit)| bit),
                    "lba": e.lba,
                    "nsid": e.nsid,
                    "vs": e.vs,
                    "trtype": e.trtype,
                    "trtype_name": transport_type(e.trtype),
                    "csi": e.csi,
                    "opcode": e.opcode,
                    "cs": e.cmd_specific_info,
                    "trtype_spec_info": e.trtype_specific_info,
                    "log_page_version": e.log_page_version,
                })
            })
            .collect();
        json!({
            "device": self.device,
            "elpe": self.elpe,
            "entries_read": self.read,
            "entries": entries,
        })
    }
}

/// Runs `upnvme fw-log`.
pub fn fw_log(a: &FwLogArgs) -> Result<()> {
    let c = a.dev.open()?;
    let id = c.identify();
    let (frmw, fr) = (id.frmw, id.fr.clone());
    let device = c.device_name().to_string();
    // Retain Asynchronous Event clear (a masked Firmware Activation
    // Starting notice is re-armed), as the library's firmware_slot_log.
    let r = c.firmware_slot_log();
    let closed = c.close();
    let log = FwLog {
        device,
        log: r?,
        frmw,
        fr,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&log.json())?);
    } else {
        out!("{}", log.text());
    }
    Ok(closed?)
}

/// What `fw-log` shows.
struct FwLog {
    device: String,
    log: FirmwareSlotLog,
    /// Identify Controller FRMW (Firmware Updates, byte 260).
    frmw: u8,
    /// Identify Controller FR (Firmware Revision, bytes 71:64).
    fr: String,
}

impl FwLog {
    /// The slots with a revision: (slot number, revision).
    fn slots(&self) -> Vec<(u8, &str)> {
        (1u8..)
            .zip(self.log.frs.iter())
            .filter(|(_, r)| !r.is_empty())
            .map(|(n, r)| (n, r.as_str()))
            .collect()
    }

    /// AFI (byte 0) in words: bits 2:0 the active slot, bits 6:4 the slot
    /// activated at the next reset (0h: none).
    fn afi_words(&self) -> String {
        let next = match self.log.next_slot() {
            0 => "none".to_string(),
            n => format!("slot {n}"),
        };
        let mut s = format!("active slot {}, next reset: {next}", self.log.active_slot());
        if self.log.afi & 0x88 != 0 {
            s.push_str(&format!(", reserved bits {:#04x}", self.log.afi & 0x88));
        }
        s
    }

    /// FRMW in words: bit 0 the first slot is read only, bits 3:1 the
    /// number of slots, bit 4 activation without reset.
    fn frmw_words(&self) -> String {
        let f = self.frmw;
        format!(
            "slot 1 read-only: {}, {} slots, activation without reset: {}",
            if f & 1 != 0 { "yes" } else { "no" },
            (f >> 1) & 0x7,
            if f & 0x10 != 0 { "yes" } else { "no" }
        )
    }

    fn text(&self) -> String {
        let mut t = format!("Firmware Slot Information log of {}\n", self.device);
        let mut line = |name: &str, value: String| t.push_str(&format!("  {name:<6}: {value}\n"));
        line(
            "afi",
            format!("0x{:02x} ({})", self.log.afi, self.afi_words()),
        );
        for (n, r) in self.slots() {
            let mut v = r.to_string();
            if n == self.log.active_slot() {
                v.push_str(" (active)");
            }
            if n == self.log.next_slot() {
                v.push_str(" (next reset)");
            }
            line(&format!("frs{n}"), v);
        }
        line(
            "frmw",
            format!("0x{:02x} ({})", self.frmw, self.frmw_words()),
        );
        line("fr", self.fr.clone());
        t
    }

    /// The JSON document (keys in docs/setup.md, "Troubleshooting the
    /// device").
    fn json(&self) -> Value {
        let next = self.log.next_slot();
        json!({
            "device": self.device,
            "afi": self.log.afi,
            "active_slot": self.log.active_slot(),
            "next_reset_slot": (next != 0).then_some(next),
            "slots": self.slots().iter().map(|(n, r)| json!({"slot": n, "revision": r})).collect::<Vec<_>>(),
            "frmw": self.frmw,
            "first_slot_read_only": self.frmw & 1 != 0,
            "number_of_slots": (self.frmw >> 1) & 0x7,
            "activation_without_reset": self.frmw & 0x10 != 0,
            "fr": self.fr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// An Error Information log page of `n` entries built byte by byte at
    /// the specification's offsets (not through the library's encoder).
    fn error_page(n: usize) -> Vec<u8> {
        vec![0u8; n * 64]
    }

    /// Writes one entry at position `i` with every field set.
    fn put_entry(page: &mut [u8], i: usize) {
        let e = &mut page[i * 64..(i + 1) * 64];
        e[0..8].copy_from_slice(&0x1_0000_0002u64.to_le_bytes()); // Error Count
        e[8..10].copy_from_slice(&3u16.to_le_bytes()); // Submission Queue ID
        e[10..12].copy_from_slice(&0xabcdu16.to_le_bytes()); // Command ID
        // Status Field: DNR (bit 14), More (13), CRD 2 (12:11), SCT 2
        // Media (10:8), SC 81h Unrecovered Read Error; shifted past the
        // Phase Tag (bit 0, set).
        let status: u16 = (1 << 14) | (1 << 13) | (2 << 11) | (2 << 8) | 0x81;
        e[12..14].copy_from_slice(&((status << 1) | 1).to_le_bytes());
        // Parameter Error Location: byte 40 (bits 7:0), bit 5 (10:8).
        e[14..16].copy_from_slice(&((5u16 << 8) | 40).to_le_bytes());
        e[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // LBA
        e[24..28].copy_from_slice(&0xffff_fffeu32.to_le_bytes()); // Namespace
        e[28] = 0xc1; // Vendor Specific Information Available
        e[29] = 0x03; // Transport Type: TCP
        e[30] = 0x02; // Command Set Indicator
        e[31] = 0x02; // Opcode (NVMe 2.1)
        e[32..40].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes()); // CS
        e[40..42].copy_from_slice(&0xbeefu16.to_le_bytes()); // TTSI
        e[63] = 1; // Log Page Version
    }

    fn log(page: &[u8]) -> ErrorLog {
        ErrorLog {
            device: "0000:00:04.0".into(),
            elpe: 3,
            read: page.len() / 64,
            entries: entries_in_use(page),
        }
    }

    #[test]
    fn every_error_log_field_is_decoded_from_its_offset() {
        let mut page = error_page(4);
        put_entry(&mut page, 2);
        let l = log(&page);
        assert_eq!(l.entries.len(), 1);
        assert_eq!(l.entries[0].0, 2, "its position in the page");
        let t = l.text();
        for want in [
            "Error Information log of 0000:00:04.0: 4 entries read (Identify Controller ELPE 3: \
             the controller keeps 4), 1 in use",
            "Entry[ 2]",
            "  error_count         : 4294967298",
            "  sqid                : 3",
            "  cmdid               : 0xabcd",
            "  status_field        : 0x7281: Unrecovered Read Error (SCT 0x2 Media and Data \
             Integrity Errors, SC 0x81, CRD 2, More 1, DNR 1)",
            "  phase_tag           : 1",
            "  parm_error_location : 0x0528 (byte 40, bit 5)",
            "  lba                 : 18446744073709551615",
            "  nsid                : 0xfffffffe",
            "  vs                  : 0xc1 (in log page 0xc1)",
            "  trtype              : 0x03 (TCP Transport)",
            "  csi                 : 2",
            "  opcode              : 0x02",
            "  cs                  : 0x0102030405060708",
            "  trtype_spec_info    : 0xbeef",
            "  log_page_version    : 1",
        ] {
            assert!(t.lines().any(|l| l == want), "{want:?} missing from\n{t}");
        }
        let j = l.json();
        assert_eq!(j["device"], "0000:00:04.0");
        assert_eq!(j["elpe"], 3);
        assert_eq!(j["entries_read"], 4);
        let e = &j["entries"][0];
        assert_eq!(e["index"], 2);
        assert_eq!(e["error_count"], 0x1_0000_0002u64);
        assert_eq!(e["sqid"], 3);
        assert_eq!(e["cmdid"], 0xabcd);
        assert_eq!(e["status_field"], 0x7281);
        assert_eq!(e["phase_tag"], 1);
        assert_eq!(e["status"]["name"], "Unrecovered Read Error");
        assert_eq!(e["status"]["sct"], 2);
        assert_eq!(e["status"]["sc"], 0x81);
        assert_eq!(e["status"]["crd"], 2);
        assert_eq!(e["status"]["more"], true);
        assert_eq!(e["status"]["dnr"], true);
        assert_eq!(e["parm_error_location"], 0x0528);
        assert_eq!(e["parm_error_byte"], 40);
        assert_eq!(e["parm_error_bit"], 5);
        assert_eq!(e["lba"], u64::MAX);
        assert_eq!(e["nsid"], 0xffff_fffeu32);
        assert_eq!(e["vs"], 0xc1);
        assert_eq!(e["trtype"], 3);
        assert_eq!(e["trtype_name"], "TCP Transport");
        assert_eq!(e["csi"], 2);
        assert_eq!(e["opcode"], 2);
        assert_eq!(e["cs"], 0x0102_0304_0506_0708u64);
        assert_eq!(e["trtype_spec_info"], 0xbeef);
        assert_eq!(e["log_page_version"], 1);
    }

    /// Edge values: FFFFh identifiers and location, a zero status with the
    /// phase tag clear, nothing vendor specific, not transport related.
    #[test]
    fn error_log_edge_values() {
        let mut page = error_page(1);
        page[0] = 1; // Error Count 1
        page[8..16].fill(0xff); // SQID, CID, Status Field, PEL all FFFFh
        let t = log(&page).text();
        for want in [
            "  sqid                : 0xffff (not associated with a command)",
            "  cmdid               : 0xffff (not associated with a command)",
            "  status_field        : 0x7fff: Vendor Specific (SCT 0x7 Vendor Specific, SC 0xff, \
             CRD 3, More 1, DNR 1)",
            "  phase_tag           : 1",
            "  parm_error_location : 0xffff (not specific to a command field)",
            "  vs                  : 0x00 (none)",
            "  trtype              : 0x00 (not transport related)",
        ] {
            assert!(t.lines().any(|l| l == want), "{want:?} missing from\n{t}");
        }
        let j = log(&page).json();
        assert_eq!(j["entries"][0]["parm_error_byte"], Value::Null);
        assert_eq!(j["entries"][0]["parm_error_bit"], Value::Null);
        // Reserved location bits are said, not dropped.
        assert_eq!(
            parameter_error_location(0x8012).1,
            "byte 18, bit 0, reserved bits 0x8000"
        );
        assert_eq!(transport_type(0xfe), "Intra-host Transport");
        assert_eq!(transport_type(0x04), "reserved");
    }

    /// Entries whose Error Count is 0 are not shown, wherever they are; an
    /// empty log shows the header only; garbage decodes without a panic.
    #[test]
    fn unused_entries_are_skipped_and_garbage_decodes() {
        let empty = log(&error_page(4));
        assert!(empty.entries.is_empty());
        assert_eq!(empty.text().lines().count(), 1, "{}", empty.text());
        assert!(empty.text().ends_with(", 0 in use\n"));
        assert_eq!(empty.json()["entries"], serde_json::json!([]));

        let mut page = error_page(3);
        put_entry(&mut page, 0);
        put_entry(&mut page, 2);
        // Entry 1: fields set but Error Count 0: not valid.
        page[64 + 8] = 9;
        let l = log(&page);
        assert_eq!(
            l.entries.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 2]
        );
        // A partial entry at the end is ignored.
        page.extend_from_slice(&[0xff; 63]);
        assert_eq!(entries_in_use(&page).len(), 2);

        let garbage: Vec<u8> = (0..64 * 5 + 7).map(|i| (i * 37 + 11) as u8).collect();
        let l = log(&garbage);
        assert_eq!(l.entries.len(), 5);
        let _ = (l.text(), l.json());
    }

    #[test]
    fn entries_read_default_to_elpe_plus_one_within_the_transfer_limit() {
        assert_eq!(entries_to_read(None, 3, 1 << 20), 4);
        assert_eq!(entries_to_read(Some(2), 3, 1 << 20), 2);
        assert_eq!(entries_to_read(Some(64), 3, 1 << 20), 4);
        assert_eq!(entries_to_read(None, 255, 1 << 20), 256);
        // 8 KiB per transfer: 128 entries.
        assert_eq!(entries_to_read(None, 255, 8192), 128);
        assert_eq!(entries_to_read(None, 0, 0), 1);
    }

    #[test]
    fn firmware_slot_log_fields() {
        let mut b = vec![0u8; 512];
        b[0] = 0x32; // AFI: active slot 2 (2:0), next reset slot 3 (6:4)
        b[8..16].copy_from_slice(b"1.0     "); // FRS1 @8
        b[16..24].copy_from_slice(b"2.0-rc1 "); // FRS2 @16
        b[56..64].copy_from_slice(b"ZZZZZZZZ"); // FRS7 @56, all 8 bytes
        let f = FwLog {
            device: "0000:00:04.0".into(),
            log: FirmwareSlotLog::parse(&b).unwrap(),
            // FRMW: slot 1 read only, 7 slots, activation without reset.
            frmw: 0x1f,
            fr: "2.0-rc1".into(),
        };
        let t = f.text();
        for want in [
            "Firmware Slot Information log of 0000:00:04.0",
            "  afi   : 0x32 (active slot 2, next reset: slot 3)",
            "  frs1  : 1.0",
            "  frs2  : 2.0-rc1 (active)",
            "  frs7  : ZZZZZZZZ",
            "  frmw  : 0x1f (slot 1 read-only: yes, 7 slots, activation without reset: yes)",
            "  fr    : 2.0-rc1",
        ] {
            assert!(t.lines().any(|l| l == want), "{want:?} missing from\n{t}");
        }
        // Empty slots are omitted.
        for slot in 3..=6 {
            assert!(!t.contains(&format!("frs{slot}")), "{t}");
        }
        let j = f.json();
        assert_eq!(j["afi"], 0x32);
        assert_eq!(j["active_slot"], 2);
        assert_eq!(j["next_reset_slot"], 3);
        assert_eq!(
            j["slots"],
            serde_json::json!([
                {"slot": 1, "revision": "1.0"},
                {"slot": 2, "revision": "2.0-rc1"},
                {"slot": 7, "revision": "ZZZZZZZZ"},
            ])
        );
        assert_eq!(j["frmw"], 0x1f);
        assert_eq!(j["first_slot_read_only"], true);
        assert_eq!(j["number_of_slots"], 7);
        assert_eq!(j["activation_without_reset"], true);
        assert_eq!(j["fr"], "2.0-rc1");
    }

    #[test]
    fn firmware_slot_log_edge_values() {
        // No next-reset slot, reserved AFI bits, slot 1 writable, one slot;
        // the active slot is also marked when it is the next-reset one.
        let mut b = vec![0u8; 64];
        b[0] = 0x88 | 0x01;
        b[8..16].copy_from_slice(b"QEMU 1.0");
        let f = FwLog {
            device: "d".into(),
            log: FirmwareSlotLog::parse(&b).unwrap(),
            frmw: 0x02,
            fr: "QEMU 1.0".into(),
        };
        let t = f.text();
        assert!(
            t.contains("  afi   : 0x89 (active slot 1, next reset: none, reserved bits 0x88)\n"),
            "{t}"
        );
        assert!(t.contains("  frs1  : QEMU 1.0 (active)\n"), "{t}");
        assert!(
            t.contains(
                "  frmw  : 0x02 (slot 1 read-only: no, 1 slots, activation without reset: no)\n"
            ),
            "{t}"
        );
        assert_eq!(f.json()["next_reset_slot"], Value::Null);
        b[0] = 0x11;
        let f = FwLog {
            log: FirmwareSlotLog::parse(&b).unwrap(),
            ..f
        };
        assert!(
            f.text()
                .contains("  frs1  : QEMU 1.0 (active) (next reset)\n")
        );
        // Garbage: every byte set, non-ASCII revisions; no panic.
        let g = FwLog {
            log: FirmwareSlotLog::parse(&[0xff; 512]).unwrap(),
            ..f
        };
        assert_eq!(g.json()["active_slot"], 7);
        assert_eq!(g.json()["slots"].as_array().unwrap().len(), 7);
        let _ = g.text();
    }

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        c: C,
    }

    #[derive(clap::Subcommand)]
    enum C {
        ErrorLog(ErrorLogArgs),
        FwLog(FwLogArgs),
    }

    #[test]
    fn flags_parse() {
        let C::ErrorLog(a) = Cli::try_parse_from(["t", "error-log", "-e", "0x10", "--json"])
            .unwrap()
            .c
        else {
            panic!()
        };
        assert_eq!(a.entries, Some(16));
        assert!(a.json);
        let C::ErrorLog(a) = Cli::try_parse_from(["t", "error-log", "--log-entries", "256"])
            .unwrap()
            .c
        else {
            panic!()
        };
        assert_eq!((a.entries, a.json), (Some(256), false));
        let C::ErrorLog(a) = Cli::try_parse_from(["t", "error-log", "-d", "00:04.0"])
            .unwrap()
            .c
        else {
            panic!()
        };
        assert_eq!(a.entries, None);
        assert_eq!(a.dev.device.as_deref(), Some("0000:00:04.0"));
        for bad in ["0", "257", "-1", "x"] {
            let e = Cli::try_parse_from(["t", "error-log", "-e", bad]).err();
            assert_eq!(e.map(|e| e.exit_code()), Some(2), "-e {bad}");
        }
        let C::FwLog(a) = Cli::try_parse_from(["t", "fw-log", "--json"]).unwrap().c else {
            panic!()
        };
        assert!(a.json);
        assert!(Cli::try_parse_from(["t", "fw-log", "-e", "1"]).is_err());
    }
}

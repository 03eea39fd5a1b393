//! Get Log Page (NVMe Base Specification 2.0, §5.16) and the log pages the
//! model keeps: Error Information (01h), SMART / Health Information
//! (02h), Firmware Slot Information (03h), Changed Namespace List (04h).

use std::collections::VecDeque;

use super::command::Command;
use super::config::NamespaceConfig;
use super::engine::Outcome;
use super::state::State;
use super::status::Status;
use super::storage::Namespace;

/// LID 01h, Error Information.
const LID_ERROR_INFO: u8 = 0x01;
/// LID 02h, SMART / Health Information.
const LID_SMART: u8 = 0x02;
/// LID 03h, Firmware Slot Information.
const LID_FIRMWARE_SLOT: u8 = 0x03;
/// LID 04h, Changed Namespace List.
const LID_CHANGED_NS_LIST: u8 = 0x04;
/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices.
const AEC_NS_ATTRIBUTE_NOTICES: u32 = 1 << 8;
/// Error Information entries kept: Identify Controller ELPE + 1.
const ERROR_ENTRIES: usize = 4;
/// Composite temperature reported, in kelvins (QEMU's default).
const COMPOSITE_TEMPERATURE: u16 = 0x0143;

/// SMART / Health counters the model maintains.
#[derive(Clone, Debug, Default)]
pub(crate) struct Health {
    /// Critical Warning (byte 0).
    pub critical_warning: u8,
    /// 512-byte units read by Read commands.
    pub units_read: u128,
    /// 512-byte units written by Write commands.
    pub units_written: u128,
    /// Host Read Commands: Read and Compare.
    pub host_reads: u128,
    /// Host Write Commands: Write.
    pub host_writes: u128,
    /// Power Cycles: counted at every CC.EN 0→1.
    pub power_cycles: u128,
    /// Unsafe Shutdowns: CC.EN 1→0 without a shutdown notification first.
    pub unsafe_shutdowns: u128,
}

impl Health {
    /// The 512-byte SMART / Health Information log page.
    fn page(&self, error_entries: u64) -> Vec<u8> {
        let mut p = vec![0u8; 512];
        let put = |p: &mut Vec<u8>, off: usize, v: &[u8]| {
            if let Some(d) = p.get_mut(off..off + v.len()) {
                d.copy_from_slice(v);
            }
        };
        put(&mut p, 0, &[self.critical_warning]);
        put(&mut p, 1, &COMPOSITE_TEMPERATURE.to_le_bytes());
        put(&mut p, 3, &[100, 10, 0]); // Available Spare, threshold, Percentage Used
        // Data Units are thousands of 512-byte units, rounded up.
        put(&mut p, 32, &self.units_read.div_ceil(1000).to_le_bytes());
        put(&mut p, 48, &self.units_written.div_ceil(1000).to_le_bytes());
        put(&mut p, 64, &self.host_reads.to_le_bytes());
        put(&mut p, 80, &self.host_writes.to_le_bytes());
        put(&mut p, 112, &self.power_cycles.to_le_bytes());
        put(&mut p, 144, &self.unsafe_shutdowns.to_le_bytes());
        put(&mut p, 176, &u128::from(error_entries).to_le_bytes());
        p
    }
}

/// The Error Information log: newest entry first.
#[derive(Clone, Debug, Default)]
pub(crate) struct ErrorLog {
    /// Error Count of the newest entry (total errors recorded).
    pub count: u64,
    entries: VecDeque<[u8; 64]>,
}

impl ErrorLog {
    /// Records a command that completed with an error (Error Information Log Entry).
    pub fn record(&mut self, sqid: u16, cid: u16, status: Status, nsid: u32) {
        self.count += 1;
        let mut e = [0u8; 64];
        e[0..8].copy_from_slice(&self.count.to_le_bytes());
        e[8..10].copy_from_slice(&sqid.to_le_bytes());
        e[10..12].copy_from_slice(&cid.to_le_bytes());
        // Status Field (bits 15:1) and Phase Tag (bit 0, 0 here).
        e[12..14].copy_from_slice(&(status.0 << 1).to_le_bytes());
        e[14..16].copy_from_slice(&0xffffu16.to_le_bytes()); // Parameter Error Location: n/a
        e[24..28].copy_from_slice(&nsid.to_le_bytes());
        self.entries.push_front(e);
        self.entries.truncate(ERROR_ENTRIES);
    }

    fn page(&self) -> Vec<u8> {
        let mut p = vec![0u8; 64 * ERROR_ENTRIES];
        for (dst, e) in p.chunks_exact_mut(64).zip(&self.entries) {
            dst.copy_from_slice(e);
        }
        p
    }
}

impl State {
    /// Firmware Slot Information: slot 1 active, FRS1 = FR.
    fn firmware_slot_page(&self) -> Vec<u8> {
        let mut p = vec![0u8; 512];
        p[0] = 0x01; // AFI: slot 1 active
        let mut frs = [b' '; 8];
        for (d, b) in frs.iter_mut().zip(self.cfg.firmware.bytes()) {
            *d = b;
        }
        p[8..16].copy_from_slice(&frs);
        p
    }

    /// Changed Namespace List: up to 1024 NSIDs, zero-filled after; the
    /// first entry FFFFFFFFh when more changed.
    fn changed_ns_page(&self) -> Vec<u8> {
        let mut p = vec![0u8; 4096];
        if self.changed_overflow {
            p[..4].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        } else {
            for (dst, id) in p.chunks_exact_mut(4).zip(&self.changed_nsids) {
                dst.copy_from_slice(&id.to_le_bytes());
            }
        }
        p
    }

    /// Someone else changes namespace `nsid` ([`super::ModelController::change_namespace`]).
    pub(crate) fn change_namespace(&mut self, nsid: u32, cfg: Option<NamespaceConfig>) {
        self.change_namespace_with(nsid, cfg, true, true);
    }

    /// [`State::change_namespace`], listed in log 04h only when `listed`
    /// and with a notice only when `notice`
    /// ([`super::ModelController::change_namespace_unannounced`]).
    pub(crate) fn change_namespace_with(
        &mut self,
        nsid: u32,
        cfg: Option<NamespaceConfig>,
        listed: bool,
        notice: bool,
    ) {
        match (self.namespace(nsid), cfg) {
            (Some(i), Some(cfg)) => {
                self.namespaces[i].format(NamespaceConfig { nsid, ..cfg });
                self.identify_overrides.remove(&(0, nsid));
            }
            (None, Some(cfg)) => {
                let at = self.namespaces.partition_point(|n| n.cfg.nsid < nsid);
                self.namespaces
                    .insert(at, Namespace::new(NamespaceConfig { nsid, ..cfg }));
            }
            (Some(i), None) => {
                self.namespaces.remove(i);
            }
            (None, None) => {}
        }
        if listed {
            self.list_changed_namespace(nsid);
        }
        if notice {
            self.notice_namespace_change();
        }
    }

    /// Lists `nsid` in the Changed Namespace List (log 04h), once; the
    /// 1025th NSID overflows it. (With [`State::notice_namespace_change`]:
    /// namespace `nsid` changed — another host formatted, resized, attached
    /// or detached it.)
    pub(crate) fn list_changed_namespace(&mut self, nsid: u32) {
        if !self.changed_nsids.contains(&nsid) {
            if self.changed_nsids.len() == 1024 {
                self.changed_overflow = true;
            } else {
                self.changed_nsids.push(nsid);
            }
        }
    }

    /// Raises a Notice / Namespace Attribute Changed event if the host
    /// enabled them (Asynchronous Event Configuration bit 8) and has read
    /// log 04h since the last one.
    pub(crate) fn notice_namespace_change(&mut self) {
        if self.features.aec & AEC_NS_ATTRIBUTE_NOTICES != 0 && !self.ns_notice_masked {
            self.ns_notice_masked = true;
            // Notice (2h), Namespace Attribute Changed (00h), log 04h.
            self.async_event(2 | 0x04 << 16);
        }
    }

    /// Get Log Page (§5.16): CDW10 LID (7:0), NUMDL (31:16); CDW11 NUMDU
    /// (15:0); CDW12/13 LPOL/LPOU, a dword-aligned byte offset. Bytes past
    /// the end of the page are not transferred (as QEMU); an offset past it
    /// is Invalid Field in Command.
    pub(crate) fn get_log_page(&mut self, cmd: &Command) -> Outcome {
        let (cdw10, cdw11) = (cmd.cdw(10), cmd.cdw(11));
        let lid = (cdw10 & 0xff) as u8;
        let numd = u64::from(cdw10 >> 16) | u64::from(cdw11 & 0xffff) << 16;
        let len = ((numd + 1) * 4) as usize;
        // As QEMU (`nvme_check_mdts`): a transfer above MDTS is refused.
        if let Some(max) = self.mdts_bytes().filter(|&max| len > max) {
            self.violation(format!(
                "Get Log Page {lid:#04x} CID {:#06x}: {len} bytes above MDTS ({max} bytes)",
                cmd.cid()
            ));
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        let offset = u64::from(cmd.cdw(12)) | u64::from(cmd.cdw(13)) << 32;
        let nsid = cmd.nsid();
        let page = match lid {
            LID_ERROR_INFO => self.errors.page(),
            LID_SMART => {
                // LPA bit 0 clear: only the controller-wide page exists.
                if nsid != 0 && nsid != 0xffff_ffff {
                    return Outcome::err(Status::INVALID_FIELD.with_dnr());
                }
                self.health.page(self.errors.count)
            }
            LID_FIRMWARE_SLOT => self.firmware_slot_page(),
            LID_CHANGED_NS_LIST => {
                let page = self.changed_ns_page();
                // RAE (CDW10 bit 15) clear: the list is cleared and the
                // notice re-armed.
                if cdw10 & (1 << 15) == 0 {
                    self.changed_nsids.clear();
                    self.changed_overflow = false;
                    self.ns_notice_masked = false;
                }
                page
            }
            _ => return Outcome::err(Status::INVALID_LOG_PAGE.with_dnr()),
        };
        if offset % 4 != 0 || offset >= page.len() as u64 {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        let start = offset as usize;
        let end = page.len().min(start.saturating_add(len));
        let data = page.get(start..end).unwrap_or_default();
        match self.write_host_data(cmd, data, len) {
            Ok(()) => {
                // RAE clear: the event type this log reports is unmasked.
                if cdw10 & (1 << 15) == 0 {
                    // Notice (2h): Namespace Attribute Changed names log
                    // 04h, Firmware Activation Starting log 03h.
                    let unmask = match lid {
                        LID_ERROR_INFO => 1 << 0,
                        LID_SMART => 1 << 1,
                        LID_FIRMWARE_SLOT | LID_CHANGED_NS_LIST => 1 << 2,
                        _ => 0,
                    };
                    if self.aer_masked & unmask != 0 {
                        self.aer_masked &= !unmask;
                        self.process_aers();
                    }
                }
                Outcome::ok(0)
            }
            Err(s) => Outcome::err(s),
        }
    }
}

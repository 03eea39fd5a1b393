//! Identify (NVMe Base Specification 2.0, §5.17): CNS 00h Identify Namespace
//! (NVM Command Set Specification), CNS 01h Identify Controller, CNS 02h Active Namespace ID list.

use super::command::Command;
use super::config::{ModelConfig, NamespaceConfig};
use super::engine::Outcome;
use super::regs::VERSION;
use super::state::State;
use super::status::Status;
use super::storage::Namespace;

/// Size of every Identify data structure.
const PAGE: usize = 4096;

/// Writes `v` little-endian at `off` (bounds are compile-time constants
/// inside the 4 KiB page; an out-of-range write is skipped, never a panic).
fn put(page: &mut [u8], off: usize, v: &[u8]) {
    if let Some(dst) = page.get_mut(off..off + v.len()) {
        dst.copy_from_slice(v);
    }
}

/// ASCII string field, space padded / cut to `len` bytes.
fn put_str(page: &mut [u8], off: usize, len: usize, s: &str) {
    let mut field = vec![b' '; len];
    for (d, b) in field.iter_mut().zip(s.bytes()) {
        *d = b;
    }
    put(page, off, &field);
}

/// The Identify Controller data structure (CNS 01h) for `cfg`.
pub(crate) fn controller(cfg: &ModelConfig) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    put(&mut p, 0, &cfg.vid.to_le_bytes()); // VID
    put(&mut p, 2, &cfg.vid.to_le_bytes()); // SSVID
    put_str(&mut p, 4, 20, &cfg.serial); // SN
    put_str(&mut p, 24, 40, &cfg.model); // MN
    put_str(&mut p, 64, 8, &cfg.firmware); // FR
    p[72] = 6; // RAB
    put(&mut p, 73, &[0x00, 0x54, 0x52]); // IEEE OUI (QEMU's)
    p[76] = 0; // CMIC
    p[77] = cfg.mdts; // MDTS
    put(&mut p, 78, &cfg.cntlid.to_le_bytes()); // CNTLID
    put(&mut p, 80, &VERSION.to_le_bytes()); // VER
    put(&mut p, 84, &0u32.to_le_bytes()); // RTD3R
    put(&mut p, 88, &cfg.rtd3e_us.to_le_bytes()); // RTD3E
    put(&mut p, 92, &(1u32 << 8).to_le_bytes()); // OAES: Namespace Attribute Notices
    put(&mut p, 96, &(u32::from(cfg.elbas) << 15).to_le_bytes()); // CTRATT: ELBAS
    for (i, t) in cfg.crdt.iter().enumerate() {
        put(&mut p, 128 + 2 * i, &t.to_le_bytes()); // CRDT1..CRDT3
    }
    // OACS bit 1 Format NVM, bit 8 Doorbell Buffer Config.
    let oacs: u16 = 1 << 1 | if cfg.oacs_dbbc { 1 << 8 } else { 0 };
    put(&mut p, 256, &oacs.to_le_bytes()); // OACS
    p[258] = 3; // ACL (0-based)
    p[259] = cfg.aerl; // AERL (0-based)
    p[260] = 0x03; // FRMW: slot 1 read-only, 1 slot
    p[261] = 0x04; // LPA: extended data for Get Log Page (NUMDU, LPOL/LPOU)
    p[262] = 3; // ELPE: 4 Error Information entries (0-based)
    p[263] = 0; // NPSS
    put(&mut p, 266, &0x0157u16.to_le_bytes()); // WCTEMP 343 K
    put(&mut p, 268, &0x0175u16.to_le_bytes()); // CCTEMP 373 K
    let kas: u16 = u16::from(cfg.keep_alive);
    put(&mut p, 320, &kas.to_le_bytes()); // KAS (100 ms units)
    p[512] = 0x66; // SQES: 64-byte entries
    p[513] = 0x44; // CQES: 16-byte entries
    put(&mut p, 516, &cfg.nn().to_le_bytes()); // NN
    put(&mut p, 520, &cfg.oncs.to_le_bytes()); // ONCS
    put(&mut p, 522, &0u16.to_le_bytes()); // FUSES
    p[524] = cfg.fna; // FNA
    p[525] = if cfg.vwc { 0x07 } else { 0x00 }; // VWC (+ flush broadcast bits 2:1 = 11b)
    put(&mut p, 526, &0u16.to_le_bytes()); // AWUN
    put(&mut p, 528, &0u16.to_le_bytes()); // AWUPF
    put(&mut p, 534, &cfg.ocfs.to_le_bytes()); // OCFS
    put(&mut p, 536, &cfg.sgls.to_le_bytes()); // SGLS
    let nqn = format!("nqn.2024-01.invalid.upnvme:model:{}", cfg.serial);
    let mut subnqn = [0u8; 256];
    for (d, b) in subnqn.iter_mut().zip(nqn.bytes().take(255)) {
        *d = b;
    }
    put(&mut p, 768, &subnqn); // SUBNQN (NUL terminated)
    p
}

/// The Identify Namespace data structure (CNS 00h) for an active namespace.
pub(crate) fn namespace(ns: &Namespace) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    let blocks = ns.cfg.blocks;
    put(&mut p, 0, &blocks.to_le_bytes()); // NSZE
    put(&mut p, 8, &blocks.to_le_bytes()); // NCAP
    put(&mut p, 16, &blocks.to_le_bytes()); // NUSE
    p[24] = 0; // NSFEAT
    let formats = NamespaceConfig::LBA_FORMATS;
    p[25] = (formats.len() - 1) as u8; // NLBAF (0-based)
    // FLBAS: format index (3:0), bit 4 extended LBA.
    p[26] = ns.cfg.format_index().unwrap_or(0) as u8 | u8::from(ns.cfg.extended) << 4;
    p[27] = 0x3; // MC: extended LBA (bit 0) and separate buffer (bit 1)
    p[28] = ns.cfg.dpc; // DPC: PI types (2:0), PI first (3) or last (4) 8 bytes
    p[29] = ns.cfg.pi_type | u8::from(ns.cfg.pi_first) << 3; // DPS
    p[30] = 0; // NMIC
    // DLFEAT: deallocated blocks read as zeroes (001b), Write Zeroes
    // supports DEAC (bit 3).
    p[33] = 0x09;
    put(&mut p, 74, &ns.cfg.mssrl.to_le_bytes()); // MSSRL
    put(&mut p, 76, &ns.cfg.mcl.to_le_bytes()); // MCL
    p[80] = ns.cfg.msrc; // MSRC (0-based)
    put(&mut p, 104, &ns.cfg.nguid); // NGUID
    for (i, (bs, ms)) in formats.iter().enumerate() {
        // LBAFn: MS (15:0), LBADS (23:16), RP 0.
        let lbaf = u32::from(*ms) | bs.trailing_zeros() << 16;
        put(&mut p, 128 + 4 * i, &lbaf.to_le_bytes());
    }
    p
}

/// The I/O Command Set specific Identify Namespace data structure for the
/// NVM Command Set (CNS 05h, CSI 00h): LBSTM 0, PIC 0, and ELBAF0..7 at
/// bytes 12 + 4 × index: PIF (bits 8:7) for the formats with 16 or more
/// metadata bytes, STS 0.
pub(crate) fn namespace_nvm(ns: &Namespace) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    for (i, (_, ms)) in NamespaceConfig::LBA_FORMATS.iter().enumerate() {
        if *ms >= 16 {
            let elbaf = u32::from(ns.cfg.pif & 0x3) << 7;
            put(&mut p, 12 + 4 * i, &elbaf.to_le_bytes());
        }
    }
    p
}

impl State {
    /// Identify (§5.17): CDW10 CNS (7:0); data to PRP1/PRP2.
    pub(crate) fn identify(&mut self, cmd: &Command) -> Outcome {
        let cns = cmd.cdw(10) & 0xff;
        let nsid = cmd.nsid();
        if let Some(data) = self.identify_overrides.get(&(cns as u8, nsid)) {
            let mut page = data.clone();
            page.resize(PAGE, 0);
            return match self.write_host_data(cmd, &page, PAGE) {
                Ok(()) => Outcome::ok(0),
                Err(s) => Outcome::err(s),
            };
        }
        let page = match cns {
            0x00 => {
                if nsid == 0 || nsid > self.cfg.nn() {
                    return Outcome::err(Status::INVALID_NAMESPACE.with_dnr());
                }
                match self.namespace(nsid).and_then(|i| self.namespaces.get(i)) {
                    Some(ns) => namespace(ns),
                    // An inactive NSID: a zero-filled structure.
                    None => vec![0u8; PAGE],
                }
            }
            0x01 => controller(&self.cfg),
            // The NVM Command Set's Identify Controller (CSI 00h): the size
            // limits, as QEMU's `nvme_identify_ctrl_csi`.
            0x06 if cmd.cdw(11) >> 24 == 0 => {
                let l = self.cfg.nvm_limits;
                let mut p = vec![0u8; PAGE];
                p[0] = l.vsl;
                p[1] = l.wzsl;
                p[3] = l.dmrl;
                put(&mut p, 4, &l.dmrsl.to_le_bytes());
                put(&mut p, 8, &l.dmsl.to_le_bytes());
                p
            }
            // CSI (CDW11 bits 31:24) 00h, the NVM Command Set.
            0x05 if self.cfg.elbas && cmd.cdw(11) >> 24 == 0 => {
                match self.namespace(nsid).and_then(|i| self.namespaces.get(i)) {
                    Some(ns) => namespace_nvm(ns),
                    None => return Outcome::err(Status::INVALID_NAMESPACE.with_dnr()),
                }
            }
            0x02 => {
                if nsid >= 0xffff_fffe {
                    return Outcome::err(Status::INVALID_NAMESPACE.with_dnr());
                }
                let mut ids: Vec<u32> = self
                    .namespaces
                    .iter()
                    .map(|n| n.cfg.nsid)
                    .filter(|&id| id > nsid)
                    .collect();
                ids.sort_unstable();
                let mut p = vec![0u8; PAGE];
                for (i, id) in ids.iter().take(PAGE / 4).enumerate() {
                    put(&mut p, i * 4, &id.to_le_bytes());
                }
                p
            }
            _ => return Outcome::err(Status::INVALID_FIELD.with_dnr()),
        };
        match self.write_host_data(cmd, &page, PAGE) {
            Ok(()) => Outcome::ok(0),
            Err(s) => Outcome::err(s),
        }
    }
}

//! NVM command set I/O commands (NVM Command Set Specification 1.0 and
//! Base Specification 2.0, "I/O Commands"): Flush, Write, Read, Compare, Write Zeroes,
//! Dataset Management.
//!
//! Checks follow QEMU's order: namespace (Invalid Namespace or Format), then
//! transfer size against MDTS (Invalid Field in Command), then the LBA range
//! against NSZE (LBA Out of Range), then the data pointer.

use super::command::{Command, io_op};
use super::config::ModelConfig;
use super::engine::Outcome;
use super::pi::{self, PiFields};
use super::state::State;
use super::status::Status;

/// Unrecovered Read Error (Media and Data Integrity Errors, 81h).
const UNRECOVERED_READ_ERROR: Status = Status::new(2, 0x81);
/// Command Size Limit Exceeded (Command Specific Status 83h, NVM Command
/// Set): a Copy beyond the namespace's MSRC, MSSRL or MCL.
const COMMAND_SIZE_LIMIT: Status = Status::new(1, 0x83);
/// Copy: Incompatible Namespace or Format (NVM Command Set, SCT 1h, 85h).
const INCOMPATIBLE_NAMESPACE_OR_FORMAT: Status = Status::new(1, 0x85);

/// Flush to all namespaces (Flush with NSID FFFFFFFFh).
const BROADCAST_NSID: u32 = 0xffff_ffff;

/// A command's protection fields (CDW12 PRINFO, CDW14, CDW15).
fn pi_fields(cmd: &Command) -> PiFields {
    PiFields {
        prinfo: (cmd.cdw(12) >> 26 & 0xf) as u8,
        ref_tag: cmd.cdw(14),
        ref_tag_upper: cmd.cdw(3) as u16,
        app_tag: cmd.cdw(15) as u16,
        app_mask: (cmd.cdw(15) >> 16) as u16,
    }
}

impl State {
    /// MPTR (CDW4-5) as a plain address: with PSDT 10b it would point at an
    /// SGL, which the model does not offer (SGLS bit 19 clear); the caller's
    /// data pointer already refused that. With PSDT 00b "that address shall
    /// be dword aligned" (NVMe Base 2.0, §4.1, MPTR): a host that sends
    /// another broke the rule, recorded as a violation (QEMU, like the
    /// model, refuses the command with Invalid Field; other controllers may
    /// not).
    fn mptr(&mut self, cmd: &Command) -> Result<u64, Status> {
        let m = cmd.mptr();
        if m & 3 != 0 {
            self.violation(format!(
                "opcode {:#04x} CID {:#06x}: MPTR {m:#x} is not dword aligned",
                cmd.opcode(),
                cmd.cid()
            ));
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        Ok(m)
    }

    /// Executes an I/O command fetched from an I/O submission queue.
    pub(crate) fn io(&mut self, cmd: &Command) -> Outcome {
        let oncs = self.cfg.oncs;
        match cmd.opcode() {
            io_op::FLUSH => self.flush(cmd),
            io_op::WRITE | io_op::READ => self.read_write(cmd),
            io_op::COMPARE if oncs & ModelConfig::ONCS_COMPARE != 0 => self.read_write(cmd),
            io_op::WRITE_ZEROES if oncs & ModelConfig::ONCS_WRITE_ZEROES != 0 => {
                self.write_zeroes(cmd)
            }
            io_op::DATASET_MANAGEMENT if oncs & ModelConfig::ONCS_DSM != 0 => {
                self.dataset_management(cmd)
            }
            io_op::VERIFY if oncs & ModelConfig::ONCS_VERIFY != 0 => self.verify(cmd),
            io_op::WRITE_UNCORRECTABLE if oncs & ModelConfig::ONCS_WRITE_UNCORRECTABLE != 0 => {
                self.write_uncorrectable(cmd)
            }
            io_op::COPY if oncs & ModelConfig::ONCS_COPY != 0 => self.copy(cmd),
            _ => Outcome::err(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// MDTS in bytes (units of CAP.MPSMIN = 4 KiB), `None` for no limit.
    pub(super) fn mdts_bytes(&self) -> Option<usize> {
        match self.cfg.mdts {
            0 => None,
            m => 1usize.checked_shl(12 + u32::from(m)),
        }
    }

    fn ns_index(&self, cmd: &Command) -> Result<usize, Status> {
        let nsid = cmd.nsid();
        // As QEMU's nvme_io_cmd: an NSID that cannot name a namespace is
        // Invalid Namespace; one that could but is not attached (detached,
        // never created) is Invalid Field.
        let i = self
            .namespace(nsid)
            .ok_or(if nsid == 0 || nsid > self.cfg.nn() {
                Status::INVALID_NAMESPACE.with_dnr()
            } else {
                Status::INVALID_FIELD.with_dnr()
            })?;
        // A format with a 64-bit guard is an Extended LBA Format: usable
        // only once the host set Host Behavior Support LBAFEE (as QEMU's
        // nvme_io_cmd: Invalid Format).
        if self.namespaces.get(i).is_some_and(|n| n.cfg.pif != 0) && !self.features.lbafee {
            return Err(Status::new(1, 0x0a).with_dnr());
        }
        Ok(i)
    }

    /// Flush: nothing is volatile, so it only validates NSID.
    fn flush(&mut self, cmd: &Command) -> Outcome {
        if cmd.nsid() == BROADCAST_NSID {
            return Outcome::ok(0);
        }
        match self.ns_index(cmd) {
            Ok(_) => Outcome::ok(0),
            Err(s) => Outcome::err(s),
        }
    }

    /// Read, Write and Compare: CDW10-11 SLBA, CDW12 NLB (15:0, 0-based);
    /// data through PRP1/PRP2.
    fn read_write(&mut self, cmd: &Command) -> Outcome {
        match self.try_read_write(cmd) {
            Ok(()) => Outcome::ok(0),
            Err(s) => Outcome::err(s),
        }
    }

    fn try_read_write(&mut self, cmd: &Command) -> Result<(), Status> {
        let i = self.ns_index(cmd)?;
        let slba = cmd.cdw10_11();
        let nlb = u64::from(cmd.cdw(12) & 0xffff) + 1;
        let f = pi_fields(cmd);
        let Some(ns) = self.namespaces.get(i) else {
            return Err(Status::INTERNAL_ERROR);
        };
        let (bs, ms, in_range) = (ns.lba_size(), ns.ms(), ns.in_range(slba, nlb));
        let (ext, pi) = (ns.cfg.extended, ns.cfg.pi_type != 0);
        if pi && f.pract() && cmd.opcode() == io_op::COMPARE {
            // As QEMU's `nvme_compare`: nothing to insert or strip.
            return Err(pi::INVALID_PI.with_dnr());
        }
        // Metadata moves unless PRACT inserts/strips a PI tuple that is all
        // the metadata (QEMU's rule, NVM Command Set 1.0 §5.2.1).
        let md_moves = ms != 0 && !(pi && f.pract() && ms == ns.cfg.pi_tuple_size());
        let n = nlb as usize;
        let len = bs * n;
        let host_len = len + if ext && md_moves { ms * n } else { 0 };
        if let Some(max) = self.mdts_bytes().filter(|&max| host_len > max) {
            // The host shall not exceed MDTS: QEMU refuses the command,
            // other controllers may not.
            self.violation(format!(
                "opcode {:#04x} CID {:#06x}: {nlb} blocks ({host_len} bytes) above MDTS ({max} bytes)",
                cmd.opcode(),
                cmd.cid()
            ));
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        if !in_range {
            return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        if pi {
            pi::check_prinfo(ns, &f, slba)?;
        }
        let units = (len / 512) as u128;
        match cmd.opcode() {
            io_op::WRITE | io_op::COMPARE => {
                let host = self.read_host_data(cmd, host_len)?;
                let (data, mut meta) = if ext && md_moves {
                    pi::split(&host, bs, ms)
                } else if md_moves {
                    (host, self.read_host_meta(cmd, ms * n)?)
                } else {
                    (host, vec![0u8; ms * n])
                };
                let ns = &self.namespaces[i];
                if cmd.opcode() == io_op::COMPARE {
                    self.health.host_reads += 1;
                    let same = ns.read(slba, nlb) == data
                        && (!md_moves || ns.read_meta(slba, nlb) == meta);
                    if !same {
                        return Err(Status::COMPARE_FAILURE);
                    }
                    return Ok(());
                }
                if pi && f.pract() {
                    pi::generate(ns, &data, &mut meta, &f);
                } else if pi {
                    pi::check(ns, &data, &meta, &f)?;
                }
                let ns = &mut self.namespaces[i];
                ns.write(slba, &data);
                ns.write_meta(slba, &meta);
                self.health.host_writes += 1;
                self.health.units_written += units;
            }
            _ => {
                let ns = &self.namespaces[i];
                if ns.any_uncorrectable(slba, nlb) {
                    return Err(UNRECOVERED_READ_ERROR);
                }
                let data = ns.read(slba, nlb);
                let meta = ns.read_meta(slba, nlb);
                if pi {
                    pi::check(ns, &data, &meta, &f)?;
                }
                if ext && md_moves {
                    let host = pi::interleave(&data, &meta, bs, ms);
                    self.write_host_data(cmd, &host, host_len)?;
                } else {
                    self.write_host_data(cmd, &data, len)?;
                    if md_moves {
                        self.write_host_meta(cmd, &meta)?;
                    }
                }
                self.health.host_reads += 1;
                self.health.units_read += units;
            }
        }
        Ok(())
    }

    /// Reads `len` metadata bytes from MPTR (CDW4-5), one contiguous buffer.
    fn read_host_meta(&mut self, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
        let mut meta = vec![0u8; len];
        let at = self.mptr(cmd)?;
        if let Err(f) = self.mem.read(at, &mut meta) {
            self.dma_fault(f, "metadata read");
            return Err(Status::DATA_TRANSFER_ERROR);
        }
        Ok(meta)
    }

    /// Writes metadata to MPTR.
    fn write_host_meta(&mut self, cmd: &Command, meta: &[u8]) -> Result<(), Status> {
        let at = self.mptr(cmd)?;
        if let Err(f) = self.mem.write(at, meta) {
            self.dma_fault(f, "metadata write");
            return Err(Status::DATA_TRANSFER_ERROR);
        }
        Ok(())
    }

    /// Write Zeroes: CDW10-11 SLBA, CDW12 NLB (15:0), DEAC (bit
    /// 25). Both with and without DEAC the blocks end up deallocated, which
    /// reads as zeros (DLFEAT 001b). Not limited by MDTS (WZSL = 0).
    fn write_zeroes(&mut self, cmd: &Command) -> Outcome {
        let i = match self.ns_index(cmd) {
            Ok(i) => i,
            Err(s) => return Outcome::err(s),
        };
        let slba = cmd.cdw10_11();
        let nlb = u64::from(cmd.cdw(12) & 0xffff) + 1;
        let f = pi_fields(cmd);
        match self.namespaces.get_mut(i) {
            Some(ns) if ns.in_range(slba, nlb) => {
                if ns.cfg.pi_type != 0 && f.checks() {
                    // Nothing to check on Write Zeroes (as QEMU).
                    return Outcome::err(pi::INVALID_PI.with_dnr());
                }
                ns.deallocate(slba, nlb);
                if ns.cfg.pi_type != 0 && f.pract() {
                    // Zero data and metadata, and a tuple from the command's
                    // tags (the guard of zeros is 0).
                    let zeros = vec![0u8; ns.lba_size() * nlb as usize];
                    let mut meta = vec![0u8; ns.ms() * nlb as usize];
                    pi::generate(ns, &zeros, &mut meta, &f);
                    ns.write(slba, &zeros);
                    ns.write_meta(slba, &meta);
                }
                Outcome::ok(0)
            }
            _ => Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr()),
        }
    }

    /// Dataset Management: CDW10 NR (7:0, 0-based number of
    /// ranges), CDW11 AD (bit 2, deallocate); the range list (16 bytes per
    /// range: context attributes, length in LBAs, starting LBA) comes
    /// through PRP1/PRP2. Every range is checked before any is deallocated.
    fn dataset_management(&mut self, cmd: &Command) -> Outcome {
        let i = match self.ns_index(cmd) {
            Ok(i) => i,
            Err(s) => return Outcome::err(s),
        };
        let nr = (cmd.cdw(10) & 0xff) as usize + 1;
        let deallocate = cmd.cdw(11) & (1 << 2) != 0;
        let list = match self.read_host_data(cmd, nr * 16) {
            Ok(l) => l,
            Err(s) => return Outcome::err(s),
        };
        // The host must stay within the NVM Command Set's limits (Identify
        // CNS 06h): the driver splits or refuses beyond them.
        let l = self.cfg.nvm_limits;
        let lengths = list
            .chunks_exact(16)
            .map(|r| u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]])));
        let total: u64 = lengths.clone().sum();
        if l.dmrl != 0 && nr > usize::from(l.dmrl) {
            self.violation(format!(
                "Dataset Management with {nr} ranges, above DMRL {}",
                l.dmrl
            ));
        }
        if l.dmrsl != 0 && lengths.clone().any(|n| n > u64::from(l.dmrsl)) {
            self.violation(format!(
                "Dataset Management with a range above DMRSL {} blocks",
                l.dmrsl
            ));
        }
        if l.dmsl != 0 && total > l.dmsl {
            self.violation(format!(
                "Dataset Management of {total} blocks, above DMSL {}",
                l.dmsl
            ));
        }
        if !deallocate {
            // Integral dataset hints only: nothing to do.
            return Outcome::ok(0);
        }
        let ranges: Vec<(u64, u64)> = list
            .chunks_exact(16)
            .map(|r| {
                let mut nlb = [0u8; 4];
                let mut slba = [0u8; 8];
                nlb.copy_from_slice(r.get(4..8).unwrap_or(&[0; 4]));
                slba.copy_from_slice(r.get(8..16).unwrap_or(&[0; 8]));
                (u64::from_le_bytes(slba), u64::from(u32::from_le_bytes(nlb)))
            })
            .filter(|&(_, nlb)| nlb != 0)
            .collect();
        let Some(ns) = self.namespaces.get_mut(i) else {
            return Outcome::err(Status::INTERNAL_ERROR);
        };
        if ranges.iter().any(|&(slba, nlb)| !ns.in_range(slba, nlb)) {
            return Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        let dmrsl = u64::from(self.cfg.nvm_limits.dmrsl);
        for (slba, nlb) in ranges {
            // As QEMU's `nvme_dsm_cb`: a range above DMRSL is skipped, and
            // the command still completes with success.
            if dmrsl != 0 && nlb > dmrsl {
                continue;
            }
            ns.deallocate(slba, nlb);
        }
        Outcome::ok(0)
    }

    /// Verify: CDW10-11 SLBA, CDW12 NLB (15:0, 0-based). Reads nothing to
    /// the host; fails like a read of the blocks would.
    fn verify(&mut self, cmd: &Command) -> Outcome {
        let (slba, nlb) = (cmd.cdw10_11(), u64::from(cmd.cdw(12) & 0xffff) + 1);
        let ns = match self.ns_index(cmd) {
            Ok(i) => &self.namespaces[i],
            Err(s) => return Outcome::err(s),
        };
        if ns.cfg.pi_type != 0 && pi_fields(cmd).pract() {
            // As QEMU's `nvme_verify`: nothing to insert or strip.
            return Outcome::err(pi::INVALID_PI.with_dnr());
        }
        if !ns.in_range(slba, nlb) {
            return Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        // As QEMU's `nvme_verify`: above VSL (the data, and the metadata
        // when interleaved) is Invalid Field.
        let vsl = self.cfg.nvm_limits.vsl;
        let md = if ns.cfg.extended { ns.cfg.ms } else { 0 };
        let per_block = u64::from(ns.cfg.lba_size) + u64::from(md);
        if vsl != 0 && nlb * per_block > 4096u64 << vsl {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        if ns.any_uncorrectable(slba, nlb) {
            return Outcome::err(UNRECOVERED_READ_ERROR);
        }
        if ns.cfg.pi_type != 0 {
            let f = pi_fields(cmd);
            let checked = pi::check_prinfo(ns, &f, slba)
                .and_then(|()| pi::check(ns, &ns.read(slba, nlb), &ns.read_meta(slba, nlb), &f));
            if let Err(s) = checked {
                return Outcome::err(s);
            }
        }
        Outcome::ok(0)
    }

    /// Write Uncorrectable: CDW10-11 SLBA, CDW12 NLB (15:0, 0-based).
    fn write_uncorrectable(&mut self, cmd: &Command) -> Outcome {
        let (slba, nlb) = (cmd.cdw10_11(), u64::from(cmd.cdw(12) & 0xffff) + 1);
        let i = match self.ns_index(cmd) {
            Ok(i) => i,
            Err(s) => return Outcome::err(s),
        };
        let ns = &mut self.namespaces[i];
        if !ns.in_range(slba, nlb) {
            return Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        ns.mark_uncorrectable(slba, nlb);
        Outcome::ok(0)
    }

    /// Copy: CDW10-11 SDLBA, CDW12 NR (7:0, 0-based) and Descriptor Format
    /// (11:8): Format 0h (32-byte entries) on a namespace with the 16-bit
    /// guard protection information format (PIF 00b), Format 1h (40-byte
    /// entries) on one with a 32- or 64-bit guard; the other pairing is
    /// Invalid Format, as QEMU's nvme_copy (Formats 2h and 3h, with a source
    /// NSID, are not offered: Invalid Field). SLBA sits at bytes 15:08 and
    /// NLB (0-based) at 17:16 in both. The source ranges come through the
    /// data pointer. Every range is checked (and read) before the
    /// destination is written.
    fn copy(&mut self, cmd: &Command) -> Outcome {
        let i = match self.ns_index(cmd) {
            Ok(i) => i,
            Err(s) => return Outcome::err(s),
        };
        let format = cmd.cdw(12) >> 8 & 0xf;
        // As QEMU's nvme_copy: a cross-namespace format (2h, 3h) the model
        // does not report in OCFS or the host has not enabled in Host
        // Behavior Support CDFE is Invalid Field (Formats 0h and 1h run
        // whatever OCFS says, so that a controller reporting 0 is modelled).
        let cdfe = self
            .features
            .hbs
            .as_ref()
            .map_or(0, |h| u16::from_le_bytes([h[4], h[5]]));
        let cross = format == 2 || format == 3;
        if format > 3 || (cross && self.cfg.ocfs & cdfe & (1 << format) == 0) {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        let wide_guard = self.namespaces.get(i).is_some_and(|n| n.cfg.pif != 0);
        if (format & 1 == 1) != wide_guard {
            return Outcome::err(Status::new(1, 0x0a).with_dnr());
        }
        let entry = if format & 1 == 1 { 40 } else { 32 };
        let nr = (cmd.cdw(12) & 0xff) as usize + 1;
        let list = match self.read_host_data(cmd, nr * entry) {
            Ok(l) => l,
            Err(s) => return Outcome::err(s),
        };
        // The destination's limits, checked as QEMU's nvme_copy does: MSRC
        // before the ranges, MCL over all of them; MSSRL per range is the
        // source namespace's (nvme_do_copy).
        let (msrc, mcl) = (self.namespaces[i].cfg.msrc, self.namespaces[i].cfg.mcl);
        if nr > usize::from(msrc) + 1 {
            return Outcome::err(COMMAND_SIZE_LIMIT.with_dnr());
        }
        let nlb_of = |r: &[u8]| u64::from(u16::from_le_bytes([r[16], r[17]])) + 1;
        let total: u64 = list.chunks_exact(entry).map(nlb_of).sum();
        if total > u64::from(mcl) {
            return Outcome::err(COMMAND_SIZE_LIMIT.with_dnr());
        }
        let dnsid = cmd.nsid();
        let mut data = Vec::new();
        let mut meta = Vec::new();
        for r in list.chunks_exact(entry) {
            let snsid = if cross {
                u32::from_le_bytes([r[0], r[1], r[2], r[3]])
            } else {
                dnsid
            };
            let s = if snsid == dnsid {
                i
            } else {
                match self.namespace(snsid) {
                    Some(s) => s,
                    None if snsid == 0 || snsid > self.cfg.nn() => {
                        return Outcome::err(Status::INVALID_NAMESPACE.with_dnr());
                    }
                    None => return Outcome::err(Status::INVALID_FIELD.with_dnr()),
                }
            };
            let (src, dst) = (&self.namespaces[s], &self.namespaces[i]);
            // The model copies only between namespaces of the same LBA
            // data and metadata size and protection (no PRACT
            // conversions): anything else is Incompatible Namespace or
            // Format, as QEMU answers the cases it does not convert.
            if s != i
                && (src.cfg.lba_size != dst.cfg.lba_size
                    || src.cfg.ms != dst.cfg.ms
                    || src.cfg.pi_type != dst.cfg.pi_type)
            {
                return Outcome::err(INCOMPATIBLE_NAMESPACE_OR_FORMAT.with_dnr());
            }
            let mut slba = [0u8; 8];
            slba.copy_from_slice(&r[8..16]);
            let slba = u64::from_le_bytes(slba);
            let nlb = nlb_of(r);
            if nlb > u64::from(src.cfg.mssrl) {
                return Outcome::err(COMMAND_SIZE_LIMIT.with_dnr());
            }
            if !src.in_range(slba, nlb) {
                return Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr());
            }
            if src.any_uncorrectable(slba, nlb) {
                return Outcome::err(UNRECOVERED_READ_ERROR);
            }
            data.extend_from_slice(&src.read(slba, nlb));
            meta.extend_from_slice(&src.read_meta(slba, nlb));
        }
        let ns = &mut self.namespaces[i];
        let sdlba = cmd.cdw10_11();
        if !ns.in_range(sdlba, (data.len() / ns.lba_size()) as u64) {
            return Outcome::err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        ns.write(sdlba, &data);
        ns.write_meta(sdlba, &meta);
        Outcome::ok(0)
    }
}

//! The NVM Command Set's per-command size limits (Identify Controller, I/O
//! Command Set specific, CNS 06h, CSI 00h: VSL, WZSL, WUSL, DMRL, DMRSL,
//! DMSL), checked before a Verify, Write Zeroes, Write Uncorrectable or
//! Dataset Management command is queued. A controller may refuse a command
//! beyond them, or — QEMU's Dataset Management does — skip a range beyond
//! DMRSL and still complete the command with success, so a deallocation
//! the application asked for silently does not happen. A Verify, Write
//! Zeroes or Write Uncorrectable beyond its limit is split into commands
//! within it (split.rs); a Dataset Management beyond its limits is refused.

use upnvme_queues::{DsmRange, IdentifyControllerNvm};

use crate::error::{NvmLimit, Reject};
use crate::namespace::Namespace;

/// The limits as the queue pair checks them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SizeLimits {
    /// VSL in bytes (`None`: no limit).
    verify: Option<u64>,
    /// WZSL in bytes.
    write_zeroes: Option<u64>,
    /// WUSL in bytes.
    write_uncorrectable: Option<u64>,
    /// DMRL: ranges per command (0: no limit beyond the 256 of the format).
    dmrl: u32,
    /// DMRSL: logical blocks per range (0: no limit).
    dmrsl: u32,
    /// DMSL: logical blocks in all ranges (0: no limit).
    dmsl: u64,
}

impl SizeLimits {
    /// The limits of `id` for a controller whose minimum memory page size
    /// (CAP.MPSMIN) is `min_page` bytes.
    pub(super) fn new(id: IdentifyControllerNvm, min_page: usize) -> SizeLimits {
        let bytes = |f| IdentifyControllerNvm::size_limit_bytes(f, min_page);
        SizeLimits {
            verify: bytes(id.vsl),
            write_zeroes: bytes(id.wzsl),
            write_uncorrectable: bytes(id.wusl),
            dmrl: u32::from(id.dmrl),
            dmrsl: id.dmrsl,
            dmsl: id.dmsl,
        }
    }

    /// Checks a Verify, Write Zeroes or Write Uncorrectable of `blocks`
    /// blocks of `ns` against its size limit. The size counts the blocks'
    /// data, and their metadata when it is interleaved with the data
    /// (extended LBA), as the NVM Command Set specification defines these
    /// limits and QEMU applies them.
    pub(super) fn blocks(
        &self,
        limit: NvmLimit,
        ns: &Namespace,
        blocks: u32,
    ) -> Result<(), Reject> {
        match self.max_blocks(limit, ns) {
            Some(max) if u64::from(blocks) > max => Err(Reject::SizeLimit { limit, max }),
            _ => Ok(()),
        }
    }

    /// The most blocks of `ns` one Verify, Write Zeroes or Write
    /// Uncorrectable may cover under its size limit (`None`: no limit; any
    /// other `limit`: `None`). The size counts the blocks' data, and their
    /// metadata when interleaved (see [`SizeLimits::blocks`]).
    pub(super) fn max_blocks(&self, limit: NvmLimit, ns: &Namespace) -> Option<u64> {
        let max_bytes = match limit {
            NvmLimit::Verify => self.verify,
            NvmLimit::WriteZeroes => self.write_zeroes,
            NvmLimit::WriteUncorrectable => self.write_uncorrectable,
            _ => None,
        }?;
        let md = ns
            .metadata_layout()
            .filter(|l| l.extended)
            .map_or(0, |l| u64::from(l.ms));
        let per_block = u64::from(ns.lba_size()) + md;
        Some(max_bytes / per_block.max(1))
    }

    /// Dataset Management's limits as (ranges per command, blocks per
    /// range, blocks per command): DMRL, DMRSL and DMSL, each at its type's
    /// maximum where the controller reports none (0h).
    pub(super) fn dsm_caps(&self) -> (usize, u32, u64) {
        let or_max = |v: u64, max: u64| if v == 0 { max } else { v };
        (
            or_max(u64::from(self.dmrl), usize::MAX as u64) as usize,
            or_max(u64::from(self.dmrsl), u64::from(u32::MAX)) as u32,
            or_max(self.dmsl, u64::MAX),
        )
    }

    /// Checks a Dataset Management command's ranges against DMRL, DMRSL and
    /// DMSL.
    pub(super) fn dsm(&self, ranges: &[DsmRange]) -> Result<(), Reject> {
        if self.dmrl != 0 && ranges.len() > self.dmrl as usize {
            return Err(Reject::SizeLimit {
                limit: NvmLimit::DsmRanges,
                max: u64::from(self.dmrl),
            });
        }
        if self.dmrsl != 0 && ranges.iter().any(|r| r.nlb > self.dmrsl) {
            return Err(Reject::SizeLimit {
                limit: NvmLimit::DsmRangeBlocks,
                max: u64::from(self.dmrsl),
            });
        }
        if self.dmsl != 0 && ranges.iter().map(|r| u64::from(r.nlb)).sum::<u64>() > self.dmsl {
            return Err(Reject::SizeLimit {
                limit: NvmLimit::DsmBlocks,
                max: self.dmsl,
            });
        }
        Ok(())
    }
}

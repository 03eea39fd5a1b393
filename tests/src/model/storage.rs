//! Namespace contents: a sparse map of written logical blocks. A block that
//! was never written, or was deallocated (Dataset Management, Write Zeroes
//! with DEAC), reads as zeros — what Identify Namespace DLFEAT = 001b
//! ("deallocated blocks read as all zeros") promises. Each block's metadata
//! (LBAF.MS bytes) is kept beside it; unwritten metadata reads as zeros,
//! except its PI tuple, which reads as all FFh (checks disabled), as QEMU's
//! nvme-ns reports unwritten blocks.

use std::collections::{BTreeSet, HashMap};

use super::config::NamespaceConfig;

/// One namespace: its geometry and its data.
#[derive(Debug)]
pub(crate) struct Namespace {
    /// The configured geometry.
    pub cfg: NamespaceConfig,
    blocks: HashMap<u64, Box<[u8]>>,
    /// Metadata of written blocks (LBAF.MS bytes each).
    meta: HashMap<u64, Box<[u8]>>,
    /// Blocks marked by Write Uncorrectable: reading them fails until they
    /// are written or deallocated.
    uncorrectable: BTreeSet<u64>,
}

impl Namespace {
    /// An empty (all-zero) namespace.
    pub fn new(cfg: NamespaceConfig) -> Self {
        Namespace {
            cfg,
            blocks: HashMap::new(),
            meta: HashMap::new(),
            uncorrectable: BTreeSet::new(),
        }
    }

    /// LBA data size in bytes.
    pub fn lba_size(&self) -> usize {
        self.cfg.lba_size as usize
    }

    /// True when `[slba, slba + nlb)` lies inside the namespace (NSZE).
    pub fn in_range(&self, slba: u64, nlb: u64) -> bool {
        slba.checked_add(nlb)
            .is_some_and(|end| end <= self.cfg.blocks)
    }

    /// Reads `nlb` blocks from `slba`; the caller checked the range.
    pub fn read(&self, slba: u64, nlb: u64) -> Vec<u8> {
        let bs = self.lba_size();
        let mut out = Vec::with_capacity(bs.saturating_mul(nlb as usize));
        for lba in slba..slba.saturating_add(nlb) {
            match self.blocks.get(&lba) {
                Some(b) => out.extend_from_slice(b),
                None => out.resize(out.len() + bs, 0),
            }
        }
        out
    }

    /// Writes whole blocks from `data` starting at `slba`; a partial trailing
    /// block is ignored. The caller checked the range.
    pub fn write(&mut self, slba: u64, data: &[u8]) {
        let bs = self.lba_size();
        for (i, chunk) in data.chunks_exact(bs).enumerate() {
            let lba = slba.saturating_add(i as u64);
            self.uncorrectable.remove(&lba);
            self.blocks.insert(lba, chunk.to_vec().into_boxed_slice());
        }
    }

    /// Metadata bytes per block.
    pub fn ms(&self) -> usize {
        usize::from(self.cfg.ms)
    }

    /// Where the PI tuple sits in a block's metadata, if the format has PI.
    pub fn pi_offset(&self) -> Option<usize> {
        if self.cfg.pi_type == 0 {
            return None;
        }
        let ms = self.ms().checked_sub(self.cfg.pi_tuple_size())?;
        Some(if self.cfg.pi_first { 0 } else { ms })
    }

    /// The metadata of `nlb` blocks from `slba`.
    pub fn read_meta(&self, slba: u64, nlb: u64) -> Vec<u8> {
        let ms = self.ms();
        let mut out = Vec::with_capacity(ms.saturating_mul(nlb as usize));
        for lba in slba..slba.saturating_add(nlb) {
            match self.meta.get(&lba) {
                Some(m) => out.extend_from_slice(m),
                None => {
                    let at = out.len();
                    out.resize(at + ms, 0);
                    if let Some(pi) = self.pi_offset() {
                        out[at + pi..at + pi + 8].fill(0xff);
                    }
                }
            }
        }
        out
    }

    /// Stores the metadata of the blocks from `slba` (MS bytes each).
    pub fn write_meta(&mut self, slba: u64, meta: &[u8]) {
        let ms = self.ms();
        if ms == 0 {
            return;
        }
        for (i, chunk) in meta.chunks_exact(ms).enumerate() {
            self.meta.insert(
                slba.saturating_add(i as u64),
                chunk.to_vec().into_boxed_slice(),
            );
        }
    }

    /// Marks `nlb` blocks from `slba` uncorrectable (Write Uncorrectable).
    pub fn mark_uncorrectable(&mut self, slba: u64, nlb: u64) {
        self.uncorrectable.extend(slba..slba.saturating_add(nlb));
    }

    /// True when a block of `[slba, slba + nlb)` is marked uncorrectable.
    pub fn any_uncorrectable(&self, slba: u64, nlb: u64) -> bool {
        self.uncorrectable
            .range(slba..slba.saturating_add(nlb))
            .next()
            .is_some()
    }

    /// Deallocates `nlb` blocks from `slba` (they read as zeros afterwards).
    pub fn deallocate(&mut self, slba: u64, nlb: u64) {
        let end = slba.saturating_add(nlb);
        self.uncorrectable.retain(|&lba| lba < slba || lba >= end);
        if nlb >= self.blocks.len() as u64 {
            self.blocks.retain(|&lba, _| lba < slba || lba >= end);
            self.meta.retain(|&lba, _| lba < slba || lba >= end);
        } else {
            for lba in slba..end {
                self.blocks.remove(&lba);
                self.meta.remove(&lba);
            }
        }
    }

    /// Erases everything (Format NVM) and takes the new format.
    pub fn format(&mut self, cfg: NamespaceConfig) {
        self.cfg = cfg;
        self.blocks.clear();
        self.meta.clear();
        self.uncorrectable.clear();
    }

    /// Number of blocks holding written data.
    pub fn allocated_blocks(&self) -> u64 {
        self.blocks.len() as u64
    }
}

//! Namespaces: what Identify Namespace (CNS 00h) says about one NSID, in the
//! units an application needs.

use upnvme_queues::IdentifyNamespace;

/// An active namespace of a controller.
#[derive(Clone, Debug)]
pub struct Namespace {
    id: u32,
    lba_size: u32,
    metadata_size: u16,
    identify: IdentifyNamespace,
}

impl Namespace {
    /// Builds a namespace from its Identify Namespace data; `None` when the
    /// current LBA format (FLBAS) is unusable (LBADS outside 9..=31).
    pub fn from_identify(id: u32, identify: IdentifyNamespace) -> Option<Namespace> {
        let fmt = identify.current_lba_format()?;
        let lba_size = identify.lba_size()?;
        Some(Namespace {
            id,
            lba_size,
            metadata_size: fmt.ms,
            identify,
        })
    }

    /// The namespace ID (NSID).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes per logical block of the current LBA format (2^LBADS).
    pub fn lba_size(&self) -> u32 {
        self.lba_size
    }

    /// Namespace Size (NSZE): the number of logical blocks.
    pub fn lba_count(&self) -> u64 {
        self.identify.nsze
    }

    /// Namespace Capacity (NCAP) in logical blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.identify.ncap
    }

    /// Size in bytes (NSZE × LBA size).
    pub fn size_bytes(&self) -> u64 {
        self.identify.nsze.saturating_mul(self.lba_size as u64)
    }

    /// Metadata bytes per logical block of the current LBA format (LBAF.MS).
    pub fn metadata_size(&self) -> u16 {
        self.metadata_size
    }

    /// Namespace Features (NSFEAT): bit 0 thin provisioning, bit 1 NAWUN/NAWUPF
    /// valid, bit 2 deallocated or unwritten logical block error, bit 4 NPWG etc.
    pub fn features(&self) -> u8 {
        self.identify.nsfeat
    }

    /// Whether the namespace supports thin provisioning (NSFEAT bit 0).
    pub fn thin_provisioned(&self) -> bool {
        self.identify.nsfeat & 1 != 0
    }

    /// The full Identify Namespace data.
    pub fn identify(&self) -> &IdentifyNamespace {
        &self.identify
    }
}

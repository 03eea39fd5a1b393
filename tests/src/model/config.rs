//! What the model controller looks like: the values it reports in its
//! registers (NVMe Base Specification 2.0, §3.1.3) and in Identify Controller /
//! Identify Namespace (§5.17; NVM Command Set Specification, "Identify
//! Namespace data structure").

/// Configuration of a [`ModelController`](super::ModelController).
///
/// [`Default`] describes what QEMU's `nvme` device reports with its default
/// properties (MDTS 7, MQES 2047, 64 queue pairs, shadow doorbells supported),
/// with one 64 MiB namespace of 4096-byte LBAs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Identify Controller SN (bytes 23:04), Serial Number; ASCII, padded with
    /// spaces to 20 bytes (longer strings are cut).
    pub serial: String,
    /// Identify Controller MN (bytes 63:24), Model Number; padded to 40 bytes.
    pub model: String,
    /// Identify Controller FR (bytes 71:64), Firmware Revision; padded to 8
    /// bytes. Also reported in the Firmware Slot Information log page, slot 1.
    pub firmware: String,
    /// Identify Controller VID (bytes 01:00) and SSVID (bytes 03:02), PCI
    /// (Subsystem) Vendor ID.
    pub vid: u16,
    /// Identify Controller CNTLID (bytes 79:78), Controller ID.
    pub cntlid: u16,
    /// Identify Controller CRDT1..CRDT3 (bytes 133:128), Command Retry
    /// Delay Times in 100 ms units. The model never sets CRD itself; a
    /// [`Fault::Status`](super::Fault::Status) can carry one.
    pub crdt: [u16; 3],
    /// Identify Controller MDTS (byte 77), Maximum Data Transfer Size, as a
    /// power of two in units of the minimum memory page size (CAP.MPSMIN,
    /// 4 KiB); 0 means no limit.
    pub mdts: u8,
    /// CAP.MQES (bits 15:0), Maximum Queue Entries Supported, **0-based**
    /// (2047 means 2048 entries). Applies to I/O queues.
    pub mqes: u16,
    /// The most I/O submission/completion queue pairs the model grants through
    /// Set Features — Number of Queues (§5.27); also the highest valid I/O
    /// queue identifier.
    pub max_ioqpairs: u16,
    /// CAP.TO (bits 31:24), Timeout, in 500 ms units.
    pub cap_to: u8,
    /// `Some(t)`: CAP.CRMS.CRWMS (bit 59) set and CRTO.CRWMT (register 68h,
    /// bits 15:0) = `t`, in 500 ms units (NVMe 2.0 Controller Ready
    /// Timeouts); `None`: CAP.CRMS = 0, CRTO reads 0.
    pub crwmt: Option<u16>,
    /// CAP.DSTRD (bits 35:32), Doorbell Stride: doorbells are `4 << dstrd`
    /// bytes apart.
    pub dstrd: u8,
    /// Identify Controller RTD3E (bytes 91:88), RTD3 Entry Latency, in
    /// microseconds.
    pub rtd3e_us: u32,
    /// Identify Controller AERL (byte 259), Asynchronous Event Request Limit,
    /// 0-based: the model holds up to `aerl + 1` outstanding requests.
    pub aerl: u8,
    /// Identify Controller OACS bit 8: Doorbell Buffer Config command
    /// supported (shadow doorbells, §5.8).
    pub oacs_dbbc: bool,
    /// Identify Controller CTRATT bit 15, Extended LBA Formats Supported:
    /// the model answers Identify CNS 05h (ELBAF) and Set Features Host
    /// Behavior Support, and refuses I/O to a namespace with a 64-bit guard
    /// (`NamespaceConfig::pif`) until LBAFEE is set, as QEMU does.
    pub elbas: bool,
    /// Identify Controller VWC (byte 525) bit 0: a volatile write cache is
    /// present, so Set Features — Volatile Write Cache is accepted.
    pub vwc: bool,
    /// Identify Controller ONCS (bytes 521:520), Optional NVM Command Support.
    /// The model implements Compare (bit 0), Write Uncorrectable (bit 1),
    /// Dataset Management (bit 2), Write Zeroes (bit 3), Verify (bit 7) and
    /// Copy (bit 8, Source Range Entries Format 0); clearing a bit makes that
    /// command fail with Invalid Command Opcode. The default leaves Write
    /// Uncorrectable, Verify and Copy off.
    pub oncs: u16,
    /// Identify Controller SGLS (bytes 539:536). Bits 1:0 select SGL
    /// support for I/O commands: 00b none (the default: a command with
    /// CDW0.PSDT = 01b fails with Invalid Field), 01b without alignment
    /// requirement, 10b with dword-aligned Data Blocks.
    pub sgls: u32,
    /// Identify Controller OCFS (bytes 535:534), Optional Copy Formats
    /// Supported: bit *n* for Copy Descriptor Format *n*h. The model runs
    /// Formats 0h and 1h whatever it reports (default 03h; QEMU 10.0
    /// reports 0Fh), the cross-namespace Formats 2h and 3h only where
    /// reported here and enabled by the host (Host Behavior Support CDFE,
    /// which the model then accepts).
    pub ocfs: u16,
    /// Identify Controller KAS (bytes 321:320) non-zero and the Keep Alive
    /// command accepted. Off by default, as in QEMU (Keep Alive is then an
    /// Invalid Command Opcode).
    pub keep_alive: bool,
    /// Identify Controller FNA (byte 524), Format NVM Attributes: bit 0 a
    /// Format NVM of any namespace formats every namespace, bit 1 a secure
    /// erase applies to all, bit 2 cryptographic erase supported. 0 by
    /// default, as QEMU.
    pub fna: u8,
    /// SMART / Health Information log, Critical Warning (byte 0), as QEMU's
    /// `smart_critical_warning` property.
    pub smart_critical_warning: u8,
    /// Namespaces attached to the controller. Identify Controller NN is the
    /// largest NSID configured.
    pub namespaces: Vec<NamespaceConfig>,
    /// Size of BAR0 in bytes (register file plus doorbells).
    pub bar_len: usize,
    /// Number of CSTS reads after a CC.EN transition before CSTS.RDY follows
    /// it (0: at once). Exercises the driver's wait loops.
    pub ready_delay_reads: u32,
    /// Number of CSTS reads after a shutdown notification (CC.SHN) during
    /// which CSTS.SHST reports "shutdown processing occurring" before it
    /// reports "complete" (0: complete at once).
    pub shutdown_delay_reads: u32,
    /// The NVM Command Set's size limits the model reports (Identify CNS
    /// 06h, CSI 00h) and applies as QEMU does: a Verify above VSL is
    /// refused (Invalid Field), a Dataset Management range above DMRSL is
    /// skipped while the command still succeeds. Zeros: no limits.
    pub nvm_limits: NvmLimitsConfig,
    /// The IOMMU refuses mappings without the device's write permission
    /// (`DmaMapper::map_device_read_only` fails), as one that cannot
    /// restrict access would: the driver's read-only memory then comes
    /// from its read-write allocator.
    pub refuse_read_only_mappings: bool,
}

impl ModelConfig {
    /// Identify Controller ONCS bit 0: Compare command supported.
    pub const ONCS_COMPARE: u16 = 1 << 0;
    /// Identify Controller ONCS bit 2: Dataset Management command supported.
    pub const ONCS_DSM: u16 = 1 << 2;
    /// Identify Controller ONCS bit 3: Write Zeroes command supported.
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    /// ONCS bit 1: Write Uncorrectable.
    pub const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// ONCS bit 7: Verify.
    pub const ONCS_VERIFY: u16 = 1 << 7;
    /// ONCS bit 8: Copy.
    pub const ONCS_COPY: u16 = 1 << 8;

    /// Identify Controller NN: the largest configured NSID (at least 1).
    pub fn nn(&self) -> u32 {
        self.namespaces
            .iter()
            .map(|n| n.nsid)
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Checks that the configuration describes a controller the model can
    /// build: non-zero and distinct NSIDs below the broadcast value, LBA sizes
    /// 512 or 4096, at least two queue entries, a BAR large enough for the
    /// doorbells of every queue.
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = Vec::new();
        for ns in &self.namespaces {
            if ns.nsid == 0 || ns.nsid >= 0xffff_fffe {
                return Err(format!("namespace ID {:#x} is reserved", ns.nsid));
            }
            if seen.contains(&ns.nsid) {
                return Err(format!("namespace ID {} configured twice", ns.nsid));
            }
            seen.push(ns.nsid);
            if !matches!(ns.lba_size, 512 | 4096) {
                return Err(format!(
                    "namespace {}: LBA size {} (the model supports 512 and 4096)",
                    ns.nsid, ns.lba_size
                ));
            }
            if ns.format_index().is_none() {
                return Err(format!(
                    "namespace {}: metadata size {} (the model offers 0, 8, 16 and 64)",
                    ns.nsid, ns.ms
                ));
            }
            if ns.pif != 0 && ns.pif != 2 {
                return Err(format!("namespace {}: pif {} (0 or 2)", ns.nsid, ns.pif));
            }
            if ns.pi_type > 3 || (ns.pi_type != 0 && usize::from(ns.ms) < ns.pi_tuple_size()) {
                return Err(format!(
                    "namespace {}: PI type {} with {} metadata bytes (types 1-3 need 8 or more)",
                    ns.nsid, ns.pi_type, ns.ms
                ));
            }
            if ns.blocks == 0 {
                return Err(format!("namespace {} has no blocks", ns.nsid));
            }
        }
        if self.mqes == 0 {
            return Err("CAP.MQES is 0-based and must be at least 1".into());
        }
        if self.dstrd > 15 {
            return Err(format!("CAP.DSTRD {} does not fit 4 bits", self.dstrd));
        }
        let stride = 4usize << self.dstrd;
        let doorbells = 2 * (usize::from(self.max_ioqpairs) + 1) * stride;
        if self.bar_len < 0x1000 + doorbells {
            return Err(format!(
                "BAR0 of {:#x} bytes has no room for the doorbells of {} I/O queue pairs (stride {stride})",
                self.bar_len, self.max_ioqpairs
            ));
        }
        Ok(())
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            serial: "MODEL0".into(),
            model: "upnvme model ctrl".into(),
            firmware: "1.0".into(),
            vid: 0x1b36,
            cntlid: 0,
            crdt: [0; 3],
            mdts: 7,
            mqes: 2047,
            max_ioqpairs: 64,
            cap_to: 2,
            crwmt: None,
            dstrd: 0,
            rtd3e_us: 0,
            aerl: 3,
            oacs_dbbc: true,
            elbas: false,
            vwc: false,
            oncs: Self::ONCS_COMPARE | Self::ONCS_DSM | Self::ONCS_WRITE_ZEROES,
            sgls: 0,
            ocfs: 0x3,
            keep_alive: false,
            fna: 0,
            smart_critical_warning: 0,
            namespaces: vec![NamespaceConfig::default()],
            bar_len: 0x4000,
            ready_delay_reads: 0,
            shutdown_delay_reads: 0,
            nvm_limits: NvmLimitsConfig::default(),
            refuse_read_only_mappings: false,
        }
    }
}

/// The model's NVM Command Set size limits ([`ModelConfig::nvm_limits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmLimitsConfig {
    /// VSL: 2^VSL units of 4 KiB per Verify, the data and interleaved
    /// metadata (0: no limit).
    pub vsl: u8,
    /// WZSL: 2^WZSL units of 4 KiB per Write Zeroes (0: no limit).
    pub wzsl: u8,
    /// DMRL: ranges per Dataset Management (0: no limit).
    pub dmrl: u8,
    /// DMRSL: blocks per Dataset Management range (0: no limit).
    pub dmrsl: u32,
    /// DMSL: blocks in all ranges of a Dataset Management (0: no limit).
    pub dmsl: u64,
}

/// One namespace of the model (what Identify Namespace reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace identifier (1 ..= 0xFFFF_FFFD).
    pub nsid: u32,
    /// LBA data size in bytes (LBA Format 0, LBADS): 512 or 4096.
    pub lba_size: u32,
    /// NSZE / NCAP: size of the namespace in logical blocks.
    pub blocks: u64,
    /// Metadata bytes per block of the current LBA format (LBAF.MS): 0, 8,
    /// 16 or 64, the formats QEMU's nvme-ns offers.
    pub ms: u16,
    /// FLBAS bit 4: metadata at the end of each block's data (extended
    /// LBA); otherwise through MPTR.
    pub extended: bool,
    /// DPS bits 2:0: protection information type (0 none, 1–3).
    pub pi_type: u8,
    /// DPS bit 3: the PI tuple is the first 8 bytes of the metadata.
    pub pi_first: bool,
    /// ELBAF.PIF of the namespace's formats with 16 or more metadata bytes
    /// (reported with `ModelConfig::elbas`): 0 a 16-bit guard, 2 a 64-bit
    /// guard with a 48-bit reference tag (a 16-byte tuple).
    pub pif: u8,
    /// DPC, the protection capabilities reported: bits 2:0 PI Types 1–3,
    /// bit 3 PI in the first 8 metadata bytes, bit 4 in the last 8
    /// (default 0x1f, everything, as QEMU's nvme-ns).
    pub dpc: u8,
    /// MSSRL, the Copy limit of blocks per source range (Identify Namespace
    /// bytes 75:74; QEMU's nvme-ns `mssrl`, default 128).
    pub mssrl: u16,
    /// MCL, the Copy limit of blocks in all source ranges (bytes 79:76;
    /// QEMU's `mcl`, default 128).
    pub mcl: u32,
    /// MSRC, the Copy limit of source ranges, 0-based (byte 80; QEMU's
    /// `msrc`, default 127).
    pub msrc: u8,
    /// NGUID, the Namespace Globally Unique Identifier (bytes 119:104;
    /// default all zeros: not reported). A namespace deleted and created
    /// again under its NSID gets another one
    /// ([`ModelController::change_namespace`](super::ModelController::change_namespace)
    /// with a new value).
    pub nguid: [u8; 16],
}

impl NamespaceConfig {
    /// The LBA formats the model reports (Identify Namespace LBAF0..7), as
    /// QEMU's nvme-ns: (LBA size, MS).
    pub const LBA_FORMATS: [(u32, u16); 8] = [
        (512, 0),
        (512, 8),
        (512, 16),
        (512, 64),
        (4096, 0),
        (4096, 8),
        (4096, 16),
        (4096, 64),
    ];

    /// Bytes of the PI tuple: 8, or 16 with a 64-bit guard.
    pub fn pi_tuple_size(&self) -> usize {
        if self.pif == 2 { 16 } else { 8 }
    }

    /// The index of the current format in [`Self::LBA_FORMATS`].
    pub fn format_index(&self) -> Option<usize> {
        Self::LBA_FORMATS
            .iter()
            .position(|&(bs, ms)| bs == self.lba_size && ms == self.ms)
    }
}

impl Default for NamespaceConfig {
    /// Namespace 1, 4096-byte LBAs, 64 MiB.
    fn default() -> Self {
        NamespaceConfig {
            nsid: 1,
            lba_size: 4096,
            blocks: (64 << 20) / 4096,
            ms: 0,
            extended: false,
            pi_type: 0,
            pi_first: false,
            pif: 0,
            dpc: 0x1f,
            mssrl: 128,
            mcl: 128,
            msrc: 127,
            nguid: [0; 16],
        }
    }
}

//! Identify data structures (NVMe Base Specification 2.0, §5.17.2 "Identify
//! Data Structures": Identify Controller data structure (CNS 01h), Active
//! Namespace ID list (CNS 02h); NVM Command Set Specification 1.0, "Identify
//! Namespace data structure" (CNS 00h)).
//!
//! Parsers take the 4096-byte buffer the controller wrote and never panic:
//! a short buffer is a typed error, and any byte pattern of the right length
//! parses (fields are reported as the device wrote them; consumers validate
//! what they rely on, e.g. [`LbaFormat::lba_size`]).

use crate::bytes::{bytes, le16, le32, le64, le128, put, put_string, string, u8_at};
use core::fmt;

/// Size of every Identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;
/// Largest number of entries in an Active Namespace ID list (4096 / 4).
pub const MAX_NS_LIST: usize = 1024;
/// Largest number of LBA formats (NLBAF is 0-based, at most 63).
pub const MAX_LBA_FORMATS: usize = 64;

/// Errors from Identify parsers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentifyError {
    /// The buffer is shorter than the data structure.
    Short {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes supplied.
        got: usize,
    },
}

impl fmt::Display for IdentifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IdentifyError::Short { needed, got } => write!(
                f,
                "Identify data too short: {got} bytes, the structure is {needed} bytes"
            ),
        }
    }
}

impl std::error::Error for IdentifyError {}

fn need(buf: &[u8], needed: usize) -> Result<(), IdentifyError> {
    if buf.len() < needed {
        Err(IdentifyError::Short {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Identify Controller data structure (CNS 01h; Base 2.0 "Identify – Identify
/// Controller Data Structure"). Byte offsets are given per field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentifyController {
    /// VID, PCI Vendor ID (bytes 01:00).
    pub vid: u16,
    /// SSVID, PCI Subsystem Vendor ID (bytes 03:02).
    pub ssvid: u16,
    /// SN, Serial Number (bytes 23:04, ASCII).
    pub sn: String,
    /// MN, Model Number (bytes 63:24, ASCII).
    pub mn: String,
    /// FR, Firmware Revision (bytes 71:64, ASCII).
    pub fr: String,
    /// RAB, Recommended Arbitration Burst (byte 72).
    pub rab: u8,
    /// IEEE OUI Identifier (bytes 75:73).
    pub ieee: [u8; 3],
    /// CMIC, Controller Multi-Path I/O and Namespace Sharing Capabilities (byte 76).
    pub cmic: u8,
    /// MDTS, Maximum Data Transfer Size (byte 77): 2^MDTS units of CAP.MPSMIN;
    /// 0 = no limit. See [`crate::prp::max_transfer`].
    pub mdts: u8,
    /// CNTLID, Controller ID (bytes 79:78).
    pub cntlid: u16,
    /// VER, Version (bytes 83:80), same encoding as the VS register.
    pub ver: u32,
    /// RTD3R, RTD3 Resume Latency in microseconds (bytes 87:84).
    pub rtd3r: u32,
    /// RTD3E, RTD3 Entry Latency in microseconds (bytes 91:88): the expected
    /// time to reach CSTS.SHST = complete after a normal shutdown.
    pub rtd3e: u32,
    /// OAES, Optional Asynchronous Events Supported (bytes 95:92).
    pub oaes: u32,
    /// CTRATT, Controller Attributes (bytes 99:96).
    pub ctratt: u32,
    /// CNTRLTYPE, Controller Type (byte 111): 1 I/O, 2 discovery, 3 admin.
    pub cntrltype: u8,
    /// CRDT1..CRDT3, Command Retry Delay Times in 100 ms units (bytes 133:128).
    pub crdt: [u16; 3],
    /// OACS, Optional Admin Command Support (bytes 257:256).
    pub oacs: u16,
    /// ACL, Abort Command Limit, 0-based (byte 258).
    pub acl: u8,
    /// AERL, Asynchronous Event Request Limit, 0-based (byte 259).
    pub aerl: u8,
    /// FRMW, Firmware Updates (byte 260).
    pub frmw: u8,
    /// LPA, Log Page Attributes (byte 261).
    pub lpa: u8,
    /// ELPE, Error Log Page Entries, 0-based (byte 262).
    pub elpe: u8,
    /// NPSS, Number of Power States Support, 0-based (byte 263).
    pub npss: u8,
    /// WCTEMP, Warning Composite Temperature Threshold in kelvin (bytes 267:266).
    pub wctemp: u16,
    /// CCTEMP, Critical Composite Temperature Threshold in kelvin (bytes 269:268).
    pub cctemp: u16,
    /// TNVMCAP, Total NVM Capacity in bytes (bytes 295:280).
    pub tnvmcap: u128,
    /// UNVMCAP, Unallocated NVM Capacity in bytes (bytes 311:296).
    pub unvmcap: u128,
    /// KAS, Keep Alive Support, granularity in 100 ms units (bytes 321:320).
    pub kas: u16,
    /// SQES, Submission Queue Entry Size (byte 512): bits 3:0 required,
    /// bits 7:4 maximum, as powers of two.
    pub sqes: u8,
    /// CQES, Completion Queue Entry Size (byte 513), encoded like SQES.
    pub cqes: u8,
    /// MAXCMD, Maximum Outstanding Commands (bytes 515:514), 0 = not reported.
    pub maxcmd: u16,
    /// NN, Number of Namespaces: the largest valid NSID (bytes 519:516).
    pub nn: u32,
    /// ONCS, Optional NVM Command Support (bytes 521:520).
    pub oncs: u16,
    /// FUSES, Fused Operation Support (bytes 523:522).
    pub fuses: u16,
    /// FNA, Format NVM Attributes (byte 524).
    pub fna: u8,
    /// VWC, Volatile Write Cache (byte 525).
    pub vwc: u8,
    /// AWUN, Atomic Write Unit Normal, 0-based blocks (bytes 527:526).
    pub awun: u16,
    /// AWUPF, Atomic Write Unit Power Fail, 0-based blocks (bytes 529:528).
    pub awupf: u16,
    /// OCFS, Optional Copy Formats Supported (bytes 535:534): bit *n* set
    /// when Copy Descriptor Format *n*h is supported (0 from a controller
    /// that does not report it).
    pub ocfs: u16,
    /// SGLS, SGL Support (bytes 539:536).
    pub sgls: u32,
    /// SUBNQN, NVM Subsystem NVMe Qualified Name (bytes 1023:768, UTF-8).
    pub subnqn: String,
}

impl IdentifyController {
    /// Parses the 4096-byte Identify Controller data structure.
    pub fn parse(buf: &[u8]) -> Result<Self, IdentifyError> {
        need(buf, IDENTIFY_SIZE)?;
        Ok(IdentifyController {
            vid: le16(buf, 0),
            ssvid: le16(buf, 2),
            sn: string(buf, 4, 20),
            mn: string(buf, 24, 40),
            fr: string(buf, 64, 8),
            rab: u8_at(buf, 72),
            ieee: bytes(buf, 73),
            cmic: u8_at(buf, 76),
            mdts: u8_at(buf, 77),
            cntlid: le16(buf, 78),
            ver: le32(buf, 80),
            rtd3r: le32(buf, 84),
            rtd3e: le32(buf, 88),
            oaes: le32(buf, 92),
            ctratt: le32(buf, 96),
            cntrltype: u8_at(buf, 111),
            crdt: [le16(buf, 128), le16(buf, 130), le16(buf, 132)],
            oacs: le16(buf, 256),
            acl: u8_at(buf, 258),
            aerl: u8_at(buf, 259),
            frmw: u8_at(buf, 260),
            lpa: u8_at(buf, 261),
            elpe: u8_at(buf, 262),
            npss: u8_at(buf, 263),
            wctemp: le16(buf, 266),
            cctemp: le16(buf, 268),
            tnvmcap: le128(buf, 280),
            unvmcap: le128(buf, 296),
            kas: le16(buf, 320),
            sqes: u8_at(buf, 512),
            cqes: u8_at(buf, 513),
            maxcmd: le16(buf, 514),
            nn: le32(buf, 516),
            oncs: le16(buf, 520),
            fuses: le16(buf, 522),
            fna: u8_at(buf, 524),
            vwc: u8_at(buf, 525),
            awun: le16(buf, 526),
            awupf: le16(buf, 528),
            ocfs: le16(buf, 534),
            sgls: le32(buf, 536),
            subnqn: string(buf, 768, 256),
        })
    }

    /// When a command that failed with `status` may be sent again (NVMe 2.0
    /// "Command Retry Delay"): `None` when it must not be retried as it is —
    /// DNR (Do Not Retry) is set, or it did not fail — else the delay the
    /// completion's CRD field asks for: none for CRD 0, CRDT1..CRDT3 × 100 ms
    /// for CRD 1..3.
    ///
    /// A controller reports CRD other than 0 only after the host set ACRE
    /// (Advanced Command Retry Enable) in the Host Behavior Support feature
    /// (FID 16h); without it every retryable failure says "at once".
    pub fn retry_delay(&self, status: crate::Status) -> Option<core::time::Duration> {
        if status.is_success() || status.dnr() {
            return None;
        }
        let units = match status.crd() {
            0 => 0,
            n => self.crdt[usize::from(n - 1)],
        };
        Some(core::time::Duration::from_millis(u64::from(units) * 100))
    }

    /// Encodes the structure into 4096 bytes (the inverse of
    /// [`IdentifyController::parse`] for the fields modelled; used by
    /// controller models). Strings are space padded, SUBNQN NUL padded.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        put(&mut b, 0, &self.vid.to_le_bytes());
        put(&mut b, 2, &self.ssvid.to_le_bytes());
        put_string(&mut b, 4, 20, &self.sn, b' ');
        put_string(&mut b, 24, 40, &self.mn, b' ');
        put_string(&mut b, 64, 8, &self.fr, b' ');
        b[72] = self.rab;
        put(&mut b, 73, &self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put(&mut b, 78, &self.cntlid.to_le_bytes());
        put(&mut b, 80, &self.ver.to_le_bytes());
        put(&mut b, 84, &self.rtd3r.to_le_bytes());
        put(&mut b, 88, &self.rtd3e.to_le_bytes());
        put(&mut b, 92, &self.oaes.to_le_bytes());
        put(&mut b, 96, &self.ctratt.to_le_bytes());
        b[111] = self.cntrltype;
        for (i, t) in self.crdt.iter().enumerate() {
            put(&mut b, 128 + 2 * i, &t.to_le_bytes());
        }
        put(&mut b, 256, &self.oacs.to_le_bytes());
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        b[263] = self.npss;
        put(&mut b, 266, &self.wctemp.to_le_bytes());
        put(&mut b, 268, &self.cctemp.to_le_bytes());
        put(&mut b, 280, &self.tnvmcap.to_le_bytes());
        put(&mut b, 296, &self.unvmcap.to_le_bytes());
        put(&mut b, 320, &self.kas.to_le_bytes());
        b[512] = self.sqes;
        b[513] = self.cqes;
        put(&mut b, 514, &self.maxcmd.to_le_bytes());
        put(&mut b, 516, &self.nn.to_le_bytes());
        put(&mut b, 520, &self.oncs.to_le_bytes());
        put(&mut b, 522, &self.fuses.to_le_bytes());
        b[524] = self.fna;
        b[525] = self.vwc;
        put(&mut b, 526, &self.awun.to_le_bytes());
        put(&mut b, 528, &self.awupf.to_le_bytes());
        put(&mut b, 536, &self.sgls.to_le_bytes());
        put_string(&mut b, 768, 256, &self.subnqn, 0);
        b
    }

    /// LPA bit 2, Extended Data for Get Log Page: the controller takes the
    /// Log Page Offset (LPOL/LPOU) and the upper Number of Dwords bits
    /// (NUMDL bits 31:28, NUMDU). Without it, NUMD is CDW10 bits 27:16
    /// (at most 4096 dwords) and the offset does not exist.
    pub fn lpa_extended_data(&self) -> bool {
        self.lpa & (1 << 2) != 0
    }

    /// CTRATT bit 15, Extended LBA Formats Supported (ELBAS): the
    /// controller has LBA formats with 32- or 64-bit guards or storage tags
    /// (reported by CNS 05h) once the host sets Host Behavior Support LBAFEE.
    pub fn ctratt_elbas(&self) -> bool {
        self.ctratt & (1 << 15) != 0
    }

    /// OAES bit 8: the controller sends Namespace Attribute Notices (an
    /// asynchronous event, Notice 00h, when a namespace's Identify data
    /// changes or it is attached or detached), once Asynchronous Event
    /// Configuration bit 8 enables them.
    pub fn oaes_namespace_attribute_notices(&self) -> bool {
        self.oaes & (1 << 8) != 0
    }

    /// OACS bit 8: the Doorbell Buffer Config command is supported.
    pub fn oacs_doorbell_buffer_config(&self) -> bool {
        self.oacs & (1 << 8) != 0
    }

    /// OACS bit 3: Namespace Management and Attachment are supported.
    pub fn oacs_namespace_management(&self) -> bool {
        self.oacs & (1 << 3) != 0
    }

    /// ONCS bit 0: the Compare command is supported.
    pub fn oncs_compare(&self) -> bool {
        self.oncs & 1 != 0
    }

    /// ONCS bit 1: the Write Uncorrectable command is supported.
    pub fn oncs_write_uncorrectable(&self) -> bool {
        self.oncs & (1 << 1) != 0
    }

    /// ONCS bit 2: the Dataset Management command is supported.
    pub fn oncs_dsm(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }

    /// ONCS bit 3: the Write Zeroes command is supported.
    pub fn oncs_write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }

    /// ONCS bit 4: the Save field of Set Features and Select field of Get
    /// Features are supported.
    pub fn oncs_save_select(&self) -> bool {
        self.oncs & (1 << 4) != 0
    }

    /// VWC bit 0: a volatile write cache is present (Flush is meaningful).
    pub fn vwc_present(&self) -> bool {
        self.vwc & 1 != 0
    }

    /// SQES bits 3:0, the required (minimum) SQ entry size as a power of two.
    pub fn sqes_min(&self) -> u8 {
        self.sqes & 0xf
    }

    /// CQES bits 3:0, the required (minimum) CQ entry size as a power of two.
    pub fn cqes_min(&self) -> u8 {
        self.cqes & 0xf
    }

    /// The version as a [`crate::Vs`] (0.0.0 when the controller does not report it).
    pub fn version(&self) -> crate::regs::Vs {
        crate::regs::Vs(self.ver)
    }
}

/// The I/O Command Set specific Identify Controller data structure for the
/// NVM Command Set (Identify CNS 06h, CSI 00h): the per-command size
/// limits. Every field's 0h means "no limit" (beyond MDTS for the transfer
/// limits, 256 ranges for DMRL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentifyControllerNvm {
    /// VSL (byte 0): Verify Size Limit, 2^VSL units of CAP.MPSMIN.
    pub vsl: u8,
    /// WZSL (byte 1): Write Zeroes Size Limit, 2^WZSL units of CAP.MPSMIN.
    pub wzsl: u8,
    /// WUSL (byte 2): Write Uncorrectable Size Limit, 2^WUSL units of
    /// CAP.MPSMIN.
    pub wusl: u8,
    /// DMRL (byte 3): Dataset Management Ranges Limit, ranges per command.
    pub dmrl: u8,
    /// DMRSL (bytes 7:4): Dataset Management Range Size Limit, logical
    /// blocks per range.
    pub dmrsl: u32,
    /// DMSL (bytes 15:8): Dataset Management Size Limit, logical blocks in
    /// all ranges of a command.
    pub dmsl: u64,
}

impl IdentifyControllerNvm {
    /// Parses the first 16 bytes of the structure (a shorter buffer reads
    /// as zeros: no limits).
    pub fn parse(buf: &[u8]) -> IdentifyControllerNvm {
        let mut b = [0u8; 16];
        let n = buf.len().min(16);
        b[..n].copy_from_slice(&buf[..n]);
        IdentifyControllerNvm {
            vsl: b[0],
            wzsl: b[1],
            wusl: b[2],
            dmrl: b[3],
            dmrsl: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            dmsl: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    /// A size limit field (VSL, WZSL, WUSL) in bytes for a controller
    /// whose minimum memory page size is `min_page`; `None` for 0h (no
    /// limit) or a limit beyond `u64`.
    pub fn size_limit_bytes(field: u8, min_page: usize) -> Option<u64> {
        match field {
            0 => None,
            n => 1u64
                .checked_shl(u32::from(n))
                .and_then(|units| units.checked_mul(min_page as u64)),
        }
    }
}

/// One LBA Format Data Structure (NVM Command Set "LBA Format Data
/// Structure"): a dword with MS (bits 15:0), LBADS (bits 23:16), RP (bits 25:24).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbaFormat {
    /// MS, Metadata Size in bytes per LBA.
    pub ms: u16,
    /// LBADS, LBA Data Size as a power of two.
    pub lbads: u8,
    /// RP, Relative Performance (0 best .. 3 degraded).
    pub rp: u8,
}

impl LbaFormat {
    /// Decodes an LBA Format dword.
    pub fn from_dword(dw: u32) -> LbaFormat {
        LbaFormat {
            ms: dw as u16,
            lbads: (dw >> 16) as u8,
            rp: ((dw >> 24) & 0x3) as u8,
        }
    }

    /// Encodes the LBA Format dword.
    pub fn to_dword(&self) -> u32 {
        u32::from(self.ms) | (u32::from(self.lbads) << 16) | ((u32::from(self.rp) & 3) << 24)
    }

    /// The LBA data size `2^LBADS` in bytes, or `None` if LBADS is outside
    /// 9..=31: the specification requires at least 512 bytes, and LBADS 0
    /// marks a format that is not supported. A namespace whose current format
    /// has no size is unusable.
    pub fn lba_size(&self) -> Option<u32> {
        if (9..=31).contains(&self.lbads) {
            Some(1u32 << self.lbads)
        } else {
            None
        }
    }
}

/// Identify Namespace data structure for the NVM Command Set (CNS 00h; NVM
/// Command Set Specification 1.0 "Identify Namespace Data Structure").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// NSZE, Namespace Size in logical blocks (bytes 07:00).
    pub nsze: u64,
    /// NCAP, Namespace Capacity in logical blocks (bytes 15:08).
    pub ncap: u64,
    /// NUSE, Namespace Utilization in logical blocks (bytes 23:16).
    pub nuse: u64,
    /// NSFEAT, Namespace Features (byte 24).
    pub nsfeat: u8,
    /// NLBAF, Number of LBA Formats, 0-based (byte 25).
    pub nlbaf: u8,
    /// FLBAS, Formatted LBA Size (byte 26): bits 3:0 low index bits, bit 4
    /// metadata at end of LBA (extended), bits 6:5 high index bits.
    pub flbas: u8,
    /// MC, Metadata Capabilities (byte 27).
    pub mc: u8,
    /// DPC, End-to-end Data Protection Capabilities (byte 28).
    pub dpc: u8,
    /// DPS, End-to-end Data Protection Type Settings (byte 29).
    pub dps: u8,
    /// NMIC, Namespace Multi-path I/O and Namespace Sharing Capabilities (byte 30).
    pub nmic: u8,
    /// RESCAP, Reservation Capabilities (byte 31).
    pub rescap: u8,
    /// FPI, Format Progress Indicator (byte 32).
    pub fpi: u8,
    /// DLFEAT, Deallocate Logical Block Features (byte 33). See
    /// [`IdentifyNamespace::dlfeat_read_value`].
    pub dlfeat: u8,
    /// NAWUN, Namespace Atomic Write Unit Normal, 0-based (bytes 35:34).
    pub nawun: u16,
    /// NAWUPF, Namespace Atomic Write Unit Power Fail, 0-based (bytes 37:36).
    pub nawupf: u16,
    /// NACWU, Namespace Atomic Compare & Write Unit, 0-based (bytes 39:38).
    pub nacwu: u16,
    /// NABSN, Namespace Atomic Boundary Size Normal, 0-based (bytes 41:40).
    pub nabsn: u16,
    /// NABO, Namespace Atomic Boundary Offset (bytes 43:42).
    pub nabo: u16,
    /// NABSPF, Namespace Atomic Boundary Size Power Fail, 0-based (bytes 45:44).
    pub nabspf: u16,
    /// NOIOB, Namespace Optimal I/O Boundary in logical blocks (bytes 47:46).
    pub noiob: u16,
    /// NVMCAP, NVM Capacity in bytes (bytes 63:48).
    pub nvmcap: u128,
    /// MSSRL, Maximum Single Source Range Length (bytes 75:74): logical
    /// blocks one Copy source range may cover (non-zero when the
    /// controller supports Copy).
    pub mssrl: u16,
    /// MCL, Maximum Copy Length (bytes 79:76): logical blocks one Copy may
    /// cover in all its source ranges (non-zero when the controller
    /// supports Copy).
    pub mcl: u32,
    /// MSRC, Maximum Source Range Count, 0-based (byte 80): source ranges
    /// one Copy may carry.
    pub msrc: u8,
    /// NULBAF, Number of Unique Capability LBA Formats (byte 82; NVM
    /// Command Set, from TP 4095 Namespace Capability Reporting): LBA
    /// formats beyond the NLBAF + 1 general ones, listed right after them —
    /// the valid indices are 0..=NLBAF + NULBAF.
    pub nulbaf: u8,
    /// NGUID, Namespace Globally Unique Identifier (bytes 119:104).
    pub nguid: [u8; 16],
    /// EUI64, IEEE Extended Unique Identifier (bytes 127:120).
    pub eui64: [u8; 8],
    /// LBAF0..LBAFn, LBA Format support (4 bytes each from byte 128):
    /// `nlbaf + 1 + nulbaf` entries, at most 64.
    pub lbaf: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Parses the 4096-byte Identify Namespace data structure.
    pub fn parse(buf: &[u8]) -> Result<Self, IdentifyError> {
        need(buf, IDENTIFY_SIZE)?;
        let nlbaf = u8_at(buf, 25);
        let nulbaf = u8_at(buf, 82);
        let count = (usize::from(nlbaf) + 1 + usize::from(nulbaf)).min(MAX_LBA_FORMATS);
        let lbaf = (0..count)
            .map(|i| LbaFormat::from_dword(le32(buf, 128 + 4 * i)))
            .collect();
        Ok(IdentifyNamespace {
            nsze: le64(buf, 0),
            ncap: le64(buf, 8),
            nuse: le64(buf, 16),
            nsfeat: u8_at(buf, 24),
            nlbaf,
            flbas: u8_at(buf, 26),
            mc: u8_at(buf, 27),
            dpc: u8_at(buf, 28),
            dps: u8_at(buf, 29),
            nmic: u8_at(buf, 30),
            rescap: u8_at(buf, 31),
            fpi: u8_at(buf, 32),
            dlfeat: u8_at(buf, 33),
            nawun: le16(buf, 34),
            nawupf: le16(buf, 36),
            nacwu: le16(buf, 38),
            nabsn: le16(buf, 40),
            nabo: le16(buf, 42),
            nabspf: le16(buf, 44),
            noiob: le16(buf, 46),
            nvmcap: le128(buf, 48),
            mssrl: le16(buf, 74),
            mcl: le32(buf, 76),
            msrc: u8_at(buf, 80),
            nulbaf,
            nguid: bytes(buf, 104),
            eui64: bytes(buf, 120),
            lbaf,
        })
    }

    /// Encodes the structure into 4096 bytes (inverse of
    /// [`IdentifyNamespace::parse`] for the fields modelled; at most 64
    /// LBA formats are written).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        put(&mut b, 0, &self.nsze.to_le_bytes());
        put(&mut b, 8, &self.ncap.to_le_bytes());
        put(&mut b, 16, &self.nuse.to_le_bytes());
        b[24] = self.nsfeat;
        b[25] = self.nlbaf;
        b[26] = self.flbas;
        b[27] = self.mc;
        b[28] = self.dpc;
        b[29] = self.dps;
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[32] = self.fpi;
        b[33] = self.dlfeat;
        put(&mut b, 34, &self.nawun.to_le_bytes());
        put(&mut b, 36, &self.nawupf.to_le_bytes());
        put(&mut b, 38, &self.nacwu.to_le_bytes());
        put(&mut b, 40, &self.nabsn.to_le_bytes());
        put(&mut b, 42, &self.nabo.to_le_bytes());
        put(&mut b, 44, &self.nabspf.to_le_bytes());
        put(&mut b, 46, &self.noiob.to_le_bytes());
        put(&mut b, 48, &self.nvmcap.to_le_bytes());
        put(&mut b, 74, &self.mssrl.to_le_bytes());
        put(&mut b, 76, &self.mcl.to_le_bytes());
        b[80] = self.msrc;
        b[82] = self.nulbaf;
        put(&mut b, 104, &self.nguid);
        put(&mut b, 120, &self.eui64);
        for (i, f) in self.lbaf.iter().take(MAX_LBA_FORMATS).enumerate() {
            put(&mut b, 128 + 4 * i, &f.to_dword().to_le_bytes());
        }
        b
    }

    /// Index of the LBA format in use: FLBAS bits 3:0, extended by bits 6:5
    /// as the two most significant bits when more than 16 formats exist.
    ///
    /// With 16 formats or fewer (NLBAF + 1 + NULBAF <= 16) bits 6:5 are
    /// ignored: the NVM Command Set specification tells the host to ignore
    /// them then (they were reserved before NVMe 2.0), so a controller that
    /// leaves something in them still names the format its bits 3:0 give.
    /// (The specification's own condition, NLBAF <= 16, is off by one for
    /// a 0-based count: with NLBAF 16 the seventeenth format, index 16,
    /// needs bit 5, so the count of formats decides here.)
    pub fn current_lba_format_index(&self) -> usize {
        let low = usize::from(self.flbas & 0xf);
        if self.lba_format_count() <= 16 {
            return low;
        }
        low | (usize::from((self.flbas >> 5) & 0x3) << 4)
    }

    /// The LBA format in use, or `None` if FLBAS selects a format beyond
    /// NLBAF + NULBAF.
    pub fn current_lba_format(&self) -> Option<LbaFormat> {
        self.lbaf.get(self.current_lba_format_index()).copied()
    }

    /// How many LBA formats the namespace lists: NLBAF + 1 + NULBAF, at most 64.
    pub fn lba_format_count(&self) -> usize {
        (usize::from(self.nlbaf) + 1 + usize::from(self.nulbaf)).min(MAX_LBA_FORMATS)
    }

    /// The fields that count the LBA formats, for messages: `NLBAF n`, and
    /// `, NULBAF m` when there are unique capability formats.
    pub fn lba_format_fields(&self) -> String {
        match self.nulbaf {
            0 => format!("NLBAF {}", self.nlbaf),
            u => format!("NLBAF {}, NULBAF {u}", self.nlbaf),
        }
    }

    /// The logical block size in bytes, or `None` if the current format is
    /// invalid (the namespace is unusable).
    pub fn lba_size(&self) -> Option<u32> {
        self.current_lba_format().and_then(|f| f.lba_size())
    }

    /// Metadata bytes per logical block in the current format (0 if none or invalid).
    pub fn metadata_size(&self) -> u16 {
        self.current_lba_format().map_or(0, |f| f.ms)
    }

    /// FLBAS bit 4: metadata is transferred at the end of each logical block
    /// (extended LBA) rather than in a separate buffer.
    pub fn metadata_extended(&self) -> bool {
        self.flbas & (1 << 4) != 0
    }

    /// True for an active namespace (NSZE != 0; an inactive NSID returns a
    /// zero-filled structure).
    pub fn is_active(&self) -> bool {
        self.nsze != 0
    }

    /// DLFEAT bits 2:0: what reading a deallocated block returns — 0 not
    /// reported, 1 all bytes 00h, 2 all bytes FFh.
    pub fn dlfeat_read_value(&self) -> u8 {
        self.dlfeat & 0x7
    }

    /// DLFEAT bit 3: Write Zeroes with DEAC set deallocates the blocks.
    pub fn dlfeat_write_zeroes_deallocates(&self) -> bool {
        self.dlfeat & (1 << 3) != 0
    }

    /// Namespace capacity in bytes (`NSZE * lba_size`), if the format is valid
    /// and the product fits.
    pub fn size_bytes(&self) -> Option<u64> {
        self.lba_size()
            .and_then(|s| self.nsze.checked_mul(u64::from(s)))
    }
}

/// Parses an Active Namespace ID list (CNS 02h): little-endian NSIDs in
/// increasing order, terminated by the first 0 entry or the end of the
/// 4096-byte list (at most 1024). A trailing partial entry is ignored.
pub fn parse_ns_list(buf: &[u8]) -> Vec<u32> {
    buf.chunks_exact(4)
        .take(MAX_NS_LIST)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&id| id != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_follows_dnr_and_crd() {
        use crate::Status;
        use core::time::Duration;
        let c = IdentifyController {
            crdt: [5, 0, 65535],
            ..Default::default()
        };
        let failed = Status::new(0, 0x04); // Data Transfer Error
        assert_eq!(c.retry_delay(failed), Some(Duration::ZERO));
        assert_eq!(c.retry_delay(failed.with_dnr(true)), None);
        assert_eq!(c.retry_delay(Status::SUCCESS), None);
        let crd = |n: u16| Status(failed.0 | n << 11);
        assert_eq!(c.retry_delay(crd(1)), Some(Duration::from_millis(500)));
        assert_eq!(c.retry_delay(crd(2)), Some(Duration::ZERO));
        assert_eq!(
            c.retry_delay(crd(3)),
            Some(Duration::from_millis(6_553_500))
        );
        // DNR wins over CRD.
        assert_eq!(c.retry_delay(crd(1).with_dnr(true)), None);
    }

    #[test]
    fn nvm_controller_limits_parse_at_their_offsets() {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0] = 7; // VSL
        b[1] = 8; // WZSL
        b[2] = 9; // WUSL
        b[3] = 128; // DMRL
        b[4..8].copy_from_slice(&0x0007_ffffu32.to_le_bytes()); // DMRSL
        b[8..16].copy_from_slice(&0x1234_5678_9abcu64.to_le_bytes()); // DMSL
        let n = IdentifyControllerNvm::parse(&b);
        assert_eq!((n.vsl, n.wzsl, n.wusl, n.dmrl), (7, 8, 9, 128));
        assert_eq!((n.dmrsl, n.dmsl), (0x7ffff, 0x1234_5678_9abc));
        assert_eq!(
            IdentifyControllerNvm::parse(&[]),
            IdentifyControllerNvm::default()
        );
        assert_eq!(IdentifyControllerNvm::size_limit_bytes(0, 4096), None);
        assert_eq!(
            IdentifyControllerNvm::size_limit_bytes(7, 4096),
            Some(512 * 1024)
        );
        assert_eq!(IdentifyControllerNvm::size_limit_bytes(60, 4096), None);
        assert_eq!(IdentifyControllerNvm::size_limit_bytes(255, 4096), None);
    }

    fn ctrl_buf() -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..2].copy_from_slice(&0x1b36u16.to_le_bytes()); // VID @0
        b[2..4].copy_from_slice(&0x1af4u16.to_le_bytes()); // SSVID @2
        b[4..24].copy_from_slice(b"deadbeef            "); // SN @4..24
        let mut mn = [b' '; 40];
        mn[..15].copy_from_slice(b"QEMU NVMe Ctrl ");
        b[24..64].copy_from_slice(&mn); // MN @24..64
        b[64..72].copy_from_slice(b"8.2.0\0\0\0"); // FR @64..72, NUL padded
        b[72] = 6; // RAB
        b[73..76].copy_from_slice(&[0x00, 0x54, 0x52]); // IEEE
        b[77] = 7; // MDTS @77
        b[78..80].copy_from_slice(&0x0042u16.to_le_bytes()); // CNTLID @78
        b[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes()); // VER @80
        b[88..92].copy_from_slice(&1_000_000u32.to_le_bytes()); // RTD3E @88
        b[128..130].copy_from_slice(&5u16.to_le_bytes()); // CRDT1 @128
        b[256..258].copy_from_slice(&0x012au16.to_le_bytes()); // OACS @256 (bit 8 DBBC)
        b[258] = 3; // ACL
        b[259] = 3; // AERL
        b[262] = 63; // ELPE
        b[266..268].copy_from_slice(&343u16.to_le_bytes()); // WCTEMP @266
        b[268..270].copy_from_slice(&373u16.to_le_bytes()); // CCTEMP @268
        b[280..296].copy_from_slice(&(1u128 << 40).to_le_bytes()); // TNVMCAP @280
        b[512] = 0x66; // SQES @512
        b[513] = 0x44; // CQES @513
        b[516..520].copy_from_slice(&256u32.to_le_bytes()); // NN @516
        b[520..522].copy_from_slice(&0x015du16.to_le_bytes()); // ONCS @520
        b[525] = 0x07; // VWC @525
        b[536..540].copy_from_slice(&0x0010_0001u32.to_le_bytes()); // SGLS @536
        let nqn = b"nqn.2019-08.org.qemu:deadbeef";
        b[768..768 + nqn.len()].copy_from_slice(nqn); // SUBNQN @768
        b
    }

    #[test]
    fn controller_fields_at_spec_offsets() {
        let c = IdentifyController::parse(&ctrl_buf()).unwrap();
        assert_eq!(c.vid, 0x1b36);
        assert_eq!(c.ssvid, 0x1af4);
        assert_eq!(c.sn, "deadbeef");
        assert_eq!(c.mn, "QEMU NVMe Ctrl");
        assert_eq!(c.fr, "8.2.0");
        assert_eq!(c.rab, 6);
        assert_eq!(c.ieee, [0x00, 0x54, 0x52]);
        assert_eq!(c.mdts, 7);
        assert_eq!(c.cntlid, 0x42);
        assert_eq!(c.version().to_string(), "1.4.0");
        assert_eq!(c.rtd3e, 1_000_000);
        assert_eq!(c.crdt, [5, 0, 0]);
        assert!(c.oacs_doorbell_buffer_config());
        assert!(c.oacs_namespace_management());
        assert_eq!(c.acl, 3);
        assert_eq!(c.aerl, 3);
        assert_eq!(c.elpe, 63);
        assert_eq!((c.wctemp, c.cctemp), (343, 373));
        assert_eq!(c.tnvmcap, 1 << 40);
        assert_eq!((c.sqes_min(), c.cqes_min()), (6, 4));
        assert_eq!(c.nn, 256);
        assert!(c.oncs_compare());
        assert!(c.oncs_dsm());
        assert!(c.oncs_write_zeroes());
        assert!(c.oncs_save_select());
        assert!(!c.oncs_write_uncorrectable());
        assert!(c.vwc_present());
        assert_eq!(c.sgls, 0x0010_0001);
        assert_eq!(c.subnqn, "nqn.2019-08.org.qemu:deadbeef");
    }

    #[test]
    fn controller_roundtrip() {
        let c = IdentifyController::parse(&ctrl_buf()).unwrap();
        let again = IdentifyController::parse(&c.to_bytes()).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn short_and_garbage() {
        assert_eq!(
            IdentifyController::parse(&[0u8; 100]),
            Err(IdentifyError::Short {
                needed: 4096,
                got: 100
            })
        );
        assert!(IdentifyNamespace::parse(&[]).is_err());
        let junk = vec![0xffu8; IDENTIFY_SIZE];
        let c = IdentifyController::parse(&junk).unwrap();
        assert_eq!(c.sn, "\u{fffd}".repeat(20));
        let ns = IdentifyNamespace::parse(&junk).unwrap();
        assert_eq!(ns.lbaf.len(), 64);
        // FLBAS 0xff selects format 0x3f = 63 <= nlbaf 255; LBADS 0xff invalid.
        assert_eq!(ns.lba_size(), None);
        assert_eq!(ns.size_bytes(), None);
        let msg = IdentifyError::Short { needed: 1, got: 0 }.to_string();
        assert!(msg.contains("too short"));
    }

    fn ns_buf() -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..8].copy_from_slice(&0x20_0000u64.to_le_bytes()); // NSZE @0
        b[8..16].copy_from_slice(&0x20_0000u64.to_le_bytes()); // NCAP @8
        b[16..24].copy_from_slice(&0x1000u64.to_le_bytes()); // NUSE @16
        b[24] = 0x14; // NSFEAT @24
        b[25] = 7; // NLBAF @25 (8 formats)
        b[26] = 0x04; // FLBAS @26 -> format 4
        b[33] = 0x09; // DLFEAT @33: reads zeroes, WZ deallocates
        b[34..36].copy_from_slice(&7u16.to_le_bytes()); // NAWUN @34
        b[46..48].copy_from_slice(&32u16.to_le_bytes()); // NOIOB @46
        b[74..76].copy_from_slice(&100u16.to_le_bytes()); // MSSRL @74
        b[76..80].copy_from_slice(&0x1_0000u32.to_le_bytes()); // MCL @76
        b[80] = 15; // MSRC @80 (16 ranges)
        b[104..120].copy_from_slice(&[0xab; 16]); // NGUID @104
        b[120..128].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]); // EUI64 @120
        // LBAF0 @128: 512 B, LBAF4 @144: 4096 B with 8 B metadata.
        b[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        b[144..148].copy_from_slice(&(8 | (12u32 << 16) | (1 << 24)).to_le_bytes());
        b
    }

    #[test]
    fn namespace_fields_at_spec_offsets() {
        let ns = IdentifyNamespace::parse(&ns_buf()).unwrap();
        assert_eq!(ns.nsze, 0x20_0000);
        assert_eq!(ns.ncap, 0x20_0000);
        assert_eq!(ns.nuse, 0x1000);
        assert_eq!(ns.nsfeat, 0x14);
        assert_eq!(ns.nlbaf, 7);
        assert_eq!(ns.lbaf.len(), 8);
        assert_eq!(ns.nawun, 7);
        assert_eq!(ns.noiob, 32);
        assert_eq!((ns.mssrl, ns.mcl, ns.msrc), (100, 0x1_0000, 15));
        assert_eq!(ns.nguid, [0xab; 16]);
        assert_eq!(ns.eui64, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ns.current_lba_format_index(), 4);
        assert_eq!(
            ns.current_lba_format(),
            Some(LbaFormat {
                ms: 8,
                lbads: 12,
                rp: 1
            })
        );
        assert_eq!(ns.lba_size(), Some(4096));
        assert_eq!(ns.metadata_size(), 8);
        assert!(!ns.metadata_extended());
        assert!(ns.is_active());
        assert_eq!(ns.dlfeat_read_value(), 1);
        assert!(ns.dlfeat_write_zeroes_deallocates());
        assert_eq!(ns.size_bytes(), Some(0x20_0000 * 4096));
        assert_eq!(ns.lbaf[0].lba_size(), Some(512));
        assert_eq!(IdentifyNamespace::parse(&ns.to_bytes()).unwrap(), ns);
    }

    /// NULBAF (byte 82): LBA formats beyond NLBAF + 1 are listed after the
    /// general ones and valid (a review: a namespace formatted with one
    /// was reported unusable, and Format NVM refused its index).
    #[test]
    fn nulbaf_formats_are_valid_formats() {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        b[0..8].copy_from_slice(&0x1000u64.to_le_bytes()); // NSZE
        b[25] = 3; // NLBAF: formats 0..=3
        b[82] = 2; // NULBAF: formats 4 and 5 too
        b[26] = 4; // FLBAS: formatted with format 4
        b[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes()); // LBAF0: 512 B
        b[144..148].copy_from_slice(&(12u32 << 16).to_le_bytes()); // LBAF4: 4096 B
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.nulbaf, 2);
        assert_eq!(ns.lbaf.len(), 6);
        assert_eq!(ns.lba_format_count(), 6);
        assert_eq!(ns.lba_size(), Some(4096));
        assert_eq!(ns.lba_format_fields(), "NLBAF 3, NULBAF 2");
        assert_eq!(IdentifyNamespace::parse(&ns.to_bytes()).unwrap(), ns);
        // Index 6 is beyond both counts.
        b[26] = 6;
        assert_eq!(IdentifyNamespace::parse(&b).unwrap().lba_size(), None);
        // Without NULBAF, format 4 is beyond NLBAF, as before.
        b[26] = 4;
        b[82] = 0;
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!((ns.lbaf.len(), ns.lba_size()), (4, None));
        assert_eq!(ns.lba_format_fields(), "NLBAF 3");
    }

    #[test]
    fn flbas_high_bits_and_bounds() {
        let mut b = ns_buf();
        b[25] = 20; // 21 formats
        b[26] = 0x20 | 0x02; // index 0b01_0010 = 18
        b[128 + 4 * 18..128 + 4 * 19].copy_from_slice(&(9u32 << 16).to_le_bytes());
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.current_lba_format_index(), 18);
        assert_eq!(ns.lba_size(), Some(512));
        // NLBAF 16 (seventeen formats): index 16 needs bit 5.
        b[25] = 16;
        b[26] = 0x20;
        b[128 + 4 * 16..128 + 4 * 17].copy_from_slice(&(12u32 << 16).to_le_bytes());
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.current_lba_format_index(), 16);
        assert_eq!(ns.lba_size(), Some(4096));
        // FLBAS beyond NLBAF: no format.
        b[25] = 3;
        b[26] = 0x05;
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.current_lba_format(), None);
        assert_eq!(ns.metadata_size(), 0);
        // Inactive namespace: all zeroes; LBADS 0 is not a valid format.
        let z = IdentifyNamespace::parse(&[0u8; IDENTIFY_SIZE]).unwrap();
        assert!(!z.is_active());
        assert_eq!(z.lba_size(), None);
    }

    /// With 16 LBA formats or fewer, FLBAS bits 6:5 are ignored (the
    /// specification says the host should; a review found a namespace of 8
    /// formats with bit 5 set reported unusable, "format 20 beyond the 8
    /// it has"); with NULBAF taking the count above 16 they count again.
    #[test]
    fn flbas_bits_6_5_are_ignored_with_16_formats_or_fewer() {
        let mut b = ns_buf(); // 8 formats, format 4 is 4 KiB with 8 B metadata
        b[26] = 0x60 | 0x10 | 0x04; // bits 6:5 set, extended LBA, index 4
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.current_lba_format_index(), 4);
        assert_eq!(ns.lba_size(), Some(4096));
        assert!(ns.metadata_extended());
        // Exactly 16 formats: still 4 bits.
        b[25] = 15;
        assert_eq!(
            IdentifyNamespace::parse(&b)
                .unwrap()
                .current_lba_format_index(),
            4
        );
        // 15 general formats and 2 unique ones (17 in all): bits 6:5 count.
        b[25] = 14;
        b[82] = 2;
        b[26] = 0x20; // index 16: bit 5 set, bits 3:0 clear
        b[128 + 4 * 16..128 + 4 * 17].copy_from_slice(&(9u32 << 16).to_le_bytes());
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.lba_format_count(), 17);
        assert_eq!(ns.current_lba_format_index(), 16);
        assert_eq!(ns.lba_size(), Some(512));
    }

    #[test]
    fn lba_format_validity() {
        assert_eq!(LbaFormat::from_dword(8 << 16).lba_size(), None);
        assert_eq!(LbaFormat::from_dword(31 << 16).lba_size(), Some(1 << 31));
        assert_eq!(LbaFormat::from_dword(32 << 16).lba_size(), None);
        // LBADS 63, 64 and 255 would overflow a shift: refused, no panic.
        for lbads in [63u32, 64, 255] {
            assert_eq!(LbaFormat::from_dword(lbads << 16).lba_size(), None);
        }
    }

    #[test]
    fn ns_list() {
        let mut b = vec![0u8; IDENTIFY_SIZE];
        for (i, id) in [1u32, 2, 5].iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&id.to_le_bytes());
        }
        b[16..20].copy_from_slice(&9u32.to_le_bytes()); // after the terminator
        assert_eq!(parse_ns_list(&b), vec![1, 2, 5]);
        assert_eq!(parse_ns_list(&[1, 0, 0]), Vec::<u32>::new());
        assert_eq!(parse_ns_list(&[]), Vec::<u32>::new());
        let full = vec![0x11u8; 8192];
        assert_eq!(parse_ns_list(&full).len(), MAX_NS_LIST);
    }
}

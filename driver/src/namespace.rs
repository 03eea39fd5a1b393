//! Namespaces: what Identify Namespace (CNS 00h) says about one NSID, in the
//! units an application needs — and the handle I/O commands take.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use upnvme_queues::IdentifyNamespace;
use upnvme_queues::pi::Pif;

/// An active namespace of a controller, and the handle I/O commands take
/// (`IoCommand::Read { ns: &ns, .. }`).
///
/// Resolved once (`ctrl.namespace(1)?`), it carries what the I/O path needs
/// — NSID, block count (NSZE) and LBA shift — so submitting a command looks
/// nothing up. It is cheap to clone (the Identify data is shared) and usable
/// by any queue pair of the controller it came from; a pair refuses a handle
/// of another controller ([`crate::Reject::ForeignNamespace`]).
#[derive(Clone, Debug)]
pub struct Namespace {
    id: u32,
    lba_shift: u32,
    blocks: u64,
    /// The controller (bring-up instance) this namespace belongs to.
    controller: u64,
    lba_size: u32,
    metadata_size: u16,
    shared: Arc<Shared>,
}

/// What every clone of one handle shares.
#[derive(Debug)]
struct Shared {
    identify: IdentifyNamespace,
    /// The current LBA format's Extended LBA Format dword (CNS 05h ELBAF:
    /// STS bits 6:0, PIF bits 8:7), 0 when the controller reports none.
    elbaf: u32,
    /// Set when Format NVM (or someone else) changed the namespace: the handle's
    /// geometry no longer holds, so queue pairs refuse it
    /// ([`crate::Reject::StaleNamespace`]).
    retired: AtomicBool,
    /// The plain I/O path's whole namespace check in one load: the adopting
    /// controller's instance while the handle is current and its format has
    /// no metadata, else 0 (no controller's instance: they start at 1).
    /// Cleared together with `retired`.
    plain_key: AtomicU64,
}

/// How the current LBA format lays out metadata (FLBAS bit 4, LBAF.MS, DPS):
/// what a data command on the namespace must transfer besides its data
/// (docs/io.md, "Metadata and protection information").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataLayout {
    /// Metadata bytes per logical block (LBAF.MS), never 0 here.
    pub ms: u16,
    /// FLBAS bit 4: metadata at the end of each block (extended LBA);
    /// otherwise a separate buffer (MPTR).
    pub extended: bool,
    /// DPS bits 2:0: the protection information type (0 none, 1–3).
    pub pi_type: u8,
    /// DPS bit 3: the PI tuple is the first bytes of the metadata (else
    /// the last).
    pub pi_first: bool,
    /// ELBAF.PIF, the guard size of the format's PI: 16 bits unless the
    /// controller reports Extended LBA Formats (CTRATT.ELBAS) and CNS 05h
    /// says otherwise. The driver builds commands for 16- and 64-bit guards;
    /// protection fields on a 32-bit guard are refused.
    pub pif: Pif,
    /// ELBAF.STS, Storage Tag Size in bits (0: none). Protection fields on
    /// a format with storage tags are refused.
    pub sts: u8,
}

impl MetadataLayout {
    /// The PI format of the layout, `None` without protection information
    /// or with a reserved type (DPS bits 2:0 above 3: no tuple layout is
    /// defined for it, and queue pairs refuse protection fields on it).
    pub fn pi_format(&self, lba_size: u32) -> Option<upnvme_queues::pi::PiFormat> {
        (1..=3)
            .contains(&self.pi_type)
            .then_some(upnvme_queues::pi::PiFormat {
                lba_size: lba_size as usize,
                ms: usize::from(self.ms),
                first: self.pi_first,
                pi_type: self.pi_type,
                pif: self.pif,
            })
    }
}

impl std::fmt::Display for MetadataLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layout = if self.extended {
            "extended LBA"
        } else {
            "separate metadata buffer"
        };
        write!(f, "{} metadata bytes per block, {layout}", self.ms)?;
        if self.pi_type != 0 {
            let at = if self.pi_first { "first" } else { "last" };
            write!(
                f,
                ", protection information type {} ({}-bit guard) in the {at} {} bytes",
                self.pi_type,
                self.pif.guard_bits(),
                self.pif.tuple_size()
            )?;
            if self.sts != 0 {
                write!(f, ", {}-bit storage tag", self.sts)?;
            }
        }
        Ok(())
    }
}

/// A process-unique number for each controller brought up, so a namespace
/// handle can tell its controller apart from others (0 is never used).
pub(crate) fn next_controller_instance() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Namespace {
    /// Builds a namespace from its Identify Namespace data; `None` when the
    /// driver cannot use it ([`Controller::namespace`](crate::Controller::namespace)
    /// says why): FLBAS names no listed LBA format, the format's LBADS is
    /// outside 9..=31, or NSZE blocks of that size do not fit in 2^64 bytes.
    /// The handle belongs to no controller (queue pairs refuse it) until the
    /// controller's bring-up adopts it.
    pub fn from_identify(id: u32, identify: IdentifyNamespace) -> Option<Namespace> {
        Namespace::from_identify_elbaf(id, identify, 0)
    }

    /// Why a namespace with this Identify data and ELBAF cannot be used
    /// ([`Namespace::from_identify_elbaf`] returns `None` exactly then).
    pub(crate) fn unusable_reason(identify: &IdentifyNamespace, elbaf: u32) -> Option<String> {
        if Pif::from_elbaf(elbaf).is_none() {
            return Some(format!(
                "the protection information format of its LBA format {} (ELBAF.PIF {}) is \
                 reserved; format it with another LBA format (Controller::format_nvm, \
                 `upnvme format`)",
                identify.current_lba_format_index(),
                (elbaf >> 7) & 0x3
            ));
        }
        let i = identify.current_lba_format_index();
        let Some(fmt) = identify.current_lba_format() else {
            return Some(format!(
                "FLBAS names LBA format {i}, beyond the {} it has ({}); format it with one of \
                 its LBA formats (Controller::format_nvm, `upnvme format`)",
                identify.lba_format_count(),
                identify.lba_format_fields()
            ));
        };
        let Some(lba_size) = fmt.lba_size() else {
            return Some(format!(
                "its LBA format {i} has LBADS {}, outside 9..=31 (512 B to 2 GiB blocks); \
                 format it with another LBA format first (Controller::format_nvm, `upnvme format`)",
                fmt.lbads
            ));
        };
        // Byte offsets and sizes of the namespace are u64 (`size_bytes`,
        // the C API's `size_bytes`): a size beyond 2^64 bytes (16 EiB) is
        // no namespace a controller can have, and no figure derived from it
        // could be trusted.
        if identify.size_bytes().is_none() {
            return Some(format!(
                "its Identify Namespace reports NSZE {} blocks of {lba_size} bytes, more than \
                 2^64 bytes: the controller's data is not plausible; \
                 Controller::refresh_namespaces reads it again",
                identify.nsze
            ));
        }
        None
    }

    /// [`Namespace::from_identify`] with the current LBA format's Extended
    /// LBA Format dword (ELBAF, from CNS 05h) of a controller that reports
    /// Extended LBA Formats; `None` also for a reserved PIF (11b).
    pub fn from_identify_elbaf(
        id: u32,
        identify: IdentifyNamespace,
        elbaf: u32,
    ) -> Option<Namespace> {
        Pif::from_elbaf(elbaf)?;
        let fmt = identify.current_lba_format()?;
        let lba_size = identify.lba_size()?;
        identify.size_bytes()?;
        Some(Namespace {
            id,
            lba_shift: lba_size.trailing_zeros(),
            blocks: identify.nsze,
            controller: 0,
            lba_size,
            metadata_size: fmt.ms,
            shared: Arc::new(Shared {
                identify,
                elbaf,
                retired: AtomicBool::new(false),
                plain_key: AtomicU64::new(0),
            }),
        })
    }

    /// Marks the namespace as one of controller `instance`.
    pub(crate) fn adopt(mut self, instance: u64) -> Namespace {
        self.controller = instance;
        let key = if self.has_metadata() || self.is_stale() {
            0
        } else {
            instance
        };
        self.shared.plain_key.store(key, Ordering::Relaxed);
        self
    }

    /// Controller `instance`'s handle, not retired, of a namespace without
    /// metadata: what the plain Read/Write path (qpair/plain.rs) requires,
    /// with one load and one compare.
    #[inline(always)]
    pub(crate) fn is_plain_for(&self, instance: u64) -> bool {
        self.shared.plain_key.load(Ordering::Relaxed) == instance
    }

    /// The controller instance this handle belongs to.
    #[inline(always)]
    pub(crate) fn controller(&self) -> u64 {
        self.controller
    }

    /// log2 of the LBA size (LBAF.LBADS).
    #[inline(always)]
    pub fn lba_shift(&self) -> u32 {
        self.lba_shift
    }

    /// The namespace ID (NSID).
    #[inline(always)]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes per logical block of the current LBA format (2^LBADS).
    #[inline(always)]
    pub fn lba_size(&self) -> u32 {
        self.lba_size
    }

    /// Namespace Size (NSZE): the number of logical blocks.
    #[inline(always)]
    pub fn lba_count(&self) -> u64 {
        self.blocks
    }

    /// Namespace Capacity (NCAP) in logical blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.shared.identify.ncap
    }

    /// Size in bytes (NSZE × LBA size; a handle exists only for a
    /// namespace where it fits in a u64).
    pub fn size_bytes(&self) -> u64 {
        self.shared
            .identify
            .nsze
            .saturating_mul(self.lba_size as u64)
    }

    /// Metadata bytes per logical block of the current LBA format (LBAF.MS).
    pub fn metadata_size(&self) -> u16 {
        self.metadata_size
    }

    /// Namespace Features (NSFEAT): bit 0 thin provisioning, bit 1 NAWUN/NAWUPF
    /// valid, bit 2 deallocated or unwritten logical block error, bit 4 NPWG etc.
    pub fn features(&self) -> u8 {
        self.shared.identify.nsfeat
    }

    /// Whether the namespace supports thin provisioning (NSFEAT bit 0).
    pub fn thin_provisioned(&self) -> bool {
        self.shared.identify.nsfeat & 1 != 0
    }

    /// The metadata layout of the current LBA format, or `None` when the
    /// format has no metadata (LBAF.MS = 0).
    pub fn metadata_layout(&self) -> Option<MetadataLayout> {
        (self.metadata_size != 0).then(|| self.metadata_layout_always())
    }

    /// The metadata layout fields of the current format, MS 0 included.
    pub(crate) fn metadata_layout_always(&self) -> MetadataLayout {
        MetadataLayout {
            ms: self.metadata_size,
            extended: self.shared.identify.metadata_extended(),
            pi_type: self.shared.identify.dps & 0x7,
            pi_first: self.shared.identify.dps & 0x8 != 0,
            pif: Pif::from_elbaf(self.shared.elbaf).unwrap_or_default(),
            sts: (self.shared.elbaf & 0x7f) as u8,
        }
    }

    /// The PI format (for [`crate::pi::PiFormat::protect`]), `None` without
    /// protection information.
    pub fn pi_format(&self) -> Option<upnvme_queues::pi::PiFormat> {
        self.metadata_layout_always().pi_format(self.lba_size)
    }

    /// Whether data commands (Read, Write, Compare) may carry metadata on
    /// this namespace (LBAF.MS != 0): they then take the path in
    /// qpair/metadata.rs.
    #[inline(always)]
    pub(crate) fn has_metadata(&self) -> bool {
        self.metadata_size != 0
    }

    /// The full Identify Namespace data.
    pub fn identify(&self) -> &IdentifyNamespace {
        &self.shared.identify
    }

    /// True once Format NVM changed the namespace's format after this
    /// handle was taken, or a Namespace Attribute Changed notice showed its
    /// geometry changed, the namespace gone, or another namespace under its
    /// NSID (deleted and created again: a new NGUID or EUI64): queue pairs
    /// refuse it; take a new one with [`crate::Controller::namespace`]
    /// (after [`crate::Controller::refresh_namespaces`] for a change made
    /// by someone else).
    #[inline(always)]
    pub fn is_stale(&self) -> bool {
        self.shared.retired.load(Ordering::Relaxed)
    }

    /// Whether `other` is the namespace this handle names, as this handle
    /// describes it for I/O: the same NSID, size (NSZE), LBA data size,
    /// metadata size and layout and protection information — and the same
    /// namespace, not another one created under its NSID after it was
    /// deleted (Namespace Management): the same NGUID and EUI64 (Identify
    /// Namespace; zero where the controller reports none). A handle of a
    /// deleted namespace must not write into its successor because the two
    /// happen to share a geometry (Linux drops a namespace whose
    /// identifiers changed, `nvme_ns_ids_equal`, for the same reason).
    /// Without metadata (LBAF.MS 0) the layout bits (FLBAS bit 4, DPS) move
    /// no byte of a transfer and are not compared.
    pub(crate) fn same_namespace(&self, other: &Namespace) -> bool {
        let (a, b) = (&self.shared.identify, &other.shared.identify);
        let layout = |n: &Namespace| Some(n.metadata_layout_always()).filter(|l| l.ms != 0);
        self.id == other.id
            && self.blocks == other.blocks
            && self.lba_size == other.lba_size
            && self.metadata_size == other.metadata_size
            && layout(self) == layout(other)
            && a.nguid == b.nguid
            && a.eui64 == b.eui64
    }

    /// Marks every clone of this handle stale (after Format NVM, or a
    /// change another host made).
    pub(crate) fn retire(&self) {
        self.shared.plain_key.store(0, Ordering::Relaxed);
        self.shared.retired.store(true, Ordering::Relaxed);
    }
}

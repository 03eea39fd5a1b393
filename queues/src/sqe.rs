//! Submission Queue Entry (NVMe Base Specification 2.0, §4.2 "Submission
//! Queue Entry") and builders for the admin and NVM I/O commands upnvme uses.
//!
//! Every builder returns an [`Sqe`] with CID 0 and, unless the command itself
//! carries addresses (Create I/O SQ/CQ, Doorbell Buffer Config), PRP1 = PRP2 = 0:
//! the driver fills in the command identifier and the data pointer.

use crate::cqe::SQE_SIZE;

/// Command opcodes (NVMe Base Specification 2.0 "Opcodes for Admin
/// Commands"; NVM Command Set Specification 1.0 "Opcodes for NVM Commands").
pub mod opcode {
    /// Admin Command Set opcodes (NVMe Base Specification 2.0, "Opcodes
    /// for Admin Commands").
    pub mod admin {
        /// Delete I/O Submission Queue.
        pub const DELETE_IO_SQ: u8 = 0x00;
        /// Create I/O Submission Queue.
        pub const CREATE_IO_SQ: u8 = 0x01;
        /// Get Log Page.
        pub const GET_LOG_PAGE: u8 = 0x02;
        /// Delete I/O Completion Queue.
        pub const DELETE_IO_CQ: u8 = 0x04;
        /// Create I/O Completion Queue.
        pub const CREATE_IO_CQ: u8 = 0x05;
        /// Identify.
        pub const IDENTIFY: u8 = 0x06;
        /// Abort.
        pub const ABORT: u8 = 0x08;
        /// Set Features.
        pub const SET_FEATURES: u8 = 0x09;
        /// Get Features.
        pub const GET_FEATURES: u8 = 0x0a;
        /// Asynchronous Event Request.
        pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
        /// Namespace Management.
        pub const NAMESPACE_MANAGEMENT: u8 = 0x0d;
        /// Firmware Commit.
        pub const FIRMWARE_COMMIT: u8 = 0x10;
        /// Firmware Image Download.
        pub const FIRMWARE_IMAGE_DOWNLOAD: u8 = 0x11;
        /// Device Self-test.
        pub const DEVICE_SELF_TEST: u8 = 0x14;
        /// Namespace Attachment.
        pub const NAMESPACE_ATTACHMENT: u8 = 0x15;
        /// Keep Alive.
        pub const KEEP_ALIVE: u8 = 0x18;
        /// Directive Send.
        pub const DIRECTIVE_SEND: u8 = 0x19;
        /// Directive Receive.
        pub const DIRECTIVE_RECEIVE: u8 = 0x1a;
        /// Virtualization Management.
        pub const VIRTUALIZATION_MANAGEMENT: u8 = 0x1c;
        /// NVMe-MI Send.
        pub const NVME_MI_SEND: u8 = 0x1d;
        /// NVMe-MI Receive.
        pub const NVME_MI_RECEIVE: u8 = 0x1e;
        /// Capacity Management.
        pub const CAPACITY_MANAGEMENT: u8 = 0x20;
        /// Lockdown.
        pub const LOCKDOWN: u8 = 0x24;
        /// Controller Data Queue (NVMe 2.1): creates or deletes a queue in
        /// host memory that the controller writes to after the command.
        pub const CONTROLLER_DATA_QUEUE: u8 = 0x45;
        /// Doorbell Buffer Config.
        pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
        /// Fabrics Commands.
        pub const FABRICS: u8 = 0x7f;
        /// Format NVM.
        pub const FORMAT_NVM: u8 = 0x80;
        /// Security Send.
        pub const SECURITY_SEND: u8 = 0x81;
        /// Security Receive.
        pub const SECURITY_RECEIVE: u8 = 0x82;
        /// Sanitize.
        pub const SANITIZE: u8 = 0x84;
        /// Get LBA Status.
        pub const GET_LBA_STATUS: u8 = 0x86;

        /// The specification's name for an admin opcode, or `"Unknown Admin
        /// Command"`.
        pub fn name(op: u8) -> &'static str {
            match op {
                DELETE_IO_SQ => "Delete I/O Submission Queue",
                CREATE_IO_SQ => "Create I/O Submission Queue",
                GET_LOG_PAGE => "Get Log Page",
                DELETE_IO_CQ => "Delete I/O Completion Queue",
                CREATE_IO_CQ => "Create I/O Completion Queue",
                IDENTIFY => "Identify",
                ABORT => "Abort",
                SET_FEATURES => "Set Features",
                GET_FEATURES => "Get Features",
                ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
                NAMESPACE_MANAGEMENT => "Namespace Management",
                FIRMWARE_COMMIT => "Firmware Commit",
                FIRMWARE_IMAGE_DOWNLOAD => "Firmware Image Download",
                DEVICE_SELF_TEST => "Device Self-test",
                NAMESPACE_ATTACHMENT => "Namespace Attachment",
                KEEP_ALIVE => "Keep Alive",
                DIRECTIVE_SEND => "Directive Send",
                DIRECTIVE_RECEIVE => "Directive Receive",
                VIRTUALIZATION_MANAGEMENT => "Virtualization Management",
                NVME_MI_SEND => "NVMe-MI Send",
                NVME_MI_RECEIVE => "NVMe-MI Receive",
                CAPACITY_MANAGEMENT => "Capacity Management",
                LOCKDOWN => "Lockdown",
                DOORBELL_BUFFER_CONFIG => "Doorbell Buffer Config",
                FABRICS => "Fabrics Commands",
                FORMAT_NVM => "Format NVM",
                SECURITY_SEND => "Security Send",
                SECURITY_RECEIVE => "Security Receive",
                SANITIZE => "Sanitize",
                GET_LBA_STATUS => "Get LBA Status",
                _ => "Unknown Admin Command",
            }
        }
    }

    /// NVM Command Set I/O opcodes (NVM Command Set Specification 1.0,
    /// "Opcodes for NVM Commands").
    pub mod nvm {
        /// Flush.
        pub const FLUSH: u8 = 0x00;
        /// Write.
        pub const WRITE: u8 = 0x01;
        /// Read.
        pub const READ: u8 = 0x02;
        /// Write Uncorrectable.
        pub const WRITE_UNCORRECTABLE: u8 = 0x04;
        /// Compare.
        pub const COMPARE: u8 = 0x05;
        /// Write Zeroes.
        pub const WRITE_ZEROES: u8 = 0x08;
        /// Dataset Management.
        pub const DATASET_MANAGEMENT: u8 = 0x09;
        /// Verify.
        pub const VERIFY: u8 = 0x0c;
        /// Reservation Register.
        pub const RESERVATION_REGISTER: u8 = 0x0d;
        /// Reservation Report.
        pub const RESERVATION_REPORT: u8 = 0x0e;
        /// Reservation Acquire.
        pub const RESERVATION_ACQUIRE: u8 = 0x11;
        /// Reservation Release.
        pub const RESERVATION_RELEASE: u8 = 0x15;
        /// Copy.
        pub const COPY: u8 = 0x19;

        /// The specification's name for an NVM I/O opcode, or `"Unknown I/O
        /// Command"`.
        pub fn name(op: u8) -> &'static str {
            match op {
                FLUSH => "Flush",
                WRITE => "Write",
                READ => "Read",
                WRITE_UNCORRECTABLE => "Write Uncorrectable",
                COMPARE => "Compare",
                WRITE_ZEROES => "Write Zeroes",
                DATASET_MANAGEMENT => "Dataset Management",
                VERIFY => "Verify",
                RESERVATION_REGISTER => "Reservation Register",
                RESERVATION_REPORT => "Reservation Report",
                RESERVATION_ACQUIRE => "Reservation Acquire",
                RESERVATION_RELEASE => "Reservation Release",
                COPY => "Copy",
                _ => "Unknown I/O Command",
            }
        }
    }
}

/// Identify CNS values (Identify command, CDW10.CNS "Controller or Namespace
/// Structure").
pub mod cns {
    /// Identify Namespace data structure for the NSID (NVM Command Set).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list (NSIDs greater than the NSID in the command).
    pub const ACTIVE_NSID_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    /// NVM Set List.
    pub const NVM_SET_LIST: u8 = 0x04;
    /// I/O Command Set specific Identify Namespace data structure.
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller data structure.
    pub const CSI_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list associated with the specified I/O Command Set.
    pub const CSI_ACTIVE_NSID_LIST: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace data structure.
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
    /// Allocated Namespace ID list.
    pub const ALLOCATED_NSID_LIST: u8 = 0x10;
    /// Identify Namespace data structure for an allocated NSID.
    pub const ALLOCATED_NAMESPACE: u8 = 0x11;
    /// Controller list of controllers attached to the NSID.
    pub const NS_ATTACHED_CONTROLLER_LIST: u8 = 0x12;
    /// Controller list of all controllers in the NVM subsystem.
    pub const CONTROLLER_LIST: u8 = 0x13;
    /// Primary Controller Capabilities data structure.
    pub const PRIMARY_CONTROLLER_CAPABILITIES: u8 = 0x14;
    /// Secondary Controller list.
    pub const SECONDARY_CONTROLLER_LIST: u8 = 0x15;
    /// Namespace Granularity List.
    pub const NAMESPACE_GRANULARITY_LIST: u8 = 0x16;
    /// UUID List.
    pub const UUID_LIST: u8 = 0x17;
    /// Domain List.
    pub const DOMAIN_LIST: u8 = 0x18;
    /// Endurance Group List.
    pub const ENDURANCE_GROUP_LIST: u8 = 0x19;
    /// I/O Command Set data structure.
    pub const IO_COMMAND_SET: u8 = 0x1c;
}

/// Log Page Identifiers (Figure "Get Log Page – Log Page Identifiers").
pub mod log_id {
    /// Supported Log Pages.
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    /// Error Information.
    pub const ERROR_INFO: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART_HEALTH: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS_LIST: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const COMMANDS_SUPPORTED_EFFECTS: u8 = 0x05;
    /// Device Self-test.
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    /// Telemetry Host-Initiated.
    pub const TELEMETRY_HOST: u8 = 0x07;
    /// Telemetry Controller-Initiated.
    pub const TELEMETRY_CONTROLLER: u8 = 0x08;
    /// Endurance Group Information.
    pub const ENDURANCE_GROUP_INFO: u8 = 0x09;
    /// Predictable Latency Per NVM Set.
    pub const PREDICTABLE_LATENCY_PER_SET: u8 = 0x0a;
    /// Predictable Latency Event Aggregate.
    pub const PREDICTABLE_LATENCY_AGGREGATE: u8 = 0x0b;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0c;
    /// Persistent Event Log.
    pub const PERSISTENT_EVENT: u8 = 0x0d;
    /// Endurance Group Event Aggregate.
    pub const ENDURANCE_GROUP_EVENT_AGGREGATE: u8 = 0x0f;
    /// Media Unit Status.
    pub const MEDIA_UNIT_STATUS: u8 = 0x10;
    /// Supported Capacity Configuration List.
    pub const CAPACITY_CONFIG_LIST: u8 = 0x11;
    /// Feature Identifiers Supported and Effects.
    pub const FEATURES_SUPPORTED_EFFECTS: u8 = 0x12;
    /// NVMe-MI Commands Supported and Effects.
    pub const NVME_MI_SUPPORTED_EFFECTS: u8 = 0x13;
    /// Command and Feature Lockdown.
    pub const COMMAND_FEATURE_LOCKDOWN: u8 = 0x14;
    /// Boot Partition.
    pub const BOOT_PARTITION: u8 = 0x15;
    /// Rotational Media Information.
    pub const ROTATIONAL_MEDIA: u8 = 0x16;
    /// Discovery (fabrics).
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
    /// Sanitize Status.
    pub const SANITIZE_STATUS: u8 = 0x81;
}

/// Feature Identifiers (Figure "Feature Identifiers") and
/// helpers for the features whose values the driver encodes.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// LBA Range Type.
    pub const LBA_RANGE_TYPE: u8 = 0x03;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Interrupt Vector Configuration.
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY_NORMAL: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Autonomous Power State Transition.
    pub const AUTONOMOUS_POWER_STATE_TRANSITION: u8 = 0x0c;
    /// Host Memory Buffer.
    pub const HOST_MEMORY_BUFFER: u8 = 0x0d;
    /// Timestamp.
    pub const TIMESTAMP: u8 = 0x0e;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    /// Host Controlled Thermal Management.
    pub const HOST_CONTROLLED_THERMAL_MANAGEMENT: u8 = 0x10;
    /// Non-Operational Power State Config.
    pub const NON_OPERATIONAL_POWER_STATE_CONFIG: u8 = 0x11;
    /// Read Recovery Level Config.
    pub const READ_RECOVERY_LEVEL_CONFIG: u8 = 0x12;
    /// Predictable Latency Mode Config.
    pub const PREDICTABLE_LATENCY_MODE_CONFIG: u8 = 0x13;
    /// Predictable Latency Mode Window.
    pub const PREDICTABLE_LATENCY_MODE_WINDOW: u8 = 0x14;
    /// Host Behavior Support.
    pub const HOST_BEHAVIOR_SUPPORT: u8 = 0x16;
    /// Sanitize Config.
    pub const SANITIZE_CONFIG: u8 = 0x17;
    /// Endurance Group Event Configuration.
    pub const ENDURANCE_GROUP_EVENT_CONFIG: u8 = 0x18;
    /// I/O Command Set Profile.
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
    /// Spinup Control.
    pub const SPINUP_CONTROL: u8 = 0x1a;
    /// LBA Status Information Attributes (NVMe 1.4: Report Interval).
    pub const LBA_STATUS_INFORMATION: u8 = 0x15;
    /// Power Loss Signaling Config.
    pub const POWER_LOSS_SIGNALING_CONFIG: u8 = 0x1b;
    /// Performance Characteristics.
    pub const PERFORMANCE_CHARACTERISTICS: u8 = 0x1c;
    /// Flexible Data Placement.
    pub const FLEXIBLE_DATA_PLACEMENT: u8 = 0x1d;
    /// FDP Events.
    pub const FDP_EVENTS: u8 = 0x1e;
    /// Namespace Admin Label.
    pub const NAMESPACE_ADMIN_LABEL: u8 = 0x1f;
    /// Key Value Configuration.
    pub const KEY_VALUE_CONFIG: u8 = 0x20;
    /// Controller Data Queue.
    pub const CONTROLLER_DATA_QUEUE: u8 = 0x21;
    /// Embedded Management Controller Address.
    pub const EMBEDDED_MANAGEMENT_CONTROLLER_ADDRESS: u8 = 0x78;
    /// Host Management Agent Address.
    pub const HOST_MANAGEMENT_AGENT_ADDRESS: u8 = 0x79;
    /// Boot Partition Write Protection Config.
    pub const BOOT_PARTITION_WRITE_PROTECTION_CONFIG: u8 = 0x85;
    /// Software Progress Marker.
    pub const SOFTWARE_PROGRESS_MARKER: u8 = 0x80;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask.
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence.
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
    /// Namespace Write Protection Config.
    pub const NAMESPACE_WRITE_PROTECTION_CONFIG: u8 = 0x84;

    /// The feature's name as the specification spells it (Set Features,
    /// "Feature Identifiers"), `None` for an identifier not listed here
    /// (reserved or vendor specific).
    pub fn name(fid: u8) -> Option<&'static str> {
        Some(match fid {
            ARBITRATION => "Arbitration",
            POWER_MANAGEMENT => "Power Management",
            LBA_RANGE_TYPE => "LBA Range Type",
            TEMPERATURE_THRESHOLD => "Temperature Threshold",
            ERROR_RECOVERY => "Error Recovery",
            VOLATILE_WRITE_CACHE => "Volatile Write Cache",
            NUMBER_OF_QUEUES => "Number of Queues",
            INTERRUPT_COALESCING => "Interrupt Coalescing",
            INTERRUPT_VECTOR_CONFIG => "Interrupt Vector Configuration",
            WRITE_ATOMICITY_NORMAL => "Write Atomicity Normal",
            ASYNC_EVENT_CONFIG => "Asynchronous Event Configuration",
            AUTONOMOUS_POWER_STATE_TRANSITION => "Autonomous Power State Transition",
            HOST_MEMORY_BUFFER => "Host Memory Buffer",
            TIMESTAMP => "Timestamp",
            KEEP_ALIVE_TIMER => "Keep Alive Timer",
            HOST_CONTROLLED_THERMAL_MANAGEMENT => "Host Controlled Thermal Management",
            NON_OPERATIONAL_POWER_STATE_CONFIG => "Non-Operational Power State Config",
            READ_RECOVERY_LEVEL_CONFIG => "Read Recovery Level Config",
            PREDICTABLE_LATENCY_MODE_CONFIG => "Predictable Latency Mode Config",
            PREDICTABLE_LATENCY_MODE_WINDOW => "Predictable Latency Mode Window",
            LBA_STATUS_INFORMATION => "LBA Status Information Attributes",
            HOST_BEHAVIOR_SUPPORT => "Host Behavior Support",
            SANITIZE_CONFIG => "Sanitize Config",
            ENDURANCE_GROUP_EVENT_CONFIG => "Endurance Group Event Configuration",
            IO_COMMAND_SET_PROFILE => "I/O Command Set Profile",
            SPINUP_CONTROL => "Spinup Control",
            POWER_LOSS_SIGNALING_CONFIG => "Power Loss Signaling Config",
            PERFORMANCE_CHARACTERISTICS => "Performance Characteristics",
            FLEXIBLE_DATA_PLACEMENT => "Flexible Data Placement",
            FDP_EVENTS => "FDP Events",
            NAMESPACE_ADMIN_LABEL => "Namespace Admin Label",
            KEY_VALUE_CONFIG => "Key Value Configuration",
            CONTROLLER_DATA_QUEUE => "Controller Data Queue",
            EMBEDDED_MANAGEMENT_CONTROLLER_ADDRESS => "Embedded Management Controller Address",
            HOST_MANAGEMENT_AGENT_ADDRESS => "Host Management Agent Address",
            0x7d => "Enhanced Controller Metadata",
            0x7e => "Controller Metadata",
            0x7f => "Namespace Metadata",
            SOFTWARE_PROGRESS_MARKER => "Software Progress Marker",
            HOST_IDENTIFIER => "Host Identifier",
            RESERVATION_NOTIFICATION_MASK => "Reservation Notification Mask",
            RESERVATION_PERSISTENCE => "Reservation Persistence",
            NAMESPACE_WRITE_PROTECTION_CONFIG => "Namespace Write Protection Config",
            BOOT_PARTITION_WRITE_PROTECTION_CONFIG => "Boot Partition Write Protection Config",
            _ => return None,
        })
    }

    /// A feature whose value is a data structure in host memory (moved
    /// through the Get / Set Features data pointer): its name and length
    /// in bytes for Get Features, or with `set` for Set Features, given
    /// CDW11: Host Identifier is 16 bytes with CDW11.EXHID set, else 8; FDP
    /// Events are NOET (CDW11 bits 23:16) descriptors of 2 bytes to get and
    /// event types of 1 byte to set (libnvme sizes the largest NOET, 510
    /// bytes; QEMU moves NOET's); Namespace Admin Label is 256 bytes; Set
    /// Features Host Memory Buffer carries no data (its descriptor list is
    /// named in CDW12–15). `None` for a feature whose
    /// value is dword 11 / dword 0, or one not listed in [`name`].
    pub fn structure(fid: u8, cdw11: u32, set: bool) -> Option<(&'static str, usize)> {
        let noet = (cdw11 >> 16 & 0xff) as usize;
        let len = match fid {
            HOST_MEMORY_BUFFER if set => return None,
            LBA_RANGE_TYPE | HOST_MEMORY_BUFFER | 0x7d..=0x7f => 4096,
            PERFORMANCE_CHARACTERISTICS => 4096,
            NAMESPACE_ADMIN_LABEL => 256,
            AUTONOMOUS_POWER_STATE_TRANSITION => 256,
            TIMESTAMP => 8,
            PREDICTABLE_LATENCY_MODE_CONFIG | HOST_BEHAVIOR_SUPPORT => 512,
            HOST_IDENTIFIER if cdw11 & 1 != 0 => 16,
            HOST_IDENTIFIER => 8,
            // NOET 0 moves nothing (and the controller refuses it).
            FDP_EVENTS if noet == 0 => return None,
            FDP_EVENTS if set => noet,
            FDP_EVENTS => 2 * noet,
            _ => return None,
        };
        Some((name(fid)?, len))
    }

    /// Get Features SEL value 000b: current value.
    pub const SEL_CURRENT: u8 = 0;
    /// Get Features SEL value 001b: default value.
    pub const SEL_DEFAULT: u8 = 1;
    /// Get Features SEL value 010b: saved value.
    pub const SEL_SAVED: u8 = 2;
    /// Get Features SEL value 011b: supported capabilities.
    pub const SEL_SUPPORTED_CAPABILITIES: u8 = 3;

    /// Command Dword 11 for Set Features – Number of Queues:
    /// NSQR (bits 15:0) and NCQR (bits 31:16), both **0-based**. Takes the
    /// 1-based numbers of I/O submission and completion queues requested
    /// (1..=65535; 0 is treated as 1, larger values as 65535 — the value
    /// 65536 is reserved by the specification).
    pub fn number_of_queues_cdw11(io_sqs: u32, io_cqs: u32) -> u32 {
        let nsqr = io_sqs.clamp(1, 65535) - 1;
        let ncqr = io_cqs.clamp(1, 65535) - 1;
        nsqr | (ncqr << 16)
    }

    /// Decodes completion Dword 0 of Set/Get Features – Number of Queues:
    /// NSQA (bits 15:0) and NCQA (bits 31:16) are 0-based; returns the
    /// 1-based `(io_sqs, io_cqs)` the controller allocated.
    pub fn number_of_queues_allocated(dw0: u32) -> (u32, u32) {
        ((dw0 & 0xffff) + 1, (dw0 >> 16) + 1)
    }

    /// Command Dword 11 for Set Features – Volatile Write Cache:
    /// WCE (bit 0).
    pub fn volatile_write_cache_cdw11(enable: bool) -> u32 {
        u32::from(enable)
    }
}

/// Largest 1-based block count an NVM read, write, compare or write zeroes
/// command can carry: NLB is a 16-bit 0-based field.
pub const MAX_NLB: u32 = 65536;

/// Largest number of ranges a Dataset Management command can carry: NR is an
/// 8-bit 0-based field.
pub const MAX_DSM_RANGES: u32 = 256;

/// An NVM command with a data pointer, built straight as the eight qwords of
/// its SQE ([`Sqe::to_qwords`] layout): CDW0.OPC = `opcode`, CDW0.CID =
/// `cid`, NSID, PRP1 (CDW6-7), PRP2 (CDW8-9), SLBA (CDW10-11) and CDW12 =
/// `cdw12` (NLB, 0-based, in bits 15:0, plus any flags such as FUA); CDW2-5
/// and CDW13-15 are zero. No 64-byte array is built and copied: the I/O path
/// stores these eight values into the SQ slot.
#[inline(always)]
pub const fn io_qwords(
    opcode: u8,
    cid: u16,
    nsid: u32,
    prp1: u64,
    prp2: u64,
    slba: u64,
    cdw12: u32,
) -> [u64; 8] {
    [
        opcode as u64 | (cid as u64) << 16 | (nsid as u64) << 32,
        0,
        0,
        prp1,
        prp2,
        slba,
        cdw12 as u64,
        0,
    ]
}

/// A 64-byte Submission Queue Entry (§4.2, "Common Command Format"), as sixteen command dwords CDW0..CDW15 in host order. Use
/// [`Sqe::to_le_bytes`] to obtain the little-endian wire image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sqe {
    /// Command Dwords 0..=15.
    pub dw: [u32; 16],
}

const _: () = assert!(core::mem::size_of::<Sqe>() == 64);
const _: () = assert!(SQE_SIZE == 64);

/// Converts a 1-based count to the 0-based 16-bit field used by NLB and QSIZE,
/// saturating: 0 becomes 0 (one unit) and values above 65536 become 0xffff.
#[inline]
fn zero_based_u16(count: u32) -> u32 {
    count.clamp(1, 65536) - 1
}

impl Sqe {
    /// CDW0.OPC (bits 7:0), Opcode.
    pub fn opcode(&self) -> u8 {
        self.dw[0] as u8
    }

    /// Sets CDW0.OPC.
    pub fn set_opcode(&mut self, opcode: u8) {
        self.dw[0] = (self.dw[0] & !0xff) | u32::from(opcode);
    }

    /// CDW0.FUSE (bits 9:8), Fused Operation (00b normal, 01b first, 10b second).
    pub fn fuse(&self) -> u8 {
        ((self.dw[0] >> 8) & 0x3) as u8
    }

    /// Sets CDW0.FUSE (2 bits).
    pub fn set_fuse(&mut self, fuse: u8) {
        self.dw[0] = (self.dw[0] & !(0x3 << 8)) | ((u32::from(fuse) & 0x3) << 8);
    }

    /// CDW0.PSDT (bits 15:14), PRP or SGL for Data Transfer (00b: PRPs).
    pub fn psdt(&self) -> u8 {
        ((self.dw[0] >> 14) & 0x3) as u8
    }

    /// Sets CDW0.PSDT (2 bits): 00b PRPs, 01b SGL with MPTR an address,
    /// 10b SGL with MPTR a descriptor.
    pub fn set_psdt(&mut self, psdt: u8) {
        self.dw[0] = (self.dw[0] & !(0x3 << 14)) | ((u32::from(psdt) & 0x3) << 14);
    }

    /// CDW0.CID (bits 31:16), Command Identifier.
    pub fn cid(&self) -> u16 {
        (self.dw[0] >> 16) as u16
    }

    /// Sets CDW0.CID.
    pub fn set_cid(&mut self, cid: u16) {
        self.dw[0] = (self.dw[0] & 0xffff) | (u32::from(cid) << 16);
    }

    /// NSID (CDW1), Namespace Identifier.
    pub fn nsid(&self) -> u32 {
        self.dw[1]
    }

    /// Sets NSID (CDW1).
    pub fn set_nsid(&mut self, nsid: u32) {
        self.dw[1] = nsid;
    }

    fn get64(&self, lo: usize) -> u64 {
        u64::from(self.dw[lo]) | (u64::from(self.dw[lo + 1]) << 32)
    }

    fn set64(&mut self, lo: usize, v: u64) {
        self.dw[lo] = v as u32;
        self.dw[lo + 1] = (v >> 32) as u32;
    }

    /// MPTR (CDW4-5), Metadata Pointer.
    pub fn mptr(&self) -> u64 {
        self.get64(4)
    }

    /// Sets MPTR (CDW4-5).
    pub fn set_mptr(&mut self, mptr: u64) {
        self.set64(4, mptr);
    }

    /// DPTR.PRP1 (CDW6-7), PRP Entry 1.
    pub fn prp1(&self) -> u64 {
        self.get64(6)
    }

    /// Sets DPTR.PRP1 (CDW6-7).
    pub fn set_prp1(&mut self, prp1: u64) {
        self.set64(6, prp1);
    }

    /// DPTR.PRP2 (CDW8-9), PRP Entry 2 (second page or PRP List pointer).
    pub fn prp2(&self) -> u64 {
        self.get64(8)
    }

    /// Sets DPTR.PRP2 (CDW8-9).
    pub fn set_prp2(&mut self, prp2: u64) {
        self.set64(8, prp2);
    }

    /// Command Dword `n` (`n` in 0..=15; the command-specific ones are 10..=15).
    ///
    /// # Panics
    /// If `n > 15` (a programming error, never device input).
    pub fn cdw(&self, n: usize) -> u32 {
        self.dw[n]
    }

    /// Sets Command Dword `n` (`n` in 0..=15).
    ///
    /// # Panics
    /// If `n > 15` (a programming error, never device input).
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        self.dw[n] = v;
    }

    /// The 64-byte little-endian image of the entry, as the controller fetches it.
    pub fn to_le_bytes(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        for (chunk, dw) in out.chunks_exact_mut(4).zip(self.dw.iter()) {
            chunk.copy_from_slice(&dw.to_le_bytes());
        }
        out
    }

    /// Decodes a 64-byte little-endian entry (used by controller models).
    pub fn from_le_bytes(bytes: &[u8; 64]) -> Sqe {
        let mut dw = [0u32; 16];
        for (d, chunk) in dw.iter_mut().zip(bytes.chunks_exact(4)) {
            *d = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Sqe { dw }
    }

    /// An entry with only CDW0.OPC and NSID set.
    /// The entry as eight little-endian-ordered qwords (CDW0|CDW1 << 32,
    /// CDW2|CDW3 << 32, ...): the form the I/O path stores into the SQ slot.
    #[inline(always)]
    pub fn to_qwords(&self) -> [u64; 8] {
        let mut q = [0u64; 8];
        for (i, v) in q.iter_mut().enumerate() {
            *v = u64::from(self.dw[2 * i]) | (u64::from(self.dw[2 * i + 1]) << 32);
        }
        q
    }

    fn with_opcode(opcode: u8, nsid: u32) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode);
        sqe.set_nsid(nsid);
        sqe
    }

    // ---------------------------------------------------------------- admin

    /// Identify: CDW10.CNS (bits 7:0) selects the data structure (see
    /// [`cns`]), CDW10.CNTID (bits 31:16) the controller identifier. The
    /// controller returns 4096 bytes through PRP1/PRP2.
    pub fn identify(cns: u8, nsid: u32, cntid: u16) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::IDENTIFY, nsid);
        sqe.dw[10] = u32::from(cns) | (u32::from(cntid) << 16);
        sqe
    }

    /// Get Log Page: `lid` (see [`log_id`]) in CDW10.LID (bits 7:0),
    /// CDW10.RAE (bit 15, Retain Asynchronous Event), and `numd` — the
    /// **1-based** number of dwords to return — encoded 0-based as NUMDL
    /// (CDW10 bits 31:16) and NUMDU (CDW11 bits 15:0). `offset` is the byte
    /// offset into the log (LPOL in CDW12, LPOU in CDW13); it must be a
    /// multiple of 4. `numd` = 0 is treated as 1.
    pub fn get_log_page(lid: u8, nsid: u32, numd: u32, offset: u64, rae: bool) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::GET_LOG_PAGE, nsid);
        let numd0 = numd.saturating_sub(1);
        sqe.dw[10] = u32::from(lid) | (u32::from(rae) << 15) | ((numd0 & 0xffff) << 16);
        sqe.dw[11] = numd0 >> 16;
        sqe.set64(12, offset);
        sqe
    }

    /// Set Features: CDW10.FID (bits 7:0, see [`feature`]), CDW10.SV
    /// (bit 31, Save) and the feature-specific CDW11.
    pub fn set_features(fid: u8, cdw11: u32, save: bool) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::SET_FEATURES, 0);
        sqe.dw[10] = u32::from(fid) | (u32::from(save) << 31);
        sqe.dw[11] = cdw11;
        sqe
    }

    /// A command of the caller's choosing, as an admin passthrough takes
    /// it (nvme-cli's `admin-passthru` fields): the opcode, NSID, Command
    /// Dwords 2–3 and 10–15; everything else (CID, PSDT, MPTR, the data
    /// pointer) zero, for the driver to fill in.
    pub fn passthrough(opcode: u8, nsid: u32, cdw2_3: [u32; 2], cdw10_15: [u32; 6]) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode, nsid);
        sqe.dw[2..4].copy_from_slice(&cdw2_3);
        sqe.dw[10..16].copy_from_slice(&cdw10_15);
        sqe
    }

    /// Get Features: CDW10.FID (bits 7:0), CDW10.SEL (bits 10:8,
    /// `feature::SEL_*`) and the feature-specific CDW11.
    pub fn get_features(fid: u8, sel: u8, cdw11: u32) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::GET_FEATURES, 0);
        sqe.dw[10] = u32::from(fid) | ((u32::from(sel) & 0x7) << 8);
        sqe.dw[11] = cdw11;
        sqe
    }

    /// Create I/O Completion Queue: CDW10.QID (bits 15:0), CDW10.QSIZE
    /// (bits 31:16, **0-based**; `entries` is the 1-based count, 2..=65536),
    /// CDW11.PC = 1 (physically contiguous, bit 0), CDW11.IEN (bit 1) and
    /// CDW11.IV (bits 31:16). PRP1 is the queue's base address. upnvme always
    /// passes `ien = false` (polled queues).
    pub fn create_io_cq(qid: u16, entries: u32, prp1: u64, ien: bool, iv: u16) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::CREATE_IO_CQ, 0);
        sqe.dw[10] = u32::from(qid) | (zero_based_u16(entries) << 16);
        sqe.dw[11] = 1 | (u32::from(ien) << 1) | (u32::from(iv) << 16);
        sqe.set_prp1(prp1);
        sqe
    }

    /// Create I/O Submission Queue: CDW10.QID, CDW10.QSIZE (0-based;
    /// `entries` is 1-based), CDW11.PC = 1 (bit 0), CDW11.QPRIO (bits 2:1) and
    /// CDW11.CQID (bits 31:16) of the completion queue it posts to. PRP1 is the
    /// queue's base address.
    pub fn create_io_sq(qid: u16, entries: u32, prp1: u64, cqid: u16, qprio: u8) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::CREATE_IO_SQ, 0);
        sqe.dw[10] = u32::from(qid) | (zero_based_u16(entries) << 16);
        sqe.dw[11] = 1 | ((u32::from(qprio) & 0x3) << 1) | (u32::from(cqid) << 16);
        sqe.set_prp1(prp1);
        sqe
    }

    /// Delete I/O Submission Queue: CDW10.QID (bits 15:0).
    pub fn delete_io_sq(qid: u16) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::DELETE_IO_SQ, 0);
        sqe.dw[10] = u32::from(qid);
        sqe
    }

    /// Delete I/O Completion Queue: CDW10.QID (bits 15:0).
    pub fn delete_io_cq(qid: u16) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::DELETE_IO_CQ, 0);
        sqe.dw[10] = u32::from(qid);
        sqe
    }

    /// Abort: CDW10.SQID (bits 15:0) and CDW10.CID (bits 31:16) of the
    /// command to abort.
    pub fn abort(sqid: u16, cid: u16) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::ABORT, 0);
        sqe.dw[10] = u32::from(sqid) | (u32::from(cid) << 16);
        sqe
    }

    /// Asynchronous Event Request: no parameters; completes when an
    /// event occurs (see [`crate::aer::AsyncEvent`]).
    pub fn async_event_request() -> Sqe {
        Sqe::with_opcode(opcode::admin::ASYNC_EVENT_REQUEST, 0)
    }

    /// Doorbell Buffer Config: PRP1 = Shadow Doorbell buffer address,
    /// PRP2 = EventIdx buffer address (each one page, page-aligned).
    pub fn doorbell_buffer_config(shadow_iova: u64, eventidx_iova: u64) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::admin::DOORBELL_BUFFER_CONFIG, 0);
        sqe.set_prp1(shadow_iova);
        sqe.set_prp2(eventidx_iova);
        sqe
    }

    /// Keep Alive: no parameters.
    pub fn keep_alive() -> Sqe {
        Sqe::with_opcode(opcode::admin::KEEP_ALIVE, 0)
    }

    // ------------------------------------------------------------------ I/O

    /// Read, Write, Compare share one layout (NVM Command Set Specification
    /// 1.0, "Read", "Write" and "Compare" commands): SLBA in CDW10-11, NLB (0-based) in CDW12
    /// bits 15:0.
    fn rw(op: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut sqe = Sqe::with_opcode(op, nsid);
        sqe.set64(10, slba);
        sqe.dw[12] = zero_based_u16(nlb);
        sqe
    }

    /// Read (NVM Command Set Specification, "Read command") of `nlb` logical blocks starting at
    /// `slba`. `nlb` is a **1-based** block count (1..=[`MAX_NLB`]); the SQE's
    /// CDW12.NLB field is 0-based, so `nlb - 1` is stored. Out-of-range counts
    /// saturate (0 → 1 block, > 65536 → 65536): validate against the
    /// namespace and MDTS before calling.
    pub fn read(nsid: u32, slba: u64, nlb: u32) -> Sqe {
        Sqe::rw(opcode::nvm::READ, nsid, slba, nlb)
    }

    /// Write (NVM Command Set Specification, "Write command") of `nlb` (1-based) logical blocks at
    /// `slba`; CDW12.NLB holds `nlb - 1`. See [`Sqe::read`] for saturation.
    pub fn write(nsid: u32, slba: u64, nlb: u32) -> Sqe {
        Sqe::rw(opcode::nvm::WRITE, nsid, slba, nlb)
    }

    /// Compare (NVM Command Set Specification, "Compare command") of `nlb` (1-based) logical blocks at
    /// `slba` against the host buffer; a mismatch completes with the Media
    /// and Data Integrity Error "Compare Failure". CDW12.NLB holds `nlb - 1`.
    pub fn compare(nsid: u32, slba: u64, nlb: u32) -> Sqe {
        Sqe::rw(opcode::nvm::COMPARE, nsid, slba, nlb)
    }

    /// Flush (Base Specification 2.0, "Flush command") of namespace `nsid`.
    pub fn flush(nsid: u32) -> Sqe {
        Sqe::with_opcode(opcode::nvm::FLUSH, nsid)
    }

    /// Write Zeroes (NVM Command Set Specification, "Write Zeroes command") of `nlb` (1-based) logical blocks
    /// at `slba`: CDW12.NLB holds `nlb - 1`, CDW12.DEAC (bit 25) asks the
    /// controller to deallocate the blocks as well.
    pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Sqe {
        let mut sqe = Sqe::rw(opcode::nvm::WRITE_ZEROES, nsid, slba, nlb);
        sqe.dw[12] |= u32::from(deallocate) << 25;
        sqe
    }

    /// Dataset Management (NVM Command Set Specification, "Dataset Management
    /// command"): CDW10.NR (bits 7:0) is the
    /// **0-based** number of ranges (`nr_ranges` is 1-based, 1..=256,
    /// saturating), CDW11.AD (bit 2) Attribute – Deallocate. The ranges
    /// ([`DsmRange`], 16 bytes each) go in the data buffer pointed to by PRP1/PRP2.
    pub fn dataset_management(nsid: u32, nr_ranges: u32, deallocate: bool) -> Sqe {
        let mut sqe = Sqe::with_opcode(opcode::nvm::DATASET_MANAGEMENT, nsid);
        sqe.dw[10] = nr_ranges.clamp(1, MAX_DSM_RANGES) - 1;
        sqe.dw[11] = u32::from(deallocate) << 2;
        sqe
    }

    /// Sets or clears CDW12.FUA (bit 30), Force Unit Access, of a read, write,
    /// compare or write zeroes command.
    pub fn set_fua(&mut self, fua: bool) {
        self.dw[12] = (self.dw[12] & !(1 << 30)) | (u32::from(fua) << 30);
    }

    /// CDW12.FUA (bit 30), Force Unit Access.
    pub fn fua(&self) -> bool {
        self.dw[12] & (1 << 30) != 0
    }

    /// Sets or clears CDW12.LR (bit 31), Limited Retry.
    pub fn set_limited_retry(&mut self, lr: bool) {
        self.dw[12] = (self.dw[12] & !(1 << 31)) | (u32::from(lr) << 31);
    }

    /// SLBA (CDW10-11), Starting LBA of an NVM I/O command.
    pub fn slba(&self) -> u64 {
        self.get64(10)
    }

    /// The **1-based** block count of an NVM I/O command (CDW12.NLB + 1).
    pub fn nlb(&self) -> u32 {
        (self.dw[12] & 0xffff) + 1
    }
}

/// One Dataset Management range (NVM Command Set Specification 1.0,
/// "Dataset Management – Range Definition"): 16 bytes in the data buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsmRange {
    /// Context Attributes (bytes 03:00).
    pub cattr: u32,
    /// Length in logical blocks (bytes 07:04). Unlike the SQE's NLB this count
    /// is **1-based**: 8 means eight blocks.
    pub nlb: u32,
    /// Starting LBA (bytes 15:08).
    pub slba: u64,
}

impl DsmRange {
    /// Size of one range in the data buffer.
    pub const SIZE: usize = 16;

    /// The 16-byte little-endian image of the range.
    pub fn to_le_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[0..4].copy_from_slice(&self.cattr.to_le_bytes());
        out[4..8].copy_from_slice(&self.nlb.to_le_bytes());
        out[8..16].copy_from_slice(&self.slba.to_le_bytes());
        out
    }

    /// Decodes a 16-byte little-endian range (used by controller models).
    pub fn from_le_bytes(b: &[u8; 16]) -> DsmRange {
        DsmRange {
            cattr: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            nlb: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            slba: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data-structure features of NVMe 2.1 that libnvme sizes, in both
    /// directions, and names for every Feature Identifier it knows (a
    /// review found FDP Events sent without a data pointer: the controller
    /// wrote its descriptors to IOVA 0).
    #[test]
    fn feature_structures_and_names_follow_the_specification() {
        // FDP Events: NOET (CDW11 bits 23:16) descriptors of 2 bytes to get,
        // event types of 1 byte to set.
        assert_eq!(
            feature::structure(0x1e, 5 << 16, false).map(|s| s.1),
            Some(10)
        );
        assert_eq!(
            feature::structure(0x1e, 5 << 16, true).map(|s| s.1),
            Some(5)
        );
        assert_eq!(feature::structure(0x1c, 0, false).map(|s| s.1), Some(4096));
        assert_eq!(feature::structure(0x1f, 0, true).map(|s| s.1), Some(256));
        // Host Memory Buffer: attributes to get, no data to set.
        assert_eq!(feature::structure(0x0d, 0, false).map(|s| s.1), Some(4096));
        assert_eq!(feature::structure(0x0d, 0, true), None);
        assert_eq!(feature::structure(0x81, 1, true).map(|s| s.1), Some(16));
        assert_eq!(feature::structure(0x07, 0, false), None);
        for fid in (0x01..=0x21).chain([0x78, 0x79]).chain(0x7d..=0x85) {
            assert!(feature::name(fid).is_some(), "FID 0x{fid:02x} has no name");
        }
        assert_eq!(
            feature::name(0x15),
            Some("LBA Status Information Attributes")
        );
        assert_eq!(feature::name(0xc0), None);
    }

    #[test]
    fn io_qwords_match_the_builders() {
        let mut r = Sqe::read(7, 0x1_2345_6789, 8);
        r.set_cid(0xabcd);
        r.set_prp1(0x20_0000);
        r.set_prp2(0x20_1000);
        assert_eq!(
            io_qwords(
                opcode::nvm::READ,
                0xabcd,
                7,
                0x20_0000,
                0x20_1000,
                0x1_2345_6789,
                7
            ),
            r.to_qwords()
        );
        let mut w = Sqe::write(1, 5, 1);
        w.set_fua(true);
        assert_eq!(
            io_qwords(opcode::nvm::WRITE, 0, 1, 0, 0, 5, w.dw[12]),
            w.to_qwords()
        );
        assert_eq!(w.to_qwords()[6] as u32, w.dw[12]);
    }

    #[test]
    fn cdw0_fields() {
        let mut s = Sqe::default();
        s.set_opcode(0x02);
        s.set_cid(0xbeef);
        s.set_fuse(1);
        s.set_psdt(0);
        assert_eq!(s.dw[0], 0xbeef_0102);
        assert_eq!(s.opcode(), 0x02);
        assert_eq!(s.cid(), 0xbeef);
        assert_eq!(s.fuse(), 1);
        s.set_cid(1);
        s.set_opcode(0x01);
        assert_eq!(s.dw[0], 0x0001_0101);
        s.set_psdt(3);
        assert_eq!(s.psdt(), 3);
    }

    #[test]
    fn pointers_are_split_low_high() {
        let mut s = Sqe::default();
        s.set_prp1(0x1122_3344_5566_7788);
        s.set_prp2(0x99aa_bbcc_ddee_ff00);
        s.set_mptr(0x0102_0304_0506_0708);
        assert_eq!(s.dw[6], 0x5566_7788);
        assert_eq!(s.dw[7], 0x1122_3344);
        assert_eq!(s.dw[8], 0xddee_ff00);
        assert_eq!(s.dw[9], 0x99aa_bbcc);
        assert_eq!(s.dw[4], 0x0506_0708);
        assert_eq!(s.prp1(), 0x1122_3344_5566_7788);
        assert_eq!(s.prp2(), 0x99aa_bbcc_ddee_ff00);
        assert_eq!(s.mptr(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn le_bytes_roundtrip() {
        let mut s = Sqe::read(1, 0x1_0000_0002, 8);
        s.set_cid(7);
        let b = s.to_le_bytes();
        // Byte 0 = opcode, bytes 2-3 = CID, bytes 4-7 = NSID, bytes 40-47 = SLBA.
        assert_eq!(b[0], opcode::nvm::READ);
        assert_eq!(&b[2..4], &7u16.to_le_bytes());
        assert_eq!(&b[4..8], &1u32.to_le_bytes());
        assert_eq!(&b[40..48], &0x1_0000_0002u64.to_le_bytes());
        assert_eq!(&b[48..50], &7u16.to_le_bytes()); // NLB 0-based
        assert_eq!(Sqe::from_le_bytes(&b), s);
    }

    #[test]
    fn io_builders() {
        let r = Sqe::read(3, 100, 1);
        assert_eq!(r.opcode(), 0x02);
        assert_eq!(r.nsid(), 3);
        assert_eq!(r.slba(), 100);
        assert_eq!(r.dw[12], 0);
        assert_eq!(r.nlb(), 1);
        assert_eq!(r.cid(), 0);
        assert_eq!(r.prp1(), 0);
        let w = Sqe::write(1, 0, MAX_NLB);
        assert_eq!(w.opcode(), 0x01);
        assert_eq!(w.dw[12], 0xffff);
        // Saturation instead of wrapping.
        assert_eq!(Sqe::write(1, 0, MAX_NLB + 1).dw[12], 0xffff);
        assert_eq!(Sqe::write(1, 0, 0).dw[12], 0);
        assert_eq!(Sqe::compare(1, 0, 2).opcode(), 0x05);
        let f = Sqe::flush(0xffff_ffff);
        assert_eq!(f.opcode(), 0x00);
        assert_eq!(f.nsid(), 0xffff_ffff);
        let wz = Sqe::write_zeroes(1, 5, 4, true);
        assert_eq!(wz.opcode(), 0x08);
        assert_eq!(wz.dw[12], 3 | (1 << 25));
        assert_eq!(Sqe::write_zeroes(1, 5, 4, false).dw[12], 3);
        let d = Sqe::dataset_management(1, 2, true);
        assert_eq!(d.opcode(), 0x09);
        assert_eq!(d.dw[10], 1);
        assert_eq!(d.dw[11], 4);
        assert_eq!(Sqe::dataset_management(1, 1000, false).dw[10], 255);
        let mut fua = Sqe::write(1, 0, 1);
        fua.set_fua(true);
        assert!(fua.fua());
        assert_eq!(fua.dw[12], 1 << 30);
        fua.set_limited_retry(true);
        assert_eq!(fua.dw[12], 3 << 30);
    }

    #[test]
    fn admin_builders() {
        let id = Sqe::identify(cns::CONTROLLER, 0, 0x1234);
        assert_eq!(id.opcode(), 0x06);
        assert_eq!(id.dw[10], 0x1234_0001);
        let lp = Sqe::get_log_page(log_id::SMART_HEALTH, 0xffff_ffff, 128, 0, true);
        assert_eq!(lp.opcode(), 0x02);
        assert_eq!(lp.dw[10], 0x02 | (1 << 15) | (127 << 16));
        assert_eq!(lp.dw[11], 0);
        let big = Sqe::get_log_page(log_id::ERROR_INFO, 0, 0x12_3457, 0x1_0000_0010, false);
        assert_eq!(big.dw[10] >> 16, 0x3456);
        assert_eq!(big.dw[11], 0x12);
        assert_eq!(big.dw[12], 0x10);
        assert_eq!(big.dw[13], 0x1);
        let sf = Sqe::set_features(feature::NUMBER_OF_QUEUES, 0x0003_0003, true);
        assert_eq!(sf.opcode(), 0x09);
        assert_eq!(sf.dw[10], 0x8000_0007);
        assert_eq!(sf.dw[11], 0x0003_0003);
        let gf = Sqe::get_features(feature::VOLATILE_WRITE_CACHE, feature::SEL_SAVED, 0);
        assert_eq!(gf.opcode(), 0x0a);
        assert_eq!(gf.dw[10], 0x0206);
        let cq = Sqe::create_io_cq(1, 1024, 0xdead_b000, false, 0);
        assert_eq!(cq.opcode(), 0x05);
        assert_eq!(cq.dw[10], 0x03ff_0001);
        assert_eq!(cq.dw[11], 0x1);
        assert_eq!(cq.prp1(), 0xdead_b000);
        assert_eq!(Sqe::create_io_cq(2, 65536, 0, true, 5).dw[11], 0x0005_0003);
        let sq = Sqe::create_io_sq(1, 2, 0x1000, 1, 0);
        assert_eq!(sq.opcode(), 0x01);
        assert_eq!(sq.dw[10], 0x0001_0001);
        assert_eq!(sq.dw[11], 0x0001_0001);
        assert_eq!(Sqe::delete_io_sq(3).dw[10], 3);
        assert_eq!(Sqe::delete_io_sq(3).opcode(), 0x00);
        assert_eq!(Sqe::delete_io_cq(3).opcode(), 0x04);
        assert_eq!(Sqe::abort(1, 0x42).dw[10], 0x0042_0001);
        assert_eq!(Sqe::async_event_request().opcode(), 0x0c);
        assert_eq!(Sqe::keep_alive().opcode(), 0x18);
        let db = Sqe::doorbell_buffer_config(0x1000, 0x2000);
        assert_eq!(db.opcode(), 0x7c);
        assert_eq!((db.prp1(), db.prp2()), (0x1000, 0x2000));
    }

    #[test]
    fn number_of_queues_helpers() {
        assert_eq!(feature::number_of_queues_cdw11(4, 4), 0x0003_0003);
        assert_eq!(feature::number_of_queues_cdw11(0, 70000), 0xfffe_0000);
        assert_eq!(feature::number_of_queues_allocated(0x0007_0003), (4, 8));
        assert_eq!(
            feature::number_of_queues_allocated(u32::MAX),
            (65536, 65536)
        );
    }

    #[test]
    fn dsm_range_layout() {
        let r = DsmRange {
            cattr: 1,
            nlb: 8,
            slba: 0x0102_0304_0506_0708,
        };
        let b = r.to_le_bytes();
        assert_eq!(&b[0..4], &[1, 0, 0, 0]);
        assert_eq!(&b[4..8], &[8, 0, 0, 0]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(DsmRange::from_le_bytes(&b), r);
    }

    #[test]
    fn opcode_names() {
        assert_eq!(opcode::admin::name(0x06), "Identify");
        assert_eq!(opcode::nvm::name(0x02), "Read");
        assert_eq!(opcode::nvm::name(0xee), "Unknown I/O Command");
    }
}

//! Registers, enable/disable/shutdown, Identify, features and log pages.

use upnvme::Device;

use super::{CC_ENABLE, Host, Ring, Sqe};
use crate::model::{Fault, ModelConfig, ModelController, NamespaceConfig, Status};

fn identify(h: &mut Host, cns: u32, nsid: u32) -> (super::Cqe, Vec<u8>) {
    let buf = h.buffer(4096);
    let c = h.admin(Sqe::new(0x06).nsid(nsid).prp1(buf.iova()).cdw(10, cns));
    (c, buf.to_vec())
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

#[test]
fn registers_after_reset() {
    let m = ModelController::new(ModelConfig::default());
    let cap = m.read64(0);
    assert_eq!(cap & 0xffff, 2047, "MQES");
    assert_eq!(cap >> 16 & 1, 1, "CQR");
    assert_eq!(cap >> 24 & 0xff, 2, "TO");
    assert_eq!(cap >> 32 & 0xf, 0, "DSTRD");
    assert_eq!(cap >> 37 & 0xff, 1, "CSS: NVM");
    assert_eq!(cap >> 48 & 0xf, 0, "MPSMIN");
    assert_eq!(cap >> 52 & 0xf, 4, "MPSMAX");
    assert_eq!(m.read32(0), cap as u32);
    assert_eq!(m.read32(4), (cap >> 32) as u32);
    assert_eq!(m.read32(0x08), 0x0001_0400, "VS 1.4.0");
    assert_eq!(m.read32(0x1c), 0, "CSTS");
    assert_eq!(m.bar_len(), 0x4000);
    assert_eq!(m.name(), "model");
    assert!(m.violations().is_empty());
}

#[test]
fn invalid_register_accesses_read_all_ones_and_are_recorded() {
    let m = ModelController::new(ModelConfig::default());
    assert_eq!(m.read32(0x1e), u32::MAX);
    assert_eq!(m.read32(0x4000), u32::MAX);
    assert_eq!(m.read32(usize::MAX - 1), u32::MAX);
    assert_eq!(m.read64(0x04), u64::MAX);
    m.write32(0x15, 1);
    m.write64(0x1000, 1);
    m.write32(0, 0);
    m.write32(usize::MAX - 3, 7);
    assert_eq!(m.cc(), 0);
    assert_eq!(m.take_violations().len(), 8);
    // Doorbells while disabled are violations too, and do nothing.
    m.write32(0x1000, 1);
    assert_eq!(m.doorbell_writes(0), (1, 0));
    assert_eq!(m.take_violations().len(), 1);
}

#[test]
fn enable_latches_admin_queues_and_sets_ready() {
    let h = Host::new();
    assert_eq!(h.m.cc(), CC_ENABLE);
    assert_eq!(h.m.csts() & 1, 1);
    let sq = h.m.sq_state(0).unwrap();
    assert_eq!((sq.size, sq.head, sq.tail, sq.cqid), (16, 0, 0, 0));
    assert_eq!(h.m.cq_state(0).unwrap().size, 16);
    // Disable: RDY drops, the queues are gone.
    h.m.write32(0x14, 0);
    assert_eq!(h.m.read32(0x1c) & 1, 0);
    assert!(!h.m.queue_exists(0));
    h.assert_clean();
}

#[test]
fn ready_follows_after_configured_csts_reads() {
    let cfg = ModelConfig {
        ready_delay_reads: 3,
        ..ModelConfig::default()
    };
    let m = ModelController::new(cfg);
    let admin = Ring::new(&m, 0, 4);
    m.write32(0x24, 3 | 3 << 16);
    m.write64(0x28, admin.sq.iova());
    m.write64(0x30, admin.cq.iova());
    m.write32(0x14, CC_ENABLE);
    let reads: Vec<u32> = (0..5).map(|_| m.read32(0x1c) & 1).collect();
    assert_eq!(reads, [0, 0, 0, 1, 1]);
    m.write32(0x14, 0);
    let reads: Vec<u32> = (0..5).map(|_| m.read32(0x1c) & 1).collect();
    assert_eq!(reads, [1, 1, 1, 0, 0]);
    assert!(m.violations().is_empty());
}

#[test]
fn never_ready_and_invalid_enable() {
    let m = ModelController::new(ModelConfig::default());
    m.inject(Fault::NeverReady);
    let admin = Ring::new(&m, 0, 4);
    m.write32(0x24, 3 | 3 << 16);
    m.write64(0x28, admin.sq.iova());
    m.write64(0x30, admin.cq.iova());
    m.write32(0x14, CC_ENABLE);
    for _ in 0..100 {
        assert_eq!(m.read32(0x1c), 0);
    }
    // A reset and a second enable work (the fault was one-shot).
    m.write32(0x14, 0);
    m.write32(0x14, CC_ENABLE);
    assert_eq!(m.read32(0x1c), 1);
    m.write32(0x14, 0);
    // IOSQES missing: the controller fails (as QEMU) and says why.
    m.write32(0x14, 0x0040_0001);
    assert_eq!(m.read32(0x1c) & 2, 2, "CSTS.CFS");
    let v = m.take_violations();
    assert!(v[0].contains("IOSQES"), "{v:?}");
    m.write32(0x14, 0);
    assert_eq!(m.read32(0x1c), 0, "reset clears CFS");
}

#[test]
fn shutdown_reports_complete_and_drops_queues() {
    let cfg = ModelConfig {
        shutdown_delay_reads: 2,
        ..ModelConfig::default()
    };
    let h = Host::with(cfg);
    h.m.write32(0x14, CC_ENABLE | 1 << 14);
    let shst: Vec<u32> = (0..4).map(|_| h.m.read32(0x1c) >> 2 & 3).collect();
    assert_eq!(shst, [1, 1, 2, 2]);
    assert!(!h.m.queue_exists(0));
    h.m.write32(0x14, 0);
    assert_eq!(h.m.read32(0x1c), 0);
    h.assert_clean();

    let h = Host::new();
    h.m.inject(Fault::NeverShutdownComplete);
    h.m.write32(0x14, CC_ENABLE | 1 << 14);
    for _ in 0..10 {
        assert_eq!(h.m.read32(0x1c) >> 2 & 3, 1);
    }
}

#[test]
fn identify_controller_fields() {
    let cfg = ModelConfig {
        serial: "SER123".into(),
        model: "Model X".into(),
        firmware: "FW9".into(),
        vid: 0x1234,
        cntlid: 7,
        mdts: 5,
        rtd3e_us: 1_000_000,
        aerl: 2,
        vwc: true,
        namespaces: vec![
            NamespaceConfig::default(),
            NamespaceConfig {
                nsid: 3,
                lba_size: 512,
                blocks: 1000,
                ..NamespaceConfig::default()
            },
        ],
        ..ModelConfig::default()
    };
    let mut h = Host::with(cfg);
    let (c, id) = identify(&mut h, 1, 0);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(le16(&id, 0), 0x1234, "VID");
    assert_eq!(le16(&id, 2), 0x1234, "SSVID");
    assert_eq!(&id[4..24], b"SER123              ");
    assert_eq!(&id[24..64], format!("{:<40}", "Model X").as_bytes());
    assert_eq!(&id[64..72], b"FW9     ");
    assert_eq!(id[77], 5, "MDTS");
    assert_eq!(le16(&id, 78), 7, "CNTLID");
    assert_eq!(le32(&id, 80), 0x0001_0400, "VER");
    assert_eq!(le32(&id, 88), 1_000_000, "RTD3E");
    assert_eq!(le16(&id, 256) & 1 << 8, 1 << 8, "OACS DBBC");
    assert_eq!(id[259], 2, "AERL");
    assert_eq!(id[512], 0x66, "SQES");
    assert_eq!(id[513], 0x44, "CQES");
    assert_eq!(le32(&id, 516), 3, "NN");
    assert_eq!(le16(&id, 520), 0x0d, "ONCS");
    assert_eq!(id[525] & 1, 1, "VWC");
    assert_eq!(le32(&id, 536), 0, "SGLS");
    assert!(id[768..].starts_with(b"nqn."));

    let (_, ns) = identify(&mut h, 0, 3);
    assert_eq!(le64(&ns, 0), 1000, "NSZE");
    assert_eq!(le64(&ns, 8), 1000, "NCAP");
    assert_eq!(ns[25], 7, "NLBAF: QEMU's eight formats");
    assert_eq!(ns[26], 0, "FLBAS: format 0 (512 + 0)");
    assert_eq!(le32(&ns, 128) >> 16 & 0xff, 9, "LBADS 512");
    assert_eq!(le32(&ns, 128 + 4 * 5), 12 << 16 | 8, "LBAF5: 4096 + 8");
    assert_eq!((ns[27], ns[28], ns[29]), (0x3, 0x1f, 0), "MC, DPC, DPS");
    let (_, ns) = identify(&mut h, 0, 1);
    assert_eq!(ns[26], 4, "FLBAS: format 4 (4096 + 0)");
    assert_eq!(le32(&ns, 128 + 4 * 4) >> 16 & 0xff, 12, "LBADS 4096");
    assert_eq!(le64(&ns, 0), 16384);
    // NSID 2 is inactive (≤ NN): zero-filled; NSID 4 is invalid.
    let (c, ns) = identify(&mut h, 0, 2);
    assert_eq!(c.status, Status::SUCCESS);
    assert!(ns.iter().all(|&b| b == 0));
    let (c, _) = identify(&mut h, 0, 4);
    assert_eq!(c.status, Status::INVALID_NAMESPACE.with_dnr());

    let (_, list) = identify(&mut h, 2, 0);
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 3, 0));
    let (_, list) = identify(&mut h, 2, 1);
    assert_eq!((le32(&list, 0), le32(&list, 4)), (3, 0));
    let (c, _) = identify(&mut h, 0x55, 0);
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    h.assert_clean();
}

#[test]
fn identify_into_buffer_with_offset_uses_prp2() {
    let mut h = Host::new();
    let buf = h.buffer(8192);
    let c = h.admin(
        Sqe::new(0x06)
            .prp1(buf.iova() + 3584)
            .prp2(buf.iova() + 4096)
            .cdw(10, 1),
    );
    assert_eq!(c.status, Status::SUCCESS);
    let all = buf.to_vec();
    assert_eq!(&all[3584 + 24..3584 + 41], b"upnvme model ctrl");
    assert_eq!(all[3584 + 512], 0x66, "SQES lands in the second page");
    // An unaligned PRP1 is PRP Offset Invalid.
    let c = h.admin(Sqe::new(0x06).prp1(buf.iova() + 2).cdw(10, 1));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    assert_eq!(h.m.take_violations().len(), 1, "recorded as a violation");
    h.assert_clean();
}

#[test]
fn features_number_of_queues_and_others() {
    let mut h = Host::new();
    // Ask for 100 SQs and 8 CQs (0-based 99 / 7): granted min(req, 64).
    let c = h.admin(Sqe::new(0x09).cdw(10, 0x07).cdw(11, 7 << 16 | 99));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(c.dw0, 7 << 16 | 63);
    assert_eq!(h.m.granted_queues(), Some((64, 8)));
    let c = h.admin(Sqe::new(0x0a).cdw(10, 0x07));
    assert_eq!(c.dw0, 7 << 16 | 63);
    // CQ 9 is beyond the 8 granted.
    let cq = h.buffer(4096);
    let c = h.admin(
        Sqe::new(0x05)
            .prp1(cq.iova())
            .cdw(10, 15 << 16 | 9)
            .cdw(11, 1),
    );
    assert_eq!(c.status, Status::INVALID_QID.with_dnr());
    // Volatile write cache absent by default: not changeable.
    let c = h.admin(Sqe::new(0x09).cdw(10, 0x06).cdw(11, 1));
    assert_eq!(c.status, Status::FEATURE_NOT_CHANGEABLE.with_dnr());
    // Temperature threshold round trip.
    let c = h.admin(Sqe::new(0x0a).cdw(10, 0x04));
    assert_eq!(c.dw0, 0x157);
    h.admin(Sqe::new(0x09).cdw(10, 0x04).cdw(11, 0x150));
    assert_eq!(h.admin(Sqe::new(0x0a).cdw(10, 0x04)).dw0, 0x150);
    assert_eq!(h.admin(Sqe::new(0x0a).cdw(10, 0x104)).dw0, 0x157, "default");
    // Async event configuration.
    h.admin(Sqe::new(0x09).cdw(10, 0x0b).cdw(11, 0x1ff));
    assert_eq!(h.admin(Sqe::new(0x0a).cdw(10, 0x0b)).dw0, 0x1ff);
    // Saving and unknown features.
    let c = h.admin(Sqe::new(0x09).cdw(10, 1 << 31 | 0x0b));
    assert_eq!(c.status, Status::FEATURE_NOT_SAVEABLE.with_dnr());
    let c = h.admin(Sqe::new(0x0a).cdw(10, 0x02));
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    // Unknown opcode; Keep Alive unsupported by default.
    let c = h.admin(Sqe::new(0xc3));
    assert_eq!(c.status, Status::INVALID_OPCODE.with_dnr());
    let c = h.admin(Sqe::new(0x18));
    assert_eq!(c.status, Status::INVALID_OPCODE.with_dnr());
    h.assert_clean();
}

#[test]
fn log_pages_smart_error_firmware() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    let data = h.buffer(8192);
    for _ in 0..3 {
        let c = io.call(&h.m, super::rw(0x01, 0, 2, data.iova(), data.iova() + 4096));
        assert_eq!(c.status, Status::SUCCESS);
    }
    let c = io.call(&h.m, super::rw(0x02, 0, 1, data.iova(), 0));
    assert_eq!(c.status, Status::SUCCESS);
    // An error for the error log: LBA out of range.
    let c = io.call(&h.m, super::rw(0x02, 1 << 40, 1, data.iova(), 0));
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());

    let log = h.buffer(4096);
    let numd = (512 / 4 - 1) << 16;
    let c = h.admin(
        Sqe::new(0x02)
            .nsid(0xffff_ffff)
            .prp1(log.iova())
            .cdw(10, numd | 0x02),
    );
    assert_eq!(c.status, Status::SUCCESS);
    let smart = log.to_vec();
    let u128_at = |o: usize| u128::from_le_bytes(smart[o..o + 16].try_into().unwrap());
    assert_eq!(
        u128_at(32),
        1,
        "data units read: 8 units of 512 B, rounded up"
    );
    assert_eq!(u128_at(48), 1, "data units written");
    assert_eq!(u128_at(64), 1, "host read commands");
    assert_eq!(u128_at(80), 3, "host write commands");
    assert_eq!(u128_at(112), 1, "power cycles");
    assert_eq!(u128_at(176), 1, "error log entries");

    // Offset and length honoured: 8 bytes at offset 64 = host read commands.
    let small = h.buffer(4096);
    small.fill(0, 4096, 0xee).unwrap();
    let c = h.admin(
        Sqe::new(0x02)
            .prp1(small.iova())
            .cdw(10, 1 << 16 | 0x02)
            .cdw(12, 64),
    );
    assert_eq!(c.status, Status::SUCCESS);
    let v = small.to_vec();
    assert_eq!(&v[..8], &1u64.to_le_bytes());
    assert_eq!(v[8], 0xee, "nothing beyond NUMD");

    let c = h.admin(Sqe::new(0x02).prp1(log.iova()).cdw(10, 15 << 16 | 0x01));
    assert_eq!(c.status, Status::SUCCESS);
    let e = log.to_vec();
    assert_eq!(le64(&e, 0), 1, "error count");
    assert_eq!(le16(&e, 8), 1, "SQID");
    assert_eq!(le16(&e, 12) >> 1, Status::LBA_OUT_OF_RANGE.with_dnr().0);

    let c = h.admin(Sqe::new(0x02).prp1(log.iova()).cdw(10, 127 << 16 | 0x03));
    assert_eq!(c.status, Status::SUCCESS);
    let fw = log.to_vec();
    assert_eq!(fw[0], 1, "AFI");
    assert_eq!(&fw[8..16], b"1.0     ");

    let c = h.admin(Sqe::new(0x02).prp1(log.iova()).cdw(10, 0x7f));
    assert_eq!(c.status, Status::INVALID_LOG_PAGE.with_dnr());
    let c = h.admin(Sqe::new(0x02).prp1(log.iova()).cdw(10, 0x02).cdw(12, 512));
    assert_eq!(
        c.status,
        Status::INVALID_FIELD.with_dnr(),
        "offset past the page"
    );
    h.assert_clean();
}

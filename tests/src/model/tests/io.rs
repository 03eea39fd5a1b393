//! I/O queue creation and NVM commands: data integrity through every PRP
//! shape, command validation, DMA faults.

use super::{Host, Sqe, pattern, rw};
use crate::model::{ModelConfig, NamespaceConfig, Status};

#[test]
fn write_then_read_4k() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    assert_eq!(h.m.cq_interrupts_enabled(1), Some(false));
    let src = h.buffer(4096);
    let data = pattern(4096, 1);
    src.write_bytes(0, &data).unwrap();
    let c = io.call(&h.m, rw(0x01, 10, 1, src.iova(), 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(c.sqhd, 1);
    assert_eq!(h.m.namespace_data(1, 10, 1), data);
    let dst = h.buffer(4096);
    let c = io.call(&h.m, rw(0x02, 10, 1, dst.iova(), 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(dst.to_vec(), data);
    assert_eq!(h.m.doorbell_writes(1), (2, 2));
    assert_eq!(
        h.m.commands_seen().iter().filter(|c| c.0 == 1).count(),
        2,
        "{:?}",
        h.m.commands_seen()
    );
    h.assert_clean();
}

/// Fills `list` with the IOVAs of `buf`'s pages from `first_page` on.
fn prp_list(h: &Host, buf: &upnvme_dma::DmaBuffer, first_page: usize) -> upnvme_dma::DmaBuffer {
    let list = h.buffer(4096);
    for (i, page) in (first_page..buf.len() / 4096).enumerate() {
        list.write_u64(i * 8, buf.iova() + (page * 4096) as u64)
            .unwrap();
    }
    list
}

#[test]
fn write_then_read_64k_through_prp_lists() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    let src = h.buffer(65536);
    let data = pattern(65536, 7);
    src.write_bytes(0, &data).unwrap();
    let list = prp_list(&h, &src, 1);
    let c = io.call(&h.m, rw(0x01, 100, 16, src.iova(), list.iova()));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.m.namespace_data(1, 100, 16), data);

    let dst = h.buffer(65536);
    let list = prp_list(&h, &dst, 1);
    let c = io.call(&h.m, rw(0x02, 100, 16, dst.iova(), list.iova()));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(dst.to_vec(), data);

    // 8 KiB: PRP2 is the second page itself.
    let dst = h.buffer(8192);
    let c = io.call(&h.m, rw(0x02, 100, 2, dst.iova(), dst.iova() + 4096));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(dst.to_vec(), data[..8192]);
    h.assert_clean();
}

#[test]
fn prp1_offset_and_chained_list() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    let data = pattern(65536, 3);
    h.m.write_namespace_data(1, 0, &data);

    // Host buffer starts 512 bytes into a page: 17 pages touched, PRP1 plus
    // 16 list entries. The list starts 16 bytes before the end of its page:
    // one data entry, then a pointer to the next list page.
    let dst = h.buffer(69632);
    let lists = h.buffer(8192);
    let entries: Vec<u64> = (1..17).map(|p| dst.iova() + p * 4096).collect();
    lists.write_u64(4080, entries[0]).unwrap();
    lists.write_u64(4088, lists.iova() + 4096).unwrap();
    for (i, e) in entries[1..].iter().enumerate() {
        lists.write_u64(4096 + i * 8, *e).unwrap();
    }
    let c = io.call(&h.m, rw(0x02, 0, 16, dst.iova() + 512, lists.iova() + 4080));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(dst.to_vec()[512..512 + 65536], data);
    h.assert_clean();
}

#[test]
fn prp_offset_rules() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    let buf = h.buffer(3 * 4096);
    // PRP2 used as a data page must be page aligned.
    let c = io.call(&h.m, rw(0x02, 0, 2, buf.iova(), buf.iova() + 4096 + 8));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    // PRP list entries must be page aligned.
    let list = h.buffer(4096);
    list.write_u64(0, buf.iova() + 4096).unwrap();
    list.write_u64(8, buf.iova() + 8192 + 512).unwrap();
    let c = io.call(&h.m, rw(0x02, 0, 3, buf.iova(), list.iova()));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    // PRP list pointer must be qword aligned.
    let c = io.call(&h.m, rw(0x02, 0, 3, buf.iova(), list.iova() + 4));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    // PRP1 must be dword aligned.
    let c = io.call(&h.m, rw(0x02, 0, 1, buf.iova() + 2, 0));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    // A list page with room only for the chain pointer is refused.
    let c = io.call(&h.m, rw(0x02, 0, 3, buf.iova(), list.iova() + 4088));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID.with_dnr());
    // Each is recorded as a host violation too.
    assert_eq!(h.m.take_violations().len(), 5);
    h.assert_clean();
}

#[test]
fn unmapped_iova_is_a_dma_fault() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    let c = io.call(&h.m, rw(0x02, 0, 1, 0xdead_0000, 0));
    assert_eq!(c.status, Status::DATA_TRANSFER_ERROR);
    let c = io.call(&h.m, rw(0x01, 0, 2, 0x1000, 0x2000));
    assert_eq!(c.status, Status::DATA_TRANSFER_ERROR);
    // Just past the end of a mapping.
    let buf = h.buffer(4096);
    let end = buf.iova() + (2 << 20);
    let c = io.call(&h.m, rw(0x02, 0, 1, end, 0));
    assert_eq!(c.status, Status::DATA_TRANSFER_ERROR);
    assert_eq!(h.m.dma_faults(), 3);
    assert!(h.m.violations().is_empty());
    assert_eq!(
        h.m.namespace_data(1, 0, 2),
        vec![0; 8192],
        "nothing written"
    );
}

#[test]
fn command_validation() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);
    let buf = h.buffer(4096);
    let c = io.call(&h.m, rw(0x02, 0, 1, buf.iova(), 0).nsid(2));
    assert_eq!(c.status, Status::INVALID_NAMESPACE.with_dnr());
    let c = io.call(&h.m, rw(0x02, 16383, 2, buf.iova(), 0));
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    let c = io.call(&h.m, rw(0x02, u64::MAX, 1, buf.iova(), 0));
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    // MDTS 7: 128 pages of 4 KiB; 129 blocks of 4 KiB is too much.
    let c = io.call(&h.m, rw(0x02, 0, 129, buf.iova(), 0));
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    assert_eq!(h.m.take_violations().len(), 1, "above MDTS");
    let c = io.call(&h.m, Sqe::new(0x7e).nsid(1));
    assert_eq!(c.status, Status::INVALID_OPCODE.with_dnr());
    // SGLs and fused operations are not supported.
    let c = io.call(&h.m, rw(0x02, 0, 1, buf.iova(), 0).flags(0x40));
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr(), "SGL");
    assert_eq!(h.m.take_violations().len(), 1, "SGL");
    let c = io.call(&h.m, rw(0x02, 0, 1, buf.iova(), 0).flags(0x01));
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr(), "fused");
    let c = io.call(&h.m, Sqe::new(0x00).nsid(1));
    assert_eq!(c.status, Status::SUCCESS, "flush");
    let c = io.call(&h.m, Sqe::new(0x00).nsid(0xffff_ffff));
    assert_eq!(c.status, Status::SUCCESS, "broadcast flush");
    let c = io.call(&h.m, Sqe::new(0x00).nsid(0));
    assert_eq!(c.status, Status::INVALID_NAMESPACE.with_dnr());
    h.assert_clean();
}

#[test]
fn compare_write_zeroes_and_deallocate() {
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 4096,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    };
    let mut h = Host::with(cfg);
    let mut io = h.create_pair(1, 4);
    let buf = h.buffer(4096);
    let data = pattern(4096, 9);
    buf.write_bytes(0, &data).unwrap();
    let c = io.call(&h.m, rw(0x01, 8, 8, buf.iova(), 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.m.allocated_blocks(1), 8);
    let c = io.call(&h.m, rw(0x05, 8, 8, buf.iova(), 0));
    assert_eq!(c.status, Status::SUCCESS, "compare equal");
    buf.write_bytes(100, &[0]).unwrap();
    let c = io.call(&h.m, rw(0x05, 8, 8, buf.iova(), 0));
    assert_eq!(c.status, Status::COMPARE_FAILURE);

    // Write Zeroes with DEAC on blocks 8..10.
    let c = io.call(&h.m, Sqe::new(0x08).nsid(1).slba(8).cdw(12, 1 | 1 << 25));
    assert_eq!(c.status, Status::SUCCESS);
    let got = h.m.namespace_data(1, 8, 8);
    assert_eq!(got[..1024], [0; 1024]);
    assert_eq!(got[1024..], data[1024..]);
    let c = io.call(&h.m, Sqe::new(0x08).nsid(1).slba(4095).cdw(12, 1));
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());

    // Dataset Management, deallocate two ranges (one of them empty).
    let ranges = h.buffer(4096);
    ranges.write_u32(4, 2).unwrap(); // range 0: 2 blocks at 12
    ranges.write_u64(8, 12).unwrap();
    ranges.write_u32(16 + 4, 0).unwrap(); // range 1: empty
    let c = io.call(
        &h.m,
        Sqe::new(0x09)
            .nsid(1)
            .prp1(ranges.iova())
            .cdw(10, 1)
            .cdw(11, 1 << 2),
    );
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.m.allocated_blocks(1), 4);
    let got = h.m.namespace_data(1, 8, 8);
    assert_eq!(got[2048..3072], [0; 1024]);
    assert_eq!(got[3072..], data[3072..]);
    // A range outside the namespace fails the whole command.
    ranges.write_u64(16 + 8, 4095).unwrap();
    ranges.write_u32(16 + 4, 2).unwrap();
    let c = io.call(
        &h.m,
        Sqe::new(0x09)
            .nsid(1)
            .prp1(ranges.iova())
            .cdw(10, 1)
            .cdw(11, 1 << 2),
    );
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    h.assert_clean();
}

#[test]
fn queue_creation_rules() {
    let mut h = Host::new();
    let q = h.buffer(4096);
    let create_cq = |qid: u32, size: u32, flags: u32, base: u64| {
        Sqe::new(0x05)
            .prp1(base)
            .cdw(10, (size - 1) << 16 | qid)
            .cdw(11, flags)
    };
    let create_sq = |qid: u32, cqid: u32| {
        Sqe::new(0x01)
            .prp1(q.iova())
            .cdw(10, 15 << 16 | qid)
            .cdw(11, cqid << 16 | 1)
    };
    let s = |h: &mut Host, sqe| h.admin(sqe).status;
    assert_eq!(s(&mut h, create_sq(1, 1)), Status::CQ_INVALID.with_dnr());
    assert_eq!(
        s(&mut h, create_cq(0, 16, 1, q.iova())),
        Status::INVALID_QID.with_dnr()
    );
    assert_eq!(
        s(&mut h, create_cq(65, 16, 1, q.iova())),
        Status::INVALID_QID.with_dnr()
    );
    assert_eq!(
        s(&mut h, create_cq(1, 1, 1, q.iova())),
        Status::INVALID_QUEUE_SIZE.with_dnr()
    );
    assert_eq!(
        s(&mut h, create_cq(1, 2049, 1, q.iova())),
        Status::INVALID_QUEUE_SIZE.with_dnr()
    );
    assert_eq!(
        s(&mut h, create_cq(1, 16, 0, q.iova())),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        s(&mut h, create_cq(1, 16, 1, q.iova() + 64)),
        Status::PRP_OFFSET_INVALID.with_dnr()
    );
    // IEN = 1 is accepted and recorded.
    assert_eq!(s(&mut h, create_cq(1, 16, 3, q.iova())), Status::SUCCESS);
    assert_eq!(h.m.cq_interrupts_enabled(1), Some(true));
    assert_eq!(
        s(&mut h, create_cq(1, 16, 1, q.iova())),
        Status::INVALID_QID.with_dnr()
    );
    assert_eq!(s(&mut h, create_sq(1, 1)), Status::SUCCESS);
    assert_eq!(s(&mut h, create_sq(1, 1)), Status::INVALID_QID.with_dnr());
    // Number of Queues cannot change once I/O queues exist.
    let c = h.admin(Sqe::new(0x09).cdw(10, 0x07).cdw(11, 0));
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    // Delete: the CQ is in use until its SQ is gone.
    assert_eq!(
        s(&mut h, Sqe::new(0x04).cdw(10, 1)),
        Status::INVALID_QUEUE_DELETION.with_dnr()
    );
    assert_eq!(s(&mut h, Sqe::new(0x00).cdw(10, 1)), Status::SUCCESS);
    assert_eq!(
        s(&mut h, Sqe::new(0x00).cdw(10, 1)),
        Status::INVALID_QID.with_dnr()
    );
    assert_eq!(s(&mut h, Sqe::new(0x04).cdw(10, 1)), Status::SUCCESS);
    assert!(!h.m.queue_exists(1));
    h.assert_clean();
}

/// A Write on a namespace with separate metadata (8 bytes per block through
/// MPTR): a dword-aligned MPTR moves the metadata; a misaligned one is
/// refused with Invalid Field and recorded as a host violation (the Base
/// specification's MPTR "shall be dword aligned"), so a driver that sent
/// one fails `assert_clean` instead of passing on the refusal alone.
#[test]
fn a_misaligned_metadata_pointer_is_a_violation() {
    let mut h = Host::with(ModelConfig {
        namespaces: vec![NamespaceConfig {
            lba_size: 512,
            ms: 8,
            extended: false,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    });
    let mut io = h.create_pair(1, 16);
    let data = h.buffer(4096);
    data.write_bytes(0, &pattern(512, 3)).unwrap();
    let meta = h.buffer(4096);
    meta.write_bytes(0, &[0xa5; 8]).unwrap();
    let c = io.call(&h.m, rw(0x01, 4, 1, data.iova(), 0).put64(16, meta.iova()));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.m.namespace_metadata(1, 4, 1), vec![0xa5; 8]);
    h.assert_clean();
    let c = io.call(
        &h.m,
        rw(0x01, 5, 1, data.iova(), 0).put64(16, meta.iova() + 2),
    );
    assert_eq!(c.status, Status::INVALID_FIELD.with_dnr());
    let v = h.m.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("MPTR") && v[0].contains("not dword aligned"),
        "{v:?}"
    );
    h.assert_clean();
}

//! The model is as strict as the NVMe Base Specification 2.0 and QEMU's
//! hw/nvme where host tests would otherwise pass a driver bug: each test
//! asserts what the specification or QEMU does (found by a review of the
//! model; each failed against the model before).

use upnvme::Device;

use super::{Host, Sqe, rw};
use crate::{ModelConfig, NamespaceConfig, Status};

const PAGE: u64 = 4096;

/// PRP list chaining: the chain pointer (last entry of a list page) is a PRP
/// entry inside a list, so its offset must be 0 (QEMU: Invalid PRP Offset).
#[test]
fn a_prp_list_chain_pointer_needs_offset_0() {
    let mut h = Host::new();
    let mut q = h.create_pair(1, 16);
    let data = h.buffer(4 * PAGE as usize);
    let lists = h.buffer(2 * PAGE as usize);
    let l1 = lists.iova() + PAGE - 16; // room for 2 entries: 1 data + chain
    let l2 = lists.iova() + PAGE + 8; // chained list at a non-zero page offset
    lists
        .write_bytes((PAGE - 16) as usize, &(data.iova() + PAGE).to_le_bytes())
        .unwrap();
    lists
        .write_bytes((PAGE - 8) as usize, &l2.to_le_bytes())
        .unwrap();
    lists
        .write_bytes((PAGE + 8) as usize, &(data.iova() + 2 * PAGE).to_le_bytes())
        .unwrap();
    lists
        .write_bytes(
            (PAGE + 16) as usize,
            &(data.iova() + 3 * PAGE).to_le_bytes(),
        )
        .unwrap();
    let c = q.call(&h.m, rw(0x01, 0, 4, data.iova(), l1));
    assert_eq!(c.status.code_only(), Status::PRP_OFFSET_INVALID);
}

/// SGLs shall not be used for Admin commands over PCIe (QEMU: Invalid Field).
#[test]
fn admin_commands_take_no_sgl() {
    let mut h = Host::with(ModelConfig {
        sgls: 1,
        ..ModelConfig::default()
    });
    let buf = h.buffer(4096);
    // Identify Controller, PSDT 01b, SGL1 = one Data Block of 4096 bytes.
    let c = h.admin(
        Sqe::new(0x06)
            .flags(0x40)
            .put64(24, buf.iova())
            .put64(32, 4096)
            .cdw(10, 1),
    );
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
}

/// QEMU checks IV against the MSI-X table size whatever IEN says.
#[test]
fn the_cq_vector_is_checked_without_ien_too() {
    let mut h = Host::new();
    let cq = h.buffer(16 * 16);
    let c = h.admin(
        Sqe::new(0x05)
            .prp1(cq.iova())
            .cdw(10, (15 << 16) | 1)
            .cdw(11, 1 | (1000 << 16)),
    );
    assert_eq!(c.status.code_only(), Status::INVALID_INTERRUPT_VECTOR);
}

/// Number of Queues is for initialisation only: QEMU refuses it once any I/O
/// queue was created since the last reset, even if they were deleted.
#[test]
fn number_of_queues_is_refused_once_queues_were_created_until_a_reset() {
    let mut h = Host::new();
    let _q = h.create_pair(1, 16);
    assert_eq!(h.admin(Sqe::new(0x00).cdw(10, 1)).status, Status::SUCCESS);
    assert_eq!(h.admin(Sqe::new(0x04).cdw(10, 1)).status, Status::SUCCESS);
    let c = h.admin(Sqe::new(0x09).cdw(10, 0x07).cdw(11, 0x0003_0003));
    assert_eq!(c.status.code_only(), Status::COMMAND_SEQUENCE_ERROR);
}

/// QEMU checks Get Log Page's NUMD against MDTS (Invalid Field).
#[test]
fn get_log_page_above_mdts_is_refused() {
    let mut h = Host::new();
    let buf = h.buffer(4096);
    let numd = (1u32 << 20) / 4 - 1; // 1 MiB > MDTS 7 (512 KiB)
    let c = h.admin(
        Sqe::new(0x02)
            .nsid(0xffff_ffff)
            .prp1(buf.iova())
            .cdw(10, 0x02 | (numd & 0xffff) << 16)
            .cdw(11, numd >> 16),
    );
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
}

/// Once an event of a type is reported, further events of that type are
/// masked until the host reads its log page (RAE 0).
#[test]
fn an_event_type_is_masked_until_its_log_is_read() {
    let mut h = Host::new();
    h.admin.push(Sqe::new(0x0c));
    h.admin.push(Sqe::new(0x0c));
    h.admin.ring_sq(&h.m);
    h.m.raise_async_event(1, 0x01, 0x02); // SMART / Health, temperature
    h.m.raise_async_event(1, 0x01, 0x02);
    let mut n = 0;
    while h.admin.poll().is_some() {
        n += 1;
    }
    h.admin.ring_cq(&h.m);
    assert_eq!(n, 1, "second SMART event must be masked");
}

/// The host shall wait for CSTS.RDY = 0 before setting CC.EN to 1 again.
#[test]
fn cc_en_set_before_csts_rdy_cleared_is_a_violation() {
    let h = Host::with(ModelConfig {
        ready_delay_reads: 3,
        ..ModelConfig::default()
    });
    h.m.write32(0x14, 0x0046_0000);
    h.m.write32(0x14, 0x0046_0001); // no CSTS read in between
    assert!(!h.m.violations().is_empty(), "EN 1 while RDY still 1");
}

/// QEMU clears its AER mask on a controller reset; the model keeps the
/// Namespace Attribute Notice masked across CC.EN 1->0->1.
#[test]
fn a_reset_unmasks_the_namespace_notice() {
    let mut h = Host::new();
    h.admin(Sqe::new(0x09).cdw(10, 0x0b).cdw(11, 1 << 8));
    h.m.change_namespace(1, Some(NamespaceConfig::default())); // no AER: queued, masked
    h.m.write32(0x14, 0x0046_0000);
    while h.m.read32(0x1c) & 1 != 0 {}
    let mut h = {
        let Host { m, admin: _ } = h;
        drop(m.clone());
        // re-enable with a fresh admin queue
        let admin = super::Ring::new(&m, 0, 16);
        m.write64(0x28, admin.sq.iova());
        m.write64(0x30, admin.cq.iova());
        m.write32(0x14, super::CC_ENABLE);
        while m.read32(0x1c) & 1 == 0 {}
        Host { m, admin }
    };
    h.admin(Sqe::new(0x09).cdw(10, 0x0b).cdw(11, 1 << 8));
    h.admin.push(Sqe::new(0x0c));
    h.admin.ring_sq(&h.m);
    h.m.change_namespace(1, Some(NamespaceConfig::default()));
    assert!(h.admin.poll().is_some(), "QEMU would post the notice");
}

/// QEMU: I/O to an inactive (detached) NSID within NN is Invalid Field.
#[test]
fn io_to_a_detached_nsid_is_invalid_field() {
    let mut h = Host::with(ModelConfig {
        namespaces: vec![
            NamespaceConfig::default(),
            NamespaceConfig {
                nsid: 2,
                ..NamespaceConfig::default()
            },
        ],
        ..ModelConfig::default()
    });
    let mut q = h.create_pair(1, 16);
    h.m.change_namespace(2, None);
    let buf = h.buffer(4096);
    let c = q.call(&h.m, rw(0x02, 0, 1, buf.iova(), 0).nsid(2));
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
}

/// A data pointer the host may not build, or a transfer above MDTS, is a
/// host violation as well as an error status: QEMU answers with an error,
/// but a controller need not check ("the host shall"), and a driver test
/// that tolerates an error status (or a driver that retries or falls back)
/// would otherwise not notice that the driver built it.
#[test]
fn a_refused_data_pointer_or_mdts_is_a_host_violation() {
    let mut h = Host::new();
    let mut q = h.create_pair(1, 16);
    let data = h.buffer(2 * PAGE as usize);
    // Two blocks from offset 0: PRP2 must name the next page at offset 0.
    let c = q.call(&h.m, rw(0x02, 0, 2, data.iova(), data.iova() + PAGE + 8));
    assert_eq!(c.status.code_only(), Status::PRP_OFFSET_INVALID);
    assert_eq!(h.m.take_violations().len(), 1, "PRP2 offset");
    // PRP1 not dword aligned.
    let c = q.call(&h.m, rw(0x02, 0, 1, data.iova() + 2, 0));
    assert_eq!(c.status.code_only(), Status::PRP_OFFSET_INVALID);
    assert_eq!(h.m.take_violations().len(), 1, "PRP1 offset");
    // MDTS 7 (512 KiB): 129 blocks of 4 KiB.
    let c = q.call(&h.m, rw(0x02, 0, 129, data.iova(), 0));
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
    assert_eq!(h.m.take_violations().len(), 1, "above MDTS");
    // A Get Log Page above MDTS.
    let numd = (1u32 << 20) / 4 - 1;
    let c = h.admin(
        Sqe::new(0x02)
            .nsid(0xffff_ffff)
            .prp1(data.iova())
            .cdw(10, 0x02 | (numd & 0xffff) << 16)
            .cdw(11, numd >> 16),
    );
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
    assert_eq!(h.m.take_violations().len(), 1, "Get Log Page above MDTS");
    // PSDT 01b on a controller without SGLs.
    let c = q.call(&h.m, rw(0x02, 0, 1, data.iova(), 0).flags(0x40));
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
    assert_eq!(h.m.take_violations().len(), 1, "SGL without SGLS");
    h.assert_clean();
}

/// The same for SGLs: Data Blocks that describe less or more than the
/// transfer, and an SGL on an admin command.
#[test]
fn a_refused_sgl_is_a_host_violation() {
    let mut h = Host::with(ModelConfig {
        sgls: 1,
        ..ModelConfig::default()
    });
    let mut q = h.create_pair(1, 16);
    let data = h.buffer(3 * PAGE as usize);
    let data_block = |len: u64| rw(0x02, 0, 2, data.iova(), len).flags(0x40);
    let c = q.call(&h.m, data_block(PAGE));
    assert_eq!(c.status.code_only(), Status::new(0, 0x0f));
    assert_eq!(h.m.take_violations().len(), 1, "under-described");
    let c = q.call(&h.m, data_block(3 * PAGE));
    assert_eq!(c.status.code_only(), Status::new(0, 0x0f));
    assert_eq!(h.m.take_violations().len(), 1, "over-described");
    let c = q.call(&h.m, data_block(2 * PAGE));
    assert_eq!(c.status, Status::SUCCESS);
    let c = h.admin(
        Sqe::new(0x06)
            .flags(0x40)
            .put64(24, data.iova())
            .put64(32, 4096)
            .cdw(10, 1),
    );
    assert_eq!(c.status.code_only(), Status::INVALID_FIELD);
    assert_eq!(h.m.take_violations().len(), 1, "admin SGL");
    h.assert_clean();
}

/// An SGL segment is "a Qword aligned data structure" (NVMe Base 2.0,
/// "Scatter Gather List (SGL)"): a Last Segment descriptor whose Address is
/// 4 bytes into a qword is a host violation (Invalid SGL Segment
/// Descriptor), 8 bytes in is fine.
#[test]
fn an_sgl_segment_off_a_qword_is_a_host_violation() {
    let mut h = Host::with(ModelConfig {
        sgls: 1,
        ..ModelConfig::default()
    });
    let mut q = h.create_pair(1, 16);
    let data = h.buffer(2 * PAGE as usize);
    let lists = h.buffer(PAGE as usize);
    for at in [4u64, 8] {
        // Two Data Blocks of one page each at `at` bytes into the page.
        for (i, page) in [0u64, 1].into_iter().enumerate() {
            let d = at as usize + 16 * i;
            lists
                .write_bytes(d, &(data.iova() + page * PAGE).to_le_bytes())
                .unwrap();
            lists.write_bytes(d + 8, &PAGE.to_le_bytes()).unwrap();
        }
        let last_segment = 32 | 0x30 << 56;
        let c = q.call(
            &h.m,
            rw(0x02, 0, 2, lists.iova() + at, last_segment).flags(0x40),
        );
        if at == 4 {
            assert_eq!(c.status.code_only(), Status::new(0, 0x0d), "at {at}");
            assert_eq!(h.m.take_violations().len(), 1, "at {at}");
        } else {
            assert_eq!(c.status, Status::SUCCESS, "at {at}");
        }
    }
    h.assert_clean();
}

/// The mirror rule (CC.EN: clearing it from 1 to 0 while CSTS.RDY is 0 has
/// undefined results): after setting CC.EN the host waits for CSTS.RDY = 1
/// before clearing it. A controller that never becomes ready
/// (`Fault::NeverReady`) is not this: the host gives up after CAP.TO.
#[test]
fn cc_en_cleared_before_csts_rdy_set_is_a_violation() {
    let h = Host::with(ModelConfig {
        ready_delay_reads: 3,
        ..ModelConfig::default()
    });
    h.m.write32(0x14, 0x0046_0000);
    while h.m.read32(0x1c) & 1 != 0 {}
    h.m.write32(0x14, 0x0046_0001);
    h.m.write32(0x14, 0x0046_0000); // no CSTS read in between
    assert!(!h.m.take_violations().is_empty(), "EN 0 while RDY still 0");
    while h.m.read32(0x1c) & 1 != 0 {}
    h.m.write32(0x14, 0x0046_0001);
    while h.m.read32(0x1c) & 1 == 0 {}
    h.m.write32(0x14, 0x0046_0000);
    assert_eq!(h.m.violations(), Vec::<String>::new());
}

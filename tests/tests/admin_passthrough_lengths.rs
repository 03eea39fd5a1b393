//! admin_passthrough's length check (a data length shorter than the command
//! moves is refused: `admin.rs::a_passthrough_shorter_than_its_command_moves_is_refused`)
//! lets through the commands that move no data, sent the way libnvme and
//! nvme-cli send them (data_len 0, with NUMD 0 or Get Features SEL 011b).
//! The check runs before anything is sent, so whatever the model answers
//! afterwards (Invalid Opcode, Invalid Field, success) is fine; only the
//! driver's own refusal would be wrong (found in the session's final review).

mod common;

use common::setup;
use upnvme::queues::feature;
use upnvme::{Error, Sqe};
use upnvme_tests::ModelConfig;

fn refused_for_length(r: &upnvme::Result<(upnvme::Cqe, Vec<u8>)>) -> Option<String> {
    match r {
        Err(Error::InvalidArgument(m)) if m.contains("through its data pointer") => Some(m.clone()),
        _ => None,
    }
}

fn raw(opcode: u8, nsid: u32, cdw10: u32, cdw11: u32, cdw12: u32) -> Sqe {
    let mut sqe = Sqe::default();
    sqe.set_opcode(opcode);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cdw10);
    sqe.set_cdw(11, cdw11);
    sqe.set_cdw(12, cdw12);
    sqe
}

/// Directive Send, Identify directive, Enable Directive (DOPER 01h) of the
/// Streams directive: no data (Linux's nvme_enable_streams, libnvme's
/// nvme_directive_send with data_len 0 sets NUMD 0 and no buffer).
#[test]
fn directive_send_enable_streams_without_data_is_not_refused() {
    let (_m, c) = setup(ModelConfig::default());
    // CDW11: DOPER 01h (bits 7:0), DTYPE 00h Identify (bits 15:8).
    // CDW12: ENDIR (bit 0), TDTYPE 01h Streams (bits 15:8).
    let sqe = raw(0x19, 0xffff_ffff, 0, 0x01, 1 | (1 << 8));
    let r = c.admin_passthrough(sqe, 0, None);
    assert_eq!(refused_for_length(&r), None, "{r:?}");
}

/// Directive Receive, Streams, Allocate Resources (DOPER 03h): the answer is
/// in CQE DW0, no data.
#[test]
fn directive_receive_allocate_resources_without_data_is_not_refused() {
    let (_m, c) = setup(ModelConfig::default());
    let sqe = raw(0x1a, 1, 0, 0x03 | (1 << 8), 4);
    let r = c.admin_passthrough(sqe, 0, None);
    assert_eq!(refused_for_length(&r), None, "{r:?}");
}

/// Get Features with SEL 011b (Supported Capabilities) answers in CQE DW0 and
/// transfers no data structure (nvme-cli: `if (cfg.sel == 3) data_len = 0`).
#[test]
fn get_features_supported_capabilities_without_data_is_not_refused() {
    let (_m, c) = setup(ModelConfig::default());
    let sqe = Sqe::get_features(feature::TIMESTAMP, 3, 0);
    let r = c.admin_passthrough(sqe, 0, None);
    assert_eq!(refused_for_length(&r), None, "{r:?}");
}

/// A data length longer than the command moves is cut to what it moves: a
/// two-page Get Log Page described as three pages would get PRP2 pointing
/// at a PRP List, which the controller (moving two pages) takes as its
/// second data page — the log's second half landed in the driver's list
/// page and the caller read zeros (a review of the session's C API and CLI
/// passthrough, which hand the caller's length through).
#[test]
fn a_passthrough_longer_than_its_command_moves_returns_exactly_what_it_moves() {
    let (m, c) = setup(ModelConfig::default());
    // Error Information log (LID 01h), 8 KiB: 2048 dwords, RAE set.
    let sqe = Sqe::get_log_page(0x01, 0xffff_ffff, 2048, 0, true);
    let (_, exact) = c.admin_passthrough(sqe, 8192, None).unwrap();
    assert_eq!(exact.len(), 8192);
    let (_, longer) = c.admin_passthrough(sqe, 12288, None).unwrap();
    assert_eq!(longer.len(), 8192, "what the command moves");
    assert_eq!(longer, exact);
    // Identify with a page and a half described: one page back.
    let (_, id) = c
        .admin_passthrough(Sqe::identify(0x01, 0, 0), 6144, None)
        .unwrap();
    assert_eq!(id.len(), 4096);
    drop(c);
    common::assert_clean(&m);
}

//! `upnvme_ctrl_get_info`: what the controller supports, as the queue pairs
//! check it, on the in-memory model. A C program (the fio engine) could not
//! tell before its first command whether the controller offers Dataset
//! Management or Write Zeroes (Identify Controller ONCS), so a trim job met
//! `UPNVME_ENOTSUP` at every I/O; the query answers from the same Identify
//! data the pairs refuse commands by. The crate's modules are compiled in
//! with `#[path]`, as in tests/reentry.rs, so that `Ctrl` runs on the model.
#![allow(dead_code, missing_docs, non_camel_case_types)]

#[path = "../src/buf.rs"]
pub mod buf;
#[path = "../src/ctrl.rs"]
pub mod ctrl;
#[path = "../src/qpair.rs"]
pub mod qpair;
#[path = "../src/status.rs"]
pub mod status;

mod common;

use std::ffi::{CStr, c_char};
use std::mem::{offset_of, size_of};

use common::model_with;
use upnvme::QueuePairOptions;
use upnvme_tests::{ModelConfig, ModelController};

use ctrl::{Ctrl, UPNVME_ONCS_DSM, UPNVME_ONCS_WRITE_ZEROES, UPNVME_VWC_PRESENT, upnvme_ctrl_info};
use qpair::{Cmd, Qpair, upnvme_range};
use status::*;

fn handle(cfg: ModelConfig) -> Ctrl<ModelController> {
    Ctrl::new(model_with(cfg).1)
}

fn text(s: &[c_char]) -> String {
    assert_eq!(s.last(), Some(&0), "not NUL-terminated");
    // SAFETY: NUL-terminated (checked above), inside the array.
    unsafe { CStr::from_ptr(s.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// An 8-entry C API queue pair of `h`, and its queue ID.
fn pair(h: &Ctrl<ModelController>) -> (u16, Box<Qpair<ModelController>>) {
    let qp = h
        .get()
        .unwrap()
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            ..Default::default()
        })
        .unwrap();
    (qp.qid(), Box::new(Qpair::new(qp, h.nss.clone())))
}

/// Processes completions until nothing is outstanding (at most 5 s).
fn drain(qp: &mut Box<Qpair<ModelController>>) {
    let start = std::time::Instant::now();
    while qp.outstanding() > 0 && start.elapsed() < std::time::Duration::from_secs(5) {
        let p: *mut Qpair<ModelController> = &mut **qp;
        // SAFETY: a live pair of this thread.
        assert!(unsafe { Qpair::process_completions(p, 0) } >= 0);
    }
}

/// The status of a Dataset Management and a Write Zeroes submitted on a
/// pair of `h`: what the pairs make of the controller's ONCS.
fn submit_both(h: &Ctrl<ModelController>) -> (i32, i32) {
    let (_, mut qp) = pair(h);
    let ranges = [upnvme_range { slba: 0, blocks: 8 }];
    let dsm = Cmd::Deallocate { ranges: &ranges };
    let wz = Cmd::WriteZeroes {
        slba: 0,
        blocks: 8,
        deallocate: false,
    };
    // SAFETY: no buffer, no callback.
    let a = unsafe { qp.submit(1, dsm, std::ptr::null_mut(), None, std::ptr::null_mut()) };
    // SAFETY: as above.
    let b = unsafe { qp.submit(1, wz, std::ptr::null_mut(), None, std::ptr::null_mut()) };
    drain(&mut qp);
    assert_eq!(qp.outstanding(), 0);
    (a, b)
}

#[test]
fn the_info_says_what_the_pairs_accept() {
    let h = handle(ModelConfig {
        oncs: ModelConfig::ONCS_COMPARE,
        vwc: true,
        serial: "SER-42".into(),
        model: "a model without DSM".into(),
        firmware: "2.1".into(),
        vid: 0x1234,
        cntlid: 7,
        ..Default::default()
    });
    let i = h.info().unwrap();
    assert_eq!(i.size as usize, size_of::<upnvme_ctrl_info>());
    assert_eq!(i.oncs & (UPNVME_ONCS_DSM | UPNVME_ONCS_WRITE_ZEROES), 0);
    assert_ne!(i.vwc & UPNVME_VWC_PRESENT, 0);
    assert_eq!((i.vid, i.cntlid), (0x1234, 7));
    assert_eq!(text(&i.sn), "SER-42");
    assert_eq!(text(&i.mn), "a model without DSM");
    assert_eq!(text(&i.fr), "2.1");
    assert!(i.io_queues >= 1, "{i:?}");
    assert_eq!(
        submit_both(&h),
        (UPNVME_ENOTSUP, UPNVME_ENOTSUP),
        "the bits clear, and the pairs refuse both"
    );

    let h = handle(ModelConfig::default());
    let i = h.info().unwrap();
    assert_eq!(
        i.oncs & (UPNVME_ONCS_DSM | UPNVME_ONCS_WRITE_ZEROES),
        UPNVME_ONCS_DSM | UPNVME_ONCS_WRITE_ZEROES
    );
    assert_eq!(i.vwc & UPNVME_VWC_PRESENT, 0);
    assert_eq!(
        submit_both(&h),
        (UPNVME_OK, UPNVME_OK),
        "the bits set, and the pairs send both"
    );
}

/// A caller built against an older, shorter struct gets no byte past its
/// `sizeof`, and `size` tells it how much was filled.
#[test]
fn the_info_is_written_only_as_far_as_the_callers_struct_goes() {
    let h = handle(ModelConfig::default());
    let i = h.info().unwrap();
    let old = offset_of!(upnvme_ctrl_info, sn);
    let mut mem = [0xa5u8; size_of::<upnvme_ctrl_info>() + 8];
    let p = mem.as_mut_ptr().cast::<upnvme_ctrl_info>();
    // SAFETY: `old` bytes of `mem` are writable.
    assert_eq!(unsafe { write_sized(p, old, i) }, UPNVME_OK);
    assert!(
        mem[old..].iter().all(|&b| b == 0xa5),
        "wrote past the struct"
    );
    assert_eq!(
        u32::from_ne_bytes(mem[..4].try_into().unwrap()) as usize,
        old
    );
    let oncs = offset_of!(upnvme_ctrl_info, oncs);
    assert_eq!(
        u16::from_ne_bytes(mem[oncs..oncs + 2].try_into().unwrap()),
        i.oncs
    );
    // A longer struct than the library's (a newer header): the library's
    // bytes only, and `size` says so.
    let mut mem = [0xa5u8; size_of::<upnvme_ctrl_info>() + 8];
    let p = mem.as_mut_ptr().cast::<upnvme_ctrl_info>();
    // SAFETY: `mem` is writable for its whole length.
    assert_eq!(unsafe { write_sized(p, mem.len(), i) }, UPNVME_OK);
    assert_eq!(
        u32::from_ne_bytes(mem[..4].try_into().unwrap()) as usize,
        size_of::<upnvme_ctrl_info>()
    );
    assert!(
        mem[size_of::<upnvme_ctrl_info>()..]
            .iter()
            .all(|&b| b == 0xa5)
    );
}

/// NULL and a `size` too small for the `size` field are refused before
/// anything is written, each with its reason.
#[test]
fn the_info_call_refuses_null_and_tiny_sizes() {
    let mut info = upnvme_c::upnvme_ctrl_info::default();
    let last = || {
        // SAFETY: this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(upnvme_c::upnvme_last_error()) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: NULL is refused before any use.
    let rc = unsafe {
        upnvme_c::upnvme_ctrl_get_info_sized(std::ptr::null(), std::ptr::null_mut(), 104)
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(last().contains("info NULL"), "{}", last());
    let mut bytes = [0xa5u8; 8];
    // SAFETY: a size below 4 is refused before any write.
    let rc = unsafe {
        upnvme_c::upnvme_ctrl_get_info_sized(std::ptr::null(), bytes.as_mut_ptr().cast(), 2)
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert_eq!(bytes, [0xa5; 8]);
    // SAFETY: `info` is valid; the NULL handle is refused.
    let rc = unsafe {
        upnvme_c::upnvme_ctrl_get_info_sized(
            std::ptr::null(),
            &raw mut info,
            size_of::<upnvme_c::upnvme_ctrl_info>(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(last().contains("controller handle is NULL"), "{}", last());
}

/// The layout C callers compile against: fields only ever added at the end.
#[test]
fn the_info_layout_is_pinned() {
    assert_eq!(size_of::<upnvme_ctrl_info>(), 116);
    assert_eq!(offset_of!(upnvme_ctrl_info, oncs), 12);
    assert_eq!(offset_of!(upnvme_ctrl_info, vwc), 14);
    assert_eq!(offset_of!(upnvme_ctrl_info, io_queues), 28);
    assert_eq!(offset_of!(upnvme_ctrl_info, sn), 32);
    assert_eq!(offset_of!(upnvme_ctrl_info, mn), 53);
    assert_eq!(offset_of!(upnvme_ctrl_info, fr), 94);
    assert_eq!(offset_of!(upnvme_ctrl_info, crdt), 104);
    // The padding after `crdt` is reserved (`rsvd110`): an older library
    // writes it, so `ocfs` and `cdfe` start past the old sizeof, 112.
    assert_eq!(offset_of!(upnvme_ctrl_info, rsvd110), 110);
    assert_eq!(offset_of!(upnvme_ctrl_info, ocfs), 112);
    assert_eq!(offset_of!(upnvme_ctrl_info, cdfe), 114);
    // `crd` took the padding byte after `dnr`: no other field moved.
    assert_eq!(offset_of!(qpair::upnvme_cpl, crd), 7);
    assert_eq!(offset_of!(qpair::upnvme_cpl, dw0), 8);
    assert_eq!(offset_of!(qpair::upnvme_cpl, buf), 16);
    // `md` was added after `buf`: the library writes the completion and
    // passes it by pointer, so a caller built before it reads what it knows.
    assert_eq!(offset_of!(qpair::upnvme_cpl, md), 24);
    assert_eq!(size_of::<qpair::upnvme_cpl>(), 32);
    // `pi_first` and `pi_guard_bits` took the padding after `dlfeat`.
    assert_eq!(offset_of!(ctrl::upnvme_ns_info, dlfeat), 28);
    assert_eq!(offset_of!(ctrl::upnvme_ns_info, pi_first), 29);
    assert_eq!(offset_of!(ctrl::upnvme_ns_info, pi_guard_bits), 30);
    assert_eq!(size_of::<ctrl::upnvme_ns_info>(), 32);
    // Size-versioned by its `size`: fields only ever added at the end.
    assert_eq!(offset_of!(qpair::upnvme_io_ext, flags), 4);
    assert_eq!(offset_of!(qpair::upnvme_io_ext, md), 8);
    assert_eq!(offset_of!(qpair::upnvme_io_ext, pi), 16);
    assert_eq!(offset_of!(qpair::upnvme_io_ext, app_tag), 20);
    assert_eq!(offset_of!(qpair::upnvme_io_ext, app_tag_mask), 22);
    assert_eq!(offset_of!(qpair::upnvme_io_ext, ref_tag), 24);
    assert_eq!(size_of::<qpair::upnvme_io_ext>(), 32);
    assert_eq!(offset_of!(ctrl::upnvme_admin_cpl, crd), 11);
    assert_eq!(size_of::<ctrl::upnvme_admin_cpl>(), 12);
}

/// Every field lies wholly past the `sizeof` of each earlier version of the
/// struct that lacked it. An older library writes its whole struct, tail
/// padding included, and sets `size` to that `sizeof`; a field placed in
/// that padding would pass `UPNVME_CTRL_INFO_HAS` in a program built
/// against the newer header while holding the older library's padding
/// bytes (as the options structs' rule, tests.rs::options_struct_sizes_are_pinned).
#[test]
fn fields_added_later_are_not_filled_by_an_older_library() {
    // `UPNVME_CTRL_INFO_HAS(&info, field)` for an `info.size` of `size`.
    let has = |offset: usize, len: usize, size: usize| offset + len <= size;
    // Up to `fr`: sizeof 104. Up to `crdt`: sizeof 112.
    assert!(!has(offset_of!(upnvme_ctrl_info, crdt), 6, 104));
    assert!(!has(offset_of!(upnvme_ctrl_info, ocfs), 2, 112));
    assert!(!has(offset_of!(upnvme_ctrl_info, cdfe), 2, 112));
}

unsafe extern "C" fn keep_cpl(arg: *mut std::ffi::c_void, cpl: *const qpair::upnvme_cpl) {
    // SAFETY: `cpl` is valid for the call.
    let cpl = unsafe { *cpl };
    // SAFETY: the test's `Option<upnvme_cpl>`, alive until the pair is
    // drained.
    unsafe { *arg.cast::<Option<qpair::upnvme_cpl>>() = Some(cpl) };
}

/// A failed completion carries its Command Retry Delay (`crd`) and the info
/// the CRDT it selects: `crdt[crd - 1]` × 100 ms.
#[test]
fn a_failed_completion_carries_crd_and_the_info_crdt() {
    let (m, c) = model_with(ModelConfig {
        crdt: [4, 9, 0],
        ..Default::default()
    });
    let h = Ctrl::new(c);
    assert_eq!(h.info().unwrap().crdt, [4, 9, 0]);
    let (qid, mut qp) = pair(&h);
    // Namespace Not Ready (SC 82h) with CRD 2, then with CRD 2 and DNR.
    for (raw, dnr) in [
        (0x0082 | 2 << 11, false),
        (0x0082 | 2 << 11 | 1 << 14, true),
    ] {
        m.inject(upnvme_tests::Fault::Status {
            on: upnvme_tests::Match::Queue(qid),
            status: upnvme_tests::Status(raw),
        });
        let mut got: Option<qpair::upnvme_cpl> = None;
        let wz = Cmd::WriteZeroes {
            slba: 0,
            blocks: 8,
            deallocate: false,
        };
        let arg: *mut Option<qpair::upnvme_cpl> = &mut got;
        // SAFETY: no buffer; the callback's argument outlives the command
        // (the loop below drains the pair).
        let rc = unsafe { qp.submit(1, wz, std::ptr::null_mut(), Some(keep_cpl), arg.cast()) };
        assert_eq!(rc, UPNVME_OK);
        drain(&mut qp);
        let cpl = got.expect("the callback ran");
        assert_eq!(cpl.status, UPNVME_EIO);
        assert_eq!((cpl.sct, cpl.sc, cpl.dnr, cpl.crd), (0, 0x82, dnr, 2));
    }
}

/// The namespace info carries DLFEAT (what a deallocated block reads as),
/// in the padding byte after `pi_type`: no field moved.
#[test]
fn the_namespace_info_carries_dlfeat() {
    let h = handle(ModelConfig::default());
    let i = h.ns_info(1).unwrap();
    // The model: reads as zeroes (001b), Write Zeroes deallocates (bit 3).
    assert_eq!(i.dlfeat, 0x09);
    assert_eq!(i.dlfeat & 7, ctrl::UPNVME_DLFEAT_READS_ZEROES);
    assert_eq!(offset_of!(ctrl::upnvme_ns_info, pi_type), 27);
    assert_eq!(offset_of!(ctrl::upnvme_ns_info, dlfeat), 28);
    assert_eq!(size_of::<ctrl::upnvme_ns_info>(), 32);
}

//! Host tests of metadata and End-to-end Data Protection against the model,
//! which keeps each block's metadata beside its data and implements PRACT
//! and PRCHK from the specification (tests/src/model/pi.rs): extended-LBA
//! and separate-buffer round trips checked against the model's storage,
//! PRACT insert/strip, host-built PI, each typed check error, the refusals,
//! and Format NVM with the handle refresh.

mod common;

use common::{assert_clean, buffer_with, pattern, read_back, run_io, setup};
use upnvme::pi::{PiFormat, Pif};
use upnvme::{
    FormatNvm, IoCommand, IoData, IoError, IoVec, PiCheck, Protection, QueuePairOptions, Reject,
    SglMode,
};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

const BS: usize = 512;
const BLOCKS: u64 = 4096;

fn with_format(ms: u16, extended: bool, pi_type: u8, pi_first: bool) -> ModelConfig {
    ModelConfig {
        oncs: ModelConfig::ONCS_COMPARE
            | ModelConfig::ONCS_DSM
            | ModelConfig::ONCS_WRITE_ZEROES
            | ModelConfig::ONCS_VERIFY,
        sgls: 1,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: BLOCKS,
            ms,
            extended,
            pi_type,
            pi_first,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

fn write(slba: u64, blocks: u32, ns: &upnvme::Namespace) -> IoCommand<'_> {
    IoCommand::Write { ns, slba, blocks }
}

fn read(slba: u64, blocks: u32, ns: &upnvme::Namespace) -> IoCommand<'_> {
    IoCommand::Read { ns, slba, blocks }
}

/// Interleaves data and metadata into an extended-LBA buffer.
fn interleave(data: &[u8], md: &[u8], ms: usize) -> Vec<u8> {
    data.chunks(BS)
        .zip(md.chunks(ms))
        .flat_map(|(d, m)| d.iter().chain(m).copied())
        .collect()
}

#[test]
fn extended_lba_round_trip_lands_data_and_metadata_in_their_places() {
    let (m, c) = setup(with_format(8, true, 0, false));
    let ns = c.namespace(1).unwrap().clone();
    let layout = ns.metadata_layout().unwrap();
    assert!(layout.extended && layout.ms == 8 && layout.pi_type == 0);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let (data, md) = (pattern(1, 9 * BS), pattern(2, 9 * 8));
    let host = interleave(&data, &md, 8);
    let c1 = run_io(&mut qp, write(100, 9, &ns), buffer_with(&c, &host).into());
    assert!(c1.is_ok(), "{:?}", c1.result);
    assert_eq!(m.namespace_data(1, 100, 9), data);
    assert_eq!(m.namespace_metadata(1, 100, 9), md);
    // Read back through a vector of odd pieces (an SGL): byte exact.
    let mut v = IoVec::new();
    let total = host.len();
    for (i, len) in [100usize, 2000, 1, total - 2101].into_iter().enumerate() {
        v.push(c.alloc_dma(len + 4 * i).unwrap(), 4 * i, len)
            .unwrap();
    }
    let r = run_io(&mut qp, read(100, 9, &ns), IoData::vectored(v));
    assert!(r.is_ok(), "{:?}", r.result);
    let back: Vec<u8> = r
        .segments
        .unwrap()
        .segments()
        .iter()
        .flat_map(|s| {
            let mut b = vec![0u8; s.len()];
            s.buffer().read_bytes(s.offset(), &mut b).unwrap();
            b
        })
        .collect();
    assert_eq!(back, host);
    // Too small a buffer for data + metadata is refused.
    let f = qp
        .submit_io(
            write(0, 2, &ns),
            IoData::slice(c.alloc_dma(2 * BS).unwrap(), 0, 2 * BS),
            1,
        )
        .unwrap_err();
    assert_eq!(
        f.reason,
        Reject::BufferTooSmall {
            need: 2 * (BS as u64 + 8)
        }
    );
    // A metadata buffer has no place here.
    let f = qp
        .submit_io(
            write(0, 1, &ns),
            IoData::buffer(c.alloc_dma(BS + 8).unwrap()).metadata(c.alloc_dma(8).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(f.reason, Reject::MetadataNotApplicable);
    assert!(f.metadata.is_some() && f.buffer.is_some());
    drop(qp);
    assert_clean(&m);
}

#[test]
fn separate_metadata_goes_through_mptr_with_prp_and_sgl_data() {
    let (m, c) = setup(with_format(16, false, 0, false));
    let ns = c.namespace(1).unwrap().clone();
    for mode in [SglMode::Never, SglMode::Always] {
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                sgl: mode,
                ..QueuePairOptions::default()
            })
            .unwrap();
        let (data, md) = (pattern(3, 12 * BS), pattern(4, 12 * 16));
        let io = IoData::buffer(buffer_with(&c, &data)).metadata(buffer_with(&c, &md));
        let w = run_io(&mut qp, write(8, 12, &ns), io);
        assert!(w.is_ok(), "{mode:?}: {:?}", w.result);
        assert!(w.metadata.is_some(), "the metadata buffer comes back");
        assert_eq!(m.namespace_data(1, 8, 12), data);
        assert_eq!(m.namespace_metadata(1, 8, 12), md);
        let io = IoData::buffer(c.alloc_dma(12 * BS).unwrap()).metadata(c.alloc_dma(4096).unwrap());
        let r = run_io(&mut qp, read(8, 12, &ns), io);
        assert!(r.is_ok(), "{:?}", r.result);
        assert_eq!(read_back(r.buffer.as_ref().unwrap(), data.len()), data);
        assert_eq!(read_back(r.metadata.as_ref().unwrap(), md.len()), md);
        // Without a metadata buffer, or with one too small: refused.
        let f = qp
            .submit(read(8, 12, &ns), Some(c.alloc_dma(12 * BS).unwrap()), 1)
            .unwrap_err();
        assert_eq!(f.reason, Reject::MetadataBuffer { need: 12 * 16 });
        let f = qp
            .submit_io(
                read(8, 12, &ns),
                IoData::buffer(c.alloc_dma(12 * BS).unwrap())
                    .metadata(c.alloc_dma(4096).unwrap().split(128).unwrap().remove(0)),
                1,
            )
            .unwrap_err();
        assert_eq!(f.reason, Reject::MetadataBuffer { need: 12 * 16 });
        assert!(f.metadata.is_some());
        assert_eq!(
            qp.describe(f.reason).to_string(),
            "invalid argument: the namespace keeps metadata in a separate buffer: pass one of at \
             least 192 bytes (blocks × metadata size) with IoData::metadata"
        );
    }
    assert_clean(&m);
}

#[test]
fn pract_generates_and_strips_pi_for_eight_byte_metadata() {
    for extended in [false, true] {
        let (m, c) = setup(with_format(8, extended, 1, false));
        let ns = c.namespace(1).unwrap().clone();
        let fmt = ns.pi_format().unwrap();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        // PRACT with 8-byte metadata: only data moves, in either layout.
        let data = pattern(5, 4 * BS);
        let io = IoData::buffer(buffer_with(&c, &data)).protection(Protection::PRACT);
        let w = run_io(&mut qp, write(40, 4, &ns), io);
        assert!(w.is_ok(), "{:?}", w.result);
        // The controller stored a tuple per block: guard over the data,
        // reference tag = LBA (Type 1).
        let md = m.namespace_metadata(1, 40, 4);
        for (i, chunk) in md.chunks(8).enumerate() {
            let t = fmt.tuple(chunk).unwrap();
            assert_eq!(
                t.guard,
                u64::from(upnvme::pi::guard(&data[i * BS..(i + 1) * BS], &[]))
            );
            assert_eq!(t.ref_tag, 40 + i as u64);
        }
        let io = IoData::buffer(c.alloc_dma(4 * BS).unwrap()).protection(Protection::PRACT);
        let r = run_io(&mut qp, read(40, 4, &ns), io);
        assert!(r.is_ok(), "{:?}", r.result);
        assert_eq!(read_back(r.buffer.as_ref().unwrap(), data.len()), data);
        // Without PRACT the tuples come to the host, and check.
        let io = if extended {
            IoData::buffer(c.alloc_dma(4 * (BS + 8)).unwrap())
        } else {
            IoData::buffer(c.alloc_dma(4 * BS).unwrap()).metadata(c.alloc_dma(32).unwrap())
        };
        let r = run_io(&mut qp, read(40, 4, &ns), io.protection(Protection::CHECK));
        assert!(r.is_ok(), "{:?}", r.result);
        let got_md = if extended {
            let b = read_back(r.buffer.as_ref().unwrap(), 4 * (BS + 8));
            b.chunks(BS + 8).flat_map(|c| c[BS..].to_vec()).collect()
        } else {
            read_back(r.metadata.as_ref().unwrap(), 32)
        };
        assert_eq!(got_md, md);
        // PRACT with a metadata buffer: nothing would use it.
        let f = qp
            .submit_io(
                write(40, 1, &ns),
                IoData::buffer(c.alloc_dma(BS).unwrap())
                    .metadata(c.alloc_dma(8).unwrap())
                    .protection(Protection::PRACT),
                1,
            )
            .unwrap_err();
        assert_eq!(f.reason, Reject::MetadataNotApplicable);
        // PRACT on Verify and Compare: nothing to insert or strip. QEMU
        // answers Invalid Protection Information (SCT 1h, SC 81h), and so
        // does the model; the driver sends what was asked.
        let verify = IoCommand::Verify {
            ns: &ns,
            slba: 40,
            blocks: 4,
        };
        let compare = IoCommand::Compare {
            ns: &ns,
            slba: 40,
            blocks: 4,
        };
        for (cmd, io) in [
            (verify, IoData::none()),
            (compare, IoData::buffer(buffer_with(&c, &data))),
        ] {
            let e = run_io(&mut qp, cmd, io.protection(Protection::PRACT));
            let text = match e.result {
                Err(err) => err.to_string(),
                Ok(_) => format!("{} with PRACT succeeded", cmd.name()),
            };
            assert!(
                text.contains("Invalid Protection Information"),
                "{}: {text}",
                cmd.name()
            );
        }
        drop(qp);
        assert_clean(&m);
    }
}

#[test]
fn host_built_pi_is_checked_and_each_mismatch_is_typed() {
    // Type 1, 16 metadata bytes with the PI in the last 8: the guard covers
    // the 8 bytes before it too.
    let (m, c) = setup(with_format(16, true, 1, false));
    let ns = c.namespace(1).unwrap().clone();
    let fmt: PiFormat = ns.pi_format().unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let stride = BS + 16;
    let mut host = pattern(6, 3 * stride);
    assert!(fmt.protect_extended(&mut host, 0x1234, 200));
    let check_all = Protection {
        check_app_tag: true,
        app_tag: 0x1234,
        app_tag_mask: 0xffff,
        ..Protection::CHECK
    };
    let w = run_io(
        &mut qp,
        write(200, 3, &ns),
        IoData::buffer(buffer_with(&c, &host)).protection(check_all),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let r = run_io(
        &mut qp,
        read(200, 3, &ns),
        IoData::buffer(c.alloc_dma(3 * stride).unwrap()).protection(check_all),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), host.len()), host);

    // One flipped data byte: guard error, nothing stored.
    let mut bad = host.clone();
    bad[stride + 7] ^= 1;
    let e = run_io(
        &mut qp,
        write(200, 3, &ns),
        IoData::buffer(buffer_with(&c, &bad)).protection(check_all),
    );
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::Guard,
                ..
            })
        ),
        "{:?}",
        e.result
    );
    // Another application tag under the mask.
    let mut other = pattern(6, 3 * stride);
    assert!(fmt.protect_extended(&mut other, 0x1235, 200));
    let e = run_io(
        &mut qp,
        write(200, 3, &ns),
        IoData::buffer(buffer_with(&c, &other)).protection(check_all),
    );
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::ApplicationTag,
                ..
            })
        ),
        "{:?}",
        e.result
    );
    // Tuples tagged for other LBAs.
    let mut shifted = pattern(6, 3 * stride);
    assert!(fmt.protect_extended(&mut shifted, 0x1234, 201));
    let e = run_io(
        &mut qp,
        write(200, 3, &ns),
        IoData::buffer(buffer_with(&c, &shifted)).protection(check_all),
    );
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::ReferenceTag,
                ..
            })
        ),
        "{:?}",
        e.result
    );
    assert_eq!(m.namespace_data(1, 200, 3), {
        let d: Vec<u8> = host.chunks(stride).flat_map(|b| b[..BS].to_vec()).collect();
        d
    });
    // Written without checks, a bad guard is caught on the read and by
    // Verify.
    let w = run_io(&mut qp, write(300, 3, &ns), buffer_with(&c, &bad).into());
    assert!(w.is_ok(), "{:?}", w.result);
    // (Block 0's tuple is tagged for LBA 200: check the guard only.)
    let guard_only = Protection {
        check_guard: true,
        ..Protection::default()
    };
    let e = run_io(
        &mut qp,
        read(300, 3, &ns),
        IoData::buffer(c.alloc_dma(3 * stride).unwrap()).protection(guard_only),
    );
    assert!(matches!(
        e.result,
        Err(IoError::Protection {
            check: PiCheck::Guard,
            ..
        })
    ));
    assert!(
        e.result.unwrap_err().to_string().contains("guard"),
        "the message names the field"
    );
    let verify = IoCommand::Verify {
        ns: &ns,
        slba: 300,
        blocks: 3,
    };
    let e = run_io(&mut qp, verify, IoData::none().protection(guard_only));
    assert!(matches!(
        e.result,
        Err(IoError::Protection {
            check: PiCheck::Guard,
            ..
        })
    ));
    // Unwritten blocks carry an all-FFh tuple: checks are off for them.
    let r = run_io(
        &mut qp,
        read(1000, 2, &ns),
        IoData::buffer(c.alloc_dma(2 * stride).unwrap()).protection(Protection::CHECK),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    drop(qp);
    assert_clean(&m);
}

#[test]
fn pi_first_and_type_3_keep_their_rules() {
    // Type 3, PI in the first 8 of 16 bytes, separate buffer: PRACT with
    // 16-byte metadata still moves the metadata; the controller fills the
    // tuple, the host's other 8 bytes stay; the reference tag does not count.
    let (m, c) = setup(with_format(16, false, 3, true));
    let ns = c.namespace(1).unwrap().clone();
    let fmt = ns.pi_format().unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(7, 2 * BS);
    let md = pattern(8, 32);
    // (Type 3 has no reference tag to check: the driver refuses that.)
    let f = qp
        .submit_io(
            write(10, 2, &ns),
            IoData::buffer(c.alloc_dma(2 * BS).unwrap())
                .metadata(c.alloc_dma(32).unwrap())
                .protection(Protection::PRACT),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("Type 3")),
        "{:?}",
        f.reason
    );
    let p = Protection {
        ref_tag: Some(0xabcd),
        app_tag: 9,
        check_ref_tag: false,
        ..Protection::PRACT
    };
    let io = IoData::buffer(buffer_with(&c, &data))
        .metadata(buffer_with(&c, &md))
        .protection(p);
    let w = run_io(&mut qp, write(10, 2, &ns), io);
    assert!(w.is_ok(), "{:?}", w.result);
    let stored = m.namespace_metadata(1, 10, 2);
    for (i, chunk) in stored.chunks(16).enumerate() {
        let t = fmt.tuple(chunk).unwrap();
        assert_eq!((t.ref_tag, t.app_tag), (0xabcd, 9));
        assert_eq!(
            t.guard,
            u64::from(upnvme::pi::guard(&data[i * BS..(i + 1) * BS], &[]))
        );
        assert_eq!(&chunk[8..], &md[i * 16 + 8..(i + 1) * 16]);
    }
    drop(qp);
    assert_clean(&m);
}

#[test]
fn protection_refusals_say_what_is_wrong() {
    // No PI on this namespace.
    let (m, c) = setup(with_format(8, false, 0, false));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let f = qp
        .submit_io(
            write(0, 1, &ns),
            IoData::buffer(c.alloc_dma(BS).unwrap())
                .metadata(c.alloc_dma(8).unwrap())
                .protection(Protection::PRACT),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("DPS")),
        "{:?}",
        f.reason
    );
    // Flush has no protection fields and no metadata.
    let f = qp
        .submit_io(
            IoCommand::Flush { ns: &ns },
            IoData::none().protection(Protection::PRACT),
            1,
        )
        .unwrap_err();
    assert!(matches!(f.reason, Reject::ProtectionNotApplicable(_)));
    let f = qp
        .submit_io(
            IoCommand::Flush { ns: &ns },
            IoData::none().metadata(c.alloc_dma(8).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(f.reason, Reject::MetadataNotApplicable);
    drop(qp);
    drop(c);
    assert_clean(&m);

    // PI namespace: Write Zeroes takes PRACT only.
    let (m, c) = setup(with_format(8, true, 2, false));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks: 4,
        deallocate: false,
    };
    let f = qp
        .submit_io(wz, IoData::none().protection(Protection::CHECK), 1)
        .unwrap_err();
    assert!(matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("Write Zeroes")));
    let pract_only = Protection {
        pract: true,
        ..Protection::default()
    };
    let z = run_io(&mut qp, wz, IoData::none().protection(pract_only));
    assert!(z.is_ok(), "{:?}", z.result);
    drop(qp);
    drop(c);
    assert_clean(&m);

    // Type 1 takes the reference tag from the LBA (the model, like QEMU,
    // fails a checked other tag with Invalid Protection Information, and
    // PRACT would store it): an explicit other tag is refused, checked or
    // not; the SLBA's own lower bits are taken.
    let (m, c) = setup(with_format(8, true, 1, false));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let fetched = m.commands_fetched();
    for check_ref_tag in [true, false] {
        let p = Protection {
            ref_tag: Some(7),
            check_ref_tag,
            ..Protection::PRACT
        };
        let f = qp
            .submit_io(
                write(6, 1, &ns),
                IoData::buffer(c.alloc_dma(BS).unwrap()).protection(p),
                1,
            )
            .unwrap_err();
        assert!(
            matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("Type 1")),
            "{:?}",
            f.reason
        );
        assert!(f.buffer.is_some(), "the refused buffer comes back");
    }
    assert_eq!(m.commands_fetched(), fetched, "nothing reached the device");
    let own = Protection {
        ref_tag: Some((1 << 32) + 6),
        ..Protection::PRACT
    };
    let f = qp
        .submit_io(
            write(6, 1, &ns),
            IoData::buffer(c.alloc_dma(BS).unwrap()).protection(own),
            1,
        )
        .unwrap_err();
    assert!(matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("wider")));
    let own = Protection {
        ref_tag: Some(6),
        check_ref_tag: true,
        ..Protection::PRACT
    };
    let data = pattern(31, BS);
    let w = run_io(
        &mut qp,
        write(6, 1, &ns),
        IoData::buffer(buffer_with(&c, &data)).protection(own),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let r = run_io(
        &mut qp,
        read(6, 1, &ns),
        IoData::buffer(c.alloc_dma(BS).unwrap()).protection(Protection {
            check_ref_tag: true,
            ..Protection::PRACT
        }),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), BS), data);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn format_nvm_changes_the_geometry_and_retires_old_handles() {
    let (m, mut c) = setup(with_format(0, false, 0, false));
    let old = c.namespace(1).unwrap().clone();
    assert!(old.metadata_layout().is_none());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let w = run_io(
        &mut qp,
        write(0, 1, &old),
        buffer_with(&c, &pattern(9, BS)).into(),
    );
    assert!(w.is_ok());
    drop(qp);
    // LBA format 5 of the model: 4096 + 8, extended, PI Type 1.
    let new = c
        .format_nvm(
            1,
            &FormatNvm {
                extended: true,
                pi_type: 1,
                ..FormatNvm::lbaf(5)
            },
        )
        .unwrap();
    assert!(old.is_stale() && !new.is_stale());
    assert_eq!(new.lba_size(), 4096);
    let layout = new.metadata_layout().unwrap();
    assert!(layout.extended && layout.ms == 8 && layout.pi_type == 1);
    assert_eq!(
        new.lba_count(),
        BLOCKS * BS as u64 / (4096 + 8),
        "capacity follows the new format"
    );
    assert_eq!(c.namespace(1).unwrap().lba_size(), 4096);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let f = qp
        .submit(read(0, 1, &old), Some(c.alloc_dma(BS).unwrap()), 1)
        .unwrap_err();
    assert_eq!(f.reason, Reject::StaleNamespace { nsid: 1 });
    assert!(
        qp.describe(f.reason)
            .to_string()
            .contains("Controller::namespace(1)")
    );
    // The new handle works; the data was erased.
    let io = IoData::buffer(c.alloc_dma(4096).unwrap()).protection(Protection::PRACT);
    let r = run_io(&mut qp, read(0, 1, &new), io);
    assert!(r.is_ok(), "{:?}", r.result);
    assert!(
        read_back(r.buffer.as_ref().unwrap(), 4096)
            .iter()
            .all(|&b| b == 0)
    );
    drop(qp);
    // Bad arguments are refused before anything is sent.
    let fetched = m.commands_fetched();
    for (f, text) in [
        (FormatNvm::lbaf(8), "LBA format 8 does not exist"),
        (
            FormatNvm {
                pi_type: 1,
                ..FormatNvm::lbaf(0)
            },
            "needs 8 or more metadata bytes",
        ),
        (
            FormatNvm {
                pi_type: 4,
                ..FormatNvm::lbaf(1)
            },
            "PI type 4",
        ),
    ] {
        let e = c.format_nvm(1, &f).unwrap_err().to_string();
        assert!(e.contains(text), "{e}");
    }
    assert_eq!(m.commands_fetched(), fetched);
    // And back to no metadata.
    let back = c.format_nvm(1, &FormatNvm::lbaf(0)).unwrap();
    assert!(back.metadata_layout().is_none() && back.lba_size() == 512);
    assert_clean(&m);
}

/// Format NVM refusals say what the namespace offers instead (a review):
/// a PI type or location DPC lacks names the ones it has, and the tuple's
/// real size (16 bytes with a 64-bit guard, not always 8); a target format
/// whose ELBAF.PIF is reserved (the namespace would be unusable after it) and
/// a timeout of zero (the wait would end while the controller formats) are
/// refused. No Format NVM is sent for any.
#[test]
fn format_nvm_refusals_name_what_the_namespace_offers() {
    let m = ModelController::new(ModelConfig {
        elbas: true,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: BLOCKS,
            dpc: 0x09, // Type 1, in the first bytes only
            ..NamespaceConfig::default()
        }],
        ..with_format(0, false, 0, false)
    });
    // CNS 05h: ELBAF2 (512 + 16) a 64-bit guard, ELBAF6 (4096 + 16) PIF 11b.
    let mut nvm = vec![0u8; 4096];
    nvm[12 + 4 * 2..16 + 4 * 2].copy_from_slice(&(2u32 << 7).to_le_bytes());
    nvm[12 + 4 * 6..16 + 4 * 6].copy_from_slice(&(3u32 << 7).to_le_bytes());
    m.set_identify_data(0x05, 1, Some(nvm));
    let mut c = common::open(&m, common::opts());
    let refusals = [
        (
            FormatNvm {
                pi_type: 1,
                ..FormatNvm::lbaf(1)
            },
            "invalid argument: Format NVM of namespace 1: PI type 1 in the last 8 metadata bytes \
             is not offered (Identify Namespace DPC = 0x9): it offers type 1 in the first bytes",
        ),
        (
            FormatNvm {
                pi_type: 2,
                pi_first: true,
                ..FormatNvm::lbaf(2)
            },
            "invalid argument: Format NVM of namespace 1: PI type 2 in the first 16 metadata \
             bytes is not offered (Identify Namespace DPC = 0x9): it offers type 1 in the first \
             bytes",
        ),
        (
            FormatNvm {
                pi_type: 1,
                pi_first: true,
                ..FormatNvm::lbaf(6)
            },
            "invalid argument: Format NVM of namespace 1: LBA format 6's protection information \
             format (ELBAF.PIF 3) is reserved: the driver could not use the namespace after it; \
             choose another LBA format",
        ),
        (
            FormatNvm {
                timeout: Some(std::time::Duration::ZERO),
                ..FormatNvm::lbaf(4)
            },
            "invalid argument: Format NVM of namespace 1: a timeout of 0 would end the wait at \
             once while the controller goes on formatting; pass None for the admin timeout, or \
             minutes for a secure erase of a large device",
        ),
        (
            FormatNvm {
                pi_type: 4,
                ..FormatNvm::lbaf(1)
            },
            "invalid argument: Format NVM of namespace 1: PI type 4: must be 0 (none) to 3",
        ),
    ];
    for (f, text) in refusals {
        let e = c.format_nvm(1, &f).unwrap_err();
        assert_eq!(e.to_string(), text);
    }
    assert!(
        m.commands_seen()
            .iter()
            .all(|&(q, op, _)| q != 0 || op != 0x80),
        "no Format NVM was sent"
    );
    // What DPC offers goes.
    let ns = c
        .format_nvm(
            1,
            &FormatNvm {
                pi_type: 1,
                pi_first: true,
                ..FormatNvm::lbaf(1)
            },
        )
        .unwrap();
    assert_eq!(
        ns.metadata_layout().map(|l| (l.pi_type, l.pi_first)),
        Some((1, true))
    );
    drop(c);
    assert_clean(&m);
}

/// FNA bit 0: a format of one namespace formats every namespace, so every
/// handle's geometry changes. The driver retires all of them and reads
/// every namespace again; an old handle of the other namespace must not go
/// on describing 512-byte blocks that are 4096 bytes now (the controller
/// would move 4096 bytes into a 512-byte slice).
#[test]
fn format_nvm_with_fna_bit_0_retires_every_namespaces_handles() {
    let ns = |nsid| NamespaceConfig {
        nsid,
        lba_size: 512,
        blocks: 2048,
        ..NamespaceConfig::default()
    };
    let (m, mut c) = setup(ModelConfig {
        fna: 1,
        namespaces: vec![ns(1), ns(2)],
        ..ModelConfig::default()
    });
    let old2 = c.namespace(2).unwrap().clone();
    assert_eq!(old2.lba_size(), 512);
    let new1 = c.format_nvm(1, &FormatNvm::lbaf(4)).unwrap();
    assert_eq!(new1.lba_size(), 4096);
    assert!(old2.is_stale(), "namespace 2 was formatted too");
    let new2 = c.namespace(2).unwrap().clone();
    assert!(!new2.is_stale());
    assert_eq!((new2.lba_size(), new2.lba_count()), (4096, 256));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp
        .submit_io(read(0, 1, &old2), IoData::slice(buf, 0, 512), 7)
        .unwrap_err();
    assert_eq!(f.reason, Reject::StaleNamespace { nsid: 2 });
    m.write_namespace_data(2, 0, &pattern(5, 4096));
    let r = run_io(
        &mut qp,
        read(0, 1, &new2),
        IoData::buffer(c.alloc_dma(4096).unwrap()),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(
        read_back(r.buffer.as_ref().unwrap(), 4096),
        pattern(5, 4096)
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// An Identify that fails after the Format NVM: the call fails with it, and
/// the namespace is listed as unusable (with why) instead of under its old,
/// retired handle, which `Controller::namespace` would hand out again.
#[test]
fn an_identify_failing_after_format_nvm_leaves_the_namespace_unusable() {
    let (m, mut c) = setup(with_format(0, false, 0, false));
    let old = c.namespace(1).unwrap().clone();
    m.inject(upnvme_tests::Fault::Status {
        on: upnvme_tests::Match::Identify { cns: 0, nsid: 1 },
        status: upnvme_tests::Status::INVALID_FIELD.with_dnr(),
    });
    let e = c.format_nvm(1, &FormatNvm::lbaf(4)).unwrap_err();
    assert!(matches!(e, upnvme::Error::Command { .. }), "{e:?}");
    assert!(old.is_stale());
    let e = c.namespace(1).unwrap_err();
    assert!(
        e.to_string()
            .contains("its Identify after Format NVM failed"),
        "{e}"
    );
    // Formatting it again reads its Identify again and brings it back.
    let ns = c.format_nvm(1, &FormatNvm::lbaf(4)).unwrap();
    assert_eq!(ns.lba_size(), 4096);
    drop(c);
    assert_clean(&m);
}

#[test]
fn format_nvm_reads_the_pi_location_from_dpc_bits_3_first_and_4_last() {
    // DPC 0x09: Type 1, PI in the first 8 metadata bytes only; 0x11: Type 1,
    // the last 8 only. Each namespace takes the location it offers and the
    // driver refuses the other before anything reaches the device.
    for (dpc, offered_first) in [(0x09u8, true), (0x11, false)] {
        let mut cfg = with_format(0, false, 0, false);
        cfg.namespaces[0].dpc = dpc;
        let (m, mut c) = setup(cfg);
        let want = |pi_first| FormatNvm {
            extended: true,
            pi_type: 1,
            pi_first,
            ..FormatNvm::lbaf(5)
        };
        let fetched = m.commands_fetched();
        let e = c.format_nvm(1, &want(!offered_first)).unwrap_err();
        assert!(
            e.to_string().contains("is not offered"),
            "DPC {dpc:#x}: {e}"
        );
        assert_eq!(m.commands_fetched(), fetched, "refused before sending");
        let ns = c
            .format_nvm(1, &want(offered_first))
            .unwrap_or_else(|e| panic!("DPC {dpc:#x}: {e}"));
        let layout = ns.metadata_layout().unwrap();
        assert_eq!((layout.pi_type, layout.pi_first), (1, offered_first));
        assert_clean(&m);
    }
}

/// A raw Read or Write on a format with separate metadata needs the
/// metadata buffer (the driver's MPTR): without it the controller would
/// move the metadata to IOVA 0. On an extended-LBA format the data pointer
/// must cover data and metadata.
#[test]
fn raw_reads_and_writes_carry_the_metadata_their_format_moves() {
    for extended in [false, true] {
        let (m, c) = setup(with_format(16, extended, 0, false));
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let sqe = upnvme::Sqe::read(1, 8, 4);
        let raw = |data_len| IoCommand::Raw {
            ns: &ns,
            sqe: &sqe,
            data_len,
        };
        if extended {
            let f = qp
                .submit_io(raw(4 * BS), IoData::buffer(c.alloc_dma(4096).unwrap()), 1)
                .unwrap_err();
            assert_eq!(
                f.reason,
                Reject::BufferTooSmall {
                    need: 4 * (BS as u64 + 16)
                }
            );
            let r = run_io(
                &mut qp,
                raw(4 * (BS + 16)),
                IoData::buffer(c.alloc_dma(4096).unwrap()),
            );
            assert!(r.is_ok(), "{:?}", r.result);
        } else {
            let f = qp
                .submit_io(raw(4 * BS), IoData::buffer(c.alloc_dma(4096).unwrap()), 1)
                .unwrap_err();
            assert_eq!(f.reason, Reject::MetadataBuffer { need: 64 });
            let (data, md) = (pattern(7, 4 * BS), pattern(8, 64));
            let wsqe = upnvme::Sqe::write(1, 8, 4);
            let w = IoCommand::Raw {
                ns: &ns,
                sqe: &wsqe,
                data_len: 4 * BS,
            };
            let io = IoData::buffer(buffer_with(&c, &data)).metadata(buffer_with(&c, &md));
            let r = run_io(&mut qp, w, io);
            assert!(r.is_ok(), "{:?}", r.result);
            assert_eq!(m.namespace_metadata(1, 8, 4), md);
            let io =
                IoData::buffer(c.alloc_dma(4096).unwrap()).metadata(c.alloc_dma(4096).unwrap());
            let r = run_io(&mut qp, raw(4 * BS), io);
            assert!(r.is_ok(), "{:?}", r.result);
            assert_eq!(read_back(r.buffer.as_ref().unwrap(), data.len()), data);
            assert_eq!(read_back(r.metadata.as_ref().unwrap(), 64), md);
        }
        drop(qp);
        assert_clean(&m);
    }
}

/// A model controller with Extended LBA Formats (CTRATT.ELBAS) and two
/// namespaces whose 16 extended metadata bytes per block carry a 64-bit
/// guard tuple (ELBAF.PIF 10b): namespace 1 Type 1, namespace 2 Type 2.
fn with_guard64() -> ModelConfig {
    let ns = |nsid, pi_type| NamespaceConfig {
        nsid,
        lba_size: BS as u32,
        blocks: BLOCKS,
        ms: 16,
        extended: true,
        pi_type,
        pif: 2,
        ..NamespaceConfig::default()
    };
    ModelConfig {
        elbas: true,
        sgls: 1,
        namespaces: vec![ns(1, 1), ns(2, 2)],
        ..with_format(16, true, 1, false)
    }
}

#[test]
fn a_64_bit_guard_format_gets_lbafee_16_byte_tuples_and_a_48_bit_reference_tag() {
    let (m, c) = setup(with_guard64());
    // The driver set Host Behavior Support LBAFEE at bring-up (without it
    // the model, like QEMU, refuses I/O to these namespaces).
    assert_eq!(m.host_behavior_sets(), 1);
    let ns = c.namespace(1).unwrap().clone();
    let layout = ns.metadata_layout().unwrap();
    assert_eq!((layout.pif, layout.sts), (Pif::Guard64, 0));
    assert!(
        layout
            .to_string()
            .contains("(64-bit guard) in the last 16 bytes"),
        "{layout}"
    );
    let fmt = ns.pi_format().unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let stride = BS + 16;

    // Host-built tuples (Type 1: the tag is the LBA), checked by the model,
    // read back byte for byte.
    let mut host = pattern(64, 3 * stride);
    assert!(fmt.protect_extended(&mut host, 0x0bee, 300));
    let check = Protection {
        check_app_tag: true,
        app_tag: 0x0bee,
        app_tag_mask: 0xffff,
        ..Protection::CHECK
    };
    let w = run_io(
        &mut qp,
        write(300, 3, &ns),
        IoData::buffer(buffer_with(&c, &host)).protection(check),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let r = run_io(
        &mut qp,
        read(300, 3, &ns),
        IoData::buffer(c.alloc_dma(3 * stride).unwrap()).protection(check),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), host.len()), host);
    // A flipped data byte fails the CRC-64 guard.
    let mut bad = host.clone();
    bad[stride + 3] ^= 0x40;
    let e = run_io(
        &mut qp,
        write(300, 3, &ns),
        IoData::buffer(buffer_with(&c, &bad)).protection(check),
    );
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::Guard,
                ..
            })
        ),
        "{:?}",
        e.result
    );

    // PRACT with metadata that is just the 16-byte tuple: only data moves,
    // the model stores a tuple the host can check.
    let data = pattern(65, 2 * BS);
    let w = run_io(
        &mut qp,
        write(310, 2, &ns),
        IoData::buffer(buffer_with(&c, &data)).protection(Protection::PRACT),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let md = m.namespace_metadata(1, 310, 2);
    for (i, t) in md.chunks(16).enumerate() {
        let t = fmt.tuple(t).unwrap();
        assert_eq!(
            t.guard,
            upnvme::pi::guard64(&data[i * BS..(i + 1) * BS], &[])
        );
        assert_eq!(t.ref_tag, 310 + i as u64);
    }
    let r = run_io(
        &mut qp,
        read(310, 2, &ns),
        IoData::buffer(c.alloc_dma(2 * BS).unwrap()).protection(Protection::PRACT),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), data.len()), data);

    // Type 2 with a tag above 32 bits: bits 47:32 travel in CDW3, so the
    // model expects exactly the tags the host built.
    let ns2 = c.namespace(2).unwrap().clone();
    let fmt2 = ns2.pi_format().unwrap();
    let tag = 0x1234_0000_0007u64;
    let mut host2 = pattern(66, 2 * stride);
    assert!(fmt2.protect_extended(&mut host2, 0, tag));
    let wide = Protection {
        ref_tag: Some(tag),
        ..Protection::CHECK
    };
    let w = run_io(
        &mut qp,
        write(40, 2, &ns2),
        IoData::buffer(buffer_with(&c, &host2)).protection(wide),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    // The same tuples under a tag that differs only in bits 47:32.
    let other = Protection {
        ref_tag: Some(0x1235_0000_0007),
        ..Protection::CHECK
    };
    let e = run_io(
        &mut qp,
        write(40, 2, &ns2),
        IoData::buffer(buffer_with(&c, &host2)).protection(other),
    );
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::ReferenceTag,
                ..
            })
        ),
        "{:?}",
        e.result
    );
    // A tag wider than 48 bits is refused before submission.
    let too_wide = Protection {
        ref_tag: Some(1 << 48),
        ..Protection::CHECK
    };
    let err = qp
        .submit_io(
            write(40, 2, &ns2),
            IoData::buffer(buffer_with(&c, &host2)).protection(too_wide),
            9,
        )
        .unwrap_err();
    assert!(
        matches!(err.reason, Reject::ProtectionNotApplicable(_)),
        "{err:?}"
    );

    // A reset sets LBAFEE again (Host Behavior Support is not kept across a
    // Controller Level Reset), and I/O goes on.
    drop(qp);
    c.reset().unwrap();
    assert_eq!(m.host_behavior_sets(), 2);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let r = run_io(
        &mut qp,
        read(300, 3, &ns),
        IoData::buffer(c.alloc_dma(3 * stride).unwrap()).protection(check),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), host.len()), host);
    drop(qp);
    assert_clean(&m);
}

#[test]
fn a_32_bit_guard_or_storage_tags_are_reported_and_protection_on_them_refused() {
    for (elbaf, why) in [(1u32 << 7, "32-bit guard"), (8, "storage tags")] {
        let m = ModelController::new(with_guard64());
        // CNS 05h of namespace 1: ELBAF of format 2 (512 + 16), the current
        // one, says PIF 01b or STS 8.
        let mut page = vec![0u8; 4096];
        page[12 + 4 * 2..12 + 4 * 2 + 4].copy_from_slice(&elbaf.to_le_bytes());
        m.set_identify_data(5, 1, Some(page));
        let c = common::open(&m, common::opts());
        let ns = c.namespace(1).unwrap().clone();
        let layout = ns.metadata_layout().unwrap();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let err = qp
            .submit_io(
                read(0, 1, &ns),
                IoData::buffer(c.alloc_dma(BS + 16).unwrap()).protection(Protection::CHECK),
                1,
            )
            .unwrap_err();
        match err.reason {
            Reject::ProtectionNotApplicable(s) => assert!(s.contains(why), "{s}"),
            r => panic!("{layout}: {r:?}"),
        }
        if elbaf == 8 {
            assert_eq!(layout.sts, 8);
        } else {
            assert_eq!(layout.pif, Pif::Guard32);
            assert!(
                !ns.pi_format()
                    .unwrap()
                    .protect_extended(&mut [0; 528], 0, 0)
            );
        }
    }
}

#[test]
fn format_nvm_checks_pi_against_the_target_formats_guard() {
    let m = ModelController::new(with_guard64());
    // CNS 05h of namespace 1 says LBA format 1 (512 + 8) has a 64-bit
    // guard: its 16-byte tuple does not fit 8 metadata bytes.
    let mut page = vec![0u8; 4096];
    for i in 0..8usize {
        page[12 + 4 * i..16 + 4 * i].copy_from_slice(&(2u32 << 7).to_le_bytes());
    }
    m.set_identify_data(5, 1, Some(page));
    let mut c = common::open(&m, common::opts());
    let fetched = m.commands_fetched();
    let e = c
        .format_nvm(
            1,
            &FormatNvm {
                pi_type: 1,
                ..FormatNvm::lbaf(1)
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 16 or more metadata bytes per block (the tuple of a 64-bit guard)"),
        "{e}"
    );
    // Only the Identify (CNS 05h) of the check reached the controller.
    assert_eq!(m.commands_fetched(), fetched + 1);
    // 16 bytes hold it.
    let ns = c
        .format_nvm(
            1,
            &FormatNvm {
                pi_type: 1,
                extended: true,
                ..FormatNvm::lbaf(2)
            },
        )
        .unwrap();
    assert_eq!(ns.metadata_layout().unwrap().pif, Pif::Guard64);
    assert_clean(&m);
}

#[test]
fn a_reserved_protection_type_is_refused() {
    // Identify Namespace DPS bits 2:0 = 5 (reserved): no protection fields
    // are built for it.
    let m = ModelController::new(with_format(8, false, 1, false));
    let c = common::open(&m, common::opts());
    let (_, mut id) = c
        .admin_passthrough(upnvme::Sqe::identify(0, 1, 0), 4096, None)
        .unwrap();
    drop(c);
    id[29] = 5;
    m.set_identify_data(0, 1, Some(id));
    let c = common::open(&m, common::opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let f = qp
        .submit_io(
            write(0, 1, &ns),
            IoData::buffer(c.alloc_dma(BS).unwrap())
                .metadata(c.alloc_dma(8).unwrap())
                .protection(Protection::CHECK),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(f.reason, Reject::ProtectionNotApplicable(w) if w.contains("reserved")),
        "{:?}",
        f.reason
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

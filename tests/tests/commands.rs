//! Host tests of per-command flags and the optional NVM commands against
//! the model: FUA and Limited Retry as sent (CDW12 bits 30 and 31), Verify,
//! Write Uncorrectable, Copy, Dataset Management with attributes and 32-bit
//! lengths, raw commands, and the typed refusals (ONCS, flags where CDW12
//! has none, raw commands the driver could not describe).

mod common;

use common::{T, assert_clean, buffer_with, config_one_ns, pattern, read_back, run_io, setup};
use upnvme::{
    Controller, CopyRange, CopySource, DsmAttributes, DsmRange, IoCommand, IoData, IoError,
    IoFlags, NvmLimit, QueuePairOptions, RangeCommand, Reject, Sqe,
};
use upnvme_tests::{
    Fault, Match, ModelConfig, ModelController, NamespaceConfig, NvmLimitsConfig, Status,
};

fn all_commands() -> (ModelController, Controller<ModelController>) {
    setup(ModelConfig {
        oncs: ModelConfig::ONCS_COMPARE
            | ModelConfig::ONCS_DSM
            | ModelConfig::ONCS_WRITE_ZEROES
            | ModelConfig::ONCS_VERIFY
            | ModelConfig::ONCS_WRITE_UNCORRECTABLE
            | ModelConfig::ONCS_COPY,
        ..config_one_ns(512, 8192)
    })
}

/// CDW12 of the newest I/O command the model fetched.
fn last_cdw12(m: &ModelController) -> (u8, u32) {
    m.last_io_cdw12().expect("an I/O command")
}

#[test]
fn fua_and_limited_retry_reach_cdw12() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let cases = [
        (IoFlags::NONE, 0u32),
        (IoFlags::FUA, 1 << 30),
        (
            IoFlags {
                fua: false,
                limited_retry: true,
            },
            1 << 31,
        ),
        (
            IoFlags {
                fua: true,
                limited_retry: true,
            },
            3 << 30,
        ),
    ];
    for (flags, bits) in cases {
        let data = pattern(u64::from(bits >> 30), 1024);
        let buf = buffer_with(&c, &data);
        let w = IoCommand::Write {
            ns: &ns,
            slba: 4,
            blocks: 2,
        };
        let done = run_io(&mut qp, w, IoData::buffer(buf).flags(flags));
        assert!(done.is_ok());
        assert_eq!(last_cdw12(&m), (0x01, bits | 1), "{flags:?}");
        let r = IoCommand::Read {
            ns: &ns,
            slba: 4,
            blocks: 2,
        };
        let done = run_io(&mut qp, r, IoData::from(done.buffer).flags(flags));
        assert!(done.is_ok());
        assert_eq!(last_cdw12(&m), (0x02, bits | 1));
        assert_eq!(read_back(&done.buffer.unwrap(), 1024), data);
        let v = IoCommand::Verify {
            ns: &ns,
            slba: 4,
            blocks: 2,
        };
        assert!(run_io(&mut qp, v, IoData::none().flags(flags)).is_ok());
        assert_eq!(last_cdw12(&m), (0x0c, bits | 1));
    }
    assert_clean(&m);
}

#[test]
fn flags_are_refused_where_cdw12_has_none() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ranges = [DsmRange {
        cattr: 0,
        nlb: 1,
        slba: 0,
    }];
    let sqe = Sqe::flush(1);
    for cmd in [
        IoCommand::Flush { ns: &ns },
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        IoCommand::WriteUncorrectable {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        IoCommand::Raw {
            ns: &ns,
            sqe: &sqe,
            data_len: 0,
        },
    ] {
        let r = qp
            .submit_io(cmd, IoData::none().flags(IoFlags::FUA), 1)
            .unwrap_err();
        assert_eq!(r.reason, Reject::FlagsNotApplicable, "{}", cmd.name());
    }
    assert_eq!(qp.in_flight(), 0);
    assert_clean(&m);
}

#[test]
fn write_uncorrectable_then_verify_and_read_fail_until_rewritten() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = qp
        .write_blocking(&ns, 10, 4, buffer_with(&c, &pattern(1, 2048)), T)
        .unwrap();
    let wu = IoCommand::WriteUncorrectable {
        ns: &ns,
        slba: 11,
        blocks: 2,
    };
    assert!(run_io(&mut qp, wu, IoData::none()).is_ok());
    let verify = |slba, blocks| IoCommand::Verify {
        ns: &ns,
        slba,
        blocks,
    };
    // Verify and Read of a marked block fail with Unrecovered Read Error.
    for cmd in [
        verify(10, 4),
        IoCommand::Read {
            ns: &ns,
            slba: 12,
            blocks: 1,
        },
    ] {
        let io = if cmd.transfers_data() {
            IoData::buffer(c.alloc_dma(4096).unwrap())
        } else {
            IoData::none()
        };
        let done = run_io(&mut qp, cmd, io);
        match done.result {
            Err(IoError::Status(s)) => assert_eq!((s.sct(), s.sc()), (2, 0x81), "{}", cmd.name()),
            other => panic!("{}: {other:?}", cmd.name()),
        }
    }
    // Unmarked blocks verify fine; rewriting clears the mark.
    assert!(run_io(&mut qp, verify(10, 1), IoData::none()).is_ok());
    assert!(run_io(&mut qp, verify(13, 1), IoData::none()).is_ok());
    qp.write_blocking(&ns, 11, 2, buf, T).unwrap();
    assert!(run_io(&mut qp, verify(10, 4), IoData::none()).is_ok());
    assert_clean(&m);
}

#[test]
fn copy_moves_the_source_ranges_in_order() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(1, 3 * 512);
    let b = pattern(2, 5 * 512);
    m.write_namespace_data(1, 100, &a);
    m.write_namespace_data(1, 200, &b);
    let ranges = [
        CopyRange {
            slba: 200,
            blocks: 5,
        },
        CopyRange {
            slba: 100,
            blocks: 3,
        },
    ];
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 1000,
        ranges: &ranges,
    };
    let done = run_io(&mut qp, cmd, IoData::none().flags(IoFlags::FUA));
    assert!(done.is_ok(), "{:?}", done.result);
    let (op, cdw12) = last_cdw12(&m);
    assert_eq!(
        (op, cdw12),
        (0x19, 1 | 1 << 30),
        "NR 0-based, format 0, FUA"
    );
    let mut want = b.clone();
    want.extend_from_slice(&a);
    assert_eq!(m.namespace_data(1, 1000, 8), want);
    // 128 ranges fit the command's page; 129 do not; the destination must
    // fit the namespace.
    let many = vec![CopyRange { slba: 0, blocks: 1 }; 129];
    for (ranges, sdlba, want) in [
        (
            &many[..],
            0,
            Reject::RangeCount {
                command: RangeCommand::Copy,
                ranges: 129,
                max: 128,
            },
        ),
        (
            &[][..],
            0,
            Reject::RangeCount {
                command: RangeCommand::Copy,
                ranges: 0,
                max: 128,
            },
        ),
        (&many[..2], 8191, Reject::LbaRange),
    ] {
        let cmd = IoCommand::Copy {
            ns: &ns,
            sdlba,
            ranges,
        };
        assert_eq!(
            qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason,
            want
        );
    }
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 2000,
        ranges: &many[..128],
    };
    assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
    assert_clean(&m);
}

#[test]
fn dataset_management_attributes_and_32_bit_lengths() {
    let (m, c) = setup(ModelConfig {
        oncs: ModelConfig::ONCS_DSM,
        ..config_one_ns(512, 200_000)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.write_namespace_data(1, 0, &pattern(1, 512));
    m.write_namespace_data(1, 150_000, &pattern(2, 512));
    // A range longer than 65536 blocks (the 32-bit Length).
    let ranges = [DsmRange {
        cattr: 0x0000_0301,
        nlb: 100_000,
        slba: 100_000,
    }];
    let hints = DsmAttributes {
        integral_read: true,
        integral_write: true,
        deallocate: false,
    };
    let cmd = IoCommand::DatasetManagement {
        ns: &ns,
        ranges: &ranges,
        attributes: hints,
    };
    assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
    let (_, raw) = *m.recent_commands().last().unwrap();
    assert_eq!(
        u32::from_le_bytes([raw[44], raw[45], raw[46], raw[47]]),
        0b011,
        "CDW11"
    );
    assert_eq!(m.allocated_blocks(1), 2, "hints only: nothing deallocated");
    let cmd = IoCommand::DatasetManagement {
        ns: &ns,
        ranges: &ranges,
        attributes: DsmAttributes {
            deallocate: true,
            ..hints
        },
    };
    assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
    assert_eq!(m.allocated_blocks(1), 1, "the block at 150000 is gone");
    for (r, want) in [
        (
            DsmRange {
                cattr: 0,
                nlb: 0,
                slba: 0,
            },
            Reject::BlockCount { blocks: 0 },
        ),
        (
            DsmRange {
                cattr: 0,
                nlb: 100_001,
                slba: 100_000,
            },
            Reject::LbaRange,
        ),
    ] {
        let cmd = IoCommand::DatasetManagement {
            ns: &ns,
            ranges: &[r],
            attributes: hints,
        };
        assert_eq!(
            qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason,
            want
        );
    }
    assert_clean(&m);
}

#[test]
fn commands_the_controller_does_not_advertise_are_refused() {
    let (m, c) = setup(ModelConfig {
        oncs: 0,
        ..config_one_ns(512, 8192)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let fetched = m.commands_fetched();
    let dsm = [DsmRange {
        cattr: 0,
        nlb: 1,
        slba: 0,
    }];
    let copy = [CopyRange { slba: 0, blocks: 1 }];
    let cases = [
        (
            IoCommand::Compare {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            "Compare",
        ),
        (
            IoCommand::WriteZeroes {
                ns: &ns,
                slba: 0,
                blocks: 1,
                deallocate: false,
            },
            "Write Zeroes",
        ),
        (
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &dsm,
            },
            "Dataset Management",
        ),
        (
            IoCommand::Verify {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            "Verify",
        ),
        (
            IoCommand::WriteUncorrectable {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            "Write Uncorrectable",
        ),
        (
            IoCommand::Copy {
                ns: &ns,
                sdlba: 10,
                ranges: &copy,
            },
            "Copy",
        ),
    ];
    for (cmd, name) in cases {
        let buf = c.alloc_dma(4096).unwrap();
        let r = qp.submit(cmd, Some(buf), 1).unwrap_err();
        assert_eq!(r.reason, Reject::Unsupported { command: name });
        assert!(r.reason.to_string().contains("ONCS"), "{}", r.reason);
        assert!(r.buffer.is_some());
    }
    assert_eq!(m.commands_fetched(), fetched, "nothing was sent");
    assert_clean(&m);
}

#[test]
fn raw_commands_keep_the_callers_dwords_and_get_a_data_pointer() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // A Write built by hand, with junk where the driver's fields go.
    let data = pattern(9, 1536);
    let mut sqe = Sqe::write(77, 40, 3);
    sqe.set_cid(0xdead);
    sqe.set_prp1(0x1234_5000);
    sqe.dw[12] |= 1 << 30;
    let buf = c.alloc_dma(8192).unwrap();
    buf.write_bytes(100, &data).unwrap();
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: 1536,
    };
    let done = run_io(&mut qp, cmd, IoData::slice(buf, 100, 1536));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(m.namespace_data(1, 40, 3), data);
    let (op, cdw12) = last_cdw12(&m);
    assert_eq!((op, cdw12), (0x01, 2 | 1 << 30));
    let (_, raw) = *m.recent_commands().last().unwrap();
    assert_eq!(
        u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]),
        1,
        "NSID from the handle"
    );
    // Read back through a raw Read into a vector.
    let rsqe = Sqe::read(1, 40, 3);
    let mut v = upnvme::IoVec::new();
    v.push(c.alloc_dma(4096).unwrap(), 4, 1000).unwrap();
    v.push(c.alloc_dma(4096).unwrap(), 0, 536).unwrap();
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &rsqe,
        data_len: 1536,
    };
    let r = qp.submit_io(cmd, IoData::vectored(v), 1).unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable, "no SGLs on this model");
    // Fused or with a metadata pointer: refused.
    let mut fused = Sqe::read(1, 0, 1);
    fused.dw[0] |= 1 << 8;
    let mut mptr = Sqe::read(1, 0, 1);
    mptr.dw[4] = 0x1000;
    for s in [&fused, &mptr] {
        let cmd = IoCommand::Raw {
            ns: &ns,
            sqe: s,
            data_len: 512,
        };
        let buf = c.alloc_dma(4096).unwrap();
        let r = qp.submit_io(cmd, IoData::buffer(buf), 1).unwrap_err();
        assert!(matches!(r.reason, Reject::RawCommand(_)), "{}", r.reason);
    }
    assert_clean(&m);
}

/// A raw command whose SQE moves more than `data_len` says would make the
/// controller take the caller's bytes past the described memory as further
/// PRP entries (or data): for the commands whose transfer the SQE gives,
/// the driver refuses it before the device sees it.
#[test]
fn a_raw_command_must_describe_what_its_sqe_transfers() {
    let (m, c) = all_commands();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // A victim buffer, and a forged "PRP List" in the second page of the
    // data buffer naming it.
    let victim = c.alloc_dma(4096).unwrap();
    let pat = pattern(5, 4096);
    victim.write_bytes(0, &pat).unwrap();
    m.write_namespace_data(1, 0, &pattern(6, 16 * 512));
    let buf = c.alloc_dma(8192).unwrap();
    for i in 0..512 {
        buf.write_u64(4096 + i * 8, victim.iova()).unwrap();
    }
    // 16 blocks of 512 bytes = 8 KiB, but only 4 KiB described: PRP2
    // would be read as a list pointer.
    let sqe = Sqe::read(1, 0, 16);
    let fetched = m.commands_fetched();
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: 4096,
    };
    let r = qp.submit_io(cmd, IoData::buffer(buf), 1).unwrap_err();
    assert_eq!(r.reason, Reject::BufferTooSmall { need: 8192 });
    assert!(r.buffer.is_some(), "the refused buffer comes back");
    // Dataset Management with two ranges (CDW10.NR = 1) needs 32 bytes.
    let mut dsm = Sqe::flush(1);
    dsm.dw[0] = 0x09;
    dsm.dw[10] = 1;
    dsm.dw[11] = 1 << 2;
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &dsm,
        data_len: 16,
    };
    let r = qp
        .submit_io(cmd, IoData::buffer(c.alloc_dma(4096).unwrap()), 1)
        .unwrap_err();
    assert_eq!(r.reason, Reject::BufferTooSmall { need: 32 });
    // Without any buffer at all.
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: 0,
    };
    let r = qp.submit_io(cmd, IoData::none(), 1).unwrap_err();
    assert_eq!(r.reason, Reject::BufferTooSmall { need: 8192 });
    assert_eq!(m.commands_fetched(), fetched, "nothing reached the device");
    // Described in full, the same read lands in its buffer only.
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: 8192,
    };
    let done = run_io(&mut qp, cmd, IoData::buffer(c.alloc_dma(8192).unwrap()));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(
        read_back(done.buffer.as_ref().unwrap(), 8192),
        pattern(6, 16 * 512)
    );
    assert_eq!(victim.to_vec(), pat, "the victim is untouched");
    assert_clean(&m);
}

/// A raw command whose `data_len` is larger than what its SQE moves gets a
/// data pointer for what it moves: an SGL Data Block longer than the
/// transfer is Data SGL Length Invalid on a controller without SGLS bit 18
/// (the model's), and a PRP List would name pages nothing uses.
#[test]
fn a_raw_command_describes_what_its_sqe_moves_not_its_data_len() {
    for sgls in [0u32, 1] {
        let (m, c) = setup(ModelConfig {
            sgls,
            ..config_one_ns(512, 8192)
        });
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        m.write_namespace_data(1, 8, &pattern(11, 4096));
        // 8 blocks of 512 bytes (4 KiB) from a 4-byte offset (PRP List or
        // SGL), with 16 KiB of room offered.
        let sqe = Sqe::read(1, 8, 8);
        let cmd = IoCommand::Raw {
            ns: &ns,
            sqe: &sqe,
            data_len: 16384,
        };
        let buf = c.alloc_dma(5 * 4096).unwrap();
        let done = run_io(&mut qp, cmd, IoData::slice(buf, 4, 16384));
        assert!(done.is_ok(), "sgls {sgls}: {:?}", done.result);
        let back = read_back(done.buffer.as_ref().unwrap(), 4 + 16384);
        let want = pattern(11, 4096);
        let diff: Vec<usize> = (0..4096).filter(|&i| back[4 + i] != want[i]).collect();
        assert!(
            diff.is_empty(),
            "sgls {sgls}: {} bytes differ from {:?}",
            diff.len(),
            diff.first()
        );
        assert!(
            back[4 + 4096..].iter().all(|&b| b == 0),
            "sgls {sgls}: past the transfer"
        );
        assert_clean(&m);
    }
}

/// The NVM Command Set's size limits (Identify CNS 06h) are read at
/// bring-up and checked before a command is queued. The model behaves like
/// QEMU beyond them: a Dataset Management range above DMRSL is skipped while
/// the command still succeeds (the deallocation silently does not happen),
/// a Verify above VSL is refused by the controller (and the model records
/// a Dataset Management beyond DMRL, DMRSL or DMSL as a host violation). The
/// driver refuses a Dataset Management of one integral dataset (IDR, IDW)
/// beyond its limits with the limit, sends any other beyond them as
/// commands within them (tests/tests/split.rs), and sends a Verify or
/// Write Zeroes beyond VSL or WZSL as pieces within them.
#[test]
fn dataset_management_beyond_the_nvm_size_limits_is_refused_with_the_limit() {
    let (m, c) = setup(ModelConfig {
        oncs: ModelConfig::ONCS_DSM | ModelConfig::ONCS_VERIFY | ModelConfig::ONCS_WRITE_ZEROES,
        nvm_limits: NvmLimitsConfig {
            // 8 KiB: two 4 KiB blocks per Verify, four per Write Zeroes.
            vsl: 1,
            wzsl: 2,
            dmrl: 2,
            dmrsl: 8,
            dmsl: 12,
        },
        ..config_one_ns(4096, 1024)
    });
    let limits = c.nvm_limits();
    assert_eq!(
        (
            limits.vsl,
            limits.wzsl,
            limits.dmrl,
            limits.dmrsl,
            limits.dmsl
        ),
        (1, 2, 2, 8, 12)
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(5, 16 * 4096);
    qp.write_blocking(&ns, 0, 16, buffer_with(&c, &data), T)
        .unwrap();
    let refused = |qp: &mut upnvme::IoQueuePair<ModelController>, cmd| {
        qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason
    };
    let range = |slba, nlb| DsmRange {
        cattr: 0,
        nlb,
        slba,
    };
    let integral = |ranges| IoCommand::DatasetManagement {
        ns: &ns,
        ranges,
        attributes: upnvme::DsmAttributes {
            integral_write: true,
            deallocate: true,
            ..Default::default()
        },
    };
    // DMRSL: a 16-block range is refused (QEMU would skip it and succeed).
    let one = [range(0, 16)];
    let r = refused(&mut qp, integral(&one));
    assert_eq!(
        r,
        Reject::SizeLimit {
            limit: NvmLimit::DsmRangeBlocks,
            max: 8
        }
    );
    assert!(
        qp.describe(r).to_string().contains("DMRSL"),
        "{}",
        qp.describe(r)
    );
    // DMRL and DMSL.
    let three = [range(0, 1), range(2, 1), range(4, 1)];
    let r = refused(&mut qp, integral(&three));
    assert_eq!(
        r,
        Reject::SizeLimit {
            limit: NvmLimit::DsmRanges,
            max: 2
        }
    );
    let big = [range(0, 8), range(8, 8)];
    let r = refused(&mut qp, integral(&big));
    assert_eq!(
        r,
        Reject::SizeLimit {
            limit: NvmLimit::DsmBlocks,
            max: 12
        }
    );
    // Nothing was sent: the data is all there.
    let back = qp
        .read_blocking(&ns, 0, 16, c.alloc_dma(16 * 4096).unwrap(), T)
        .unwrap();
    assert_eq!(read_back(&back, 16 * 4096), data);
    // Within the limits: deallocated (the model reads zeros back).
    let ok = [range(0, 8), range(8, 4)];
    assert!(
        run_io(
            &mut qp,
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &ok
            },
            IoData::none()
        )
        .is_ok()
    );
    let back = qp.read_blocking(&ns, 0, 12, back, T).unwrap();
    assert_eq!(read_back(&back, 12 * 4096), vec![0u8; 12 * 4096]);
    // VSL and WZSL: within them one command; beyond them pieces within
    // them (tests/tests/split.rs), never one command past the limit.
    let verify = |blocks| IoCommand::Verify {
        ns: &ns,
        slba: 12,
        blocks,
    };
    let wz = |blocks| IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks,
        deallocate: false,
    };
    for (cmd, most) in [(verify(2), 2), (verify(3), 2), (wz(4), 4), (wz(5), 4)] {
        let seen = m.commands_fetched();
        assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
        let sent = m.commands_fetched() - seen;
        let recent = m.recent_commands();
        for (_, sqe) in &recent[recent.len() - sent as usize..] {
            let nlb = u32::from(u16::from_le_bytes([sqe[48], sqe[49]])) + 1;
            assert!(nlb <= most, "{} of {nlb} blocks sent", cmd.name());
        }
    }
    assert_eq!(qp.in_flight(), 0);
    drop(qp);
    assert_clean(&m);
}

/// Copy takes at most 128 source ranges (one list page): a Copy of 129..=256
/// is refused with a Copy message and its limit (it said "Dataset Management
/// with 200 ranges: must be 1..=256", found in review).
#[test]
fn a_copy_with_too_many_ranges_is_refused_with_a_copy_message() {
    let (_m, c) = setup(ModelConfig {
        oncs: ModelConfig::ONCS_COPY | ModelConfig::ONCS_DSM,
        ..common::config_one_ns(512, 100_000)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ranges: Vec<CopyRange> = (0..200)
        .map(|i| CopyRange {
            slba: i * 2,
            blocks: 1,
        })
        .collect();
    let copy = IoCommand::Copy {
        ns: &ns,
        sdlba: 10_000,
        ranges: &ranges,
    };
    let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
    let msg = qp.describe(r.reason).to_string();
    assert!(
        msg.contains("Copy") && msg.contains("128"),
        "a Copy of 200 source ranges was refused with: {msg}"
    );
}

/// A model with Copy and one 512-byte namespace whose Copy limits are
/// `(msrc, mssrl, mcl)` (Identify Namespace bytes 80, 75:74, 79:76).
fn copy_limited(msrc: u8, mssrl: u16, mcl: u32) -> (ModelController, Controller<ModelController>) {
    let mut cfg = config_one_ns(512, 8192);
    cfg.oncs = ModelConfig::ONCS_COPY;
    cfg.namespaces[0].msrc = msrc;
    cfg.namespaces[0].mssrl = mssrl;
    cfg.namespaces[0].mcl = mcl;
    setup(cfg)
}

#[test]
fn a_copy_beyond_the_namespaces_copy_limits_is_refused_with_the_limit() {
    // MSRC 3 (four ranges), MSSRL 8, MCL 20.
    let (m, c) = copy_limited(3, 8, 20);
    let ns = c.namespace(1).unwrap().clone();
    let id = ns.identify();
    assert_eq!((id.msrc, id.mssrl, id.mcl), (3, 8, 20));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let r = |slba, blocks| CopyRange { slba, blocks };
    let five = [r(0, 1), r(10, 1), r(20, 1), r(30, 1), r(40, 1)];
    let long = [r(0, 9)];
    let over = [r(0, 8), r(10, 8), r(20, 5)];
    for (ranges, want, text) in [
        (
            &five[..],
            Reject::RangeCount {
                command: RangeCommand::Copy,
                ranges: 5,
                max: 4,
            },
            "Copy with 5 ranges: must be 1..=4",
        ),
        (
            &long[..],
            Reject::SizeLimit {
                limit: NvmLimit::CopyRangeBlocks,
                max: 8,
            },
            "MSSRL): at most 8 blocks per range",
        ),
        (
            &over[..],
            Reject::SizeLimit {
                limit: NvmLimit::CopyBlocks,
                max: 20,
            },
            "MCL): at most 20 blocks in all source ranges",
        ),
    ] {
        let cmd = IoCommand::Copy {
            ns: &ns,
            sdlba: 1000,
            ranges,
        };
        let e = qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason;
        assert_eq!(e, want);
        let msg = qp.describe(e).to_string();
        assert!(
            msg.starts_with("invalid argument: ") && msg.contains(text),
            "{msg}"
        );
    }
    // Nothing reached the controller; at the limits the Copy goes through.
    assert!(
        m.recent_commands()
            .iter()
            .all(|(q, raw)| *q == 0 || raw[0] != 0x19)
    );
    let data = pattern(9, 20 * 512);
    qp.write_blocking(&ns, 0, 20, buffer_with(&c, &data), T)
        .unwrap();
    let at = [r(12, 8), r(0, 8), r(8, 4)];
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 1000,
        ranges: &at,
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    let mut want = data[12 * 512..20 * 512].to_vec();
    want.extend_from_slice(&data[..8 * 512]);
    want.extend_from_slice(&data[8 * 512..12 * 512]);
    assert_eq!(m.namespace_data(1, 1000, 20), want);
    assert_clean(&m);
}

#[test]
fn copy_limits_not_filled_in_leave_the_copy_to_the_controller() {
    // MSSRL, MCL and MSRC all zero: the namespace did not report its limits,
    // so the pair sends the Copy and the controller's status tells (this
    // model then takes one range of no blocks: Command Size Limit Exceeded).
    let (m, c) = copy_limited(0, 0, 0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ranges = [
        CopyRange { slba: 0, blocks: 2 },
        CopyRange { slba: 4, blocks: 2 },
    ];
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 100,
        ranges: &ranges,
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    match done.result {
        Err(IoError::Status(s)) => assert_eq!((s.sct(), s.sc()), (1, 0x83)),
        other => panic!("{other:?}"),
    }
    assert_clean(&m);
}

/// On a namespace whose LBA format has a 64-bit guard (ELBAF.PIF 10b) a
/// Copy must use Source Range Entries Descriptor Format 1h (40-byte
/// entries): Format 0h is only for the 16-bit guard, and a controller (QEMU,
/// the model) fails it with Invalid Format. The driver sent Format 0h on
/// every namespace (found in review).
#[test]
fn a_copy_on_a_64_bit_guard_format_uses_descriptor_format_1h() {
    let mut cfg = config_one_ns(512, 8192);
    cfg.oncs = ModelConfig::ONCS_COPY;
    cfg.elbas = true;
    cfg.namespaces[0].ms = 16;
    cfg.namespaces[0].extended = true;
    cfg.namespaces[0].pi_type = 1;
    cfg.namespaces[0].pif = 2;
    let (m, c) = setup(cfg);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(11, 2 * 512);
    let b = pattern(12, 3 * 512);
    m.write_namespace_data(1, 100, &a);
    m.write_namespace_data(1, 200, &b);
    let ranges = [
        CopyRange {
            slba: 200,
            blocks: 3,
        },
        CopyRange {
            slba: 100,
            blocks: 2,
        },
    ];
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 1000,
        ranges: &ranges,
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(last_cdw12(&m), (0x19, 1 | 1 << 8), "NR 0-based, format 1h");
    let mut want = b.clone();
    want.extend_from_slice(&a);
    assert_eq!(m.namespace_data(1, 1000, 5), want);
    // 40-byte entries: 102 fill the command's page, 103 do not.
    let many = vec![CopyRange { slba: 0, blocks: 1 }; 103];
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 2000,
        ranges: &many,
    };
    assert_eq!(
        qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason,
        Reject::RangeCount {
            command: RangeCommand::Copy,
            ranges: 103,
            max: 102,
        }
    );
    let cmd = IoCommand::Copy {
        ns: &ns,
        sdlba: 2000,
        ranges: &many[..102],
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    drop(qp);
    assert_clean(&m);
}

/// A controller that reports its Copy formats (Identify Controller OCFS)
/// without Format 1h: a Copy on a 64-bit guard format, which needs it, is
/// refused before the device (it would fail with Invalid Format); one on a
/// namespace without PI (Format 0h) goes. OCFS 0 (not reported): both go.
#[test]
fn a_copy_in_a_descriptor_format_ocfs_does_not_report_is_refused() {
    for (ocfs, refused) in [(0x1u16, true), (0x0, false)] {
        let mut cfg = config_one_ns(512, 8192);
        cfg.oncs = ModelConfig::ONCS_COPY;
        cfg.ocfs = ocfs;
        cfg.elbas = true;
        cfg.namespaces[0].ms = 16;
        cfg.namespaces[0].extended = true;
        cfg.namespaces[0].pi_type = 1;
        cfg.namespaces[0].pif = 2;
        cfg.namespaces.push(NamespaceConfig {
            nsid: 2,
            ..cfg.namespaces[0]
        });
        cfg.namespaces[1].ms = 0;
        cfg.namespaces[1].pi_type = 0;
        cfg.namespaces[1].pif = 0;
        cfg.namespaces[1].extended = false;
        let (m, c) = setup(cfg);
        assert_eq!(c.identify().ocfs, ocfs);
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let ranges = [CopyRange { slba: 0, blocks: 2 }];
        let guard64 = c.namespace(1).unwrap().clone();
        let copy = IoCommand::Copy {
            ns: &guard64,
            sdlba: 100,
            ranges: &ranges,
        };
        let seen = m.commands_fetched();
        if refused {
            let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
            assert_eq!(r.reason, Reject::CopyFormat { format: 1 });
            assert_eq!(m.commands_fetched(), seen, "nothing sent");
            assert!(
                r.reason.to_string().contains("OCFS bit 1 clear"),
                "{}",
                r.reason
            );
        } else {
            let done = run_io(&mut qp, copy, IoData::none());
            assert!(done.is_ok(), "{:?}", done.result);
        }
        let plain = c.namespace(2).unwrap().clone();
        let copy = IoCommand::Copy {
            ns: &plain,
            sdlba: 100,
            ranges: &ranges,
        };
        let done = run_io(&mut qp, copy, IoData::none());
        assert!(done.is_ok(), "OCFS {ocfs:#x}: {:?}", done.result);
        assert_eq!(last_cdw12(&m), (0x19, 0), "format 0h");
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// Two namespaces of 512-byte blocks on a controller that reports the
/// cross-namespace Copy formats (OCFS 0Fh, as QEMU 10.0) and Copy.
fn cross_copy_config() -> ModelConfig {
    let mut cfg = config_one_ns(512, 8192);
    cfg.oncs = ModelConfig::ONCS_COPY;
    cfg.ocfs = 0xf;
    cfg.namespaces.push(NamespaceConfig {
        nsid: 2,
        ..cfg.namespaces[0]
    });
    cfg
}

/// A cross-namespace Copy (Copy Descriptor Format 2h): the driver enables
/// Formats 2h and 3h at bring-up (Host Behavior Support CDFE, bytes 05:04),
/// each entry names its source namespace (SNSID, bytes 03:00), and the
/// blocks of namespace 2 and of namespace 1 itself land in namespace 1 in
/// order. Without the CDFE the model (as QEMU) fails Format 2h with Invalid
/// Field, and without the SNSID it would copy from namespace 1.
#[test]
fn a_cross_namespace_copy_moves_blocks_of_another_namespace() {
    let (m, c) = setup(cross_copy_config());
    let hbs = m.host_behavior().expect("Host Behavior Support set");
    assert_eq!(u16::from_le_bytes([hbs[4], hbs[5]]), 0b1100, "CDFE 2h, 3h");
    assert_eq!(hbs[2], 0, "no LBAFEE without Extended LBA Formats");
    let (ns1, ns2) = (
        c.namespace(1).unwrap().clone(),
        c.namespace(2).unwrap().clone(),
    );
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(21, 3 * 512);
    let b = pattern(22, 2 * 512);
    m.write_namespace_data(2, 100, &a);
    m.write_namespace_data(1, 100, &b);
    let sources = [
        CopySource {
            ns: &ns2,
            slba: 100,
            blocks: 3,
        },
        CopySource {
            ns: &ns1,
            slba: 100,
            blocks: 2,
        },
    ];
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 1000,
        sources: &sources,
    };
    let done = run_io(&mut qp, cmd, IoData::none().flags(IoFlags::FUA));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(
        last_cdw12(&m),
        (0x19, 1 | 2 << 8 | 1 << 30),
        "NR 0-based, format 2h, FUA"
    );
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert_eq!(m.namespace_data(1, 1000, 5), want);
    // The other way round: namespace 1's blocks into namespace 2.
    let back = [CopySource {
        ns: &ns1,
        slba: 1000,
        blocks: 5,
    }];
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns2,
        sdlba: 4000,
        sources: &back,
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(m.namespace_data(2, 4000, 5), want);
    drop(qp);
    assert_clean(&m);
}

/// What the pair refuses before the device: a source range outside its own
/// namespace (the destination's size does not count), one beyond the
/// source's MSSRL, a source handle of another controller, a stale source
/// handle (Format NVM), and Format 2h where the controller does not report
/// it (OCFS 03h) — then the driver does not enable it either.
#[test]
fn a_cross_namespace_copy_is_checked_against_each_source() {
    let mut cfg = cross_copy_config();
    cfg.namespaces[1].blocks = 256;
    cfg.namespaces[1].mssrl = 8;
    let (m, mut c) = setup(cfg);
    let (ns1, ns2) = (
        c.namespace(1).unwrap().clone(),
        c.namespace(2).unwrap().clone(),
    );
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let refused = |qp: &mut upnvme::IoQueuePair<ModelController>, sources: &[CopySource]| {
        let seen = m.commands_fetched();
        let cmd = IoCommand::CrossNamespaceCopy {
            ns: &ns1,
            sdlba: 0,
            sources,
        };
        let r = qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason;
        assert_eq!(m.commands_fetched(), seen, "nothing sent for {r:?}");
        r
    };
    let src = |ns, slba, blocks| CopySource { ns, slba, blocks };
    assert_eq!(refused(&mut qp, &[src(&ns2, 250, 7)]), Reject::LbaRange);
    assert_eq!(
        refused(&mut qp, &[src(&ns2, 0, 9)]),
        Reject::SizeLimit {
            limit: NvmLimit::CopyRangeBlocks,
            max: 8
        }
    );
    assert_eq!(
        refused(&mut qp, &[]),
        Reject::RangeCount {
            command: RangeCommand::Copy,
            ranges: 0,
            max: 128
        }
    );
    // 9 blocks of namespace 1 (its MSSRL is 128) go.
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns2,
        sdlba: 0,
        sources: &[src(&ns1, 0, 9)],
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    // Another controller's handle.
    let (m_other, other) = setup(cross_copy_config());
    let foreign = other.namespace(2).unwrap().clone();
    assert_eq!(
        refused(&mut qp, &[src(&foreign, 0, 1)]),
        Reject::ForeignNamespace
    );
    drop(other);
    assert_clean(&m_other);
    // A handle Format NVM retired (the fresh one goes; the pair's queues,
    // deleted by the format's reset, are created again by that Copy).
    let fresh = c.format_nvm(2, &upnvme::FormatNvm::lbaf(0)).unwrap();
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 0,
        sources: &[src(&fresh, 0, 1)],
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(
        refused(&mut qp, &[src(&ns2, 0, 1)]),
        Reject::StaleNamespace { nsid: 2 }
    );
    drop(qp);
    drop(c);
    assert_clean(&m);

    // OCFS 03h: no Format 2h; the driver sets no CDFE and refuses.
    let mut cfg = cross_copy_config();
    cfg.ocfs = 0x3;
    let (m, c) = setup(cfg);
    assert_eq!(m.host_behavior(), None, "nothing to enable");
    let (ns1, ns2) = (
        c.namespace(1).unwrap().clone(),
        c.namespace(2).unwrap().clone(),
    );
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 0,
        sources: &[src(&ns2, 0, 1)],
    };
    let seen = m.commands_fetched();
    let r = qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason;
    assert_eq!(r, Reject::CopyFormat { format: 2 });
    assert!(r.to_string().contains("OCFS"), "{r}");
    assert_eq!(m.commands_fetched(), seen);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A 64-bit guard destination takes Format 3h (40-byte entries, SNSID in
/// bytes 03:00) between two namespaces of the same format, and the driver
/// enables LBAFEE and CDFE in one Host Behavior Support.
#[test]
fn a_cross_namespace_copy_to_a_64_bit_guard_format_uses_format_3h() {
    let mut cfg = cross_copy_config();
    cfg.elbas = true;
    for n in &mut cfg.namespaces {
        n.ms = 16;
        n.extended = true;
        n.pi_type = 1;
        n.pif = 2;
    }
    let (m, c) = setup(cfg);
    let hbs = m.host_behavior().expect("Host Behavior Support set");
    assert_eq!((hbs[2], hbs[4]), (1, 0b1100), "LBAFEE and CDFE");
    let (ns1, ns2) = (
        c.namespace(1).unwrap().clone(),
        c.namespace(2).unwrap().clone(),
    );
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(31, 2 * 512);
    m.write_namespace_data(2, 10, &a);
    let cmd = IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 50,
        sources: &[CopySource {
            ns: &ns2,
            slba: 10,
            blocks: 2,
        }],
    };
    let done = run_io(&mut qp, cmd, IoData::none());
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(last_cdw12(&m), (0x19, 3 << 8), "format 3h");
    assert_eq!(m.namespace_data(1, 50, 2), a);
    drop(qp);
    assert_clean(&m);
}

/// The enabled formats follow resets and the application: a reset sets
/// the driver's CDFE again; an application's Host Behavior Support without
/// CDFE disables Formats 2h and 3h (refused before the device), kept
/// across a reset; one with it enables them again.
#[test]
fn cross_namespace_copy_formats_follow_resets_and_the_application() {
    let (m, c) = setup(cross_copy_config());
    let (ns1, ns2) = (
        c.namespace(1).unwrap().clone(),
        c.namespace(2).unwrap().clone(),
    );
    let sources = [CopySource {
        ns: &ns2,
        slba: 0,
        blocks: 1,
    }];
    let copy = || IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 0,
        sources: &sources,
    };
    c.reset().unwrap();
    let hbs = m.host_behavior().expect("set again after the reset");
    assert_eq!(hbs[4], 0b1100);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert!(run_io(&mut qp, copy(), IoData::none()).is_ok());
    let set_hbs = |cdfe: u8| {
        let mut data = vec![0u8; 512];
        data[4] = cdfe;
        let sqe = Sqe::set_features(0x16, 0, false);
        c.admin_passthrough(sqe, 512, Some(&data)).unwrap();
    };
    set_hbs(0);
    let r = qp.submit_io(copy(), IoData::none(), 1).unwrap_err().reason;
    assert_eq!(r, Reject::CopyFormat { format: 2 });
    drop(qp);
    c.reset().unwrap();
    assert_eq!(m.host_behavior().unwrap()[4], 0, "the application's again");
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let r = qp.submit_io(copy(), IoData::none(), 1).unwrap_err().reason;
    assert_eq!(r, Reject::CopyFormat { format: 2 });
    set_hbs(0b100);
    assert!(run_io(&mut qp, copy(), IoData::none()).is_ok());
    drop(qp);
    assert_clean(&m);
}

/// The entry images of a cross-namespace Copy (NVM Command Set, Copy
/// Descriptor Formats 2h and 3h): SNSID in bytes 03:00, SLBA in 15:08, NLB
/// 0-based in 17:16, everything else zero; Format 3h is Format 2h's bytes
/// followed by eight zero bytes (tags and masks, which the driver leaves 0).
#[test]
fn copy_source_entries_carry_the_snsid_in_bytes_3_0() {
    let (m, c) = setup(cross_copy_config());
    let ns2 = c.namespace(2).unwrap().clone();
    let s = CopySource {
        ns: &ns2,
        slba: 0x0102_0304_0506_0708,
        blocks: 0x10,
    };
    let f2 = s.to_le_bytes_format_2();
    let mut want = [0u8; 32];
    want[..4].copy_from_slice(&2u32.to_le_bytes());
    want[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
    want[16..18].copy_from_slice(&0x0fu16.to_le_bytes());
    assert_eq!(f2, want);
    let f3 = s.to_le_bytes_format_3();
    assert_eq!(f3[..32], f2);
    assert_eq!(f3[32..], [0u8; 8]);
    assert_eq!(
        s.range().to_le_bytes()[4..],
        f2[4..],
        "Format 0h without SNSID"
    );
    drop(c);
    assert_clean(&m);
}

/// The cross-namespace formats are optional after a reset as at bring-up:
/// a reset whose Set Features Host Behavior Support with the driver's CDFE
/// the controller refuses succeeds without them (a cross-namespace Copy is
/// refused before the device, other I/O goes), with LBAFEE alone where the
/// driver needs it (Extended LBA Formats), and the next reset sets CDFE
/// again.
#[test]
fn a_reset_whose_cdfe_is_refused_goes_on_without_the_cross_namespace_formats() {
    for elbas in [false, true] {
        let mut cfg = cross_copy_config();
        cfg.elbas = elbas;
        let (m, c) = setup(cfg);
        let (ns1, ns2) = (
            c.namespace(1).unwrap().clone(),
            c.namespace(2).unwrap().clone(),
        );
        let sources = [CopySource {
            ns: &ns2,
            slba: 0,
            blocks: 1,
        }];
        let copy = || IoCommand::CrossNamespaceCopy {
            ns: &ns1,
            sdlba: 0,
            sources: &sources,
        };
        m.inject(Fault::Status {
            on: Match::SetFeatures { fid: 0x16 },
            status: Status::INVALID_FIELD.with_dnr(),
        });
        c.reset()
            .unwrap_or_else(|e| panic!("elbas {elbas}: reset failed: {e}"));
        let hbs = m.host_behavior();
        if elbas {
            let hbs = hbs.expect("LBAFEE alone after the refusal");
            assert_eq!((hbs[2], hbs[4]), (1, 0), "LBAFEE, no CDFE");
        } else {
            assert_eq!(hbs, None, "nothing set: the controller's defaults");
        }
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let seen = m.commands_fetched();
        let r = qp.submit_io(copy(), IoData::none(), 1).unwrap_err().reason;
        assert_eq!(r, Reject::CopyFormat { format: 2 }, "elbas {elbas}");
        assert!(
            r.to_string().contains("unless the controller refuses it"),
            "{r}"
        );
        assert_eq!(m.commands_fetched(), seen, "nothing sent");
        let buf = c.alloc_dma(512).unwrap();
        qp.write_blocking(&ns1, 0, 1, buf, T).unwrap();
        drop(qp);
        c.reset().unwrap();
        assert_eq!(m.host_behavior().unwrap()[4], 0b1100, "CDFE again");
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        assert!(run_io(&mut qp, copy(), IoData::none()).is_ok());
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

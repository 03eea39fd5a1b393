//! Guest tests of application-owned memory (`Controller::register_memory`)
//! against QEMU's controller behind the emulated IOMMU: an anonymous 2 MiB
//! hugepage mapping the test made itself is registered, I/O goes through
//! buffers carved from it, and the mapping comes back with the data in it.
//! A buffer the driver described at a wrong IOVA would show as wrong bytes
//! or as a DMAR fault, which fails the run.

use std::time::Duration;

use upnvme::memmap2::MmapOptions;
use upnvme::{
    Controller, ControllerOptions, IoCommand, IoData, IoVec, Namespace, PageBacking,
    QueuePairOptions, UnregisterError,
};

const T: Duration = Duration::from_secs(10);
const HUGE: usize = 2 << 20;

/// xorshift bytes for `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A namespace without metadata (namespace 2 in the metadata-pi
/// configuration, namespace 1 elsewhere).
fn plain_namespace(c: &Controller) -> Namespace {
    c.namespaces()
        .iter()
        .rev()
        .find(|n| n.metadata_layout().is_none())
        .expect("a namespace without metadata")
        .clone()
}

#[test]
fn registered_hugepage_round_trip_hands_the_data_back() {
    let c = Controller::open(&crate::vm::device(), ControllerOptions::default()).unwrap();
    let ns = plain_namespace(&c);
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();

    // The application's own hugepage mapping, with data put in it first.
    let mut mapping = MmapOptions::new()
        .len(HUGE)
        .huge(Some(21))
        .map_anon()
        .expect("a 2 MiB hugepage (the test bed reserves some)");
    let out = pattern(0x3e9, 64 << 10);
    mapping[..out.len()].copy_from_slice(&out);
    let reg = c.register_memory(mapping).unwrap();
    assert_eq!(reg.backing(), PageBacking::Huge2M, "{reg:?}");
    assert_eq!(reg.iova() % HUGE as u64, 0, "2 MiB-aligned IOVA");

    // 64 KiB out of the mapping's first bytes (a PRP list or an SGL).
    let blocks = (out.len() / lba) as u32;
    let slba = 64;
    let src = reg.buffer(0, out.len()).unwrap();
    let src = qp.write_blocking(&ns, slba, blocks, src, T).unwrap();

    // Read it back into the upper half of the hugepage: a whole buffer,
    // and a slice at a dword offset inside another.
    let dst = reg.buffer(HUGE / 2, out.len()).unwrap();
    let dst = qp.read_blocking(&ns, slba, blocks, dst, T).unwrap();
    let mut back = vec![0; out.len()];
    dst.read_bytes(0, &mut back).unwrap();
    assert_eq!(back, out, "read back through a registered buffer");
    let big = reg.buffer(HUGE - (32 << 10), 16 << 10).unwrap();
    let read = IoCommand::Read {
        ns: &ns,
        slba: slba + 1,
        blocks: 1,
    };
    qp.submit_io(read, IoData::slice(big, 12, lba), 1).unwrap();
    let done = loop {
        if let Some(done) = qp.next_completion().unwrap() {
            break done;
        }
    };
    assert!(done.is_ok(), "{:?}", done.result);
    let big = done.buffer.unwrap();

    // Two registered segments on page boundaries, in one write (PRPs).
    let more = pattern(0x3ea, 2 * lba);
    let a = reg.buffer(HUGE / 4, lba).unwrap();
    let b = reg.buffer(HUGE / 4 + (64 << 10), lba).unwrap();
    a.write_bytes(0, &more[..lba]).unwrap();
    b.write_bytes(0, &more[lba..]).unwrap();
    let mut v = IoVec::with_capacity(2);
    v.push(a, 0, lba).unwrap();
    v.push(b, 0, lba).unwrap();
    let write = IoCommand::Write {
        ns: &ns,
        slba: slba + 100,
        blocks: 2,
    };
    qp.submit_io(write, IoData::vectored(v), 2).unwrap();
    let done = loop {
        if let Some(done) = qp.next_completion().unwrap() {
            break done;
        }
    };
    assert!(done.is_ok(), "{:?}", done.result);
    drop(done);
    let check = qp
        .read_blocking(&ns, slba + 100, 2, c.alloc_dma(2 * lba).unwrap(), T)
        .unwrap();
    let mut got = vec![0; 2 * lba];
    check.read_bytes(0, &mut got).unwrap();
    assert_eq!(got, more, "the vectored write reached the namespace");

    // Not while a buffer is alive; then the mapping comes back with it all.
    let reg = match reg.unregister() {
        Err(UnregisterError::StillInUse {
            buffers,
            registration,
        }) => {
            assert_eq!(buffers, 3);
            registration
        }
        other => panic!("expected StillInUse, got {other:?}"),
    };
    drop((src, dst, big));
    let mapping = reg.unregister().unwrap();
    assert_eq!(mapping.len(), HUGE);
    assert_eq!(&mapping[..out.len()], &out[..]);
    assert_eq!(&mapping[HUGE / 2..HUGE / 2 + out.len()], &out[..]);
    let s = HUGE - (32 << 10) + 12;
    assert_eq!(&mapping[s..s + lba], &out[lba..2 * lba]);
    assert_eq!(&mapping[HUGE / 4..HUGE / 4 + lba], &more[..lba]);
    drop(qp);
    c.close().unwrap();
}

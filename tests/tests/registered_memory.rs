//! Application-owned memory on the model: a mapping registered with
//! `Controller::register_memory`, byte-exact I/O through buffers carved from
//! it (whole buffers, slices, vectors), the mapping handed back with the data
//! in it, unregistering refused while a buffer (or a command holding one) is
//! alive, and every bad input refused with a typed error that hands the
//! mapping back.

mod common;

use std::time::Duration;

use common::{T, assert_clean, model, open, opts, pattern, run_io, setup};
use upnvme::memmap2::{MmapMut, MmapOptions};
use upnvme::{
    CarveError, DmaPool, IoCommand, IoData, IoVec, QueuePairOptions, RegisterFailure,
    UnregisterError,
};
use upnvme_tests::{Fault, Match, ModelConfig};

const LBA: usize = 4096;

/// An anonymous mapping of `len` bytes with `data` at `at`.
fn mapping_with(len: usize, at: usize, data: &[u8]) -> MmapMut {
    let mut m = MmapMut::map_anon(len).expect("map_anon");
    m[at..at + data.len()].copy_from_slice(data);
    m
}

#[test]
fn round_trip_through_registered_buffers_and_back_into_the_mapping() {
    // SGLs, so the vector with a 100-byte first segment can be described.
    let (m, c) = setup(ModelConfig {
        sgls: 1,
        ..ModelConfig::default()
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let maps_before = m.iova_mappings();

    // Data the application put into its mapping before registering it.
    let written = pattern(1, 4 * LBA);
    let reg = c
        .register_memory(mapping_with(1 << 20, 64 << 10, &written))
        .unwrap();
    assert_eq!(reg.len(), 1 << 20);
    assert_eq!(m.iova_mappings(), maps_before + 1, "one IOMMU mapping");
    assert_eq!(reg.iova() % (2 << 20), 0);

    // Write it from a buffer at that offset: it reaches the namespace.
    let src = reg.buffer(64 << 10, 4 * LBA).unwrap();
    assert_eq!(src.iova(), reg.iova() + (64 << 10));
    let src = qp.write_blocking(&ns, 10, 4, src, T).unwrap();
    assert_eq!(m.namespace_data(1, 10, 4), written);

    // Read it back into a first-fit buffer and into a slice of another.
    let dst = reg.alloc(4 * LBA).unwrap();
    let dst_off = (dst.iova() - reg.iova()) as usize;
    assert_eq!(dst_off, 0, "first fit: the lowest free pages");
    let dst = qp.read_blocking(&ns, 10, 4, dst, T).unwrap();
    let mut back = vec![0; 4 * LBA];
    dst.read_bytes(0, &mut back).unwrap();
    assert_eq!(back, written);
    let big = reg.alloc(8 * LBA).unwrap();
    let big_off = (big.iova() - reg.iova()) as usize;
    let read = IoCommand::Read {
        ns: &ns,
        slba: 11,
        blocks: 1,
    };
    let c1 = run_io(&mut qp, read, IoData::slice(big, 2 * LBA + 8, LBA));
    assert!(c1.is_ok(), "{:?}", c1.result);
    let big = c1.buffer.expect("the whole buffer back");

    // A vectored write from two registered buffers (an odd split).
    let head = reg.alloc(LBA).unwrap();
    let tail = reg.alloc(2 * LBA).unwrap();
    let vec_data = pattern(2, 2 * LBA);
    head.write_bytes(0, &vec_data[..100]).unwrap();
    tail.write_bytes(0, &vec_data[100..]).unwrap();
    let mut v = IoVec::with_capacity(2);
    v.push(head, 0, 100).unwrap();
    v.push(tail, 0, 2 * LBA - 100).unwrap();
    let write = IoCommand::Write {
        ns: &ns,
        slba: 20,
        blocks: 2,
    };
    let c2 = run_io(&mut qp, write, IoData::vectored(v));
    assert!(c2.is_ok(), "{:?}", c2.result);
    assert_eq!(m.namespace_data(1, 20, 2), vec_data);

    drop((src, dst, c2));
    assert_eq!(reg.live_buffers(), 1, "only `big` is left");
    drop(big);
    let mapping = reg.unregister().unwrap();
    assert_eq!(m.iova_mappings(), maps_before, "IOMMU mapping removed");
    assert_eq!(&mapping[dst_off..dst_off + 4 * LBA], &written[..]);
    let s = big_off + 2 * LBA + 8;
    assert_eq!(&mapping[s..s + LBA], &written[LBA..2 * LBA]);
    assert_eq!(&mapping[64 << 10..(64 << 10) + 4 * LBA], &written[..]);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn unregister_waits_for_every_buffer_including_one_a_command_holds() {
    let (m, c) = setup(ModelConfig::default());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let reg = c
        .register_memory(MmapMut::map_anon(64 << 10).unwrap())
        .unwrap();

    // A plain live buffer.
    let buf = reg.alloc(LBA).unwrap();
    let err = reg.unregister().unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, UnregisterError::StillInUse { buffers: 1, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("1 DMA buffer(s)") && msg.contains("drop them"),
        "{msg}"
    );
    let reg = err.into_registration().expect("handed back");
    drop(buf);

    // A buffer inside a command whose completion the device holds back:
    // the blocking call times out, the command keeps the buffer.
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    let f = qp
        .read_blocking(
            &ns,
            0,
            1,
            reg.alloc(LBA).unwrap(),
            Duration::from_millis(20),
        )
        .unwrap_err();
    assert!(f.buffer.is_none(), "kept until the completion arrives");
    let reg = match reg.unregister() {
        Err(UnregisterError::StillInUse {
            buffers: 1,
            registration,
        }) => registration,
        other => panic!("expected StillInUse, got {other:?}"),
    };
    m.release_delayed();
    let mut back = None;
    qp.process_completions(8, |_, c| back = c.buffer).unwrap();
    drop(back.expect("the buffer came back with its completion"));
    assert_eq!(reg.live_buffers(), 0);
    let mapping = reg.unregister().unwrap();
    assert_eq!(mapping.len(), 64 << 10);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn dropping_the_registration_with_buffers_alive_keeps_them_usable() {
    let (m, c) = setup(ModelConfig::default());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let maps_before = m.iova_mappings();
    let reg = c
        .register_memory(MmapMut::map_anon(32 << 10).unwrap())
        .unwrap();
    let buf = reg.alloc(2 * LBA).unwrap();
    drop(reg);
    assert_eq!(m.iova_mappings(), maps_before + 1, "still mapped");
    let data = pattern(3, 2 * LBA);
    buf.write_bytes(0, &data).unwrap();
    let buf = qp.write_blocking(&ns, 5, 2, buf, T).unwrap();
    buf.fill(0, buf.len(), 0).unwrap();
    let buf = qp.read_blocking(&ns, 5, 2, buf, T).unwrap();
    assert_eq!(buf.to_vec(), data);
    // Split pieces keep it alive too; the last one unmaps it.
    let mut pieces = buf.split(LBA).unwrap();
    let last = pieces.pop().unwrap();
    drop(pieces);
    assert_eq!(m.iova_mappings(), maps_before + 1);
    drop(last);
    assert_eq!(
        m.iova_mappings(),
        maps_before,
        "unmapped with the last buffer"
    );
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn bad_registrations_are_refused_with_the_mapping_back() {
    let m = model();
    let c = open(&m, opts());
    let maps = m.iova_mappings();

    let e = c
        .register_memory(MmapMut::map_anon(0).unwrap())
        .unwrap_err();
    assert!(matches!(e.reason(), RegisterFailure::Empty), "{e}");
    assert!(e.to_string().contains("map at least one 4 KiB page"), "{e}");

    let e = c
        .register_memory(mapping_with(5000, 4990, b"0123456789"))
        .unwrap_err();
    assert!(
        matches!(
            e.reason(),
            RegisterFailure::LengthNotPageMultiple {
                len: 5000,
                rounded: 8192
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("map 8192 bytes instead"), "{e}");
    let back = e.into_mapping().expect("the mapping comes back");
    assert_eq!(&back[4990..], b"0123456789", "untouched");

    // An IOMMU with a small address space: 8 MiB more than is mapped now.
    m.limit_iova_window(8 << 20);
    let huge = MmapOptions::new().len(256 << 20).map_anon().unwrap();
    let e = c.register_memory(huge).unwrap_err();
    assert!(
        matches!(e.reason(), RegisterFailure::LargerThanIovaWindow { len, .. } if *len == 256 << 20),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("register it as several smaller mappings"),
        "{e}"
    );
    assert_eq!(e.into_mapping().map(|m| m.len()), Some(256 << 20));
    let first = c
        .register_memory(MmapMut::map_anon(6 << 20).unwrap())
        .unwrap();
    let e = c
        .register_memory(MmapMut::map_anon(4 << 20).unwrap())
        .unwrap_err();
    assert!(
        matches!(e.reason(), RegisterFailure::IovaExhausted { .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("unregister memory that is no longer needed"),
        "{e}"
    );
    assert!(e.into_mapping().is_some());
    assert_eq!(
        m.iova_mappings(),
        maps + 1,
        "nothing left mapped by refusals"
    );
    drop(first.unregister().unwrap());

    // A device without a DMA mapper cannot take application memory.
    let spy = common::Spy::new(upnvme_tests::ModelController::new(ModelConfig::default()));
    let sc = upnvme::Controller::with_device(spy, opts()).unwrap();
    let e = sc
        .register_memory(MmapMut::map_anon(4096).unwrap())
        .unwrap_err();
    assert!(
        matches!(e.reason(), RegisterFailure::Unsupported { .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("use Controller::alloc_dma instead"),
        "{e}"
    );
    sc.close().unwrap();
    c.close().unwrap();
    assert_eq!(m.iova_mappings(), maps);
    assert_clean(&m);
}

#[test]
fn bad_carvings_are_refused_with_typed_errors() {
    let (m, c) = setup(ModelConfig::default());
    let reg = c
        .register_memory(MmapMut::map_anon(16 << 10).unwrap())
        .unwrap();
    assert_eq!(reg.alloc(0).unwrap_err(), CarveError::ZeroLength);
    assert_eq!(reg.buffer(0, 0).unwrap_err(), CarveError::ZeroLength);
    let e = reg.buffer(4100, 8).unwrap_err();
    assert_eq!(
        e,
        CarveError::Unaligned {
            offset: 4100,
            aligned: 4096
        }
    );
    assert!(e.to_string().contains("use IoData::slice"), "{e}");
    assert!(matches!(
        reg.buffer(12 << 10, 4097),
        Err(CarveError::OutOfRange { .. })
    ));
    assert!(matches!(
        reg.buffer(usize::MAX & !4095, 1),
        Err(CarveError::OutOfRange { .. })
    ));
    assert!(matches!(
        reg.alloc(usize::MAX),
        Err(CarveError::OutOfRange { .. })
    ));
    let mid = reg.buffer(4096, 100).unwrap();
    assert_eq!(mid.len(), 100, "exactly the length asked for");
    let e = reg.buffer(0, 8192).unwrap_err();
    assert!(matches!(e, CarveError::Overlaps { .. }), "{e}");
    assert!(e.to_string().contains("drop that buffer first"), "{e}");
    // 0..4096 and 8192..16384 are free: an 8 KiB first fit takes the latter.
    let hi = reg.alloc(8192).unwrap();
    assert_eq!(hi.iova(), reg.iova() + 8192);
    let e = reg.alloc(8192).unwrap_err();
    assert_eq!(
        e,
        CarveError::NoSpace {
            pages_len: 8192,
            size: 16 << 10,
            free: 4096,
            largest: 4096
        }
    );
    assert!(e.to_string().contains("register more memory"), "{e}");
    drop((mid, hi));
    assert_eq!(reg.free_bytes(), 16 << 10, "free runs merged back");
    assert!(reg.alloc(16 << 10).is_ok());
    drop(reg.unregister().unwrap());
    c.close().unwrap();
    assert_clean(&m);
}

/// A pool over registered memory: its buffers carry I/O, show the
/// application's bytes (not zeroed), refuse a registered buffer that is not
/// the pool's, and hold the registration — as one buffer — until the pool
/// and every buffer it handed out are gone.
#[test]
fn a_pool_over_registered_memory_carries_io_and_holds_the_registration() {
    let (m, c) = setup(ModelConfig::default());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let app = pattern(5, 4 * LBA);
    let reg = c.register_memory(mapping_with(64 << 10, 0, &app)).unwrap();
    let mut pool = DmaPool::new(reg.alloc(4 * LBA).unwrap(), LBA, 4).unwrap();
    assert_eq!(reg.live_buffers(), 1, "the pool's slab");
    let b = pool.get().unwrap();
    assert_eq!(
        b.to_vec(),
        app[..LBA],
        "not zeroed: the application's bytes"
    );
    let b = qp.write_blocking(&ns, 40, 1, b, T).unwrap();
    pool.put(b).unwrap();
    let mut held: Vec<_> = std::iter::from_fn(|| pool.get()).collect();
    assert_eq!(held.len(), 4);
    let last = held.pop().unwrap();
    let last = qp.read_blocking(&ns, 40, 1, last, T).unwrap();
    assert_eq!(last.to_vec(), app[..LBA]);
    let last_at = (last.iova() - reg.iova()) as usize;
    for b in held {
        pool.put(b).unwrap();
    }
    // A buffer of the same registration, not of the pool, is refused.
    let other = reg.alloc(LBA).unwrap();
    let other = pool.put(other).unwrap_err().0;
    drop(other);
    // The pool (with a buffer out) holds the registration.
    drop(pool);
    let reg = match reg.unregister() {
        Err(UnregisterError::StillInUse {
            buffers: 1,
            registration,
        }) => registration,
        other => panic!("expected StillInUse with one buffer, got {other:?}"),
    };
    drop(last);
    assert_eq!(reg.free_bytes(), 64 << 10);
    let mapping = reg.unregister().unwrap();
    assert_eq!(&mapping[last_at..last_at + LBA], &app[..LBA]);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

/// `RegisteredMemory` is `Sync`: threads carving from one registration at
/// once never get buffers that share a byte (each fills its buffers with
/// its own byte and finds them unchanged after the others ran), and every
/// page comes back.
#[test]
fn threads_carving_one_registration_never_share_a_page() {
    let (m, c) = setup(ModelConfig::default());
    let reg = std::sync::Arc::new(
        c.register_memory(MmapMut::map_anon(256 << 10).unwrap())
            .unwrap(),
    );
    let threads: Vec<_> = (1..=4u8)
        .map(|t| {
            let reg = reg.clone();
            std::thread::spawn(move || {
                let mut held = std::collections::VecDeque::new();
                let mut carved = 0;
                for round in 0..400usize {
                    let len = 1 + (round * 4099 + usize::from(t) * 977) % (3 * LBA);
                    let b = if round % 3 == 0 {
                        // At an offset: another thread's pages are refused.
                        let off = (round * 7 + usize::from(t)) % 60 * LBA;
                        match reg.buffer(off, len) {
                            Ok(b) => b,
                            Err(CarveError::Overlaps { .. } | CarveError::OutOfRange { .. }) => {
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        match reg.alloc(len) {
                            Ok(b) => b,
                            Err(CarveError::NoSpace { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    };
                    b.fill(0, len, t).unwrap();
                    held.push_back(b);
                    carved += 1;
                    if held.len() > 3 {
                        let b = held.pop_front().unwrap();
                        assert!(
                            b.to_vec().iter().all(|&x| x == t),
                            "thread {t}: another thread wrote into its buffer"
                        );
                    }
                    std::thread::yield_now();
                }
                for b in held {
                    assert!(b.to_vec().iter().all(|&x| x == t));
                }
                carved
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap() > 100, "too few carvings to mean anything");
    }
    let reg = std::sync::Arc::try_unwrap(reg).unwrap();
    assert_eq!(reg.live_buffers(), 0);
    assert_eq!(reg.free_bytes(), 256 << 10, "every page came back");
    drop(reg.unregister().unwrap());
    c.close().unwrap();
    assert_clean(&m);
}

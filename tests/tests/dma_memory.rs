//! The controller's own DMA memory on the model: `alloc_dma` and
//! `dma_pool` edge cases a demanding application hits — a big buffer's
//! mapping going back when it is dropped, impossible pools refused with
//! what to change, and buffers, pools and registered memory that outlive
//! their controller.

mod common;

use common::{T, assert_clean, pattern, setup};
use upnvme::memmap2::MmapMut;
use upnvme::{Error, QueuePairOptions};
use upnvme_tests::ModelConfig;

/// A buffer larger than a standard 2 MiB region gets a region of its own,
/// which is unmapped (its pages and IOVA range given back) when the buffer
/// goes — also when the buffer went through a pool or was split first.
/// Small buffers' regions stay mapped for reuse.
#[test]
fn a_big_buffer_gives_its_mapping_back_when_it_goes() {
    let (m, c) = setup(ModelConfig::default());
    let small = c.alloc_dma(4096).unwrap();
    let maps = m.iova_mappings();
    let live = m.live_dma_buffers();

    let big = c.alloc_dma(8 << 20).unwrap();
    assert_eq!(m.iova_mappings(), maps + 1, "a region of its own");
    big.fill(0, big.len(), 0xa5).unwrap();
    drop(big);
    assert_eq!(m.iova_mappings(), maps, "unmapped with its buffer");

    // A pool's slab: kept while the pool or any of its buffers lives.
    let mut pool = c.dma_pool(1 << 20, 4).unwrap();
    assert_eq!(m.iova_mappings(), maps + 1);
    let b = pool.get().unwrap();
    drop(pool);
    assert_eq!(m.iova_mappings(), maps + 1, "a pool buffer holds the slab");
    let pieces = b.split(4096).unwrap();
    drop(pieces);
    assert_eq!(m.iova_mappings(), maps);

    // Many big buffers one after the other take one mapping at a time,
    // and each is zeroed like any new buffer.
    for i in 0..8 {
        let b = c.alloc_dma((3 << 20) + i * 4096).unwrap();
        assert_eq!(m.iova_mappings(), maps + 1);
        assert!(b.to_vec().iter().all(|&x| x == 0), "not zeroed");
    }
    assert_eq!(m.iova_mappings(), maps);

    // A small buffer's region stays: its pages are reused.
    let iova = small.iova();
    drop(small);
    assert_eq!(m.iova_mappings(), maps);
    let again = c.alloc_dma(4096).unwrap();
    assert_eq!(again.iova(), iova);
    drop(again);
    assert_eq!(m.live_dma_buffers(), live - 1);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn impossible_pools_are_refused_with_what_to_change() {
    let (m, c) = setup(ModelConfig::default());
    for (len, count, fix) in [
        (0, 4, "ask for buffers of at least 1 byte"),
        (4096, 0, "ask for at least one buffer"),
        (usize::MAX, 1, "ask for fewer or smaller buffers"),
        (4096, usize::MAX, "ask for fewer or smaller buffers"),
    ] {
        let e = c.dma_pool(len, count).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains(fix), "({len}, {count}): {e}");
    }
    // A pool carved from a slab too small for it says how large it must be.
    let e = upnvme::DmaPool::new(c.alloc_dma(8192).unwrap(), 4097, 2).unwrap_err();
    assert!(e.to_string().contains("needs a slab of 16384 bytes"), "{e}");
    c.close().unwrap();
    assert_clean(&m);
}

/// Buffers, a pool and registered memory outlive the controller that made
/// them: the CPU still reads and writes them (the controller is disabled,
/// so the device no longer does), the pool still gets and puts, and the
/// registration is handed back with its data. Nothing is freed under them.
#[test]
fn buffers_pools_and_registrations_outlive_their_controller() {
    let (m, c) = setup(ModelConfig::default());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(7, 8192);
    let buf = c.alloc_dma(8192).unwrap();
    buf.write_bytes(0, &data).unwrap();
    let buf = qp.write_blocking(&ns, 3, 2, buf, T).unwrap();
    let mut pool = c.dma_pool(4096, 2).unwrap();
    let reg = c
        .register_memory(MmapMut::map_anon(64 << 10).unwrap())
        .unwrap();
    let into = reg.alloc(8192).unwrap();
    let into = qp.read_blocking(&ns, 3, 2, into, T).unwrap();
    let at = (into.iova() - reg.iova()) as usize;
    drop(qp);
    c.close().unwrap();

    assert_eq!(buf.to_vec(), data);
    buf.write_u64(0, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(buf.read_u64(0).unwrap(), 0x1122_3344_5566_7788);
    let p = pool.get().unwrap();
    p.write_u32(0, 9).unwrap();
    pool.put(p).unwrap();
    assert_eq!(pool.available(), 2);
    assert_eq!(into.to_vec(), data);
    let reg = match reg.unregister() {
        Err(e) => e.into_registration().expect("still in use: handed back"),
        Ok(_) => panic!("unregistered with a buffer alive"),
    };
    drop(into);
    let mapping = reg.unregister().unwrap();
    assert_eq!(&mapping[at..at + 8192], &data[..]);
    drop((buf, pool));
    assert_eq!(m.live_dma_buffers(), 0, "every buffer given back");
    assert_clean(&m);
}

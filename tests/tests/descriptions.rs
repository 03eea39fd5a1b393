//! The data path's breadth (split.rs, iodata.rs, metadata.rs, submit.rs'
//! general path, queues' PRP/SGL/PI) against the model: transfers
//! described exactly (nothing outside the described bytes is touched,
//! everything inside lands), across LBA sizes, metadata layouts, PI types,
//! MDTS values, SGL support levels and modes, slices and vectors, split or
//! not; and the reference tags of split pieces.

mod common;

use common::{Rng, assert_clean, buffer_with, pattern, read_back, run_io, setup};
use upnvme::{
    Controller, DmaBuffer, IoCommand, IoData, IoVec, Protection, QueuePairOptions, SglMode,
};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

const SENTINEL: u8 = 0xee;
const NS_BLOCKS: u64 = 1024;

#[derive(Clone, Copy, Debug)]
struct Fmt {
    lba: u32,
    ms: u16,
    ext: bool,
    pi: u8,
    pif: u8,
}

impl Fmt {
    fn tuple(&self) -> usize {
        if self.pif == 2 { 16 } else { 8 }
    }
    /// Whether metadata moves between host and controller.
    fn md_moves(&self, pract: bool) -> bool {
        self.ms != 0 && !(self.pi != 0 && pract && usize::from(self.ms) == self.tuple())
    }
    /// (bytes per block through the data pointer, bytes per block at MPTR)
    fn per_block(&self, pract: bool) -> (usize, usize) {
        let lba = self.lba as usize;
        let ms = usize::from(self.ms);
        match (self.md_moves(pract), self.ext) {
            (true, true) => (lba + ms, 0),
            (true, false) => (lba, ms),
            (false, _) => (lba, 0),
        }
    }
}

fn cfg(f: Fmt, mdts: u8, sgls: u32) -> ModelConfig {
    ModelConfig {
        mdts,
        sgls,
        elbas: f.pif == 2,
        oncs: ModelConfig::ONCS_COMPARE,
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: f.lba,
            blocks: NS_BLOCKS,
            ms: f.ms,
            extended: f.ext,
            pi_type: f.pi,
            pif: f.pif,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

/// Where a transfer's bytes live, with guard bytes around them that the
/// device must never touch.
enum Mem {
    /// `len` bytes at `off` of `buf` (the slice's limit may be larger).
    Slice {
        buf: DmaBuffer,
        off: usize,
        limit: usize,
    },
    /// Segments: each (buffer, offset, length).
    Vector(Vec<(DmaBuffer, usize, usize)>),
}

/// Memory for `need` bytes, laid out at random within the rules of the
/// encodings the pair may use: `prp_only` (inner boundaries on pages, the
/// first piece dword aligned), `dword` (SGLS 10b: every piece dword aligned).
fn layout(
    c: &Controller<ModelController>,
    rng: &mut Rng,
    need: usize,
    prp_only: bool,
    dword: bool,
) -> Mem {
    let align = |x: usize| if prp_only || dword { x & !3 } else { x };
    if rng.below(2) == 0 {
        let off = align(rng.below(9000) as usize);
        let tail = rng.below(300) as usize;
        let buf = c.alloc_dma(off + need + tail).unwrap();
        buf.fill(0, buf.len(), SENTINEL).unwrap();
        let limit = need + rng.below(tail as u64 + 1) as usize;
        return Mem::Slice { buf, off, limit };
    }
    // A vector; the last segment may be longer than the transfer needs.
    let extra = align(rng.below(600) as usize);
    let total = need + extra;
    let mut segs = Vec::new();
    let mut at = 0usize;
    while at < total {
        let left = total - at;
        let (pre, len) = if prp_only {
            if at == 0 {
                // First piece: any dword offset in a page, ends on a page.
                let pre = align(rng.below(4096) as usize);
                let first_page = 4096 - pre;
                let len = (first_page + 4096 * rng.below(3) as usize).min(left);
                (pre, len)
            } else {
                (0, (4096 * (1 + rng.below(3) as usize)).min(left))
            }
        } else {
            let pre = align(rng.below(5000) as usize);
            let len = align(1 + rng.below(6000) as usize).max(4).min(left);
            (pre, len)
        };
        // The last piece absorbs any remainder below 4 bytes.
        let len = if left - len < 4 { left } else { len };
        let post = rng.below(200) as usize;
        let b = c.alloc_dma(pre + len + post + 4096).unwrap();
        // Page-align where the rules need it (the buffer's IOVA decides).
        let shift = if prp_only && at > 0 {
            ((4096 - (b.iova() as usize & 4095)) & 4095) + pre
        } else if prp_only {
            let base = b.iova() as usize & 4095;
            ((4096 - base) & 4095) + pre
        } else {
            pre
        };
        b.fill(0, b.len(), SENTINEL).unwrap();
        segs.push((b, shift, len));
        at += len;
    }
    Mem::Vector(segs)
}

fn io_of(m: Mem) -> IoData {
    match m {
        Mem::Slice { buf, off, limit } => IoData::slice(buf, off, limit),
        Mem::Vector(segs) => {
            let mut v = IoVec::with_capacity(segs.len());
            for (b, off, len) in segs {
                v.push(b, off, len).unwrap();
            }
            IoData::vectored(v)
        }
    }
}

/// Fills the first `data.len()` bytes of the memory with `data`.
fn put(m: &Mem, data: &[u8]) {
    match m {
        Mem::Slice { buf, off, .. } => buf.write_bytes(*off, data).unwrap(),
        Mem::Vector(segs) => {
            let mut at = 0;
            for (b, off, len) in segs {
                let n = (*len).min(data.len() - at);
                b.write_bytes(*off, &data[at..at + n]).unwrap();
                at += n;
                if at == data.len() {
                    break;
                }
            }
        }
    }
}

/// The `need` transferred bytes of a completed vectored command, and the
/// guard bytes (outside them) that were touched.
fn take(c: &upnvme::Completion, need: usize) -> (Vec<u8>, Vec<String>) {
    let mut bad = Vec::new();
    let mut out = Vec::new();
    let v = c.segments.as_ref().expect("the vector comes back");
    let mut at = 0usize;
    for (i, s) in v.segments().iter().enumerate() {
        let all = read_back(s.buffer(), s.buffer().len());
        let used = s.len().min(need - at.min(need));
        out.extend_from_slice(&all[s.offset()..s.offset() + used]);
        for (j, &x) in all.iter().enumerate() {
            let inside = j >= s.offset() && j < s.offset() + used;
            if !inside && x != SENTINEL {
                bad.push(format!(
                    "segment {i} byte {j} (used {}..{})",
                    s.offset(),
                    s.offset() + used
                ));
                break;
            }
        }
        at += s.len();
    }
    (out, bad)
}

/// Checks a slice buffer: bytes [off, off + need) are returned, anything
/// else must be the sentinel.
fn take_slice(b: &DmaBuffer, off: usize, need: usize) -> (Vec<u8>, Vec<String>) {
    let all = read_back(b, b.len());
    let mut bad = Vec::new();
    for (j, &x) in all.iter().enumerate() {
        if (j < off || j >= off + need) && x != SENTINEL {
            bad.push(format!("slice byte {j} outside {off}..{}", off + need));
            break;
        }
    }
    (all[off..off + need].to_vec(), bad)
}

fn modes(sgls: u32) -> &'static [SglMode] {
    if sgls == 0 {
        &[SglMode::Auto, SglMode::Never]
    } else {
        &[SglMode::Auto, SglMode::Never, SglMode::Always]
    }
}

/// Interleaves per-block data and metadata.
fn interleave(data: &[u8], md: &[u8], lba: usize, ms: usize) -> Vec<u8> {
    data.chunks(lba)
        .zip(md.chunks(ms))
        .flat_map(|(d, m)| d.iter().chain(m).copied())
        .collect()
}

/// One write then one read through random memory layouts, checked against
/// the model's storage and the guard bytes around every buffer.
#[allow(clippy::too_many_arguments)]
fn round_trip(
    m: &ModelController,
    c: &Controller<ModelController>,
    qp: &mut upnvme::IoQueuePair<ModelController>,
    rng: &mut Rng,
    f: Fmt,
    prp_only: bool,
    dword: bool,
    ctx: &str,
) {
    let ns = c.namespace(1).unwrap().clone();
    let per = qp.max_transfer() / (f.lba as usize + if f.ext { usize::from(f.ms) } else { 0 });
    let max_blocks = (4 * per.max(1)).min(200) as u64;
    let blocks = 1 + rng.below(max_blocks) as u32;
    let slba = rng.below(NS_BLOCKS - u64::from(blocks) + 1);
    let lba = f.lba as usize;
    let ms = usize::from(f.ms);
    let n = blocks as usize;
    let seed = rng.next();
    let data = pattern(seed, n * lba);
    let md = pattern(seed ^ 1, n * ms);

    // Write: PI formats with PRACT (the controller generates the tuples);
    // others carry their metadata.
    let wprot = (f.pi != 0).then_some(Protection {
        pract: true,
        check_guard: false,
        check_app_tag: false,
        check_ref_tag: false,
        ref_tag: None,
        app_tag: 0x1234,
        app_tag_mask: 0,
    });
    let pract = wprot.is_some();
    let (dbytes, mbytes) = f.per_block(pract);
    let host = if dbytes > lba {
        interleave(&data, &md, lba, ms)
    } else {
        data.clone()
    };
    assert_eq!(host.len(), n * dbytes);
    let wm = layout(c, rng, host.len(), prp_only, dword);
    put(&wm, &host);
    let mut io = io_of(wm);
    if let Some(p) = wprot {
        io = io.protection(p);
    }
    if mbytes > 0 {
        io = io.metadata(buffer_with(c, &md));
    }
    let w = match qp.submit_io(
        IoCommand::Write {
            ns: &ns,
            slba,
            blocks,
        },
        io,
        7,
    ) {
        Ok(()) => common::wait_one(qp),
        Err(r) => panic!("{ctx}: write of {blocks} at {slba} refused: {}", r.reason),
    };
    assert!(w.is_ok(), "{ctx}: write {blocks}@{slba}: {:?}", w.result);
    assert_eq!(
        m.namespace_data(1, slba, u64::from(blocks)),
        data,
        "{ctx}: write {blocks}@{slba} stored other data"
    );
    if f.pi == 0 && ms > 0 {
        assert_eq!(
            m.namespace_metadata(1, slba, u64::from(blocks)),
            md,
            "{ctx}: write {blocks}@{slba} stored other metadata"
        );
    }
    let stored_md = m.namespace_metadata(1, slba, u64::from(blocks));

    // Read back: PI formats check the guard (and for Types 1 and 2 the
    // reference tag from each piece's SLBA) without PRACT, so metadata moves.
    let rprot = (f.pi != 0).then_some(Protection {
        pract: false,
        check_guard: true,
        check_app_tag: true,
        check_ref_tag: f.pi != 3,
        ref_tag: None,
        app_tag: 0x1234,
        app_tag_mask: 0xffff,
    });
    let (dbytes, mbytes) = f.per_block(false);
    let need = n * dbytes;
    let rm = layout(c, rng, need, prp_only, dword);
    let slice_off = match &rm {
        Mem::Slice { off, .. } => Some(*off),
        Mem::Vector(_) => None,
    };
    let mut io = io_of(rm);
    if let Some(p) = rprot {
        io = io.protection(p);
    }
    let md_tail = rng.below(64) as usize;
    if mbytes > 0 {
        let b = c.alloc_dma(n * mbytes + md_tail).unwrap();
        b.fill(0, b.len(), SENTINEL).unwrap();
        io = io.metadata(b);
    }
    let r = run_io(
        qp,
        IoCommand::Read {
            ns: &ns,
            slba,
            blocks,
        },
        io,
    );
    assert!(r.is_ok(), "{ctx}: read {blocks}@{slba}: {:?}", r.result);
    let (got, bad) = match slice_off {
        Some(off) => take_slice(r.buffer.as_ref().unwrap(), off, need),
        None => take(&r, need),
    };
    assert!(
        bad.is_empty(),
        "{ctx}: read {blocks}@{slba} touched {bad:?}"
    );
    let want = if dbytes > lba {
        interleave(&data, &stored_md, lba, ms)
    } else {
        data.clone()
    };
    assert!(
        got == want,
        "{ctx}: read {blocks}@{slba} returned other bytes"
    );
    if mbytes > 0 {
        let (gotm, bad) = take_slice(r.metadata.as_ref().unwrap(), 0, n * mbytes);
        assert!(bad.is_empty(), "{ctx}: metadata read touched {bad:?}");
        assert!(
            gotm == stored_md,
            "{ctx}: metadata read returned other bytes"
        );
    }
}

/// Every combination of LBA size, metadata layout, PI type and guard,
/// MDTS (split or not), SGL support and mode, slices and vectors: each
/// transfer is byte exact and touches nothing outside its bytes.
#[test]
fn every_layout_and_encoding_moves_exactly_the_described_bytes() {
    let fmts = [
        Fmt {
            lba: 512,
            ms: 0,
            ext: false,
            pi: 0,
            pif: 0,
        },
        Fmt {
            lba: 4096,
            ms: 0,
            ext: false,
            pi: 0,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 8,
            ext: true,
            pi: 0,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 16,
            ext: false,
            pi: 0,
            pif: 0,
        },
        Fmt {
            lba: 4096,
            ms: 64,
            ext: true,
            pi: 0,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 8,
            ext: true,
            pi: 1,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 8,
            ext: false,
            pi: 2,
            pif: 0,
        },
        Fmt {
            lba: 4096,
            ms: 16,
            ext: true,
            pi: 3,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 64,
            ext: false,
            pi: 1,
            pif: 0,
        },
        Fmt {
            lba: 512,
            ms: 16,
            ext: true,
            pi: 2,
            pif: 2,
        },
        Fmt {
            lba: 4096,
            ms: 64,
            ext: false,
            pi: 1,
            pif: 2,
        },
    ];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let (mut prp, mut sgl, mut fetched, mut issued) = (0u64, 0u64, 0u64, 0u64);
    for f in fmts {
        for mdts in [1u8, 2, 0] {
            for sgls in [0u32, 1, 2] {
                for &mode in modes(sgls) {
                    let (m, c) = setup(cfg(f, mdts, sgls));
                    let mut qp = c
                        .io_queue_pair(QueuePairOptions {
                            sgl: mode,
                            ..Default::default()
                        })
                        .unwrap();
                    let prp_only = sgls == 0 || mode == SglMode::Never;
                    let dword = sgls == 2;
                    let ctx = format!("{f:?} mdts {mdts} sgls {sgls} {mode:?}");
                    let (p0, s0) = m.transfers_by_encoding();
                    let f0 = m.commands_fetched();
                    for _ in 0..6 {
                        round_trip(&m, &c, &mut qp, &mut rng, f, prp_only, dword, &ctx);
                    }
                    let (p1, s1) = m.transfers_by_encoding();
                    prp += p1 - p0;
                    sgl += s1 - s0;
                    fetched += m.commands_fetched() - f0;
                    issued += 12;
                    drop(qp);
                    drop(c);
                    assert_clean(&m);
                }
            }
        }
    }
    eprintln!(
        "PRP transfers {prp}, SGL transfers {sgl}, commands {fetched} for {issued} submitted"
    );
    // Both encodings and many splits were exercised.
    assert!(prp > 500 && sgl > 500 && fetched > issued + 500);
}

/// The reference tags a PRACT write leaves on the medium, per block.
fn stored_ref_tags(m: &ModelController, slba: u64, blocks: u64) -> Vec<u64> {
    m.namespace_metadata(1, slba, blocks)
        .chunks(8)
        .map(|t| u64::from(u32::from_be_bytes(t[4..8].try_into().unwrap())))
        .collect()
}

/// Type 3: the reference tag is not incremented per block (the controller
/// writes the command's tag into every block), and `ref_tag: None` means
/// "the lower bits of SLBA". A write split into pieces must store what the
/// same write in one command stores: the caller's SLBA in every block, not
/// each piece's own SLBA.
#[test]
fn a_split_type_3_pract_write_stores_the_same_tags_as_one_command() {
    // 512 + 8 extended, Type 3, MDTS 8 KiB: PRACT moves data only, 16
    // blocks per piece.
    let f = Fmt {
        lba: 512,
        ms: 8,
        ext: true,
        pi: 3,
        pif: 0,
    };
    let (m, c) = setup(cfg(f, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let pract = Protection {
        pract: true,
        check_guard: true,
        check_app_tag: false,
        check_ref_tag: false,
        ref_tag: None,
        app_tag: 0,
        app_tag_mask: 0,
    };
    // Unsplit: 16 blocks at LBA 100, every block gets tag 100.
    let w = run_io(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 100,
            blocks: 16,
        },
        IoData::buffer(buffer_with(&c, &pattern(1, 16 * 512))).protection(pract),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    assert_eq!(stored_ref_tags(&m, 100, 16), vec![100; 16]);
    // The same call for 40 blocks at LBA 200 (three pieces).
    let w = run_io(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 200,
            blocks: 40,
        },
        IoData::buffer(buffer_with(&c, &pattern(2, 40 * 512))).protection(pract),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    assert_eq!(
        stored_ref_tags(&m, 200, 40),
        vec![200; 40],
        "the tags depend on MDTS: each piece wrote its own SLBA"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Type 2 with an explicit initial tag just below the 32-bit wrap, split:
/// each piece's CDW14 is the tag plus its block offset, modulo 2^32, and a
/// checked read of the whole succeeds.
#[test]
fn type_2_tags_wrap_across_split_pieces() {
    let f = Fmt {
        lba: 512,
        ms: 8,
        ext: true,
        pi: 2,
        pif: 0,
    };
    let (m, c) = setup(cfg(f, 1, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let tag = u64::from(u32::MAX) - 20;
    let p = Protection {
        ref_tag: Some(tag),
        ..Protection::PRACT
    };
    let before = m.commands_fetched();
    let w = run_io(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 5,
            blocks: 40,
        },
        IoData::buffer(buffer_with(&c, &pattern(3, 40 * 512))).protection(p),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let n = (m.commands_fetched() - before) as usize;
    let recent = m.recent_commands();
    let cdw14: Vec<u32> = recent[recent.len() - n..]
        .iter()
        .filter(|(q, _)| *q == qp.qid())
        .map(|(_, s)| u32::from_le_bytes(s[56..60].try_into().unwrap()))
        .collect();
    assert_eq!(
        cdw14,
        vec![
            tag as u32,
            (tag + 16) as u32,
            ((tag + 32) & 0xffff_ffff) as u32
        ]
    );
    let tags = stored_ref_tags(&m, 5, 40);
    for (i, t) in tags.iter().enumerate() {
        assert_eq!(*t, (tag + i as u64) & 0xffff_ffff, "block {i}");
    }
    let r = run_io(
        &mut qp,
        IoCommand::Read {
            ns: &ns,
            slba: 5,
            blocks: 40,
        },
        IoData::buffer(c.alloc_dma(40 * 520).unwrap()).protection(Protection { pract: false, ..p }),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A vector whose segments are `lens` long, each at `pre` bytes into a
/// buffer of its own (page-aligned start plus `pre`), guard bytes around.
fn guarded_vector(
    c: &Controller<ModelController>,
    lens: &[usize],
    pre: &[usize],
) -> Vec<(DmaBuffer, usize, usize)> {
    lens.iter()
        .zip(pre)
        .map(|(&len, &pre)| {
            let b = c.alloc_dma(len + pre + 2 * 4096).unwrap();
            b.fill(0, b.len(), SENTINEL).unwrap();
            let shift = ((4096 - (b.iova() as usize & 4095)) & 4095) + pre;
            (b, shift, len)
        })
        .collect()
}

/// Chained list pages for vectors: a 4 MiB PRP vector (1024 entries over
/// three chained list pages) and a 4 MiB SGL vector of 600 pieces (three
/// chained SGL segments), written and read back byte exact with nothing
/// outside the pieces touched.
#[test]
fn chained_prp_and_sgl_lists_of_vectors_are_exact() {
    // PRP: 4 KiB LBAs, no MDTS (the 4 MiB cap), no SGLs.
    let f = Fmt {
        lba: 4096,
        ms: 0,
        ext: false,
        pi: 0,
        pif: 0,
    };
    let (m, c) = setup(cfg(f, 0, 0));
    let qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!(qp.max_transfer(), 4 << 20);
    drop(qp);
    let total = 4usize << 20;
    // First piece 8 bytes into a page, then whole pages, 3 pages per piece.
    let mut lens = vec![4096 - 8];
    let mut at = lens[0];
    while at < total {
        let l = (3 * 4096).min(total - at);
        lens.push(l);
        at += l;
    }
    let mut pre = vec![0; lens.len()];
    pre[0] = 8;
    let data = pattern(77, total);
    vector_round_trip(&m, &c, &lens, &pre, 1024, &data, "PRP", (2, 0));
    drop(c);
    assert_clean(&m);

    // SGL: 512-byte LBAs, 600 odd-length pieces.
    let f = Fmt {
        lba: 512,
        ms: 0,
        ext: false,
        pi: 0,
        pif: 0,
    };
    let mut cf = cfg(f, 0, 1);
    cf.namespaces[0].blocks = 8192;
    let (m, c) = setup(cf);
    let n = 600;
    let mut lens = vec![total / n; n];
    lens[n - 1] += total - (total / n) * n;
    let pre: Vec<usize> = (0..n).map(|i| (i * 37) % 4000 + 1).collect();
    vector_round_trip(&m, &c, &lens, &pre, 8192, &data, "SGL", (0, 2));
    drop(c);
    assert_clean(&m);
}

/// Writes `data` from a guarded vector of `lens` (each piece `pre` bytes
/// into its buffer) to LBA 0 of namespace 1 and reads it back into another:
/// byte exact, nothing outside the pieces touched, and the two transfers
/// went as `encodings` (PRP, SGL) counts. Drops the queue pair it makes.
#[allow(clippy::too_many_arguments)]
fn vector_round_trip(
    m: &ModelController,
    c: &upnvme::Controller<ModelController>,
    lens: &[usize],
    pre: &[usize],
    blocks: u32,
    data: &[u8],
    what: &str,
    encodings: (u64, u64),
) {
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let wm = Mem::Vector(guarded_vector(c, lens, pre));
    put(&wm, data);
    let before = m.transfers_by_encoding();
    let r = run_io(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks,
        },
        io_of(wm),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert!(
        m.namespace_data(1, 0, u64::from(blocks)) == data,
        "{what} vector write"
    );
    let rd = guarded_vector(c, lens, pre);
    let r = run_io(
        &mut qp,
        IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks,
        },
        io_of(Mem::Vector(rd)),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    let (got, bad) = take(&r, data.len());
    assert!(bad.is_empty(), "{bad:?}");
    assert!(got == data, "{what} vector read");
    let after = m.transfers_by_encoding();
    assert_eq!((after.0 - before.0, after.1 - before.1), encodings);
}

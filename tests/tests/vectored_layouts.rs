//! The data-pointer description of vectored and sliced I/O
//! (iodata.rs, plain.rs, submit.rs, split.rs, queues' prp.rs / sgl.rs, the
//! per-tracker list pages): the controller is told exactly the bytes the
//! caller described — nothing outside them, nothing fewer, in order — or the
//! submission is refused with the typed reason an independent oracle of the
//! rules predicts, with every buffer handed back and nothing sent.

mod common;

use common::{Rng, assert_clean, fetched_since, pattern, read_back, setup, wait_one};
use upnvme::{Controller, DmaBuffer, IoCommand, IoData, IoVec, QueuePairOptions, Reject, SglMode};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

const SENT: u8 = 0xee;
const PAGE: usize = 4096;
const LBA: usize = 512;
const NS_BLOCKS: u64 = 16384;

fn cfg(sgls: u32, mdts: u8) -> ModelConfig {
    ModelConfig {
        mdts,
        sgls,
        oncs: ModelConfig::ONCS_COMPARE,
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: LBA as u32,
            blocks: NS_BLOCKS,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

fn pair(c: &Controller<ModelController>, mode: SglMode) -> upnvme::IoQueuePair<ModelController> {
    c.io_queue_pair(QueuePairOptions {
        sgl: mode,
        ..Default::default()
    })
    .unwrap()
}

fn modes(sgls: u32) -> &'static [SglMode] {
    if sgls == 0 {
        &[SglMode::Auto, SglMode::Never]
    } else {
        &[SglMode::Auto, SglMode::Never, SglMode::Always]
    }
}

// ---------------------------------------------------------------------------
// The oracle: which encoding one command's pieces get, or why they are
// refused — written from the rules in docs/DESIGN.md ("Data pointers: PRP
// and SGL") and NVMe 2.0 §4.3, not from the driver's code.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enc {
    Prp,
    Sgl,
}

#[derive(Clone, Copy, Debug)]
struct Env {
    sgls: u32,
    mode: SglMode,
    /// Data Blocks one slot's list pages hold.
    sgl_cap: usize,
}

impl Env {
    fn sgl_tried(&self) -> bool {
        self.sgls & 3 != 0 && self.mode != SglMode::Never
    }
    fn dword(&self) -> bool {
        self.sgls & 3 == 2
    }
}

/// A contiguous transfer of `bytes` at `iova`.
fn expect_contiguous(e: Env, iova: u64, bytes: usize) -> Result<Enc, Reject> {
    let in_page = iova as usize & (PAGE - 1);
    if e.mode != SglMode::Always && iova & 3 == 0 && in_page + bytes <= 2 * PAGE {
        return Ok(Enc::Prp);
    }
    if e.sgl_tried() {
        if !e.dword() || (iova | bytes as u64) & 3 == 0 {
            return Ok(Enc::Sgl);
        }
        if e.mode == SglMode::Always {
            return Err(Reject::NotDescribable);
        }
    }
    if iova & 3 == 0 {
        Ok(Enc::Prp)
    } else {
        Err(Reject::Misaligned)
    }
}

/// A vector's pieces (IOVA, length) for one command.
fn expect_vector(e: Env, pieces: &[(u64, usize)]) -> Result<Enc, Reject> {
    let n = pieces.len();
    let prp_ok = e.mode != SglMode::Always
        && pieces.iter().enumerate().all(|(i, &(a, l))| {
            let start = if i == 0 {
                a & 3 == 0
            } else {
                (a as usize).is_multiple_of(PAGE)
            };
            let end = i + 1 == n || (a as usize + l).is_multiple_of(PAGE);
            start && end
        });
    if e.sgl_tried() {
        let sgl = if n > 1 && n > e.sgl_cap {
            Err(Reject::TooManySegments { segments: n as u32 })
        } else if e.dword() && pieces.iter().any(|&(a, l)| (a | l as u64) & 3 != 0) {
            Err(Reject::NotDescribable)
        } else {
            Ok(Enc::Sgl)
        };
        match sgl {
            Ok(x) => return Ok(x),
            Err(_) if prp_ok => {}
            Err(r) => return Err(r),
        }
    }
    if prp_ok {
        Ok(Enc::Prp)
    } else {
        Err(Reject::NotDescribable)
    }
}

/// Where a command's bytes are.
enum Layout {
    Slice {
        buf: DmaBuffer,
        off: usize,
        limit: usize,
    },
    Vector(IoVec),
}

impl Layout {
    /// The (IOVA, length) pieces of bytes `[from, from + n)`.
    fn pieces(&self, from: usize, n: usize) -> Vec<(u64, usize)> {
        match self {
            Layout::Slice { buf, off, .. } => vec![(buf.iova() + (*off + from) as u64, n)],
            Layout::Vector(v) => {
                let mut out = Vec::new();
                let mut at = 0usize;
                for s in v.segments() {
                    let (a, b) = (at, at + s.len());
                    at = b;
                    let lo = a.max(from);
                    let hi = b.min(from + n);
                    if lo < hi {
                        out.push((s.buffer().iova() + (s.offset() + lo - a) as u64, hi - lo));
                    }
                }
                out
            }
        }
    }

    /// (buffer, first described byte, described bytes) of each buffer, for
    /// the first `need` bytes.
    fn regions(&self, need: usize) -> Vec<(&DmaBuffer, usize, usize)> {
        match self {
            Layout::Slice { buf, off, .. } => vec![(buf, *off, need)],
            Layout::Vector(v) => {
                let mut at = 0usize;
                v.segments()
                    .iter()
                    .map(|s| {
                        let used = s.len().min(need - at.min(need));
                        at += s.len();
                        (s.buffer(), s.offset(), used)
                    })
                    .collect()
            }
        }
    }

    fn put(&self, data: &[u8]) {
        let mut at = 0;
        for (b, off, used) in self.regions(data.len()) {
            b.write_bytes(off, &data[at..at + used]).unwrap();
            at += used;
        }
    }

    /// Sets every byte of every buffer to the sentinel.
    fn wipe(&self) {
        for (b, ..) in self.regions(0) {
            b.fill(0, b.len(), SENT).unwrap();
        }
    }

    /// The first `need` described bytes, and the bytes outside them that are
    /// not the sentinel.
    fn take(&self, need: usize) -> (Vec<u8>, Vec<String>) {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for (i, (b, off, used)) in self.regions(need).into_iter().enumerate() {
            let all = read_back(b, b.len());
            out.extend_from_slice(&all[off..off + used]);
            if let Some(j) = all
                .iter()
                .enumerate()
                .position(|(j, &x)| (j < off || j >= off + used) && x != SENT)
            {
                bad.push(format!(
                    "buffer {i} byte {j} (described {off}..{})",
                    off + used
                ));
            }
        }
        (out, bad)
    }

    fn io(self) -> IoData {
        match self {
            Layout::Slice { buf, off, limit } => IoData::slice(buf, off, limit),
            Layout::Vector(v) => IoData::vectored(v),
        }
    }

    fn describe(&self) -> String {
        match self {
            Layout::Slice { buf, off, limit } => {
                format!("slice iova {:#x} + {off} limit {limit}", buf.iova())
            }
            Layout::Vector(v) => {
                let s: Vec<String> = v
                    .segments()
                    .iter()
                    .map(|s| format!("{:#x}+{}", s.buffer().iova() + s.offset() as u64, s.len()))
                    .collect();
                format!("vector [{}]", s.join(", "))
            }
        }
    }
}

/// Rebuilds the layout from what a completion or a refusal handed back.
fn back(
    buffer: Option<DmaBuffer>,
    segments: Option<IoVec>,
    was: (usize, usize),
    ctx: &str,
) -> Layout {
    match (buffer, segments) {
        (Some(buf), None) => Layout::Slice {
            buf,
            off: was.0,
            limit: was.1,
        },
        (None, Some(v)) => Layout::Vector(v),
        (b, s) => panic!(
            "{ctx}: memory not handed back as it went in (buffer {}, vector {})",
            b.is_some(),
            s.is_some()
        ),
    }
}

/// A fresh buffer of `len` bytes at `pre` bytes into a page (sentinel
/// everywhere); returns it and the offset where the `len` bytes start.
/// Sometimes a piece of a split buffer, whose IOVA need not be on a page.
fn fresh(
    c: &Controller<ModelController>,
    rng: &mut Rng,
    pre: usize,
    len: usize,
    spare: &mut Vec<DmaBuffer>,
) -> (DmaBuffer, usize) {
    let post = rng.pick(&[0usize, 1, 3, 4, 100]);
    if rng.below(3) == 0 {
        // The middle piece of a buffer split in three: it starts `pre` bytes
        // into a page; its neighbours stay alive as guards.
        let s = pre % PAGE + PAGE * (len + post).div_ceil(PAGE);
        let parent = c.alloc_dma(3 * s).unwrap();
        parent.fill(0, parent.len(), SENT).unwrap();
        let mut pieces = parent.split(s).unwrap().into_iter();
        spare.push(pieces.next().unwrap());
        let b = pieces.next().unwrap();
        spare.extend(pieces);
        assert_eq!(b.iova() as usize % PAGE, pre % PAGE);
        return (b, 0);
    }
    let b = c.alloc_dma(pre + len + post).unwrap();
    b.fill(0, b.len(), SENT).unwrap();
    (b, pre)
}

const PRES: &[usize] = &[0, 1, 2, 3, 4, 8, 508, 4092, 4093, 4095, 4096, 4100];

/// A random layout of at least `LBA` bytes (sometimes following PRP's
/// rules, sometimes any), and the blocks to transfer through it.
fn random_layout(
    c: &Controller<ModelController>,
    rng: &mut Rng,
    spare: &mut Vec<DmaBuffer>,
    bb: usize,
) -> (Layout, u32) {
    if rng.below(3) == 0 {
        let blocks = 1 + rng.below(40) as u32;
        let bytes = blocks as usize * bb;
        let pre = if rng.below(2) == 0 {
            rng.pick(PRES)
        } else {
            rng.below(9000) as usize
        };
        let slack = rng.pick(&[0usize, 0, 1, 4, 700]);
        let (buf, off) = fresh(c, rng, pre, bytes + slack, spare);
        let limit = bytes + rng.below(slack as u64 + 1) as usize;
        return (Layout::Slice { buf, off, limit }, blocks);
    }
    let prp_style = rng.below(3) == 0;
    let nseg = 1 + rng.below(6) as usize;
    let mut v = IoVec::with_capacity(nseg + 1);
    let mut total = 0usize;
    for i in 0..nseg {
        let (pre, len) = if prp_style {
            if i == 0 {
                let r4 = 4 * rng.below(1024) as usize;
                let pre = rng.pick(&[0usize, 4, 8, 4092, 2048, r4]);
                let to_page = PAGE - pre % PAGE;
                (pre, to_page + PAGE * rng.below(3) as usize)
            } else if i + 1 == nseg {
                (0, 1 + rng.below(3 * PAGE as u64) as usize)
            } else {
                (0, PAGE * (1 + rng.below(3) as usize))
            }
        } else {
            let pre = rng.pick(PRES);
            let to_page = PAGE - pre % PAGE;
            let r = 1 + rng.below(10_000) as usize;
            let len = rng.pick(&[
                1usize,
                2,
                3,
                4,
                5,
                8,
                511,
                512,
                513,
                4092,
                4095,
                4096,
                4097,
                to_page,
                to_page + 1,
                to_page - 1,
                to_page + PAGE,
                r,
            ]);
            (pre, len.max(1))
        };
        let (b, off) = fresh(c, rng, pre, len, spare);
        v.push(b, off, len).unwrap();
        total += len;
    }
    if total < bb {
        let len = bb - total + rng.below(50) as usize;
        let pre = rng.pick(PRES);
        let (b, off) = fresh(c, rng, pre, len, spare);
        v.push(b, off, len).unwrap();
        total += len;
    }
    let mut blocks = (total / bb) as u32;
    if blocks > 1 && rng.below(3) == 0 {
        blocks -= rng.below(u64::from(blocks - 1)) as u32;
    }
    (Layout::Vector(v), blocks)
}

/// The expected outcome of a transfer of `blocks` through `l` on a pair
/// whose commands carry `per` blocks at most: each command's encoding, or
/// the first command's refusal.
fn expect(e: Env, l: &Layout, blocks: u32, per: u32, bb: usize) -> Result<Vec<Enc>, Reject> {
    let mut encs = Vec::new();
    let mut b = 0u32;
    while b < blocks {
        let n = per.min(blocks - b);
        let p = l.pieces(b as usize * bb, n as usize * bb);
        let r = match l {
            Layout::Slice { .. } => expect_contiguous(e, p[0].0, p[0].1),
            Layout::Vector(_) => expect_vector(e, &p),
        };
        encs.push(r?);
        b += n;
    }
    Ok(encs)
}

fn counts(encs: &[Enc]) -> (u64, u64) {
    let p = encs.iter().filter(|&&x| x == Enc::Prp).count() as u64;
    (p, encs.len() as u64 - p)
}

fn delta(m: &ModelController, base: (u64, u64)) -> (u64, u64) {
    let (p, s) = m.transfers_by_encoding();
    (p - base.0, s - base.1)
}

/// Random vectors and slices — segments of 1..3 bytes, not dword aligned,
/// ending on / one byte past / one byte before a page, pieces of split
/// buffers — written and read back on every SGL support level and mode, at
/// MDTS 4 MiB and at 8 KiB (split): every command the oracle accepts is
/// byte exact, in the predicted encoding, touching no byte of any buffer
/// outside the described ones (nor a split buffer's neighbouring pieces)
/// and no block outside the range; every command it refuses is refused
/// with its reason, all memory back, nothing sent.
#[test]
fn random_layouts_are_described_exactly_or_refused_as_the_rules_say() {
    random_layouts(0, 0x5eed_0bad_cafe_f00d, 0);
}

/// The same at MDTS 8 KiB: most transfers split, children cut inside
/// segments, each child judged by the rules on its own.
#[test]
fn random_layouts_split_above_mdts_are_described_exactly_or_refused_as_the_rules_say() {
    random_layouts(1, 0x0dd_ba11_5eed_1234, 0);
}

/// The same on an extended-LBA format (8 metadata bytes after each
/// 512-byte block: 520 bytes a block on the wire), split (children of 15
/// blocks, 7800 bytes, cut off every page) and not: data and metadata
/// land apart on the medium, exact.
#[test]
fn random_layouts_on_an_extended_lba_format_are_described_exactly_or_refused_as_the_rules_say() {
    random_layouts(1, 0xe47e_0dd5_eed0_0001, 8);
    random_layouts(0, 0xe47e_0dd5_eed0_0002, 8);
}

/// `ms` metadata bytes per block, interleaved (extended LBA) when not 0.
fn random_layouts(mdts: u8, seed: u64, ms: usize) {
    let bb = LBA + ms;
    let cases = if ms == 0 { 40 } else { 10 };
    let mut rng = Rng(seed);
    let (mut ok, mut refused) = (0u32, 0u32);
    let mut reasons = std::collections::BTreeMap::<String, u32>::new();
    {
        for sgls in [0u32, 1, 2] {
            for &mode in modes(sgls) {
                let mut config = cfg(sgls, mdts);
                config.namespaces[0].ms = ms as u16;
                config.namespaces[0].extended = ms > 0;
                let (m, c) = setup(config);
                let ns = c.namespace(1).unwrap().clone();
                let mut qp = pair(&c, mode);
                let per = (qp.max_transfer() / bb) as u32;
                let sgl_cap = if mdts == 0 { 766 } else { 256 };
                let e = Env {
                    sgls,
                    mode,
                    sgl_cap,
                };
                let mut media = pattern(
                    u64::from(sgls) << 8 | u64::from(mdts),
                    NS_BLOCKS as usize * LBA,
                );
                m.write_namespace_data(1, 0, &media);
                for case in 0..cases {
                    let mut spare = Vec::new();
                    let (l, blocks) = random_layout(&c, &mut rng, &mut spare, bb);
                    let need = blocks as usize * bb;
                    let slba = 1 + rng.below(NS_BLOCKS - 2 - u64::from(blocks));
                    let ctx = format!(
                        "ms {ms} mdts {mdts} sgls {sgls} {mode:?} case {case}: {blocks} blocks via {}",
                        l.describe()
                    );
                    let want = expect(e, &l, blocks, per, bb);
                    let was = match &l {
                        Layout::Slice { off, limit, .. } => (*off, *limit),
                        Layout::Vector(_) => (0, 0),
                    };
                    let data = pattern(rng.next(), need);
                    l.put(&data);
                    let mut written = None;
                    let fetched = m.commands_fetched();
                    let base = m.transfers_by_encoding();
                    let w = IoCommand::Write {
                        ns: &ns,
                        slba,
                        blocks,
                    };
                    let l = match (qp.submit_io(w, l.io(), 1), &want) {
                        (Ok(()), Ok(encs)) => {
                            let done = wait_one(&mut qp);
                            assert!(done.is_ok(), "{ctx}: write {:?}", done.result);
                            assert_eq!(delta(&m, base), counts(encs), "{ctx}: write encodings");
                            let l = back(done.buffer, done.segments, was, &ctx);
                            // The wire bytes, block by block: data, then
                            // the interleaved metadata.
                            let n = blocks as usize;
                            let (mut d, mut md) = (Vec::new(), Vec::new());
                            for blk in data.chunks(bb) {
                                d.extend_from_slice(&blk[..LBA]);
                                md.extend_from_slice(&blk[LBA..]);
                            }
                            let at = slba as usize * LBA;
                            media[at..at + n * LBA].copy_from_slice(&d);
                            let around = m.namespace_data(1, slba - 1, u64::from(blocks) + 2);
                            assert!(
                                around == media[at - LBA..at + (n + 1) * LBA],
                                "{ctx}: the medium holds other bytes after the write"
                            );
                            if ms > 0 {
                                assert!(
                                    m.namespace_metadata(1, slba, u64::from(blocks)) == md,
                                    "{ctx}: the medium holds other metadata after the write"
                                );
                            }
                            written = Some(data.clone());
                            let (got, bad) = l.take(need);
                            assert!(bad.is_empty(), "{ctx}: a write changed host memory {bad:?}");
                            assert!(got == data, "{ctx}: host data changed by a write");
                            ok += 1;
                            l
                        }
                        (Err(r), Err(reason)) => {
                            assert_eq!(
                                r.reason, *reason,
                                "{ctx}: write refused for another reason"
                            );
                            assert_eq!(m.commands_fetched(), fetched, "{ctx}: a refusal sent");
                            assert_eq!(qp.in_flight(), 0, "{ctx}");
                            *reasons.entry(format!("{reason:?}")).or_default() += 1;
                            refused += 1;
                            let l = back(r.buffer, r.segments, was, &ctx);
                            assert!(r.metadata.is_none());
                            l
                        }
                        (Ok(()), Err(reason)) => {
                            let done = wait_one(&mut qp);
                            panic!(
                                "{ctx}: write accepted ({:?}, encodings {:?}), the rules refuse it: {reason:?}",
                                done.result,
                                delta(&m, base)
                            );
                        }
                        (Err(r), Ok(encs)) => {
                            panic!(
                                "{ctx}: write refused ({:?}), the rules allow it as {encs:?}",
                                r.reason
                            )
                        }
                    };
                    // Read back through the same memory, every byte sentinel.
                    l.wipe();
                    let fetched = m.commands_fetched();
                    let base = m.transfers_by_encoding();
                    let r = IoCommand::Read {
                        ns: &ns,
                        slba,
                        blocks,
                    };
                    match (qp.submit_io(r, l.io(), 2), &want) {
                        (Ok(()), Ok(encs)) => {
                            let done = wait_one(&mut qp);
                            assert!(done.is_ok(), "{ctx}: read {:?}", done.result);
                            assert_eq!(delta(&m, base), counts(encs), "{ctx}: read encodings");
                            let l = back(done.buffer, done.segments, was, &ctx);
                            let (got, bad) = l.take(need);
                            assert!(bad.is_empty(), "{ctx}: a read touched {bad:?}");
                            assert!(
                                Some(&got) == written.as_ref(),
                                "{ctx}: a read returned other bytes"
                            );
                        }
                        (Err(r), Err(reason)) => {
                            assert_eq!(r.reason, *reason, "{ctx}: read refused for another reason");
                            assert_eq!(m.commands_fetched(), fetched, "{ctx}: a refusal sent");
                            let l = back(r.buffer, r.segments, was, &ctx);
                            let (_, bad) = l.take(0);
                            assert!(bad.is_empty(), "{ctx}: a refused read touched {bad:?}");
                        }
                        (Ok(()), Err(reason)) => {
                            let done = wait_one(&mut qp);
                            panic!(
                                "{ctx}: read accepted ({:?}), the rules refuse it: {reason:?}",
                                done.result
                            );
                        }
                        (Err(r), Ok(encs)) => {
                            panic!(
                                "{ctx}: read refused ({:?}), the rules allow it as {encs:?}",
                                r.reason
                            )
                        }
                    }
                    for s in &spare {
                        assert!(
                            read_back(s, s.len()).iter().all(|&x| x == SENT),
                            "{ctx}: a neighbouring piece of a split buffer was touched"
                        );
                    }
                }
                drop(qp);
                drop(c);
                assert_clean(&m);
            }
        }
    }
    eprintln!("{ok} accepted, {refused} refused: {reasons:?}");
    assert!(
        ok > 2 * cases && refused > cases / 2,
        "{ok} accepted, {refused} refused"
    );
}

// ---------------------------------------------------------------------------
// Targeted cases.
// ---------------------------------------------------------------------------

/// Submits `cmd` with `io`; the completion (panics when refused, when it
/// failed, or when a second completion follows it).
fn run(
    qp: &mut upnvme::IoQueuePair<ModelController>,
    cmd: IoCommand<'_>,
    io: IoData,
    ctx: &str,
) -> upnvme::Completion {
    if let Err(r) = qp.submit_io(cmd, io, 9) {
        panic!("{ctx}: refused {:?}", r.reason);
    }
    let done = wait_one(qp);
    assert_eq!(done.tag, 9, "{ctx}");
    assert!(done.is_ok(), "{ctx}: {:?}", done.result);
    assert!(
        qp.next_completion().unwrap().is_none(),
        "{ctx}: a second completion"
    );
    done
}

/// A vector of `n` pieces of `len` bytes, each `pre` bytes into its own
/// piece of one split buffer (pieces of `stride` bytes; sentinel around).
fn strided(
    c: &Controller<ModelController>,
    n: usize,
    stride: usize,
    pre: usize,
    len: usize,
) -> IoVec {
    let big = c.alloc_dma(n * stride).unwrap();
    big.fill(0, big.len(), SENT).unwrap();
    let mut v = IoVec::with_capacity(n);
    // (`alloc_dma` rounds up to whole pages: take `n` pieces only.)
    for p in big.split(stride).unwrap().into_iter().take(n) {
        v.push(p, pre, len).unwrap();
    }
    v
}

/// Writes `data` through `v` at `slba` and reads it back through `r`:
/// byte exact, guards untouched, one command each, in `enc`.
#[allow(clippy::too_many_arguments)]
fn round_trip_vec(
    m: &ModelController,
    qp: &mut upnvme::IoQueuePair<ModelController>,
    ns: &upnvme::Namespace,
    slba: u64,
    v: IoVec,
    r: IoVec,
    data: &[u8],
    enc: (u64, u64),
    ctx: &str,
) {
    let blocks = (data.len() / LBA) as u32;
    let l = Layout::Vector(v);
    l.put(data);
    let base = m.transfers_by_encoding();
    let f0 = m.commands_fetched();
    let w = run(qp, IoCommand::Write { ns, slba, blocks }, l.io(), ctx);
    assert!(
        m.namespace_data(1, slba, u64::from(blocks)) == data,
        "{ctx}: medium"
    );
    let l = Layout::Vector(w.segments.unwrap());
    let (got, bad) = l.take(data.len());
    assert!(
        bad.is_empty() && got == data,
        "{ctx}: write changed host memory {bad:?}"
    );
    let rl = Layout::Vector(r);
    let rd = run(qp, IoCommand::Read { ns, slba, blocks }, rl.io(), ctx);
    let rl = Layout::Vector(rd.segments.unwrap());
    let (got, bad) = rl.take(data.len());
    assert!(bad.is_empty(), "{ctx}: read touched {bad:?}");
    assert!(got == data, "{ctx}: read returned other bytes");
    assert_eq!(delta(m, base), (2 * enc.0, 2 * enc.1), "{ctx}: encodings");
    assert_eq!(m.commands_fetched() - f0, 2, "{ctx}: one command each");
}

/// SGL chains at the exact capacity of a slot's list area: one list page
/// (MDTS 512 KiB: 256 Data Blocks), two (MDTS 2 MiB: 2 × 255 + 1 = 511)
/// and three (no MDTS, the 4 MiB cap: 766): exactly that many pieces go
/// as chained segments, byte exact; one more is `TooManySegments` with
/// the vector back and nothing sent, and the pair still works.
#[test]
fn sgl_chains_fill_the_list_area_exactly_and_refuse_one_more() {
    for (mdts, cap) in [(7u8, 256usize), (9, 511), (0, 766)] {
        let (m, c) = setup(cfg(1, mdts));
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = pair(&c, SglMode::Auto);
        let ctx = format!("mdts {mdts} cap {cap}");
        // 512-byte pieces 4 bytes into 1 KiB strides: no PRP possible.
        let data = pattern(u64::from(mdts), cap * LBA);
        round_trip_vec(
            &m,
            &mut qp,
            &ns,
            3,
            strided(&c, cap, 1024, 4, LBA),
            strided(&c, cap, 1024, 8, LBA),
            &data,
            (0, 1),
            &ctx,
        );
        // One more piece: the same bytes over cap + 1 pieces.
        let mut v = strided(&c, cap - 1, 1024, 4, LBA);
        for b in strided(&c, 2, 1024, 4, LBA / 2).into_buffers() {
            v.push(b, 4, LBA / 2).unwrap();
        }
        assert_eq!((v.len(), v.total_len()), (cap + 1, cap * LBA));
        let f0 = m.commands_fetched();
        let r = qp
            .submit_io(
                IoCommand::Read {
                    ns: &ns,
                    slba: 3,
                    blocks: cap as u32,
                },
                IoData::vectored(v),
                1,
            )
            .unwrap_err();
        assert_eq!(
            r.reason,
            Reject::TooManySegments {
                segments: cap as u32 + 1
            },
            "{ctx}"
        );
        assert_eq!(r.segments.map(|v| v.len()), Some(cap + 1), "{ctx}");
        assert_eq!(m.commands_fetched(), f0, "{ctx}");
        assert_eq!(qp.in_flight(), 0, "{ctx}");
        // The pair goes on.
        let b = c.alloc_dma(LBA).unwrap();
        let done = run(
            &mut qp,
            IoCommand::Read {
                ns: &ns,
                slba: 3,
                blocks: 1,
            },
            IoData::buffer(b),
            &ctx,
        );
        assert_eq!(read_back(done.buffer.as_ref().unwrap(), LBA), data[..LBA]);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// Contiguous PRP transfers around the list page's edges (SglMode::Never,
/// no MDTS: 4 MiB, three list pages per slot): PRP2 unused (ends exactly
/// at the page), a data page (ends one dword past / at the second page),
/// lists of 2, 511, 512 (the one-page fast path's whole page) and 513
/// entries (the first chained list), 1023 and 1024 entries (4 MiB from a
/// page start and from 4 bytes before a page end). Each written and read
/// back byte exact through a slice with sentinels around, one PRP
/// transfer each.
#[test]
fn prp_lists_at_the_edges_of_a_list_page_are_exact() {
    let (m, c) = setup(cfg(0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Never);
    assert_eq!(qp.max_transfer(), 4 << 20);
    // (offset in the page, bytes): the entries after PRP1 are
    // ceil((offset + bytes) / 4096) - 1.
    let cases: &[(usize, usize)] = &[
        (3584, 512),               // ends at the page end: PRP2 0
        (3588, 512),               // one dword into the next page
        (0, 8192),                 // two pages exactly
        (4, 8192),                 // three pages: a list of 2
        (0, 512 * PAGE),           // 511 entries
        (0, 513 * PAGE),           // 512 entries: one full list page
        (8, 513 * PAGE - 512),     // 512 entries from an offset
        (0, 514 * PAGE),           // 513 entries: chained
        (4092, 513 * PAGE - 3584), // 513 entries from the page's last dword
        (0, 4 << 20),              // 1023 entries
        (4092, 4 << 20),           // 1024 entries
    ];
    for (i, &(off, bytes)) in cases.iter().enumerate() {
        let ctx = format!("offset {off}, {bytes} bytes");
        let blocks = (bytes / LBA) as u32;
        let data = pattern(i as u64 + 40, bytes);
        let buf = c.alloc_dma(off + bytes + PAGE).unwrap();
        buf.fill(0, buf.len(), SENT).unwrap();
        buf.write_bytes(off, &data).unwrap();
        let base = m.transfers_by_encoding();
        let w = run(
            &mut qp,
            IoCommand::Write {
                ns: &ns,
                slba: 5,
                blocks,
            },
            IoData::slice(buf, off, bytes),
            &ctx,
        );
        assert!(
            m.namespace_data(1, 5, u64::from(blocks)) == data,
            "{ctx}: medium"
        );
        let buf = w.buffer.unwrap();
        buf.fill(0, buf.len(), SENT).unwrap();
        let r = run(
            &mut qp,
            IoCommand::Read {
                ns: &ns,
                slba: 5,
                blocks,
            },
            IoData::slice(buf, off, bytes),
            &ctx,
        );
        let l = Layout::Slice {
            buf: r.buffer.unwrap(),
            off,
            limit: bytes,
        };
        let (got, bad) = l.take(bytes);
        assert!(bad.is_empty(), "{ctx}: read touched {bad:?}");
        assert!(got == data, "{ctx}: read returned other bytes");
        assert_eq!(delta(&m, base), (2, 0), "{ctx}");
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// PRP vectors whose entries land at the list page's edges, with pieces out
/// of address order (the entries must follow the vector, not the
/// addresses): 512 and 513 entries, first piece 4 bytes before a page end.
#[test]
fn prp_vectors_keep_vector_order_across_chained_list_pages() {
    let (m, c) = setup(cfg(0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Auto);
    for pages in [512usize, 513, 514] {
        let ctx = format!("{pages} pages after the first dword");
        // Buffers of 2 pages each, pushed in descending address order.
        let make = || {
            let first = c.alloc_dma(PAGE).unwrap();
            first.fill(0, PAGE, SENT).unwrap();
            let mut bufs: Vec<DmaBuffer> = (0..pages.div_ceil(2))
                .map(|_| {
                    let b = c.alloc_dma(2 * PAGE).unwrap();
                    b.fill(0, b.len(), SENT).unwrap();
                    b
                })
                .collect();
            bufs.reverse();
            let mut v = IoVec::new();
            v.push(first, PAGE - 4, 4).unwrap();
            let mut left = pages * PAGE - 4 + 4; // whole pages, then 4 bytes short
            for b in bufs {
                let n = (2 * PAGE).min(left);
                v.push(b, 0, n).unwrap();
                left -= n;
            }
            v
        };
        let v = make();
        let r = make();
        let total = v.total_len();
        let bytes = total / LBA * LBA;
        assert!(v.segments()[1].buffer().iova() > v.segments()[2].buffer().iova());
        let data = pattern(pages as u64, bytes);
        round_trip_vec(&m, &mut qp, &ns, 0, v, r, &data, (1, 0), &ctx);
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Builds a fresh layout.
type MakeLayout<'a> = Box<dyn Fn() -> Layout + 'a>;

/// A transfer of exactly MDTS goes as one command, MDTS + one block as
/// two (the second of one block) — for a whole buffer, a slice, a vector
/// whose segment boundary is exactly the children's boundary, and one
/// whose boundary is one block past it — in every SGL mode, reads and
/// writes, byte exact with nothing outside touched.
#[test]
fn exactly_mdts_is_one_command_and_mdts_plus_a_block_is_two() {
    for sgls in [0u32, 1] {
        for &mode in modes(sgls) {
            let (m, c) = setup(cfg(sgls, 1));
            let ns = c.namespace(1).unwrap().clone();
            let mut qp = pair(&c, mode);
            let per = (qp.max_transfer() / LBA) as u32;
            assert_eq!(per, 16);
            for blocks in [per, per + 1] {
                let bytes = blocks as usize * LBA;
                let layouts: Vec<(&str, MakeLayout)> = vec![
                    (
                        "slice",
                        Box::new(|| {
                            let buf = c.alloc_dma(bytes + 2 * PAGE).unwrap();
                            buf.fill(0, buf.len(), SENT).unwrap();
                            Layout::Slice {
                                buf,
                                off: 1024,
                                limit: bytes,
                            }
                        }),
                    ),
                    (
                        "vector cut at the child boundary",
                        Box::new(|| {
                            let mut v = IoVec::new();
                            for len in [per as usize * LBA, bytes - per as usize * LBA] {
                                if len == 0 {
                                    continue;
                                }
                                let b = c.alloc_dma(len + PAGE).unwrap();
                                b.fill(0, b.len(), SENT).unwrap();
                                v.push(b, 0, len).unwrap();
                            }
                            // An unused segment after the transfer.
                            let b = c.alloc_dma(PAGE).unwrap();
                            b.fill(0, b.len(), SENT).unwrap();
                            v.push(b, 0, PAGE).unwrap();
                            Layout::Vector(v)
                        }),
                    ),
                    (
                        "vector cut a page after the child boundary",
                        Box::new(|| {
                            let mut v = IoVec::new();
                            let first = (per as usize * LBA + PAGE).min(bytes);
                            for len in [first, bytes - first] {
                                if len == 0 {
                                    continue;
                                }
                                let b = c.alloc_dma(len + PAGE).unwrap();
                                b.fill(0, b.len(), SENT).unwrap();
                                v.push(b, 0, len).unwrap();
                            }
                            Layout::Vector(v)
                        }),
                    ),
                ];
                for (what, make) in &layouts {
                    let ctx = format!("sgls {sgls} {mode:?} {blocks} blocks, {what}");
                    let data = pattern(u64::from(blocks) * 7 + u64::from(sgls), bytes);
                    let l = make();
                    l.put(&data);
                    let f0 = m.commands_fetched();
                    let w = run(
                        &mut qp,
                        IoCommand::Write {
                            ns: &ns,
                            slba: 30,
                            blocks,
                        },
                        l.io(),
                        &ctx,
                    );
                    let want = if blocks == per {
                        vec![(30, per)]
                    } else {
                        vec![(30, per), (30 + u64::from(per), 1)]
                    };
                    assert_eq!(fetched_since(&m, qp.qid(), f0), want, "{ctx}");
                    assert!(m.namespace_data(1, 30, u64::from(blocks)) == data, "{ctx}");
                    let l = back(w.buffer, w.segments, (1024, bytes), &ctx);
                    l.wipe();
                    let f0 = m.commands_fetched();
                    let r = run(
                        &mut qp,
                        IoCommand::Read {
                            ns: &ns,
                            slba: 30,
                            blocks,
                        },
                        l.io(),
                        &ctx,
                    );
                    assert_eq!(fetched_since(&m, qp.qid(), f0), want, "{ctx}");
                    let l = back(r.buffer, r.segments, (1024, bytes), &ctx);
                    let (got, bad) = l.take(bytes);
                    assert!(bad.is_empty(), "{ctx}: read touched {bad:?}");
                    assert!(got == data, "{ctx}: read returned other bytes");
                }
            }
            drop(qp);
            drop(c);
            assert_clean(&m);
        }
    }
}

/// A split whose second child has more pieces than its slot's list page
/// holds (MDTS 8 KiB, one list page: 256 Data Blocks; child 2 spans 512
/// pieces of 16 bytes) is refused whole as `TooManySegments` after child
/// 1 took its slot: the slot is released, nothing is sent, the vector
/// comes back whole, and no completion ever appears for it. A child at
/// exactly 256 pieces (32 bytes each) goes, byte exact.
#[test]
fn a_split_child_beyond_its_list_page_refuses_the_whole_and_releases_everything() {
    let (m, c) = setup(cfg(1, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Auto);
    let first = || {
        let b = c.alloc_dma(8192).unwrap();
        b.fill(0, b.len(), SENT).unwrap();
        b
    };
    let mut v = IoVec::new();
    v.push(first(), 0, 8192).unwrap();
    for b in strided(&c, 512, 32, 4, 16).into_buffers() {
        v.push(b, 4, 16).unwrap();
    }
    let f0 = m.commands_fetched();
    let r = qp
        .submit_io(
            IoCommand::Write {
                ns: &ns,
                slba: 0,
                blocks: 32,
            },
            IoData::vectored(v),
            5,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::TooManySegments { segments: 512 });
    assert_eq!(r.segments.as_ref().map(IoVec::len), Some(513));
    assert!(r.buffer.is_none() && r.metadata.is_none());
    assert_eq!(m.commands_fetched(), f0);
    assert_eq!(qp.in_flight(), 0);
    assert!(qp.next_completion().unwrap().is_none());
    // Exactly 256 pieces in the second child.
    let mut v = IoVec::new();
    v.push(first(), 0, 8192).unwrap();
    for b in strided(&c, 256, 64, 4, 32).into_buffers() {
        v.push(b, 4, 32).unwrap();
    }
    let mut r = IoVec::new();
    r.push(first(), 0, 8192).unwrap();
    for b in strided(&c, 256, 64, 8, 32).into_buffers() {
        r.push(b, 8, 32).unwrap();
    }
    let data = pattern(99, 32 * LBA);
    let l = Layout::Vector(v);
    l.put(&data);
    let f0 = m.commands_fetched();
    let w = run(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks: 32,
        },
        l.io(),
        "256 pieces",
    );
    assert_eq!(fetched_since(&m, qp.qid(), f0), vec![(0, 16), (16, 16)]);
    assert!(m.namespace_data(1, 0, 32) == data);
    assert_eq!(w.segments.map(|v| v.len()), Some(257));
    let rl = Layout::Vector(r);
    rl.wipe();
    let rd = run(
        &mut qp,
        IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 32,
        },
        rl.io(),
        "256 pieces",
    );
    let (got, bad) = Layout::Vector(rd.segments.unwrap()).take(32 * LBA);
    assert!(bad.is_empty(), "{bad:?}");
    assert!(got == data);
    assert!(qp.next_completion().unwrap().is_none());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

fn md_cfg(sgls: u32, mdts: u8, ms: u16, extended: bool) -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: LBA as u32,
            blocks: 4096,
            ms,
            extended,
            ..NamespaceConfig::default()
        }],
        ..cfg(sgls, mdts)
    }
}

/// Metadata with vectors, separate (MPTR) and extended (interleaved in the
/// vector), in each SGL mode, whole and split (MDTS 8 KiB): data and
/// metadata byte exact on the medium and back in the host, nothing outside
/// the described bytes touched (the metadata buffer's tail included).
#[test]
fn vectors_with_separate_and_extended_metadata_are_exact() {
    for (ms, extended) in [(8u16, false), (16, true)] {
        for sgls in [0u32, 1] {
            for &mode in modes(sgls) {
                for mdts in [0u8, 1] {
                    let (m, c) = setup(md_cfg(sgls, mdts, ms, extended));
                    let ns = c.namespace(1).unwrap().clone();
                    let mut qp = pair(&c, mode);
                    let ctx = format!("ms {ms} ext {extended} sgls {sgls} {mode:?} mdts {mdts}");
                    let ms = usize::from(ms);
                    let blocks = 40u32;
                    let n = blocks as usize;
                    let per_block = if extended { LBA + ms } else { LBA };
                    let bytes = n * per_block;
                    // Page-aligned inner boundaries, so that PRPs can carry
                    // the vector too; the last segment longer than needed.
                    let make = || {
                        let mut v = IoVec::new();
                        let mut at = 0;
                        let lens =
                            std::iter::once(PAGE - 8).chain([2 * PAGE, PAGE].into_iter().cycle());
                        for (i, len) in lens.enumerate() {
                            if at >= bytes {
                                break;
                            }
                            let b = c.alloc_dma(3 * PAGE).unwrap();
                            b.fill(0, b.len(), SENT).unwrap();
                            let off = if i == 0 { 8 } else { 0 };
                            let len = if at + len >= bytes { len + 100 } else { len };
                            v.push(b, off, len.min(3 * PAGE - off)).unwrap();
                            at += len;
                        }
                        Layout::Vector(v)
                    };
                    let data = pattern(u64::from(mdts) + 3, n * LBA);
                    let md = pattern(u64::from(mdts) + 4, n * ms);
                    let host: Vec<u8> = if extended {
                        data.chunks(LBA)
                            .zip(md.chunks(ms))
                            .flat_map(|(d, x)| d.iter().chain(x).copied())
                            .collect()
                    } else {
                        data.clone()
                    };
                    let l = make();
                    l.put(&host);
                    let mut io = l.io();
                    let mdbuf = |fill: Option<&[u8]>| {
                        let b = c.alloc_dma(n * ms + 64).unwrap();
                        b.fill(0, b.len(), SENT).unwrap();
                        if let Some(x) = fill {
                            b.write_bytes(0, x).unwrap();
                        }
                        b
                    };
                    if !extended {
                        io = io.metadata(mdbuf(Some(&md)));
                    }
                    let w = run(
                        &mut qp,
                        IoCommand::Write {
                            ns: &ns,
                            slba: 7,
                            blocks,
                        },
                        io,
                        &ctx,
                    );
                    assert!(m.namespace_data(1, 7, n as u64) == data, "{ctx}: data");
                    assert!(
                        m.namespace_metadata(1, 7, n as u64) == md,
                        "{ctx}: metadata"
                    );
                    assert_eq!(w.metadata.is_some(), !extended, "{ctx}");
                    let l = Layout::Vector(w.segments.unwrap());
                    l.wipe();
                    let mut io = l.io();
                    if !extended {
                        io = io.metadata(mdbuf(None));
                    }
                    let r = run(
                        &mut qp,
                        IoCommand::Read {
                            ns: &ns,
                            slba: 7,
                            blocks,
                        },
                        io,
                        &ctx,
                    );
                    let (got, bad) = Layout::Vector(r.segments.unwrap()).take(bytes);
                    assert!(bad.is_empty(), "{ctx}: read touched {bad:?}");
                    assert!(got == host, "{ctx}: read returned other bytes");
                    if let Some(mb) = r.metadata {
                        let (got, bad) = Layout::Slice {
                            buf: mb,
                            off: 0,
                            limit: n * ms,
                        }
                        .take(n * ms);
                        assert!(bad.is_empty(), "{ctx}: metadata read touched {bad:?}");
                        assert!(got == md, "{ctx}: metadata read returned other bytes");
                    }
                    drop(qp);
                    drop(c);
                    assert_clean(&m);
                }
            }
        }
    }
}

/// Metadata refusals with vectors, whole and split, each with every buffer
/// back and nothing sent: a metadata buffer off a dword (a piece of a
/// split buffer 2 bytes into a page) is `Misaligned`; one block short is
/// `MetadataBuffer` with the whole need; none on a separate format is
/// `MetadataBuffer`; one on an extended format is `MetadataNotApplicable`;
/// an extended vector sized for the data alone is `BufferTooSmall` with
/// the interleaved need.
#[test]
fn metadata_refusals_with_vectors_hand_everything_back() {
    for mdts in [0u8, 1] {
        for sgls in [0u32, 1] {
            let vec_of = |c: &Controller<ModelController>, bytes: usize| {
                let mut v = IoVec::new();
                let mut at = 0;
                while at < bytes {
                    let len = (2 * PAGE).min(bytes - at);
                    v.push(c.alloc_dma(len).unwrap(), 0, len).unwrap();
                    at += len;
                }
                v
            };
            let blocks = 24u32;
            let n = blocks as usize;
            // Separate metadata, 8 bytes per block.
            let (m, c) = setup(md_cfg(sgls, mdts, 8, false));
            let ns = c.namespace(1).unwrap().clone();
            let mut qp = pair(&c, SglMode::Auto);
            let ctx = format!("mdts {mdts} sgls {sgls}");
            let read = IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks,
            };
            let f0 = m.commands_fetched();
            let odd = c.alloc_dma(2 * PAGE).unwrap().split(PAGE + 2).unwrap();
            let mut odd = odd.into_iter();
            let _guard = odd.next().unwrap();
            let odd = odd.next().unwrap();
            assert_eq!(odd.iova() % 4, 2);
            let check = |r: upnvme::Rejected, want: Reject, md: bool, what: &str| {
                assert_eq!(r.reason, want, "{ctx}: {what}");
                assert!(r.segments.is_some(), "{ctx}: {what}: the vector back");
                assert_eq!(r.metadata.is_some(), md, "{ctx}: {what}: the metadata back");
                assert!(r.buffer.is_none());
            };
            let r = qp
                .submit_io(read, IoData::vectored(vec_of(&c, n * LBA)).metadata(odd), 1)
                .unwrap_err();
            check(r, Reject::Misaligned, true, "MPTR off a dword");
            // (`alloc_dma` rounds up to a page: a piece of a split is exact.)
            let short = c
                .alloc_dma(PAGE)
                .unwrap()
                .split(n * 8 - 8)
                .unwrap()
                .remove(0);
            assert_eq!(short.len(), n * 8 - 8);
            let r = qp
                .submit_io(
                    read,
                    IoData::vectored(vec_of(&c, n * LBA)).metadata(short),
                    1,
                )
                .unwrap_err();
            check(
                r,
                Reject::MetadataBuffer {
                    need: (n * 8) as u64,
                },
                true,
                "metadata buffer one block short",
            );
            let r = qp
                .submit_io(read, IoData::vectored(vec_of(&c, n * LBA)), 1)
                .unwrap_err();
            check(
                r,
                Reject::MetadataBuffer {
                    need: (n * 8) as u64,
                },
                false,
                "no metadata buffer",
            );
            assert_eq!(m.commands_fetched(), f0, "{ctx}");
            assert_eq!(qp.in_flight(), 0, "{ctx}");
            drop(qp);
            drop(c);
            assert_clean(&m);
            // Extended, 8 bytes per block.
            let (m, c) = setup(md_cfg(sgls, mdts, 8, true));
            let ns = c.namespace(1).unwrap().clone();
            let mut qp = pair(&c, SglMode::Auto);
            let read = IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks,
            };
            let f0 = m.commands_fetched();
            let r = qp
                .submit_io(
                    read,
                    IoData::vectored(vec_of(&c, n * (LBA + 8)))
                        .metadata(c.alloc_dma(n * 8).unwrap()),
                    1,
                )
                .unwrap_err();
            check(r, Reject::MetadataNotApplicable, true, "MPTR on extended");
            let r = qp
                .submit_io(read, IoData::vectored(vec_of(&c, n * LBA)), 1)
                .unwrap_err();
            check(
                r,
                Reject::BufferTooSmall {
                    need: (n * (LBA + 8)) as u64,
                },
                false,
                "extended vector without room for the metadata",
            );
            assert_eq!(m.commands_fetched(), f0, "{ctx}");
            assert_eq!(qp.in_flight(), 0, "{ctx}");
            drop(qp);
            drop(c);
            assert_clean(&m);
        }
    }
}

/// Slices whose offset or length overflow `usize`, or are empty, on reads
/// and writes that fit one command and that would be split: each refused
/// `SliceOutOfBounds` (never a panic, never a wrapped address), the
/// buffer back, nothing sent; `IoVec::push` refuses overflowing and empty
/// ranges with the buffer back; an empty vector is `BufferTooSmall`, no
/// memory `NoBuffer`.
#[test]
fn overflowing_and_empty_ranges_are_refused_with_their_memory() {
    let (m, c) = setup(cfg(1, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Auto);
    let max = usize::MAX;
    let f0 = m.commands_fetched();
    for blocks in [1u32, 8, 16, 17, 64] {
        for (off, len) in [
            (max, 512),
            (max - 3, 8),
            (max - 511, 512),
            (8, max),
            (8, max - 1),
            (max, max),
            (1, max - 8),
            (0, 0),
            (4096, 0),
        ] {
            for write in [false, true] {
                let ctx = format!("{blocks} blocks, slice ({off:#x}, {len:#x}), write {write}");
                let buf = c.alloc_dma(64 * LBA).unwrap();
                let size = buf.len();
                let cmd = if write {
                    IoCommand::Write {
                        ns: &ns,
                        slba: 0,
                        blocks,
                    }
                } else {
                    IoCommand::Read {
                        ns: &ns,
                        slba: 0,
                        blocks,
                    }
                };
                let r = qp
                    .submit_io(cmd, IoData::slice(buf, off, len), 1)
                    .unwrap_err();
                assert!(
                    matches!(r.reason, Reject::SliceOutOfBounds { .. }),
                    "{ctx}: {:?}",
                    r.reason
                );
                assert_eq!(r.buffer.map(|b| b.len()), Some(size), "{ctx}");
            }
        }
    }
    // A whole buffer too small, and a slice one byte short, split or not.
    for blocks in [8u32, 17] {
        let need = blocks as u64 * LBA as u64;
        let r = qp
            .submit_io(
                IoCommand::Read {
                    ns: &ns,
                    slba: 0,
                    blocks,
                },
                IoData::slice(c.alloc_dma(need as usize).unwrap(), 0, need as usize - 1),
                1,
            )
            .unwrap_err();
        assert_eq!(r.reason, Reject::BufferTooSmall { need }, "{blocks}");
        assert!(r.buffer.is_some());
    }
    let mut v = IoVec::new();
    for (off, len) in [
        (max, 1),
        (1, max),
        (max - 1, 2),
        (4096, 1),
        (0, 0),
        (4095, 0),
    ] {
        let e = v.push(c.alloc_dma(PAGE).unwrap(), off, len).unwrap_err();
        assert_eq!(
            (e.offset, e.len, e.size, e.buffer.len()),
            (off, len, PAGE, PAGE)
        );
    }
    assert!(v.is_empty());
    let r = qp
        .submit_io(
            IoCommand::Write {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            IoData::vectored(v),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::BufferTooSmall { need: 512 });
    assert_eq!(r.segments.map(|v| v.len()), Some(0));
    let r = qp
        .submit_io(
            IoCommand::Write {
                ns: &ns,
                slba: 0,
                blocks: 20,
            },
            IoData::vectored(IoVec::new()),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::BufferTooSmall { need: 20 * 512 });
    let r = qp
        .submit_io(
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 20,
            },
            IoData::none(),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::NoBuffer);
    assert_eq!(m.commands_fetched(), f0, "a refusal reached the device");
    assert_eq!(qp.in_flight(), 0);
    assert!(qp.next_completion().unwrap().is_none());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A segment of another controller's memory anywhere in a vector — beyond
/// the transfer too, in a vector that would be split, or as the metadata
/// buffer — refuses the command `ForeignBuffer` with everything back and
/// nothing sent to either controller.
#[test]
fn a_foreign_segment_anywhere_refuses_the_whole_command() {
    let (m1, c1) = setup(md_cfg(1, 1, 8, false));
    let (m2, c2) = setup(cfg(1, 1));
    let ns1 = c1.namespace(1).unwrap().clone();
    let ns2 = c2.namespace(1).unwrap().clone();
    let mut qp = pair(&c2, SglMode::Auto);
    let mut qp1 = pair(&c1, SglMode::Auto);
    let f1 = m1.commands_fetched();
    let f2 = m2.commands_fetched();
    for blocks in [8u32, 40] {
        let bytes = blocks as usize * LBA;
        for foreign_at in [0usize, 1, 2] {
            // Own segments for the whole transfer; the foreign one first,
            // in the middle, or after the transfer's bytes.
            let mut v = IoVec::new();
            for i in 0..3 {
                if i == foreign_at {
                    v.push(
                        c1.alloc_dma(PAGE).unwrap(),
                        0,
                        if i == 2 { PAGE } else { LBA },
                    )
                    .unwrap();
                }
                if i < 2 {
                    v.push(c2.alloc_dma(bytes).unwrap(), 0, bytes / 2).unwrap();
                }
            }
            let r = qp
                .submit_io(
                    IoCommand::Write {
                        ns: &ns2,
                        slba: 0,
                        blocks,
                    },
                    IoData::vectored(v),
                    1,
                )
                .unwrap_err();
            assert_eq!(
                r.reason,
                Reject::ForeignBuffer,
                "{blocks} blocks, at {foreign_at}"
            );
            assert_eq!(r.segments.map(|v| v.len()), Some(3));
        }
    }
    // A foreign metadata buffer on the other controller's format.
    for blocks in [8u32, 40] {
        let bytes = blocks as usize * LBA;
        let mut v = IoVec::new();
        v.push(c1.alloc_dma(bytes).unwrap(), 0, bytes).unwrap();
        let r = qp1
            .submit_io(
                IoCommand::Read {
                    ns: &ns1,
                    slba: 0,
                    blocks,
                },
                IoData::vectored(v).metadata(c2.alloc_dma(PAGE).unwrap()),
                1,
            )
            .unwrap_err();
        assert_eq!(r.reason, Reject::ForeignBuffer, "{blocks} blocks");
        assert!(r.segments.is_some() && r.metadata.is_some());
    }
    assert_eq!(m1.commands_fetched(), f1);
    assert_eq!(m2.commands_fetched(), f2);
    drop(qp);
    drop(qp1);
    drop(c1);
    drop(c2);
    assert_clean(&m1);
    assert_clean(&m2);
}

/// A batch of vectored commands — accepted, split, refused (PRPs cannot
/// describe them), refused for a full queue — queued on a shallow pair and
/// rung once, with and without `reap_on_submit`: every accepted command
/// completes exactly once with its own vector (its segment count) and
/// bytes, every refused one is handed back at once and never completes.
#[test]
fn a_batch_of_vectors_completes_each_accepted_command_once_with_its_own_memory() {
    for reap_on_submit in [false, true] {
        let (m, c) = setup(cfg(0, 1));
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(8),
                cq_entries: Some(8),
                reap_on_submit,
                ..Default::default()
            })
            .unwrap();
        let depth = qp.max_depth();
        assert_eq!(depth, 7);
        let media = pattern(5, 256 * LBA);
        m.write_namespace_data(1, 0, &media);
        // tag -> (slba, blocks, segments) of the accepted ones.
        let mut accepted = std::collections::BTreeMap::new();
        let mut in_flight = 0u32;
        for tag in 0..12u64 {
            let slba = tag * 20;
            // Tag % 3: 0 a 2-child split (24 blocks, page-aligned
            // segments), 1 a one-command vector, 2 a vector PRPs cannot
            // describe (an inner boundary off a page).
            let (blocks, lens): (u32, Vec<usize>) = match tag % 3 {
                0 => (24, vec![PAGE, 2 * PAGE, 3 * PAGE]),
                1 => (8, vec![PAGE - 4, PAGE]),
                _ => (8, vec![1000, 3096]),
            };
            let mut v = IoVec::new();
            for (i, &len) in lens.iter().enumerate() {
                let b = c.alloc_dma(2 * PAGE + len).unwrap();
                b.fill(0, b.len(), SENT).unwrap();
                let off = if i == 0 && tag % 3 == 1 { 4 } else { 0 };
                v.push(b, off, len).unwrap();
            }
            let nseg = v.len();
            let children = if tag % 3 == 0 { 2 } else { 1 };
            let r = qp.queue_io(
                IoCommand::Read {
                    ns: &ns,
                    slba,
                    blocks,
                },
                IoData::vectored(v),
                tag,
            );
            match r {
                Ok(()) => {
                    assert_ne!(tag % 3, 2, "tag {tag}: a vector PRPs cannot describe went");
                    in_flight += children;
                    accepted.insert(tag, (slba, blocks, nseg));
                }
                Err(r) => {
                    // A vector PRPs cannot describe (no SGLs here) is
                    // `NotDescribable` with or without a free slot (before
                    // the forty-second session: `QueueFull` with none).
                    let want = if tag % 3 == 2 {
                        Reject::NotDescribable
                    } else {
                        assert!(in_flight + children > depth, "tag {tag}: refused with room");
                        Reject::QueueFull
                    };
                    assert_eq!(r.reason, want, "tag {tag}");
                    assert_eq!(r.segments.map(|v| v.len()), Some(nseg), "tag {tag}");
                }
            }
        }
        qp.ring();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..100_000 {
            if seen.len() == accepted.len() {
                break;
            }
            qp.process_completions(64, |_, done| {
                assert!(done.is_ok(), "tag {}: {:?}", done.tag, done.result);
                assert!(seen.insert(done.tag), "tag {} completed twice", done.tag);
                let (slba, blocks, nseg) = accepted[&done.tag];
                let l = Layout::Vector(done.segments.expect("the vector back"));
                let n = blocks as usize * LBA;
                let (got, bad) = l.take(n);
                assert!(bad.is_empty(), "tag {}: touched {bad:?}", done.tag);
                assert!(
                    got == media[slba as usize * LBA..slba as usize * LBA + n],
                    "tag {}: other bytes",
                    done.tag
                );
                if let Layout::Vector(v) = l {
                    assert_eq!(v.len(), nseg, "tag {}: another vector", done.tag);
                }
            })
            .unwrap();
        }
        assert_eq!(seen.len(), accepted.len(), "completions lost");
        assert!(accepted.len() >= 3, "{accepted:?}");
        for _ in 0..1000 {
            assert!(
                qp.next_completion().unwrap().is_none(),
                "a completion too many"
            );
        }
        assert_eq!(qp.in_flight(), 0);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// Every slot's list area is its own: eight commands queued before one
/// doorbell (so every list is written before the device reads any), each
/// with a full three-page list — SGL chains of 766 Data Blocks, PRP
/// vectors of 1024 entries, contiguous 4 MiB PRP Lists — written then read
/// back, each byte exact: a list written over another slot's would hand
/// the device another command's pieces.
#[test]
fn full_list_areas_of_commands_queued_together_do_not_overlap() {
    for sgls in [1u32, 0] {
        let mut config = cfg(sgls, 0);
        config.namespaces[0].blocks = 8 * 8192 + 64;
        let (m, c) = setup(config);
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = pair(&c, SglMode::Auto);
        let n = if sgls == 1 { 8u64 } else { 4 };
        let layout = |i: u64| -> (Layout, u32) {
            if sgls == 1 {
                let pre = 4 * (i as usize + 1);
                (Layout::Vector(strided(&c, 766, 1024, pre, LBA)), 766)
            } else if i.is_multiple_of(2) {
                // 1024 PRP entries: 4 bytes, then pages in 1-page buffers.
                let mut v = IoVec::new();
                let b = c.alloc_dma(PAGE).unwrap();
                b.fill(0, PAGE, SENT).unwrap();
                v.push(b, PAGE - 4, 4).unwrap();
                for _ in 0..1024 {
                    let b = c.alloc_dma(PAGE).unwrap();
                    b.fill(0, PAGE, SENT).unwrap();
                    v.push(b, 0, PAGE).unwrap();
                }
                (Layout::Vector(v), 8192 - 8)
            } else {
                let buf = c.alloc_dma((4 << 20) + PAGE).unwrap();
                buf.fill(0, buf.len(), SENT).unwrap();
                (
                    Layout::Slice {
                        buf,
                        off: 4092,
                        limit: 4 << 20,
                    },
                    8192,
                )
            }
        };
        let slba = |i: u64| i * 8192;
        // Writes, all queued, one ring.
        let mut datas = Vec::new();
        for i in 0..n {
            let (l, blocks) = layout(i);
            let data = pattern(100 + i, blocks as usize * LBA);
            l.put(&data);
            qp.queue_io(
                IoCommand::Write {
                    ns: &ns,
                    slba: slba(i) + i,
                    blocks,
                },
                l.io(),
                i,
            )
            .unwrap();
            datas.push(data);
        }
        let k = datas.len() as u64;
        qp.ring();
        let mut done = 0;
        for _ in 0..100_000 {
            if done == k {
                break;
            }
            done += u64::from(
                qp.process_completions(64, |_, c| assert!(c.is_ok(), "{:?}", c.result))
                    .unwrap(),
            );
        }
        assert_eq!(done, k);
        for (i, data) in datas.iter().enumerate() {
            let i = i as u64;
            let blocks = (data.len() / LBA) as u64;
            assert!(
                m.namespace_data(1, slba(i) + i, blocks) == *data,
                "sgls {sgls}: write {i} stored other bytes"
            );
        }
        // Reads, all queued, one ring.
        for i in 0..k {
            let (l, blocks) = layout(i);
            qp.queue_io(
                IoCommand::Read {
                    ns: &ns,
                    slba: slba(i) + i,
                    blocks,
                },
                l.io(),
                i,
            )
            .unwrap();
        }
        qp.ring();
        let mut got = Vec::new();
        for _ in 0..100_000 {
            if got.len() as u64 == k {
                break;
            }
            qp.process_completions(64, |_, c| got.push(c)).unwrap();
        }
        assert_eq!(got.len() as u64, k);
        for c in got {
            assert!(c.is_ok(), "{:?}", c.result);
            let i = c.tag as usize;
            let data = &datas[i];
            let l = match (c.buffer, c.segments) {
                (Some(buf), None) => Layout::Slice {
                    buf,
                    off: 4092,
                    limit: 4 << 20,
                },
                (None, Some(v)) => Layout::Vector(v),
                _ => panic!("memory"),
            };
            let (bytes, bad) = l.take(data.len());
            assert!(bad.is_empty(), "sgls {sgls}: read {i} touched {bad:?}");
            assert!(bytes == *data, "sgls {sgls}: read {i} returned other bytes");
        }
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// A vectored read with separate metadata whose completion the device
/// holds back, and a split vectored read with one piece held back, ended
/// by a controller reset: each completes once with `ControllerReset`, its
/// whole vector (every segment) and its metadata buffer back; nothing
/// more is delivered; the pair then reads byte exact through the same
/// vector.
#[test]
fn vectors_and_metadata_cut_by_a_reset_come_back_once_and_whole() {
    use upnvme::IoError;
    use upnvme_tests::{Fault, Match};
    let (m, c) = setup(md_cfg(1, 1, 8, false));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Auto);
    let media = pattern(8, 64 * LBA);
    m.write_namespace_data(1, 0, &media);
    for (blocks, held) in [(8u32, 0u64), (40, 1)] {
        let ctx = format!("{blocks} blocks, piece {held} held");
        let n = blocks as usize;
        let mut v = IoVec::new();
        for len in [1000usize, 1000, n * LBA - 2000 + 300] {
            let b = c.alloc_dma(len + 8).unwrap();
            b.fill(0, b.len(), SENT).unwrap();
            v.push(b, 4, len).unwrap();
        }
        let md = c.alloc_dma(n * 8).unwrap();
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(m.commands_fetched() + held),
            doorbells: None,
        });
        qp.submit_io(
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks,
            },
            IoData::vectored(v).metadata(md),
            21,
        )
        .unwrap();
        for _ in 0..100 {
            qp.process_completions(u32::MAX, |_, c| panic!("{ctx}: {} before the reset", c.tag))
                .unwrap();
        }
        c.reset().unwrap();
        let done = wait_one(&mut qp);
        assert_eq!(
            (done.tag, done.result),
            (21, Err(IoError::ControllerReset)),
            "{ctx}"
        );
        assert!(done.metadata.is_some(), "{ctx}: metadata back");
        let v = done.segments.expect("the vector back");
        assert_eq!(v.len(), 3, "{ctx}");
        assert_eq!(
            qp.process_completions(u32::MAX, |_, c| panic!("{ctx}: extra completion {}", c.tag))
                .unwrap(),
            0
        );
        // The same memory works afterwards.
        let l = Layout::Vector(v);
        l.wipe();
        let r = run(
            &mut qp,
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks,
            },
            l.io().metadata(done.metadata.unwrap()),
            &ctx,
        );
        let (got, bad) = Layout::Vector(r.segments.unwrap()).take(n * LBA);
        assert!(bad.is_empty(), "{ctx}: {bad:?}");
        assert!(got == media[..n * LBA], "{ctx}");
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Commands that move no data (Flush, Write Zeroes — split above 65536
/// blocks too) carrying a vector: the device is told no bytes of it (the
/// sentinel everywhere stays), and the vector comes back once with the
/// completion.
#[test]
fn a_vector_on_a_command_without_data_is_untouched_and_comes_back() {
    let mut config = cfg(1, 1);
    config.oncs |= ModelConfig::ONCS_WRITE_ZEROES;
    config.namespaces[0].blocks = 70_000;
    let (m, c) = setup(config);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = pair(&c, SglMode::Auto);
    for cmd in [
        IoCommand::Flush { ns: &ns },
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 0,
            blocks: 8,
            deallocate: false,
        },
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 0,
            blocks: 66_000,
            deallocate: false,
        },
    ] {
        let mut v = IoVec::new();
        for _ in 0..2 {
            let b = c.alloc_dma(PAGE).unwrap();
            b.fill(0, PAGE, SENT).unwrap();
            v.push(b, 3, 1001).unwrap();
        }
        let base = m.transfers_by_encoding();
        let done = run(&mut qp, cmd, IoData::vectored(v), cmd.name());
        assert_eq!(delta(&m, base), (0, 0), "{}", cmd.name());
        let (_, bad) = Layout::Vector(done.segments.expect("the vector back")).take(0);
        assert!(bad.is_empty(), "{}: {bad:?}", cmd.name());
        assert!(qp.next_completion().unwrap().is_none());
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

//! `data_path`: what the driver moves, checked byte for byte against a
//! shadow copy of the namespace.
//!
//! A healthy model (no faults) with a fuzzer-chosen geometry (512 or 4096
//! byte blocks, no metadata or 8/16 bytes of it, interleaved or through
//! MPTR), MDTS, SGL support and NVM Command Set limits (VSL, WZSL, DMRL,
//! DMRSL, DMSL); one queue pair with a small depth and a fuzzer-chosen SGL
//! mode. Then up to 64 commands: Read, Write and Compare whose memory is a
//! whole buffer, a slice at any offset, or a vector of segments of any
//! lengths and offsets (the PRP and SGL planners, split.rs cutting transfers
//! above MDTS, children starting inside segments), Write Zeroes, Deallocate
//! with ranges of any count and length, Verify and Write Uncorrectable
//! (split at their limits), Copy (Descriptor Format 0h/1h) and the same
//! ranges as a cross-namespace Copy naming namespace 1 as their source
//! (Format 2h/3h), with and without the separate metadata buffer.
//!
//! The oracle is the shadow: the namespace's data, metadata and
//! uncorrectable blocks as the commands that completed so far left them.
//! - every tag completes exactly once, with the very memory (buffer,
//!   segments in order, metadata buffer) it was submitted with; a refused
//!   command hands all of it back;
//! - a Read completes `Ok` exactly when no block of its range is
//!   uncorrectable, and then the bytes it describes (data, interleaved or
//!   separate metadata) are the shadow's, and every byte of its memory it
//!   does not describe still holds the canary it had before;
//! - a Copy succeeds exactly when no source block is uncorrectable, and
//!   then its destination holds the sources' data and metadata in order;
//! - a Write, Write Zeroes, Deallocate and Write Uncorrectable succeed and
//!   change exactly their blocks; a Compare succeeds exactly when its memory
//!   equals the shadow; a Verify exactly when no block is uncorrectable;
//! - a plain Read or Write of a whole buffer inside the namespace, sent with
//!   nothing in flight, is accepted when its pieces fit the pair's depth;
//! - whenever nothing is in flight, the model's namespace equals the
//!   shadow; the model saw no DMA outside mapped memory and no command
//!   above MDTS or a size limit (its host-rule violations).

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use upnvme::{
    Completion, Controller, CopyRange, CopySource, DmaBuffer, DsmRange, IoCommand, IoData, IoError,
    IoQueuePair, IoVec, Namespace, QueuePairOptions, Rejected, SglMode,
};
use upnvme_fuzz::{Reader, options};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig, NvmLimitsConfig};

/// Blocks in the namespace.
const BLOCKS: u64 = 48;
/// Most commands per input.
const MAX_COMMANDS: usize = 64;
/// The byte every Read buffer holds before the command.
const CANARY: u8 = 0xa5;

type Pair = IoQueuePair<ModelController>;

/// The namespace as the completed commands left it.
struct Shadow {
    bs: usize,
    ms: usize,
    extended: bool,
    data: Vec<u8>,
    meta: Vec<u8>,
    bad: Vec<bool>,
}

impl Shadow {
    /// Bytes per block in the data memory (data, plus metadata when
    /// interleaved).
    fn host_block(&self) -> usize {
        self.bs + if self.extended { self.ms } else { 0 }
    }

    /// Whether metadata goes through a separate buffer.
    fn separate(&self) -> bool {
        self.ms != 0 && !self.extended
    }

    /// The data memory's bytes of `blocks` blocks from `slba`, as a Read
    /// delivers them.
    fn host_bytes(&self, slba: u64, blocks: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for b in slba..slba + blocks {
            let b = b as usize;
            out.extend_from_slice(&self.data[b * self.bs..(b + 1) * self.bs]);
            if self.extended {
                out.extend_from_slice(&self.meta[b * self.ms..(b + 1) * self.ms]);
            }
        }
        out
    }

    /// The separate metadata of `blocks` blocks from `slba`.
    fn meta_bytes(&self, slba: u64, blocks: u64) -> Vec<u8> {
        let (a, b) = (slba as usize * self.ms, (slba + blocks) as usize * self.ms);
        self.meta[a..b].to_vec()
    }

    /// Stores what a Write's memory held.
    fn write(&mut self, slba: u64, host: &[u8], md: &[u8]) {
        let hb = self.host_block();
        for (i, chunk) in host.chunks_exact(hb).enumerate() {
            let b = slba as usize + i;
            self.data[b * self.bs..(b + 1) * self.bs].copy_from_slice(&chunk[..self.bs]);
            if self.extended {
                self.meta[b * self.ms..(b + 1) * self.ms].copy_from_slice(&chunk[self.bs..]);
            }
            self.bad[b] = false;
        }
        if self.separate() {
            let a = slba as usize * self.ms;
            self.meta[a..a + md.len()].copy_from_slice(md);
        }
    }

    /// Deallocated blocks read as zeros, data and metadata.
    fn zero(&mut self, slba: u64, blocks: u64) {
        for b in slba..slba + blocks {
            let b = b as usize;
            self.data[b * self.bs..(b + 1) * self.bs].fill(0);
            self.meta[b * self.ms..(b + 1) * self.ms].fill(0);
            self.bad[b] = false;
        }
    }

    /// A Copy: the ranges' data and metadata, read first, in order from
    /// `sdlba` (as the model runs it).
    fn copy(&mut self, ranges: &[(u64, u64)], sdlba: u64) {
        let mut data = Vec::new();
        let mut meta = Vec::new();
        for &(s, n) in ranges {
            let (a, b) = (s as usize, (s + n) as usize);
            data.extend_from_slice(&self.data[a * self.bs..b * self.bs]);
            meta.extend_from_slice(&self.meta[a * self.ms..b * self.ms]);
        }
        let d = sdlba as usize;
        self.data[d * self.bs..d * self.bs + data.len()].copy_from_slice(&data);
        self.meta[d * self.ms..d * self.ms + meta.len()].copy_from_slice(&meta);
        let blocks = data.len() / self.bs;
        self.bad[d..d + blocks].fill(false);
    }

    fn any_bad(&self, slba: u64, blocks: u64) -> bool {
        self.bad[slba as usize..(slba + blocks) as usize]
            .iter()
            .any(|&b| b)
    }
}

/// Where a command's data lies: (buffer IOVA, offset, length) pieces in
/// transfer order, and every buffer it went with.
#[derive(Clone, Debug)]
struct Layout {
    pieces: Vec<(u64, usize, usize)>,
    /// IOVAs of the data buffers, in order (a vector's segments' buffers).
    buffers: Vec<u64>,
    /// Whether the data went as a vector.
    vectored: bool,
    metadata: Option<u64>,
    /// Bytes of the metadata buffer.
    md_room: usize,
    /// The data is one whole buffer (`IoData::buffer`).
    whole: bool,
}

/// What the harness expects of a command once it completes.
#[derive(Debug)]
enum Expect {
    Read {
        slba: u64,
        blocks: u64,
    },
    Write {
        slba: u64,
        host: Vec<u8>,
        md: Vec<u8>,
    },
    Compare {
        equal: bool,
    },
    Zero {
        ranges: Vec<(u64, u64)>,
    },
    Verify {
        bad: bool,
    },
    Uncorrectable {
        slba: u64,
        blocks: u64,
    },
    Copy {
        ranges: Vec<(u64, u64)>,
        sdlba: u64,
        bad: bool,
    },
}

struct InFlight {
    layout: Layout,
    expect: Expect,
}

struct Harness {
    m: ModelController,
    c: Controller<ModelController>,
    qp: Pair,
    ns: Namespace,
    shadow: Shadow,
    next_tag: u64,
    in_flight: HashMap<u64, InFlight>,
    /// Buffers the harness owns, by IOVA.
    pool: HashMap<u64, DmaBuffer>,
}

/// Up to `n` bytes of a fuzzer-seeded pattern.
fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

impl Harness {
    /// A zero-based buffer of at least `len` bytes (reused when one is free).
    fn buffer(&mut self, len: usize) -> DmaBuffer {
        let key = self
            .pool
            .iter()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(k, _)| *k);
        match key.and_then(|k| self.pool.remove(&k)) {
            Some(b) => b,
            None => {
                let b = self.c.alloc_dma(len.max(1)).expect("DMA memory");
                assert!(
                    !self.pool.contains_key(&b.iova()),
                    "allocator reused a live IOVA"
                );
                b
            }
        }
    }

    fn give_back(&mut self, b: DmaBuffer) {
        let iova = b.iova();
        assert!(
            self.pool.insert(iova, b).is_none(),
            "buffer {iova:#x} handed back twice"
        );
    }

    /// Builds the data memory of `host_len` bytes (and the metadata buffer
    /// of `md_len` bytes), filled with `fill` (the bytes the transfer
    /// describes) and the canary elsewhere.
    fn memory(
        &mut self,
        r: &mut Reader<'_>,
        host_len: usize,
        md_len: usize,
        fill: &[u8],
        md_fill: &[u8],
    ) -> (IoData, Layout) {
        let mut layout = Layout {
            pieces: Vec::new(),
            buffers: Vec::new(),
            vectored: false,
            metadata: None,
            md_room: 0,
            whole: false,
        };
        let mut io = match r.below(8) {
            // The whole buffer.
            0..=2 => {
                let b = self.buffer(host_len);
                b.fill(0, b.len(), CANARY).expect("fill");
                b.write_bytes(0, &fill[..host_len.min(b.len())])
                    .expect("write");
                layout.pieces.push((b.iova(), 0, host_len));
                layout.buffers.push(b.iova());
                layout.whole = true;
                IoData::buffer(b)
            }
            // A slice: any offset (mostly dword aligned), a length that is
            // mostly the transfer's.
            3..=5 => {
                let off = match r.below(4) {
                    0 => r.below(64) as usize,
                    1 => 4096 - 4 * r.below(4) as usize,
                    _ => 4 * r.below(1024) as usize,
                };
                let len = match r.below(8) {
                    0 => host_len.saturating_sub(1 + r.below(16) as usize),
                    1 => host_len + r.below(64) as usize,
                    _ => host_len,
                };
                let b = self.buffer(off + len.max(host_len) + r.below(2) as usize * 4096);
                b.fill(0, b.len(), CANARY).expect("fill");
                let n = host_len.min(b.len().saturating_sub(off));
                b.write_bytes(off, &fill[..n]).expect("write");
                layout.pieces.push((b.iova(), off, host_len));
                layout.buffers.push(b.iova());
                IoData::slice(b, off, len)
            }
            // A vector: segments of any length at any offset.
            _ => {
                layout.vectored = true;
                let mut v = IoVec::new();
                let mut done = 0;
                let aligned = r.bool();
                while done < host_len && v.len() < 40 {
                    let left = host_len - done;
                    let (off, len) = if aligned {
                        // Page-aligned inner boundaries: PRPs can describe it.
                        let first = v.is_empty();
                        let off = if first { 4 * r.below(1024) as usize } else { 0 };
                        let room = 4096 * (1 + r.below(3) as usize) - off % 4096;
                        (off, left.min(room))
                    } else {
                        let off = match r.below(3) {
                            0 => r.below(4096) as usize,
                            _ => 4 * r.below(1024) as usize,
                        };
                        let len = match r.below(4) {
                            0 => left,
                            _ => 1 + r.below(left.min(12288) as u32) as usize,
                        };
                        (off, len.min(left))
                    };
                    let b = self.buffer(off + len);
                    b.fill(0, b.len(), CANARY).expect("fill");
                    b.write_bytes(off, &fill[done..done + len]).expect("write");
                    layout.pieces.push((b.iova(), off, len));
                    layout.buffers.push(b.iova());
                    v.push(b, off, len).expect("segment inside its buffer");
                    done += len;
                }
                IoData::vectored(v)
            }
        };
        if md_len > 0 && r.below(8) != 0 {
            let want = if r.below(8) == 0 { md_len / 2 } else { md_len };
            let b = self.buffer(want);
            b.fill(0, b.len(), CANARY).expect("fill");
            b.write_bytes(0, &md_fill[..md_len.min(b.len())])
                .expect("write");
            layout.metadata = Some(b.iova());
            layout.md_room = b.len();
            io = io.metadata(b);
        }
        (io, layout)
    }

    /// A submission's outcome; `must_accept` when the command was valid and
    /// fit the pair's free slots.
    fn submitted(
        &mut self,
        res: Result<(), Rejected>,
        tag: u64,
        layout: Layout,
        expect: Expect,
        must_accept: bool,
    ) {
        match res {
            Ok(()) => {
                debug(|| {
                    let kind = format!("{expect:?}");
                    let kind = kind.split([' ', '{']).next().unwrap_or("").to_string();
                    format!(
                        "accepted {kind} pieces {} vectored {} metadata {}",
                        layout.pieces.len(),
                        layout.vectored,
                        layout.metadata.is_some()
                    )
                });
                self.in_flight.insert(tag, InFlight { layout, expect });
            }
            Err(rej) => {
                debug(|| format!("refused {:?}", rej.reason));
                assert!(
                    !must_accept,
                    "a valid command was refused: {:?} ({expect:?}, {layout:?})",
                    rej.reason
                );
                let _ = self.qp.describe(rej.reason).to_string();
                self.memory_back(&layout, rej.buffer, rej.segments, rej.metadata);
                if self.qp.in_flight() == 0 {
                    self.check_model();
                }
            }
        }
    }

    /// Checks the memory that came back is the memory that went, and takes
    /// it back.
    fn memory_back(
        &mut self,
        layout: &Layout,
        buffer: Option<DmaBuffer>,
        segments: Option<IoVec>,
        metadata: Option<DmaBuffer>,
    ) {
        if layout.vectored {
            assert!(buffer.is_none(), "a vector came back as a buffer");
            let v = segments.expect("the vector comes back");
            let back: Vec<(u64, usize, usize)> = v
                .segments()
                .iter()
                .map(|s| (s.buffer().iova(), s.offset(), s.len()))
                .collect();
            assert_eq!(back, layout.pieces, "the vector came back changed");
            for b in v.into_buffers() {
                self.give_back(b);
            }
        } else if layout.buffers.is_empty() {
            assert!(
                buffer.is_none() && segments.is_none(),
                "memory came back that never went"
            );
        } else {
            assert!(segments.is_none(), "a buffer came back as a vector");
            let b = buffer.expect("the buffer comes back");
            assert_eq!(Some(&b.iova()), layout.buffers.first(), "another buffer");
            self.give_back(b);
        }
        assert_eq!(
            metadata.as_ref().map(DmaBuffer::iova),
            layout.metadata,
            "the metadata buffer"
        );
        if let Some(m) = metadata {
            self.give_back(m);
        }
    }

    /// The bytes the layout describes, read from the harness's buffers.
    fn described(&self, layout: &Layout) -> Vec<u8> {
        let mut out = Vec::new();
        for &(iova, off, len) in &layout.pieces {
            let b = &self.pool[&iova];
            let mut v = vec![0; len];
            b.read_bytes(off, &mut v).expect("read");
            out.extend_from_slice(&v);
        }
        out
    }

    /// Every byte of the layout's buffers outside its pieces holds the
    /// canary.
    fn check_canary(&self, layout: &Layout, md_len: usize) {
        let mut inside: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
        for &(iova, off, len) in &layout.pieces {
            inside.entry(iova).or_default().push((off, off + len));
        }
        for iova in layout.buffers.iter().chain(layout.metadata.iter()) {
            let b = &self.pool[iova];
            let mut v = vec![0; b.len()];
            b.read_bytes(0, &mut v).expect("read");
            let ranges = if Some(*iova) == layout.metadata {
                vec![(0, md_len)]
            } else {
                inside.get(iova).cloned().unwrap_or_default()
            };
            for (i, &x) in v.iter().enumerate() {
                if !ranges.iter().any(|&(a, e)| (a..e).contains(&i)) {
                    assert_eq!(
                        x, CANARY,
                        "byte {i} of buffer {iova:#x} outside the transfer was written"
                    );
                }
            }
        }
    }

    fn complete(&mut self, c: Completion) {
        let f = self
            .in_flight
            .remove(&c.tag)
            .unwrap_or_else(|| panic!("tag {} completed twice or never submitted", c.tag));
        self.memory_back(&f.layout, c.buffer, c.segments, c.metadata);
        let res = c.result;
        let inside = |s: u64, n: u64| s.checked_add(n).is_some_and(|e| e <= BLOCKS);
        let ranges_ok = match &f.expect {
            Expect::Read { slba, blocks } | Expect::Uncorrectable { slba, blocks } => {
                inside(*slba, *blocks)
            }
            Expect::Write { slba, host, .. } => {
                inside(*slba, (host.len() / self.shadow.host_block()) as u64)
            }
            Expect::Zero { ranges } => ranges.iter().all(|&(s, n)| inside(s, n)),
            Expect::Copy { ranges, sdlba, .. } => {
                let total = ranges.iter().map(|&(_, n)| n).sum();
                ranges.iter().all(|&(s, n)| inside(s, n)) && inside(*sdlba, total)
            }
            Expect::Compare { .. } | Expect::Verify { .. } => true,
        };
        assert!(
            ranges_ok || res.is_err(),
            "a command outside the namespace succeeded: {:?}",
            f.expect
        );
        if !ranges_ok {
            return;
        }
        let status = |res: &Result<u32, IoError>| match res {
            Err(IoError::Status(s)) => Some(*s),
            _ => None,
        };
        match f.expect {
            Expect::Read { slba, blocks } => {
                if self.shadow.any_bad(slba, blocks) {
                    assert!(
                        status(&res).is_some_and(|s| s.sct() == 2 && s.sc() == 0x81),
                        "Read of an uncorrectable block: {res:?}"
                    );
                    return;
                }
                assert!(res.is_ok(), "Read failed: {res:?}");
                let got = self.described(&f.layout);
                let want = self.shadow.host_bytes(slba, blocks);
                assert!(got == want, "Read {slba}+{blocks}: wrong data");
                let md_len = if self.shadow.separate() {
                    let m = &self.pool[&f.layout.metadata.expect("separate metadata")];
                    let mut got = vec![0; blocks as usize * self.shadow.ms];
                    m.read_bytes(0, &mut got).expect("read");
                    assert!(
                        got == self.shadow.meta_bytes(slba, blocks),
                        "Read {slba}+{blocks}: wrong metadata"
                    );
                    got.len()
                } else {
                    0
                };
                self.check_canary(&f.layout, md_len);
            }
            Expect::Write { slba, host, md } => {
                assert!(res.is_ok(), "Write failed: {res:?}");
                self.shadow.write(slba, &host, &md);
            }
            Expect::Compare { equal } => {
                if equal {
                    assert!(res.is_ok(), "Compare of equal data failed: {res:?}");
                } else {
                    assert!(
                        status(&res).is_some_and(|s| s.is_compare_failure()),
                        "Compare of different data: {res:?}"
                    );
                }
            }
            Expect::Zero { ranges } => {
                assert!(res.is_ok(), "Write Zeroes / Deallocate failed: {res:?}");
                for (s, n) in ranges {
                    self.shadow.zero(s, n);
                }
            }
            Expect::Verify { bad } => {
                assert_eq!(res.is_ok(), !bad, "Verify: {res:?}");
            }
            Expect::Uncorrectable { slba, blocks } => {
                assert!(res.is_ok(), "Write Uncorrectable failed: {res:?}");
                for b in slba..slba + blocks {
                    self.shadow.bad[b as usize] = true;
                }
            }
            Expect::Copy { ranges, sdlba, bad } => {
                assert_eq!(res.is_ok(), !bad, "Copy: {res:?}");
                if !bad {
                    self.shadow.copy(&ranges, sdlba);
                }
            }
        }
    }

    /// Reaps until nothing is in flight (the healthy model completes every
    /// command it fetched).
    fn drain(&mut self) {
        for _ in 0..64 {
            if self.qp.in_flight() == 0 {
                break;
            }
            let mut got = Vec::new();
            self.qp
                .process_completions(u32::MAX, |_, c| got.push(c))
                .expect("process_completions on a healthy model");
            for c in got {
                self.complete(c);
            }
        }
        assert_eq!(self.qp.in_flight(), 0, "commands never completed");
        assert!(self.in_flight.is_empty(), "tags never completed");
        self.check_model();
    }

    /// The model's namespace is the shadow, and the host broke no rule.
    fn check_model(&self) {
        let data = self.m.namespace_data(1, 0, BLOCKS);
        assert!(data == self.shadow.data, "namespace data differs");
        if self.shadow.ms != 0 {
            let meta = self.m.namespace_metadata(1, 0, BLOCKS);
            assert!(meta == self.shadow.meta, "namespace metadata differs");
        }
        assert_eq!(
            self.m.dma_faults(),
            0,
            "DMA faults: {:?}",
            self.m.dma_fault_log()
        );
        let v = self.m.violations();
        assert!(v.is_empty(), "host-rule violations: {v:?}");
    }

    fn slba_blocks(&self, r: &mut Reader<'_>, max: u32) -> (u64, u64) {
        let blocks = match r.below(8) {
            0 => 1 + r.below(BLOCKS as u32) as u64,
            _ => 1 + r.below(max) as u64,
        };
        let slba = match r.below(16) {
            0 => BLOCKS - blocks + 1,
            _ => u64::from(r.below((BLOCKS - blocks + 1) as u32)),
        };
        (slba, blocks)
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let action = r.below(16);
        let ns = self.ns.clone();
        match action {
            // Read, Write, Compare.
            0..=8 => {
                let (slba, blocks) = self.slba_blocks(r, 12);
                let in_range = slba + blocks <= BLOCKS;
                let host_len = blocks as usize * self.shadow.host_block();
                let md_len = if self.shadow.separate() {
                    blocks as usize * self.shadow.ms
                } else {
                    0
                };
                let kind = action % 3;
                if kind == 2 {
                    // The bytes a Compare is built from are the shadow's:
                    // the commands in flight (executed, not yet reaped)
                    // must be in it first.
                    self.drain();
                }
                let (fill, md_fill, equal) = if kind == 0 {
                    (vec![CANARY; host_len], vec![CANARY; md_len], false)
                } else if kind == 2 && in_range {
                    // Compare: mostly the shadow's bytes, sometimes one off.
                    let mut h = self.shadow.host_bytes(slba, blocks);
                    let mut md = self.shadow.meta_bytes(slba, blocks);
                    let flip = r.below(4) == 0;
                    if flip {
                        let i = r.below(host_len as u32) as usize;
                        h[i] ^= 1 << r.below(8);
                    }
                    if md_len > 0 && r.below(8) == 0 {
                        md[0] ^= 0x80;
                        (h, md, false)
                    } else {
                        (h, md, !flip)
                    }
                } else {
                    let seed = r.u8();
                    (pattern(seed, host_len), pattern(!seed, md_len), false)
                };
                let (io, layout) = self.memory(r, host_len, md_len, &fill, &md_fill);
                let idle = self.qp.in_flight() == 0;
                let plain_whole = layout.whole;
                let has_md = md_len == 0 || layout.metadata.is_some();
                let md_fits = layout.md_room >= md_len;
                let blocks32 = blocks as u32;
                let cmd = match kind {
                    0 => IoCommand::Read {
                        ns: &ns,
                        slba,
                        blocks: blocks32,
                    },
                    1 => IoCommand::Write {
                        ns: &ns,
                        slba,
                        blocks: blocks32,
                    },
                    _ => IoCommand::Compare {
                        ns: &ns,
                        slba,
                        blocks: blocks32,
                    },
                };
                let expect = match kind {
                    0 => Expect::Read { slba, blocks },
                    1 => Expect::Write {
                        slba,
                        host: fill,
                        md: md_fill,
                    },
                    _ => Expect::Compare { equal },
                };
                let children = self.children(blocks);
                let must_accept = idle
                    && in_range
                    && plain_whole
                    && has_md
                    && md_fits
                    && kind != 2
                    && children.is_some_and(|n| n <= self.qp.max_depth());
                let res = self.qp.submit_io(cmd, io, tag);
                self.submitted(res, tag, layout, expect, must_accept);
            }
            // Write Zeroes.
            9 => {
                let (slba, blocks) = self.slba_blocks(r, BLOCKS as u32);
                let cmd = IoCommand::WriteZeroes {
                    ns: &ns,
                    slba,
                    blocks: blocks as u32,
                    deallocate: r.bool(),
                };
                let res = self.qp.submit_io(cmd, IoData::none(), tag);
                self.no_memory(
                    res,
                    tag,
                    Expect::Zero {
                        ranges: vec![(slba, blocks)],
                    },
                );
            }
            // Deallocate: ranges of any count and length.
            10 | 11 => {
                let n = match r.below(8) {
                    0 => 256 + r.below(4) as usize,
                    1 => 0,
                    _ => 1 + r.below(8) as usize,
                };
                let ranges: Vec<DsmRange> = (0..n)
                    .map(|_| {
                        let (slba, nlb) = self.slba_blocks(r, 16);
                        DsmRange {
                            cattr: 0,
                            nlb: nlb as u32,
                            slba,
                        }
                    })
                    .collect();
                let zeroed = ranges.iter().map(|d| (d.slba, u64::from(d.nlb))).collect();
                let cmd = IoCommand::Deallocate {
                    ns: &ns,
                    ranges: &ranges,
                };
                let res = self.qp.submit_io(cmd, IoData::none(), tag);
                self.no_memory(res, tag, Expect::Zero { ranges: zeroed });
            }
            // Verify.
            12 => {
                // Its outcome depends on the Write Uncorrectables before it.
                self.drain();
                let (slba, blocks) = self.slba_blocks(r, BLOCKS as u32);
                let bad = slba + blocks <= BLOCKS && self.shadow.any_bad(slba, blocks);
                let cmd = IoCommand::Verify {
                    ns: &ns,
                    slba,
                    blocks: blocks as u32,
                };
                let res = self.qp.submit_io(cmd, IoData::none(), tag);
                self.no_memory(res, tag, Expect::Verify { bad });
            }
            // Write Uncorrectable.
            13 => {
                let (slba, blocks) = self.slba_blocks(r, 4);
                let cmd = IoCommand::WriteUncorrectable {
                    ns: &ns,
                    slba,
                    blocks: blocks as u32,
                };
                let res = self.qp.submit_io(cmd, IoData::none(), tag);
                self.no_memory(res, tag, Expect::Uncorrectable { slba, blocks });
            }
            // Copy, or the same ranges as a cross-namespace Copy whose
            // every source is namespace 1 (SNSID 1, Format 2h/3h).
            14 => {
                // Its outcome depends on the Write Uncorrectables before it.
                self.drain();
                let n = match r.below(8) {
                    0 => 0,
                    1 => 129 + r.below(2) as usize,
                    _ => 1 + r.below(4) as usize,
                };
                let ranges: Vec<CopyRange> = (0..n)
                    .map(|_| {
                        let (slba, blocks) = self.slba_blocks(r, 8);
                        CopyRange {
                            slba,
                            blocks: blocks as u32,
                        }
                    })
                    .collect();
                let spans: Vec<(u64, u64)> = ranges
                    .iter()
                    .map(|c| (c.slba, u64::from(c.blocks)))
                    .collect();
                let total: u64 = spans.iter().map(|&(_, n)| n).sum();
                let sdlba = match r.below(8) {
                    0 => BLOCKS.saturating_sub(total) + 1,
                    _ => u64::from(r.below((BLOCKS.saturating_sub(total) + 1) as u32)),
                };
                let bad = spans
                    .iter()
                    .any(|&(s, n)| s + n <= BLOCKS && self.shadow.any_bad(s, n));
                let expect = Expect::Copy {
                    ranges: spans,
                    sdlba,
                    bad,
                };
                let res = if r.bool() {
                    let cmd = IoCommand::Copy {
                        ns: &ns,
                        sdlba,
                        ranges: &ranges,
                    };
                    self.qp.submit_io(cmd, IoData::none(), tag)
                } else {
                    let sources: Vec<CopySource<'_>> = ranges
                        .iter()
                        .map(|c| CopySource {
                            ns: &ns,
                            slba: c.slba,
                            blocks: c.blocks,
                        })
                        .collect();
                    let cmd = IoCommand::CrossNamespaceCopy {
                        ns: &ns,
                        sdlba,
                        sources: &sources,
                    };
                    self.qp.submit_io(cmd, IoData::none(), tag)
                };
                self.no_memory(res, tag, expect);
            }
            _ => self.drain(),
        }
        // Commands complete in the order they executed: a read checked at
        // its completion sees the writes completed before it. Keep the
        // in-flight set from growing past what the pair holds.
        // Every command in flight holds a slot (a split one, one per
        // child), and no more slots than the pair has.
        let n = self.qp.in_flight();
        assert!(
            n as usize >= self.in_flight.len() && n <= self.qp.max_depth(),
            "{n} slots in flight for {} commands, depth {}",
            self.in_flight.len(),
            self.qp.max_depth()
        );
        if n >= self.qp.max_depth() {
            self.drain();
        }
    }

    /// How many commands a Read or Write of `blocks` goes as, if the pair
    /// can split it at all.
    fn children(&self, blocks: u64) -> Option<u32> {
        let per = (self.qp.max_transfer() / self.shadow.host_block()).min(0x1_0000) as u64;
        (per > 0).then(|| blocks.div_ceil(per) as u32)
    }

    /// A command without memory: it comes back with none.
    fn no_memory(&mut self, res: Result<(), Rejected>, tag: u64, expect: Expect) {
        let layout = Layout {
            pieces: Vec::new(),
            buffers: Vec::new(),
            vectored: false,
            metadata: None,
            md_room: 0,
            whole: false,
        };
        match res {
            Ok(()) => {
                debug(|| format!("accepted {expect:?}"));
                self.in_flight.insert(tag, InFlight { layout, expect });
            }
            Err(rej) => {
                debug(|| format!("refused {:?}", rej.reason));
                assert!(
                    rej.buffer.is_none() && rej.segments.is_none() && rej.metadata.is_none(),
                    "memory came back that never went"
                );
                let _ = self.qp.describe(rej.reason).to_string();
            }
        }
    }
}

/// With `UPNVME_FUZZ_DEBUG` set: what happened to each command, on stderr.
fn debug(what: impl FnOnce() -> String) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("UPNVME_FUZZ_DEBUG").is_some()) {
        eprintln!("data_path: {}", what());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let lba_size = if r.bool() { 4096 } else { 512 };
    let ms = [0u16, 0, 8, 16][r.below(4) as usize];
    let extended = ms != 0 && r.bool();
    let cfg = ModelConfig {
        mdts: r.below(4) as u8,
        oncs: ModelConfig::ONCS_COMPARE
            | ModelConfig::ONCS_DSM
            | ModelConfig::ONCS_WRITE_ZEROES
            | ModelConfig::ONCS_WRITE_UNCORRECTABLE
            | ModelConfig::ONCS_VERIFY
            | ModelConfig::ONCS_COPY,
        // Every Copy Descriptor Format, as QEMU 10.0.
        ocfs: 0xf,
        sgls: r.below(3),
        nvm_limits: NvmLimitsConfig {
            vsl: r.below(3) as u8,
            wzsl: r.below(3) as u8,
            dmrl: r.below(4) as u8,
            dmrsl: r.below(8),
            dmsl: u64::from(r.below(24)),
        },
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size,
            blocks: BLOCKS,
            ms,
            extended,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    };
    let m = ModelController::new(cfg);
    let c = Controller::with_device(m.clone(), options()).expect("bring-up on a healthy model");
    let sgl = match r.below(3) {
        0 => SglMode::Auto,
        1 => SglMode::Never,
        _ => SglMode::Always,
    };
    let entries = 2 + r.below(15);
    let opts = |sgl| QueuePairOptions {
        entries: Some(entries),
        sgl,
        ..Default::default()
    };
    let qp = match c.io_queue_pair(opts(sgl)) {
        Ok(qp) => qp,
        // SGLs always, on a controller without them.
        Err(_) => c.io_queue_pair(opts(SglMode::Auto)).expect("queue pair"),
    };
    let ns = c.namespace(1).expect("namespace 1").clone();
    let bs = lba_size as usize;
    let ms = usize::from(ms);
    let mut h = Harness {
        m,
        c,
        qp,
        ns,
        shadow: Shadow {
            bs,
            ms,
            extended,
            data: vec![0; BLOCKS as usize * bs],
            meta: vec![0; BLOCKS as usize * ms],
            bad: vec![false; BLOCKS as usize],
        },
        next_tag: 1,
        in_flight: HashMap::new(),
        pool: HashMap::new(),
    };
    let mut n = 0;
    while !r.is_empty() && n < MAX_COMMANDS {
        h.step(&mut r);
        n += 1;
    }
    h.drain();
    drop(h.qp);
    let _ = h.c.close();
});

//! The driver's own CPU work per I/O, for `cargo xtask cost`.
//!
//! `io_cost N [WORKLOAD]` runs `N` round trips of one workload — `read-4k`
//! (the default: one 4 KiB read, PRP1 only), `write-4k` (one 4 KiB write), or
//! `read-64k` (one 64 KiB read: PRP1 and a PRP List) — each a submit, then
//! `process_completions` until it is reaped, on a queue pair whose controller is the in-memory
//! model ([`upnvme_tests::ModelController`]). The model is reached through
//! [`Meter`], a [`Device`] whose register accessors are never inlined, so a
//! profiler can tell the model's work (inside `Meter::*`) from the driver's:
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*io_cost*one_io*' \
//!          --toggle-collect='*io_cost*Meter*' target/release/examples/io_cost 100000
//! ```
//!
//! collects instructions only inside [`one_io`] and outside the model
//! (callgrind flips collection on entry to and exit from each listed
//! function, so the nested `Meter` calls switch it off again). `cargo xtask
//! cost` runs it for `N` and `2N` and divides the difference by `N`, which
//! removes everything that is not per I/O.
//!
//! Shadow doorbells are off (every doorbell is an MMIO write the model sees
//! synchronously); queue pair options are the defaults (`reap_on_submit`
//! off, adaptive CQ head moderation).

use std::time::Duration;

use upnvme::{
    Controller, ControllerOptions, Device, DmaBuffer, IoCommand, IoQueuePair, Namespace,
    PageBacking, QueuePairOptions,
};
use upnvme_dma::DmaError;
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

/// Blocks of the model's namespace (4 KiB each: 64 MiB).
const BLOCKS: u64 = 16 * 1024;
/// I/Os before the measured ones (lazy initialisation, first-touch effects).
const WARMUP: u64 = 1000;

/// The model behind register accessors that are never inlined, so their
/// (the model's) cost is separable in a profile.
#[derive(Clone)]
struct Meter(ModelController);

impl Device for Meter {
    #[inline(never)]
    fn read32(&self, offset: usize) -> u32 {
        self.0.read32(offset)
    }
    #[inline(never)]
    fn write32(&self, offset: usize, value: u32) {
        self.0.write32(offset, value)
    }
    #[inline(never)]
    fn read64(&self, offset: usize) -> u64 {
        self.0.read64(offset)
    }
    #[inline(never)]
    fn write64(&self, offset: usize, value: u64) {
        self.0.write64(offset, value)
    }
    fn bar_len(&self) -> usize {
        self.0.bar_len()
    }
    #[inline(never)]
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.0.alloc_dma(len)
    }
    fn name(&self) -> String {
        "model (metered)".into()
    }
}

/// One I/O: submit, then reap until its completion arrives. Returns the
/// buffer. Never inlined: the profiler collects inside it. One instance per
/// workload (const parameters), as an application's I/O call site would be.
#[inline(never)]
fn one_io<const WRITE: bool, const BLOCKS: u32>(
    qp: &mut IoQueuePair<Meter>,
    ns: &Namespace,
    buf: DmaBuffer,
    slba: u64,
) -> DmaBuffer {
    let blocks = BLOCKS;
    let cmd = if WRITE {
        IoCommand::Write { ns, slba, blocks }
    } else {
        IoCommand::Read { ns, slba, blocks }
    };
    if let Err(f) = qp.submit(cmd, Some(buf), 7) {
        panic!("submit failed: {f}");
    }
    let mut back = None;
    while back.is_none() {
        qp.process_completions(u32::MAX, |_, c| {
            // The error by value: formatting `c.result` in place would
            // take the completion's address and keep it in memory.
            if let Err(e) = c.result {
                panic!("read failed: {e:?}");
            }
            back = c.buffer;
        })
        .expect("process_completions");
    }
    back.expect("the completion returns the buffer")
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| {
            s.parse()
                .expect("usage: io_cost [N] [read-4k|write-4k|read-64k]")
        })
        .unwrap_or(100_000);
    let workload = std::env::args().nth(2).unwrap_or_else(|| "read-4k".into());
    let (write, blocks) = match workload.as_str() {
        "read-4k" => (false, 1u32),
        "write-4k" => (true, 1),
        "read-64k" => (false, 16),
        w => panic!("unknown workload {w}: read-4k, write-4k or read-64k"),
    };
    let model = ModelController::new(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 4096,
            blocks: BLOCKS,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    });
    let ctrl = Controller::with_device(
        Meter(model.clone()),
        ControllerOptions {
            page_backing: PageBacking::Small4K,
            shadow_doorbells: false,
            admin_timeout: Some(Duration::from_secs(5)),
            ready_timeout: Some(Duration::from_secs(5)),
            shutdown_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        },
    )
    .expect("bring-up on the model");
    let mut qp = ctrl
        .io_queue_pair(QueuePairOptions::default())
        .expect("queue pair");
    let mut buf = ctrl.alloc_dma(blocks as usize * 4096).expect("DMA buffer");
    let ns = ctrl.namespace(1).expect("namespace 1").clone();
    // Deterministic LBAs: a fixed xorshift sequence.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (BLOCKS / u64::from(blocks))) * u64::from(blocks)
    };
    let io = match (write, blocks) {
        (false, 1) => one_io::<false, 1>,
        (true, 1) => one_io::<true, 1>,
        _ => one_io::<false, 16>,
    };
    for _ in 0..WARMUP {
        buf = io(&mut qp, &ns, buf, next());
    }
    for _ in 0..n {
        buf = io(&mut qp, &ns, buf, next());
    }
    let stats = qp.stats();
    drop(buf);
    drop(qp);
    ctrl.close().expect("shutdown");
    assert_eq!(model.violations(), Vec::<String>::new(), "model violations");
    println!(
        "io_cost: {n} measured {workload} I/Os (+{WARMUP} warm-up), {} SQ and {} CQ doorbell MMIO writes",
        stats.sq_doorbell_mmio, stats.cq_doorbell_mmio
    );
}

//! The driver's own CPU work per I/O, for `cargo xtask cost`.
//!
//! `io_cost N [WORKLOAD]` runs `N` round trips of one workload — `read-4k`
//! (the default: one 4 KiB read, PRP1 only), `write-4k` (one 4 KiB write), or
//! `read-64k` (one 64 KiB read: PRP1 and a PRP List) — each a submit, then
//! `process_completions` until it is reaped — or `read-4k-qd32`: 32 reads
//! in flight, each completion's callback queueing the next read into its
//! buffer (the closed loop of an application at depth, as `upnvme perf`
//! runs it: the resubmissions wait for one doorbell, so completions are
//! reaped while commands are queued but not yet announced), `N` of them
//! measured. The queue pair's controller is the in-memory
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
    #[inline(never)]
    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.0.alloc_dma_device_read_only(len)
    }
    fn read_only_memory(&self) -> upnvme::ReadOnlyMemory {
        self.0.read_only_memory()
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

/// Commands in flight for `read-4k-qd32`.
const DEPTH: usize = 32;

/// One reap at depth: one `process_completions` call with the callback
/// `f`. Never inlined: the profiler collects inside it (its name matches
/// `*one_io*`). The callback is made outside (in [`at_depth`]) so that its
/// own name does not match the toggle too, which would switch collection
/// off inside it.
#[inline(never)]
fn one_io_round<F: FnMut(&mut IoQueuePair<Meter>, upnvme::Completion)>(
    qp: &mut IoQueuePair<Meter>,
    f: F,
) -> u32 {
    qp.process_completions(u32::MAX, f)
        .expect("process_completions")
}

/// `read-4k-qd32`: `DEPTH` reads primed, then `WARMUP` + `n` resubmissions
/// from the callbacks — each completion's callback queues the next 4 KiB
/// read into its buffer while more are due, else keeps the buffer — then
/// the drain (the same in every run, so the difference of two runs is `n`
/// I/Os).
fn at_depth(qp: &mut IoQueuePair<Meter>, ctrl: &Controller<Meter>, ns: &Namespace, n: u64) {
    let mut idle = Vec::with_capacity(DEPTH);
    for i in 0..DEPTH as u64 {
        let buf = ctrl.alloc_dma(4096).expect("DMA buffer");
        let cmd = IoCommand::Read {
            ns,
            slba: i,
            blocks: 1,
        };
        if let Err(f) = qp.submit(cmd, Some(buf), 7) {
            panic!("submit failed: {f}");
        }
    }
    let mut left = WARMUP + n;
    while idle.len() < DEPTH {
        one_io_round(qp, |qp, c| {
            if let Err(e) = c.result {
                panic!("read failed: {e:?}");
            }
            let buf = c.buffer.expect("the completion returns the buffer");
            if left == 0 {
                idle.push(buf);
                return;
            }
            left -= 1;
            // Deterministic LBAs, cheap: the harness's share stays small.
            let slba = left.wrapping_mul(7919) % BLOCKS;
            let cmd = IoCommand::Read {
                ns,
                slba,
                blocks: 1,
            };
            if let Err(f) = qp.queue(cmd, Some(buf), 7) {
                panic!("queue failed: {f}");
            }
        });
    }
    assert_eq!(left, 0);
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| {
            s.parse()
                .expect("usage: io_cost [N] [read-4k|write-4k|read-64k|read-4k-qd32]")
        })
        .unwrap_or(100_000);
    let workload = std::env::args().nth(2).unwrap_or_else(|| "read-4k".into());
    let (write, blocks) = match workload.as_str() {
        "read-4k" | "read-4k-qd32" => (false, 1u32),
        "write-4k" => (true, 1),
        "read-64k" => (false, 16),
        w => panic!("unknown workload {w}: read-4k, write-4k, read-64k or read-4k-qd32"),
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
    let ns = ctrl.namespace(1).expect("namespace 1").clone();
    if workload == "read-4k-qd32" {
        at_depth(&mut qp, &ctrl, &ns, n);
    } else {
        let mut buf = ctrl.alloc_dma(blocks as usize * 4096).expect("DMA buffer");
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
        drop(buf);
    }
    let stats = qp.stats();
    drop(qp);
    ctrl.close().expect("shutdown");
    assert_eq!(model.violations(), Vec::<String>::new(), "model violations");
    println!(
        "io_cost: {n} measured {workload} I/Os (+{WARMUP} warm-up), {} SQ and {} CQ doorbell MMIO writes",
        stats.sq_doorbell_mmio, stats.cq_doorbell_mmio
    );
}

//! Helpers shared by the host-side driver tests: building a model and a
//! driver on it, a register-access recorder, deterministic data patterns and
//! the end-of-test cleanliness check.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use upnvme::{Controller, ControllerOptions, Device, DmaBuffer};
use upnvme_dma::{DmaError, DmaMapper};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

/// Generous bound for blocking calls that are expected to succeed.
pub const T: Duration = Duration::from_secs(5);

/// Controller options every host test starts from: 4 KiB pages (the model's
/// DMA memory is ordinary memory), bounded waits.
///
/// Shadow doorbells on (the library's default is off): the host tests keep
/// the more involved doorbell mode (Doorbell Buffer Config, EventIdx) under
/// every fault they inject. MMIO-only doorbells, the default, are covered by
/// the tests that turn the buffer off, by the property tests (both modes)
/// and by the guest tests (which run the defaults).
pub fn opts() -> ControllerOptions {
    ControllerOptions {
        shadow_doorbells: true,
        ..upnvme_tests::host_options()
    }
}

/// Namespace `nsid` of `blocks` blocks of `lba_size` bytes, no metadata.
pub fn ns(nsid: u32, lba_size: u32, blocks: u64) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        lba_size,
        blocks,
        ..NamespaceConfig::default()
    }
}

/// A model with one namespace of `lba_size`-byte blocks (`blocks` of them).
pub fn config_one_ns(lba_size: u32, blocks: u64) -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size,
            blocks,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    }
}

/// A default model (one 64 MiB namespace of 4 KiB blocks).
pub fn model() -> ModelController {
    ModelController::new(ModelConfig::default())
}

/// Brings a driver up on (a clone of) `model`.
pub fn open(model: &ModelController, options: ControllerOptions) -> Controller<ModelController> {
    Controller::with_device(model.clone(), options).expect("bring-up on the model")
}

/// Model + driver with the default options of these tests.
pub fn setup(cfg: ModelConfig) -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(cfg);
    let c = open(&m, opts());
    (m, c)
}

/// Asserts that the driver never broke a spec rule the model checks and
/// never made the model touch unmapped memory.
#[track_caller]
pub fn assert_clean(m: &ModelController) {
    assert_eq!(m.violations(), Vec::<String>::new(), "model violations");
    assert_eq!(m.dma_faults(), 0, "DMA faults: {:?}", m.dma_fault_log());
}

/// Deterministic, seed- and position-dependent bytes (xorshift).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A DMA buffer of `data.len()` bytes holding `data`.
pub fn buffer_with<D: upnvme::Device>(c: &Controller<D>, data: &[u8]) -> DmaBuffer {
    let b = c.alloc_dma(data.len()).expect("alloc_dma");
    b.write_bytes(0, data).expect("write_bytes");
    b
}

/// The first `len` bytes of `buf`.
pub fn read_back(buf: &DmaBuffer, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    buf.read_bytes(0, &mut v).expect("read_bytes");
    v
}

/// Submits one-block reads of namespace 1 at LBAs `0..n`, tag = LBA, each
/// with a fresh 4 KiB buffer.
pub fn submit_reads(
    c: &Controller<ModelController>,
    qp: &mut upnvme::IoQueuePair<ModelController>,
    n: u64,
) {
    let ns = c.namespace(1).unwrap().clone();
    for tag in 0..n {
        let buf = c.alloc_dma(4096).unwrap();
        qp.submit(
            upnvme::IoCommand::Read {
                ns: &ns,
                slba: tag,
                blocks: 1,
            },
            Some(buf),
            tag,
        )
        .unwrap();
    }
}

/// One register or doorbell access seen by [`Spy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// 32-bit read (offset, value returned).
    R32(usize, u32),
    /// 32-bit write (offset, value).
    W32(usize, u32),
    /// 64-bit read (offset, value returned).
    R64(usize, u64),
    /// 64-bit write (offset, value).
    W64(usize, u64),
}

/// Runs `f` as the device's own work: allocation counting leaves it out.
fn in_device<R>(f: impl FnOnce() -> R) -> R {
    upnvme_dma::alloc_count::excluded(f)
}

/// What a test device in front of the model intercepts. Every method
/// defaults to the model's; [`Front`] makes the device of it.
pub trait Hooks: Send + Sync + 'static {
    /// The model behind the device.
    fn model(&self) -> &ModelController;
    /// Runs `call`, each [`upnvme::Device`] call of [`Front`], hooked or
    /// not. The default runs it as is.
    fn around<R>(&self, call: impl FnOnce() -> R) -> R {
        call()
    }
    /// [`upnvme::Device::read32`].
    fn read32(&self, offset: usize) -> u32 {
        self.model().read32(offset)
    }
    /// [`upnvme::Device::write32`].
    fn write32(&self, offset: usize, value: u32) {
        self.model().write32(offset, value)
    }
    /// [`upnvme::Device::read64`].
    fn read64(&self, offset: usize) -> u64 {
        self.model().read64(offset)
    }
    /// [`upnvme::Device::write64`].
    fn write64(&self, offset: usize, value: u64) {
        self.model().write64(offset, value)
    }
    /// [`upnvme::Device::bar_len`].
    fn bar_len(&self) -> usize {
        self.model().bar_len()
    }
    /// [`upnvme::Device::dma_mapper`].
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        self.model().dma_mapper()
    }
    /// [`upnvme::Device::release`].
    fn release(&self) -> bool {
        self.model().release()
    }
}

/// The [`upnvme::Device`] of hooks `H`: the calls [`Hooks`] has go to `H`,
/// the others (`alloc_dma`, `alloc_dma_device_read_only`,
/// `read_only_memory`, `name`, `release_request`) to its model; every one
/// through [`Hooks::around`].
#[derive(Clone)]
pub struct Front<H>(pub H);

impl<H: Hooks> upnvme::Device for Front<H> {
    fn read32(&self, offset: usize) -> u32 {
        self.0.around(|| self.0.read32(offset))
    }
    fn write32(&self, offset: usize, value: u32) {
        self.0.around(|| self.0.write32(offset, value))
    }
    fn read64(&self, offset: usize) -> u64 {
        self.0.around(|| self.0.read64(offset))
    }
    fn write64(&self, offset: usize, value: u64) {
        self.0.around(|| self.0.write64(offset, value))
    }
    fn bar_len(&self) -> usize {
        self.0.around(|| self.0.bar_len())
    }
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.0.around(|| self.0.model().alloc_dma(len))
    }
    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.0
            .around(|| self.0.model().alloc_dma_device_read_only(len))
    }
    fn read_only_memory(&self) -> upnvme::ReadOnlyMemory {
        self.0.around(|| self.0.model().read_only_memory())
    }
    fn name(&self) -> String {
        self.0.around(|| self.0.model().name())
    }
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        self.0.around(|| self.0.dma_mapper())
    }
    fn release_request(&self) -> Option<Arc<dyn upnvme::ReleaseRequest>> {
        self.0.around(|| self.0.model().release_request())
    }
    fn release(&self) -> bool {
        self.0.around(|| self.0.release())
    }
}

/// A [`upnvme::Device`] that forwards to the model and records every
/// register access in order. Its device calls run outside allocation
/// counting. It has no DMA mapper and its `release` is refused (returns
/// false): tests use it as a device that cannot take application memory or
/// be released.
pub type Spy = Front<Recorder>;

/// The [`Hooks`] of a [`Spy`].
#[derive(Clone)]
pub struct Recorder {
    model: ModelController,
    log: Arc<Mutex<Vec<Access>>>,
}

impl Spy {
    /// A recorder in front of `model`.
    pub fn new(model: ModelController) -> Spy {
        Front(Recorder {
            model,
            log: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The accesses recorded so far.
    pub fn log(&self) -> Vec<Access> {
        self.0.log.lock().unwrap().clone()
    }

    /// Forgets the accesses recorded so far.
    pub fn clear(&self) {
        self.0.log.lock().unwrap().clear();
    }
}

impl Recorder {
    fn push(&self, a: Access) {
        self.log.lock().unwrap().push(a);
    }
}

impl Hooks for Recorder {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn around<R>(&self, call: impl FnOnce() -> R) -> R {
        in_device(call)
    }
    fn read32(&self, offset: usize) -> u32 {
        let v = self.model.read32(offset);
        self.push(Access::R32(offset, v));
        v
    }
    fn write32(&self, offset: usize, value: u32) {
        self.push(Access::W32(offset, value));
        self.model.write32(offset, value);
    }
    fn read64(&self, offset: usize) -> u64 {
        let v = self.model.read64(offset);
        self.push(Access::R64(offset, v));
        v
    }
    fn write64(&self, offset: usize, value: u64) {
        self.push(Access::W64(offset, value));
        self.model.write64(offset, value);
    }
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        None
    }
    fn release(&self) -> bool {
        false
    }
}

/// Register offsets (NVMe Base Specification 2.0, §3.1.3).
pub mod reg {
    /// Controller Capabilities.
    pub const CAP: usize = 0x00;
    /// Controller Configuration.
    pub const CC: usize = 0x14;
    /// Controller Status.
    pub const CSTS: usize = 0x1c;
    /// Admin Queue Attributes.
    pub const AQA: usize = 0x24;
    /// Admin Submission Queue Base Address.
    pub const ASQ: usize = 0x28;
    /// Admin Completion Queue Base Address.
    pub const ACQ: usize = 0x30;
    /// First doorbell (SQ 0 tail).
    pub const DOORBELLS: usize = 0x1000;
}

/// Admin opcodes (NVMe Base Specification 2.0, §5).
pub mod admin_op {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const AER: u8 = 0x0c;
    /// Doorbell Buffer Config.
    pub const DBBC: u8 = 0x7c;
}

/// I/O opcodes (NVM Command Set Specification 1.0).
pub mod io_op {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DSM: u8 = 0x09;
}

/// Polls `qp` until one completion arrives (bounded).
pub fn wait_one(qp: &mut upnvme::IoQueuePair<ModelController>) -> upnvme::Completion {
    for _ in 0..1_000_000 {
        if let Some(c) = qp.next_completion().expect("next_completion") {
            return c;
        }
    }
    panic!("no completion");
}

/// Submits `cmd` with `io` (tag 7) and waits for its completion; panics if
/// the command is refused.
pub fn run_io(
    qp: &mut upnvme::IoQueuePair<ModelController>,
    cmd: upnvme::IoCommand<'_>,
    io: upnvme::IoData,
) -> upnvme::Completion {
    if let Err(r) = qp.submit_io(cmd, io, 7) {
        panic!("{} refused: {}", cmd.name(), r.reason);
    }
    let c = wait_one(qp);
    assert_eq!(c.tag, 7);
    c
}

/// xorshift64*: deterministic, dependency-free randomness for layout and
/// workload draws.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// 0..n (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// One of `xs` (not empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// The (SLBA, blocks) of every command queue `qid` fetched since the
/// model's fetch count was `from` (at most the last 64 commands), in
/// fetch order.
pub fn fetched_since(m: &ModelController, qid: u16, from: u64) -> Vec<(u64, u32)> {
    let n = (m.commands_fetched() - from) as usize;
    let recent = m.recent_commands();
    assert!(n <= recent.len(), "more commands than the model keeps");
    recent[recent.len() - n..]
        .iter()
        .filter(|(q, _)| *q == qid)
        .map(|(_, sqe)| {
            let slba = u64::from_le_bytes(sqe[40..48].try_into().unwrap());
            let nlb = u16::from_le_bytes(sqe[48..50].try_into().unwrap());
            (slba, u32::from(nlb) + 1)
        })
        .collect()
}

/// A device that cannot be stopped once `stubborn` is set: CC writes that
/// clear EN are dropped (CSTS.RDY stays 1), and `release` always reports
/// that DMA may go on — what the driver must survive when the kernel asks
/// for a controller it cannot quiesce.
#[derive(Clone)]
pub struct Unstoppable {
    /// The model behind it.
    pub model: ModelController,
    /// Set: CC.EN = 0 is ignored.
    pub stubborn: Arc<std::sync::atomic::AtomicBool>,
}

impl Unstoppable {
    /// In front of `model`, not stubborn yet.
    pub fn new(model: &ModelController) -> Unstoppable {
        Unstoppable {
            model: model.clone(),
            stubborn: Arc::default(),
        }
    }
}

impl Hooks for Unstoppable {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn write32(&self, o: usize, v: u32) {
        if o == reg::CC && v & 1 == 0 && self.stubborn.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.model.write32(o, v)
    }
    fn release(&self) -> bool {
        false
    }
}

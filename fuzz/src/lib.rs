//! Helpers shared by the fuzz targets: a byte reader that never fails (it
//! yields zeros once the input is exhausted) and the controller options every
//! target starts from (4 KiB DMA pages, short bounded waits).

use std::time::Duration;

use upnvme::{ControllerOptions, PageBacking};

/// Reads fuzzer bytes as small integers; past the end every read is 0.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    /// True once every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A boolean.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u32) -> u32 {
        if n <= 256 {
            u32::from(self.u8()) % n
        } else {
            self.u32() % n
        }
    }

    /// Up to `max` bytes (the count is read first, then the bytes).
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let want = usize::from(self.u16()) % (max + 1);
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(want).min(self.data.len());
        self.pos = start.saturating_add(want);
        &self.data[start..end]
    }
}

/// Controller options for the fuzz targets: ordinary 4 KiB memory (the model
/// needs no hugepages) and waits short enough that a stuck command costs
/// milliseconds, not seconds.
pub fn options() -> ControllerOptions {
    ControllerOptions {
        page_backing: PageBacking::Small4K,
        ready_timeout: Some(Duration::from_millis(50)),
        admin_timeout: Some(Duration::from_millis(50)),
        shutdown_timeout: Some(Duration::from_millis(50)),
        ..Default::default()
    }
}

/// A check for a driver bug that was found by fuzzing and reported but is not
/// fixed yet (`id` names it in fuzz/README.md). In strict mode for `id` it
/// fails like `assert!`; otherwise it is skipped so that the fuzzer keeps
/// looking for new problems and the short CI run stays green until the fix
/// lands.
pub fn known_issue(id: &str, ok: bool, what: impl FnOnce() -> String) {
    if !ok && strict(id) {
        panic!("{id}: {}", what());
    }
}

/// Whether known finding `id` is checked strictly: `UPNVME_FUZZ_STRICT` is
/// `1` or `all`, or a comma-separated list that names `id` (`KNOWN-1,KNOWN-6`).
pub fn strict(id: &str) -> bool {
    static STRICT: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let list = STRICT.get_or_init(|| {
        std::env::var("UPNVME_FUZZ_STRICT")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    list.iter().any(|s| s == "1" || s == "all" || s == id)
}

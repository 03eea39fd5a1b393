//! `upnvme read` / `upnvme write`: byte-exact block I/O between a file (or
//! stdin/stdout) and a namespace, split into transfers of at most MDTS.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use upnvme::{Controller, Namespace, QueuePairOptions};

const TIMEOUT: Duration = Duration::from_secs(30);

fn chunk_blocks(c: &Controller, lba: usize, total: u64) -> u32 {
    let max = c.max_transfer_bytes().unwrap_or(2 << 20).min(2 << 20);
    ((max / lba) as u64).min(total).max(1) as u32
}

/// The namespace handle and its LBA size, once the range is checked.
fn check_range(c: &Controller, nsid: u32, start: u64, count: u64) -> Result<(&Namespace, usize)> {
    let ns = c.namespace(nsid)?;
    if count == 0 {
        bail!("--block-count must be at least 1");
    }
    match start.checked_add(count) {
        Some(end) if end <= ns.lba_count() => Ok((ns, ns.lba_size() as usize)),
        _ => bail!(
            "blocks {start}..+{count} are outside namespace {nsid} ({} blocks)",
            ns.lba_count()
        ),
    }
}

/// Reads `count` blocks from `start` to `out` (stdout when `None`).
pub fn read(c: &Controller, nsid: u32, start: u64, count: u64, out: Option<&Path>) -> Result<()> {
    let (ns, lba) = check_range(c, nsid, start, count)?;
    let mut sink: Box<dyn Write> = match out {
        Some(p) => Box::new(File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    let per = chunk_blocks(c, lba, count);
    let mut buf = c.alloc_dma(per as usize * lba)?;
    let mut data = vec![0u8; per as usize * lba];
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(per as u64) as u32;
        buf = qp
            .read_blocking(ns, start + done, n, buf, TIMEOUT)
            .map_err(|e| anyhow::anyhow!("read at LBA {}: {e}", start + done))?;
        let bytes = n as usize * lba;
        buf.read_bytes(0, &mut data[..bytes])?;
        sink.write_all(&data[..bytes])?;
        done += n as u64;
    }
    sink.flush()?;
    Ok(())
}

/// Writes `count` blocks at `start` from `input` (stdin when `None`). The
/// input must supply exactly `count × LBA size` bytes; a short input is an
/// error before anything is written past it (the last partial block is not
/// padded silently).
pub fn write(
    c: &Controller,
    nsid: u32,
    start: u64,
    count: u64,
    input: Option<&Path>,
) -> Result<()> {
    let (ns, lba) = check_range(c, nsid, start, count)?;
    let mut src: Box<dyn Read> = match input {
        Some(p) => Box::new(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    let per = chunk_blocks(c, lba, count);
    let mut buf = c.alloc_dma(per as usize * lba)?;
    let mut data = vec![0u8; per as usize * lba];
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(per as u64) as u32;
        let bytes = n as usize * lba;
        src.read_exact(&mut data[..bytes]).with_context(|| {
            format!(
                "input ended before {} bytes ({count} blocks of {lba}) were read",
                count as usize * lba
            )
        })?;
        buf.write_bytes(0, &data[..bytes])?;
        buf = qp
            .write_blocking(ns, start + done, n, buf, TIMEOUT)
            .map_err(|e| anyhow::anyhow!("write at LBA {}: {e}", start + done))?;
        done += n as u64;
    }
    Ok(())
}

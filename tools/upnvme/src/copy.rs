//! `upnvme copy`: the NVM Command Set's Copy command (opcode 19h), as
//! nvme-cli's `copy`: source ranges copied, in order, to consecutive blocks
//! of the destination namespace; with `--snsids`, a cross-namespace Copy
//! (Copy Descriptor Format 2h/3h) whose ranges name their namespaces.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use upnvme::{Controller, CopyRange, CopySource, IoCommand, IoData, Namespace, QueuePairOptions};

use crate::rw::number;
use crate::usage::{no_such_namespace_is_usage, usage};

/// How long the Copy may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `upnvme copy`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Destination namespace ID, decimal or 0x-prefixed hex.
    #[arg(short, long, default_value_t = 1, value_parser = number::<u32>)]
    pub nsid: u32,
    /// Starting Destination LBA (SDLBA).
    #[arg(long = "sdlba", value_parser = number::<u64>)]
    pub sdlba: u64,
    /// Each source range's starting LBA, comma-separated.
    #[arg(short = 's', long = "slbs", value_delimiter = ',', required = true,
          value_parser = number::<u64>)]
    pub slbs: Vec<u64>,
    /// Each source range's number of blocks, comma-separated, 1-based
    /// (nvme-cli's --blocks is 0-based: 1 here is its 0).
    #[arg(short = 'b', long = "blocks", value_delimiter = ',', required = true,
          value_parser = number::<u32>)]
    pub blocks: Vec<u32>,
    /// Each source range's namespace ID (SNSID), comma-separated: makes it a
    /// cross-namespace Copy (Descriptor Format 2h, or 3h on a 32- or 64-bit
    /// guard destination), which the controller must report in Identify
    /// Controller OCFS.
    #[arg(short = 'N', long = "snsids", value_delimiter = ',', value_parser = number::<u32>)]
    pub snsids: Option<Vec<u32>>,
}

/// Sends the Copy and waits for it; prints what it copied.
pub fn copy(c: &Controller, a: &CopyArgs) -> Result<()> {
    if a.slbs.len() != a.blocks.len() {
        return Err(usage(format!(
            "--slbs names {} ranges and --blocks {}: give one block count per starting LBA",
            a.slbs.len(),
            a.blocks.len()
        ))
        .into());
    }
    if let Some(s) = &a.snsids
        && s.len() != a.slbs.len()
    {
        return Err(usage(format!(
            "--snsids names {} namespaces for {} ranges: give one per range",
            s.len(),
            a.slbs.len()
        ))
        .into());
    }
    if let Some(b) = a.blocks.iter().find(|&&b| b == 0) {
        return Err(usage(format!(
            "--blocks {b}: each range holds at least 1 block (the counts are 1-based)"
        ))
        .into());
    }
    let ns = c.namespace(a.nsid).map_err(no_such_namespace_is_usage)?;
    let sources: Vec<&Namespace> = match &a.snsids {
        Some(ids) => ids
            .iter()
            .map(|&id| c.namespace(id).map_err(no_such_namespace_is_usage))
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let ranges: Vec<CopyRange> = a
        .slbs
        .iter()
        .zip(&a.blocks)
        .map(|(&slba, &blocks)| CopyRange { slba, blocks })
        .collect();
    let cross: Vec<CopySource<'_>> = sources
        .iter()
        .zip(&ranges)
        .map(|(&ns, r)| CopySource {
            ns,
            slba: r.slba,
            blocks: r.blocks,
        })
        .collect();
    let cmd = if a.snsids.is_some() {
        IoCommand::CrossNamespaceCopy {
            ns,
            sdlba: a.sdlba,
            sources: &cross,
        }
    } else {
        IoCommand::Copy {
            ns,
            sdlba: a.sdlba,
            ranges: &ranges,
        }
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    // A refusal sends nothing: bad input for this controller (exit 2).
    qp.submit_io(cmd, IoData::none(), 0)
        .map_err(|r| usage(format!("Copy: {}", qp.describe(r.reason))))?;
    let until = Instant::now() + TIMEOUT;
    let done = loop {
        if let Some(done) = qp.next_completion()? {
            break done;
        }
        if Instant::now() > until {
            bail!("Copy: no completion within {TIMEOUT:?}");
        }
    };
    done.result.map_err(|e| anyhow!("Copy: {e}"))?;
    let total: u64 = a.blocks.iter().map(|&b| u64::from(b)).sum();
    outln!(
        "copied {total} blocks from {} range(s) to namespace {} LBAs {}..={}",
        ranges.len(),
        a.nsid,
        a.sdlba,
        a.sdlba + total - 1
    );
    Ok(())
}

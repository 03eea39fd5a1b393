//! `upnvme read` / `upnvme write`: byte-exact block I/O between a file (or
//! stdin/stdout) and a namespace, split into transfers of at most MDTS —
//! with the blocks' metadata in a file of its own (`--metadata`) and the
//! protection information fields (`--prinfo`, `--ref-tag`, `--app-tag`,
//! `--app-tag-mask`, as nvme-cli's read/write) on formats that have them.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::usage::usage;
use upnvme::{
    Completion, Controller, DmaBuffer, IoCommand, IoData, IoQueuePair, Namespace, Protection,
    QueuePairOptions,
};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Metadata and protection options of `read` / `write`.
#[derive(clap::Args, Debug, Default)]
pub struct MetadataArgs {
    /// File with the blocks' metadata (block-count × MS bytes, block by
    /// block), for namespaces whose LBA format has metadata: written from it,
    /// or read into it. The tool interleaves it for extended-LBA formats.
    #[arg(long)]
    pub metadata: Option<PathBuf>,
    /// PRINFO, as nvme-cli: bit 3 PRACT (the controller inserts/strips the
    /// PI), bits 2..0 PRCHK (check guard, application tag, reference tag).
    /// E.g. 8 = PRACT only, 15 = PRACT with every check, 5 = host PI with
    /// guard and reference tag checks.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..16))]
    pub prinfo: u8,
    /// Initial (expected) logical block reference tag (default: the lower
    /// 32 bits of the start block, or 48 with a 64-bit guard, as Type 1
    /// requires). Decimal or 0x-prefixed hexadecimal.
    #[arg(long, value_parser = number::<u64>)]
    pub ref_tag: Option<u64>,
    /// (Expected) logical block application tag (decimal or 0x…).
    #[arg(long, default_value_t = 0, value_parser = number::<u16>)]
    pub app_tag: u16,
    /// Application tag mask: which bits are checked (decimal or 0x…).
    #[arg(long, default_value_t = 0, value_parser = number::<u16>)]
    pub app_tag_mask: u16,
}

/// A decimal or `0x`-prefixed hexadecimal number, as nvme-cli takes tags.
pub(crate) fn number<T: TryFrom<u64>>(s: &str) -> std::result::Result<T, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|e| format!("'{s}' is not a decimal or 0x-prefixed hexadecimal number: {e}"))?;
    T::try_from(v).map_err(|_| format!("{s} is too large for this field"))
}

impl MetadataArgs {
    fn protection(&self) -> Option<Protection> {
        let any = self.prinfo != 0
            || self.ref_tag.is_some()
            || self.app_tag != 0
            || self.app_tag_mask != 0;
        any.then_some(Protection {
            pract: self.prinfo & 8 != 0,
            check_guard: self.prinfo & 4 != 0,
            check_app_tag: self.prinfo & 2 != 0,
            check_ref_tag: self.prinfo & 1 != 0,
            ref_tag: self.ref_tag,
            app_tag: self.app_tag,
            app_tag_mask: self.app_tag_mask,
        })
    }

    /// The protection fields of the command that starts `done` blocks into
    /// the transfer. A `--ref-tag` names the first block's tag; a later
    /// chunk's first block expects that tag plus the blocks before it
    /// (Type 1 and 2 tags advance by one per block, wrapping at the
    /// format's tag width, `tag_max`). A tag above `tag_max` is passed on
    /// unchanged for the driver to refuse.
    fn protection_at(&self, done: u64, tag_max: u64) -> Option<Protection> {
        let mut p = self.protection()?;
        if let Some(t) = p.ref_tag
            && t <= tag_max
        {
            p.ref_tag = Some(t.wrapping_add(done) & tag_max);
        }
        Some(p)
    }
}

/// What moves per block on this namespace with these options.
struct Shape {
    lba: usize,
    /// Metadata bytes that move per block (0: none).
    ms: usize,
    extended: bool,
}

fn shape(ns: &Namespace, m: &MetadataArgs) -> Result<Shape> {
    let lba = ns.lba_size() as usize;
    // Checked here, before any file is created or any I/O is sent (the
    // queue pair would refuse the first command with the same reason).
    if m.protection().is_some() && ns.metadata_layout().is_none_or(|l| l.pi_type == 0) {
        return Err(usage(format!(
            "namespace {} has no protection information (Identify Namespace DPS type 0): leave \
             out --prinfo, --ref-tag, --app-tag and --app-tag-mask",
            ns.id()
        ))
        .into());
    }
    if m.protection().is_some_and(|p| p.check_ref_tag)
        && ns.metadata_layout().is_some_and(|l| l.pi_type == 3)
    {
        return Err(usage(format!(
            "namespace {} has Type 3 protection, which has no reference tag to check: clear bit 0 \
             (PRCHK reference tag) of --prinfo",
            ns.id()
        ))
        .into());
    }
    let Some(layout) = ns.metadata_layout() else {
        if m.metadata.is_some() {
            return Err(usage(format!(
                "namespace {} has no metadata (LBAF.MS = 0): leave out --metadata",
                ns.id()
            ))
            .into());
        }
        return Ok(Shape {
            lba,
            ms: 0,
            extended: false,
        });
    };
    let pract = m.prinfo & 8 != 0;
    // The metadata is just the PI tuple (8 bytes, 16 with a 64-bit guard):
    // with PRACT the controller inserts and strips it.
    let tuple_only = layout.pi_type != 0 && usize::from(layout.ms) == layout.pif.tuple_size();
    let moves = !(tuple_only && pract);
    if moves && m.metadata.is_none() {
        return Err(usage(format!(
            "namespace {} has metadata ({layout}): pass --metadata FILE (block-count × {} bytes){}",
            ns.id(),
            layout.ms,
            if tuple_only {
                ", or --prinfo 8 (PRACT) to let the controller insert and strip the protection information"
            } else {
                ""
            }
        ))
        .into());
    }
    if !moves && m.metadata.is_some() {
        return Err(usage(
            "with PRACT and metadata that is just the protection information tuple no metadata moves: leave out --metadata",
        )
        .into());
    }
    Ok(Shape {
        lba,
        ms: if moves { usize::from(layout.ms) } else { 0 },
        extended: layout.extended,
    })
}

fn chunk_blocks(c: &Controller, per_block: usize, total: u64) -> u32 {
    let max = c.max_transfer_bytes().unwrap_or(2 << 20).min(2 << 20);
    ((max / per_block) as u64).min(total).max(1) as u32
}

/// The namespace handle, once the range is checked; bad arguments are
/// usage errors (exit status 2).
fn check_range(c: &Controller, nsid: u32, start: u64, count: u64) -> Result<&Namespace> {
    let ns = c
        .namespace(nsid)
        .map_err(crate::usage::no_such_namespace_is_usage)?;
    if count == 0 {
        return Err(usage("--block-count must be at least 1").into());
    }
    match start.checked_add(count) {
        Some(end) if end <= ns.lba_count() => Ok(ns),
        _ => Err(usage(format!(
            "blocks {start}..+{count} are outside namespace {nsid} ({} blocks)",
            ns.lba_count()
        ))
        .into()),
    }
}

/// Submits one command and waits for it (bounded by [`TIMEOUT`]).
fn run(qp: &mut IoQueuePair, cmd: IoCommand<'_>, io: IoData, slba: u64) -> Result<Completion> {
    // The command's blocks: a media error may be at any of them.
    let what = match cmd {
        IoCommand::Read { blocks, .. } | IoCommand::Write { blocks, .. } if blocks > 1 => format!(
            "{} of LBAs {slba}..={}",
            cmd.name(),
            slba + u64::from(blocks) - 1
        ),
        _ => format!("{} at LBA {slba}", cmd.name()),
    };
    qp.submit_io(cmd, io, 0)
        .map_err(|r| anyhow!("{what}: {}", qp.describe(r.reason)))?;
    let until = Instant::now() + TIMEOUT;
    loop {
        if let Some(c) = qp.next_completion()? {
            return match c.result {
                Ok(_) => Ok(c),
                Err(e) => Err(anyhow!("{what}: {e}")),
            };
        }
        if Instant::now() > until {
            bail!("{what}: no completion within {TIMEOUT:?}");
        }
    }
}

/// Where a chunk lies in the whole transfer: its first LBA and how many
/// blocks came before it.
#[derive(Clone, Copy)]
struct ChunkAt {
    slba: u64,
    done: u64,
}

/// Runs one chunk's command with its memory and protection fields; hands
/// the buffers back for the next chunk.
fn transfer(
    qp: &mut IoQueuePair,
    cmd: IoCommand<'_>,
    buf: DmaBuffer,
    md: Option<DmaBuffer>,
    m: &MetadataArgs,
    at: ChunkAt,
) -> Result<(DmaBuffer, Option<DmaBuffer>)> {
    let ChunkAt { slba, done } = at;
    let mut io = IoData::buffer(buf);
    if let Some(b) = md {
        io = io.metadata(b);
    }
    let tag_max = cmd
        .namespace()
        .metadata_layout()
        .map_or(u64::MAX, |l| l.pif.ref_tag_max());
    if let Some(p) = m.protection_at(done, tag_max) {
        io = io.protection(p);
    }
    let r = run(qp, cmd, io, slba)?;
    let buf = r
        .buffer
        .ok_or_else(|| anyhow!("completion without its buffer"))?;
    Ok((buf, r.metadata))
}

/// Buffers for one chunk: data (with interleaved metadata when extended)
/// and a separate metadata buffer.
fn buffers(c: &Controller, s: &Shape, per: u32) -> Result<(DmaBuffer, Option<DmaBuffer>)> {
    let n = per as usize;
    let data_len = n * s.lba + if s.extended { n * s.ms } else { 0 };
    let md = (!s.extended && s.ms > 0)
        .then(|| c.alloc_dma(n * s.ms))
        .transpose()?;
    Ok((c.alloc_dma(data_len)?, md))
}

/// `--data PATH` of `read` / `write`: `None` (stdout / stdin) for no path
/// or "-", as `set-feature --data -` and `admin-passthru -i -` take it (a
/// read with `--data -` wrote a file named "-" and printed nothing).
pub fn file_or_std(p: Option<&Path>) -> Option<&Path> {
    p.filter(|p| p.as_os_str() != "-")
}

/// Reads `count` blocks from `start` to `out` (stdout when `None`), and
/// their metadata to `--metadata`.
pub fn read(
    c: &Controller,
    nsid: u32,
    start: u64,
    count: u64,
    out: Option<&Path>,
    m: &MetadataArgs,
) -> Result<()> {
    let ns = check_range(c, nsid, start, count)?;
    let s = shape(ns, m)?;
    let mut sink: Box<dyn Write> = match out {
        Some(p) => Box::new(File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut md_sink = match &m.metadata {
        Some(p) => Some(File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => None,
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    let per = chunk_blocks(c, s.lba + s.ms, count);
    let (mut buf, mut md) = buffers(c, &s, per)?;
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(per as u64) as u32;
        let slba = start + done;
        let cmd = IoCommand::Read {
            ns,
            slba,
            blocks: n,
        };
        (buf, md) = transfer(&mut qp, cmd, buf, md, m, ChunkAt { slba, done })
            .map_err(|e| anyhow!("{e:#}{}", read_so_far(out, start, done)))?;
        let nb = n as usize;
        if s.extended && s.ms > 0 {
            let mut host = vec![0u8; nb * (s.lba + s.ms)];
            buf.read_bytes(0, &mut host)?;
            let mut meta = Vec::with_capacity(nb * s.ms);
            for block in host.chunks(s.lba + s.ms) {
                sink.write_all(&block[..s.lba])?;
                meta.extend_from_slice(&block[s.lba..]);
            }
            if let Some(f) = md_sink.as_mut() {
                f.write_all(&meta)?;
            }
        } else {
            let mut data = vec![0u8; nb * s.lba];
            buf.read_bytes(0, &mut data)?;
            sink.write_all(&data)?;
            if let (Some(f), Some(b)) = (md_sink.as_mut(), md.as_ref()) {
                let mut meta = vec![0u8; nb * s.ms];
                b.read_bytes(0, &mut meta)?;
                f.write_all(&meta)?;
            }
        }
        done += n as u64;
    }
    sink.flush()?;
    Ok(())
}

/// Writes `count` blocks at `start` from `input` (stdin when `None`), with
/// their metadata from `--metadata`. The input must supply exactly
/// `count × LBA size` bytes (and the metadata file `count × MS`); a short
/// input is an error before anything is written past it (the last partial
/// block is not padded silently).
pub fn write(
    c: &Controller,
    nsid: u32,
    start: u64,
    count: u64,
    input: Option<&Path>,
    m: &MetadataArgs,
) -> Result<()> {
    let ns = check_range(c, nsid, start, count)?;
    let s = shape(ns, m)?;
    // A regular file's size is checked before anything is written.
    let exact = |p: &Path, per_block: usize, what: &str| -> Result<()> {
        if p.is_dir() {
            return Err(usage(format!("{what} {} is a directory", p.display())).into());
        }
        let want = count * per_block as u64;
        if let Ok(md) = std::fs::metadata(p)
            && md.is_file()
            && md.len() != want
        {
            return Err(usage(format!(
                "{what} {} holds {} bytes; writing {count} blocks takes exactly {want} \
                 ({count} x {per_block}); nothing was written",
                p.display(),
                md.len()
            ))
            .into());
        }
        Ok(())
    };
    if let Some(p) = input {
        exact(p, s.lba, "input")?;
    }
    if let Some(p) = &m.metadata {
        exact(p, s.ms, "metadata file")?;
    }
    let mut src: Box<dyn Read> = match input {
        Some(p) => Box::new(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut md_src = match &m.metadata {
        Some(p) => Some(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => None,
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    let per = chunk_blocks(c, s.lba + s.ms, count);
    let (mut buf, mut md) = buffers(c, &s, per)?;
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(per as u64) as u32;
        let nb = n as usize;
        let slba = start + done;
        let mut data = vec![0u8; nb * s.lba];
        src.read_exact(&mut data).with_context(|| {
            format!(
                "input ended before {} bytes ({count} blocks of {}) were read{}",
                count as usize * s.lba,
                s.lba,
                written_so_far(start, done)
            )
        })?;
        let mut meta = vec![0u8; nb * s.ms];
        if let Some(f) = md_src.as_mut() {
            f.read_exact(&mut meta).with_context(|| {
                format!(
                    "the metadata file ended before {} bytes ({count} blocks of {}) were read{}",
                    count as usize * s.ms,
                    s.ms,
                    written_so_far(start, done)
                )
            })?;
        }
        if s.extended && s.ms > 0 {
            let host: Vec<u8> = data
                .chunks(s.lba)
                .zip(meta.chunks(s.ms))
                .flat_map(|(d, m)| d.iter().chain(m).copied())
                .collect();
            buf.write_bytes(0, &host)?;
        } else {
            buf.write_bytes(0, &data)?;
            if let Some(b) = md.as_ref() {
                b.write_bytes(0, &meta)?;
            }
        }
        let cmd = IoCommand::Write {
            ns,
            slba,
            blocks: n,
        };
        (buf, md) = transfer(&mut qp, cmd, buf, md, m, ChunkAt { slba, done })
            .map_err(|e| anyhow!("{e:#}{}", written_so_far(start, done)))?;
        done += n as u64;
    }
    // A pipe is checked at its end: more input than the blocks take is an
    // error too (the blocks were written).
    let mut more = [0u8; 1];
    if src.read(&mut more)? != 0 {
        bail!(
            "the input holds more than {} bytes ({count} blocks of {}); the {count} blocks were \
             written, the rest of the input was not",
            count as usize * s.lba,
            s.lba
        );
    }
    Ok(())
}

/// What a read that stopped at `done` blocks left in its output (a file, or
/// stdout when `None`), for its error message.
fn read_so_far(out: Option<&Path>, start: u64, done: u64) -> String {
    let to = out.map_or("stdout".to_string(), |p| p.display().to_string());
    if done == 0 {
        format!("; nothing was written to {to}")
    } else {
        format!(
            "; {to} holds LBAs {start}..={} ({done} blocks), nothing from LBA {} on",
            start + done - 1,
            start + done
        )
    }
}

/// What a write that stopped at `done` blocks left on the namespace, for
/// its error message.
fn written_so_far(start: u64, done: u64) -> String {
    if done == 0 {
        "; nothing was written".to_string()
    } else {
        format!(
            "; LBAs {start}..={} were written, nothing from LBA {} on",
            start + done - 1,
            start + done
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(prinfo: u8, ref_tag: Option<u64>) -> MetadataArgs {
        MetadataArgs {
            prinfo,
            ref_tag,
            ..MetadataArgs::default()
        }
    }

    #[test]
    fn a_given_reference_tag_advances_with_each_chunk() {
        let m = args(13, Some(100));
        let tag = |done, max| m.protection_at(done, max).unwrap().ref_tag;
        assert_eq!(tag(0, u64::from(u32::MAX)), Some(100));
        assert_eq!(tag(128, u64::from(u32::MAX)), Some(228));
        // Wraps at the format's width (32-bit tags with a 16-bit guard).
        let m = args(13, Some(u64::from(u32::MAX) - 1));
        assert_eq!(
            m.protection_at(3, u64::from(u32::MAX)).unwrap().ref_tag,
            Some(1)
        );
        // Out of range: left for the driver to refuse.
        let m = args(13, Some(1 << 40));
        assert_eq!(
            m.protection_at(8, u64::from(u32::MAX)).unwrap().ref_tag,
            Some(1 << 40)
        );
        // No tag given: the driver derives it from each chunk's SLBA.
        assert_eq!(
            args(13, None).protection_at(128, u64::MAX).unwrap().ref_tag,
            None
        );
        assert!(args(0, None).protection_at(128, u64::MAX).is_none());
    }

    #[test]
    fn tags_take_decimal_and_hex() {
        assert_eq!(number::<u16>("0x1234"), Ok(0x1234));
        assert_eq!(number::<u16>("4660"), Ok(0x1234));
        assert_eq!(
            number::<u64>("0XfFfF_ffff".replace('_', "").as_str()),
            Ok(0xffff_ffff)
        );
        assert!(number::<u16>("0x10000").unwrap_err().contains("too large"));
        assert!(number::<u16>("0xzz").unwrap_err().contains("hexadecimal"));
    }

    #[test]
    fn a_partial_read_says_what_its_output_holds() {
        assert_eq!(
            read_so_far(Some(Path::new("/tmp/o")), 10, 0),
            "; nothing was written to /tmp/o"
        );
        assert_eq!(
            read_so_far(None, 10, 512),
            "; stdout holds LBAs 10..=521 (512 blocks), nothing from LBA 522 on"
        );
    }

    #[test]
    fn a_dash_is_stdin_or_stdout() {
        assert_eq!(file_or_std(Some(Path::new("-"))), None);
        assert_eq!(file_or_std(None), None);
        assert_eq!(file_or_std(Some(Path::new("./-"))), Some(Path::new("./-")));
        assert_eq!(
            file_or_std(Some(Path::new("d.bin"))),
            Some(Path::new("d.bin"))
        );
    }

    #[test]
    fn a_partial_write_says_which_blocks_were_written() {
        assert_eq!(written_so_far(10, 0), "; nothing was written");
        assert_eq!(
            written_so_far(10, 512),
            "; LBAs 10..=521 were written, nothing from LBA 522 on"
        );
    }
}

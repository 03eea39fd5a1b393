//! perf on namespaces whose LBA format has metadata: the per-slot metadata
//! buffers (separate layout), the extended-LBA stride, the protection fields
//! of `-e` and the host-built PI (PRACT=0), so that the no-metadata hot path
//! pays one `Option` test for all of it.

use anyhow::Result;
use upnvme::pi::PiFormat;
use upnvme::{Controller, DmaBuffer, IoData, MetadataLayout, Protection};

/// Parses SPDK perf's `-e` value: `PRACT=0|1,PRCHK=GUARD|REFTAG|APPTAG`
/// (either part may be left out; PRCHK names joined by `|`).
pub fn parse_pi(s: &str) -> Result<Protection, String> {
    let mut p = Protection::default();
    if s.trim().is_empty() {
        return Err("empty: expected PRACT=0|1 and/or PRCHK=GUARD|REFTAG|APPTAG".into());
    }
    let mut seen: Vec<String> = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected PRACT=0|1 or PRCHK=GUARD|REFTAG|APPTAG"))?;
        let key = k.trim().to_ascii_uppercase();
        if seen.contains(&key) {
            return Err(format!("{key} given twice: name each once"));
        }
        seen.push(key.clone());
        match key.as_str() {
            "PRACT" => match v.trim() {
                "0" => p.pract = false,
                "1" => p.pract = true,
                other => return Err(format!("PRACT={other}: expected 0 or 1")),
            },
            "PRCHK" => {
                for c in v.split('|') {
                    match c.trim().to_ascii_uppercase().as_str() {
                        "GUARD" => p.check_guard = true,
                        "REFTAG" => p.check_ref_tag = true,
                        "APPTAG" => {
                            p.check_app_tag = true;
                            p.app_tag_mask = 0xffff;
                        }
                        other => {
                            return Err(format!(
                                "PRCHK `{other}`: expected GUARD, REFTAG or APPTAG"
                            ));
                        }
                    }
                }
            }
            other => return Err(format!("`{other}`: expected PRACT or PRCHK")),
        }
    }
    Ok(p)
}

/// What one job does about metadata on its namespace.
#[derive(Debug)]
pub struct MdWork {
    /// Data bytes per block.
    lba: usize,
    /// Metadata bytes per block that move (0 with PRACT when the metadata is the PI tuple).
    ms: usize,
    extended: bool,
    /// The separate metadata buffer of each slot (by tag), while the slot's
    /// command is not in flight.
    bufs: Vec<Option<DmaBuffer>>,
    protection: Option<Protection>,
    /// PI the host builds before each write (PRACT = 0 on a PI format).
    host_pi: Option<PiFormat>,
    scratch: Vec<u8>,
}

/// Bytes per block that move in the data buffer.
pub fn data_stride(lba: u32, layout: Option<MetadataLayout>, prot: Option<Protection>) -> usize {
    let lba = lba as usize;
    match layout {
        Some(l) if l.extended && moves(l, prot) => lba + usize::from(l.ms),
        _ => lba,
    }
}

/// Whether the metadata moves at all (not with PRACT when the metadata is
/// just the PI tuple).
fn moves(l: MetadataLayout, prot: Option<Protection>) -> bool {
    let pract = prot.is_some_and(|p| p.pract);
    !(l.pi_type != 0 && pract && usize::from(l.ms) == l.pif.tuple_size())
}

impl MdWork {
    /// `None` for a namespace without metadata and without `-e`.
    pub fn new(
        ctrl: &Controller,
        lba: u32,
        layout: Option<MetadataLayout>,
        prot: Option<Protection>,
        depth: u32,
        io_blocks: u32,
    ) -> Result<Option<Box<MdWork>>> {
        let Some(l) = layout else {
            return Ok(None);
        };
        let moving = moves(l, prot);
        let ms = if moving { usize::from(l.ms) } else { 0 };
        let bufs = if !l.extended && ms > 0 {
            (0..depth)
                .map(|_| ctrl.alloc_dma(io_blocks as usize * ms).map(Some))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let host_pi = match (l.pi_format(lba), prot) {
            (Some(f), Some(p)) if !p.pract => Some(f),
            _ => None,
        };
        Ok(Some(Box::new(MdWork {
            lba: lba as usize,
            ms,
            extended: l.extended,
            bufs,
            protection: prot,
            host_pi,
            scratch: Vec::new(),
        })))
    }

    /// The memory of the command in slot `tag` at `slba`: the data buffer,
    /// the slot's metadata buffer, the protection fields; with host PI the
    /// tuples are built first over the data as it now is.
    pub fn io(&mut self, buf: DmaBuffer, tag: u64, slba: u64, blocks: u32, write: bool) -> IoData {
        let md = self.bufs.get_mut(tag as usize).and_then(Option::take);
        if write && let Some(f) = self.host_pi {
            let p = self.protection.unwrap_or_default();
            let tag = p.ref_tag.unwrap_or(slba & f.pif.ref_tag_max());
            let n = blocks as usize;
            if self.extended {
                self.scratch.resize(n * (self.lba + self.ms), 0);
                if buf.read_bytes(0, &mut self.scratch).is_ok()
                    && f.protect_extended(&mut self.scratch, p.app_tag, tag)
                {
                    let _ = buf.write_bytes(0, &self.scratch);
                }
            } else if let Some(m) = md.as_ref() {
                self.scratch.resize(n * self.lba, 0);
                let mut meta = vec![0u8; n * self.ms];
                if buf.read_bytes(0, &mut self.scratch).is_ok()
                    && f.protect(&self.scratch, &mut meta, p.app_tag, tag)
                {
                    let _ = m.write_bytes(0, &meta);
                }
            }
        }
        let mut io = IoData::buffer(buf);
        if let Some(m) = md {
            io = io.metadata(m);
        }
        if let Some(p) = self.protection {
            io = io.protection(p);
        }
        io
    }

    /// The slot's metadata buffer, back from its completion.
    pub fn put_back(&mut self, tag: u64, md: DmaBuffer) {
        if let Some(slot) = self.bufs.get_mut(tag as usize) {
            *slot = Some(md);
        }
    }

    /// Bytes per block in the data buffer.
    pub fn stride(&self) -> usize {
        self.lba + if self.extended { self.ms } else { 0 }
    }
}

/// The memory of a `blocks`-block read on `ns` for `--verify`.
pub fn read_memory(
    ctrl: &Controller,
    ns: &upnvme::Namespace,
    blocks: u32,
    prot: Option<Protection>,
) -> Result<IoData> {
    let layout = ns.metadata_layout();
    let stride = data_stride(ns.lba_size(), layout, prot);
    let mut io = IoData::buffer(ctrl.alloc_dma(blocks as usize * stride)?);
    if let Some(l) = layout
        && !l.extended
        && moves(l, prot)
    {
        io = io.metadata(ctrl.alloc_dma(blocks as usize * usize::from(l.ms))?);
    }
    if let Some(p) = prot {
        io = io.protection(p);
    }
    Ok(io)
}

/// Submits one command and waits (30 s at most) for its completion.
pub fn run_one(
    q: &mut upnvme::IoQueuePair,
    cmd: upnvme::IoCommand<'_>,
    io: IoData,
) -> Result<upnvme::Completion> {
    if let Err(r) = q.submit_io(cmd, io, 0) {
        anyhow::bail!("{} refused: {}", cmd.name(), q.describe(r.reason));
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(c) = q.next_completion()? {
            return Ok(c);
        }
        if std::time::Instant::now() > until {
            anyhow::bail!("{}: no completion within 30 s", cmd.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_flags_parse_as_spdk_perf_writes_them() {
        let p = parse_pi("PRACT=1,PRCHK=GUARD|REFTAG").unwrap();
        assert!(p.pract && p.check_guard && p.check_ref_tag && !p.check_app_tag);
        let p = parse_pi("PRCHK=APPTAG").unwrap();
        assert!(!p.pract && p.check_app_tag && p.app_tag_mask == 0xffff);
        assert_eq!(parse_pi("PRACT=0").unwrap(), Protection::default());
        assert!(parse_pi("PRACT=2").unwrap_err().contains("expected 0 or 1"));
        assert!(parse_pi("PRCHK=CRC").unwrap_err().contains("GUARD"));
        assert!(parse_pi("FOO=1").unwrap_err().contains("PRACT or PRCHK"));
        assert!(parse_pi("PRACT").unwrap_err().contains("expected"));
        assert!(parse_pi("").unwrap_err().starts_with("empty"));
        assert!(parse_pi(" ").unwrap_err().starts_with("empty"));
        assert!(
            parse_pi("PRACT=1,pract=0")
                .unwrap_err()
                .contains("PRACT given twice")
        );
    }
}

//! Just enough ELF64 parsing to tell static from dynamic executables and to find the PVH
//! entry note in a vmlinux.

use anyhow::{Result, bail};

const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit PVH entry point QEMU boots through.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
const EM_X86_64: u16 = 62;

/// One program header.
#[derive(Debug, Clone, Copy)]
struct Phdr {
    kind: u32,
    offset: u64,
    filesz: u64,
}

fn u16_at(d: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(d: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(d: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(o..o + 8)?.try_into().ok()?))
}

/// Checks that `data` is a little-endian x86-64 ELF64 file.
pub fn check_x86_64(data: &[u8]) -> Result<()> {
    if data.get(..4) != Some(b"\x7fELF") {
        bail!("not an ELF file");
    }
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        bail!("not a little-endian 64-bit ELF file");
    }
    if u16_at(data, 0x12) != Some(EM_X86_64) {
        bail!("not an x86-64 ELF file");
    }
    Ok(())
}

fn program_headers(data: &[u8]) -> Result<Vec<Phdr>> {
    check_x86_64(data)?;
    let bad = || anyhow::anyhow!("truncated ELF program header table");
    let phoff = usize::try_from(u64_at(data, 0x20).ok_or_else(bad)?)?;
    let entsize = usize::from(u16_at(data, 0x36).ok_or_else(bad)?);
    let num = usize::from(u16_at(data, 0x38).ok_or_else(bad)?);
    if entsize < 56 {
        bail!("bad ELF program header size {entsize}");
    }
    (0..num)
        .map(|i| {
            let o = phoff + i * entsize;
            Ok(Phdr {
                kind: u32_at(data, o).ok_or_else(bad)?,
                offset: u64_at(data, o + 8).ok_or_else(bad)?,
                filesz: u64_at(data, o + 32).ok_or_else(bad)?,
            })
        })
        .collect()
}

/// True when the x86-64 ELF executable has no program interpreter, i.e. is statically linked.
pub fn is_static(data: &[u8]) -> Result<bool> {
    Ok(!program_headers(data)?.iter().any(|p| p.kind == PT_INTERP))
}

/// True when the ELF file carries a Xen `PHYS32_ENTRY` note, which QEMU needs to boot it
/// directly through PVH.
pub fn has_pvh_note(data: &[u8]) -> Result<bool> {
    for p in program_headers(data)?
        .into_iter()
        .filter(|p| p.kind == PT_NOTE)
    {
        let start = usize::try_from(p.offset)?;
        let end = start.saturating_add(usize::try_from(p.filesz)?);
        let Some(mut notes) = data.get(start..end) else {
            bail!("ELF note segment out of bounds");
        };
        while notes.len() >= 12 {
            let namesz = u32_at(notes, 0).unwrap_or(0) as usize;
            let descsz = u32_at(notes, 4).unwrap_or(0) as usize;
            let kind = u32_at(notes, 8).unwrap_or(0);
            let name_end = 12 + namesz;
            let next = 12 + namesz.next_multiple_of(4) + descsz.next_multiple_of(4);
            if notes.get(12..name_end) == Some(b"Xen\0") && kind == XEN_ELFNOTE_PHYS32_ENTRY {
                return Ok(true);
            }
            if next > notes.len() {
                break;
            }
            notes = &notes[next..];
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image with the given program headers (kind, payload).
    fn image(segments: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut d = vec![0u8; 64];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        d[0x12..0x14].copy_from_slice(&EM_X86_64.to_le_bytes());
        d[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        d[0x38..0x3a].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        let mut payload_off = 64 + 56 * segments.len();
        let mut payloads = Vec::new();
        for (kind, data) in segments {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&kind.to_le_bytes());
            ph[8..16].copy_from_slice(&(payload_off as u64).to_le_bytes());
            ph[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
            d.extend_from_slice(&ph);
            payloads.extend_from_slice(data);
            payload_off += data.len();
        }
        d.extend_from_slice(&payloads);
        d
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend_from_slice(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    #[test]
    fn static_vs_dynamic() {
        assert!(is_static(&image(&[(1, vec![0; 8])])).unwrap());
        assert!(
            !is_static(&image(&[(
                PT_INTERP,
                b"/lib64/ld-linux-x86-64.so.2\0".to_vec()
            )]))
            .unwrap()
        );
        assert!(is_static(b"#!/bin/sh\n").is_err());
    }

    #[test]
    fn pvh_note() {
        let mut notes = note(b"Xen\0", 6, b"linux\0");
        assert!(!has_pvh_note(&image(&[(PT_NOTE, notes.clone())])).unwrap());
        notes.extend(note(b"Xen\0", XEN_ELFNOTE_PHYS32_ENTRY, &[0, 0, 0, 1]));
        assert!(has_pvh_note(&image(&[(PT_NOTE, notes)])).unwrap());
        assert!(!has_pvh_note(&image(&[(PT_NOTE, note(b"GNU\0", 18, &[0; 4]))])).unwrap());
    }

    #[test]
    fn host_binaries() {
        // The running test binary is a dynamically linked x86-64 executable.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        check_x86_64(&me).unwrap();
        assert!(!is_static(&me).unwrap());
    }
}

//! Little-endian field access for the data structures the controller returns
//! (Identify data, log pages). Readers never panic: a field beyond the end of
//! the buffer reads as zero (parsers check the length up front and report a
//! typed error; this is only a second line of defence). Writers are used by
//! the `to_bytes` encoders for controller models and ignore fields that do
//! not fit.

fn array<const N: usize>(buf: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| buf.get(off..end)) {
        out.copy_from_slice(s);
    }
    out
}

/// Byte at `off`.
pub(crate) fn u8_at(buf: &[u8], off: usize) -> u8 {
    buf.get(off).copied().unwrap_or(0)
}

/// Little-endian u16 at `off`.
pub(crate) fn le16(buf: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(array(buf, off))
}

/// Little-endian u32 at `off`.
pub(crate) fn le32(buf: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(buf, off))
}

/// Little-endian u64 at `off`.
pub(crate) fn le64(buf: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(buf, off))
}

/// Little-endian u128 at `off`.
pub(crate) fn le128(buf: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(array(buf, off))
}

/// `N` raw bytes at `off`.
pub(crate) fn bytes<const N: usize>(buf: &[u8], off: usize) -> [u8; N] {
    array(buf, off)
}

/// An ASCII/UTF-8 string field of `len` bytes at `off`: cut at the first NUL,
/// trailing spaces removed, invalid UTF-8 replaced (lossy).
pub(crate) fn string(buf: &[u8], off: usize, len: usize) -> String {
    let end = off.saturating_add(len).min(buf.len());
    let raw = buf.get(off..end).unwrap_or(&[]);
    let raw = match raw.iter().position(|&b| b == 0) {
        Some(nul) => &raw[..nul],
        None => raw,
    };
    String::from_utf8_lossy(raw)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

/// Writes `src` at `off` if it fits.
pub(crate) fn put(buf: &mut [u8], off: usize, src: &[u8]) {
    if let Some(dst) = off
        .checked_add(src.len())
        .and_then(|end| buf.get_mut(off..end))
    {
        dst.copy_from_slice(src);
    }
}

/// Writes a space-padded string field of `len` bytes (truncated to fit).
pub(crate) fn put_string(buf: &mut [u8], off: usize, len: usize, s: &str, pad: u8) {
    let mut field = vec![pad; len];
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
    put(buf, off, &field);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_tolerate_short_buffers() {
        let b = [1u8, 2, 3];
        assert_eq!(le16(&b, 0), 0x0201);
        assert_eq!(le16(&b, 2), 0);
        assert_eq!(le32(&b, 0), 0);
        assert_eq!(le64(&b, usize::MAX), 0);
        assert_eq!(u8_at(&b, 5), 0);
        assert_eq!(string(&b, 2, 100), "\u{3}");
        assert_eq!(string(&b, usize::MAX, 100), "");
    }

    #[test]
    fn strings() {
        let mut b = [0u8; 16];
        put_string(&mut b, 0, 8, "QEMU", b' ');
        assert_eq!(&b[..8], b"QEMU    ");
        assert_eq!(string(&b, 0, 8), "QEMU");
        put_string(&mut b, 8, 8, "a\u{fffd}", 0);
        assert_eq!(string(&b, 8, 8), "a\u{fffd}");
        let bad = [0xffu8, b'x', b' ', 0, b'y'];
        assert_eq!(string(&bad, 0, 5), "\u{fffd}x");
    }
}

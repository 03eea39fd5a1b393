//! Writing the guest's initramfs: "newc" cpio archives, the format the kernel unpacks.
//!
//! The initrd handed to QEMU is a cached base archive (busybox and the kernel modules)
//! followed by a per-run archive (init, configuration, binaries); the kernel unpacks
//! concatenated archives in order, later files replacing earlier ones.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// Writes a newc ("070701") cpio archive.
pub struct CpioWriter<W: Write> {
    out: W,
    next_ino: u32,
    written: u64,
    dirs: BTreeSet<String>,
}

impl<W: Write> CpioWriter<W> {
    /// Starts an archive.
    pub fn new(out: W) -> Self {
        Self {
            out,
            next_ino: 1,
            written: 0,
            dirs: BTreeSet::new(),
        }
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad4(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.write_all(&[0; 3][..pad])
    }

    /// Writes one header and name; the caller writes `size` bytes of data next.
    fn header(&mut self, name: &str, mode: u32, size: u64, rdev: (u32, u32)) -> io::Result<()> {
        let name = name.trim_start_matches('/');
        let size = u32::try_from(size).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is larger than 4 GiB"),
            )
        })?;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let ino = self.next_ino;
        self.next_ino += 1;
        let fields = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            size,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            (name.len() + 1) as u32,
            0, // check
        ];
        let mut h = String::with_capacity(110);
        h.push_str("070701");
        for f in fields {
            h.push_str(&format!("{f:08X}"));
        }
        self.write_all(h.as_bytes())?;
        self.write_all(name.as_bytes())?;
        self.write_all(&[0])?;
        self.pad4()
    }

    /// Adds a directory (and its missing parents).
    pub fn dir(&mut self, path: &str) -> io::Result<()> {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return Ok(());
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.header(path, S_IFDIR | 0o755, 0, (0, 0))?;
        self.dirs.insert(path.to_string());
        Ok(())
    }

    fn parent_dirs(&mut self, path: &str) -> io::Result<()> {
        match path.trim_matches('/').rsplit_once('/') {
            Some((parent, _)) => self.dir(parent),
            None => Ok(()),
        }
    }

    /// Adds a regular file with the given permission bits.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.parent_dirs(path)?;
        self.header(path, S_IFREG | (perm & 0o7777), data.len() as u64, (0, 0))?;
        self.write_all(data)?;
        self.pad4()
    }

    /// Adds a host file, streaming its contents; the permission bits come from the host.
    pub fn host_file(&mut self, path: &str, host: &Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut f = File::open(host)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", host.display())))?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", host.display()),
            ));
        }
        self.parent_dirs(path)?;
        self.header(
            path,
            S_IFREG | (meta.permissions().mode() & 0o7777),
            meta.len(),
            (0, 0),
        )?;
        let copied = io::copy(&mut f, &mut self.out)?;
        self.written += copied;
        if copied != meta.len() {
            return Err(io::Error::other(format!(
                "{} changed size while being read",
                host.display()
            )));
        }
        self.pad4()
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.parent_dirs(path)?;
        self.header(path, S_IFLNK | 0o777, target.len() as u64, (0, 0))?;
        self.write_all(target.as_bytes())?;
        self.pad4()
    }

    /// Adds a character device node.
    pub fn char_device(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.parent_dirs(path)?;
        self.header(path, S_IFCHR | (perm & 0o7777), 0, (major, minor))
    }

    /// Writes the trailer, pads the archive to 512 bytes and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 0, (0, 0))?;
        let pad = ((512 - self.written % 512) % 512) as usize;
        self.write_all(&vec![0; pad])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a newc archive back into (name, mode, data) entries.
    fn parse(mut a: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut entries = Vec::new();
        let total = a.len();
        loop {
            let off = total - a.len();
            assert_eq!(off % 4, 0, "header at {off} not aligned");
            assert_eq!(&a[..6], b"070701");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&a[6 + 8 * i..14 + 8 * i]).unwrap(), 16)
                    .unwrap()
            };
            let (mode, size, namesize) = (field(1), field(6) as usize, field(11) as usize);
            let name = std::str::from_utf8(&a[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(a[110 + namesize - 1], 0);
            let data_start = (110 + namesize).next_multiple_of(4);
            let data = a[data_start..data_start + size].to_vec();
            a = &a[(data_start + size).next_multiple_of(4)..];
            if name == "TRAILER!!!" {
                assert!(a.iter().all(|&b| b == 0));
                return entries;
            }
            entries.push((name, mode, data));
        }
    }

    #[test]
    fn archive_roundtrip() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("/bin").unwrap();
        w.file("/etc/upnvme/x.env", 0o644, b"A=1\n").unwrap();
        w.symlink("/bin/sh", "busybox").unwrap();
        w.char_device("/dev/console", 0o600, 5, 1).unwrap();
        w.file("/odd", 0o755, b"12345").unwrap();
        let a = w.finish().unwrap();
        assert_eq!(a.len() % 512, 0);
        let names = parse(&a);
        assert_eq!(
            names,
            [
                ("bin".to_string(), S_IFDIR | 0o755, vec![]),
                ("etc".to_string(), S_IFDIR | 0o755, vec![]),
                ("etc/upnvme".to_string(), S_IFDIR | 0o755, vec![]),
                (
                    "etc/upnvme/x.env".to_string(),
                    S_IFREG | 0o644,
                    b"A=1\n".to_vec()
                ),
                ("bin/sh".to_string(), S_IFLNK | 0o777, b"busybox".to_vec()),
                ("dev".to_string(), S_IFDIR | 0o755, vec![]),
                ("dev/console".to_string(), S_IFCHR | 0o600, vec![]),
                ("odd".to_string(), S_IFREG | 0o755, b"12345".to_vec()),
            ]
        );
    }

    #[test]
    fn host_files_keep_mode() {
        let exe = std::env::current_exe().unwrap();
        let mut w = CpioWriter::new(Vec::new());
        w.host_file("/bin/me", &exe).unwrap();
        let a = w.finish().unwrap();
        let e = parse(&a);
        assert_eq!(e[1].0, "bin/me");
        assert_eq!(e[1].1 & 0o111, 0o111);
        assert_eq!(e[1].2, std::fs::read(&exe).unwrap());
        let mut w = CpioWriter::new(Vec::new());
        assert!(w.host_file("/x", Path::new("/nonexistent/file")).is_err());
    }
}

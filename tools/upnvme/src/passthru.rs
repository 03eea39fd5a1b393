//! `upnvme admin-passthru` and `io-passthru`: any admin command the driver
//! does not own, or any I/O command, as nvme-cli's passthrough commands send
//! them — the opcode, NSID and command dwords from flags, data from a file
//! or back to stdout (a hex dump, or raw with `-b`), completion dword 0 in
//! the report.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use std::time::Instant;
use upnvme::{Controller, IoCommand, IoData, QueuePairOptions, Sqe};

use crate::DeviceArgs;
use crate::usage::usage;

/// The flags of `upnvme admin-passthru`.
#[derive(clap::Args, Debug)]
pub struct AdminPassthruArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    #[command(flatten)]
    cmd: PassthruCmd,
}

/// The flags of `upnvme io-passthru`: the same fields as
/// `admin-passthru`'s, sent on an I/O queue pair to namespace `-n`.
#[derive(clap::Args, Debug)]
pub struct IoPassthruArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    #[command(flatten)]
    cmd: PassthruCmd,
}

/// The command and its data, as nvme-cli's passthrough commands take them.
#[derive(clap::Args, Debug)]
pub struct PassthruCmd {
    /// Opcode (decimal or 0x-prefixed hex); its bits 1:0 give the data
    /// direction (01b host to controller, 10b controller to host, 11b both),
    /// to which --read / --write add.
    #[arg(short = 'O', long, value_parser = crate::rw::number::<u8>)]
    opcode: u8,
    /// Namespace ID (NSID).
    #[arg(short = 'n', long = "namespace-id", default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    nsid: u32,
    /// Command dword 2.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw2: u32,
    /// Command dword 3.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw3: u32,
    /// Command dword 10.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw10: u32,
    /// Command dword 11.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw11: u32,
    /// Command dword 12.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw12: u32,
    /// Command dword 13.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw13: u32,
    /// Command dword 14.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw14: u32,
    /// Command dword 15.
    #[arg(long, default_value_t = 0, value_parser = crate::rw::number::<u32>)]
    cdw15: u32,
    /// Bytes the command moves through its data pointer. With --input-file
    /// it defaults to the file's length; a larger value pads the file's
    /// data with zeros. At most 2101248 for an admin command (513 pages of
    /// 4 KiB) and 4194304 for an I/O command (4 MiB); the controller's MDTS
    /// may allow less.
    #[arg(short = 'l', long, value_parser = crate::rw::number::<usize>)]
    data_len: Option<usize>,
    /// Data also comes from the controller (printed as a hex dump, or raw
    /// with --raw-binary), whatever the opcode's bit 1 says (for vendor
    /// opcodes that do not follow the convention).
    #[arg(short = 'r', long)]
    read: bool,
    /// Data also goes to the controller (from --input-file, else
    /// --data-len bytes from stdin), whatever the opcode's bit 0 says.
    #[arg(short = 'w', long)]
    write: bool,
    /// File holding the data to send ("-": stdin).
    #[arg(short = 'i', long)]
    input_file: Option<PathBuf>,
    /// Write the data read to stdout as it is, instead of a hex dump (the
    /// report goes to stderr then).
    #[arg(short = 'b', long)]
    raw_binary: bool,
    /// Bound on the command in milliseconds (default: the admin timeout,
    /// for io-passthru 30 s; a Firmware Commit that activates may need up to
    /// the controller's MTFA).
    #[arg(short = 't', long, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: Option<u64>,
}

/// The most an admin command moves through upnvme's data pointer, whatever
/// the controller's MDTS: 513 pages of 4 KiB (PRP1 and one PRP List page;
/// `Controller::admin_passthrough` refuses more).
pub const ADMIN_DATA_MAX: usize = 513 * 4096;

/// Which queue a passthrough command goes to, for the most data it moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The admin queue: at most [`ADMIN_DATA_MAX`].
    Admin,
    /// An I/O queue: at most `upnvme::MAX_TRANSFER_CAP` (4 MiB; a raw
    /// command is never split, so the controller's MDTS may allow less).
    Io,
}

impl Kind {
    /// The most data a command of this kind moves through upnvme.
    pub fn max(self) -> usize {
        match self {
            Kind::Admin => ADMIN_DATA_MAX,
            Kind::Io => upnvme::MAX_TRANSFER_CAP,
        }
    }

    /// "more than … moves through upnvme (…)": the limit, in words.
    pub fn limit(self) -> String {
        match self {
            Kind::Admin => format!(
                "more than an admin command moves through upnvme: at most {ADMIN_DATA_MAX} (513 \
                 pages of 4 KiB; the controller's MDTS, `upnvme identify`, may allow less)"
            ),
            Kind::Io => format!(
                "more than an I/O command moves through upnvme: at most {} (4 MiB; the \
                 controller's MDTS, `upnvme identify`, may allow less)",
                upnvme::MAX_TRANSFER_CAP
            ),
        }
    }
}

/// A `--data-len` (decimal or 0x…): at most [`ADMIN_DATA_MAX`], refused at
/// parse time (exit 2) — a larger one would only be refused after the
/// data was read and padded to it (a length of terabytes aborted the tool
/// allocating it).
pub(crate) fn data_len(s: &str) -> std::result::Result<usize, String> {
    let len = crate::rw::number::<usize>(s)?;
    if len > ADMIN_DATA_MAX {
        return Err(format!("{len} bytes is {}", Kind::Admin.limit()));
    }
    Ok(len)
}

/// Which way the data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    None,
    ToController,
    FromController,
    Both,
}

impl PassthruCmd {
    /// The opcode's direction, with what --read / --write add (as
    /// nvme-cli: the flags add to the opcode's bits, never take away).
    fn direction(&self) -> Direction {
        let sends = self.write || self.opcode & 0b01 != 0;
        let receives = self.read || self.opcode & 0b10 != 0;
        match (sends, receives) {
            (true, true) => Direction::Both,
            (true, false) => Direction::ToController,
            (false, true) => Direction::FromController,
            (false, false) => Direction::None,
        }
    }

    fn sqe(&self) -> Sqe {
        Sqe::passthrough(
            self.opcode,
            self.nsid,
            [self.cdw2, self.cdw3],
            [
                self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
            ],
        )
    }

    /// The data to send (zero-padded to --data-len), checked before the
    /// controller is opened.
    fn data_out(&self, direction: Direction, kind: Kind) -> Result<Option<Vec<u8>>> {
        let sends = matches!(direction, Direction::ToController | Direction::Both);
        if !sends {
            if self.input_file.is_some() {
                return Err(usage(format!(
                    "--input-file: opcode 0x{:02x} sends no data to the controller (its bits 1:0 \
                     are {:02b}b) and --write is not given; the data the controller returns goes \
                     to stdout",
                    self.opcode,
                    self.opcode & 0b11
                ))
                .into());
            }
            return Ok(None);
        }
        if self.input_file.is_none() && self.data_len.unwrap_or(0) == 0 {
            // Set Features (09h) and its kind: no data pointer at all.
            return Ok(None);
        }
        // Without --input-file: --data-len bytes of stdin (above).
        let path = self.input_file.as_deref().unwrap_or(Path::new("-"));
        let mut data = read_input(path, self.data_len, "--input-file", kind)?;
        if let Some(len) = self.data_len {
            data.resize(len, 0);
        }
        Ok(Some(data))
    }
}

/// The data to send from `path` ("-": stdin), read before the controller
/// is opened: never more than `max` bytes (so a pipe whose writer stays
/// open, a FIFO or /dev/zero cannot hang the tool). A regular file longer
/// than `max` is refused; without `max` a regular file is read whole (one
/// above what a `kind` command moves is refused unread) and anything else
/// (stdin, a pipe, a device) is refused, since its length is not the data's.
/// `flag` names the option in the messages.
pub fn read_input(path: &Path, max: Option<usize>, flag: &str, kind: Kind) -> Result<Vec<u8>> {
    let stdin = path.as_os_str() == "-";
    let what = if stdin {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let fail = |e: std::io::Error| usage(format!("{flag} {what}: {e}"));
    let mut data = Vec::new();
    if stdin {
        let Some(max) = max else {
            return Err(usage(format!(
                "{flag} -: stdin has no length of its own: pass --data-len, the bytes to take"
            ))
            .into());
        };
        std::io::stdin()
            .lock()
            .take(max as u64)
            .read_to_end(&mut data)
            .context("reading the data to send from stdin")?;
        return Ok(data);
    }
    let file = std::fs::File::open(path).map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    match max {
        Some(max) if meta.is_file() && meta.len() > max as u64 => Err(usage(format!(
            "{flag} {what} holds {} bytes, more than the {max} the command sends",
            meta.len()
        ))
        .into()),
        Some(max) => {
            file.take(max as u64).read_to_end(&mut data).map_err(fail)?;
            Ok(data)
        }
        None if meta.is_file() && meta.len() > kind.max() as u64 => Err(usage(format!(
            "{flag} {what} holds {} bytes, {}",
            meta.len(),
            kind.limit()
        ))
        .into()),
        None if meta.is_file() => {
            (&file).read_to_end(&mut data).map_err(fail)?;
            Ok(data)
        }
        None => Err(usage(format!(
            "{flag} {what} is not a regular file: pass --data-len, the bytes to take from it"
        ))
        .into()),
    }
}

/// Checks the flags and reads the data to send, before the controller is
/// opened: the direction, the data (if any) and the data pointer's length.
/// A `--data-len` above what a `kind` command moves is refused before
/// anything is read or allocated (a length of terabytes aborted the tool
/// allocating it).
fn prepare(a: &PassthruCmd, kind: Kind) -> Result<(Direction, Option<Vec<u8>>, usize)> {
    if let Some(len) = a.data_len
        && len > kind.max()
    {
        return Err(usage(format!("--data-len {len}: {len} bytes is {}", kind.limit())).into());
    }
    let direction = a.direction();
    if direction == Direction::None && a.data_len.is_some_and(|l| l > 0) {
        return Err(usage(format!(
            "--data-len {}: opcode 0x{:02x} moves no data (its bits 1:0 are 00b); pass --read or \
             --write to give it a data pointer anyway",
            a.data_len.unwrap_or(0),
            a.opcode
        ))
        .into());
    }
    let out = a.data_out(direction, kind)?;
    let data_len = match &out {
        Some(d) => d.len(),
        None => a.data_len.unwrap_or(0),
    };
    Ok((direction, out, data_len))
}

/// Runs `upnvme admin-passthru`.
pub fn run(a: &AdminPassthruArgs) -> Result<()> {
    let (direction, out, data_len) = prepare(&a.cmd, Kind::Admin)?;
    let c = a.dev.open()?;
    let result = send(&c, &a.cmd, data_len, out.as_deref());
    let closed = c.close();
    let (cqe, data) = result?;
    // What the command did is shown even when the shutdown after it fails
    // (then reported, exit 1).
    let report = format!(
        "admin command 0x{:02x}: Successful Completion, dword 0 0x{:08x}, dword 1 0x{:08x}",
        a.cmd.opcode,
        cqe.dw0(),
        cqe.dw[1]
    );
    shown(&a.cmd, direction, &report, &data)?;
    closed?;
    Ok(())
}

/// Runs `upnvme io-passthru`: the command on a new I/O queue pair of the
/// controller, to namespace `-n` (an active namespace).
pub fn run_io(a: &IoPassthruArgs) -> Result<()> {
    if a.cmd.nsid == 0 {
        return Err(usage(
            "io-passthru needs a namespace: pass -n NSID (an active namespace; `upnvme list` \
             shows them)",
        )
        .into());
    }
    let (direction, out, data_len) = prepare(&a.cmd, Kind::Io)?;
    let c = a.dev.open()?;
    let result = send_io(&c, &a.cmd, data_len, out.as_deref());
    let closed = c.close();
    let (dw0, data) = result?;
    let report = format!(
        "I/O command 0x{:02x}: Successful Completion, dword 0 0x{dw0:08x}",
        a.cmd.opcode
    );
    shown(&a.cmd, direction, &report, &data)?;
    closed?;
    Ok(())
}

/// The I/O command on a queue pair of `c`: its completion dword 0 and the
/// data it brought. A refusal (nothing sent) is a usage error; an NVMe
/// error status or no completion within the timeout is an error.
fn send_io(
    c: &Controller,
    a: &PassthruCmd,
    data_len: usize,
    out: Option<&[u8]>,
) -> Result<(u32, Vec<u8>)> {
    let ns = c
        .namespace(a.nsid)
        .map_err(|e| usage(format!("-n {}: {e}", a.nsid)))?
        .clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default())?;
    let buf = match data_len {
        0 => None,
        n => {
            let b = c.alloc_dma(n)?;
            if let Some(d) = out {
                b.write_bytes(0, d)?;
            }
            Some(b)
        }
    };
    let sqe = a.sqe();
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len,
    };
    if let Err(r) = qp.submit_io(cmd, IoData::from(buf), 0) {
        return Err(usage(qp.describe(r.reason).to_string()).into());
    }
    let limit = Duration::from_millis(a.timeout.unwrap_or(30_000));
    let start = Instant::now();
    let done = loop {
        let mut got = None;
        qp.process_completions(1, |_, c| got = Some(c))?;
        if let Some(c) = got {
            break c;
        }
        if start.elapsed() > limit {
            anyhow::bail!(
                "I/O command 0x{:02x}: no completion within {} ms (it stays in flight until \
                 the controller is closed)",
                a.opcode,
                limit.as_millis()
            );
        }
    };
    let dw0 = done
        .result
        .with_context(|| format!("I/O command 0x{:02x}", a.opcode))?;
    let mut data = vec![0u8; data_len];
    if let Some(b) = &done.buffer
        && data_len > 0
    {
        b.read_bytes(0, &mut data)?;
    }
    Ok((dw0, data))
}

/// Prints the completion's `report` and the data received.
fn shown(a: &PassthruCmd, direction: Direction, report: &str, data: &[u8]) -> Result<()> {
    let receives = matches!(direction, Direction::FromController | Direction::Both);
    if a.raw_binary {
        eprintln!("{report}");
        if receives {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(data)?;
            stdout.flush()?;
        }
        return Ok(());
    }
    outln!("{report}");
    if receives && !data.is_empty() {
        out!("{}", hex_dump(data));
    }
    Ok(())
}

/// The command on `c`; the library's refusals (nothing was sent) are usage
/// errors.
fn send(
    c: &Controller,
    a: &PassthruCmd,
    data_len: usize,
    out: Option<&[u8]>,
) -> Result<(upnvme::Cqe, Vec<u8>)> {
    let sqe = a.sqe();
    let r = match a.timeout {
        Some(ms) => c.admin_passthrough_with_timeout(sqe, data_len, out, Duration::from_millis(ms)),
        None => c.admin_passthrough(sqe, data_len, out),
    };
    match r {
        Ok(done) => Ok(done),
        Err(upnvme::Error::InvalidArgument(why)) => Err(usage(why).into()),
        Err(e) => Err(e.into()),
    }
}

/// `data` as nvme-cli's hex dump: a header of column numbers, then 16 bytes
/// a line with their offset and their printable ASCII.
pub fn hex_dump(data: &[u8]) -> String {
    let mut s = String::from("       0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f\n");
    for (i, line) in data.chunks(16).enumerate() {
        s.push_str(&format!("{:04x}:", i * 16));
        for b in line {
            s.push_str(&format!(" {b:02x}"));
        }
        for _ in line.len()..16 {
            s.push_str("   ");
        }
        s.push_str(" \"");
        s.extend(line.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        }));
        s.push_str("\"\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::hex_dump;

    #[test]
    fn hex_dump_lines_carry_offsets_bytes_and_ascii() {
        let data: Vec<u8> = (0x41..0x41 + 20).collect();
        let d = hex_dump(&data);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            "0000: 41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f 50 \"ABCDEFGHIJKLMNOP\""
        );
        assert_eq!(
            lines[2],
            format!("0010: 51 52 53 54{} \"QRST\"", "   ".repeat(12))
        );
        assert!(hex_dump(&[0, 0x7f]).contains("\"..\""));
    }
}

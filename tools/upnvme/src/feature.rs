//! `upnvme get-feature` / `set-feature` / `get-log`, as nvme-cli's: a
//! feature's value (completion dword 0, and the data structure of the
//! features that have one) and any log page, printed as nvme-cli prints
//! them (`get-feature:0x07 (Number of Queues), Current value:0x003f003f`, a
//! hex dump) or raw with `-b`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use upnvme::Sqe;
use upnvme::queues::sqe::feature;

use crate::DeviceArgs;
use crate::passthru::{hex_dump, read_input};
use crate::rw::number;
use crate::usage::usage;

/// Get Features' Select field (CDW10 bits 10:8) in words.
const SELECT: [&str; 4] = ["Current", "Default", "Saved", "Supported capabilities"];

/// The flags of `upnvme get-feature`.
#[derive(clap::Args, Debug)]
pub struct GetFeatureArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Feature Identifier (FID), decimal or 0x-prefixed hex.
    #[arg(short = 'f', long = "feature-id", value_parser = number::<u8>)]
    fid: u8,
    /// Select: 0 current, 1 default, 2 saved, 3 supported capabilities.
    #[arg(short = 's', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..4))]
    sel: u8,
    /// Command dword 11 (feature specific: e.g. the temperature sensor of
    /// Temperature Threshold).
    #[arg(long, default_value_t = 0, value_parser = number::<u32>)]
    cdw11: u32,
    /// Namespace ID, for namespace-specific features.
    #[arg(short = 'n', long = "namespace-id", default_value_t = 0, value_parser = number::<u32>)]
    nsid: u32,
    /// Bytes of the feature's data structure (default: the length the
    /// specification gives the feature, none for a feature it does not
    /// list, such as a vendor's).
    #[arg(short = 'l', long, value_parser = crate::passthru::data_len)]
    data_len: Option<usize>,
    /// UUID Index (CDW14 bits 6:0) of a vendor feature.
    #[arg(short = 'U', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..128))]
    uuid_index: u8,
    /// Write the feature's data structure to stdout as it is, instead of a
    /// hex dump (the value line goes to stderr then).
    #[arg(short = 'b', long)]
    raw_binary: bool,
    /// Decode the value in words under the value line (Arbitration, Power
    /// Management, Temperature Threshold, Error Recovery, Volatile Write
    /// Cache, Number of Queues, Interrupt Coalescing, Interrupt Vector
    /// Configuration, Write Atomicity Normal, Asynchronous Event
    /// Configuration, Autonomous Power State Transition, Host Behavior
    /// Support; with -s 3 any feature's capabilities), as nvme-cli's -H;
    /// other features are shown raw.
    #[arg(short = 'H', long = "human-readable", conflicts_with = "raw_binary")]
    human: bool,
}

/// The flags of `upnvme set-feature`.
#[derive(clap::Args, Debug)]
pub struct SetFeatureArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Feature Identifier (FID), decimal or 0x-prefixed hex.
    #[arg(short = 'f', long = "feature-id", value_parser = number::<u8>)]
    fid: u8,
    /// The value: command dword 11.
    #[arg(short = 'V', long, default_value_t = 0, value_parser = number::<u32>)]
    value: u32,
    /// Command dword 12 (feature specific: FDP Events' enable bit, ...).
    #[arg(long, default_value_t = 0, value_parser = number::<u32>)]
    cdw12: u32,
    /// Make the value persist across power cycles (Save, CDW10 bit 31).
    #[arg(long)]
    save: bool,
    /// Namespace ID, for namespace-specific features.
    #[arg(short = 'n', long = "namespace-id", default_value_t = 0, value_parser = number::<u32>)]
    nsid: u32,
    /// Bytes of the data structure (default: the length the specification
    /// gives the feature; needed for a feature it does not list, such as a
    /// vendor's); the data itself comes with --data.
    #[arg(short = 'l', long, value_parser = crate::passthru::data_len)]
    data_len: Option<usize>,
    /// UUID Index (CDW14 bits 6:0) of a vendor feature.
    #[arg(short = 'U', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..128))]
    uuid_index: u8,
    /// The data structure of a feature that has one (Host Behavior
    /// Support, Timestamp, ...), from this file ("-": stdin), zero-padded
    /// to the structure's length (nvme-cli's -d; -d is the device here).
    #[arg(long = "data")]
    data: Option<PathBuf>,
}

/// The flags of `upnvme get-log`.
#[derive(clap::Args, Debug)]
pub struct GetLogArgs {
    #[command(flatten)]
    dev: DeviceArgs,
    /// Log Page Identifier (LID), decimal or 0x-prefixed hex.
    #[arg(short = 'i', long = "log-id", value_parser = number::<u8>)]
    lid: u8,
    /// Bytes to read (a multiple of 4).
    #[arg(short = 'l', long = "log-len", value_parser = number::<usize>)]
    len: usize,
    /// Namespace ID (default: controller-wide, 0xffffffff).
    #[arg(short = 'n', long = "namespace-id", default_value_t = 0xffff_ffff, value_parser = number::<u32>)]
    nsid: u32,
    /// Log Page Offset in bytes (a multiple of 4).
    #[arg(long, default_value_t = 0, value_parser = number::<u64>)]
    lpo: u64,
    /// Retain Asynchronous Event: leave the event type masked (default: the
    /// read re-arms it).
    #[arg(long)]
    rae: bool,
    /// Log Specific Parameter (CDW10 bits 14:8).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..128))]
    lsp: u8,
    /// Log Specific Identifier (CDW11 bits 31:16).
    #[arg(long, default_value_t = 0, value_parser = number::<u16>)]
    lsi: u16,
    /// Offset Type (CDW14 bit 23): --lpo is an index into the log's
    /// entries, not bytes (the log is then read in one command).
    #[arg(long)]
    ot: bool,
    /// Command Set Identifier (CDW14 bits 31:24).
    #[arg(long, default_value_t = 0, value_parser = number::<u8>)]
    csi: u8,
    /// UUID Index (CDW14 bits 6:0) of a vendor log.
    #[arg(short = 'U', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..128))]
    uuid_index: u8,
    /// Bytes per Get Log Page command (a multiple of 4): a longer log is read
    /// in pieces of this size at increasing offsets, the event retained
    /// until the last (default: the controller's transfer limit).
    #[arg(long, value_parser = number::<usize>)]
    xfer_len: Option<usize>,
    /// Write the log to stdout as it is, instead of a hex dump.
    #[arg(short = 'b', long)]
    raw_binary: bool,
}

/// The feature's name, or what it is when the specification names none.
fn feature_name(fid: u8) -> &'static str {
    feature::name(fid).unwrap_or("unknown or vendor specific")
}

/// Runs `upnvme get-feature`.
pub fn get(a: &GetFeatureArgs) -> Result<()> {
    // Select 011b (supported capabilities) returns dword 0 only.
    let structure = feature::structure(a.fid, a.cdw11, false).filter(|_| a.sel != 3);
    let mut sqe = Sqe::get_features(a.fid, a.sel, a.cdw11);
    sqe.dw[1] = a.nsid;
    sqe.dw[14] = u32::from(a.uuid_index);
    let len = a.data_len.unwrap_or(structure.map_or(0, |(_, l)| l));
    let c = a.dev.open()?;
    let r = c.admin_passthrough(sqe, len, None);
    let closed = c.close();
    let (cqe, data) = r.map_err(refusal)?;
    let line = format!(
        "get-feature:0x{:02x} ({}), {} value:0x{:08x}",
        a.fid,
        feature_name(a.fid),
        SELECT[usize::from(a.sel)],
        cqe.dw0()
    );
    // Shown even when the shutdown after it fails (then reported).
    let decoded = a
        .human
        .then(|| crate::feature_decode::decode(a.fid, a.sel, a.cdw11, cqe.dw0(), &data))
        .flatten();
    match decoded {
        Some(lines) => {
            outln!("{line}");
            for l in lines {
                outln!("  {l}");
            }
            if !crate::feature_decode::decodes_structure(a.fid, a.sel) && !data.is_empty() {
                out!("{}", hex_dump(&data));
            }
        }
        None => print_data(&line, &data, a.raw_binary)?,
    }
    Ok(closed?)
}

/// Runs `upnvme set-feature`.
pub fn set(a: &SetFeatureArgs) -> Result<()> {
    let mut sqe = Sqe::set_features(a.fid, a.value, a.save);
    sqe.dw[1] = a.nsid;
    sqe.dw[12] = a.cdw12;
    sqe.dw[14] = u32::from(a.uuid_index);
    let structure = feature::structure(a.fid, a.value, true);
    let len = a.data_len.or(structure.map(|(_, l)| l));
    let data = match (len, structure, &a.data) {
        (Some(len), _, Some(path)) => {
            let mut d = read_input(path, Some(len), "--data", crate::passthru::Kind::Admin)?;
            d.resize(len, 0);
            Some(d)
        }
        (_, Some((name, len)), None) => {
            return Err(usage(format!(
                "{name} (FID 0x{:02x}) is a data structure of {len} bytes: pass it with --data \
                 FILE",
                a.fid
            ))
            .into());
        }
        // A length without data: said, not dropped (the controller would
        // read its structure from IOVA 0).
        (Some(len), None, None) => {
            return Err(usage(format!(
                "--data-len {len} without --data: pass the structure with --data FILE (--data - \
                 for stdin)"
            ))
            .into());
        }
        (None, _, Some(_)) => {
            return Err(usage(format!(
                "--data: the specification gives {} (FID 0x{:02x}) no data structure; pass \
                 --data-len for a feature that has one (a vendor's)",
                feature_name(a.fid),
                a.fid
            ))
            .into());
        }
        (None, None, None) => None,
    };
    let c = a.dev.open()?;
    let r = c.admin_passthrough(sqe, 0, data.as_deref());
    let closed = c.close();
    let (cqe, _) = r.map_err(refusal)?;
    outln!(
        "set-feature:0x{:02x} ({}), value:0x{:08x}, cdw12:0x{:08x}, save:{}, result: 0x{:08x}",
        a.fid,
        feature_name(a.fid),
        a.value,
        a.cdw12,
        u8::from(a.save),
        cqe.dw0()
    );
    Ok(closed?)
}

/// Runs `upnvme get-log`.
pub fn get_log(a: &GetLogArgs) -> Result<()> {
    if a.len == 0 || !a.len.is_multiple_of(4) {
        return Err(usage(format!(
            "--log-len {}: a log is read in dwords: pass a non-zero multiple of 4",
            a.len
        ))
        .into());
    }
    // With Offset Type set, LPO is an index into the log's entries.
    if !a.ot && !a.lpo.is_multiple_of(4) {
        return Err(usage(format!(
            "--lpo {}: the Log Page Offset is dword aligned: pass a multiple of 4",
            a.lpo
        ))
        .into());
    }
    if a.xfer_len.is_some_and(|x| x == 0 || !x.is_multiple_of(4)) {
        return Err(usage("--xfer-len: a non-zero multiple of 4").into());
    }
    let data = log_buffer(a.len)?;
    let c = a.dev.open()?;
    // Pieces of at most the transfer limit (the passthrough's own limit:
    // MDTS, and 513 pages of data).
    let limit = c.max_transfer_bytes().unwrap_or(usize::MAX).min(2 << 20) & !3;
    let r = if a.xfer_len.is_some_and(|x| x > limit) {
        Err(usage(format!(
            "--xfer-len {}: above the controller's transfer limit ({limit} bytes)",
            a.xfer_len.unwrap_or(0)
        ))
        .into())
    } else if a.ot && a.len > a.xfer_len.unwrap_or(limit) {
        Err(usage(format!(
            "--ot: --lpo is an entry index, so a log cannot be read in pieces at byte offsets: \
             --log-len {} is above {} (the transfer limit, or --xfer-len)",
            a.len,
            a.xfer_len.unwrap_or(limit)
        ))
        .into())
    } else if let Some(why) = log_range_refusal(c.identify().lpa, a, limit) {
        Err(usage(why).into())
    } else {
        let piece = a.xfer_len.unwrap_or(limit).max(4);
        read_log(&c, a, piece, data)
    };
    let closed = c.close();
    let data = r?;
    let line = format!(
        "Device log page 0x{:02x}, {} bytes from offset {}, namespace 0x{:x}",
        a.lid, a.len, a.lpo, a.nsid
    );
    print_data(&line, &data, a.raw_binary)?;
    Ok(closed?)
}

/// The most one Get Log Page moves on a controller without Extended Data
/// for Get Log Page (LPA bit 2): before NVMe 1.3 the Number of Dwords was
/// CDW10 bits 27:16 (0-based, 12 bits), 16 KiB — the library's
/// `Controller::get_log_page` refuses more.
const NUMDL_BYTES: usize = 4 << 12;

/// Why the log range `a` asks for cannot be read (pieces of at most
/// `limit` bytes, or --xfer-len) from a controller with Identify Controller
/// LPA `lpa`: an end beyond the 64-bit offset, or — without LPA bit 2
/// (extended data for Get Log Page), where the controller takes neither
/// LPOL/LPOU nor NUMDU — an offset, or more than one piece or the 12-bit
/// NUMD's 16 KiB (a second piece would read the first again; a long read
/// stops at NUMD).
fn log_range_refusal(lpa: u8, a: &GetLogArgs, limit: usize) -> Option<String> {
    if a.lpo.checked_add(a.len as u64).is_none() {
        return Some(format!(
            "--lpo {} with --log-len {}: the log's end is beyond the 64-bit offset LPOL/LPOU carry",
            a.lpo, a.len
        ));
    }
    let one = a.xfer_len.unwrap_or(limit).min(NUMDL_BYTES);
    (lpa & (1 << 2) == 0 && (a.lpo != 0 || a.len > one)).then(|| {
        format!(
            "the controller does not support Get Log Page offsets or reads above {one} bytes \
             (Identify Controller LPA bit 2, extended data, is clear): read from --lpo 0 with \
             --log-len {one} or less"
        )
    })
}

/// The log in pieces of `piece` bytes: Retain Asynchronous Event set on
/// every one but the last, which has --rae's (so the event type is re-armed
/// only once the whole log was read).
fn read_log(
    c: &upnvme::Controller,
    a: &GetLogArgs,
    piece: usize,
    mut data: Vec<u8>,
) -> Result<Vec<u8>> {
    while data.len() < a.len {
        let n = piece.min(a.len - data.len());
        let last = data.len() + n == a.len;
        let offset = a.lpo + data.len() as u64;
        let mut sqe = Sqe::get_log_page(a.lid, a.nsid, (n / 4) as u32, offset, a.rae || !last);
        sqe.dw[10] |= u32::from(a.lsp & 0x7f) << 8;
        sqe.dw[11] |= u32::from(a.lsi) << 16;
        sqe.dw[14] = u32::from(a.uuid_index) | u32::from(a.ot) << 23 | u32::from(a.csi) << 24;
        let (_, d) = c.admin_passthrough(sqe, n, None).map_err(refusal)?;
        data.extend_from_slice(&d);
    }
    Ok(data)
}

/// An empty buffer with room for a log of `len` bytes, reserved before the
/// device is opened: a length no memory can hold is a usage error (exit 2)
/// rather than an abort (`--log-len 0xfffffffffffffffc` panicked with
/// "capacity overflow" once the controller was open).
fn log_buffer(len: usize) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    data.try_reserve_exact(len).map_err(|e| {
        usage(format!(
            "--log-len {len}: cannot hold a log of {len} bytes in memory ({e}): read it in \
             parts with --lpo and a smaller --log-len"
        ))
    })?;
    Ok(data)
}

/// `line`, then `data` as a hex dump; with `raw`, `line` to stderr and the
/// bytes to stdout.
fn print_data(line: &str, data: &[u8], raw: bool) -> Result<()> {
    if raw {
        eprintln!("{line}");
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(data)?;
        stdout.flush()?;
        return Ok(());
    }
    outln!("{line}");
    if !data.is_empty() {
        out!("{}", hex_dump(data));
    }
    Ok(())
}

/// The library's refusals (nothing was sent) are usage errors.
fn refusal(e: upnvme::Error) -> anyhow::Error {
    match e {
        upnvme::Error::InvalidArgument(why) => usage(why).into(),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: GetLogArgs,
    }

    /// `get-log -i 2` with `extra` (`-l 512` unless it has a `-l`).
    fn args(extra: &[&str]) -> GetLogArgs {
        let mut v = vec!["get-log", "-i", "2"];
        if !extra.contains(&"-l") {
            v.extend(["-l", "512"]);
        }
        v.extend(extra);
        Cli::try_parse_from(v).unwrap().a
    }

    /// Without LPA bit 2 (extended data) an offset, several pieces or a
    /// read above the 12-bit NUMD's 16 KiB are refused (a spec review: the second
    /// piece read the first again); with it they go; an end beyond 64 bits
    /// is refused either way (it wrapped, or panicked in a debug build).
    #[test]
    fn log_ranges_a_controller_cannot_take_are_refused() {
        let limit = 128 << 10;
        assert_eq!(log_range_refusal(0, &args(&[]), limit), None);
        for extra in [
            &["--lpo", "512"][..],
            &["-l", "16388"][..],
            &["-l", "4096", "--xfer-len", "1024"][..],
        ] {
            let a = args(extra);
            let why = log_range_refusal(0, &a, limit).expect("refused without LPA bit 2");
            assert!(why.contains("LPA bit 2"), "{why}");
            assert_eq!(log_range_refusal(1 << 2, &a, limit), None, "{extra:?}");
        }
        // One read of up to 16 KiB is fine without offsets.
        assert_eq!(log_range_refusal(0, &args(&["-l", "16384"]), 1 << 20), None);
        assert!(log_range_refusal(0, &args(&["-l", "16388"]), 1 << 20).is_some());
        let a = args(&["--lpo", "0xfffffffffffffffc", "-l", "8"]);
        for lpa in [0, 1 << 2] {
            let why = log_range_refusal(lpa, &a, limit).expect("refused");
            assert!(why.contains("64-bit offset"), "{why}");
        }
    }
}

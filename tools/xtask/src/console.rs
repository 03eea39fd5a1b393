//! The guest's serial console as seen by the host: streams COMMAND's output live, hides
//! the boot log (unless verbose), and picks out the markers the guest init prints.
//!
//! The guest init writes, in this order:
//!
//! ```text
//! UPNVME-SETUP-FAILED: <reason>      (only when setup fails; the guest then powers off)
//! UPNVME-BEGIN <nonce>               (COMMAND's output follows)
//! <COMMAND's output>
//! <empty line>                       (guarantees the END marker starts a line; swallowed)
//! UPNVME-END <nonce>
//! UPNVME-DMESG-LOST: <oldest line>  (only when the kernel log wrapped: see below)
//! UPNVME-DMAR-EXPECTED: <pattern>    (each fault a test provoked on purpose, see below)
//! UPNVME-DMESG: <kernel log line>    (every kernel log line mentioning DMAR)
//! UPNVME-DMAR-FAULTS: <n>            (the faults not expected)
//! UPNVME-EXIT: <status>
//! ```
//!
//! The nonce is chosen by the host per run, so COMMAND cannot end its own section by
//! accident (for example by printing the init script).
//!
//! Expected faults: a guest test that makes the device hit memory the IOMMU refuses it (to
//! show the refusal is enforced) appends each fault record it provoked — the whole kernel
//! log line as `dmesg` prints it, timestamp included — to the file `UPNVME_VM_EXPECTED_DMAR`
//! names. Only fault-record lines count ([`is_expected_dmar_record`]); each excuses the one
//! record identical to it (the timestamp makes it unique), every other record still fails
//! the run, and so does a fault-status header beyond those of the excused records, and so
//! does the kernel's note that it rate-limited fault messages away
//! (`dmar_fault: N callbacks suppressed`).
//!
//! The count is read from the kernel log after COMMAND. A log that wrapped during the run
//! (its oldest record is no longer the boot banner, `Linux version …`) may have lost fault
//! records, so the guest then reports `UPNVME-DMESG-LOST` and the run is a bed failure,
//! never a pass: the kernel boots with `log_buf_len=16M` so that no run should come near.

use std::collections::VecDeque;
use std::io::{self, Write};

/// Printed by the guest when its setup failed, followed by the reason.
pub const SETUP_FAILED: &str = "UPNVME-SETUP-FAILED: ";
/// Starts COMMAND's output (followed by the run's nonce).
pub const BEGIN: &str = "UPNVME-BEGIN";
/// Ends COMMAND's output (followed by the run's nonce).
pub const END: &str = "UPNVME-END";
/// Prefix of a kernel log line mentioning DMAR, printed after COMMAND.
pub const DMESG: &str = "UPNVME-DMESG: ";
/// The guest's own count of IOMMU faults (those not expected).
pub const DMAR_FAULTS: &str = "UPNVME-DMAR-FAULTS: ";
/// Printed after COMMAND when the kernel log wrapped (followed by its oldest line): the
/// fault count cannot be trusted.
pub const DMESG_LOST: &str = "UPNVME-DMESG-LOST: ";
/// Prefix of one expected fault record, printed after COMMAND.
pub const DMAR_EXPECTED: &str = "UPNVME-DMAR-EXPECTED: ";
/// The extended regular expression a declared record must match (the guest init drops any
/// other line of the file): a timestamped DMA fault record with its fault address.
pub const EXPECTED_DMAR_RECORD_ERE: &str =
    "^\\[ *[0-9]+\\.[0-9]+\\] DMAR: \\[DMA (Read|Write)[^]]*\\] .*fault addr ";
/// COMMAND's exit status.
pub const EXIT: &str = "UPNVME-EXIT: ";
/// What the kernel prints when it panics.
pub const PANIC: &str = "Kernel panic - not syncing";

/// Longest line kept for inspection (longer lines are still printed in full).
const MAX_LINE: usize = 64 * 1024;
/// Boot log lines kept for error messages.
const BOOT_LOG_LINES: usize = 400;

/// True for a kernel log line that reports one IOMMU fault record, e.g.
/// `DMAR: [DMA Read NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x06] ...`.
pub fn is_dmar_fault_record(line: &str) -> bool {
    line.contains("DMAR:")
        && ["[DMA Read", "[DMA Write", "[INTR-REMAP", "fault addr"]
            .iter()
            .any(|p| line.contains(p))
}

/// True for the `DMAR: DRHD: handling fault status reg …` line that precedes fault records.
pub fn is_dmar_fault_header(line: &str) -> bool {
    line.contains("DMAR:") && line.contains("handling fault status")
}

/// The kernel's note that `dmar_fault()` rate-limited fault messages away (its header and
/// records share one limit, 10 per 5 s): `dmar_fault: 4 callbacks suppressed`, printed when
/// a later fault opens a new window. A basic regular expression, for the guest init too.
pub const DMAR_SUPPRESSED_BRE: &str = "dmar_fault: .*callbacks suppressed";

/// True for a [`DMAR_SUPPRESSED_BRE`] line: fault messages nobody saw, so at least one
/// fault that no declaration can excuse.
pub fn is_dmar_fault_suppressed(line: &str) -> bool {
    line.split_once("dmar_fault: ")
        .is_some_and(|(_, rest)| rest.contains("callbacks suppressed"))
}

/// Counts IOMMU faults in kernel log lines: the number of fault records, or, when the
/// kernel rate-limited every record away, the number of fault-status headers; plus one
/// per rate-limit note ([`is_dmar_fault_suppressed`]).
pub fn count_dmar_faults<'a>(lines: impl IntoIterator<Item = &'a str>) -> u32 {
    count_unexpected_dmar_faults(lines, &[])
}

/// True for a line that may be declared as an expected fault: a DMA fault record with its
/// timestamp, as `dmesg` prints it (`[    4.23] DMAR: [DMA Write NO_PASID] Request device
/// [00:04.0] fault addr 0x600000 [fault reason 0x05] PTE Write access is not set`). The same
/// shape as [`EXPECTED_DMAR_RECORD_ERE`].
pub fn is_expected_dmar_record(line: &str) -> bool {
    let Some(rest) = line.strip_prefix('[') else {
        return false;
    };
    let Some((stamp, rest)) = rest.split_once("] DMAR: [DMA ") else {
        return false;
    };
    let stamp = stamp.trim_start_matches(' ');
    let stamp_ok = stamp.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    });
    stamp_ok
        && (rest.starts_with("Read") || rest.starts_with("Write"))
        && rest
            .split_once(']')
            .is_some_and(|(_, r)| r.contains("fault addr "))
}

/// [`count_dmar_faults`] without the records declared as expected (lines of
/// [`is_expected_dmar_record`]'s shape; others are ignored). A declared line excuses the one
/// record identical to it. Fault-status headers count beyond one per excused record, so a
/// header-only fault (a fault-record overflow, an invalidation-queue error) is not hidden
/// behind an excused record.
pub fn count_unexpected_dmar_faults<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    expected: &[String],
) -> u32 {
    let mut declared: Vec<&str> = expected
        .iter()
        .map(|l| l.trim_end())
        .filter(|l| is_expected_dmar_record(l))
        .collect();
    let (mut records, mut unexpected, mut headers, mut suppressed) = (0u32, 0u32, 0u32, 0u32);
    for l in lines {
        if is_dmar_fault_suppressed(l) {
            suppressed += 1;
        } else if is_dmar_fault_record(l) {
            records += 1;
            match declared.iter().position(|d| *d == l.trim_end()) {
                Some(i) => {
                    declared.swap_remove(i);
                }
                None => unexpected += 1,
            }
        } else if is_dmar_fault_header(l) {
            headers += 1;
        }
    }
    if records == 0 {
        return headers + suppressed;
    }
    let excused = records - unexpected;
    unexpected.max(headers.saturating_sub(excused)) + suppressed
}

/// Removes ANSI escape sequences (colours) from `s`.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What the console showed, once the guest stopped.
#[derive(Debug, Default, Clone)]
pub struct ConsoleReport {
    /// The BEGIN marker was seen: setup succeeded and COMMAND ran.
    pub begun: bool,
    /// The END marker was seen: COMMAND finished.
    pub ended: bool,
    /// COMMAND's exit status.
    pub exit_status: Option<i32>,
    /// The guest's own count of DMAR faults (those not expected).
    pub guest_dmar_faults: Option<u32>,
    /// The kernel log's oldest line when the log wrapped during the run (the fault count
    /// then cannot be trusted).
    pub dmesg_lost: Option<String>,
    /// Patterns of the faults a test provoked on purpose.
    pub expected_dmar: Vec<String>,
    /// Kernel log lines mentioning DMAR.
    pub dmesg: Vec<String>,
    /// Why the guest setup failed.
    pub setup_failure: Option<String>,
    /// The kernel panic line, if the kernel panicked.
    pub panic: Option<String>,
    /// The last lines of the boot log (everything before BEGIN).
    pub boot_log: VecDeque<String>,
    /// Console lines after END that were not markers (e.g. "reboot: Power down").
    pub after_log: Vec<String>,
    /// COMMAND's output lines (only when capturing), escape sequences included.
    pub command_lines: Vec<String>,
}

impl ConsoleReport {
    /// IOMMU faults: the larger of the guest's count and the host's count of the kernel log
    /// lines it received.
    pub fn dmar_faults(&self) -> u32 {
        self.guest_dmar_faults
            .unwrap_or(0)
            .max(count_unexpected_dmar_faults(
                self.dmesg.iter().map(String::as_str),
                &self.expected_dmar,
            ))
    }

    /// Fault records a test provoked on purpose (they contain an expected pattern).
    pub fn expected_dmar_faults(&self) -> u32 {
        let lines = || self.dmesg.iter().map(String::as_str);
        count_dmar_faults(lines())
            .saturating_sub(count_unexpected_dmar_faults(lines(), &self.expected_dmar))
    }

    /// The kernel log lines that report faults.
    pub fn dmar_fault_lines(&self) -> Vec<&str> {
        self.dmesg
            .iter()
            .map(String::as_str)
            .filter(|l| {
                is_dmar_fault_record(l) || is_dmar_fault_header(l) || is_dmar_fault_suppressed(l)
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Boot,
    Command,
    After,
}

/// Filters the serial console byte stream; see the module documentation.
pub struct Console<W: Write> {
    out: W,
    verbose: bool,
    capture: bool,
    begin: String,
    end: String,
    phase: Phase,
    /// The current line (capped at `MAX_LINE`).
    line: Vec<u8>,
    /// Command phase: the current line is being printed as it arrives.
    printing: bool,
    /// A carriage return not yet printed (dropped if a newline follows).
    pending_cr: bool,
    /// Command phase: an empty line not yet printed (dropped if END follows).
    held_empty: bool,
    report: ConsoleReport,
}

impl<W: Write> Console<W> {
    /// A console for one run: `nonce` is the run's marker nonce; `verbose` prints the boot
    /// log too; `capture` keeps COMMAND's output lines in the report.
    pub fn new(out: W, nonce: &str, verbose: bool, capture: bool) -> Self {
        Self {
            out,
            verbose,
            capture,
            begin: format!("{BEGIN} {nonce}"),
            end: format!("{END} {nonce}"),
            phase: Phase::Boot,
            line: Vec::new(),
            printing: false,
            pending_cr: false,
            held_empty: false,
            report: ConsoleReport::default(),
        }
    }

    /// True once the guest got through its boot: COMMAND started, setup failed, or the
    /// kernel panicked (each ends the boot one way or another).
    pub fn booted(&self) -> bool {
        self.report.begun || self.report.setup_failure.is_some() || self.report.panic.is_some()
    }

    /// True once the exit marker was seen.
    pub fn exited(&self) -> bool {
        self.report.exit_status.is_some()
    }

    /// Processes bytes from the console.
    pub fn feed(&mut self, data: &[u8]) -> io::Result<()> {
        for &b in data {
            match self.phase {
                Phase::Command => self.command_byte(b)?,
                Phase::Boot | Phase::After => self.log_byte(b)?,
            }
        }
        self.out.flush()
    }

    /// Ends the stream (QEMU exited) and returns the writer and what was seen.
    pub fn finish(mut self) -> io::Result<(W, ConsoleReport)> {
        match self.phase {
            Phase::Command => {
                if !self.printing && !self.line.is_empty() {
                    self.flush_held_empty()?;
                    self.out.write_all(&self.line)?;
                    self.printing = true;
                }
                if self.printing {
                    self.out.write_all(b"\n")?;
                    let text = self.take_line();
                    self.command_line_done(text);
                }
            }
            Phase::Boot | Phase::After => {
                if !self.line.is_empty() {
                    let text = self.take_line();
                    self.log_line(text)?;
                }
            }
        }
        self.out.flush()?;
        Ok((self.out, self.report))
    }

    fn push(&mut self, b: u8) {
        if self.line.len() < MAX_LINE {
            self.line.push(b);
        }
    }

    fn take_line(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.line)
            .trim_end_matches('\r')
            .to_string();
        self.line.clear();
        s
    }

    fn flush_held_empty(&mut self) -> io::Result<()> {
        if self.held_empty {
            self.held_empty = false;
            self.out.write_all(b"\n")?;
            self.command_line_done(String::new());
        }
        Ok(())
    }

    fn command_line_done(&mut self, text: String) {
        if text.contains(PANIC) && self.report.panic.is_none() {
            self.report.panic = Some(strip_ansi(&text));
        }
        if self.capture {
            self.report.command_lines.push(text);
        }
    }

    fn command_byte(&mut self, b: u8) -> io::Result<()> {
        match b {
            b'\n' => {
                self.pending_cr = false;
                let text = self.take_line();
                if self.printing {
                    self.printing = false;
                    self.out.write_all(b"\n")?;
                    self.command_line_done(text);
                } else if text.is_empty() {
                    self.flush_held_empty()?;
                    self.held_empty = true;
                } else if text == self.end {
                    self.held_empty = false;
                    self.report.ended = true;
                    self.phase = Phase::After;
                } else {
                    self.flush_held_empty()?;
                    self.out.write_all(text.as_bytes())?;
                    self.out.write_all(b"\n")?;
                    self.command_line_done(text);
                }
            }
            b'\r' => {
                if self.pending_cr {
                    self.push(b'\r');
                    if self.printing {
                        self.out.write_all(b"\r")?;
                    }
                }
                self.pending_cr = true;
            }
            _ => {
                if self.pending_cr {
                    self.pending_cr = false;
                    self.push(b'\r');
                    if self.printing {
                        self.out.write_all(b"\r")?;
                    }
                }
                self.push(b);
                if self.printing {
                    self.out.write_all(&[b])?;
                } else if !self.end.as_bytes().starts_with(&self.line) {
                    // Cannot be the END marker: print what was held and stream the rest.
                    self.flush_held_empty()?;
                    self.out.write_all(&self.line)?;
                    self.printing = true;
                }
            }
        }
        Ok(())
    }

    fn log_byte(&mut self, b: u8) -> io::Result<()> {
        if b == b'\n' {
            let text = self.take_line();
            self.log_line(text)
        } else {
            self.push(b);
            Ok(())
        }
    }

    fn print_log_line(&mut self, text: &str) -> io::Result<()> {
        if self.verbose {
            self.out.write_all(text.as_bytes())?;
            self.out.write_all(b"\n")?;
        }
        Ok(())
    }

    fn log_line(&mut self, text: String) -> io::Result<()> {
        if text.contains(PANIC) && self.report.panic.is_none() {
            self.report.panic = Some(strip_ansi(&text));
        }
        match self.phase {
            Phase::Boot => {
                if text.contains(&self.begin) {
                    self.report.begun = true;
                    self.phase = Phase::Command;
                } else if let Some(i) = text.find(SETUP_FAILED) {
                    self.report.setup_failure =
                        Some(text[i + SETUP_FAILED.len()..].trim().to_string());
                    self.print_log_line(&text)?;
                } else {
                    self.print_log_line(&text)?;
                    if self.report.boot_log.len() == BOOT_LOG_LINES {
                        self.report.boot_log.pop_front();
                    }
                    self.report.boot_log.push_back(text);
                }
            }
            Phase::After => {
                if let Some(i) = text.find(DMAR_EXPECTED) {
                    self.report
                        .expected_dmar
                        .push(text[i + DMAR_EXPECTED.len()..].trim().to_string());
                } else if let Some(i) = text.find(DMESG_LOST) {
                    self.report.dmesg_lost = Some(text[i + DMESG_LOST.len()..].trim().to_string());
                } else if let Some(i) = text.find(DMESG) {
                    self.report.dmesg.push(text[i + DMESG.len()..].to_string());
                } else if let Some(i) = text.find(DMAR_FAULTS) {
                    self.report.guest_dmar_faults =
                        text[i + DMAR_FAULTS.len()..].trim().parse().ok();
                } else if let Some(i) = text.find(EXIT) {
                    self.report.exit_status = text[i + EXIT.len()..].trim().parse().ok();
                } else {
                    self.print_log_line(&text)?;
                    self.report.after_log.push(text);
                }
            }
            Phase::Command => unreachable!("command lines are handled byte by byte"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "n0nce";

    fn run(input: &[u8], chunk: usize, verbose: bool) -> (String, ConsoleReport) {
        let mut c = Console::new(Vec::new(), NONCE, verbose, true);
        for part in input.chunks(chunk) {
            c.feed(part).unwrap();
        }
        let (out, report) = c.finish().unwrap();
        (String::from_utf8(out).unwrap(), report)
    }

    fn guest(command_output: &str, faults: u32, status: i32, dmesg: &[&str]) -> Vec<u8> {
        let mut s = String::from(
            "\x1bc\x1b[?7lSeaBIOS\r\n[    0.000000] Linux version 6.1\r\nupnvme-init: binding\r\n",
        );
        s += &format!("UPNVME-BEGIN {NONCE}\r\n");
        s += &command_output.replace('\n', "\r\n");
        s += &format!("\r\nUPNVME-END {NONCE}\r\n");
        for d in dmesg {
            s += &format!("UPNVME-DMESG: {d}\r\n");
        }
        s += &format!(
            "UPNVME-DMAR-FAULTS: {faults}\r\nUPNVME-EXIT: {status}\r\n[    3.0] reboot: Power down\r\n"
        );
        s.into_bytes()
    }

    #[test]
    fn streams_command_output_only() {
        for chunk in [1, 2, 3, 7, 4096] {
            let (out, r) = run(
                &guest("hello\nworld\n", 0, 0, &["DMAR: IOMMU enabled"]),
                chunk,
                false,
            );
            assert_eq!(out, "hello\nworld\n", "chunk {chunk}");
            assert!(r.begun && r.ended);
            assert_eq!(r.exit_status, Some(0));
            assert_eq!(r.dmar_faults(), 0);
            assert_eq!(r.command_lines, ["hello", "world"]);
            assert_eq!(r.after_log, ["[    3.0] reboot: Power down"]);
            assert!(r.boot_log.iter().any(|l| l.contains("Linux version")));
        }
    }

    #[test]
    fn output_without_trailing_newline_and_empty_lines() {
        let (out, r) = run(&guest("no newline", 0, 7, &[]), 1, false);
        assert_eq!(out, "no newline\n");
        assert_eq!(r.exit_status, Some(7));
        let (out, r) = run(&guest("a\n\n\nb\n\n", 0, 0, &[]), 1, false);
        assert_eq!(out, "a\n\n\nb\n\n");
        assert_eq!(r.command_lines, ["a", "", "", "b", ""]);
        let (out, _) = run(&guest("", 0, 0, &[]), 1, false);
        assert_eq!(out, "");
    }

    #[test]
    fn lines_resembling_markers_are_output() {
        let text = "UPNVME-END\nUPNVME-END wrong\nUPNVME-EXIT: 3\nUPNVME-E\n";
        let (out, r) = run(&guest(text, 0, 1, &[]), 1, false);
        assert_eq!(out, text);
        assert_eq!(r.exit_status, Some(1));
    }

    #[test]
    fn carriage_returns() {
        let (out, _) = run(&guest("10%\r20%\n", 0, 0, &[]), 1, false);
        assert_eq!(out, "10%\r20%\n");
    }

    #[test]
    fn verbose_shows_boot_log_but_not_markers() {
        let (out, _) = run(&guest("x\n", 0, 0, &["DMAR: IOMMU enabled"]), 5, true);
        assert!(out.contains("Linux version 6.1\n"));
        assert!(out.contains("\nx\n"));
        assert!(out.contains("reboot: Power down"));
        assert!(!out.contains("UPNVME-"));
    }

    #[test]
    fn dmar_faults_are_counted() {
        let dmesg = [
            "[    5.1] DMAR: DRHD: handling fault status reg 2",
            "[    5.1] DMAR: [DMA Read NO_PASID] Request device [00:04.0] fault addr 0xfff000 [fault reason 0x06] PTE Read access is not set",
            "[    5.2] DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set",
            "[    0.1] DMAR: IOMMU enabled",
        ];
        let (_, r) = run(&guest("", 2, 0, &dmesg), 64, false);
        assert_eq!(r.dmar_faults(), 2);
        assert_eq!(r.dmar_fault_lines().len(), 3);
        // The host count wins when the guest's count is missing or lower.
        let (_, r) = run(&guest("", 0, 0, &dmesg), 64, false);
        assert_eq!(r.dmar_faults(), 2);
    }

    #[test]
    fn a_wrapped_kernel_log_is_reported() {
        let (_, r) = run(&guest("", 0, 0, &[]), 64, false);
        assert_eq!(r.dmesg_lost, None);
        let mut input = String::from_utf8(guest("", 0, 0, &[])).unwrap();
        let at = input.find("UPNVME-DMAR-FAULTS").unwrap();
        input.insert_str(
            at,
            "UPNVME-DMESG-LOST: [  812.5] vfio-pci 0000:00:04.0: reset\r\n",
        );
        let (_, r) = run(input.as_bytes(), 7, false);
        assert_eq!(
            r.dmesg_lost.as_deref(),
            Some("[  812.5] vfio-pci 0000:00:04.0: reset")
        );
    }

    #[test]
    fn expected_dmar_faults_are_not_counted_and_nothing_else_is_excused() {
        let write = "[    5.2] DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set";
        let read = "[    5.1] DMAR: [DMA Read NO_PASID] Request device [00:04.0] fault addr 0xfff000 [fault reason 0x06] PTE Read access is not set";
        let header = "[    5.1] DMAR: DRHD: handling fault status reg 2";
        let with = |patterns: &[&str], dmesg: &[&str]| {
            let mut input = String::from_utf8(guest("", 0, 0, dmesg)).unwrap();
            let at = input
                .find("UPNVME-DMESG")
                .unwrap_or(input.find("UPNVME-DMAR-FAULTS").unwrap());
            for p in patterns.iter().rev() {
                input.insert_str(at, &format!("UPNVME-DMAR-EXPECTED: {p}\r\n"));
            }
            run(input.as_bytes(), 16, false).1
        };
        let r = with(&[write], &[header, write]);
        assert_eq!((r.dmar_faults(), r.expected_dmar_faults()), (0, 1));
        // Another fault beside the expected one still counts.
        let r = with(&[write], &[header, write, read]);
        assert_eq!((r.dmar_faults(), r.expected_dmar_faults()), (1, 1));
        // A header-only fault beside the excused record counts.
        let r = with(&[write], &[header, write, header]);
        assert_eq!(r.dmar_faults(), 1);
        // One declaration excuses one record: the same line twice counts once.
        let r = with(&[write], &[header, write, write]);
        assert_eq!(r.dmar_faults(), 1);
        // Nothing but the identical record is excused.
        let later = write.replace("5.2]", "6.2]");
        for p in [
            "fault addr 0x1000 [fault reason 0x05]",
            "DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set",
            "",
            "DMAR",
            later.as_str(),
            read,
        ] {
            let r = with(&[p], &[header, write]);
            assert_eq!(r.dmar_faults(), 1, "declared {p:?}");
        }
        assert!(is_expected_dmar_record(write) && is_expected_dmar_record(read));
        assert!(is_expected_dmar_record(
            "[12.5] DMAR: [DMA Write] Request device [00:04.0] PASID ffffffff fault addr 7f000 [fault reason 05] PTE Write access is not set"
        ));
        assert!(!is_expected_dmar_record(header));
        assert!(!is_expected_dmar_record(
            "[ 1.x] DMAR: [DMA Write] fault addr 0"
        ));
    }

    #[test]
    fn rate_limited_fault_messages_count() {
        // dmar_fault() rate-limits its header and records together (10 per 5 s); when a
        // later fault opens a new window the kernel says how many it swallowed. Those are
        // faults nobody saw: never excusable, never zero.
        let suppressed = "[   12.0] dmar_fault: 4 callbacks suppressed";
        assert_eq!(count_dmar_faults([suppressed]), 1);
        let write = "[    5.2] DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set";
        let header = "[    5.1] DMAR: DRHD: handling fault status reg 2";
        assert_eq!(
            count_unexpected_dmar_faults([header, write, suppressed], &[write.to_string()]),
            1
        );
        let mut input = String::from_utf8(guest("", 0, 0, &[header, write, suppressed])).unwrap();
        let at = input.find("UPNVME-DMESG").unwrap();
        input.insert_str(at, &format!("UPNVME-DMAR-EXPECTED: {write}\r\n"));
        let (_, r) = run(input.as_bytes(), 16, false);
        assert_eq!(r.dmar_faults(), 1);
        assert!(r.dmar_fault_lines().contains(&suppressed));
        // Other rate-limit notices are not IOMMU faults.
        assert_eq!(
            count_dmar_faults(["[ 3.0] nvme_poll: 3 callbacks suppressed"]),
            0
        );
    }

    #[test]
    fn dmar_line_classification() {
        assert!(is_dmar_fault_record(
            "DMAR: [DMA Read] Request device [00:04.0] PASID ffffffff fault addr fff000 [fault reason 06] PTE Read access is not set"
        ));
        assert!(is_dmar_fault_record(
            "DMAR: [INTR-REMAP] Request device [00:04.0] fault index 0x4 [fault reason 0x25] Blocked a compatibility format interrupt request"
        ));
        assert!(!is_dmar_fault_record("DMAR: Host address width 39"));
        assert!(!is_dmar_fault_record(
            "DMAR-IR: Enabled IRQ remapping in xapic mode"
        ));
        assert_eq!(
            count_dmar_faults(["DMAR: DRHD: handling fault status reg 3"]),
            1
        );
        assert_eq!(
            count_dmar_faults(["DMAR: No RMRR found", "DMAR: No ATSR found"]),
            0
        );
    }

    #[test]
    fn setup_failure_and_panic() {
        let input = b"boot\r\nUPNVME-SETUP-FAILED: could not bind 0000:00:04.0\r\n";
        let (out, r) = run(input, 3, false);
        assert_eq!(out, "");
        assert!(!r.begun);
        assert_eq!(
            r.setup_failure.as_deref(),
            Some("could not bind 0000:00:04.0")
        );

        let input = b"[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs\r\n[ 1.0] ---[ end ]---\r\n";
        let (_, r) = run(input, 4, false);
        assert!(r.panic.unwrap().contains("Unable to mount root"));

        let mut input = format!("UPNVME-BEGIN {NONCE}\r\nrunning\r\n").into_bytes();
        input.extend_from_slice(b"[ 9.0] Kernel panic - not syncing: Fatal exception\r\n");
        let (out, r) = run(&input, 1, false);
        assert!(out.contains("Kernel panic"));
        assert!(r.panic.is_some() && r.begun && !r.ended);
    }

    #[test]
    fn partial_output_is_flushed_at_eof() {
        let input = format!("UPNVME-BEGIN {NONCE}\r\nhalf a li").into_bytes();
        let mut c = Console::new(Vec::new(), NONCE, false, true);
        c.feed(&input).unwrap();
        assert_eq!(c.out, b"half a li");
        let (out, r) = c.finish().unwrap();
        assert_eq!(out, b"half a li\n");
        assert_eq!(r.command_lines, ["half a li"]);
        // Held bytes that could still become END are printed at EOF.
        let input = format!("UPNVME-BEGIN {NONCE}\r\nUPNV").into_bytes();
        let mut c = Console::new(Vec::new(), NONCE, false, true);
        c.feed(&input).unwrap();
        assert!(c.out.is_empty());
        let (out, r) = c.finish().unwrap();
        assert_eq!(out, b"UPNV\n");
        assert_eq!(r.command_lines, ["UPNV"]);
    }

    #[test]
    fn ansi() {
        assert_eq!(
            strip_ansi("test result: \x1b[32mok\x1b[0m. 3 passed"),
            "test result: ok. 3 passed"
        );
        assert_eq!(strip_ansi("\x1bc\x1b[?7lSeaBIOS"), "SeaBIOS");
    }
}

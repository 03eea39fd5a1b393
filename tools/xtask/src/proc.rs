//! Running host programs, always with a timeout.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Waits for `child` for at most `timeout`; kills it and returns `None` when the time is up.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            // The child may have exited in between: kill() then fails, wait() reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How long to wait for a pipe to drain after its writer exited (a process the child left
/// behind could keep it open forever).
pub const PIPE_GRACE: Duration = Duration::from_secs(10);

/// A value computed on a background thread, typically by draining a pipe.
pub struct Background<T>(mpsc::Receiver<T>);

/// Runs `f` on a new thread.
pub fn background<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Background<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    Background(rx)
}

impl<T> Background<T> {
    /// The thread's result, or `None` if it did not finish within `timeout` (or panicked).
    pub fn wait(self, timeout: Duration) -> Option<T> {
        self.0.recv_timeout(timeout).ok()
    }
}

/// Describes a command for error messages: `program arg1 arg2 ...`.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&crate::cli::shell_quote(&a.to_string_lossy()));
    }
    s
}

/// Runs `cmd` with stdin closed and stdout/stderr captured; fails on timeout (killing it),
/// but not on a non-zero exit status (check `Output::status`).
pub fn run_captured(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run `{what}`"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_thread = background(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_thread = background(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status =
        wait_timeout(&mut child, timeout).with_context(|| format!("waiting for `{what}`"))?;
    let stdout = out_thread.wait(PIPE_GRACE).unwrap_or_default();
    let stderr = err_thread.wait(PIPE_GRACE).unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "`{what}` did not finish within {} s and was killed",
            timeout.as_secs()
        ),
    }
}

/// Runs `cmd` with stdin closed and its output on the terminal (a build whose progress the
/// user watches); fails on timeout (killing it) and on a non-zero exit status.
pub fn run_inherited(cmd: &mut Command, timeout: Duration) -> Result<()> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run `{what}`"))?;
    match wait_timeout(&mut child, timeout).with_context(|| format!("waiting for `{what}`"))? {
        None => bail!(
            "`{what}` did not finish within {} s and was killed",
            timeout.as_secs()
        ),
        Some(status) if !status.success() => bail!("`{what}` failed ({status})"),
        Some(_) => Ok(()),
    }
}

/// Like [`run_captured`], and also fails on a non-zero exit status, quoting the tail of
/// the program's output.
pub fn run_checked(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let what = describe(cmd);
    let out = run_captured(cmd, timeout)?;
    if !out.status.success() {
        bail!(
            "`{what}` failed ({}):\n{}",
            out.status,
            output_tail(&out, 25)
        );
    }
    Ok(out)
}

/// The last `n` lines of a program's stdout and stderr, for error messages.
pub fn output_tail(out: &Output, n: usize) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    tail_lines(&text, n)
}

/// The last `n` lines of `text`, each indented by two spaces.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_and_timeout() {
        let out = run_captured(
            Command::new("sh").args(["-c", "echo hi; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"err\n");
        let start = Instant::now();
        let e =
            run_captured(Command::new("sleep").arg("20"), Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("was killed"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(run_checked(&mut Command::new("false"), Duration::from_secs(10)).is_err());
    }

    #[test]
    fn tails() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "  b\n  c");
        assert_eq!(tail_lines("", 2), "");
    }
}

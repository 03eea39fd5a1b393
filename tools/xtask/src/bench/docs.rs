//! docs/benchmarks.md: generated blocks between HTML comment markers, so the
//! hand-written analysis around them survives a new run.

use std::path::Path;

use anyhow::{Context, Result};

/// The block `cargo xtask bench` writes.
pub const BENCH_BLOCK: &str = "bench";
/// The block `cargo xtask cost` writes.
pub const COST_BLOCK: &str = "cost";

/// The file written when docs/benchmarks.md does not exist yet.
const SKELETON: &str = "# Benchmarks

Generated parts are rewritten by `cargo xtask bench` and `cargo xtask cost`;
everything outside the marked blocks is kept.

## Guest benchmark: upnvme, the raw floor and the kernel side by side

<!-- bench:begin -->
<!-- bench:end -->

## Driver CPU work per I/O (host, callgrind)

<!-- cost:begin -->
<!-- cost:end -->
";

/// Replaces the content of block `name` in `text` (appending the block when the
/// markers are missing).
pub fn replace_block(text: &str, name: &str, content: &str) -> String {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let body = format!("{begin}\n{}\n{end}", content.trim_end());
    match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{body}{}", &text[..b], &text[e + end.len()..])
        }
        _ => {
            let mut t = text.trim_end().to_string();
            t.push_str("\n\n");
            t.push_str(&body);
            t.push('\n');
            t
        }
    }
}

/// Writes block `name` of the Markdown file at `path`, creating the file from
/// the skeleton if needed.
pub fn write_block(path: &Path, name: &str, content: &str) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => SKELETON.to_string(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    std::fs::write(path, replace_block(&text, name, content))
        .with_context(|| format!("writing {}", path.display()))
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Now, as [`utc`].
pub fn now_utc() -> String {
    utc(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks() {
        let t = "intro\n<!-- bench:begin -->\nold\n<!-- bench:end -->\nanalysis\n";
        let n = replace_block(t, "bench", "new\n");
        assert_eq!(
            n,
            "intro\n<!-- bench:begin -->\nnew\n<!-- bench:end -->\nanalysis\n"
        );
        let n = replace_block("intro\n", "cost", "c");
        assert_eq!(n, "intro\n\n<!-- cost:begin -->\nc\n<!-- cost:end -->\n");
        let s = replace_block(SKELETON, "cost", "x");
        assert!(s.contains("<!-- cost:begin -->\nx\n<!-- cost:end -->"));
        assert!(s.contains("<!-- bench:begin -->\n<!-- bench:end -->"));
    }

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400 + 3_661), "2000-02-29 01:01 UTC");
        assert_eq!(utc(1_767_225_600), "2026-01-01 00:00 UTC");
    }
}

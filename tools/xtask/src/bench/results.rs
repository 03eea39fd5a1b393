//! Reading the guest's results port: markers, gzip + base64 payloads, and the
//! JSON each contender prints (`upnvme perf --json`, `upnvme-rawfloor --json`,
//! `fio --output-format=json`).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::contenders::{Contender, INFO, Kind, RESULT, RESULT_END};

/// A latency distribution, as the contender reported it.
#[derive(Debug, Clone, PartialEq)]
pub enum Cdf {
    /// `[value_us, count]` buckets of an HDR histogram (upnvme, raw floor).
    Histogram(Vec<(f64, u64)>),
    /// `(percentile, value_us)` points (fio's percentile list).
    Percentiles(Vec<(f64, f64)>),
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// Mean latency in microseconds.
    pub mean_us: f64,
    /// Median latency in microseconds.
    pub p50_us: f64,
    /// 99th percentile latency in microseconds.
    pub p99_us: f64,
    /// I/Os per second.
    pub iops: f64,
    /// I/Os completed with an error status.
    pub errors: u64,
    /// SQ tail doorbell MMIO writes per I/O (upnvme and raw floor).
    pub sq_mmio_per_io: Option<f64>,
    /// CQ head doorbell MMIO writes per I/O (upnvme and raw floor).
    pub cq_mmio_per_io: Option<f64>,
    /// The latency distribution.
    pub cdf: Cdf,
}

/// One run of one contender in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// Contender id.
    pub id: String,
    /// Round, 1-based.
    pub round: usize,
    /// The program's exit status in the guest.
    pub status: i32,
    /// The measurement, when the run succeeded and its output parsed.
    pub metrics: Option<Metrics>,
    /// Why there is no measurement.
    pub error: Option<String>,
}

/// Everything the results port carried.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// The runs, in order.
    pub runs: Vec<RunResult>,
    /// `BENCH-INFO` facts (kernel release, fio version, ...).
    pub info: BTreeMap<String, String>,
}

/// Parses the results port's text (serial output: `\r` tolerated).
pub fn parse_port(text: &str, contenders: &[Contender]) -> Collected {
    let mut out = Collected::default();
    let mut current: Option<(String, usize, i32, String)> = None;
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some((id, round, status, mut payload)) = current.take() {
            if line.trim() == RESULT_END {
                out.runs
                    .push(decode_run(id, round, status, &payload, contenders));
            } else {
                payload.push_str(line.trim());
                current = Some((id, round, status, payload));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix(INFO) {
            let rest = rest.trim();
            let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
            out.info.insert(k.to_string(), v.trim().to_string());
        } else if let Some(rest) = line.strip_prefix(RESULT) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let [id, round, status] = f[..]
                && let (Ok(r), Ok(s)) = (round.parse(), status.parse())
            {
                current = Some((id.to_string(), r, s, String::new()));
            }
        }
    }
    if let Some((id, round, status, _)) = current {
        out.runs.push(RunResult {
            id,
            round,
            status,
            metrics: None,
            error: Some("the result was cut off (the guest stopped while sending it)".into()),
        });
    }
    out
}

fn decode_run(
    id: String,
    round: usize,
    status: i32,
    payload: &str,
    contenders: &[Contender],
) -> RunResult {
    let parsed = (|| -> Result<Metrics> {
        let gz = base64_decode(payload)?;
        let raw = gunzip(&gz)?;
        let text = String::from_utf8_lossy(&raw);
        if status != 0 {
            bail!(
                "exit status {status}: {}",
                text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            );
        }
        let kind = contenders
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.kind)
            .with_context(|| format!("unknown contender {id}"))?;
        parse_output(kind, &text)
    })();
    match parsed {
        Ok(m) => RunResult {
            id,
            round,
            status,
            metrics: Some(m),
            error: None,
        },
        Err(e) => RunResult {
            id,
            round,
            status,
            metrics: None,
            error: Some(format!("{e:#}")),
        },
    }
}

/// Parses one contender's output.
pub fn parse_output(kind: Kind, text: &str) -> Result<Metrics> {
    let start = text.find('{').context("no JSON document in the output")?;
    let doc: Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()
        .context("empty output")?
        .context("the output is not JSON")?;
    match kind {
        Kind::Upnvme { .. } | Kind::RawFloor | Kind::RawFloorSqFirst | Kind::DriverLoop => {
            parse_upnvme(&doc)
        }
        Kind::Fio(_) => parse_fio(&doc),
    }
}

fn num(v: &Value, what: &str) -> Result<f64> {
    v.as_f64()
        .with_context(|| format!("{what} is missing or not a number"))
}

/// `upnvme perf --json` (and the raw floor, which prints the same fields).
fn parse_upnvme(doc: &Value) -> Result<Metrics> {
    let t = &doc["total"];
    let l = &t["latency"];
    let p = &l["percentiles_us"];
    let hist = doc["histogram_us_count"]
        .as_array()
        .context("histogram_us_count is missing")?
        .iter()
        .filter_map(|b| Some((b.get(0)?.as_f64()?, b.get(1)?.as_u64()?)))
        .collect();
    let ios = t["ios"].as_f64().unwrap_or(0.0).max(1.0);
    let tr = &t["transport"];
    let per_io = |k: &str| tr[k].as_f64().map(|n| n / ios);
    Ok(Metrics {
        mean_us: num(&l["mean_us"], "total.latency.mean_us")?,
        p50_us: num(&p["p50"], "total.latency.percentiles_us.p50")?,
        p99_us: num(&p["p99"], "total.latency.percentiles_us.p99")?,
        iops: num(&t["iops"], "total.iops")?,
        errors: t["errors"].as_u64().unwrap_or(0),
        sq_mmio_per_io: per_io("sq_doorbell_mmio"),
        cq_mmio_per_io: per_io("cq_doorbell_mmio"),
        cdf: Cdf::Histogram(hist),
    })
}

/// `fio --output-format=json` with `--lat_percentiles=1`: the first job's reads,
/// total latency (submission to completion) when fio reports its percentiles,
/// completion latency otherwise.
fn parse_fio(doc: &Value) -> Result<Metrics> {
    let job = &doc["jobs"][0];
    if job.is_null() {
        bail!("fio reported no job");
    }
    if let Some(e) = job["error"].as_i64().filter(|e| *e != 0) {
        bail!("fio job error {e}");
    }
    let read = &job["read"];
    let lat = if read["lat_ns"]["percentile"].is_object() {
        &read["lat_ns"]
    } else {
        &read["clat_ns"]
    };
    let pct: Vec<(f64, f64)> = lat["percentile"]
        .as_object()
        .context("fio reported no latency percentiles")?
        .iter()
        .filter_map(|(k, v)| Some((k.parse::<f64>().ok()?, v.as_f64()? / 1000.0)))
        .collect();
    let at = |p: f64| {
        pct.iter()
            .find(|(q, _)| (q - p).abs() < 1e-6)
            .map(|(_, v)| *v)
            .with_context(|| format!("fio reported no {p}th percentile"))
    };
    let mean_ns = num(&read["lat_ns"]["mean"], "read.lat_ns.mean")?;
    Ok(Metrics {
        mean_us: mean_ns / 1000.0,
        p50_us: at(50.0)?,
        p99_us: at(99.0)?,
        iops: num(&read["iops"], "read.iops")?,
        errors: job["total_err"].as_u64().unwrap_or(0),
        sq_mmio_per_io: None,
        cq_mmio_per_io: None,
        cdf: Cdf::Percentiles(pct),
    })
}

/// Decodes standard base64 (whitespace ignored, `=` padding optional).
pub fn base64_decode(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            c if c.is_ascii_whitespace() => continue,
            c => bail!("invalid base64 character {:?}", c as char),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// Decompresses a gzip member (RFC 1952).
pub fn gunzip(data: &[u8]) -> Result<Vec<u8>> {
    if data.len() < 18 || data[0] != 0x1f || data[1] != 0x8b || data[2] != 8 {
        bail!("not gzip data");
    }
    let flags = data[3];
    let mut i = 10;
    if flags & 4 != 0 {
        let n = usize::from(u16::from_le_bytes([data[i], data[i + 1]]));
        i += 2 + n;
    }
    for bit in [8u8, 16] {
        if flags & bit != 0 {
            while i < data.len() && data[i] != 0 {
                i += 1;
            }
            i += 1;
        }
    }
    if flags & 2 != 0 {
        i += 2;
    }
    if i >= data.len() {
        bail!("truncated gzip header");
    }
    miniz_oxide::inflate::decompress_to_vec(&data[i..])
        .map_err(|e| anyhow::anyhow!("corrupt gzip data: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::contenders;

    #[test]
    fn base64() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(
            base64_decode("aGVs\nbG8gd29y\r\nbGQ=").unwrap(),
            b"hello world"
        );
        assert!(base64_decode("a*b").is_err());
    }

    #[test]
    fn gzip_roundtrip() {
        // `printf 'hi\n' | gzip -c | base64`
        let gz = base64_decode("H4sIAAAAAAAAA8vI5AIAenpv7QMAAAA=").unwrap();
        assert_eq!(gunzip(&gz).unwrap(), b"hi\n");
        assert!(gunzip(b"nope").is_err());
    }

    const UPNVME: &str = r#"{"total":{"ios":1000,"errors":0,"iops":40000.5,
        "latency":{"mean_us":24.5,"percentiles_us":{"p50":20.1,"p99":80.2}},
        "transport":{"sq_doorbell_mmio":1000,"cq_doorbell_mmio":4}},
        "histogram_us_count":[[10.0,500],[30.0,500]]}"#;

    const FIO: &str = r#"note: both iodepth >= 1 and synchronous I/O engine selected
{"fio version":"fio-3.33","jobs":[{"jobname":"bench","error":0,"total_err":0,
 "read":{"iops":11000.0,"lat_ns":{"mean":88000.0,
   "percentile":{"1.000000":30000,"50.000000":80000,"99.000000":200000}},
   "clat_ns":{"mean":87000.0}}}]}"#;

    #[test]
    fn upnvme_json() {
        let m = parse_output(contenders::UPNVME_DEFAULT, UPNVME).unwrap();
        assert_eq!((m.mean_us, m.p50_us, m.p99_us), (24.5, 20.1, 80.2));
        assert_eq!(m.iops, 40000.5);
        assert_eq!(m.sq_mmio_per_io, Some(1.0));
        assert_eq!(m.cq_mmio_per_io, Some(0.004));
        assert_eq!(m.cdf, Cdf::Histogram(vec![(10.0, 500), (30.0, 500)]));
    }

    #[test]
    fn fio_json() {
        let m = parse_output(Kind::Fio(contenders::FioEngine::Libaio), FIO).unwrap();
        assert_eq!((m.mean_us, m.p50_us, m.p99_us), (88.0, 80.0, 200.0));
        assert_eq!(m.iops, 11000.0);
        let Cdf::Percentiles(p) = m.cdf else {
            panic!("fio gives percentiles")
        };
        assert_eq!(p.len(), 3);
        assert!(parse_output(Kind::RawFloor, "garbage").is_err());
    }

    #[test]
    fn port_text() {
        let all = contenders::Set::Options.contenders();
        let text = "BENCH-INFO kernel 6.1.0-57-amd64\r\n\
                    BENCH-RESULT upnvme-qd1 1 0\r\n\
                    H4sIAAAAAAAAA8vI5AIAenpv7QMAAAA=\r\n\
                    BENCH-RESULT-END\r\n\
                    BENCH-RESULT rawfloor-qd1 2 1\r\n\
                    H4sIAAAAAAAAA8vI5AIAenpv7QMAAAA=\r\n\
                    BENCH-RESULT-END\r\n\
                    BENCH-RESULT fio-libaio-qd1 2 0\r\n\
                    H4sI\r\n";
        let c = parse_port(text, &all);
        assert_eq!(c.info["kernel"], "6.1.0-57-amd64");
        assert_eq!(c.runs.len(), 3);
        // "hi\n" is not JSON.
        assert!(c.runs[0].error.as_deref().unwrap().contains("JSON"));
        assert_eq!((c.runs[1].round, c.runs[1].status), (2, 1));
        assert!(
            c.runs[1]
                .error
                .as_deref()
                .unwrap()
                .contains("exit status 1")
        );
        assert!(c.runs[2].error.as_deref().unwrap().contains("cut off"));
    }
}

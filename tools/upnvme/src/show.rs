//! Human-readable output of `list`, `identify` and `smart-log`.

use anyhow::Result;
use upnvme::{Controller, ControllerOptions, Namespace};

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// `upnvme list`.
pub fn list() -> Result<()> {
    let all = upnvme::list_controllers()?;
    outln!(
        "{:<14} {:<10} {:<20} {:<20} {:>4} {:>12}",
        "Address",
        "Driver",
        "Model",
        "Serial",
        "NS",
        "Capacity"
    );
    // Namespaces the driver found but cannot use are not counted in "NS";
    // a line after the table names them, so the count does not hide them.
    let mut notes = Vec::new();
    for f in all {
        let driver = f.driver.clone().unwrap_or_else(|| "none".into());
        let (model, serial, ns, cap) = if driver == "vfio-pci" {
            match Controller::open(
                &f.address.to_string(),
                ControllerOptions {
                    async_events: 0,
                    ..Default::default()
                },
            ) {
                Ok(c) => {
                    let id = c.identify();
                    let total: u64 = c.namespaces().iter().map(Namespace::size_bytes).sum();
                    let r = (
                        id.mn.clone(),
                        id.sn.clone(),
                        c.namespaces().len().to_string(),
                        human_bytes(total),
                    );
                    let unusable = c.unusable_namespaces();
                    if !unusable.is_empty() {
                        notes.push(format!(
                            "{}: {} more namespace(s) the driver cannot use (NSID {}): see `upnvme identify -d {}`",
                            f.address,
                            unusable.len(),
                            unusable
                                .iter()
                                .map(|(n, _)| n.to_string())
                                .collect::<Vec<_>>()
                                .join(", "),
                            f.address
                        ));
                    }
                    let _ = c.close();
                    r
                }
                Err(e) => {
                    // Held by another process: say who, briefly (the table
                    // stays a table); any other failure in full.
                    let what = match crate::busy_group(&e) {
                        Some(path) => {
                            let holders = crate::setup::host::Host::default().group_holders(&path);
                            match holders.first() {
                                Some(h) => format!("(in use by {h})"),
                                None => "(in use by another process)".to_string(),
                            }
                        }
                        None => format!("({e})"),
                    };
                    (what, String::new(), "-".into(), "-".into())
                }
            }
        } else {
            let note = format!("(vendor {:04x} device {:04x})", f.vendor, f.device);
            (note, String::new(), "-".into(), "-".into())
        };
        outln!(
            "{:<14} {:<10} {:<20} {:<20} {:>4} {:>12}",
            f.address.to_string(),
            driver,
            model,
            serial,
            ns,
            cap
        );
    }
    for n in notes {
        outln!("{n}");
    }
    Ok(())
}

/// `upnvme identify`.
/// Prints decoded fields, indented under their name.
fn print_decoded(fields: &[crate::decode::Field]) -> Result<()> {
    for f in fields {
        if f.name == "lbaf" {
            for l in &f.lines {
                outln!("    {l}");
            }
            continue;
        }
        outln!("  {:<7} : {:#x}", f.name, f.value);
        for l in &f.lines {
            outln!("    {l}");
        }
    }
    Ok(())
}

pub fn identify(c: &Controller, nsid: Option<u32>, human: bool) -> Result<()> {
    if let Some(n) = nsid {
        c.namespace(n)
            .map_err(crate::usage::no_such_namespace_is_usage)?;
    }
    if nsid.is_none() {
        let id = c.identify();
        let cap = c.cap();
        outln!("Controller {}", c.device_name());
        outln!("  vid     : 0x{:04x}", id.vid);
        outln!("  ssvid   : 0x{:04x}", id.ssvid);
        outln!("  sn      : {}", id.sn);
        outln!("  mn      : {}", id.mn);
        outln!("  fr      : {}", id.fr);
        outln!(
            "  ver     : {}.{}.{} (VS register {})",
            id.ver >> 16,
            (id.ver >> 8) & 0xff,
            id.ver & 0xff,
            c.version()
        );
        outln!("  cntlid  : 0x{:04x}", id.cntlid);
        // MDTS is a power of two of CAP.MPSMIN pages (0: no limit); the
        // driver moves at most 4 MiB per command whatever it says.
        let moved = c.max_transfer_bytes().unwrap_or(0) as u64;
        let device = (id.mdts != 0).then(|| {
            1u64.checked_shl(u32::from(id.mdts))
                .and_then(|n| n.checked_mul(c.cap().min_page_size() as u64))
                .unwrap_or(u64::MAX)
        });
        match device {
            Some(d) if d <= moved => {
                outln!("  mdts    : {} ({} max transfer)", id.mdts, human_bytes(d))
            }
            Some(d) => outln!(
                "  mdts    : {} ({} max transfer; upnvme moves at most {} per command)",
                id.mdts,
                human_bytes(d),
                human_bytes(moved)
            ),
            None => outln!(
                "  mdts    : 0 (no limit; upnvme moves at most {} per command)",
                human_bytes(moved)
            ),
        }
        outln!(
            "  oacs    : 0x{:04x}{}",
            id.oacs,
            if id.oacs_doorbell_buffer_config() {
                " (Doorbell Buffer Config)"
            } else {
                ""
            }
        );
        outln!(
            "  oncs    : 0x{:04x} (compare {}, dsm {}, write zeroes {})",
            id.oncs,
            id.oncs_compare(),
            id.oncs_dsm(),
            id.oncs_write_zeroes()
        );
        outln!("  aerl    : {}", id.aerl);
        outln!("  elpe    : {}", id.elpe);
        outln!("  sqes    : 0x{:02x}", id.sqes);
        outln!("  cqes    : 0x{:02x}", id.cqes);
        outln!("  nn      : {}", id.nn);
        outln!("  vwc     : 0x{:02x}", id.vwc);
        outln!("  rtd3e   : {} us", id.rtd3e);
        outln!(
            "  crdt    : {} / {} / {} ms (Command Retry Delay Times 1-3)",
            u32::from(id.crdt[0]) * 100,
            u32::from(id.crdt[1]) * 100,
            u32::from(id.crdt[2]) * 100
        );
        outln!("  subnqn  : {}", id.subnqn);
        outln!(
            "  CAP     : 0x{:016x} (mqes {}: {} entries, to {} ms, dstrd {}, mpsmin {} B)",
            cap.0,
            // The field as JSON gives it (0's based) and what it means.
            cap.mqes(),
            cap.max_queue_entries(),
            // The register's value (500 ms units), not the wait bound
            // derived from it (`Cap::timeout_ms`, at least 500 ms).
            u64::from(cap.to()) * 500,
            cap.dstrd(),
            cap.min_page_size()
        );
        outln!("  I/O queue pairs granted : {}", c.granted_io_queues());
        outln!(
            "  shadow doorbells        : {}",
            if c.shadow_doorbells() { "on" } else { "off" }
        );
        outln!("  SQs and list pages      : {}", c.read_only_memory());
        if human {
            outln!("  decoded:");
            print_decoded(&crate::decode::controller(id))?;
        }
    }
    for ns in c.namespaces() {
        if nsid.is_some_and(|n| n != ns.id()) {
            continue;
        }
        let id = ns.identify();
        outln!("Namespace {}", ns.id());
        outln!(
            "  nsze    : {} blocks ({})",
            id.nsze,
            human_bytes(ns.size_bytes())
        );
        outln!("  ncap    : {}", id.ncap);
        outln!("  nuse    : {}", id.nuse);
        outln!("  nsfeat  : 0x{:02x}", id.nsfeat);
        outln!("  nlbaf   : {}", id.nlbaf);
        if id.nulbaf != 0 {
            outln!("  nulbaf  : {}", id.nulbaf);
        }
        outln!("  flbas   : 0x{:02x}", id.flbas);
        outln!("  mssrl   : {}", id.mssrl);
        outln!("  mcl     : {}", id.mcl);
        outln!("  msrc    : {}", id.msrc);
        let in_use = id.current_lba_format_index();
        for (i, f) in id.lbaf.iter().enumerate() {
            outln!(
                "  lbaf {i:2} : ms {:<3} lbads {:<2} rp {}{}",
                f.ms,
                f.lbads,
                f.rp,
                if in_use == i { " (in use)" } else { "" }
            );
        }
        outln!(
            "  lba size: {} bytes, metadata {} bytes",
            ns.lba_size(),
            ns.metadata_size()
        );
        if human {
            outln!("  decoded:");
            print_decoded(&crate::decode::namespace(id))?;
        }
    }
    for (n, why) in c.unusable_namespaces() {
        if nsid.is_none() {
            outln!("Namespace {n}");
            outln!("  not usable: {why}");
        }
    }
    Ok(())
}

/// `Controller::read_only_memory` as JSON: `{"state": "enforced" |
/// "fell_back" | "not_offered", "allocations": N, "reason": "…" | null}`
/// (`allocations`: those served read-write since the open).
fn read_only_memory_json(m: &upnvme::ReadOnlyMemory) -> serde_json::Value {
    match m {
        upnvme::ReadOnlyMemory::Enforced => {
            serde_json::json!({"state": "enforced", "allocations": 0, "reason": null})
        }
        upnvme::ReadOnlyMemory::FellBack {
            allocations,
            reason,
        } => {
            serde_json::json!({"state": "fell_back", "allocations": allocations, "reason": reason})
        }
        _ => serde_json::json!({"state": "not_offered", "allocations": 0, "reason": null}),
    }
}

/// `upnvme identify --json`.
pub fn identify_json(c: &Controller, nsid: Option<u32>, human: bool) -> Result<()> {
    if let Some(n) = nsid {
        c.namespace(n)
            .map_err(crate::usage::no_such_namespace_is_usage)?;
    }
    let id = c.identify();
    let cap = c.cap();
    let namespaces: Vec<serde_json::Value> = c
        .namespaces()
        .iter()
        .filter(|ns| nsid.is_none_or(|n| n == ns.id()))
        .map(|ns| {
            let i = ns.identify();
            let mut v = serde_json::json!({
                "nsid": ns.id(),
                "nsze": i.nsze,
                "ncap": i.ncap,
                "nuse": i.nuse,
                "nsfeat": i.nsfeat,
                "nlbaf": i.nlbaf,
                "nulbaf": i.nulbaf,
                "flbas": i.flbas,
                "mssrl": i.mssrl,
                "mcl": i.mcl,
                "msrc": i.msrc,
                "lba_size": ns.lba_size(),
                "metadata_size": ns.metadata_size(),
                "size_bytes": ns.size_bytes(),
                "lbaf": i.lbaf.iter().map(|f| serde_json::json!({"ms": f.ms, "lbads": f.lbads, "rp": f.rp})).collect::<Vec<_>>(),
                "mc": i.mc, "dpc": i.dpc, "dps": i.dps,
            });
            if human {
                v["decoded"] = crate::decode::to_json(&crate::decode::namespace(i));
            }
            v
        })
        .collect();
    let mut doc = serde_json::json!({
        "device": c.device_name(),
        "controller": {
            "vid": id.vid, "ssvid": id.ssvid, "sn": id.sn, "mn": id.mn, "fr": id.fr,
            "rab": id.rab, "cmic": id.cmic, "mdts": id.mdts, "cntlid": id.cntlid, "ver": id.ver,
            "rtd3r": id.rtd3r, "rtd3e": id.rtd3e, "oaes": id.oaes, "ctratt": id.ctratt,
            "cntrltype": id.cntrltype, "crdt": id.crdt, "ocfs": id.ocfs,
            "oacs": id.oacs, "acl": id.acl, "aerl": id.aerl, "frmw": id.frmw, "lpa": id.lpa,
            "elpe": id.elpe, "npss": id.npss, "wctemp": id.wctemp, "cctemp": id.cctemp,
            "sqes": id.sqes, "cqes": id.cqes, "nn": id.nn, "oncs": id.oncs, "fuses": id.fuses,
            "fna": id.fna, "vwc": id.vwc, "awun": id.awun, "awupf": id.awupf, "sgls": id.sgls,
            "subnqn": id.subnqn,
        },
        "registers": {
            // Also as a hex string: CAP can exceed 2^53, which JSON
            // readers that use doubles (JavaScript, jq) round.
            "cap": cap.0, "cap_hex": format!("0x{:016x}", cap.0), "mqes": cap.mqes(), "max_queue_entries": cap.max_queue_entries(), "to_ms": u64::from(cap.to()) * 500, "dstrd": cap.dstrd(),
            "version": c.version().to_string(),
        },
        "granted_io_queue_pairs": c.granted_io_queues(),
        "max_transfer_bytes": c.max_transfer_bytes(),
        "shadow_doorbells": c.shadow_doorbells(),
        "read_only_memory": read_only_memory_json(&c.read_only_memory()),
        "namespaces": namespaces,
        // Active namespaces the driver cannot use (`upnvme format` can
        // make them usable).
        "unusable_namespaces": c
            .unusable_namespaces()
            .iter()
            .map(|(n, why)| serde_json::json!({"nsid": n, "reason": why}))
            .collect::<Vec<_>>(),
    });
    if human {
        doc["controller"]["decoded"] = crate::decode::to_json(&crate::decode::controller(id));
    }
    outln!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// `upnvme smart-log [--json]`.
pub fn smart_log(c: &Controller, json: bool) -> Result<()> {
    let s = c.smart_log()?;
    if json {
        let doc = smart_log_json(c.device_name(), &s);
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        out!("{}", smart_log_text(c.device_name(), &s));
    }
    Ok(())
}

/// Critical Warning's bits (Base 2.0, "SMART / Health Information Log
/// Page", byte 0).
const CRITICAL_WARNING: [(u32, &str); 6] = [
    (0, "available spare below threshold"),
    (1, "temperature outside a threshold"),
    (2, "NVM subsystem reliability degraded"),
    (3, "media placed in read-only mode"),
    (4, "volatile memory backup device failed"),
    (5, "Persistent Memory Region read-only"),
];

/// The bits set in Critical Warning, in words ("none" when clear).
fn critical_warnings(cw: u8) -> String {
    if cw == 0 {
        return "none".to_string();
    }
    let mut words: Vec<String> = CRITICAL_WARNING
        .iter()
        .filter(|&&(bit, _)| cw >> bit & 1 != 0)
        .map(|&(_, what)| what.to_string())
        .collect();
    if cw & 0xc0 != 0 {
        words.push(format!("reserved bits {:#04x}", cw & 0xc0));
    }
    words.join(", ")
}

/// A Data Units counter (thousands of 512-byte units, rounded up) in bytes
/// with an SI prefix, as nvme-cli prints it: `1000` → `512.00 MB`.
fn data_units(units: u128) -> String {
    const PREFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let bytes = units.saturating_mul(512_000);
    let mut v = bytes as f64;
    let mut p = 0;
    while v >= 1000.0 && p < PREFIXES.len() - 1 {
        v /= 1000.0;
        p += 1;
    }
    if p == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}B", PREFIXES[p])
    }
}

/// A temperature in kelvin, and in degrees Celsius (kelvin − 273).
fn kelvin(k: u16) -> String {
    format!("{k} K ({} C)", i32::from(k) - 273)
}

/// The SMART / Health Information log as `upnvme smart-log` prints it:
/// every field of the page, one a line.
fn smart_log_text(device: &str, s: &upnvme::queues::SmartLog) -> String {
    let mut t = format!("SMART / Health Information log of {device}\n");
    let mut line = |name: &str, value: String| t.push_str(&format!("  {name:<20}: {value}\n"));
    line(
        "critical_warning",
        format!(
            "0x{:02x} ({})",
            s.critical_warning,
            critical_warnings(s.critical_warning)
        ),
    );
    line("temperature", kelvin(s.temperature_kelvin));
    line("available_spare", format!("{}%", s.avail_spare));
    line("spare_threshold", format!("{}%", s.spare_thresh));
    line("percentage_used", format!("{}%", s.percent_used));
    line(
        "endurance_grp_warn",
        format!("0x{:02x}", s.endu_grp_crit_warn),
    );
    line(
        "data_units_read",
        format!("{} ({})", s.data_units_read, data_units(s.data_units_read)),
    );
    line(
        "data_units_written",
        format!(
            "{} ({})",
            s.data_units_written,
            data_units(s.data_units_written)
        ),
    );
    line("host_read_commands", s.host_read_commands.to_string());
    line("host_write_commands", s.host_write_commands.to_string());
    line(
        "controller_busy_time",
        format!("{} minutes", s.ctrl_busy_time),
    );
    line("power_cycles", s.power_cycles.to_string());
    line("power_on_hours", s.power_on_hours.to_string());
    line("unsafe_shutdowns", s.unsafe_shutdowns.to_string());
    line("media_errors", s.media_errors.to_string());
    line("num_err_log_entries", s.num_err_log_entries.to_string());
    line(
        "warning_temp_time",
        format!("{} minutes", s.warning_temp_time),
    );
    line(
        "critical_comp_time",
        format!("{} minutes", s.critical_comp_time),
    );
    // 0: the sensor is not implemented.
    for (i, &k) in s.temp_sensors.iter().enumerate() {
        if k != 0 {
            line(&format!("temperature_sensor_{}", i + 1), kelvin(k));
        }
    }
    line("thm_temp1_trans_count", s.thm_temp1_trans_count.to_string());
    line("thm_temp2_trans_count", s.thm_temp2_trans_count.to_string());
    line(
        "thm_temp1_total_time",
        format!("{} seconds", s.thm_temp1_total_time),
    );
    line(
        "thm_temp2_total_time",
        format!("{} seconds", s.thm_temp2_total_time),
    );
    t
}

/// The SMART / Health Information log as `upnvme smart-log --json` prints
/// it: the 128-bit counters as decimal strings (beyond what a JSON number
/// carries exactly), the rest as numbers; `temperature_sensors_kelvin`
/// holds Temperature Sensor 1..8, 0 for a sensor not implemented.
fn smart_log_json(device: &str, s: &upnvme::queues::SmartLog) -> serde_json::Value {
    serde_json::json!({
        "device": device,
        "critical_warning": s.critical_warning,
        "temperature_kelvin": s.temperature_kelvin,
        "available_spare": s.avail_spare,
        "spare_threshold": s.spare_thresh,
        "percentage_used": s.percent_used,
        "endurance_grp_critical_warning_summary": s.endu_grp_crit_warn,
        "data_units_read": s.data_units_read.to_string(),
        "data_units_written": s.data_units_written.to_string(),
        "host_read_commands": s.host_read_commands.to_string(),
        "host_write_commands": s.host_write_commands.to_string(),
        "controller_busy_time": s.ctrl_busy_time.to_string(),
        "power_cycles": s.power_cycles.to_string(),
        "power_on_hours": s.power_on_hours.to_string(),
        "unsafe_shutdowns": s.unsafe_shutdowns.to_string(),
        "media_errors": s.media_errors.to_string(),
        "num_err_log_entries": s.num_err_log_entries.to_string(),
        "warning_temp_time": s.warning_temp_time,
        "critical_comp_time": s.critical_comp_time,
        "temperature_sensors_kelvin": s.temp_sensors,
        "thm_temp1_trans_count": s.thm_temp1_trans_count,
        "thm_temp2_trans_count": s.thm_temp2_trans_count,
        "thm_temp1_total_time": s.thm_temp1_total_time,
        "thm_temp2_total_time": s.thm_temp2_total_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use upnvme::queues::SmartLog;

    /// Every field of the page is shown, in its unit: the text and JSON
    /// left out the Endurance Group Critical Warning Summary, Warning and
    /// Critical Composite Temperature Time, the temperature sensors and the
    /// thermal management counters the library parses, printed Critical
    /// Warning as a number only and Data Units without saying they count
    /// thousands of 512-byte units.
    #[test]
    fn the_smart_log_shows_every_field_in_its_unit() {
        let mut s = SmartLog {
            critical_warning: 0x05,
            temperature_kelvin: 310,
            avail_spare: 100,
            spare_thresh: 10,
            percent_used: 3,
            endu_grp_crit_warn: 0x01,
            data_units_read: 2_000,
            data_units_written: 3,
            host_read_commands: u128::MAX,
            ctrl_busy_time: 7,
            warning_temp_time: 11,
            critical_comp_time: 2,
            thm_temp1_trans_count: 4,
            thm_temp2_total_time: 90,
            ..SmartLog::default()
        };
        s.temp_sensors[0] = 305;
        s.temp_sensors[2] = 320;
        // Through the page's bytes, as the controller sends them.
        let s = SmartLog::parse(&s.to_bytes()).unwrap();
        let t = smart_log_text("0000:00:04.0", &s);
        for want in [
            "  critical_warning    : 0x05 (available spare below threshold, NVM subsystem reliability degraded)",
            "  temperature         : 310 K (37 C)",
            "  endurance_grp_warn  : 0x01",
            // 2000 × 1000 × 512 bytes.
            "  data_units_read     : 2000 (1.02 GB)",
            "  data_units_written  : 3 (1.54 MB)",
            "  host_read_commands  : 340282366920938463463374607431768211455",
            "  controller_busy_time: 7 minutes",
            "  warning_temp_time   : 11 minutes",
            "  critical_comp_time  : 2 minutes",
            "  temperature_sensor_1: 305 K (32 C)",
            "  temperature_sensor_3: 320 K (47 C)",
            "  thm_temp1_trans_count: 4",
            "  thm_temp2_total_time: 90 seconds",
        ] {
            assert!(t.lines().any(|l| l == want), "{want:?} missing from\n{t}");
        }
        assert!(!t.contains("temperature_sensor_2"), "{t}");
        let j = smart_log_json("0000:00:04.0", &s);
        assert_eq!(j["critical_warning"], 5);
        assert_eq!(j["data_units_read"], "2000");
        assert_eq!(j["host_read_commands"], u128::MAX.to_string());
        assert_eq!(j["endurance_grp_critical_warning_summary"], 1);
        assert_eq!(j["warning_temp_time"], 11);
        assert_eq!(j["critical_comp_time"], 2);
        assert_eq!(
            j["temperature_sensors_kelvin"],
            serde_json::json!([305, 0, 320, 0, 0, 0, 0, 0])
        );
        assert_eq!(j["thm_temp2_total_time"], 90);
    }

    #[test]
    fn critical_warning_and_data_units_in_words() {
        assert_eq!(critical_warnings(0), "none");
        assert_eq!(
            critical_warnings(0xff),
            "available spare below threshold, temperature outside a threshold, NVM subsystem \
             reliability degraded, media placed in read-only mode, volatile memory backup \
             device failed, Persistent Memory Region read-only, reserved bits 0xc0"
        );
        assert_eq!(data_units(0), "0 B");
        assert_eq!(data_units(1), "512.00 kB");
        // Saturated, and in the largest prefix.
        assert!(data_units(u128::MAX).ends_with(" EB"));
    }
}

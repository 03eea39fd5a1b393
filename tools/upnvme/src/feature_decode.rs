//! `upnvme get-feature -H`: a feature's value in words, as nvme-cli's
//! `get-feature -H` (NVMe Base Specification 2.0, "Feature Specific
//! Information": each feature's Command Dword 11 / Completion Queue Entry
//! Dword 0 layout, and the data structures of Autonomous Power State
//! Transition and Host Behavior Support). Pure functions of the values the
//! controller returned: a value with reserved bits set or a short data
//! structure decodes (and says so) without panicking.

use upnvme::queues::feature as fid;

/// The lines `-H` prints for feature `f`, read with Select `sel` and
/// command dword 11 `cdw11`, which returned `dw0` and the data structure
/// `data` (empty for a feature without one); `None` for a feature this
/// module does not decode (its value is printed raw).
pub fn decode(f: u8, sel: u8, cdw11: u32, dw0: u32, data: &[u8]) -> Option<Vec<String>> {
    // Select 011b: dword 0 holds the feature's capabilities, whatever it is.
    let lines = if sel == 3 {
        capabilities(dw0)
    } else {
        by_feature(f, cdw11, dw0, data)?
    };
    Some(lines.into_iter().filter(|l| !l.is_empty()).collect())
}

/// The lines of feature `f`'s value, empty ones included.
fn by_feature(f: u8, cdw11: u32, dw0: u32, data: &[u8]) -> Option<Vec<String>> {
    Some(match f {
        fid::ARBITRATION => arbitration(dw0),
        fid::POWER_MANAGEMENT => power_management(dw0),
        fid::TEMPERATURE_THRESHOLD => temperature_threshold(cdw11, dw0),
        fid::ERROR_RECOVERY => error_recovery(dw0),
        fid::VOLATILE_WRITE_CACHE => vec![
            format!("Volatile Write Cache Enable (WCE): {}", enabled(dw0 & 1)),
            reserved(dw0, !1),
        ],
        fid::NUMBER_OF_QUEUES => number_of_queues(dw0),
        fid::INTERRUPT_COALESCING => interrupt_coalescing(dw0),
        fid::INTERRUPT_VECTOR_CONFIG => vec![
            format!("Interrupt Vector (IV): {}", dw0 & 0xffff),
            format!("Coalescing Disable (CD): {}", yes(dw0 >> 16 & 1)),
            reserved(dw0, !0x1_ffff),
        ],
        fid::WRITE_ATOMICITY_NORMAL => vec![
            format!("Disable Normal (DN): {}", yes(dw0 & 1)),
            reserved(dw0, !1),
        ],
        fid::ASYNC_EVENT_CONFIG => async_event_config(dw0),
        fid::AUTONOMOUS_POWER_STATE_TRANSITION => apst(dw0, data),
        fid::HOST_BEHAVIOR_SUPPORT => host_behavior_support(data),
        _ => return None,
    })
}

/// Whether `-H` shows the feature's data structure in words, so the hex
/// dump is left out.
pub fn decodes_structure(f: u8, sel: u8) -> bool {
    sel != 3
        && matches!(
            f,
            fid::AUTONOMOUS_POWER_STATE_TRANSITION | fid::HOST_BEHAVIOR_SUPPORT
        )
}

fn enabled(bit: u32) -> &'static str {
    if bit != 0 { "enabled" } else { "disabled" }
}

fn yes(bit: u32) -> &'static str {
    if bit != 0 { "yes" } else { "no" }
}

/// A line naming the reserved bits (`mask`) set in `v`, or nothing.
fn reserved(v: u32, mask: u32) -> String {
    if v & mask != 0 {
        format!("reserved bits set: 0x{:08x}", v & mask)
    } else {
        String::new()
    }
}

/// Select 011b's dword 0: bit 0 saveable, bit 1 namespace specific, bit 2
/// changeable.
fn capabilities(dw0: u32) -> Vec<String> {
    vec![
        format!("[0] saveable: {}", yes(dw0 & 1)),
        format!("[1] namespace specific: {}", yes(dw0 >> 1 & 1)),
        format!("[2] changeable: {}", yes(dw0 >> 2 & 1)),
        reserved(dw0, !0x7),
    ]
}

/// Arbitration (01h): AB bits 2:0 (2^n commands, 111b no limit), LPW bits
/// 15:8, MPW 23:16, HPW 31:24 (weights, 0's based).
fn arbitration(dw0: u32) -> Vec<String> {
    let ab = dw0 & 0x7;
    let weight = |name: &str, shift: u32| {
        let w = dw0 >> shift & 0xff;
        format!("{name}: {w} (weight {})", w + 1)
    };
    vec![
        weight("High Priority Weight (HPW)", 24),
        weight("Medium Priority Weight (MPW)", 16),
        weight("Low Priority Weight (LPW)", 8),
        if ab == 7 {
            "Arbitration Burst (AB): 7 (no limit)".to_string()
        } else {
            format!("Arbitration Burst (AB): {ab} ({} commands)", 1u32 << ab)
        },
        reserved(dw0, 0xf8),
    ]
}

/// Power Management (02h): PS bits 4:0, WH bits 7:5.
fn power_management(dw0: u32) -> Vec<String> {
    let wh = dw0 >> 5 & 0x7;
    let hint = match wh {
        0 => "No Workload",
        1 => "Workload #1",
        2 => "Workload #2",
        _ => "reserved",
    };
    vec![
        format!("Workload Hint (WH): {wh} ({hint})"),
        format!("Power State (PS): {}", dw0 & 0x1f),
        reserved(dw0, !0xff),
    ]
}

/// Temperature Threshold (04h): TMPTH bits 15:0 in kelvin; TMPSEL bits
/// 19:16 and THSEL bits 21:20 say which threshold (taken from the
/// command's dword 11, which selected it).
fn temperature_threshold(cdw11: u32, dw0: u32) -> Vec<String> {
    let k = dw0 & 0xffff;
    let tmpsel = cdw11 >> 16 & 0xf;
    let sensor = match tmpsel {
        0 => "Composite Temperature".to_string(),
        1..=8 => format!("Temperature Sensor {tmpsel}"),
        0xf => "all temperature sensors".to_string(),
        _ => "reserved".to_string(),
    };
    let thsel = cdw11 >> 20 & 0x3;
    let kind = match thsel {
        0 => "Over Temperature Threshold",
        1 => "Under Temperature Threshold",
        _ => "reserved",
    };
    vec![
        format!(
            "Temperature Threshold (TMPTH): {k} K ({} °C)",
            i64::from(k) - 273
        ),
        format!("Threshold Temperature Select (TMPSEL): {tmpsel} ({sensor})"),
        format!("Threshold Type Select (THSEL): {thsel} ({kind})"),
    ]
}

/// Error Recovery (05h): TLER bits 15:0 in 100 ms units (0: no limit),
/// DULBE bit 16.
fn error_recovery(dw0: u32) -> Vec<String> {
    let tler = dw0 & 0xffff;
    vec![
        if tler == 0 {
            "Time Limited Error Recovery (TLER): 0 (no time limit)".to_string()
        } else {
            format!(
                "Time Limited Error Recovery (TLER): {tler} ({} ms)",
                u64::from(tler) * 100
            )
        },
        format!(
            "Deallocated or Unwritten Logical Block Error Enable (DULBE): {}",
            enabled(dw0 >> 16 & 1)
        ),
        reserved(dw0, !0x1_ffff),
    ]
}

/// Number of Queues (07h): NSQA bits 15:0, NCQA bits 31:16, both 0's based.
fn number_of_queues(dw0: u32) -> Vec<String> {
    let nsqa = dw0 & 0xffff;
    let ncqa = dw0 >> 16;
    vec![
        format!(
            "Number of I/O Completion Queues Allocated (NCQA): {ncqa} ({} queues)",
            ncqa + 1
        ),
        format!(
            "Number of I/O Submission Queues Allocated (NSQA): {nsqa} ({} queues)",
            nsqa + 1
        ),
    ]
}

/// Interrupt Coalescing (08h): THR bits 7:0 (0's based), TIME bits 15:8
/// in 100 µs units.
fn interrupt_coalescing(dw0: u32) -> Vec<String> {
    let time = dw0 >> 8 & 0xff;
    let thr = dw0 & 0xff;
    vec![
        format!(
            "Aggregation Time (TIME): {time} ({} µs)",
            u64::from(time) * 100
        ),
        format!(
            "Aggregation Threshold (THR): {thr} ({} completion entries)",
            thr + 1
        ),
        reserved(dw0, !0xffff),
    ]
}

/// Asynchronous Event Configuration (0Bh): bits 7:0 the SMART / Health
/// Critical Warnings that raise an event, then one bit per notice.
fn async_event_config(dw0: u32) -> Vec<String> {
    const NOTICES: [(u32, &str); 10] = [
        (8, "Namespace Attribute Notices (NAN)"),
        (9, "Firmware Activation Notices (FAN)"),
        (10, "Telemetry Log Notices (TLN)"),
        (11, "Asymmetric Namespace Access Change Notices (ANACN)"),
        (
            12,
            "Predictable Latency Event Aggregate Log Change Notices (PLEALCN)",
        ),
        (13, "LBA Status Information Notices (LSIN)"),
        (
            14,
            "Endurance Group Event Aggregate Log Change Notices (EGEALCN)",
        ),
        (15, "Normal NVM Subsystem Shutdown Notices (NNSSHDN)"),
        (27, "Zone Descriptor Changed Notices (ZDCN)"),
        (31, "Discovery Log Page Change Notification (DLPCN)"),
    ];
    let mut lines = vec![format!(
        "SMART / Health Critical Warnings (SHCW): 0x{:02x}",
        dw0 & 0xff
    )];
    lines.extend(
        NOTICES
            .iter()
            .map(|&(bit, name)| format!("[{bit:>2}] {name}: {}", enabled(dw0 >> bit & 1))),
    );
    let known = NOTICES.iter().fold(0xffu32, |m, &(b, _)| m | 1 << b);
    lines.push(reserved(dw0, !known));
    lines
}

/// Autonomous Power State Transition (0Ch): APSTE bit 0 of dword 0; the
/// data structure's 32 entries of 8 bytes, one per power state: ITPS bits
/// 7:3, ITPT bits 31:8 in milliseconds. Entries that are all zero (no
/// transition) are left out.
fn apst(dw0: u32, data: &[u8]) -> Vec<String> {
    let mut lines = vec![
        format!(
            "Autonomous Power State Transition Enable (APSTE): {}",
            enabled(dw0 & 1)
        ),
        reserved(dw0, !1),
    ];
    if data.is_empty() {
        lines.push("data structure not read".to_string());
        return lines;
    }
    let mut any = false;
    for (ps, e) in data.chunks_exact(8).take(32).enumerate() {
        let v = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
        if v == 0 {
            continue;
        }
        any = true;
        let itps = v >> 3 & 0x1f;
        let itpt = v >> 8 & 0xff_ffff;
        let mut l = format!(
            "Entry[{ps:2}]: Idle Transition Power State (ITPS): {itps}, Idle Time Prior to \
             Transition (ITPT): {itpt} ms"
        );
        if v & !0xffff_fff8 != 0 {
            l.push_str(&format!(", reserved bits set: 0x{:016x}", v & !0xffff_fff8));
        }
        lines.push(l);
    }
    if !any {
        lines.push("no transitions configured (every entry is zero)".to_string());
    }
    lines
}

/// Host Behavior Support (16h), a 512-byte structure: ACRE byte 0, ETDAS
/// byte 1, LBAFEE byte 2.
fn host_behavior_support(data: &[u8]) -> Vec<String> {
    if data.is_empty() {
        return vec!["data structure not read".to_string()];
    }
    let byte = |i: usize| data.get(i).copied();
    let field = |name: &str, i: usize, what: &dyn Fn(u8) -> String| match byte(i) {
        Some(v) => format!("{name}: {v} ({})", what(v)),
        None => format!("{name}: not read"),
    };
    let enable = |v: u8| {
        match v {
            0 => "disabled",
            1 => "enabled",
            _ => "reserved",
        }
        .to_string()
    };
    let mut lines = vec![
        field("Advanced Command Retry Enable (ACRE)", 0, &enable),
        field(
            "Extended Telemetry Data Area 4 Supported (ETDAS)",
            1,
            &|v| {
                match v {
                    0 => "not supported by the host",
                    1 => "supported by the host",
                    _ => "reserved",
                }
                .to_string()
            },
        ),
        field("LBA Format Extension Enable (LBAFEE)", 2, &enable),
    ];
    if data.iter().skip(3).any(|&b| b != 0) {
        lines.push("reserved bytes (3 and up) not zero".to_string());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(f: u8, dw0: u32) -> Vec<String> {
        decode(f, 0, 0, dw0, &[]).unwrap()
    }

    fn has(lines: &[String], want: &str) {
        assert!(
            lines.iter().any(|l| l == want),
            "{want:?} missing from {lines:#?}"
        );
    }

    #[test]
    fn arbitration_fields() {
        // HPW 31:24 = 3, MPW 23:16 = 2, LPW 15:8 = 1, AB 2:0 = 3.
        let l = d(0x01, 0x0302_0103);
        has(&l, "High Priority Weight (HPW): 3 (weight 4)");
        has(&l, "Medium Priority Weight (MPW): 2 (weight 3)");
        has(&l, "Low Priority Weight (LPW): 1 (weight 2)");
        has(&l, "Arbitration Burst (AB): 3 (8 commands)");
        assert_eq!(l.len(), 4, "{l:#?}");
        let l = d(0x01, 0xffff_ffff);
        has(&l, "High Priority Weight (HPW): 255 (weight 256)");
        has(&l, "Arbitration Burst (AB): 7 (no limit)");
        has(&l, "reserved bits set: 0x000000f8");
    }

    #[test]
    fn power_management_fields() {
        let l = d(0x02, (2 << 5) | 4);
        has(&l, "Workload Hint (WH): 2 (Workload #2)");
        has(&l, "Power State (PS): 4");
        let l = d(0x02, 0xff);
        has(&l, "Workload Hint (WH): 7 (reserved)");
        has(&l, "Power State (PS): 31");
    }

    #[test]
    fn temperature_threshold_fields() {
        // 0x157 = 343 K = 70 °C, over threshold of the composite temperature.
        let l = decode(0x04, 0, 0, 0x157, &[]).unwrap();
        has(&l, "Temperature Threshold (TMPTH): 343 K (70 °C)");
        has(
            &l,
            "Threshold Temperature Select (TMPSEL): 0 (Composite Temperature)",
        );
        has(
            &l,
            "Threshold Type Select (THSEL): 0 (Over Temperature Threshold)",
        );
        // Sensor 3's under threshold (CDW11 TMPSEL 19:16, THSEL 21:20);
        // 0 K is -273 °C; 65535 K the largest.
        let cdw11 = (1 << 20) | (3 << 16);
        let l = decode(0x04, 0, cdw11, 0, &[]).unwrap();
        has(&l, "Temperature Threshold (TMPTH): 0 K (-273 °C)");
        has(
            &l,
            "Threshold Temperature Select (TMPSEL): 3 (Temperature Sensor 3)",
        );
        has(
            &l,
            "Threshold Type Select (THSEL): 1 (Under Temperature Threshold)",
        );
        let l = decode(0x04, 0, 0x003f_0000, 0xffff, &[]).unwrap();
        has(&l, "Temperature Threshold (TMPTH): 65535 K (65262 °C)");
        has(
            &l,
            "Threshold Temperature Select (TMPSEL): 15 (all temperature sensors)",
        );
        has(&l, "Threshold Type Select (THSEL): 3 (reserved)");
        let l = decode(0x04, 0, 9 << 16, 0, &[]).unwrap();
        has(&l, "Threshold Temperature Select (TMPSEL): 9 (reserved)");
    }

    #[test]
    fn error_recovery_fields() {
        let l = d(0x05, (1 << 16) | 30);
        has(&l, "Time Limited Error Recovery (TLER): 30 (3000 ms)");
        has(
            &l,
            "Deallocated or Unwritten Logical Block Error Enable (DULBE): enabled",
        );
        let l = d(0x05, 0);
        has(&l, "Time Limited Error Recovery (TLER): 0 (no time limit)");
        has(
            &l,
            "Deallocated or Unwritten Logical Block Error Enable (DULBE): disabled",
        );
        let l = d(0x05, 0xffff_ffff);
        has(&l, "Time Limited Error Recovery (TLER): 65535 (6553500 ms)");
        has(&l, "reserved bits set: 0xfffe0000");
    }

    #[test]
    fn one_bit_features() {
        has(&d(0x06, 1), "Volatile Write Cache Enable (WCE): enabled");
        has(&d(0x06, 0), "Volatile Write Cache Enable (WCE): disabled");
        has(&d(0x0a, 1), "Disable Normal (DN): yes");
        has(&d(0x0a, 2), "reserved bits set: 0x00000002");
        let l = d(0x09, (1 << 16) | 0x1234);
        has(&l, "Interrupt Vector (IV): 4660");
        has(&l, "Coalescing Disable (CD): yes");
        has(&d(0x09, 0), "Coalescing Disable (CD): no");
    }

    #[test]
    fn number_of_queues_counts_are_one_based() {
        // NCQA 31:16 = 0x3f, NSQA 15:0 = 0x1f.
        let l = d(0x07, 0x003f_001f);
        assert_eq!(
            l,
            vec![
                "Number of I/O Completion Queues Allocated (NCQA): 63 (64 queues)",
                "Number of I/O Submission Queues Allocated (NSQA): 31 (32 queues)",
            ]
        );
        let l = d(0x07, 0xffff_0000);
        has(
            &l,
            "Number of I/O Completion Queues Allocated (NCQA): 65535 (65536 queues)",
        );
        has(
            &l,
            "Number of I/O Submission Queues Allocated (NSQA): 0 (1 queues)",
        );
    }

    #[test]
    fn interrupt_coalescing_fields() {
        let l = d(0x08, 0x0a07);
        has(&l, "Aggregation Time (TIME): 10 (1000 µs)");
        has(&l, "Aggregation Threshold (THR): 7 (8 completion entries)");
        let l = d(0x08, 0xffff);
        has(&l, "Aggregation Time (TIME): 255 (25500 µs)");
        has(
            &l,
            "Aggregation Threshold (THR): 255 (256 completion entries)",
        );
    }

    #[test]
    fn async_event_config_bits() {
        let l = d(0x0b, (1 << 8) | (1 << 9) | 0x1f);
        has(&l, "SMART / Health Critical Warnings (SHCW): 0x1f");
        has(&l, "[ 8] Namespace Attribute Notices (NAN): enabled");
        has(&l, "[ 9] Firmware Activation Notices (FAN): enabled");
        has(&l, "[10] Telemetry Log Notices (TLN): disabled");
        has(
            &l,
            "[31] Discovery Log Page Change Notification (DLPCN): disabled",
        );
        assert!(!l.iter().any(|x| x.starts_with("reserved")), "{l:#?}");
        let l = d(0x0b, 0xffff_ffff);
        has(
            &l,
            "[14] Endurance Group Event Aggregate Log Change Notices (EGEALCN): enabled",
        );
        has(
            &l,
            "[15] Normal NVM Subsystem Shutdown Notices (NNSSHDN): enabled",
        );
        has(&l, "[27] Zone Descriptor Changed Notices (ZDCN): enabled");
        has(
            &l,
            "[31] Discovery Log Page Change Notification (DLPCN): enabled",
        );
        has(&l, "reserved bits set: 0x77ff0000");
    }

    #[test]
    fn apst_enable_bit_and_entries() {
        let mut data = vec![0u8; 256];
        // Entry 0: ITPS 3 (bits 7:3), ITPT 100 ms (bits 31:8).
        data[0..8].copy_from_slice(&((100u64 << 8) | (3 << 3)).to_le_bytes());
        // Entry 31: the largest ITPT and ITPS, and reserved bits.
        data[248..256].copy_from_slice(&u64::MAX.to_le_bytes());
        let l = decode(0x0c, 0, 0, 1, &data).unwrap();
        has(
            &l,
            "Autonomous Power State Transition Enable (APSTE): enabled",
        );
        has(
            &l,
            "Entry[ 0]: Idle Transition Power State (ITPS): 3, Idle Time Prior to Transition \
             (ITPT): 100 ms",
        );
        has(
            &l,
            "Entry[31]: Idle Transition Power State (ITPS): 31, Idle Time Prior to Transition \
             (ITPT): 16777215 ms, reserved bits set: 0xffffffff00000007",
        );
        assert_eq!(l.len(), 3, "all-zero entries left out: {l:#?}");
        let l = decode(0x0c, 0, 0, 0, &[0; 256]).unwrap();
        has(
            &l,
            "Autonomous Power State Transition Enable (APSTE): disabled",
        );
        has(&l, "no transitions configured (every entry is zero)");
        let l = decode(0x0c, 0, 0, 0, &[]).unwrap();
        has(&l, "data structure not read");
        // A short structure: whole entries only, no panic.
        let l = decode(0x0c, 0, 0, 0, &data[..13]).unwrap();
        assert_eq!(l.len(), 2, "{l:#?}");
        assert!(decodes_structure(0x0c, 0) && !decodes_structure(0x0c, 3));
    }

    #[test]
    fn host_behavior_support_bytes() {
        let mut data = vec![0u8; 512];
        data[0] = 1; // ACRE
        data[2] = 1; // LBAFEE
        let l = decode(0x16, 0, 0, 0, &data).unwrap();
        assert_eq!(
            l,
            vec![
                "Advanced Command Retry Enable (ACRE): 1 (enabled)",
                "Extended Telemetry Data Area 4 Supported (ETDAS): 0 (not supported by the host)",
                "LBA Format Extension Enable (LBAFEE): 1 (enabled)",
            ]
        );
        data[1] = 1;
        data[0] = 2;
        data[511] = 9;
        let l = decode(0x16, 0, 0, 0, &data).unwrap();
        has(&l, "Advanced Command Retry Enable (ACRE): 2 (reserved)");
        has(
            &l,
            "Extended Telemetry Data Area 4 Supported (ETDAS): 1 (supported by the host)",
        );
        has(&l, "reserved bytes (3 and up) not zero");
        let l = decode(0x16, 0, 0, 0, &data[..2]).unwrap();
        has(&l, "LBA Format Extension Enable (LBAFEE): not read");
        has(
            &decode(0x16, 0, 0, 0, &[]).unwrap(),
            "data structure not read",
        );
    }

    #[test]
    fn supported_capabilities_and_unknown_features() {
        let l = decode(0x07, 3, 0, 0b101, &[]).unwrap();
        assert_eq!(
            l,
            vec![
                "[0] saveable: yes",
                "[1] namespace specific: no",
                "[2] changeable: yes",
            ]
        );
        has(
            &decode(0xc0, 3, 0, 0xff, &[]).unwrap(),
            "reserved bits set: 0x000000f8",
        );
        for f in [0x00, 0x03, 0x0d, 0x0e, 0x0f, 0x80, 0xc0, 0xff] {
            assert_eq!(decode(f, 0, 0, 0x1234, &[1, 2, 3]), None, "FID {f:#x}");
        }
    }
}

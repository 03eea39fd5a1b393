//! `upnvme identify -H`: Identify Controller and Identify Namespace
//! capability fields decoded into words, in the spirit of nvme-cli's
//! `id-ctrl -H` / `id-ns -H` (NVMe Base Specification 2.0, "Identify
//! Controller Data Structure"; NVM Command Set Specification 1.0,
//! "Identify Namespace Data Structure"). Pure functions over the parsed
//! structures: the text and the JSON carry the same lines.

use upnvme::queues::{IdentifyController, IdentifyNamespace};

/// One decoded field: its name, raw value and one line per bit or subfield.
pub struct Field {
    /// The spec's field name (lower case, as nvme-cli prints it).
    pub name: &'static str,
    /// The raw value.
    pub value: u64,
    /// What each bit or subfield says.
    pub lines: Vec<String>,
}

fn supported(b: bool) -> &'static str {
    if b { "supported" } else { "not supported" }
}

fn bits(name: &'static str, value: u64, table: &[(u32, &str)]) -> Field {
    let mut lines: Vec<String> = table
        .iter()
        .map(|&(bit, what)| {
            let set = value >> bit & 1 != 0;
            format!("[{bit:>2}] {what}: {}", supported(set))
        })
        .collect();
    let known: u64 = table.iter().map(|&(b, _)| 1u64 << b).sum();
    if value & !known != 0 {
        lines.push(format!("other bits set: {:#x}", value & !known));
    }
    Field { name, value, lines }
}

/// Identify Controller's capability fields.
pub fn controller(id: &IdentifyController) -> Vec<Field> {
    let mut out = vec![
        bits(
            "cmic",
            id.cmic.into(),
            &[
                (0, "NVM subsystem may contain more than one port"),
                (1, "NVM subsystem may contain two or more controllers"),
                (2, "SR-IOV virtual function"),
                (3, "Asymmetric Namespace Access Reporting"),
            ],
        ),
        bits(
            "oaes",
            id.oaes.into(),
            &[
                (8, "Namespace Attribute Changed event"),
                (9, "Firmware Activation Notices event"),
                (11, "Asymmetric Namespace Access Change event"),
                (12, "Predictable Latency Event Aggregate Log Change event"),
                (13, "LBA Status Information Alert event"),
                (14, "Endurance Group Event Aggregate Log Page Change event"),
            ],
        ),
        bits(
            "oacs",
            id.oacs.into(),
            &[
                (0, "Security Send and Receive"),
                (1, "Format NVM"),
                (2, "Firmware Commit and Image Download"),
                (3, "Namespace Management and Attachment"),
                (4, "Device Self-test"),
                (5, "Directives"),
                (6, "NVMe-MI Send and Receive"),
                (7, "Virtualization Management"),
                (8, "Doorbell Buffer Config"),
                (9, "Get LBA Status"),
                (10, "Command and Feature Lockdown"),
            ],
        ),
    ];
    let frmw = u64::from(id.frmw);
    out.push(Field {
        name: "frmw",
        value: frmw,
        lines: vec![
            format!("[0] first firmware slot read only: {}", yes(frmw & 1 != 0)),
            format!("[3:1] firmware slots: {}", frmw >> 1 & 0x7),
            format!(
                "[4] activation without reset: {}",
                supported(frmw >> 4 & 1 != 0)
            ),
            format!(
                "[5] multiple update detection (MUDS): {}",
                supported(frmw >> 5 & 1 != 0)
            ),
        ],
    });
    out.push(bits(
        "lpa",
        id.lpa.into(),
        &[
            (0, "SMART / Health log per namespace"),
            (1, "Commands Supported and Effects log"),
            (2, "extended data for Get Log Page"),
            (3, "Telemetry Host-Initiated and Controller-Initiated logs"),
            (4, "Persistent Event log"),
        ],
    ));
    out.push(bits(
        "oncs",
        id.oncs.into(),
        &[
            (0, "Compare"),
            (1, "Write Uncorrectable"),
            (2, "Dataset Management"),
            (3, "Write Zeroes"),
            (
                4,
                "Save field in Set Features, Select field in Get Features",
            ),
            (5, "Reservations"),
            (6, "Timestamp feature"),
            (7, "Verify"),
            (8, "Copy"),
        ],
    ));
    out.push(bits(
        "ocfs",
        id.ocfs.into(),
        &[
            (0, "Copy Format 0h (16-bit guard protection information)"),
            (
                1,
                "Copy Format 1h (32- or 64-bit guard protection information)",
            ),
            (2, "Copy Format 2h (cross-namespace, 16-bit guard)"),
            (3, "Copy Format 3h (cross-namespace, 32- or 64-bit guard)"),
        ],
    ));
    out.push(bits(
        "fuses",
        id.fuses.into(),
        &[(0, "Compare and Write fused operation")],
    ));
    let fna = u64::from(id.fna);
    out.push(Field {
        name: "fna",
        value: fna,
        lines: vec![
            format!(
                "[0] Format NVM applies to all namespaces: {}",
                yes(fna & 1 != 0)
            ),
            format!(
                "[1] secure erase applies to all namespaces: {}",
                yes(fna >> 1 & 1 != 0)
            ),
            format!("[2] cryptographic erase: {}", supported(fna >> 2 & 1 != 0)),
        ],
    });
    let vwc = u64::from(id.vwc);
    out.push(Field {
        name: "vwc",
        value: vwc,
        lines: vec![
            format!("[0] volatile write cache: {}", present(vwc & 1 != 0)),
            format!(
                "[2:1] Flush with NSID FFFFFFFFh: {}",
                match vwc >> 1 & 0x3 {
                    0b10 => "not supported",
                    0b11 => "supported",
                    _ => "not reported",
                }
            ),
        ],
    });
    let sgls = u64::from(id.sgls);
    let mut sgl_lines = vec![format!(
        "[1:0] SGLs for NVM commands: {}",
        match sgls & 0x3 {
            0b00 => "not supported",
            0b01 => "supported, no alignment or granularity requirement",
            0b10 => "supported, dword alignment and granularity",
            _ => "reserved value",
        }
    )];
    sgl_lines.push(format!(
        "[15:8] SGL Descriptor Threshold: {}",
        match sgls >> 8 & 0xff {
            0 => "not reported".to_string(),
            n => format!("{n} descriptors per command (beyond: may be slower)"),
        }
    ));
    for (bit, what) in [
        (2u32, "Keyed SGL Data Block descriptor"),
        (16, "SGL Bit Bucket descriptor"),
        (17, "byte-aligned contiguous metadata buffer"),
        (18, "SGL longer than the data transferred"),
        (19, "MPTR holding an SGL descriptor"),
        (20, "Address field as an offset"),
        (21, "Transport SGL Data Block descriptor"),
    ] {
        sgl_lines.push(format!(
            "[{bit:>2}] {what}: {}",
            supported(sgls >> bit & 1 != 0)
        ));
    }
    out.push(Field {
        name: "sgls",
        value: sgls,
        lines: sgl_lines,
    });
    out
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn present(b: bool) -> &'static str {
    if b { "present" } else { "not present" }
}

fn pi_type(dps: u8) -> &'static str {
    match dps & 0x7 {
        0 => "protection information disabled",
        1 => "type 1",
        2 => "type 2",
        3 => "type 3",
        _ => "reserved value",
    }
}

fn relative_performance(rp: u8) -> &'static str {
    match rp & 0x3 {
        0 => "best",
        1 => "better",
        2 => "good",
        _ => "degraded",
    }
}

/// An LBA format's LBADS in words (NVM Command Set 1.0, "LBA Format Data
/// Structure"): 2^LBADS bytes; 0 means the format is not available, and a
/// non-zero value below 9 (512 bytes) is not a supported size.
fn lba_data_size(lbads: u8) -> String {
    match lbads {
        0 => "not available (LBADS 0)".to_string(),
        1..=8 => format!(
            "{} bytes (LBADS {lbads}: below 512, not supported)",
            1u32 << lbads
        ),
        9..=63 => format!("{} bytes", 1u64 << lbads),
        _ => format!("2^{lbads} bytes (LBADS {lbads}: not a usable size)"),
    }
}

/// Identify Namespace's capability fields and the LBA formats.
pub fn namespace(id: &IdentifyNamespace) -> Vec<Field> {
    let mut out = vec![bits(
        "nsfeat",
        id.nsfeat.into(),
        &[
            (0, "thin provisioning (NCAP may be below NSZE)"),
            (1, "NAWUN, NAWUPF and NACWU fields"),
            (2, "Deallocated or Unwritten Logical Block error"),
            (3, "NGUID and EUI64 never reused"),
            (4, "NPWG, NPWA, NPDG, NPDA and NOWS fields"),
        ],
    )];
    let flbas = u64::from(id.flbas);
    // The driver's reading (bits 6:5 count only with more than 16
    // formats), so that this line and the "(in use)" format agree.
    let in_use = id.current_lba_format_index();
    out.push(Field {
        name: "flbas",
        value: flbas,
        lines: vec![
            format!(
                "[6:5,3:0] LBA format in use: {in_use}{}",
                if id.lba_format_count() <= 16 && flbas >> 5 & 0x3 != 0 {
                    " (bits 6:5 ignored: 16 formats or fewer)"
                } else {
                    ""
                }
            ),
            format!(
                "[4] metadata: {}",
                if flbas >> 4 & 1 != 0 {
                    "at the end of each block's data (extended LBA)"
                } else {
                    "in a separate buffer (MPTR)"
                }
            ),
        ],
    });
    out.push(bits(
        "mc",
        id.mc.into(),
        &[
            (0, "metadata as part of an extended LBA"),
            (1, "metadata in a separate buffer"),
        ],
    ));
    out.push(bits(
        "dpc",
        id.dpc.into(),
        &[
            (0, "protection information type 1"),
            (1, "protection information type 2"),
            (2, "protection information type 3"),
            (3, "protection information in the first bytes of metadata"),
            (4, "protection information in the last bytes of metadata"),
        ],
    ));
    let dps = id.dps;
    out.push(Field {
        name: "dps",
        value: dps.into(),
        lines: vec![
            format!("[2:0] protection information: {}", pi_type(dps)),
            format!(
                "[3] protection information position: {}",
                if dps >> 3 & 1 != 0 {
                    "first bytes of metadata"
                } else {
                    "last bytes of metadata"
                }
            ),
        ],
    });
    for (i, f) in id.lbaf.iter().enumerate() {
        out.push(Field {
            name: "lbaf",
            value: i as u64,
            lines: vec![format!(
                "format {i:>2}: data {}, metadata {} bytes, relative performance {} ({}){}",
                lba_data_size(f.lbads),
                f.ms,
                f.rp,
                relative_performance(f.rp),
                if i == in_use { " (in use)" } else { "" }
            )],
        });
    }
    out
}

/// The fields as JSON: `{name: {"value": v, "decoded": [lines]}}`, LBA
/// formats as a list.
pub fn to_json(fields: &[Field]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    let mut lbaf = Vec::new();
    for f in fields {
        if f.name == "lbaf" {
            lbaf.push(serde_json::json!(f.lines.first()));
        } else {
            map.insert(
                f.name.to_string(),
                serde_json::json!({"value": f.value, "decoded": f.lines}),
            );
        }
    }
    if !lbaf.is_empty() {
        map.insert("lbaf".to_string(), serde_json::Value::Array(lbaf));
    }
    serde_json::Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_lines(f: &[Field], name: &str) -> Vec<String> {
        f.iter().find(|x| x.name == name).unwrap().lines.clone()
    }

    #[test]
    fn controller_fields_in_words() {
        let id = IdentifyController {
            oacs: 0x010a,
            oncs: 0x015f,
            sgls: 0x0010_0001,
            vwc: 0x07,
            frmw: 0x23,
            ..Default::default()
        };
        let f = controller(&id);
        let frmw = &get_lines(&f, "frmw");
        assert_eq!(frmw[1], "[3:1] firmware slots: 1");
        assert_eq!(frmw[3], "[5] multiple update detection (MUDS): supported");
        let get = |n: &str| f.iter().find(|x| x.name == n).unwrap();
        let oacs = &get("oacs").lines;
        assert!(
            oacs.contains(&"[ 1] Format NVM: supported".to_string()),
            "{oacs:?}"
        );
        assert!(oacs.contains(&"[ 8] Doorbell Buffer Config: supported".to_string()));
        assert!(oacs.contains(&"[ 0] Security Send and Receive: not supported".to_string()));
        let ocfs = &get("ocfs").lines;
        assert!(
            ocfs.contains(
                &"[ 2] Copy Format 2h (cross-namespace, 16-bit guard): not supported".to_string()
            ),
            "{ocfs:?}"
        );
        let oncs = &get("oncs").lines;
        assert!(oncs.contains(&"[ 8] Copy: supported".to_string()));
        assert!(oncs.contains(&"[ 7] Verify: not supported".to_string()));
        let sgls = &get("sgls").lines;
        assert_eq!(
            sgls[0],
            "[1:0] SGLs for NVM commands: supported, no alignment or granularity requirement"
        );
        assert!(sgls.contains(&"[20] Address field as an offset: supported".to_string()));
        assert_eq!(sgls[1], "[15:8] SGL Descriptor Threshold: not reported");
        let sdt = controller(&IdentifyController {
            sgls: 0x0000_1001,
            ..Default::default()
        });
        assert_eq!(
            get_lines(&sdt, "sgls")[1],
            "[15:8] SGL Descriptor Threshold: 16 descriptors per command (beyond: may be slower)"
        );
        assert_eq!(get("vwc").lines[0], "[0] volatile write cache: present");
        assert_eq!(
            get("vwc").lines[1],
            "[2:1] Flush with NSID FFFFFFFFh: supported"
        );
        let j = to_json(&f);
        assert_eq!(j["oncs"]["value"], 0x015f);
        assert_eq!(j["sgls"]["decoded"][0], sgls[0].as_str());
    }

    #[test]
    fn namespace_fields_in_words() {
        let mut id = IdentifyNamespace {
            flbas: 0x11,
            mc: 0x3,
            dpc: 0x1f,
            dps: 0x9,
            ..Default::default()
        };
        id.lbaf = vec![
            upnvme::queues::LbaFormat {
                ms: 0,
                lbads: 9,
                rp: 0,
            },
            upnvme::queues::LbaFormat {
                ms: 8,
                lbads: 12,
                rp: 2,
            },
        ];
        let f = namespace(&id);
        let get = |n: &str| f.iter().find(|x| x.name == n).unwrap();
        assert_eq!(get("flbas").lines[0], "[6:5,3:0] LBA format in use: 1");
        assert_eq!(
            get("flbas").lines[1],
            "[4] metadata: at the end of each block's data (extended LBA)"
        );
        assert_eq!(get("dps").lines[0], "[2:0] protection information: type 1");
        assert_eq!(
            get("dps").lines[1],
            "[3] protection information position: first bytes of metadata"
        );
        let formats: Vec<&Field> = f.iter().filter(|x| x.name == "lbaf").collect();
        assert_eq!(
            formats[1].lines[0],
            "format  1: data 4096 bytes, metadata 8 bytes, relative performance 2 (good) (in use)"
        );
        assert_eq!(to_json(&f)["lbaf"].as_array().unwrap().len(), 2);
    }

    /// With 16 formats or fewer FLBAS bits 6:5 are not part of the index
    /// (NVM Command Set 1.0): the FLBAS line named format 17 for FLBAS
    /// 0x21 on a namespace of two formats, while the list marked format 1
    /// "(in use)" and the driver used format 1. An LBADS of 0 (format not
    /// available) read "data 1 bytes".
    #[test]
    fn the_format_in_use_is_the_drivers_and_unavailable_formats_say_so() {
        let lbaf = |lbads| upnvme::queues::LbaFormat {
            ms: 0,
            lbads,
            rp: 0,
        };
        let mut id = IdentifyNamespace {
            flbas: 0x21,
            nlbaf: 2,
            ..Default::default()
        };
        id.lbaf = vec![lbaf(9), lbaf(12), lbaf(0)];
        let f = namespace(&id);
        let flbas = &f.iter().find(|x| x.name == "flbas").unwrap().lines[0];
        assert_eq!(
            flbas,
            "[6:5,3:0] LBA format in use: 1 (bits 6:5 ignored: 16 formats or fewer)"
        );
        let formats: Vec<&str> = f
            .iter()
            .filter(|x| x.name == "lbaf")
            .map(|x| x.lines[0].as_str())
            .collect();
        assert!(formats[1].ends_with("(in use)"), "{formats:?}");
        assert_eq!(
            formats[2],
            "format  2: data not available (LBADS 0), metadata 0 bytes, relative performance 0 (best)"
        );
        assert_eq!(
            lba_data_size(8),
            "256 bytes (LBADS 8: below 512, not supported)"
        );
        assert_eq!(
            lba_data_size(64),
            "2^64 bytes (LBADS 64: not a usable size)"
        );
        // With more than 16 formats bits 6:5 count.
        id.nlbaf = 16;
        id.nulbaf = 2;
        id.lbaf = (0..19).map(|_| lbaf(9)).collect();
        let f = namespace(&id);
        assert_eq!(
            f.iter().find(|x| x.name == "flbas").unwrap().lines[0],
            "[6:5,3:0] LBA format in use: 17"
        );
    }
}

//! Namespaces whose LBA format carries metadata (`cargo xtask vm --ms 8 --mset 1 --pi 1`,
//! the `metadata-pi` configuration of `cargo xtask test`): the driver reports the format
//! and refuses Read, Write and Compare with a typed error instead of sending a transfer
//! it does not describe (the device would move `blocks × (LBA size + MS)` bytes, or write
//! metadata through MPTR 0; the IOMMU would log faults). Commands without data still run,
//! and namespace 2, without metadata, works on the same queue pair.
//!
//! Every test here returns at once when namespace 1 has no metadata
//! (`UPNVME_VM_NS1_MS=0`): the other configurations.

use std::time::Duration;

use upnvme::{Controller, ControllerOptions, IoCommand, QueuePairOptions, Reject};

use crate::vm::{device, env_u64, upnvme};

const T: Duration = Duration::from_secs(10);

/// Namespace 1's metadata bytes per block in this guest, `None` without.
fn ns1_ms() -> Option<u16> {
    let ms = env_u64("UPNVME_VM_NS1_MS") as u16;
    if ms == 0 {
        eprintln!("namespace 1 has no metadata in this guest: nothing to check here");
    }
    (ms != 0).then_some(ms)
}

#[test]
fn metadata_format_is_reported_and_data_commands_are_refused() {
    let Some(ms) = ns1_ms() else { return };
    let c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let layout = ns
        .metadata_layout()
        .expect("namespace 1 reports its metadata");
    assert_eq!(layout.ms, ms);
    assert_eq!(layout.extended, env_u64("UPNVME_VM_NS1_MSET") == 1);
    assert_eq!(u64::from(layout.pi_type), env_u64("UPNVME_VM_NS1_PI"));
    // QEMU stores the metadata after the data in the backing file:
    // NSZE = file size / (LBA size + MS).
    let lba = u64::from(ns.lba_size());
    assert_eq!(
        ns.lba_count(),
        env_u64("UPNVME_VM_DISK_SIZE") / (lba + u64::from(ms))
    );

    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let cmds = [
        IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 2,
        },
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks: 2,
        },
        IoCommand::Compare {
            ns: &ns,
            slba: 0,
            blocks: 2,
        },
    ];
    for cmd in cmds {
        let buf = c.alloc_dma(64 << 10).unwrap();
        let f = qp.submit(cmd, Some(buf), 1).unwrap_err();
        assert_eq!(f.reason, Reject::MetadataFormat(layout), "{cmd:?}");
        assert!(f.buffer.is_some(), "the buffer comes back");
        let text = qp.describe(f.reason).to_string();
        assert!(
            text.contains("metadata") && text.contains("Format NVM"),
            "{text}"
        );
    }
    assert_eq!(qp.in_flight(), 0);
    // No data: these run.
    qp.execute_blocking(IoCommand::Flush { ns: &ns }, None, T)
        .unwrap();
    let zeroes = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks: 8,
        deallocate: false,
    };
    qp.execute_blocking(zeroes, None, T).unwrap();

    // Namespace 2 has no metadata: byte-exact on the same pair.
    let ns2 = c.namespace(2).unwrap().clone();
    assert!(ns2.metadata_layout().is_none());
    let len = ns2.lba_size() as usize * 4;
    let w = c.alloc_dma(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    w.write_bytes(0, &data).unwrap();
    qp.write_blocking(&ns2, 8, 4, w, T).unwrap();
    let r = qp
        .read_blocking(&ns2, 8, 4, c.alloc_dma(len).unwrap(), T)
        .unwrap();
    let mut back = vec![0u8; len];
    r.read_bytes(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn metadata_namespace_is_never_a_silent_success_in_the_tool() {
    if ns1_ms().is_none() {
        return;
    }
    let dev = device();
    let file = "/tmp/metadata-write.bin";
    std::fs::write(file, vec![0x5au8; 8192]).unwrap();
    let o = upnvme(&[
        "write",
        "-d",
        &dev,
        "--nsid",
        "1",
        "--start-block",
        "0",
        "--block-count",
        "2",
        "--data",
        file,
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "write: {err}");
    assert!(err.contains("metadata"), "{err}");
    let o = upnvme(&["read", "-d", &dev, "--nsid", "1", "--block-count", "1"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "read: {err}");
    assert!(err.contains("metadata"), "{err}");
    let o = upnvme(&[
        "perf",
        "-d",
        &dev,
        "-n",
        "1",
        "-q",
        "8",
        "-o",
        "16384",
        "-w",
        "randrw",
        "-M",
        "50",
        "--verify",
        "--io-count",
        "2000",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_ne!(o.status.code(), Some(0), "perf on namespace 1: {err}");
    assert!(err.contains("metadata"), "{err}");
    // Namespace 2 (no metadata) still verifies.
    let o = upnvme(&[
        "perf",
        "-d",
        &dev,
        "-n",
        "2",
        "-q",
        "8",
        "-o",
        "16384",
        "-w",
        "randrw",
        "-M",
        "50",
        "--verify",
        "--io-count",
        "2000",
    ]);
    assert!(
        o.status.success(),
        "perf on namespace 2: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

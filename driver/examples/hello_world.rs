//! upnvme's "hello world", in the spirit of SPDK's: open the controller, write a
//! string to the first block of namespace 1, read it back, print it.
//!
//! ```text
//! cargo run --release --example hello_world -- 0000:00:04.0
//! ```
//! (inside the test bed, which installs the examples: `cargo xtask vm -- hello_world`)

use std::time::Duration;

use upnvme::{Controller, ControllerOptions, QueuePairOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = match std::env::args().nth(1) {
        Some(a) => a,
        None => {
            // The only vfio-bound NVMe controller.
            let vfio: Vec<_> = upnvme::list_controllers()?
                .into_iter()
                .filter(|f| f.driver.as_deref() == Some("vfio-pci"))
                .collect();
            match vfio.as_slice() {
                [one] => one.address.to_string(),
                _ => return Err("usage: hello_world PCI_ADDRESS (e.g. 0000:00:04.0)".into()),
            }
        }
    };
    let ctrl = Controller::open(&addr, ControllerOptions::default())?;
    let ns = ctrl.namespace(1)?;
    println!(
        "Attached to {} ({} {}), namespace 1: {} blocks of {} bytes",
        addr,
        ctrl.identify().mn,
        ctrl.identify().sn,
        ns.lba_count(),
        ns.lba_size()
    );
    let lba_size = ns.lba_size();
    let mut qp = ctrl.io_queue_pair(QueuePairOptions::default())?;

    let msg = b"Hello world!\n";
    let buf = ctrl.alloc_dma(lba_size as usize)?;
    buf.write_bytes(0, msg)?;
    let buf = qp.write_blocking(ns, 0, 1, buf, Duration::from_secs(5))?;

    buf.fill(0, buf.len(), 0)?;
    let buf = qp.read_blocking(ns, 0, 1, buf, Duration::from_secs(5))?;
    let mut back = vec![0u8; msg.len()];
    buf.read_bytes(0, &mut back)?;
    print!("{}", String::from_utf8_lossy(&back));
    if back != msg {
        return Err("read back something else than was written".into());
    }
    drop(qp);
    ctrl.close()?;
    Ok(())
}

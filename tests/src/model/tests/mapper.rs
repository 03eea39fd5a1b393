//! The model's IOMMU table refuses an `Unmapping` another mapper hands on:
//! a region of a mapper that "maps" at the IOVA of one of the table's live
//! mappings must not remove that mapping when it goes (its IOVA would be
//! handed out again while the admin queue and buffers in it still use it).

use std::sync::Arc;
use std::time::Duration;

use upnvme::dma::memory::{DmaMapper, DmaRegion, HostMemory};
use upnvme::dma::{DmaError, PageBacking, Unmapping};
use upnvme::{Controller, ControllerOptions, Device, QueuePairOptions};

use crate::model::{ModelConfig, ModelController};

/// Maps nothing itself: claims a live mapping's IOVA, and hands the
/// `Unmapping` of its region on to the real mapper.
struct Forwarding {
    to: Arc<dyn DmaMapper>,
    iova: u64,
}

// SAFETY: no device reaches memory through this mapper (it maps nothing),
// so its IOVA overlaps no mapping a device uses through it; its `unmap`
// returns what the table answers for another mapper's `Unmapping` — false,
// which the trait always allows.
#[allow(unsafe_code)]
unsafe impl DmaMapper for Forwarding {
    fn map(&self, _mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        Ok(self.iova)
    }
    fn unmap(&self, m: Unmapping<'_>) -> bool {
        self.to.unmap(m)
    }
}

#[test]
fn an_unmapping_handed_on_to_another_mapper_is_refused() {
    let m = ModelController::new(ModelConfig::default());
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            page_backing: PageBacking::Small4K,
            ..Default::default()
        },
    )
    .expect("bring-up on the model");
    let table = m.dma_mapper().expect("the model maps memory");
    let mappings = m.iova_mappings();
    let region = DmaRegion::new(
        4096,
        PageBacking::Small4K,
        Arc::new(Forwarding {
            to: table,
            iova: 0x1_0000_0000,
        }),
    )
    .unwrap();
    drop(region);
    assert_eq!(m.iova_mappings(), mappings, "no live mapping removed");
    // The controller still works on the memory it had.
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns, 0, 1, buf, Duration::from_secs(5))
        .unwrap();
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0, "{:?}", m.dma_fault_log());
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

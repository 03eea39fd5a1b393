//! The model both C API integration test crates bring a controller up on.

use std::time::Duration;

use upnvme::{Controller, ControllerOptions, PageBacking};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

/// A model with one namespace of 256 512-byte blocks and a driver on it:
/// 4 KiB pages, MMIO doorbells, 2 s bounds.
pub fn model() -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 256,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    });
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            page_backing: PageBacking::Small4K,
            shadow_doorbells: false,
            admin_timeout: Some(Duration::from_secs(2)),
            ready_timeout: Some(Duration::from_secs(2)),
            shutdown_timeout: Some(Duration::from_secs(2)),
            ..Default::default()
        },
    )
    .unwrap();
    (m, c)
}

//! The model both C API integration test crates bring a controller up on.

use upnvme::Controller;
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

/// A model with one namespace of 256 512-byte blocks and a driver on it:
/// 4 KiB pages, MMIO doorbells, 2 s bounds.
pub fn model() -> (ModelController, Controller<ModelController>) {
    model_with(ModelConfig::default())
}

/// [`model`] with the rest of the controller's configuration from `cfg`
/// (its namespaces replaced by the one namespace).
pub fn model_with(cfg: ModelConfig) -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 256,
            ..NamespaceConfig::default()
        }],
        ..cfg
    });
    let c = Controller::with_device(m.clone(), upnvme_tests::host_options()).unwrap();
    (m, c)
}

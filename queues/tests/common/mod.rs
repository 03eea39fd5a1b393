//! Shared proptest configuration: full runs on the host, a handful of cases
//! under Miri (which interprets every instruction and would take hours).

use proptest::test_runner::{Config, FileFailurePersistence};

/// Cases per property: `host` normally, 3 under Miri.
pub fn config(host: u32) -> Config {
    if cfg!(miri) {
        Config {
            cases: 3,
            failure_persistence: None,
            ..Config::default()
        }
    } else {
        Config {
            cases: host,
            // Failing seeds are saved next to the test file as
            // `<test>.proptest-regressions` and replayed first.
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
                "proptest-regressions",
            ))),
            ..Config::default()
        }
    }
}

/// Scales a size bound down under Miri (by 16, at least 2) so that the
/// interpreted run stays in minutes while exercising the same code paths.
#[allow(dead_code)] // not every test crate uses it
pub fn scale(host: usize) -> usize {
    if cfg!(miri) { (host / 16).max(2) } else { host }
}

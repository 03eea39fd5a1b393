//! Guest integration tests: built by `cargo xtask test` (feature `guest`) and run inside
//! the QEMU test bed as `upnvme-guest-tests --test-threads=1`, because the tests open
//! VFIO devices, which is exclusive.

mod bed;
mod capi;
mod cli;
mod driver;
mod fio;
mod hotplug;
mod io;
mod iommu;
mod media_errors;
mod memory;
mod metadata;
mod reliability;
mod removal;
mod vectored;
mod vm;

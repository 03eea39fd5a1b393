//! Gives the shared library its SONAME, `libupnvme_c.so.0`: the major
//! version of the C ABI. A program linked against it records that name, so
//! an incompatible library (a struct the library writes whole changed, a
//! function's signature changed) gets a new major and is never loaded by a
//! program built for the old one. See docs/capi.md, "ABI versions".

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libupnvme_c.so.{ABI_MAJOR}");
    println!("cargo:rerun-if-changed=build.rs");
}

/// The C ABI's major version (the SONAME's number).
const ABI_MAJOR: u32 = 0;

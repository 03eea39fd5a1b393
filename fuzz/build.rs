//! For the `capi_sequence` target: the C ABI's entry points
//! (driver/capi/src/lib.rs) made to run on the in-memory controller model.
//!
//! lib.rs fixes its handles to the VFIO device (`upnvme_ctrl(Ctrl<VfioNvme>)`),
//! so the target cannot call the library's exported functions with a model
//! behind them. Instead of copying their bodies (which would fuzz a copy),
//! this writes `$OUT_DIR/capi_lib.rs`: lib.rs itself, unchanged but for the
//! few lines patched below — its module files by absolute path, `VfioNvme`
//! naming the model, `Controller::open` bringing the model up
//! (`crate::model_open`), its crate-level attributes and unit tests dropped.
//! Each patch must match exactly once: when lib.rs changes under one, the
//! build fails here and says which, rather than fuzzing something else.

use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let src = Path::new(&manifest).join("../driver/capi/src");
    let src = src
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let lib = src.join("lib.rs");
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));

    // Inner attributes and module docs cannot be `include!`d.
    let mut out: String = text
        .lines()
        .filter(|l| !l.starts_with("//!") && !l.starts_with("#!["))
        .map(|l| format!("{l}\n"))
        .collect();

    let mut patch = |from: &str, to: String| {
        let n = out.matches(from).count();
        assert!(
            n == 1,
            "fuzz/build.rs: driver/capi/src/lib.rs has {n} occurrences of {from:?} (expected \
             one): update the patch for the capi_sequence target"
        );
        out = out.replace(from, &to);
    };
    for m in ["buf", "ctrl", "qpair", "status"] {
        let path = src.join(format!("{m}.rs"));
        println!("cargo:rerun-if-changed={}", path.display());
        patch(
            &format!("\npub mod {m};\n"),
            format!(
                "\n#[path = {:?}]\npub mod {m};\n",
                path.display().to_string()
            ),
        );
    }
    patch("#[cfg(test)]\nmod tests;\n", String::new());
    patch(
        "use upnvme::{Controller, VfioNvme};",
        "use upnvme::Controller;\nuse upnvme_tests::ModelController as VfioNvme;".into(),
    );
    patch(
        "Controller::open(&addr, o.to_options())",
        "crate::model_open(&addr, o.to_options())".into(),
    );

    let dst = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("capi_lib.rs");
    std::fs::write(&dst, out).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
}

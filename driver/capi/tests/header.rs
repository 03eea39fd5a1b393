//! include/upnvme.h is what cbindgen generates from this crate now.

#[test]
fn header_is_up_to_date() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).unwrap();
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses driver/capi")
        .write(&mut out);
    let want = String::from_utf8(out).unwrap();
    let path = format!("{dir}/include/upnvme.h");
    if std::env::var_os("UPNVME_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is stale: regenerate it with `UPNVME_UPDATE_HEADER=1 cargo test -p upnvme-capi \
         --test header` and check it in"
    );
}

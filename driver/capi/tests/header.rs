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

/// The header compiles as C99 and C++11 without warnings, included twice
/// (its own guard covers the inline `*_opts_default` functions, which sit
/// after cbindgen's guard), and the inlines pass the caller's `sizeof`
/// (`upnvme_ctrl_get_info` and the `UPNVME_CTRL_INFO_HAS` macro too).
#[test]
fn header_compiles_twice_included_as_c_and_cpp() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = std::env::temp_dir().join(format!("upnvme-header-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let src = out.join("twice.c");
    std::fs::write(
        &src,
        "#include \"upnvme.h\"\n#include \"upnvme.h\"\n\
         int f(void);\n\
         int f(void) {\n\
           struct upnvme_qpair_opts q;\n\
           struct upnvme_ctrl_opts c;\n\
           return upnvme_qpair_opts_default(&q) + upnvme_ctrl_opts_default(&c);\n\
         }\n\
         int g(const struct upnvme_ctrl *ctrl);\n\
         int g(const struct upnvme_ctrl *ctrl) {\n\
           struct upnvme_ctrl_info info;\n\
           int rc = upnvme_ctrl_get_info(ctrl, &info);\n\
           if (rc != UPNVME_OK || !UPNVME_CTRL_INFO_HAS(&info, oncs))\n\
             return rc;\n\
           return (info.oncs & UPNVME_ONCS_DSM) != 0;\n\
         }\n",
    )
    .unwrap();
    // C always (Rust links with `cc`); C++ where a C++ compiler is installed.
    let cxx = std::process::Command::new("c++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let langs: &[(&str, &str)] = if cxx {
        &[("c", "-std=c99"), ("c++", "-std=c++11")]
    } else {
        &[("c", "-std=c99")]
    };
    for &(lang, std) in langs {
        let compiler = if lang == "c" { "cc" } else { "c++" };
        let o = std::process::Command::new(compiler)
            .args(["-x", lang, std, "-pedantic", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-I{dir}/include"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(out.join(format!("twice-{lang}.o")))
            .output()
            .expect("the C compiler runs (Rust itself links with cc)");
        assert!(
            o.status.success(),
            "{lang}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    std::fs::remove_dir_all(&out).unwrap();
}

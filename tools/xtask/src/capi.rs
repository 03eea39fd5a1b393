//! The C API's install tree (`cargo xtask capi`), and the C programs built
//! against it: the C examples (`hello_world_c`, `admin_c`, `commands_c`, `metadata_c`) for the guest.
//!
//! An install tree is a prefix with `include/upnvme.h`, `lib/libupnvme_c.a`
//! (and, when built, `libupnvme_c.so.0` — its SONAME — with `libupnvme_c.so`
//! linking to it) and `lib/pkgconfig/upnvme.pc`. C code is
//! compiled against it the way a user's would be: through pkg-config.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::paths::Paths;
use crate::proc;

/// `cargo xtask capi`.
#[derive(Debug, Args)]
pub struct CapiCmd {
    /// Where to install (include/, lib/, lib/pkgconfig/).
    #[arg(long, value_name = "DIR", default_value = "/usr/local")]
    pub prefix: PathBuf,
}

/// The C ABI's major version: the number in libupnvme_c's SONAME, which
/// driver/capi/build.rs sets (a test holds the two equal).
pub const CAPI_ABI_MAJOR: u32 = 0;

/// Libraries a static link of libupnvme_c needs besides itself (Rust's std
/// on glibc: what `rustc --print native-static-libs` lists).
pub const PRIVATE_LIBS: &str = "-lpthread -ldl -lm -lrt";

/// Builds libupnvme_c for the host (release) and installs it under `prefix`.
pub fn capi(cmd: &CapiCmd) -> Result<i32> {
    let paths = Paths::discover();
    let lib_dir = build_host(&paths)?;
    install(&paths, &lib_dir, &cmd.prefix)?;
    eprintln!(
        "xtask: installed upnvme.h, libupnvme_c and upnvme.pc under {}; compile with \
         `cc prog.c $(PKG_CONFIG_PATH={}/lib/pkgconfig pkg-config --cflags --libs upnvme)`",
        cmd.prefix.display(),
        cmd.prefix.display()
    );
    Ok(0)
}

/// `cargo build --release -p upnvme-capi` for the host; returns the
/// directory holding the libraries.
pub fn build_host(paths: &Paths) -> Result<PathBuf> {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(&paths.root)
        .args(["build", "--release", "-p", "upnvme-capi", "--lib"]);
    proc::run_inherited(&mut c, crate::guest_build::BUILD_TIMEOUT)?;
    Ok(paths.target.join("release"))
}

/// Copies the header and the libraries found in `lib_dir` under `prefix` and
/// writes the pkg-config file.
pub fn install(paths: &Paths, lib_dir: &Path, prefix: &Path) -> Result<()> {
    let inc = prefix.join("include");
    let lib = prefix.join("lib");
    let pc = lib.join("pkgconfig");
    for d in [&inc, &lib, &pc] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let header = paths.root.join("driver/capi/include/upnvme.h");
    std::fs::copy(&header, inc.join("upnvme.h"))
        .with_context(|| format!("copying {}", header.display()))?;
    let a = lib_dir.join("libupnvme_c.a");
    if !a.exists() {
        bail!("{} is missing: build upnvme-capi first", a.display());
    }
    std::fs::copy(&a, lib.join("libupnvme_c.a"))?;
    let so = lib_dir.join("libupnvme_c.so");
    if so.exists() {
        // Installed under its SONAME (driver/capi/build.rs), with the
        // development name `-lupnvme_c` finds as a link to it.
        let versioned = format!("libupnvme_c.so.{CAPI_ABI_MAJOR}");
        std::fs::copy(&so, lib.join(&versioned))?;
        let link = lib.join("libupnvme_c.so");
        if link.symlink_metadata().is_ok() {
            std::fs::remove_file(&link).with_context(|| format!("replacing {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&versioned, &link)
            .with_context(|| format!("linking {} to {versioned}", link.display()))?;
    }
    std::fs::write(pc.join("upnvme.pc"), pkg_config(prefix))?;
    Ok(())
}

/// The pkg-config file of an install tree at `prefix`.
pub fn pkg_config(prefix: &Path) -> String {
    format!(
        "prefix={}\nlibdir=${{prefix}}/lib\nincludedir=${{prefix}}/include\n\n\
         Name: upnvme\n\
         Description: userspace polled NVMe PCIe driver over VFIO (C API)\n\
         Version: {}\n\
         Libs: -L${{libdir}} -lupnvme_c\n\
         Libs.private: {PRIVATE_LIBS}\n\
         Cflags: -I${{includedir}}\n",
        prefix.display(),
        env!("CARGO_PKG_VERSION")
    )
}

/// `pkg-config ARGS upnvme` against the install tree at `prefix`.
pub fn pkg_config_flags(prefix: &Path, args: &[&str]) -> Result<Vec<String>> {
    if crate::deps::find_program("pkg-config").is_none() {
        crate::deps::apt_install(&["pkgconf"]).context("pkg-config builds the C programs")?;
    }
    let mut c = Command::new("pkg-config");
    c.env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .args(args)
        .arg("upnvme");
    let out = proc::run_checked(&mut c, Duration::from_secs(30))
        .context("pkg-config --cflags --libs upnvme")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// Compiles driver/capi/examples/`source`.c statically against the install
/// tree at `prefix` into `out`, the way the header's users do.
pub fn build_example(paths: &Paths, source: &str, prefix: &Path, out: &Path) -> Result<()> {
    let src = paths.root.join(format!("driver/capi/examples/{source}.c"));
    let mut c = Command::new("cc");
    c.args([
        "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o",
    ])
    .arg(out)
    .arg(&src)
    .args(pkg_config_flags(
        prefix,
        &["--static", "--cflags", "--libs"],
    )?);
    proc::run_checked(&mut c, Duration::from_secs(300))
        .with_context(|| format!("compiling {source}.c against the C API"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_config_file() {
        let pc = pkg_config(Path::new("/opt/u"));
        assert!(pc.starts_with("prefix=/opt/u\n"));
        assert!(pc.contains("Libs: -L${libdir} -lupnvme_c\n"));
        assert!(pc.contains("Cflags: -I${includedir}\n"));
    }

    /// The install names the library by the SONAME driver/capi/build.rs
    /// gives it.
    #[test]
    fn the_abi_major_matches_the_sonames() {
        let build = include_str!("../../../driver/capi/build.rs");
        assert!(
            build.contains(&format!("const ABI_MAJOR: u32 = {CAPI_ABI_MAJOR};")),
            "driver/capi/build.rs and CAPI_ABI_MAJOR disagree"
        );
    }
}

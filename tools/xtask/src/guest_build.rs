//! Building the workspace's programs statically for the guest (it has no libc).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::paths::Paths;
use crate::{capi, elf, proc};

/// The target triple: explicit, so that `+crt-static` does not reach proc-macros.
pub const TRIPLE: &str = "x86_64-unknown-linux-gnu";
/// The guest integration test binary's name in the guest.
pub const TEST_BINARY: &str = "upnvme-guest-tests";
/// The C examples (driver/capi/examples/NAME.c) and their names in the
/// guest (`NAME_c`).
pub const C_EXAMPLES: [(&str, &str); 4] = [
    ("hello_world", "hello_world_c"),
    ("admin", "admin_c"),
    ("commands", "commands_c"),
    ("metadata", "metadata_c"),
];
/// How long one build (of the guest programs, the C library, the cost harness) may take.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(90 * 60);

/// A program to copy into the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestBinary {
    /// The file on the host.
    pub host: PathBuf,
    /// Its absolute path in the guest.
    pub guest: String,
}

fn cargo(paths: &Paths) -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    flags.push_str(" -C target-feature=+crt-static");
    c.current_dir(&paths.root)
        .env("RUSTFLAGS", flags.trim())
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .arg("--color")
        .arg(if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            "always"
        } else {
            "never"
        });
    c
}

/// Runs a cargo command whose stdout is JSON messages; progress and diagnostics go to the
/// terminal. Returns the executables of the artifacts as (kind, path).
fn cargo_json(cmd: &mut Command) -> Result<Vec<(String, PathBuf)>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let what = proc::describe(cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run `{what}`"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = proc::background(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let status = proc::wait_timeout(&mut child, BUILD_TIMEOUT)?;
    let json = reader.wait(proc::PIPE_GRACE).unwrap_or_default();
    match status {
        None => bail!(
            "`{what}` did not finish within {} s and was killed",
            BUILD_TIMEOUT.as_secs()
        ),
        Some(s) if !s.success() => bail!("guest build failed: `{what}` ({s})"),
        Some(_) => Ok(json.lines().filter_map(artifact_executable).collect()),
    }
}

/// From one cargo JSON message: the target kind and executable of a compiler artifact.
fn artifact_executable(line: &str) -> Option<(String, PathBuf)> {
    if json_string_field(line, "reason")? != "compiler-artifact" {
        return None;
    }
    let exe = json_string_field(line, "executable")?;
    let kind = if line.contains(r#""kind":["test"]"#) {
        "test"
    } else if line.contains(r#""kind":["example"]"#) {
        "example"
    } else {
        "bin"
    };
    Some((kind.to_string(), PathBuf::from(exe)))
}

/// The string value of the first `"key":"…"` in a JSON text (keys are unique enough in
/// cargo's messages for `reason` and `executable`); `None` when absent or not a string.
pub fn json_string_field(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":");
    let start = json.find(&pat)? + pat.len();
    let rest = json[start..].trim_start();
    let mut chars = rest.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(
                        char::from_u32(u32::from_str_radix(&hex, 16).ok()?).unwrap_or('\u{fffd}'),
                    );
                }
                c => out.push(c),
            },
            c => out.push(c),
        }
    }
}

fn check_static(path: &Path) -> Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if !elf::is_static(&data).with_context(|| path.display().to_string())? {
        bail!(
            "{} is dynamically linked; the guest has no libc (build with --target {TRIPLE} and \
             RUSTFLAGS='-C target-feature=+crt-static')",
            path.display()
        );
    }
    Ok(())
}

/// Builds `upnvme`, the library's examples, the C programs and the guest
/// integration tests statically into target/guest.
pub fn build(paths: &Paths) -> Result<Vec<GuestBinary>> {
    eprintln!(
        "xtask: building the guest programs (static, release, {TRIPLE}) into {}",
        paths.guest_target.display()
    );
    let mut out = built(paths, &["-p", "upnvme-cli", "--bins"], "bin")?;
    // The library's examples (driver/examples), so that the README's
    // `cargo xtask vm -- hello_world` works as written.
    out.extend(built(paths, &["-p", "upnvme", "--examples"], "example")?);
    out.extend(build_c_programs(paths)?);
    let mut tests = cargo(paths);
    // The test executable only drives the guest (none of its tests times
    // anything): without the release profile's fat LTO and single codegen
    // unit, which cost a minute of build per CI run on a slow host. The
    // programs above — `upnvme perf` and the C library, which the
    // benchmarks measure — keep them.
    tests
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .args(["test", "--release", "--target", TRIPLE, "--target-dir"])
        .arg(&paths.guest_target)
        .args([
            "-p",
            "upnvme-tests",
            "--features",
            "guest",
            "--test",
            "guest",
            "--no-run",
        ]);
    let test_exe = cargo_json(&mut tests)?
        .into_iter()
        .find(|(kind, _)| kind == "test")
        .map(|(_, exe)| exe)
        .context("cargo test --no-run named no guest test executable")?;
    out.push(GuestBinary {
        host: test_exe,
        guest: format!("/bin/{TEST_BINARY}"),
    });
    for b in &out {
        check_static(&b.host)?;
    }
    Ok(out)
}

/// `cargo build` of `what` for the guest: its executables of target kind
/// `kind`, each installed as /bin/NAME.
fn built(paths: &Paths, what: &[&str], kind: &str) -> Result<Vec<GuestBinary>> {
    let mut c = cargo(paths);
    c.args(["build", "--release", "--target", TRIPLE, "--target-dir"])
        .arg(&paths.guest_target)
        .args(what);
    Ok(cargo_json(&mut c)?
        .into_iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, exe)| on_path(exe))
        .collect())
}

/// `exe` installed in the guest as /bin/ with its own name.
fn on_path(exe: PathBuf) -> GuestBinary {
    let name = exe
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    GuestBinary {
        guest: format!("/bin/{name}"),
        host: exe,
    }
}

/// libupnvme_c for the guest, installed into target/guest/capi, and the C
/// examples ([`C_EXAMPLES`]) compiled statically against that install tree.
fn build_c_programs(paths: &Paths) -> Result<Vec<GuestBinary>> {
    let mut lib = cargo(paths);
    lib.args(["build", "--release", "--target", TRIPLE, "--target-dir"])
        .arg(&paths.guest_target)
        .args(["-p", "upnvme-capi", "--lib"]);
    cargo_json(&mut lib)?;
    let prefix = paths.guest_target.join("capi");
    capi::install(
        paths,
        &paths.guest_target.join(TRIPLE).join("release"),
        &prefix,
    )?;
    let mut out = Vec::new();
    for (source, name) in C_EXAMPLES {
        let exe = paths.guest_target.join(name);
        capi::build_example(paths, source, &prefix, &exe)?;
        out.push(GuestBinary {
            host: exe,
            guest: format!("/bin/{name}"),
        });
    }
    Ok(out)
}

/// The guest programs from an earlier build (`--no-build`).
pub fn prebuilt(paths: &Paths) -> Result<Vec<GuestBinary>> {
    let release = paths.guest_target.join(TRIPLE).join("release");
    let mut out = Vec::new();
    for name in ["upnvme", "upnvme-rawfloor"] {
        let exe = release.join(name);
        if exe.exists() {
            out.push(GuestBinary {
                host: exe,
                guest: format!("/bin/{name}"),
            });
        }
    }
    // The library's examples as cargo uplifts them (`examples/NAME`, no hash).
    let mut examples: Vec<PathBuf> = std::fs::read_dir(release.join("examples"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            p.is_file() && !n.contains('-') && !n.contains('.')
        })
        .collect();
    examples.sort();
    out.extend(examples.into_iter().map(on_path));
    for (_, name) in C_EXAMPLES {
        let exe = paths.guest_target.join(name);
        if exe.exists() {
            out.push(GuestBinary {
                host: exe,
                guest: format!("/bin/{name}"),
            });
        }
    }
    let newest_test = std::fs::read_dir(release.join("deps"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("guest-")
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p);
    if let Some(t) = newest_test {
        out.push(GuestBinary {
            host: t,
            guest: format!("/bin/{TEST_BINARY}"),
        });
    }
    if out.is_empty() {
        bail!(
            "--no-build: no guest programs in {}; run once without --no-build",
            release.display()
        );
    }
    for b in &out {
        check_static(&b.host)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_messages() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w#upnvme-tests@0.1.0","target":{"kind":["test"],"crate_types":["bin"],"name":"guest","src_path":"/w/tests/guest/main.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":1,"debug_assertions":false,"overflow_checks":false,"test":true},"features":["guest"],"filenames":["/w/target/guest/x86_64-unknown-linux-gnu/release/deps/guest-0123456789abcdef"],"executable":"/w/target/guest/x86_64-unknown-linux-gnu/release/deps/guest-0123456789abcdef","fresh":true}"#;
        assert_eq!(
            artifact_executable(line),
            Some((
                "test".into(),
                "/w/target/guest/x86_64-unknown-linux-gnu/release/deps/guest-0123456789abcdef"
                    .into()
            ))
        );
        let lib = r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"executable":null,"fresh":true}"#;
        assert_eq!(artifact_executable(lib), None);
        let bin = r#"{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"upnvme"},"executable":"/w/t/release/upnvme"}"#;
        assert_eq!(
            artifact_executable(bin),
            Some(("bin".into(), "/w/t/release/upnvme".into()))
        );
        assert_eq!(
            artifact_executable(r#"{"reason":"build-finished","success":true}"#),
            None
        );
    }

    #[test]
    fn json_strings() {
        assert_eq!(
            json_string_field(r#"{"a": "x\"y\\z\u0041"}"#, "a").as_deref(),
            Some("x\"y\\zA")
        );
        assert_eq!(json_string_field(r#"{"a":1}"#, "a"), None);
        assert_eq!(json_string_field(r#"{"a":"unterminated"#, "a"), None);
    }
}

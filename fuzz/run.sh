#!/usr/bin/env bash
# Runs every fuzz target for SECONDS_PER_TARGET seconds (default 30), one
# after the other; exits non-zero as soon as one finds a crash, a hang
# (libFuzzer -timeout) or runs out of memory.
#
#   fuzz/run.sh [SECONDS_PER_TARGET]
#
# Needs a nightly toolchain and cargo-fuzz:
#   rustup toolchain install nightly --profile minimal && cargo install cargo-fuzz
#
# Environment:
#   FUZZ_TARGET_DIR      cargo target directory (default: fuzz/target)
#   FUZZ_TARGETS         targets to run (default: all of `cargo fuzz list`)
#   FUZZ_JOBS            parallel libFuzzer workers per target (default 1)
#   UPNVME_FUZZ_STRICT=1 known, not yet fixed findings fail the run too
#                        (see fuzz/README.md)
#
# Crash inputs land in fuzz/artifacts/<target>/; the corpus grows in
# fuzz/corpus/<target>/; fuzz/regressions/<target>/ (inputs of earlier
# findings) is replayed at the start of every run.
# Reproduce one with: cargo +nightly fuzz run <target> <artifact>
set -euo pipefail

seconds="${1:-30}"
case "$seconds" in
'' | *[!0-9]*)
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")"
target_dir="${FUZZ_TARGET_DIR:-$PWD/target}"
jobs="${FUZZ_JOBS:-1}"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: no nightly toolchain (rustup toolchain install nightly --profile minimal)" >&2
    exit 3
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
    exit 3
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
# A failing `cargo fuzz list` inside the process substitution is not seen by
# `set -e`: an empty list would pass having fuzzed nothing.
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz/run.sh: no fuzz target found (cargo +nightly fuzz list printed none)" >&2
    exit 1
fi

cargo +nightly fuzz build --target-dir "$target_dir"

extra=()
[ "$jobs" -gt 1 ] && extra=(-jobs="$jobs" -workers="$jobs")

status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    dirs=("corpus/$t")
    # Inputs that reproduced earlier findings run first, every time.
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    log="artifacts/$t/last-run.log"
    echo "=== fuzz $t for ${seconds}s"
    # -timeout: one input taking longer than 10 s is a hang.
    # -rss_limit_mb: the model's DMA memory is pinned; 3 GiB means a leak or
    #  a hostile-size allocation.
    set +e
    cargo +nightly fuzz run --target-dir "$target_dir" "$t" "${dirs[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 \
        -max_len=4096 -len_control=20 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
    rc=$?
    set -e
    grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [ "$rc" -ne 0 ] || grep -qE '(SUMMARY|ERROR): libFuzzer' "$log"; then
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' -A2 "$log" >&2 || true
        echo "=== $t FAILED (exit $rc): input in fuzz/artifacts/$t/, log $log" >&2
        status=1
        break
    fi
done
exit "$status"

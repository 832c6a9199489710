#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for SECONDS seconds
# (libFuzzer, address sanitizer, 2 GiB RSS limit), starting from the seeds in
# fuzz/corpus/<target>/. Prints executions and crashes per target; exits
# non-zero if any target crashed (the input is under fuzz/artifacts/<target>/).
#
# Usage: scripts/fuzz.sh SECONDS [TARGET...]   (default: every target)
# libFuzzer's sanitizers need the nightly toolchain; the script installs it
# and cargo-fuzz if they are missing. Builds go to $CARGO_TARGET_DIR (under its
# x86_64-unknown-linux-gnu/, apart from normal builds); inputs libFuzzer finds
# interesting are kept in $CARGO_TARGET_DIR/fuzz-corpus/<target>/ between
# runs, not in the repository.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
    echo "usage: scripts/fuzz.sh SECONDS [TARGET...]" >&2
    exit 64
fi
seconds="$1"
shift
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(store_wire rdzv_job agent_flags accel_config lighthouse)
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "scripts/fuzz.sh: installing the nightly toolchain (cargo-fuzz needs it)" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh: installing cargo-fuzz" >&2
    cargo +nightly install cargo-fuzz --locked
fi

# Each target's limits: the config reader gets files up to 64 KiB (deeply
# nested documents are its risk), the others libFuzzer's default 4 KiB.
max_len() {
    case "$1" in
        accel_config) echo 65536 ;;
        *) echo 4096 ;;
    esac
}

if [[ $# -eq 0 ]]; then
    cargo +nightly fuzz build # every target in one cargo run
else
    for t in "${targets[@]}"; do cargo +nightly fuzz build "$t"; done
fi
failed=0
summary=()
for t in "${targets[@]}"; do
    work="$CARGO_TARGET_DIR/fuzz-corpus/$t"
    mkdir -p "$work" "artifacts/$t"
    log="$CARGO_TARGET_DIR/fuzz-corpus/$t.log"
    status=0
    cargo +nightly fuzz run "$t" "$work" "corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
        -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs=$(grep -o '^stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    crashes=$(grep -c 'Test unit written to' "$log" || true)
    if [[ $status -ne 0 ]]; then
        failed=1
        [[ "$crashes" -eq 0 ]] && crashes=1
        echo "---- $t failed (exit $status); the end of $log:" >&2
        grep -A12 -m1 -E 'panicked at|ERROR: (libFuzzer|AddressSanitizer)' "$log" >&2 || tail -30 "$log" >&2
        grep 'Test unit written to' "$log" >&2 || true
    fi
    summary+=("$(printf '%-13s executions %10s   crashes %s' "$t" "${runs:-?}" "$crashes")")
done
printf '%s\n' "${summary[@]}"
exit "$failed"

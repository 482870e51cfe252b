#!/usr/bin/env bash
# The two commands of the README, and their building blocks. Idempotent: packages are
# installed only when missing, the build directory is reused, the guest kernel is cached.
#
#   ./dev.sh demo    install, build, run the sample client/server pair over TCP and shm://
#                    on this host and over soft-RoCE (rdma_rxe) in a QEMU guest, or on this
#                    host's RDMA device when it has one
#   ./dev.sh test    install, build, run the whole test suite (what CI runs)
#   ./dev.sh deps | build
#   ./dev.sh asan | tsan | fuzz   one sanitizer or fuzz pass of `test` on its own
#   ./dev.sh format [--fix]       the style check of `test` (or rewrite the files)
set -euo pipefail
cd "$(dirname "$0")"
readonly BUILD=${RDMX_BUILD_DIR:-build}

# Why each package is here: README.md, "Dependencies".
readonly PACKAGES=(
    g++ meson ninja-build pkg-config cmake
    libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils rdmacm-utils
    libboost-dev libgtest-dev libgmock-dev libcli11-dev clang-14 libclang-rt-14-dev clang-format-14
    qemu-system-x86 busybox-static kmod iproute2 xz-utils zstd util-linux procps
)

# Each step with the time since the command started (where CI's 30 minutes go).
log() { printf '\n=== %s [%d:%02d]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

deps() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    # The guest's kernel is fetched with apt-get download: its package lists must exist.
    if ((${#missing[@]} > 0)) || [ -z "$(apt-cache depends linux-image-amd64 2>/dev/null | grep Depends)" ]; then
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        log "installing: ${missing[*]:-(package lists only)}"
        $sudo apt-get update -q
        ((${#missing[@]} == 0)) ||
            DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
}

build() {
    if [ ! -f "$BUILD/build.ninja" ]; then
        log "configuring $BUILD"
        meson setup "$BUILD" -Drdma=enabled -Dtests=enabled -Dsamples=enabled --werror
    fi
    log "building $BUILD"
    ninja -C "$BUILD"
}

# The second compiler CI holds us to: clang 14, warnings as errors, and without CUDA so
# that the build is also proven to work where the toolkit is absent. The same build is the
# AddressSanitizer + UndefinedBehaviorSanitizer one (any UB finding aborts), and it holds
# the libFuzzer targets (tests/fuzz), so that CI compiles the library with clang only once.
readonly ASAN_BUILD=${BUILD}-asan TSAN_BUILD=${BUILD}-tsan
build_clang() {
    local dir=$ASAN_BUILD
    if [ ! -f "$dir/build.ninja" ]; then
        log "configuring $dir (clang 14, ASan + UBSan, fuzz targets, -Dcuda=disabled)"
        CXX=clang++-14 meson setup "$dir" -Drdma=enabled -Dcuda=disabled -Dtests=enabled -Dsamples=enabled \
            -Dfuzz=enabled --werror -Db_sanitize=address,undefined -Db_lundef=false \
            -Dcpp_args=-fno-sanitize-recover=all -Dcpp_link_args=-fno-sanitize-recover=all
    fi
    log "building $dir"
    ninja -C "$dir"
}

# Runs the sample pair on one address: server in the background, client in front.
sample_pair() { # ADDRESS [taskset prefix for server] [for client]
    local addr=$1 server_cpu=${2:-} client_cpu=${3:-} out rc=0
    out=$(mktemp)
    $server_cpu "$BUILD/samples/rdmx_server" "$addr" --count 1 >"$out" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do grep -q listening "$out" && break; sleep 0.1; done
    $client_cpu "$BUILD/samples/rdmx_client" "$addr" --size $((4 << 20)) || rc=$?
    wait "$pid" || rc=$?
    sed 's/^/    /' "$out"
    rm -f "$out"
    return "$rc"
}

demo() {
    deps
    build
    log "sample pair over TCP on this host"
    sample_pair tcp://127.0.0.1:7471
    log "sample pair over shm:// (UNIX sockets) on this host"
    sample_pair shm://demo:7471
    if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ] && [ -n "${RDMX_RDMA_ADDR:-}" ]; then
        log "sample pair over this host's RDMA device ($RDMX_RDMA_ADDR)"
        sample_pair "rdma://$RDMX_RDMA_ADDR:7471"
    else
        log "sample pair over soft-RoCE (rdma_rxe) in a QEMU guest"
        # The guest runs this same script's sample_pair with its own IP; pinning the two
        # busy processes to different vCPUs avoids stalls on the timer tick under TCG.
        tests/guest/rxe-guest.sh --cache "$BUILD/guest-cache" --share "$PWD" --share "$(realpath "$BUILD")" \
            --timeout 300 -- env RDMX_BUILD_DIR="$(realpath "$BUILD")" bash "$PWD/dev.sh" guest-demo
    fi
}

guest_demo() { # runs inside the guest
    sample_pair "rdma://$RDMX_GUEST_IP:7471" "taskset -c 0" "taskset -c 1"
}

# Copies a sanitizer pass's GoogleTest reports next to the main ones, prefixed, so that the
# closing summary counts them too.
collect_results() { # FROM_DIR PREFIX
    local f
    for f in "$1"/*.xml; do
        [ -e "$f" ] && cp "$f" "$BUILD/tests/results/$2-$(basename "$f")"
    done
    return 0
}

# ASan + UBSan: unit, tcp (conformance-tcp-staged too, which the plain pass leaves to this
# one), conformance-tcp and shm's data suites (suite sanitized) on the host, the
# conformance suite on rxe in
# the guest (which runs host binaries over 9p, sanitizer runtime included). The siw run
# and the samples' runs over rxe (suite verbs-samples) stay out: they exercise library
# code that conformance-verbs runs under ASan already, and CI's 30 minutes are better
# spent (they take 2 minutes here under ASan). For the same reason the conformance runs
# here leave out the stress multipliers that the plain pass runs on every backend and that
# add no code of their own: 2000 connect/remove cycles and 1024 peers (endpoint_race; the
# shorter races stay, and TSan runs those two on tcp), and on rxe the soak, the 8-client
# shapes and the Asio endpoint service (all of them run under ASan on tcp); about 90 s.
readonly ASAN_CONFORMANCE_FILTER='-backends/endpoint_race.two_thousand_connect_remove_cycles/*:backends/endpoint_race.more_peers_than_1024_reach_one_endpoint/*:backends/soak.*/verbs:backends/shapes.*_8_clients/verbs:backends/asio_endpoint_service.*/verbs'
test_asan() {
    log "ASan + UBSan (suites: unit, tcp, sanitized, gpu, conformance-verbs on soft-RoCE)"
    local rc=0
    rm -rf "$ASAN_BUILD/tests/results"
    # (GTEST_FILTER reaches conformance-tcp and, through run-verbs.sh, the guest; the runs
    # that set a filter of their own keep theirs.)
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    RDMX_GUEST_CACHE="$(realpath "$BUILD")/guest-cache" GTEST_FILTER=$ASAN_CONFORMANCE_FILTER \
        meson test -C "$ASAN_BUILD" --print-errorlogs --num-processes 1 --timeout-multiplier 2 \
        --suite unit --suite tcp --suite sanitized --suite gpu --suite verbs --no-suite siw \
        --no-suite verbs-samples --no-suite packaging || rc=$?
    grep -h '^\[rdmx\]' "$ASAN_BUILD/meson-logs/testlog.txt" | sort -u | sed 's/^/asan: /' || true
    collect_results "$ASAN_BUILD/tests/results" asan
    return "$rc"
}

# ThreadSanitizer on the TCP backend's threaded tests. clang, not g++: g++ 12 warns
# (-Wtsan) inside Boost.Asio's headers. Only the two test programs are built, and the
# helper programs their tests spawn.
test_tsan() {
    log "ThreadSanitizer (tcp-unit, conformance on tcp, its data suites on shm)"
    if [ ! -f "$TSAN_BUILD/build.ninja" ]; then
        CXX=clang++-14 meson setup "$TSAN_BUILD" -Drdma=disabled -Dcuda=disabled -Dtests=enabled \
            -Dsamples=disabled --werror -Db_sanitize=thread -Db_lundef=false || return
    fi
    # (set -e does not apply in a function called with ||: failures return explicitly.)
    ninja -C "$TSAN_BUILD" tests/conformance_test tests/tcp/tcp_unit_test tests/tcp/cma_target tests/disconnect_peer \
        tests/endpoint_peer || return
    local rc=0 results=$BUILD/tests/results
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}
    GTEST_OUTPUT="xml:$results/tsan-tcp-unit.xml" "$TSAN_BUILD/tests/tcp/tcp_unit_test" || rc=$?
    # Without the runs that are long in waiting or in volume rather than in threads: the
    # soak (256 connections, each with the same two threads as any other test's) and the
    # clean-disconnect-against-dead-peer test (13 s, mostly its peer process's timeouts);
    # the plain pass runs both on every backend. About 30 s.
    RDMX_TEST_BACKENDS=tcp GTEST_FILTER='-*/soak.*:*/server_cm.a_clean_disconnect_and_a_dead_peer_process_are_told_apart/*' \
        GTEST_OUTPUT="xml:$results/tsan-conformance-tcp.xml" "$TSAN_BUILD/tests/conformance_test" || rc=$?
    # shm's data path (CMA), as conformance-shm-data runs it under ASan.
    RDMX_TEST_BACKENDS=shm GTEST_FILTER='-*/server_cm.*:*/endpoint_race.*:*/endpoint_link.*:*/soak.*' \
        GTEST_OUTPUT="xml:$results/tsan-conformance-shm-data.xml" "$TSAN_BUILD/tests/conformance_test" || rc=$?
    return "$rc"
}

# libFuzzer: each target for a bounded time, starting from a scratch copy of its committed
# corpus (tests/fuzz/corpus/TARGET). The three decoders run 15 s each: their input space is
# small and coverage stops growing within seconds, at hundreds of thousands of inputs a
# second (2-6 million inputs each in 20 s). fuzz_engine, a real connection per input, runs
# 45 s. RDMX_FUZZ_SECONDS sets one time for all. A crash, a failed check or a hang fails the
# pass; the input that caused it is kept in $BUILD/fuzz-artifacts/. Two lanes, one per CPU:
# the engine's, and the three decoders one after another (45 s for the pass instead of 90;
# each target keeps its time).
fuzz_one() { # TARGET REPORT: runs TARGET, writes its lines for the log into REPORT
    local t=$1 report=$2 work seeds extra=() trc=0 seconds=${RDMX_FUZZ_SECONDS:-15}
    [ "$t" != fuzz_engine ] || seconds=${RDMX_FUZZ_SECONDS:-45}
    work=$(mktemp -d)
    mkdir "$work/corpus"
    cp tests/fuzz/corpus/"$t"/* "$work/corpus/" || return
    seeds=$(ls "$work/corpus" | wc -l)
    # fuzz_engine's connections are freed on the engine thread after the input ends,
    # which libFuzzer's per-input leak check would take for a leak (and rescan the heap
    # every run); LeakSanitizer still checks at exit.
    [ "$t" != fuzz_engine ] || extra=(-detect_leaks=0)
    "$ASAN_BUILD/tests/fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=25 \
        -artifact_prefix="$BUILD/fuzz-artifacts/$t-" "${extra[@]}" "$work/corpus" >"$work/log" 2>&1 || trc=$?
    local runs speed
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
    if ((trc == 0)); then
        printf '%s: ok, %s runs in %s s (%s execs/s), corpus %s -> %s inputs\n' \
            "$t" "${runs:-?}" "$seconds" "${speed:-?}" "$seeds" "$(ls "$work/corpus" | wc -l)" >"$report"
    else
        {
            printf '%s: FAILED (exit %s); the input is in %s/fuzz-artifacts/; last lines:\n' "$t" "$trc" "$BUILD"
            grep -v '^rdmx: tcp: ' "$work/log" | tail -n 40 | sed 's/^/    /'
            # Then the reason (a failed check, a sanitizer report, a hang) again, last: a
            # stack trace can push it out of the tail, and a CI excerpt shows only the end.
            grep -E 'check failed|ERROR: |runtime error|hang: |touched outside|^fuzz_' "$work/log" |
                head -n 10 | sed "s/^/    $t reason: /"
        } >"$report"
    fi
    rm -rf "$work"
    return "$trc"
}

test_fuzz() {
    local rc=0 t reports
    log "fuzzing (libFuzzer + ASan + UBSan)"
    mkdir -p "$BUILD/fuzz-artifacts"
    reports=$(mktemp -d)
    fuzz_one fuzz_engine "$reports/fuzz_engine" &
    local engine=$!
    for t in fuzz_frame fuzz_handshake fuzz_descriptor; do
        fuzz_one "$t" "$reports/$t" || rc=1
    done
    wait "$engine" || rc=1
    for t in fuzz_frame fuzz_handshake fuzz_descriptor fuzz_engine; do
        cat "$reports/$t" 2>/dev/null || { echo "$t: FAILED (no report)"; rc=1; }
    done
    rm -rf "$reports"
    return "$rc"
}

# The style is mechanical (.clang-format): every tracked C++ file as clang-format-14 would
# write it. `./dev.sh format` checks; `./dev.sh format --fix` rewrites the files.
# The layering is checked too: every #include runs the way the README's diagram does
# (tests/style/check-includes.sh; --fix cannot fix that, so it is checked either way).
test_format() {
    log "format (clang-format-14, .clang-format) and include layering"
    tests/style/check-includes.sh --self-test || return
    tests/style/check-includes.sh || return
    local files bad=()
    mapfile -t files < <(git ls-files '*.cpp' '*.hpp' 2>/dev/null || find cm gpu include lib samples tests verbs -name '*.[ch]pp')
    if [ "${1:-}" = --fix ]; then
        clang-format-14 -i "${files[@]}"
        return
    fi
    # In batches, two at a time (a clang-format per file took 20 s of CI's 30 minutes);
    # only when a batch fails is each file asked, to name the ones not formatted.
    if ! printf '%s\0' "${files[@]}" | xargs -0 -P 2 -n 32 clang-format-14 --dry-run -Werror >/dev/null 2>&1; then
        for f in "${files[@]}"; do
            clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
        done
        ((${#bad[@]})) || bad+=("(clang-format-14 failed on a batch, but on no file alone)")
    fi
    if ((${#bad[@]})); then
        printf 'not formatted (./dev.sh format --fix): %s\n' "${bad[@]}"
        return 1
    fi
    echo "${#files[@]} files formatted"
}

# Sums the GoogleTest XML reports: the closing line counts skips apart from passes.
summary() {
    awk '
        /<testcase /        { n++; cur = "pass"; if ($0 ~ /result="skipped"/) cur = "skip"; open = ($0 !~ /\/>[[:space:]]*$/) ; if (!open) tally() ; next }
        /<failure/          { cur = "fail" }
        /<skipped/          { if (cur != "fail") cur = "skip" }
        /<\/testcase>/      { tally() }
        function tally() { if (cur == "pass") p++; else if (cur == "fail") f++; else if (cur == "skip") s++; cur = "" }
        END { printf "%d passed, %d failed, %d skipped\n", p, f, s }
    ' "$BUILD"/tests/results/*.xml
}

test_all() {
    deps
    build
    build_clang
    rm -rf "$BUILD/tests/results"
    log "meson test (suites: unit, tcp, verbs and fault on soft-RoCE guests, gpu)"
    local rc=0 failed=()
    # The staged TCP conformance run (suite staged) and shm's data suites again (suite
    # sanitized) run in the sanitizer passes only.
    meson test -C "$BUILD" --print-errorlogs --num-processes 1 --no-suite staged --no-suite sanitized ||
        { rc=$?; failed+=("meson test"); }
    local main_log
    main_log=$(grep -h '^\[rdmx\]' "$BUILD/meson-logs/testlog.txt" | sort -u || true)
    test_asan || { rc=$?; failed+=("ASan+UBSan"); }
    test_tsan || { rc=$?; failed+=("TSan"); }
    test_fuzz || { rc=$?; failed+=("fuzzing"); }
    test_format || { rc=$?; failed+=("format"); }
    log "summary (GoogleTest cases over all suites, sanitizer passes included)"
    [ -z "$main_log" ] || echo "$main_log"
    summary
    # A pass that stopped early (a sanitizer report halts its binary) leaves no XML, so its
    # cases are missing from the counts above: name it.
    if ((${#failed[@]})); then
        echo "FAILED passes: ${failed[*]} (see their output above)"
    fi
    return "$rc"
}

case "${1:-}" in
deps) deps ;;
build) deps; build ;;
demo) demo ;;
guest-demo) guest_demo ;;
test) test_all ;;
asan) deps; build_clang; mkdir -p "$BUILD/tests/results"; test_asan ;;
tsan) deps; mkdir -p "$BUILD/tests/results"; test_tsan ;;
fuzz) deps; build_clang; test_fuzz ;;
format) deps; test_format "${2:-}" ;;
*) echo "usage: $0 demo|test|deps|build|asan|tsan|fuzz|format [--fix]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The two commands of the README, and their building blocks. Idempotent: packages are
# installed only when missing, the build directory is reused, the guest kernel is cached.
#
#   ./dev.sh demo    install, build, run the sample client/server pair over TCP on this
#                    host and over soft-RoCE (rdma_rxe) in a QEMU guest, or on this host's
#                    RDMA device when it has one
#   ./dev.sh test    install, build, run the whole test suite (what CI runs)
#   ./dev.sh deps | build
set -euo pipefail
cd "$(dirname "$0")"
readonly BUILD=${RDMX_BUILD_DIR:-build}

# Why each package is here: README.md, "Dependencies".
readonly PACKAGES=(
    g++ meson ninja-build pkg-config
    libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils rdmacm-utils
    libboost-dev libgtest-dev libgmock-dev libcli11-dev clang-14
    qemu-system-x86 busybox-static kmod iproute2 xz-utils zstd util-linux procps
)

log() { printf '\n=== %s\n' "$*"; }

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
# that the build is also proven to work where the toolkit is absent.
build_clang() {
    local dir=${BUILD}-clang
    if [ ! -f "$dir/build.ninja" ]; then
        log "configuring $dir (clang 14, -Dcuda=disabled)"
        CXX=clang++-14 meson setup "$dir" -Drdma=enabled -Dcuda=disabled -Dtests=enabled -Dsamples=enabled --werror
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
    log "meson test (suites: unit, tcp, verbs on soft-RoCE)"
    local rc=0
    meson test -C "$BUILD" --print-errorlogs --num-processes 1 || rc=$?
    log "summary (GoogleTest cases over all suites)"
    grep -h '^\[rdmx\]' "$BUILD/meson-logs/testlog.txt" | sort -u || true
    summary
    return "$rc"
}

case "${1:-}" in
deps) deps ;;
build) deps; build ;;
demo) demo ;;
guest-demo) guest_demo ;;
test) test_all ;;
*) echo "usage: $0 demo|test|deps|build" >&2; exit 2 ;;
esac

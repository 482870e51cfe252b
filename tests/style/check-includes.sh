#!/usr/bin/env bash
# Checks that every #include runs the way the layers do (README.md, "Architecture"):
#
#   include/rdmx/   the public API: includes only itself (and the standard library);
#                   rdmx/asio.hpp alone, the header-only Asio glue, includes Boost.Asio too
#        ^
#   lib/ core       backend-neutral code (*.hpp, *.cpp directly in lib/): the public API
#        ^          and its own headers; it reaches the backends only through the
#        |          declarations in lib/backends.hpp, which the backends define
#   lib/tcp/        the TCP backend: core, itself, Boost.Asio
#   verbs/          PD, CQ, QP, MR and the data path: core, itself, libibverbs, and
#        ^          nothing of rdma_cm (no cm/, no <rdma/...>)
#   cm/             rdma_cm: the verbs backend's domain, listener, connection flow and
#                   event loop, built on verbs/
#   gpu/            <rdmx/gpu.hpp>'s device buffers: the public API and the core's CUDA
#                   driver loader (lib/cuda_driver.hpp)
#   samples/        programs a user would copy: the public API and their own shared header
#                   (and Boost.Asio in samples/asio_*, which use rdmx/asio.hpp and may
#                   include each other)
#
# So: verbs/ <- cm/ <- lib/ core (domain::open, by declaration), never the other way;
# tests/ may include anything (white-box tests). Standard and other system headers are
# always allowed.
#
#   tests/style/check-includes.sh [ROOT]   check the tree at ROOT (default: this checkout)
#   tests/style/check-includes.sh --self-test   prove each rule fails on a wrong include
set -euo pipefail

# What each layer may include, besides the standard library.
declare -A allowed=(
    [api]="api"
    [api_asio]="api asio"
    [core]="api core"
    [tcp]="api core tcp asio"
    [verbs]="api core verbs ibverbs"
    [cm]="api core verbs cm ibverbs rdma_cm"
    [gpu]="api core gpu"
    [samples]="api samples"
    [samples_asio]="api samples samples_asio asio"
)

layer_of() { # PATH (relative to the root) -> layer, or nothing for unchecked files
    case $1 in
    include/rdmx/asio.hpp) echo api_asio ;;
    include/rdmx/*) echo api ;;
    lib/tcp/*) echo tcp ;;
    lib/*) echo core ;;
    verbs/*) echo verbs ;;
    cm/*) echo cm ;;
    gpu/*) echo gpu ;;
    samples/asio_*) echo samples_asio ;;
    samples/*) echo samples ;;
    esac
}

check() { # ROOT
    local root=$1 bad=0 f line target layer kind dir
    cd "$root"
    local files
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        files=$(git ls-files -co --exclude-standard '*.cpp' '*.hpp' '*.h' '*.hpp.in')
    else
        files=$(find . -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.hpp.in' \) | sed 's|^\./||')
    fi
    for f in $files; do
        [ -f "$f" ] || continue
        layer=$(layer_of "$f")
        [ -n "$layer" ] || continue
        dir=$(dirname "$f")
        while IFS= read -r line; do
            [[ ${line#*:} =~ include[[:space:]]*([<\"][^>\"]*[>\"]) ]] || continue
            target=${BASH_REMATCH[1]}
            case $target in
            \<rdmx/*) kind=api ;;
            \<rdma/*) kind=rdma_cm ;;
            \<infiniband/*) kind=ibverbs ;;
            \<boost/*) kind=asio ;;
            \<cuda*) kind=cuda ;;
            \<*) continue ;; # the standard library and the system
            \"*)
                # As the build resolves it: next to the file, then -I include, -I lib, the root.
                local name=${target//\"/} p=""
                for cand in "$dir/$name" "include/$name" "lib/$name" "$name"; do
                    if [ -f "$cand" ]; then
                        p=$(realpath -m --relative-to=. "$cand") # folds verbs/../lib
                        break
                    fi
                done
                if [ -z "$p" ]; then
                    echo "$f:${line%%:*}: $target: not found in the tree, so its layer is unknown"
                    bad=1
                    continue
                fi
                kind=$(layer_of "$p")
                [ -n "$kind" ] || kind="outside the layers ($p)"
                ;;
            *) continue ;;
            esac
            if [[ " ${allowed[$layer]} " != *" $kind "* ]]; then
                echo "$f:${line%%:*}: includes $target ($kind): the $layer layer may include only: ${allowed[$layer]}"
                bad=1
            fi
        done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" || true)
    done
    return "$bad"
}

self_test() {
    local tmp rc=0
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    # A tree whose includes all run the right way ...
    mkdir -p "$tmp"/{include/rdmx,lib/tcp,verbs,cm,samples}
    echo '#include <vector>' >"$tmp/include/rdmx/api.hpp"
    printf '#include <rdmx/api.hpp>\n' >"$tmp/lib/core.hpp"
    printf '#include "core.hpp"\n#include <boost/asio/post.hpp>\n' >"$tmp/lib/tcp/tcp.hpp"
    printf '#include "core.hpp"\n#include <infiniband/verbs.h>\n' >"$tmp/verbs/qp.hpp"
    printf '#include "verbs/qp.hpp"\n#include <rdma/rdma_cma.h>\n' >"$tmp/cm/flow.cpp"
    printf '#include <rdmx/api.hpp>\n' >"$tmp/samples/s.cpp"
    (check "$tmp" >/dev/null) || { echo "self-test: a correct tree failed:"; (check "$tmp") || true; rc=1; }
    # ... and each wrong arrow, alone, must fail it.
    local cases=(
        'verbs/bad.cpp|#include "cm/flow.cpp"'
        'verbs/bad.cpp|#include <rdma/rdma_cma.h>'
        'include/rdmx/bad.hpp|#include "core.hpp"'
        'include/rdmx/bad.hpp|#include <boost/asio/post.hpp>'
        'include/rdmx/asio.hpp|#include "core.hpp"'
        'lib/bad.cpp|#include "tcp/tcp.hpp"'
        'lib/bad.cpp|#include "verbs/qp.hpp"'
        'lib/tcp/bad.cpp|#include "cm/flow.cpp"'
        'samples/bad.cpp|#include "core.hpp"'
        'cm/bad.cpp|#include "no/such.hpp"'
    )
    local c
    for c in "${cases[@]}"; do
        local file=${c%%|*} text=${c#*|}
        echo "$text" >"$tmp/$file"
        if (check "$tmp" >/dev/null); then
            echo "self-test: $file with '$text' passed the check"
            rc=1
        fi
        rm "$tmp/$file"
    done
    ((rc == 0)) && echo "include check self-test: ${#cases[@]} wrong includes caught, the correct tree passes"
    return "$rc"
}

if [ "${1:-}" = --self-test ]; then
    self_test
else
    root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
    check "$root" && echo "includes run one way (tests/style/check-includes.sh)"
fi

#!/usr/bin/env bash
# Builds the real Kubernetes control plane the integration tests run against: kube-apiserver,
# etcd and helm, from the Go wrapper modules beside this script (versions pinned in their go.mod
# files), plus kubectl when the machine has none; and the node the end-to-end test runs pods on:
# kubelet, kube-controller-manager, kube-scheduler and kube-proxy (the same k8s.io/kubernetes
# module and Go build cache as kube-apiserver), containerd with its CRI plugin, its runc shim and
# ctr. runc and the CNI plugins come from Debian (tests/node/install-deps.sh).
#
# The binaries go to a cache directory named after the versions, so a warm run only checks that
# they are there:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/control-plane/k8s-<v>_etcd-<v>_helm-<v>_containerd-<v>/bin
# Each binary is written under a temporary name and renamed when it is complete and reports the
# expected version, so an interrupted build is never taken as done.
#
# Usage:
#   build.sh                  build whatever is missing (a cold build takes several minutes)
#   build.sh --print-bin-dir  print the bin directory and exit (builds nothing)
#   build.sh --check-version BINARY EXPECTED ARGS...
#                             check that `BINARY ARGS...` runs and its output names EXPECTED (the
#                             check each freshly built binary passes)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The first three lines of $1, on one line (for messages).
first_lines() {
    local -a lines
    mapfile -t -n 3 lines <<<"$1"
    echo "${lines[*]}"
}

# check_version <binary> <expected> <version args...>: the binary's whole output (stdout and
# stderr) is read to its end, then matched. Never `| head`: under pipefail a binary that writes
# more than head reads dies of SIGPIPE when head exits, and the check fails (exit 141) at random.
check_version() {
    local binary="$1" want="$2"
    shift 2
    local output
    if ! output="$("$binary" "$@" 2>&1)"; then
        echo "control-plane: '$binary $*' failed: $(first_lines "$output")" >&2
        return 1
    fi
    if [[ "$output" != *"$want"* ]]; then
        echo "control-plane: $binary reports '$(first_lines "$output")', expected $want" >&2
        return 1
    fi
}

# The module versions are the single source of truth: read them from the wrapper modules.
module_version() { # <wrapper dir> <module path>
    local v
    v="$(awk -v m="$2" '$1 == m { print $2; exit }' "$here/$1/go.mod")"
    [[ -n "$v" ]] || { echo "build.sh: $2 is not required in $here/$1/go.mod" >&2; exit 1; }
    echo "$v"
}
k8s_version="$(module_version kubernetes k8s.io/kubernetes)"
etcd_version="$(module_version etcd go.etcd.io/etcd/server/v3)"
helm_version="$(module_version helm helm.sh/helm/v4)"
containerd_version="$(module_version containerd github.com/containerd/containerd/v2)"

cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
bin_dir="$cache_root/control-plane/k8s-${k8s_version}_etcd-${etcd_version}_helm-${helm_version}_containerd-${containerd_version}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "$bin_dir"
    exit 0
elif [[ "${1:-}" == "--check-version" && $# -ge 3 ]]; then
    shift
    check_version "$@"
    exit
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

# Stay on the machine's Go: the wrapper modules must build with it.
export GOTOOLCHAIN=local
# Static binaries, as Kubernetes releases them; no VCS stamping (there is no VCS in the module cache).
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false"

mkdir -p "$bin_dir"

# go_build <name> <wrapper dir> <package> <expected version> <version command...> -- <go build flags...>
go_build() {
    local name="$1" dir="$2" pkg="$3" want="$4"
    shift 4
    local -a version_cmd=()
    while [[ "$1" != "--" ]]; do version_cmd+=("$1"); shift; done
    shift

    local target="$bin_dir/$name"
    if [[ -x "$target" ]]; then
        echo "control-plane: $name $want is already built ($target)"
        return
    fi
    local tmp="$bin_dir/.$name.tmp.$$"
    trap "rm -f '$tmp'" EXIT
    echo "control-plane: building $name $want (cold build, can take several minutes on 2 cores)..."
    local start=$SECONDS
    (cd "$here/$dir" && go build -trimpath -o "$tmp" "$@" "$pkg")
    if ! check_version "$tmp" "$want" "${version_cmd[@]}"; then
        echo "control-plane: $name was built but does not report $want" >&2
        exit 1
    fi
    mv -f "$tmp" "$target"
    trap - EXIT
    echo "control-plane: built $name $want in $((SECONDS - start))s"
}

k8s_minor="${k8s_version#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# The tags Kubernetes' own release build uses (hack/lib/golang.sh).
k8s_tags="selinux,notest,grpcnotrace"

go_build etcd etcd go.etcd.io/etcd/server/v3 "${etcd_version#v}" --version -- \
    -ldflags "-s -w"

go_build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver "$k8s_version" --version -- \
    -tags "$k8s_tags" -ldflags "-s -w $k8s_ldflags"

go_build helm helm helm.sh/helm/v4/cmd/helm "$helm_version" version --short -- \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"

# kubectl: the machine's own when it has one (any release within the usual version skew works
# for the tests), otherwise built from the same Kubernetes release.
machine_kubectl="$(command -v kubectl || true)"
if [[ -x "$bin_dir/kubectl" && -L "$bin_dir/kubectl" ]]; then
    echo "control-plane: kubectl is the machine's ($(readlink "$bin_dir/kubectl"))"
elif [[ ! -e "$bin_dir/kubectl" && -n "$machine_kubectl" ]]; then
    ln -sfn "$machine_kubectl" "$bin_dir/kubectl"
    echo "control-plane: using the machine's kubectl ($machine_kubectl)"
else
    rm -f "$bin_dir/kubectl" # a dangling link to a kubectl that has gone
    go_build kubectl kubernetes k8s.io/kubernetes/cmd/kubectl "$k8s_version" version --client -- \
        -tags "$k8s_tags" -ldflags "-s -w $k8s_ldflags"
fi

# The node: the same module, flags and build cache as kube-apiserver, so each adds mostly its own
# packages and a link.
for command in kubelet kube-controller-manager kube-scheduler kube-proxy; do
    go_build "$command" kubernetes "k8s.io/kubernetes/cmd/$command" "$k8s_version" --version -- \
        -tags "$k8s_tags" -ldflags "-s -w $k8s_ldflags"
done

# containerd as its static release is built (Makefile: STATIC=1): no cgo, so no btrfs snapshotter;
# the shim without gRPC, as upstream builds it.
containerd_pkg=github.com/containerd/containerd/v2
containerd_ldflags="-s -w -X $containerd_pkg/version.Version=$containerd_version"
containerd_ldflags+=" -X $containerd_pkg/version.Package=$containerd_pkg"
containerd_tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
go_build containerd containerd "$containerd_pkg/cmd/containerd" "$containerd_version" --version -- \
    -tags "$containerd_tags" -ldflags "$containerd_ldflags"
go_build containerd-shim-runc-v2 containerd "$containerd_pkg/cmd/containerd-shim-runc-v2" \
    "$containerd_version" -v -- -tags "$containerd_tags no_grpc" -ldflags "$containerd_ldflags"
go_build ctr containerd "$containerd_pkg/cmd/ctr" "$containerd_version" --version -- \
    -tags "$containerd_tags" -ldflags "$containerd_ldflags"

echo "control-plane: binaries ready in $bin_dir"

#!/usr/bin/env bash
# Builds kcp's servers (kcp, kcp-front-proxy, cache-server,
# sharded-test-server) from a kcp source tree or tarball.
#
# kcp v0.29 and later cannot be built from Go module zips alone: their
# go.mod replaces github.com/kcp-dev/{sdk,client-go,...} with ./staging/...
# modules that the zips leave out. A whole source tree has them; every other
# dependency still comes from the Go module proxy.
#
# usage: build.sh SRC VERSION OUT
#   SRC      a kcp source tree, or a .tar.gz of one (git archive of the tag)
#   VERSION  the kcp version SRC holds (e.g. v0.32.3); the binaries are
#            stamped with it, and SRC must be that version
#   OUT      directory to write the four binaries to (created atomically)
set -euo pipefail

src=${1:?usage: build.sh SRC VERSION OUT}
version=${2:?usage: build.sh SRC VERSION OUT}
out=${3:?usage: build.sh SRC VERSION OUT}

missing() {
	cat >&2 <<EOF
ferry: cannot build kcp $version: $1

kcp $version cannot be built from the Go module proxy alone (its go.mod points
at ./staging/... modules that module zips leave out); it is built from kcp's
whole source tree at tag $version. Provide it with KCP_SRC, either
  - a tarball:     make KCP_SRC=/path/to/kcp-$version.tar.gz ...
                   (e.g. git archive --prefix=kcp-$version/ $version | gzip
                   in a clone of github.com/kcp-dev/kcp), or
  - a source tree: make KCP_SRC=/path/to/kcp ...  (a checkout of tag $version).
Or test against the oldest supported kcp only, which builds from modules:
  make test-e2e-compat
EOF
	exit 2
}

[ -e "$src" ] || missing "KCP_SRC ($src) does not exist"

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-kcp-src.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -d "$src" ]; then
	tree=$src
else
	tar -xzf "$src" -C "$work" || missing "KCP_SRC ($src) is neither a directory nor a readable .tar.gz"
	tree=$(dirname "$(find "$work" -maxdepth 2 -name go.mod -print -quit)")
	[ "$tree" != . ] || missing "KCP_SRC ($src) holds no go.mod at its top or one directory down"
fi

module=$(awk '$1 == "module" { print $2; exit }' "$tree/go.mod")
[ "$module" = github.com/kcp-dev/kcp ] || missing "KCP_SRC ($src) is module '$module', not github.com/kcp-dev/kcp"
for d in cmd/kcp cmd/kcp-front-proxy cmd/cache-server cmd/sharded-test-server staging; do
	[ -d "$tree/$d" ] || missing "KCP_SRC ($src) has no $d/ (a module zip, or a tree older than v0.29?)"
done
# A tree of another version would be built and stamped as $version.
if [ -f "$tree/.git/HEAD" ] && command -v git >/dev/null; then
	tag=$(git -C "$tree" describe --tags --exact-match 2>/dev/null || true)
	[ -z "$tag" ] || [ "$tag" = "$version" ] || missing "KCP_SRC ($src) is checked out at $tag"
fi

# The Kubernetes version kcp is built on, for the version stamps (as kcp's
# own Makefile derives it).
kube=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$tree/go.mod")
[[ "$kube" =~ ^v([0-9]+)\.([0-9]+)\. ]] || missing "cannot read the k8s.io/kubernetes version from $src's go.mod (got '$kube')"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
stamp="$kube+kcp-$version"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$stamp -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
done

echo "building kcp $version ($stamp) from $src"
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
# Some checksum look-ups for kcp-dev modules are refused by the sum
# database; the tree's go.sum pins them.
(cd "$tree" && GONOSUMDB=github.com/kcp-dev go build -o "$out.tmp/" -ldflags "$ldflags" \
	./cmd/kcp ./cmd/kcp-front-proxy ./cmd/cache-server ./cmd/sharded-test-server)
rm -rf "$out"
mv "$out.tmp" "$out"
"$out/kcp" --version 2>/dev/null | head -1 || true

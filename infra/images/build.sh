#!/usr/bin/env bash
# shellcheck disable=SC2016 # the single-quoted $... below are for apt's --format and mmdebstrap's hook shells
# Build the FedAT container images with buildah, from a Debian base made by mmdebstrap (no registry, no Docker):
#   fedat-core  numpy only: barrier, aggregator, profiler, `fedat provision`, `fedat keys`
#   fedat-tf    TensorFlow: worker, evaluator, seed; Fashion-MNIST in /usr/share/datasets/fashion-mnist
# Both are tagged localhost/fedat-<image>:<version> (the packages' version, the chart's appVersion) and :latest.
#
#   infra/images/build.sh [core] [tf]     (default: both)
#   EXPORT=1  also write results/images/fedat-<image>-<version>.tar (oci-archive)
#   FORCE=1   rebuild even when the image's inputs are unchanged
#   REFRESH_BASE=1  run mmdebstrap again (the mirror's current packages) instead of reusing the cached base tarball
#   FEDAT_IMAGES_CACHE  cache directory (default ~/.cache/fedat-images): base tarballs, wheels, dependency locks
#   FEDAT_BUILDAH_STORAGE_DRIVER  (default vfs, which works everywhere, also nested)
#
# Needs root (mmdebstrap in root mode, buildah with chroot isolation). Installs buildah and mmdebstrap with apt when
# missing. Reproducible inputs: the base is keyed by suite + mirrors + packages + options and cached as a tarball;
# each image is labelled with the hash of its inputs (Containerfile, these scripts, the package sources, the base,
# the data) and not rebuilt while that hash is unchanged. Every build context lives in a temporary directory.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/infra/images
CACHE=${FEDAT_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedat-images}
STORAGE_DRIVER=${FEDAT_BUILDAH_STORAGE_DRIVER:-vfs}
PIP_VERSION=26.3          # pip that installs inside the build stage (run from its wheel, never installed)
SETUPTOOLS_VERSION=84.2.1 # build backend of the local wheels (pyproject: setuptools>=68)
BASE_PACKAGES=(python3 libstdc++6) # on top of the `essential` variant; manylinux wheels (numpy, TF) need libstdc++
DATA_DIR=/usr/share/datasets/fashion-mnist
DATA_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

say() { printf '[images] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
sha() { sha256sum | cut -c1-"${1:-64}"; }

images=()
for a in "$@"; do
    case "$a" in
        core | tf) images+=("$a") ;;
        all) images+=(core tf) ;;
        -h | --help) sed -n '3,18p' "$0"; exit 0 ;;
        *) die "unknown image '$a' (core, tf)" ;;
    esac
done
[ ${#images[@]} -gt 0 ] || images=(core tf)

[ "$(id -u)" = 0 ] || die "run as root: mmdebstrap (root mode) and buildah (chroot isolation) need it"

# --- tools -----------------------------------------------------------------------------------------------------
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")

PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip: run \`make setup\` first (or set PYTHON)"
# pip, without the host configuration's noise about absent local index folders
pip_() { "$PY" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
HOST_PY=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VERSION=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$REPO/pyproject.toml")
REVISION=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$REPO" status --porcelain 2>/dev/null)" ] || REVISION="$REVISION-dirty"

mkdir -p "$CACHE/base" "$CACHE/wheels" "$CACHE/tools" "$CACHE/locks"
exec 9>"$CACHE/build.lock"
flock 9 # one build at a time per cache (make images and the test may overlap)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fedat-images.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
T0=$(now)

# --- Debian base: mmdebstrap from the host's own suite and mirror -------------------------------------------------
# shellcheck disable=SC1091
SUITE=${FEDAT_DEBIAN_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
# The host's configured Debian repositories of that suite (the only mirror reachable here), one source line each.
mapfile -t SOURCES < <(apt-get indextargets --format '$(TARGET_OF) $(REPO_URI) $(RELEASE) $(COMPONENT)' \
    'Identifier: Packages' | awk -v s="$SUITE" '$1 == "deb" && ($3 == s || index($3, s "-") == 1) {
        k = $2 " " $3; if (!(k in c)) { o[++n] = k; c[k] = $4 } else if (index(" " c[k] " ", " " $4 " ") == 0) c[k] = c[k] " " $4 }
        END { for (i = 1; i <= n; i++) print "deb " o[i] " " c[o[i]] }')
[ ${#SOURCES[@]} -gt 0 ] || die "no Debian '$SUITE' repository configured in apt (apt-get indextargets)"
MM_OPTS=(
    --variant=essential
    --include="$(IFS=,; echo "${BASE_PACKAGES[*]}")"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr # usr-is-merged instead of usrmerge (which pulls in perl)
    --aptopt='Acquire::Check-Valid-Until "false"'     # a snapshot mirror's Release files may be "expired"
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --customize-hook='mkdir -p "$1/usr/share/fedat" && for f in "$1"/var/lib/apt/lists/*_InRelease; do echo "${f##*/}"; grep -E "^(Origin|Suite|Codename|Version|Date):" "$f" | sed "s/^/  /"; done > "$1/usr/share/fedat/debian-release.txt"'
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}=\${Version}\n" > "$1/usr/share/fedat/debian-packages.txt"'
    --customize-hook='cat "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/* > "$1/usr/share/fedat/debian-sources.list" 2>/dev/null || true'
    # Not the build host's name and resolver; the runtime mounts its own over these (they must exist as mountpoints
    # when the root filesystem is read-only).
    --customize-hook='printf "localhost\n" > "$1/etc/hostname" && : > "$1/etc/resolv.conf" && printf "127.0.0.1\tlocalhost\n::1\tlocalhost\n" > "$1/etc/hosts"'
)
BASE_KEY=$(printf '%s\n' "$SUITE" "${SOURCES[@]}" "${MM_OPTS[@]}" "$(mmdebstrap --version)" | sha 16)
BASE_TAR=$CACHE/base/debian-$SUITE-$BASE_KEY.tar
if [ ! -s "$BASE_TAR" ] || [ ! -s "$BASE_TAR.sha256" ] || [ "${REFRESH_BASE:-0}" = 1 ]; then
    t=$(now)
    say "base: mmdebstrap $SUITE (${BASE_PACKAGES[*]}) from ${SOURCES[*]}"
    # SOURCE_DATE_EPOCH: file times clamped, so that the same packages give the same tarball (and the images stay)
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800} \
        mmdebstrap "${MM_OPTS[@]}" "$SUITE" "$TMP/rootfs.tar" "${SOURCES[@]}" > "$TMP/mmdebstrap.log" 2>&1 ||
        { tail -40 "$TMP/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
    sha < "$TMP/rootfs.tar" > "$TMP/rootfs.tar.sha256"
    mv "$TMP/rootfs.tar" "$BASE_TAR.part" && mv "$BASE_TAR.part" "$BASE_TAR" && mv "$TMP/rootfs.tar.sha256" "$BASE_TAR.sha256"
    say "base: $BASE_TAR made in $(since "$t")"
else
    say "base: cached $BASE_TAR"
fi
BASE_RELEASE=$(tar -xOf "$BASE_TAR" ./usr/share/fedat/debian-release.txt | awk '
    /_InRelease$/ { r = $0; sub(/_InRelease$/, "", r); n = split(r, p, "_"); s = p[n] } $1 == "Date:" { $1 = ""; out = out sep s ":" $0; sep = ";" }
    END { print out }')
BASE_PY=$(tar -tvf "$BASE_TAR" ./usr/bin/python3 | sed -n 's/.*-> python\([0-9.]*\)$/\1/p')
[ "$BASE_PY" = "$HOST_PY" ] ||
    die "the base's Python is $BASE_PY but $PY is $HOST_PY: wheels are resolved for the host's Python; use a $SUITE host"
# Tagged by the tarball's content: a refreshed base (REFRESH_BASE=1, newer Debian updates) makes new images.
BASE_IMAGE=localhost/fedat-base:$SUITE-$(cut -c1-16 "$BASE_TAR.sha256")
if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    t=$(now)
    mkdir "$TMP/base-ctx"
    ln "$BASE_TAR" "$TMP/base-ctx/rootfs.tar" 2>/dev/null || cp "$BASE_TAR" "$TMP/base-ctx/rootfs.tar"
    "${BUILDAH[@]}" bud --quiet --isolation chroot --pull=never -f "$HERE/Containerfile.base" \
        --label org.opencontainers.image.title=fedat-base --label io.fedat.debian.suite="$SUITE" \
        --label io.fedat.debian.release="$BASE_RELEASE" -t "$BASE_IMAGE" "$TMP/base-ctx" >/dev/null
    rm -rf "$TMP/base-ctx"
    say "base: image $BASE_IMAGE in $(since "$t")"
fi

# --- build tools: pinned pip and setuptools wheels, cached (wheel builds and installs then need no network) -----------
for spec in "pip==$PIP_VERSION" "setuptools==$SETUPTOOLS_VERSION"; do
    f="${spec%%==*}-${spec##*==}-py3-none-any.whl"
    [ -s "$CACHE/tools/$f" ] || pip_ download --quiet --no-deps --only-binary=:all: -d "$CACHE/tools" "$spec"
    [ -s "$CACHE/tools/$f" ] || die "could not get $f"
done

# A built image must import every role's code as UID 10001 (a missing shared library fails here, not in a pod).
SMOKE_CORE='import fedat.cli, fedat_aggregator.barrier_main, fedat_aggregator.aggregator_main, fedat_profiler.main
import fedat_aggregator.collector_main
import fedat.deploy.upgrade_check, fedat.deploy.release_test
print("imports ok")'
SMOKE_TF='import fedat.cli, fedat_worker.worker_main, fedat_worker.evaluator_main, fedat_worker.seed_main
import fedat_worker.client_main
import tensorflow as tf
from fedat_worker.datasets import load_fashion_mnist
d = load_fashion_mnist()
print("imports ok: tensorflow", tf.__version__, "fashion-mnist", d.x_train.shape, d.x_test.shape)'
smoke() {
    local img=$1 name=$2 ctr code rc=0
    case $img in core) code=$SMOKE_CORE ;; tf) code=$SMOKE_TF ;; esac
    ctr=$("${BUILDAH[@]}" from --pull-never --quiet "$name")
    "${BUILDAH[@]}" run --isolation chroot "$ctr" -- python -c "$code" >&2 || rc=$?
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
    if [ $rc != 0 ]; then
        "${BUILDAH[@]}" rmi "$name" >/dev/null 2>&1 || true
        die "$img: the new image does not import its own code (exit $rc); not tagged"
    fi
}

# --- one image ----------------------------------------------------------------------------------------------------
build_image() {
    local img=$1 t
    local name=localhost/fedat-$img ctx=$TMP/$img
    local -a pkgs roles
    case $img in
        core)
            pkgs=(. services/aggregator services/profiler)
            roles=(barrier aggregator profiler collector provision keys upgrade-check release-test)
            TITLE=fedat-core
            DESCRIPTION="FedAT tier barrier, global aggregator, profiler, collector and broker provisioning (numpy only)"
            ;;
        tf)
            pkgs=(. services/worker)
            roles=(worker evaluator seed client)
            TITLE=fedat-tf
            DESCRIPTION="FedAT worker, evaluator, seed and real client (TensorFlow CPU), with Fashion-MNIST"
            ;;
    esac
    local t_img
    t_img=$(now)
    mkdir -p "$ctx/src" "$ctx/wheels" "$ctx/tools" "$ctx/data"

    # Sources: a clean copy (no egg-info, caches or build dirs), so that building wheels never writes into the repo.
    local p dest
    local -a parts
    for p in "${pkgs[@]}"; do
        if [ "$p" = . ]; then
            dest=$ctx/src/fedat parts=(pyproject.toml src)
        else
            dest=$ctx/src/${p##*/} parts=(pyproject.toml "fedat_${p##*/}")
        fi
        mkdir -p "$dest"
        tar -C "$REPO/$p" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude=build \
            --exclude=dist -cf - "${parts[@]}" | tar -C "$dest" -xf -
    done
    if [ "$img" = tf ]; then
        "$REPO/infra/ensure-data.sh"
        for p in "${DATA_FILES[@]}"; do cp "$DATA_DIR/$p" "$ctx/data/"; done
    fi
    install -m 0755 "$HERE/fedat-entrypoint" "$ctx/fedat-entrypoint"
    echo "${roles[*]}" > "$ctx/roles"

    # The input hash: everything that goes into the image except the resolved third-party wheels, which follow from
    # the pins in the pyproject files (hashed with the sources) and are recorded in the image (requirements.lock).
    local input_hash
    input_hash=$( (
        cd "$ctx" && find src data fedat-entrypoint roles -type f -print0 | sort -z | xargs -0 sha256sum
        cd "$HERE" && sha256sum Containerfile Containerfile.base build.sh
        echo "$img $BASE_IMAGE pip==$PIP_VERSION setuptools==$SETUPTOOLS_VERSION $STORAGE_DRIVER"
    ) | sha 24)
    local old_id old_hash
    old_id=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$name:$VERSION" 2>/dev/null || true)
    old_hash=$("${BUILDAH[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "io.fedat.input-hash"}}' \
        "$name:$VERSION" 2>/dev/null || true)
    if [ "$old_hash" = "$input_hash" ] && [ "${FORCE:-0}" != 1 ]; then
        say "$img: $name:$VERSION is up to date (inputs $input_hash)"
        "${BUILDAH[@]}" tag "$name:$VERSION" "$name:latest"
        return
    fi

    # Wheels of the local packages, built offline with the pinned setuptools.
    t=$(now)
    pip_ wheel --quiet --no-deps --no-index --find-links "$CACHE/tools" -w "$ctx/wheels" "$ctx"/src/*
    say "$img: local wheels in $(since "$t"): $(cd "$ctx/wheels" && echo *.whl)"

    # Their dependencies: resolved once per set of pins (pip's report), downloaded once into the cache, checked.
    t=$(now)
    local dep_key lock
    dep_key=$( (cat "$ctx"/src/*/pyproject.toml; echo "$img $HOST_PY $PIP_VERSION") | sha 16)
    lock=$CACHE/locks/$img-$dep_key.txt
    if [ ! -s "$lock" ]; then
        say "$img: resolving the pinned dependencies (PyPI)"
        pip_ install --quiet --dry-run --ignore-installed --only-binary=:all: --report "$TMP/$img-report.json" \
            "$ctx"/wheels/*.whl
        "$PY" - "$TMP/$img-report.json" "$ctx/wheels" > "$lock.part" <<'EOF'
import json, sys, urllib.parse
report, local = json.load(open(sys.argv[1])), sys.argv[2]
for item in report["install"]:
    info, meta = item["download_info"], item["metadata"]
    url = urllib.parse.urlparse(info["url"])
    if url.scheme == "file" and urllib.parse.unquote(url.path).startswith(local + "/"):
        continue  # one of ours
    filename = urllib.parse.unquote(url.path.rsplit("/", 1)[-1])
    sha = info.get("archive_info", {}).get("hashes", {}).get("sha256") or info.get("archive_info", {}).get("hash", "=").split("=", 1)[1]
    print(f"{meta['name']}=={meta['version']} {filename} {sha}")
EOF
        mv "$lock.part" "$lock"
    fi
    local spec file want missing_specs=()
    while read -r spec file want; do
        [ -s "$CACHE/wheels/$file" ] || missing_specs+=("$spec")
    done < "$lock"
    if [ ${#missing_specs[@]} -gt 0 ]; then
        say "$img: downloading ${#missing_specs[@]} wheels (PyPI) into $CACHE/wheels"
        pip_ download --quiet --no-deps --only-binary=:all: -d "$CACHE/wheels" "${missing_specs[@]}"
    fi
    while read -r spec file want; do
        [ -s "$CACHE/wheels/$file" ] || die "$spec: $file not downloaded"
        if [ -n "$want" ] && [ "$(sha < "$CACHE/wheels/$file")" != "$want" ]; then
            rm -f "$CACHE/wheels/$file"
            die "$spec: $file does not match the sha256 pip resolved ($want); removed, run again"
        fi
        ln "$CACHE/wheels/$file" "$ctx/wheels/$file" 2>/dev/null || cp "$CACHE/wheels/$file" "$ctx/wheels/$file"
    done < "$lock"
    cp "$CACHE/tools/pip-$PIP_VERSION-py3-none-any.whl" "$ctx/tools/pip.whl"
    {
        for file in "$ctx"/wheels/fedat*.whl; do
            file=${file##*/}
            echo "${file%%-*}==$(echo "$file" | cut -d- -f2)" | tr _ -
        done
        cut -d' ' -f1 "$lock"
    } > "$ctx/requirements.lock"
    say "$img: $(wc -l < "$ctx/requirements.lock") pinned packages ready in $(since "$t")"

    t=$(now)
    "${BUILDAH[@]}" bud --quiet --isolation chroot --pull=never --layers=false -f "$HERE/Containerfile" \
        --build-arg BASE="$BASE_IMAGE" --build-arg IMAGE="$img" --build-arg TITLE="$TITLE" \
        --build-arg DESCRIPTION="$DESCRIPTION" --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
        --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" --build-arg INPUT_HASH="$input_hash" \
        --build-arg BASE_SUITE="$SUITE" --build-arg BASE_RELEASE="$BASE_RELEASE" \
        --build-arg BASE_MIRROR="$(IFS=';'; echo "${SOURCES[*]}")" \
        --label io.fedat.requirements="$(paste -sd' ' "$ctx/requirements.lock")" \
        --label io.fedat.roles="${roles[*]}" \
        -t "$name:candidate" "$ctx" >/dev/null
    say "$img: buildah bud in $(since "$t")"
    t=$(now)
    smoke "$img" "$name:candidate" # a failure leaves the previous image in place
    "${BUILDAH[@]}" tag "$name:candidate" "$name:$VERSION" "$name:latest"
    "${BUILDAH[@]}" rmi "$name:candidate" >/dev/null # only the tag: the image keeps the other two
    say "$img: smoke test in $(since "$t")"
    local new_id
    new_id=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$name:$VERSION")
    if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
        "${BUILDAH[@]}" rmi "$old_id" >/dev/null 2>&1 || true # the image this one replaces, now untagged
    fi
    say "$img: $name:$VERSION built in $(since "$t_img") (inputs $input_hash)"
}

for img in "${images[@]}"; do build_image "$img"; done
# Bases of earlier keys (another suite, package list or mirror): removed unless an image still uses them.
for old in $("${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | awk -v keep="$BASE_IMAGE" \
    'index($0, "localhost/fedat-base:") == 1 && $0 != keep'); do
    "${BUILDAH[@]}" rmi "$old" >/dev/null 2>&1 && say "removed the stale base $old" || true
done

if [ "${EXPORT:-0}" = 1 ]; then
    mkdir -p "$REPO/results/images"
    for img in "${images[@]}"; do
        t=$(now)
        out=$REPO/results/images/fedat-$img-$VERSION.tar
        rm -f "$out"
        "${BUILDAH[@]}" push --quiet "localhost/fedat-$img:$VERSION" "oci-archive:$out:fedat-$img:$VERSION"
        say "exported $out ($(du -h "$out" | cut -f1)) in $(since "$t")"
    done
fi

say "done in $(since "$T0")"
"${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}  {{.Size}}  {{.ID}}  {{.CreatedAt}}' |
    awk 'index($1, "localhost/fedat-") == 1' >&2

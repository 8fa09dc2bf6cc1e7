#!/usr/bin/env bash
# shellcheck disable=SC2329 # cleanup and stop run from traps
# Run a command in a FedAT image roughly as Kubernetes runs it (values.yaml: containerSecurityContext): as the
# image's USER (10001), with a read-only root filesystem and only /tmp (and /run) writable tmpfs, on the host network.
#
#   infra/images/run-readonly.sh [--name NAME] IMAGE [buildah-run options, e.g. -e K=V] -- COMMAND [ARGS...]
#   e.g. infra/images/run-readonly.sh localhost/fedat-core:0.1.0 -e FEDAT_SIGNING=off -- fedat-entrypoint aggregator
#
# buildah 1.28 has no `run --read-only`, so: a working container of IMAGE, and in a private mount namespace its root
# bind-mounted onto itself read-only, tmpfs on /tmp and /run (buildah writes /run/.containerenv; podman --read-only
# mounts the same two), /etc/{hosts,resolv.conf,hostname} left writable only as buildah's mountpoints; then
# `buildah run --isolation chroot` there (chroot isolation: host network and PID namespace). SIGTERM/SIGINT to this
# script are passed to the container's processes (buildah itself would SIGKILL them); exits with the command's status;
# the working container is removed whatever happens. Needs root.
set -euo pipefail
STORAGE_DRIVER=${FEDAT_BUILDAH_STORAGE_DRIVER:-vfs}
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")

name=
if [ "${1:-}" = --name ]; then name=$2; shift 2; fi
[ $# -ge 3 ] || { sed -n '3,7p' "$0" >&2; exit 2; }
image=$1
shift
opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
[ "${1:-}" = -- ] || { echo "run-readonly.sh: missing -- before the command" >&2; exit 2; }
shift
[ "$(id -u)" = 0 ] || { echo "run-readonly.sh: needs root (mount namespace, buildah)" >&2; exit 2; }

ctr=$("${BUILDAH[@]}" from --pull-never --quiet ${name:+--name "$name"} "$image")
child=
cleanup() {
    [ -z "$child" ] || kill -KILL "$child" 2>/dev/null || true
    "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
root=$("${BUILDAH[@]}" mount "$ctr")

# The processes inside: descendants of buildah that are not buildah's own helpers (argv[0] buildah-chroot-runtime,
# buildah-chroot-exec: they run from a memfd copy of its binary, so only their argv[0] says what they are).
inside() {
    ps -e -o pid=,ppid=,args= | awk -v top="$1" '
        { parent[$1] = $2; argv0[$1] = $3 }
        END { for (p in parent) { q = p; while ((q in parent) && q != top && q > 1) q = parent[q]
              if (q == top && p != top && argv0[p] !~ /^buildah/) print p } }'
}
stop() {
    local p
    for p in $(inside "$child"); do kill -TERM "$p" 2>/dev/null || true; done
}
trap stop TERM INT

# shellcheck disable=SC2016
unshare --mount --propagation private -- sh -ec '
    root=$1; shift
    mount --bind "$root" "$root"
    for f in etc/hosts etc/resolv.conf etc/hostname; do
        [ -e "$root/$f" ] && mount --bind "$root/$f" "$root/$f"
    done
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
    mount -o remount,bind,ro "$root"
    exec "$@"
' run-readonly "$root" "${BUILDAH[@]}" run --isolation chroot "${opts[@]}" "$ctr" -- "$@" &
child=$!
rc=0
while :; do
    wait "$child" && rc=0 || rc=$?
    # wait returns >128 when a trapped signal interrupted it; the child may still be running.
    kill -0 "$child" 2>/dev/null || break
done
child=
exit "$rc"

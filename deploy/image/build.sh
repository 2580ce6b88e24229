#!/usr/bin/env bash
# Builds a stage of the Dockerfile with whichever builder is here: docker (with a running daemon),
# podman, or buildah (daemonless, as root: --isolation chroot).
#
#   deploy/image/build.sh TAG [TARGET] [--build-arg NAME=VALUE ...]     (TARGET: runtime by default)
set -euo pipefail

tag=$1
target=${2:-runtime}
shift $(($# < 2 ? $# : 2))
cd "$(dirname "$0")/../.."

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    exec docker build --target "$target" -t "$tag" "$@" .
elif command -v podman >/dev/null && podman info >/dev/null 2>&1 && [ "$(id -u)" != 0 ]; then
    exec podman build --format docker --layers --target "$target" -t "$tag" "$@" .
elif command -v buildah >/dev/null; then
    exec buildah bud --isolation chroot --format docker --layers --target "$target" -t "$tag" "$@" .
fi
echo "no image builder here: install docker (with its daemon), podman or buildah" >&2
exit 2

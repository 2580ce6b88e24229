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

# buildah (and podman, built on it) without layer caching: buildah 1.28 does not mount a cached stage for
# `RUN --mount=type=bind,from=STAGE`, so a build whose wheel stage is cached but whose install is not fails
# ("couldn't find .../wheels on host to bind mount"), e.g. the loadgen image right after the runtime image.
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    exec docker build --target "$target" -t "$tag" "$@" .
elif command -v podman >/dev/null && podman info >/dev/null 2>&1 && [ "$(id -u)" != 0 ]; then
    exec podman build --format docker --layers=false --target "$target" -t "$tag" "$@" .
elif command -v buildah >/dev/null; then
    exec buildah bud --isolation chroot --format docker --target "$target" -t "$tag" "$@" .
fi
echo "no image builder here: install docker (with its daemon), podman or buildah" >&2
exit 2

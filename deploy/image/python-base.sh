#!/usr/bin/env bash
# A local Python 3.11 base image from Debian bookworm's packages, for building the service's image
# where no registry is reachable (python:3.11-slim is what real builds use). Needs root, debootstrap
# and buildah; the image gets `python` and `pip` on PATH (a venv at /opt/python) as python:3.11-slim has.
#
#   sudo deploy/image/python-base.sh [TAG]      (default: localhost/python:3.11-bookworm)
set -euo pipefail

tag=${1:-localhost/python:3.11-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror"
chroot "$root" python3 -m venv /opt/python
chroot "$root" ln -s /opt/python/bin/python /usr/local/bin/python
# The host's trust store, so that pip in the build reaches its index through whatever the host's TLS
# goes through (a proxy with its own CA, say); pip is told to use it rather than its own bundle.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root"/etc/ssl/certs/ca-certificates.crt
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin

container=$(buildah from scratch)
mount=$(buildah mount "$container")
tar -C "$root" -c . | tar -C "$mount" -x
buildah umount "$container" >/dev/null
buildah config --env PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --cmd python "$container"
buildah commit --rm "$container" "$tag" >/dev/null
echo "$tag"

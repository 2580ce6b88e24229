#!/usr/bin/env bash
# A local package index of torch's CPU wheel and what it needs, for building the image where
# download.pytorch.org is not reachable. The wheels come from pip's own configuration (a local
# folder in `find-links`, say); the index is served on loopback until this script is stopped:
#
#   deploy/image/torch-index.sh [DIR] [PORT]    then build with TORCH_INDEX_URL=http://127.0.0.1:PORT/simple
set -euo pipefail

dir=${1:-build/torch-index}
port=${2:-8765}
python=${PYTHON:-python3}
mkdir -p "$dir/wheels"
"$python" -m pip download -q --only-binary=:all: --dest "$dir/wheels" torch==2.13.0
"$python" - "$dir" <<'PY'
import re, sys
from pathlib import Path

root = Path(sys.argv[1])
for wheel in (root / "wheels").glob("*.whl"):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()  # PEP 503 normalized project name
    project = root / "simple" / name
    project.mkdir(parents=True, exist_ok=True)
    link = project / wheel.name
    if not link.exists():
        link.symlink_to(wheel.resolve())
PY
exec "$python" -m http.server --bind 127.0.0.1 --directory "$dir" "$port"

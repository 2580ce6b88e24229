"""``python -m server [--model DIR] [--port N] [--metrics-port N] ...``; see ``--help``.

With no arguments it serves the default model on port 50051 with metrics on
9464, exporting it first if needed (in a subprocess: the server never imports torch).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

from export.manifest import MANIFEST_FILE, ModelFolderError
from server.app import serve
from server.config import DEFAULT_MODEL_DIR, parse_config


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_config(argv)
    if config.model == DEFAULT_MODEL_DIR and not (config.model / MANIFEST_FILE).exists():
        logging.info("exporting the default model to %s", config.model)
        subprocess.run([sys.executable, "-m", "export", "--out", str(config.model), "--int8"], check=True)
    try:
        asyncio.run(serve(config))
    except (ModelFolderError, OSError) as error:
        print(f"server: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

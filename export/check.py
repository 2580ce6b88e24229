"""Re-run the parity checks on an exported folder: ``python -m export.check --model DIR [--checkpoint DIR]``.

Verifies every file against the manifest, then compares each variant's graphs
with the PyTorch checkpoint it was exported from. Exits 1 if fp32 parity fails.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import flags
from common.corpus import read_lines
from common.flags import setting
from export.pipeline import CHECK_SENTENCES, variant_parity
from model.checkpoint import WEIGHTS_FILE, load_checkpoint
from runtime.manifest import ModelFolderError, read_manifest, sha256


@dataclass(frozen=True)
class ParityCheck:
    model: Path = setting(help="exported model folder")
    checkpoint: Path | None = setting(None, "PyTorch checkpoint (default: the one in the manifest)")


def check(model_dir: Path, checkpoint: Path | None = None) -> dict[str, dict]:
    manifest = read_manifest(model_dir)
    checkpoint = checkpoint or Path(manifest["checkpoint"]["path"])
    if sha256(checkpoint / WEIGHTS_FILE) != manifest["checkpoint"]["weights_sha256"]:
        raise ModelFolderError(f"{checkpoint / WEIGHTS_FILE} is not the checkpoint {model_dir} was exported from")
    model, tokenizer = load_checkpoint(checkpoint)
    real_sources = tokenizer.encode_source(read_lines(CHECK_SENTENCES))
    return {name: variant_parity(model, model_dir, name, real_sources) for name in manifest["variants"]}


def main(argv: Sequence[str] | None = None) -> int:
    args = flags.command(ParityCheck, argv, "python -m export.check", __doc__)
    try:
        results = check(args.model, args.checkpoint)
    except Exception as e:  # the export pipeline's own errors carry the message to show
        print(f"export.check: {e}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2))
    return 0 if results["fp32"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Export a checkpoint for serving: ``python -m export [--checkpoint DIR] --out DIR [--int8] [--fp16]``.

``--format onnx`` (the default) runs the pipeline of export/pipeline.py: load and validate the checkpoint,
write the encoder, decoder-step and aligner graphs of each variant, check them against PyTorch, describe
the folder in its manifest and measure each variant. A model that fails parity is not written.

``--format marian`` writes a Hugging Face MarianMT folder instead (export/marian.py), by default in
OPUS-MT's layout, which CTranslate2's converter accepts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from common import flags
from common.corpus import read_lines
from export.marian import export_marian
from export.pipeline import CHECK_SENTENCES, ExportConfig, ExportError, export, validate
from model.marian import MarianError


def parse_args(argv: Sequence[str] | None) -> ExportConfig:
    return flags.command(ExportConfig, argv, "python -m export", __doc__)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        if cfg.format == "marian":
            validate(cfg)
            out = export_marian(cfg.checkpoint, cfg.out, read_lines(CHECK_SENTENCES), cfg.marian_layout)
        else:
            out = export(cfg)
    except (ExportError, MarianError) as e:
        print(f"export: {e}", file=sys.stderr)
        return 1
    print(f"exported {cfg.checkpoint} to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One-node graphs over a self-attention cache buffer (rows, heads, slots, d), run on the decoder's own
device so that a device-resident cache never visits the host (runtime.device_cache.DeviceKVCache):

- ``gather``: y = Gather(x, rows) along rows (beam reordering, sources leaving);
- ``pad``:    y = Pad(x, pads) with zeros (more rows or slots);
- ``copy_rows``: y = ScatterND(target, targets, Pad(Gather(x, rows), pads)), run with y bound to target's own
  buffer, so rows of x (zero-padded to target's slots) overwrite rows of target in place: a bucket's sources
  joining, beams reordering within it, and rows moving to another bucket (runtime.slotted_rows.SlottedRows). The
  rows are gathered before any is written, so x may be target itself.

They ship as files in runtime/cache_ops/ (the server has no ``onnx`` package to build them);
``python -m export.cache_ops`` writes them there, and a test checks the files against this builder.
"""

from __future__ import annotations

import sys

import numpy as np

from runtime.device_cache import CACHE_OPS, cache_op_path

OPS = {"gather": ("Gather", "rows"), "pad": ("Pad", "pads"), "copy_rows": ("ScatterND", "targets")}
DTYPES = (np.float32, np.float16)


def build(op: str, dtype: type) -> bytes:
    from onnx import TensorProto, helper

    from export.builder import IR_VERSION, OPSET

    op_type, index = OPS[op]
    f = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [
        helper.make_tensor_value_info("x", f, ["rows", "heads", "slots", "d"]),
        helper.make_tensor_value_info(index, TensorProto.INT64, ["n"]),
    ]
    if op == "copy_rows":
        inputs[1:] = [
            helper.make_tensor_value_info("target", f, ["target_rows", "heads", "target_slots", "d"]),
            helper.make_tensor_value_info("rows", TensorProto.INT64, ["n"]),
            helper.make_tensor_value_info("targets", TensorProto.INT64, ["n", 1]),
            helper.make_tensor_value_info("pads", TensorProto.INT64, [8]),
        ]
        nodes = [
            helper.make_node("Gather", ["x", "rows"], ["taken"], axis=0),
            helper.make_node("Pad", ["taken", "pads"], ["padded"]),
            helper.make_node("ScatterND", ["target", "targets", "padded"], ["y"]),
        ]
    else:
        nodes = [helper.make_node(op_type, ["x", index], ["y"], **({"axis": 0} if op_type == "Gather" else {}))]
    graph = helper.make_graph(nodes, op, inputs, [helper.make_tensor_value_info("y", f, None)])
    opsets = [helper.make_opsetid("", OPSET)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="translation-service")
    return model.SerializeToString()


def main() -> int:
    CACHE_OPS.mkdir(exist_ok=True)
    for op in OPS:
        for dtype in DTYPES:
            cache_op_path(op, dtype).write_bytes(build(op, dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())

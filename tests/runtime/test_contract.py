"""The decoder step's contract (runtime/contract.py): every variant of an exported step declares exactly the
table's inputs and outputs, in its order, with its dtypes and axes; per-layer names and the host arrays a step
writes into follow the table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from runtime.contract import (
    CACHE_SHAPE,
    CROSS_SHAPE,
    HOST_FEEDS,
    ROW_OUTPUTS,
    SOURCE_OUTPUTS,
    STEP_FEEDS,
    STEP_INPUTS,
    layer_names,
    output_arrays,
    present_names,
)
from runtime.manifest import read_manifest
from runtime.model_config import ModelConfig

FLOAT_TYPES = {"fp32": np.float32, "int8": np.float32, "fp16": np.float16}  # the float type of each variant's step


def declared(values) -> list[tuple[str, int, list[str | int]]]:  # noqa: ANN001 (a graph's inputs or outputs)
    """Each value's name, element type and axes (a name, or a size)."""
    return [
        (v.name, v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
        for v in values
    ]


@pytest.mark.parametrize("variant", FLOAT_TYPES)
def test_every_variants_step_declares_the_contracts_tensors(tiny_export: Path, variant: str):
    manifest = read_manifest(tiny_export)
    config = ModelConfig.from_dict(manifest["model_config"])
    sizes = {"heads": config.n_heads, "d_head": config.d_head, "d_cache": -(-config.d_head // 8) * 8}

    def expected(name: str, dtype: type | None, shape: tuple[str | int, ...]) -> tuple[str, int, list[str | int]]:
        element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype or FLOAT_TYPES[variant]))
        return name, element, [sizes.get(axis, axis) for axis in shape]

    layers = config.n_decoder_layers
    graph = onnx.load(str(tiny_export / manifest["variants"][variant]["decoder"]), load_external_data=False).graph
    assert declared(graph.input) == [expected(t.name, t.dtype, t.shape) for t in STEP_FEEDS] + [
        expected(name, None, CACHE_SHAPE) for name in layer_names("past", layers)
    ] + [expected(name, None, CROSS_SHAPE) for name in layer_names("cross", layers)]
    assert declared(graph.output) == [expected(t.name, t.dtype, t.shape) for t in ROW_OUTPUTS + SOURCE_OUTPUTS] + [
        expected(name, None, CACHE_SHAPE) for name in layer_names("present", layers)
    ]


def test_layer_names_go_layer_by_layer_keys_before_values():
    assert layer_names("past", 2) == ["past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    assert {tensor.name for tensor in STEP_FEEDS} == STEP_INPUTS and set(HOST_FEEDS) <= STEP_INPUTS


def test_a_k_step_graphs_last_copy_has_the_steps_present_names():
    copies = present_names(layers=1, k=3)
    assert copies == [
        ["present_key_0@0", "present_value_0@0"],
        ["present_key_0@1", "present_value_0@1"],
        ["present_key_0", "present_value_0"],
    ]
    assert present_names(layers=2, k=1) == [layer_names("present", 2)]


def test_output_arrays_are_the_row_then_source_outputs_at_the_steps_sizes():
    arrays = output_arrays(rows=5, sources=2, k=4)
    tensors = ROW_OUTPUTS + SOURCE_OUTPUTS
    assert [array.shape for array in arrays] == [(5, 4), (5, 4), (5, 1), (2, 4), (2, 4), (2, 4)]
    assert [array.dtype for array in arrays] == [np.dtype(tensor.dtype) for tensor in tensors]

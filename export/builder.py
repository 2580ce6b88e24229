"""Writing ONNX graphs node by node from a model's weights: the pieces the encoder and the
decoder-step graphs share (see export/encoder.py and export/decoder_step.py).

Linear layers are MatMul (+ Add) with the weight stored transposed (D_in, D_out), which is what
dynamic int8 quantization rewrites; residual blocks are Add + LayerNormalization; positions are a table.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from model.positional import sinusoidal_encoding
from runtime.model_config import ModelConfig

OPSET = 17
# The IR version opset 17 needs. onnx writes its own latest by default (14 with onnx 1.23), which an older
# onnxruntime refuses to load ("Unsupported model IR version: 14, max supported IR version: 13" from
# onnxruntime-gpu 1.31), so the graphs name the oldest that holds them.
IR_VERSION = 8
MS_DOMAIN = "com.microsoft"
# Positions the tables cover: the longest source and output the engine allows (the server's limits are lower).
MAX_POSITIONS = 4096
ACTIVATION_OPS = {"relu": "Relu", "gelu": "Gelu"}  # swish is x · sigmoid(x), two nodes


def position_table(c: ModelConfig) -> np.ndarray:
    """Sinusoidal encodings of positions 0..MAX_POSITIONS-1 (MAX_POSITIONS, D), computed in float32."""
    return sinusoidal_encoding(torch.arange(MAX_POSITIONS), c.d_model, c.positions).numpy()


class GraphBuilder:
    """Collects nodes and initializers; names are unique by construction."""

    def __init__(self, dtype: type[np.floating]) -> None:
        self.dtype = dtype  # of the weights and states; the log-probabilities are always float32
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def constant(self, name: str, value: np.ndarray) -> str:
        if value.dtype == np.float32:
            value = value.astype(self.dtype)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attrs) -> list[str]:
        """One node; ``outputs`` is a count of fresh names or the names themselves."""
        self._count += 1
        names = (
            outputs if isinstance(outputs, list) else [f"{op_type.lower()}_{self._count}_{k}" for k in range(outputs)]
        )
        node = helper.make_node(op_type, inputs, names, name=f"{op_type}_{self._count}", domain=domain, **attrs)
        self.nodes.append(node)
        return names

    def one(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def linear(self, x: str, layer: torch.nn.Linear, name: str, in_order: np.ndarray | None = None) -> str:
        """x · Wᵀ + b with W stored transposed (D_in, D_out), as dynamic int8 quantization wants MatMul."""
        weight = layer.weight.detach().float().numpy().T
        if in_order is not None:  # input features padded: zero rows where the padding is
            padded = np.zeros((len(in_order), weight.shape[1]), np.float32)
            padded[in_order >= 0] = weight[in_order[in_order >= 0]]
            weight = padded
        y = self.one("MatMul", [x, self.constant(f"{name}.weight", weight)])
        if layer.bias is None:
            return y
        return self.one("Add", [y, self.constant(f"{name}.bias", layer.bias.detach().float().numpy())])


def feed_forward(b: GraphBuilder, h: str, ffn: torch.nn.Module, activation: str, name: str) -> str:
    hidden = b.linear(h, ffn.fc1, f"{name}.fc1")
    if activation == "swish":
        hidden = b.one("Mul", [hidden, b.one("Sigmoid", [hidden])])
    else:
        domain = MS_DOMAIN if activation == "gelu" else ""
        hidden = b.one(ACTIVATION_OPS[activation], [hidden], domain=domain)
    return b.linear(hidden, ffn.fc2, f"{name}.fc2")


def layer_norm(b: GraphBuilder, x: str, norm: torch.nn.LayerNorm, name: str) -> str:
    gamma = b.constant(f"{name}.weight", norm.weight.detach().float().numpy())
    beta = b.constant(f"{name}.bias", norm.bias.detach().float().numpy())
    return b.one("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=norm.eps)


def residual(b: GraphBuilder, x: str, block, name: str, sublayer) -> str:
    """Post-norm LayerNorm(x + Sublayer(x)); pre-norm x + Sublayer(LN(x)).

    Add + LayerNormalization, not ONNX Runtime's fused SkipLayerNormalization: on the CPU the fused
    operator is 3-4x slower than the two (2-core AVX-512 machine, ORT 1.32: 437 against 98 µs for
    32 x 20 x 256, 37.5 against 11.4 µs for one decoder step of 32 rows), so CPU sessions are made with
    SkipLayerNormFusion disabled (runtime.providers.NO_FUSIONS; CUDA's keep it, where it is faster)."""
    if block.pre_norm:
        return b.one("Add", [x, sublayer(layer_norm(b, x, block.norm, f"{name}.norm"))])
    return layer_norm(b, b.one("Add", [sublayer(x), x]), block.norm, f"{name}.norm")

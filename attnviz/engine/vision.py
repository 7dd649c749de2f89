"""A vision transformer's attention over one picture (engine/pictures.py prepares it): run once with eager
attention, α wrapped in a Capture whose tokens are [CLS] (and any register tokens) and the patches by grid
position, p(row,col), with the picture kept beside α; and the position embeddings the model adds to the
patches of that grid.

DINOv2 reads any size (it interpolates its position table); ViT, DeiT and CLIP/SigLIP vision models are run
with `interpolate_pos_encoding`, so each sees the whole picture at its own proportions.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from attnviz.data import picture as images
from attnviz.data.capture import Capture
from attnviz.engine.forward import make_capture, model_attentions
from attnviz.engine.models import LoadedModel
from attnviz.engine.pictures import encode_picture
from attnviz.errors import InputError


def capture_image(loaded: LoadedModel, picture: images.Picture) -> Capture:
    """α of a vision model over one picture, as a Capture (its picture, grid and patch size kept)."""
    encoded = encode_picture(loaded, picture)
    alpha = model_attentions(loaded, encoded)
    return make_capture(loaded, encoded, alpha, picture.name)


def grid_positions(loaded: LoadedModel, picture: images.Picture) -> tuple[np.ndarray, float, tuple[int, int]]:
    """(each patch's position embedding as the model adds it for this picture's grid (N, D) float64, the check:
    the largest |difference| from what the model's own embedding layer added (its output less the patch
    projection and [CLS]), over that output's largest |value|; the grid)."""
    encoded = encode_picture(loaded, picture)
    rows, cols = encoded.grid or (0, 0)
    model = loaded.model
    base = getattr(model, "vision_model", model)
    embeddings = getattr(base, "embeddings", None)
    interpolate = getattr(embeddings, "interpolate_pos_encoding", None)
    projection = getattr(getattr(embeddings, "patch_embeddings", None), "projection", None) or getattr(
        embeddings, "patch_embedding", None)
    if embeddings is None or interpolate is None or projection is None:
        raise InputError(f"{loaded.name} has no position table to interpolate over the patch grid", "model")
    pixels = encoded.inputs["pixel_values"]
    h, w = int(pixels.shape[2]), int(pixels.shape[3])
    n = rows * cols
    with torch.inference_mode():
        interpolates = "interpolate_pos_encoding" in inspect.signature(embeddings.forward).parameters
        produced = embeddings(pixels, **({"interpolate_pos_encoding": True} if interpolates else {}))
        produced = produced[0] if isinstance(produced, tuple) else produced  # (1, T, D)
        patches = projection(pixels).flatten(2).transpose(1, 2)  # (1, N, D): the patch projection alone
        front = produced.shape[1] - n
        added = (produced[0, front:] - patches[0]).double()  # (N, D): what the layer added to each patch
        table = interpolate(torch.zeros(1, produced.shape[1], produced.shape[2], dtype=produced.dtype,
                                        device=produced.device), h, w)
        table = table[0, -n:].double()  # (N, D)
    check = float((table - added).abs().max()) / max(1.0, float(produced.abs().max()))
    return table.cpu().numpy(), check, (rows, cols)

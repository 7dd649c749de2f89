"""A picture as a vision model's input: fitted whole to the patch grid, normalised as the model's folder says,
with a token per [CLS] (and DeiT's distillation token, DINOv2's registers) and per patch, p(row,col) row by row.
The torch side of attnviz.data.picture (which decodes and checks the file); forward.encode hands pictures here.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import torch

from attnviz.data import picture as images
from attnviz.engine.encoded import Encoded
from attnviz.engine.models import LoadedModel
from attnviz.engine.memory import attention_bytes, memory_budget
from attnviz.errors import InputError, arg
from attnviz.base.sizes import size_text

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def settings(loaded: LoadedModel) -> tuple[int, int, tuple[float, ...], tuple[float, ...]]:
    """(the longer side fed to the model in pixels, the patch size, mean, std): from the folder's
    preprocessor_config.json where it has one, else the config's image size and ImageNet's statistics."""
    config = loaded.model.config
    patch = int(getattr(config, "patch_size", 16) or 16)
    size = int(getattr(config, "image_size", 224) or 224)
    mean: tuple[float, ...] = IMAGENET[0]
    std: tuple[float, ...] = IMAGENET[1]
    found = Path(loaded.image_source) / "preprocessor_config.json" if loaded.image_source else None
    if found is not None and found.is_file() and found.stat().st_size < 1 << 20:
        try:
            spec = json.loads(found.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            spec = {}
        if isinstance(spec, dict):
            given = spec.get("attnviz_input_size") or (spec.get("crop_size") or {}).get("height") or (
                spec.get("size") or {}).get("shortest_edge") or (spec.get("size") or {}).get("height")
            if isinstance(given, int) and images.MIN_SIZE <= given <= images.MAX_SIZE:
                size = given
            for key, into in (("image_mean", 0), ("image_std", 1)):
                value = spec.get(key)
                if isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
                    if into == 0:
                        mean = tuple(float(v) for v in value)
                    else:
                        std = tuple(float(v) for v in value)
    return min(size, images.MAX_SIZE), patch, mean, std


def encode_picture(loaded: LoadedModel, picture: images.Picture) -> Encoded:
    """A picture as a vision model's input: fitted whole to the patch grid, normalised as the model's folder
    says, with a token per [CLS] (and register) and per patch, p(row,col) row by row. The tokens before
    the patches come from the family (DeiT's distillation token, DINOv2's registers, none in SigLIP) and are
    checked when the model runs."""
    if not loaded.vision:
        raise InputError(f"{loaded.name} reads text, not images: give a vision model (-m dinov2, or a ViT, DeiT, "
                         f"DINOv2, CLIP or SigLIP vision folder)", "model")
    default, patch, mean, std = settings(loaded)
    fitted = images.fit(picture.pixels, picture.size or default, patch)  # (h, w, 3)
    rows, cols = fitted.shape[0] // patch, fitted.shape[1] // patch
    x = (fitted.astype(np.float32) / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32)
    model = loaded.model
    dtype = next(model.parameters()).dtype
    tensor = torch.from_numpy(x.transpose(2, 0, 1).copy())[None].to(loaded.device, dtype)  # (1, 3, h, w)
    inputs: dict = {"pixel_values": tensor}
    if "interpolate_pos_encoding" in inspect.signature(model.forward).parameters:
        inputs["interpolate_pos_encoding"] = True
    config = model.config
    kind = str(getattr(config, "model_type", ""))
    registers = int(getattr(config, "num_register_tokens", 0) or 0)
    extra = ["[DIST]"] if kind == "deit" else [f"[REG{k}]" for k in range(1, registers + 1)]  # after [CLS]
    head = [] if kind == "siglip_vision_model" else ["[CLS]", *extra]
    front = len(head)
    names = head + images.patch_names(rows, cols)
    need, budget = attention_bytes(loaded, len(names)), loaded.memory_budget or memory_budget()
    if need > budget:  # a picture is not streamed: its size is what to change
        raise InputError(f"{rows} × {cols} patches would need about {size_text(need)} for attention, over the "
                         f"budget of {size_text(budget)}; choose a smaller {arg('image_size')} (or raise "
                         f"{arg('max_memory')})", "image_size")
    T = len(names)
    return Encoded(inputs=inputs, tokens=names, token_ids=list(range(T)),
                   special=[True] * front + [False] * (T - front),
                   special_kind=(["start"] if front else []) + ["other"] * (front - 1 if front else 0)
                   + [""] * (rows * cols), subword=[False] * T, dropped=0, image=fitted, grid=(rows, cols),
                   patch=patch, image_name=picture.name)

"""The devices and precisions attnviz runs a model in, and the aliases it accepts for them: one definition,
used by the library and the command line (importing this module imports no torch)."""

from __future__ import annotations

from attnviz.errors import InputError, arg

# torch and transformers are imported inside the functions that need them, so that the names here answer
# before they load (about 2.5 s).

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("float32", "float16", "bfloat16")
DEVICE_ALIASES = {"gpu": "cuda"}
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32", "fp16": "float16", "f16": "float16",
                 "half": "float16", "bf16": "bfloat16"}


def dtype_name(dtype: str) -> str:
    """A dtype name or alias (fp16, bf16, any case) as one of DTYPES, or InputError."""
    name = str(dtype).strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return name


def refuse_early(device: str) -> None:
    """Refuse, without importing torch (2.5 s), a device this install cannot have: CUDA with a CPU-only torch
    build (its version says "+cpu"), MPS off macOS. Anything else is left to pick_device."""
    import importlib.metadata
    import sys

    device = DEVICE_ALIASES.get(str(device).strip().lower(), str(device).strip().lower())
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    try:
        build = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        build = ""
    if device == "cuda" and build.endswith("+cpu"):
        raise InputError(f"{arg('device')} cuda was asked for, but this torch ({build}) is built for the CPU only "
                         f"(try {arg('device')} cpu)", "device")
    if device == "mps" and sys.platform != "darwin":
        raise InputError(f"{arg('device')} mps was asked for, but MPS is Apple's, and this is {sys.platform} (try "
                         f"{arg('device')} cpu)", "device")

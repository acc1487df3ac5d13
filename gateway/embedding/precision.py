"""Which device and numerics embed passages and queries: the fastest the hardware offers,
or float32.

Passages: bfloat16 keeps float32's exponent range with an 8-bit mantissa; on CPUs with AMX
or AVX-512 BF16 its matrix products run natively, and MiniLM's vectors stay within cosine
0.999 of float32's (docs/evaluation.md, "Embedding precision"). int8 passages were measured
and not chosen: with one scale per activation tensor, vectors drifted too far for the
quality guard.

Queries (the ONNX path, `onnx_query`): one short query is bound by reading the weights,
not by arithmetic, so 8-bit weights in blocks of 128, multiplied in int8 with activations
quantised per block too (ONNX Runtime's MatMulNBits, accuracy level 4), embed a query in
about half the time and CPU of float32 where the CPU has int8 dot products (VNNI); its
vectors stay within cosine 0.997 of float32's. Every mix of query and passage numerics
ranks within the same guard, which is why one index may hold vectors of several kinds
(its generations record which).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PrecisionSetting = Literal["auto", "float32", "bfloat16"]
CPUINFO = Path("/proc/cpuinfo")
# Either gives the CPU native bfloat16 dot products that oneDNN (torch's CPU kernels) uses.
BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# Any gives int8 dot products (VPDPBUSD, or AMX tiles) to ONNX Runtime's 8-bit kernels.
INT8_FLAGS = frozenset({"amx_int8", "avx512_vnni", "avx_vnni"})


@dataclass(frozen=True)
class Numerics:
    """Where and in what passages (or queries) are embedded, and why (logged at start)."""

    device: str  # "cpu" or "cuda"
    dtype: str  # "float32" or "bfloat16"; for queries "float32" or "int8"
    reason: str
    # bfloat16 forced on a CPU that computes it in software: accepted (a fleet may force one
    # numerics everywhere), but several times slower than float32, so logged as a warning.
    emulated: bool = False

    @property
    def label(self) -> str:
        """What a generation records of the vectors it adds, e.g. `bfloat16`, `cuda:float32`."""
        return self.dtype if self.device == "cpu" else f"{self.device}:{self.dtype}"


def choose(
    setting: PrecisionSetting, flags: frozenset[str] | None = None, cuda: bool | None = None
) -> Numerics:
    """`auto`: a CUDA device when torch sees one, then bfloat16 where the CPU computes it
    natively, else float32. `float32` and `bfloat16` force the dtype (on CPU unless CUDA);
    bfloat16 forced on a CPU without it natively is `emulated`."""
    if cuda is None:
        cuda = cuda_available()
    device = "cuda" if cuda else "cpu"
    forced = _forced(setting)
    if setting == "bfloat16" and not cuda and not BF16_FLAGS & _flags(flags):
        # Passages embedded 4.6 times slower than in float32 on an AVX2-only EPYC (one thread).
        lacks = "/".join(sorted(BF16_FLAGS))
        reason = f"{forced} (emulated: this CPU lacks {lacks}; several times slower than float32)"
        return Numerics("cpu", "bfloat16", reason, emulated=True)
    if setting != "auto":
        return Numerics(device, setting, forced)
    if cuda:
        return Numerics("cuda", "bfloat16", "auto: a CUDA device")
    found = BF16_FLAGS & _flags(flags)
    if found:
        return Numerics("cpu", "bfloat16", f"auto: the CPU reports {', '.join(sorted(found))}")
    return Numerics("cpu", "float32", "auto: no native bfloat16 on this CPU")


def choose_queries(setting: PrecisionSetting, flags: frozenset[str] | None = None) -> Numerics:
    """How the ONNX path embeds queries: `auto` takes int8 where the CPU has int8 dot
    products, else float32; a forced setting keeps queries in float32 (bfloat16 names the
    passages' numerics; ONNX Runtime has no fast bfloat16 on CPUs)."""
    if setting != "auto":
        return Numerics("cpu", "float32", _forced(setting))
    found = INT8_FLAGS & _flags(flags)
    if found:
        return Numerics("cpu", "int8", f"auto: the CPU reports {', '.join(sorted(found))}")
    return Numerics("cpu", "float32", "auto: no int8 dot products on this CPU")


def _forced(setting: PrecisionSetting) -> str:
    """The reason given for numerics the setting chose."""
    return f"set: GATEWAY_EMBEDDING_PRECISION={setting}"


def log_choice(log: logging.Logger, numerics: Numerics) -> None:
    """The line a process that embeds passages logs at start (docs/operations.md,
    "Embedding precision"); a warning when the numerics are emulated."""
    level = logging.WARNING if numerics.emulated else logging.INFO
    log.log(level, "%s", choice_line(numerics))


def choice_line(numerics: Numerics) -> str:
    return f"passages are embedded in {numerics.label} ({numerics.reason})"


def _flags(given: frozenset[str] | None) -> frozenset[str]:
    return cpu_flags() if given is None else given


def cpu_flags() -> frozenset[str]:
    """The first core's feature flags (Linux); empty where /proc/cpuinfo is not there."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cuda_available() -> bool:
    """Without importing torch when no NVIDIA driver is installed (most CPU servers)."""
    if not Path("/proc/driver/nvidia").exists():
        return False
    import torch

    return bool(torch.cuda.is_available())

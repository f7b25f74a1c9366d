"""What `training.precision: auto` trains in, and why: one rule for the Trainer, the Tuner's
trials and the TPU smoke test.

- **TPU:** `mixed_bfloat16`, as TF Model Garden's DLRM/DCN-v2 recipes train on TPU
  (`runtime.mixed_precision_dtype: mixed_bfloat16`): the first TPU run trains the model TPU users
  expect.
- **GPU:** `float32` (not measured here).
- **CPU:** `mixed_bfloat16` only where the CPU has bfloat16 units (`avx512_bf16` or `amx_bf16` in
  /proc/cpuinfo, and oneDNN not capped below them by `ONEDNN_MAX_CPU_ISA`) *and* the defaults were
  measured at least `MIN_CPU_SPEEDUP` faster in bfloat16 at equal quality: `MEASURED_CPU_SPEEDUP`,
  from `bench/precision_bench.py` (bench/README.md "Precision"). Below it, `float32`.

`float32` and `mixed_bfloat16` set explicitly are used as set, on any hardware.
"""
from __future__ import annotations

import os
from typing import FrozenSet, Optional, Tuple

from components.config.choices import Precision

# bfloat16 must make the defaults' training at least this much faster on a CPU for `auto` to pick it.
MIN_CPU_SPEEDUP = 1.15
# The defaults' training examples/s in mixed_bfloat16 over float32 on a CPU with avx512_bf16 (the
# 2-core AMD EPYC development machine), at the default batch 256, the median of three repeats of
# bench/precision_bench.py (bench/README.md "Precision"; at batch 4096 bfloat16 ran on one core:
# 0.60 of float32's wall-clock rate). Below MIN_CPU_SPEEDUP, so `auto` trains float32 on CPUs.
MEASURED_CPU_SPEEDUP = 0.96
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that still allow its bfloat16 kernels.
BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX",
             "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT")


def cpu_flags(path: str = "/proc/cpuinfo") -> FrozenSet[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_bf16_units(flags: FrozenSet[str], isa_cap: Optional[str]) -> Tuple[bool, str]:
    """(whether the CPU's bfloat16 units are usable, in words).

    Args:
      flags: the CPU's flags (`cpu_flags`).
      isa_cap: oneDNN's `ONEDNN_MAX_CPU_ISA`, or None.
    """
    units = [f for f in BF16_FLAGS if f in flags]
    if not units:
        return False, "the CPU reports no bfloat16 units (avx512_bf16, amx_bf16)"
    if isa_cap and isa_cap.upper() not in BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={isa_cap} caps oneDNN below its bfloat16 kernels"
    return True, f"the CPU has {', '.join(units)}"


def choose_precision(setting: str, platform: str, flags: Optional[FrozenSet[str]] = None,
                     isa_cap: Optional[str] = None) -> Tuple[str, str]:
    """The precision a run trains in, and why (module docstring).

    Args:
      setting: `training.precision`.
      platform: `tpu`, `gpu` or `cpu`.
      flags: the CPU's flags (None: read from /proc/cpuinfo).
      isa_cap: oneDNN's ISA cap (None: read from ONEDNN_MAX_CPU_ISA).

    Returns:
      (`float32` or `mixed_bfloat16`, the reason in words).
    """
    if setting != Precision.AUTO:
        return str(setting), f"training.precision: {setting}"
    if platform == "tpu":
        return Precision.MIXED_BFLOAT16.value, "auto on a TPU: mixed_bfloat16, as TF Model Garden trains DLRM/DCN-v2"
    if platform == "gpu":
        return Precision.FLOAT32.value, "auto on a GPU: float32 (bfloat16 not measured on GPUs here)"
    usable, units = cpu_bf16_units(cpu_flags() if flags is None else flags,
                                   os.environ.get("ONEDNN_MAX_CPU_ISA") if isa_cap is None else isa_cap)
    if not usable:
        return Precision.FLOAT32.value, f"auto on a CPU: float32 ({units})"
    if MEASURED_CPU_SPEEDUP < MIN_CPU_SPEEDUP:
        return Precision.FLOAT32.value, (f"auto on a CPU: float32 ({units}, but the defaults trained "
                                         f"{MEASURED_CPU_SPEEDUP:.2f}x as fast in bfloat16, under "
                                         f"{MIN_CPU_SPEEDUP:.2f}x: bench/README.md \"Precision\")")
    return Precision.MIXED_BFLOAT16.value, (f"auto on a CPU: mixed_bfloat16 ({units}; the defaults trained "
                                            f"{MEASURED_CPU_SPEEDUP:.2f}x as fast)")

"""``nano-patch run --fast``: everything that measured faster on this kind of machine and keeps accuracy.

- bf16 autocast where the CPU computes bf16 natively (avx512_bf16 or AMX); fp32 elsewhere, where
  bf16 is emulated and slower;
- channels-last (the Trainer, ``@nano`` and ``TorchNano`` apply it only to models with 4-D
  convolutions);
- the ``nano-patch init`` environment (thread count, an installed tcmalloc or jemalloc);
- the decoded-image cache (``cache_decoded="auto"``) for image datasets whose decoded size fits half
  the memory and half the free disk: epochs after the first skip JPEG decoding.

Measured on the pets example (docs/benchmarks.md). Multi-instance training is left out: on 2-8 cores
it measured no faster than one process.
"""

from __future__ import annotations

from typing import Any

from . import envtune, sysinfo


def fast_options(native_bf16: bool | None = None) -> tuple[dict[str, Any], str]:
    """The preset's options and the one line that says what it chose and why."""
    flags = sysinfo.cpu_flags()
    native = sysinfo.has_native_bf16() if native_bf16 is None else native_bf16
    options: dict[str, Any] = {"channels_last": True, "cache_decoded": "auto"}
    if native:
        options["precision"] = "bf16"
        have = " and ".join(f for f in ("amx_bf16", "avx512_bf16") if f in flags) or "native bf16"
        parts = [f"bf16 autocast (this CPU has {have})"]
    else:
        parts = ["fp32 (this CPU has neither avx512_bf16 nor AMX, so bf16 would be emulated and slower)"]
    parts.append("channels-last for models with 4-D convolutions")
    parts.append("the decoded-image cache for image datasets that fit (one line per dataset says)")
    env, notes = envtune.settings()
    parts.append(", ".join(f"{k}={v}" for k, v in env.items() if k != "MALLOC_CONF"))
    parts += [n for n in notes if n.startswith("no ")]
    return options, "nano-patch --fast: " + "; ".join(parts)

"""The machine a result was measured on: what every sweep cell, benchmark record and calibration carries,
so that numbers from different machines are never mixed silently."""
from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
from typing import Any


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_label(device: Any) -> str:
    """``device`` as a string, with the GPU's name for CUDA devices (``cuda:0 (NVIDIA H200)``)."""
    import torch

    dev = str(device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        return f"{dev} ({torch.cuda.get_device_name(torch.device(dev))})"
    return dev


def describe(device: Any = "cpu", dtype: str = "float64") -> dict[str, Any]:
    """CPU, logical cores, torch threads, torch / transformers / mdv / Python versions, dtype, device,
    load average (1, 5, 15 min; None off Linux) and a UTC timestamp."""
    import torch
    import transformers

    import mdv

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "dtype": dtype,
            "device": device_label(device), "mdv": mdv.__version__, "python": platform.python_version(),
            "loadavg_1_5_15": load, "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


__all__ = ["cpu_name", "describe", "device_label"]

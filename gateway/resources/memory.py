"""The memory alarm's readings: this process's resident memory, the machine's (or the
cgroup's) limit, and where the gateway's own memory goes.

RabbitMQ blocks publishers at ``vm_memory_high_watermark`` (0.4 of RAM or of the cgroup
limit); ``memory_high_watermark`` means the same here: a fraction when <= 1, else bytes.
The alarm clears 10 % below the limit so that it does not flap.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_NO_CGROUP_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a huge number


def resident_bytes(statm: Path = Path("/proc/self/statm")) -> int:
    """The process's resident set size."""
    return int(statm.read_text().split()[1]) * _PAGE_BYTES


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    return None if trim is None else cast(Callable[[int], int], trim)


_MALLOC_TRIM = _load_malloc_trim()


def give_back() -> None:
    """While over the watermark: collect cycles and hand freed heap pages back to the OS
    (glibc keeps them otherwise), so a drained backlog shows in the resident size."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def machine_bytes() -> int:
    return int(os.sysconf("SC_PHYS_PAGES")) * _PAGE_BYTES


def cgroup_limit_bytes(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), None when there is none."""
    for candidate in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        value = int(text)
        return None if value >= _NO_CGROUP_LIMIT else value
    return None


def high_watermark_bytes(watermark: float, total: int, cgroup: int | None) -> int:
    """The alarm's limit: a fraction of the memory available to us, or absolute bytes."""
    if watermark > 1:
        return int(watermark)
    available = total if cgroup is None else min(total, cgroup)
    return int(available * watermark)

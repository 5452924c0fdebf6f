"""Energy counters of the machine, where it exposes them: Linux powercap (Intel RAPL).

``EnergyMeter().read()`` returns the joules counted so far by every CPU package
(``/sys/class/powercap/intel-rapl:N/energy_uj``, summed; sub-domains such as core or
dram are parts of their package and not added again), or None when no counter is
readable; ``reason`` then says why. Counters wrap at ``max_energy_range_uj``; a reading
unwraps against the previous one (read at least once per wrap period, minutes at full
load). Counters are per node: every rank of a node reads the same ones, so a run's total
takes one rank per node (profile.run).

A GPU's counter (NVML's total energy consumption) is not read, and no NVML binding is a
dependency: every block operation of this version runs in numpy on the CPU, so a GPU's
joules are no part of a run's energy. ``gpu_reason()`` says so (or that the node has no
NVIDIA GPU), and the report prints it as "unavailable" with that reason.
"""

from __future__ import annotations

import glob
import os

POWERCAP = "/sys/class/powercap"


class EnergyMeter:
    """Joules of the node's CPU packages since an arbitrary origin (see module docstring)."""

    def __init__(self, root: str = POWERCAP):
        self.reason = ""
        self._domains = []            # (energy file, wrap in µJ)
        packages = sorted(p for p in glob.glob(os.path.join(root, "intel-rapl:*"))
                          if os.path.basename(p).count(":") == 1)
        if not packages:
            self.reason = (f"{root} has no intel-rapl package domains (no RAPL interface is exposed "
                           "to this machine, e.g. a virtual machine, container or non-Intel/AMD CPU)")
            return
        for p in packages:
            path = os.path.join(p, "energy_uj")
            try:
                with open(path) as f:
                    int(f.read())
                with open(os.path.join(p, "max_energy_range_uj")) as f:
                    wrap = int(f.read())
            except (OSError, ValueError) as err:
                self.reason = (f"{path} is not readable ({getattr(err, 'strerror', None) or err}); "
                               "reading RAPL usually needs root or a chmod of energy_uj")
                self._domains = []
                return
            self._domains.append((path, wrap))
        self._last = [0] * len(self._domains)
        self._total = [0] * len(self._domains)
        self.read()

    @property
    def available(self) -> bool:
        return bool(self._domains)

    def read(self) -> float | None:
        """Joules so far (None when unavailable)."""
        if not self._domains:
            return None
        for i, (path, wrap) in enumerate(self._domains):
            with open(path) as f:
                now = int(f.read())
            step = now - self._last[i]
            self._total[i] += step if step >= 0 else step + wrap
            self._last[i] = now
        return sum(self._total) / 1e6


def gpu_reason(devices: str = "/dev/nvidia[0-9]*") -> str:
    """Why a run records no GPU joules (see module docstring)."""
    if not glob.glob(devices):
        return "no NVIDIA GPU on this node (no /dev/nvidia* device)"
    return ("this node's NVIDIA GPU ran nothing of the run (every block operation runs in numpy on the "
            "CPU), so its NVML energy counter is not read")

"""perfcast's own op profiler: time op-table rows with torch on this machine's CPU or GPU.

Source of the ``perfcast-profiler`` op records. The profiler runs ops; it knows nothing of
catalogs (the device name is recorded as torch prints it, ``cpu`` for host runs).

One module per job:

* :mod:`.device`: the CPU or CUDA device and its software versions (:func:`detect_device`);
* :mod:`.rows`: what one op-table row costs (FLOPs, elements moved, memory);
* :mod:`.measurement`: the repeat policy, the statistics of one row, a skipped row;
* :mod:`.timing`: how one row is built and measured (:func:`time_op`);
* :mod:`.collectives`: collective rows over this machine's GPUs (NCCL);
* :mod:`.budget`: the calibrated rates and cost guesses behind the caps (:func:`estimate_op_s`);
* :mod:`.run`: the sweep, its journal and the dataset it writes (:func:`run_profile`).
"""

from __future__ import annotations

from perfcast.data.profiler.budget import estimate_op_s
from perfcast.data.profiler.device import DeviceInfo, detect_device
from perfcast.data.profiler.measurement import Measurement, OpSkipped, RepeatPolicy
from perfcast.data.profiler.run import SOURCE, ProfileProgress, ProfileResult, run_profile
from perfcast.data.profiler.timing import time_op

__all__ = [
    "DeviceInfo",
    "Measurement",
    "OpSkipped",
    "ProfileProgress",
    "ProfileResult",
    "RepeatPolicy",
    "SOURCE",
    "detect_device",
    "estimate_op_s",
    "run_profile",
    "time_op",
]

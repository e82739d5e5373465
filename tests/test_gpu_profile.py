"""benchmarks/gpu_profile.py on a CPU: every path runs, the union of device intervals counts overlaps once."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import torch
from benchmark_scripts import BENCHMARKS, benchmark_script


def event(name: str, start: float, end: float, cuda: bool = True):
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return SimpleNamespace(name=name, device_type=kind, time_range=SimpleNamespace(start=start, end=end))


def test_busy_time_is_the_union_of_device_activities_and_annotations_are_left_out():
    with benchmark_script("gpu_profile") as script:
        events = [event("gemm", 0, 100), event("add", 50, 150), event("fill", 300, 310),
                  event("Optimizer.step#Adam.step", 0, 1000), event("aten::mm", 0, 5000, cuda=False)]
        busy, count = script.busy_ms(events)
        assert (busy, count) == (0.16, 3)  # 0-150 and 300-310 microseconds
        assert script.top_kernels(events, steps=2) == [["gemm", 50.0, 0.5], ["add", 50.0, 0.5], ["fill", 5.0, 0.5]]
        assert script.busy_ms([event("aten::mm", 0, 10, cuda=False)]) == (None, 0)


def test_every_path_runs_on_a_cpu():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_profile.py"), "--device", "cpu", "--scale", "0.004",
                           "--steps", "2", "--paths", "eager,captured", "--models", "distmult", "--rank-paths", "eager"],
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    assert [(r["work"], r["path"]) for r in rows] == [("train step", "eager"), ("train step", "captured"),
                                                     ("rank both sides", "eager")]
    for r in rows:
        assert r["wall_ms"] > 0 and r["kernel_ms"] is None and r["floor_ms"] > 0 and 0 < r["floor_fraction"]

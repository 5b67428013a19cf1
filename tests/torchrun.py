"""Run a worker script on 2 CPU ranks with torchrun and read back what each rank saved, for the tests that compare a
tensor-parallel model with one process (tests/sae/test_feature_parallel.py, tests/graphs/test_graph_parallel.py).

The worker is called as `worker OUT name=checkpoint_dir ...` and saves its results to OUT/rank{rank}.pt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def ranks(worker_file: str, out: Path, checkpoints: dict[str, Path]) -> list[dict]:
    """Each rank's saved results, rank 0 first; fails with the workers' output if torchrun does."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(Path(worker_file)), str(out), *(f"{name}={directory}" for name, directory in checkpoints.items())]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]

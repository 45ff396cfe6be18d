"""One agent's update on several processes (GPUs) through torchrun: data parallel, one DeepSpeed engine per rank.

    python -m torch.distributed.run --standalone --nproc_per_node N -m mars2.train.launch JOB_DIR

:func:`launch_update` writes the job (samples as Parquet, arguments as JSON) into ``JOB_DIR``, starts torchrun
and reads back rank 0's metrics. Each rank runs :func:`mars2.train.update_agent` on its shard of every optimizer
step (:func:`mars2.train.update.rank_micro_batches`); DeepSpeed all-reduces the gradients, so N processes give the
update one process would give on the same samples. On a GPU node each rank takes ``cuda:<LOCAL_RANK>``; on CPU the
ranks talk over gloo, which is how the tests run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from mars2.cpu import split_cpus, thread_environment, usable_cpus
from mars2.io import atomic_write_json, write_parquet
from mars2.train.update import Sample, UpdateHParams, update_agent

JOB = "job.json"
SAMPLES = "samples.parquet"
METRICS = "metrics.json"
RANK_ERROR = re.compile(r"^\[rank\d+\]: ((?:\w+\.)*\w*(?:Error|Exception)\b.*)$")


class UpdateLaunchError(RuntimeError):
    """A multi-process update exited with an error; the message carries the ranks' exception lines."""


def torchrun_command(job_dir: str | Path, nprocs: int) -> list[str]:
    """The launcher command line: torchrun (``torch.distributed.run``) on this node, ``nprocs`` ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nprocs}",
            "-m", "mars2.train.launch", str(job_dir)]


def write_job(job_dir: str | Path, *, model_dir: str, ref_model_dir: str, prev_ds_dir: str | None,
              samples: list[Sample], out_dir: str | Path, profile: dict[str, Any], hp: UpdateHParams, pad_id: int,
              device: str) -> Path:
    """``JOB_DIR/job.json`` (every argument of :func:`update_agent` but the samples) and ``JOB_DIR/samples.parquet``."""
    job_dir = Path(job_dir)
    write_parquet(job_dir / SAMPLES, pd.DataFrame([asdict(s) for s in samples]))
    atomic_write_json(job_dir / JOB, {"model_dir": model_dir, "ref_model_dir": ref_model_dir,
                                      "prev_ds_dir": prev_ds_dir, "out_dir": str(out_dir), "profile": profile,
                                      "hp": asdict(hp), "pad_id": pad_id, "device": device})
    return job_dir


def run_job(job_dir: str | Path) -> dict[str, float]:
    """One rank's part of the job in ``job_dir``; rank 0 writes the metrics. The rank runs with the threads its
    launcher gave it (``OMP_NUM_THREADS``, its share of the run's CPU budget), also where that exceeds the machine's
    cores, which is as far as torch would take the variable by itself."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    job_dir = Path(job_dir)
    job = json.loads((job_dir / JOB).read_text())
    hp = job.pop("hp")
    hp["betas"] = tuple(hp["betas"])
    samples = [Sample(list(r.prompt_ids), list(r.response_ids), list(r.rollout_logprobs), float(r.advantage))
               for r in pd.read_parquet(job_dir / SAMPLES).itertuples()]
    metrics = update_agent(samples=samples, hp=UpdateHParams(**hp), **job)
    if os.environ.get("RANK", "0") == "0":
        atomic_write_json(job_dir / METRICS, metrics)
    return metrics


def launch_environment(nprocs: int, base: dict[str, str], cuda_visible_devices: str | None,
                       threads_per_rank: int = 0) -> dict[str, str]:
    """The launcher's environment: ``base`` without another launch's rank variables, each rank's threads
    (:func:`mars2.cpu.thread_environment` of ``threads_per_rank``; 0: the usable cores / ``nprocs``), and
    ``CUDA_VISIBLE_DEVICES`` the GPUs the plan placed the update on (rank r takes the r-th)."""
    env = {k: v for k, v in base.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    threads = threads_per_rank or split_cpus(usable_cpus(), update_ranks=nprocs).update_rank
    env.update(thread_environment(threads))
    if cuda_visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return env


def launch_update(nprocs: int, job_dir: str | Path, *, cuda_visible_devices: str | None = None,
                  threads_per_rank: int = 0, **update_args: Any) -> dict[str, float]:
    """Run :func:`update_agent` (same keyword arguments) on ``nprocs`` processes, on the GPUs
    ``cuda_visible_devices`` names (None: those this process sees), each rank with ``threads_per_rank`` threads
    (0: its share of the usable cores); returns its metrics.

    The ranks' output streams through to this process's stdout/stderr; a non-zero exit raises
    :class:`UpdateLaunchError` and leaves ``update_args['out_dir']`` without a finished model.
    """
    job_dir = write_job(job_dir, **update_args)
    env = launch_environment(nprocs, dict(os.environ), cuda_visible_devices, threads_per_rank)
    errors: dict[str, None] = {}  # the ranks' exception lines, in order, once each
    with subprocess.Popen(torchrun_command(job_dir, nprocs), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            if m := RANK_ERROR.match(line):
                errors[m.group(1)] = None
    if proc.returncode != 0 or not (job_dir / METRICS).exists():
        raise UpdateLaunchError(f"update on {nprocs} processes failed (exit {proc.returncode}): "
                                + ("; ".join(list(errors)[-3:]) or "no exception reported; see the output above"))
    return json.loads((job_dir / METRICS).read_text())


if __name__ == "__main__":
    run_job(sys.argv[1])

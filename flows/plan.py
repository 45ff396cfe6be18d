"""Resource plan of a run (docs/plan.md): no GPU, no weights, no Prefect, no MLflow.

    python flows/plan.py agents=heterogeneous_32b                 # 3 nodes x 8 H200 (conf/plan/default.yaml)
    python flows/plan.py agents=heterogeneous_14b plan.gpu_memory_gb=80 plan.nodes=1
    python flows/plan.py agents=tiny_cpu                          # CPU agents: parameters and host memory
    python flows/plan.py --config-name evaluate agents=heterogeneous_14b plan.gpu_memory_gb=80 plan.nodes=1

The last plans what flows/evaluate.py runs: no update, so only the engines must fit (a layout may be smaller).

Builds every agent's model on the ``meta`` device from its config.json (the model folder's, else the copy
shipped in mars2/plan/model_configs/), and prints per agent: parameters, ZeRO memory per GPU (DeepSpeed's
estimators), vLLM KV-cache budget at the configured lengths, GPUs needed, and the rollout/update placement.
Exits 1 with one paragraph when the agents cannot fit the cluster, or when a run would refuse the plan's placement
(:func:`mars2.plan.placement.place`: a given node, GPU list or ``cuda:N`` device the plan contradicts).
"""

from __future__ import annotations

import os
import sys

from pipeline.runtime import configure_process

configure_process()  # PREFECT_HOME, offline hub flags, quiet warnings: before Prefect/MLflow/transformers load
import hydra
from omegaconf import DictConfig

from mars2.config import ConfigError
from pipeline.config import compose_run


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(_: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    config_name = HydraConfig.get().job.config_name
    try:
        run = compose_run(list(HydraConfig.get().overrides.task), config_name=config_name, planning=True)
    except ConfigError as e:
        sys.exit(f"mars2: config error: {e}")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # only DeepSpeed's estimators run here: no device probing
    from rich.console import Console

    from mars2.plan import ModelConfigNotFound, PlanRefused, plan
    from mars2.plan.placement import place
    from mars2.plan.render import render

    try:
        result = plan(run, updates=config_name != "evaluate")
    except ModelConfigNotFound as e:
        sys.exit(f"mars2: plan: {e}")
    render(result, Console(width=None if sys.stdout.isatty() else 140))
    if not result.fits:
        sys.exit(f"mars2: plan refused: {result.refusal()}")
    try:
        place(run, result)  # what the run's entry does with the plan: the node, GPU and rank checks included
    except PlanRefused as e:
        sys.exit(f"mars2: the plan fits the cluster, but a run would be refused: {e}")


if __name__ == "__main__":
    main()

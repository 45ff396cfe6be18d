"""Resource planner (docs/plan.md): parameters, ZeRO memory per GPU (DeepSpeed's estimators), vLLM
KV-cache budget, GPUs needed and placement of every agent — from config.json values on the ``meta`` device,
offline, without weights. Pure library: no Prefect, MLflow, Hydra or OmegaConf; torch/transformers/deepspeed
are imported only when a plan is computed."""

from mars2.plan.models import PUBLIC_PARAMS, ModelConfigNotFound, ModelShape, count_parameters, load_model_config
from mars2.plan.planner import AgentPlan, ClusterPlan, PlanRefused, plan, require_fit

__all__ = ["PUBLIC_PARAMS", "AgentPlan", "ClusterPlan", "ModelConfigNotFound", "ModelShape", "PlanRefused",
           "count_parameters", "load_model_config", "plan", "require_fit"]

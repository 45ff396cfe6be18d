"""Evaluation: LiveCodeBench metrics (``metrics``) and our diversity metrics (``diversity``); pure functions."""

from mars2.eval.diversity import (
    aec,
    algorithm_class,
    code_embedding,
    distinct_algorithms_at_k,
    diversity_metrics,
    effective_classes,
    g_vendi,
    normalise_code,
    vendi_score,
)
from mars2.eval.metrics import (
    default_scorer,
    final_node,
    mean_pass_at_k,
    pass_at_1_mcts,
    pass_at_k,
    pass_at_n,
    pick_final,
    public_pass_accuracy,
    sample_metrics,
    summarise,
    tree_metrics,
)

__all__ = [
    "aec",
    "algorithm_class",
    "code_embedding",
    "default_scorer",
    "distinct_algorithms_at_k",
    "diversity_metrics",
    "effective_classes",
    "final_node",
    "g_vendi",
    "mean_pass_at_k",
    "normalise_code",
    "pass_at_1_mcts",
    "pass_at_k",
    "pass_at_n",
    "pick_final",
    "public_pass_accuracy",
    "sample_metrics",
    "summarise",
    "tree_metrics",
    "vendi_score",
]

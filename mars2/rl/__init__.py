from mars2.rl.advantage import (
    group_advantage,
    is_flat,
    overlong_penalty,
    tree_consistent_shaping,
    tree_group_advantage,
    tree_rewards,
)
from mars2.rl.losses import LossOutput, grpo_loss, gspo_loss, k3_kl, masked_mean, truncated_is_weights

__all__ = ["LossOutput", "group_advantage", "grpo_loss", "gspo_loss", "is_flat", "k3_kl", "masked_mean",
           "overlong_penalty", "tree_consistent_shaping", "tree_group_advantage", "tree_rewards",
           "truncated_is_weights"]

from mars2.train.engine import Sample, UpdateHParams, update_agent, update_hparams, warmup_cosine

__all__ = ["Sample", "UpdateHParams", "update_agent", "update_hparams", "warmup_cosine"]

"""DeepSpeed imported without MLflow.

DeepSpeed 0.19's autotuner (``deepspeed.autotuning.autotuner``, imported by ``import deepspeed``) runs ``import
mlflow`` whenever MLflow is installed, which it is wherever the pipeline is: about 1.4 s of every update rank's
start-up, in processes that never log to MLflow. mars2 never autotunes, so MLflow is hidden while DeepSpeed loads.
"""

from __future__ import annotations

import sys
from types import ModuleType

from mars2.shims import check_version

PACKAGE, WRITTEN_FOR = "deepspeed", "0.19."


def import_deepspeed() -> ModuleType:
    """``deepspeed``; on its first import, with ``sys.modules["mlflow"] = None`` (``import mlflow`` raises ImportError,
    which the autotuner catches) unless MLflow is imported already. Only the autotuner notices."""
    if "deepspeed" not in sys.modules and "mlflow" not in sys.modules:
        check_version(PACKAGE, WRITTEN_FOR)
        sys.modules["mlflow"] = None  # type: ignore[assignment]
        try:
            import deepspeed  # noqa: F401
        finally:
            del sys.modules["mlflow"]
    import deepspeed

    return deepspeed

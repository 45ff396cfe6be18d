"""Process environment for flows, set before Prefect, MLflow or transformers are imported."""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def run_root() -> Path:
    """The run folder: ``$MARS2_HOME`` or ``./.mars2``."""
    return Path(os.environ.get("MARS2_HOME", ".mars2")).resolve()


def configure_process() -> None:
    """Offline hub access, a per-project Prefect home, quiet third-party warnings. Idempotent."""
    root = run_root()
    defaults = {
        "PREFECT_HOME": str(root / "prefect"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DS_BUILD_OPS": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the embedded server's first start in a run folder registers every block type (~2 s); no stage uses blocks
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        # the embedded server needs more than Prefect's 20 s to start on a loaded 2-core machine
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "DO_NOT_TRACK": "1",
    }
    if "PREFECT_LOGGING_LEVEL" not in os.environ:
        # Prefect's own INFO lines (task/flow run states, the temporary server) stay off the console; they still reach
        # the Prefect server (its UI). PREFECT_LOGGING_LEVEL=INFO, or this variable, brings them back.
        defaults["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "WARNING"
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*SQLAlchemy.*")

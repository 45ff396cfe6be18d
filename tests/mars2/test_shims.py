"""Every reach into a library's internals (mars2/shims/, pipeline/shims/) against the installed library: an upgrade
that moves what a shim relies on fails here, not in a run."""

from __future__ import annotations

import inspect
import sqlite3
import warnings

import pytest

from mars2.shims import check_version, deepspeed_import, deepspeed_zero3, transformers_cache
from pipeline.shims import mlflow_store, prefect_server

SHIMS = [deepspeed_import, deepspeed_zero3, transformers_cache, prefect_server, mlflow_store]


@pytest.mark.parametrize("shim", SHIMS, ids=lambda m: m.__name__)
def test_each_shim_was_written_for_the_installed_version(shim):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version(shim.PACKAGE, shim.WRITTEN_FOR)


def test_another_version_warns_once():
    import mars2.shims as shims

    shims._warned.discard("pytest")
    with pytest.warns(UserWarning, match="written for 0.0.x"):
        assert not check_version("pytest", "0.0.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not check_version("pytest", "0.0.")


def test_deepspeed_still_keeps_the_references_the_shim_drops():
    import torch
    from deepspeed.runtime.zero import parameter_offload

    assert isinstance(parameter_offload.FWD_MODULE_STACK, list)
    assert deepspeed_zero3.params_to_release_caches(), "the release cache moved: ZeRO-3 engines would leak"
    kept, ours = torch.nn.Linear(1, 1), torch.nn.Sequential(torch.nn.Linear(1, 1))
    parameter_offload.FWD_MODULE_STACK.extend([kept, ours, ours[0]])
    try:
        deepspeed_zero3.drop_zero3_references(ours)
        assert kept in parameter_offload.FWD_MODULE_STACK
        assert not any(m is ours or m is ours[0] for m in parameter_offload.FWD_MODULE_STACK)
    finally:
        parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK if m is not kept]


def test_deepspeed_loads_without_mlflow_in_a_fresh_process_and_mlflow_still_imports_after():
    """A fresh update rank: DeepSpeed's autotuner would import MLflow (the reason for the shim); it must not, and an
    ``import mlflow`` afterwards must still work (the hiding entry is gone)."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from mars2.shims.deepspeed_import import import_deepspeed\n"
             "import_deepspeed()\n"
             "from deepspeed.autotuning import autotuner\n"
             "print('mlflow' in sys.modules, autotuner.has_mlflow)\n"
             "import mlflow\n"
             "print(mlflow.__name__)\n")
    import os

    # as an update rank has it (mars2.train.update.select_accelerator): without it DeepSpeed prints its accelerator
    # guess to stdout, and whether the worker had it depended on which test ran there before
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "mlflow"]


def test_dynamic_layer_has_no_method_the_slack_layer_has_not_looked_at():
    from transformers.cache_utils import DynamicLayer

    methods = sorted(n for n, _ in inspect.getmembers(DynamicLayer) if not n.startswith("_"))
    assert methods == sorted(transformers_cache.METHODS)


def test_prefect_still_launches_its_ephemeral_server_as_the_shim_does():
    import prefect.server.api.server as server

    module, factory = prefect_server.APP_FACTORY.split(":")
    assert module == server.__name__ and callable(getattr(server, factory))
    source = inspect.getsource(server)  # Prefect's own SubprocessASGIServer sets the same private settings
    assert all(name in source for name in prefect_server.PRIVATE_SETTINGS)
    argv, env = prefect_server.server_command(4321)
    assert argv[argv.index("--factory") + 1] == prefect_server.APP_FACTORY and "4321" in argv
    assert env["PREFECT__SERVER_EPHEMERAL"] == "1"


def test_mlflow_store_schema_takes_the_default_experiments_location(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # MLflow creates its schema
    mlflow_store.point_default_experiment(db, (tmp_path / "elsewhere").as_uri())
    default = MlflowClient(tracking_uri=f"sqlite:///{db}").get_experiment("0")
    assert default.artifact_location == (tmp_path / "elsewhere").as_uri()
    with sqlite3.connect(db) as con:
        con.execute("delete from experiments")
    con.close()
    with pytest.raises(RuntimeError, match="no Default experiment"):
        mlflow_store.point_default_experiment(db, "file:///x")

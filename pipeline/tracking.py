"""MLflow side of a flow run: one MLflow run per flow run, params, per-stage metrics and artefacts.

Uses ``MlflowClient`` with an explicit run id (MLflow's active run is thread-local; Prefect tasks may
run in other threads). The embedded default is a SQLite store in the run folder; ``paths.mlflow_uri``
(``$MLFLOW_TRACKING_URI``) points it at a server instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars2.config import RunConfig
from stagekit.stage import StageRecord

ARTEFACTS_TO_LOG = ("trees.parquet", "verdicts.parquet", "results.parquet", "rejected.parquet", "summary.json",
                    "trees.png", "samples.parquet", "eval_trees.parquet", "by_difficulty.png", "attempts.parquet",
                    "gate.parquet", "refine_outcomes.parquet", "gate.md")


def tracking_uri(cfg: RunConfig) -> str:
    return cfg.paths.mlflow_uri or f"sqlite:///{Path(cfg.paths.root).resolve() / 'mlflow.db'}"


def _client(uri: str) -> RetryingClient:
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        seed_sqlite_store(Path(uri.removeprefix("sqlite:///")))
    return RetryingClient(MlflowClient(tracking_uri=uri))


# what a store says when another run's write collided with this one (SQLite, Postgres): the write can be made again
WRITE_CONFLICTS = ("UNIQUE constraint failed", "duplicate key value violates unique constraint", "database is locked")


def write_conflict(error: BaseException) -> bool:
    """``error`` (or an exception it was raised from) is a concurrent write's collision, not a lasting refusal: a
    name that already exists (``RESOURCE_ALREADY_EXISTS``) is a lasting one."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "error_code", None) == "RESOURCE_ALREADY_EXISTS":
            return False
        if any(marker in str(seen) for marker in WRITE_CONFLICTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RetryingClient:
    """An ``MlflowClient`` whose every call is made again, after a short random wait, when it collides with another
    run's write to the same store (two sweep points logging the same dataset at once, SQLite's write lock): each store
    call is one transaction, so a collided call wrote nothing and repeating it is safe. Other errors pass through."""

    ATTEMPTS = 8

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            import random

            for attempt in range(self.ATTEMPTS):
                try:
                    return attr(*args, **kwargs)
                except Exception as e:
                    if attempt == self.ATTEMPTS - 1 or not write_conflict(e):
                        raise
                    time.sleep(0.02 * 2**attempt * (1 + random.random()))

        return call


def seed_sqlite_store(db: Path) -> None:
    """Give a new run folder an empty MLflow database copied from a per-user template instead of letting MLflow
    create one: creating it replays every schema migration in each new run folder, the copy is one file copy. The
    template (``~/.cache/mars2/mlflow-<version>.db``) is made once by MLflow itself, so it is the schema this MLflow
    version expects; its ``Default`` experiment is pointed into the run folder."""
    import shutil
    import tempfile

    import mlflow

    from pipeline.shims.mlflow_store import point_default_experiment

    if db.exists():
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mars2"
    template = cache / f"mlflow-{mlflow.__version__}.db"
    if not template.exists():
        from mlflow.tracking import MlflowClient

        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            fresh = Path(tmp) / "template.db"
            MlflowClient(tracking_uri=f"sqlite:///{fresh}").search_experiments()
            os.replace(fresh, template)  # atomic: a concurrent run sees no template or a whole one
    db.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=db.parent, prefix=f".{db.name}.", delete=False) as tmp:
        part = Path(tmp.name)
    shutil.copyfile(template, part)
    part.chmod(0o644)
    point_default_experiment(part, (db.parent / "mlartifacts" / "0").as_uri())
    try:
        os.link(part, db)  # never replaces: a database another process of this run folder created first stays
    except FileExistsError:
        pass
    finally:
        part.unlink()


def client(cfg: RunConfig):
    """An MLflow client on the run's tracking store."""
    return _client(tracking_uri(cfg))


def start_run(cfg: RunConfig, config: dict[str, Any], config_yaml: str, *, flow_run_id: str, run_name: str,
              kind: str = "train", parent_run_id: str | None = None, label: str = "",
              tags: dict[str, str] | None = None) -> str:
    """Create the MLflow run of this flow run; log the resolved config as flattened params and as YAML.

    Tags: ``mars2.kind`` (train | evaluate | study | compare), ``mars2.agents``, ``mars2.paradigm``, ``mars2.overrides``
    (``label``: what makes the run differ from its preset, also in its description), ``mlflow.parentRunId`` when the
    run belongs to a study (MLflow's UI nests it under the parent), and ``tags`` (e.g. ``mars2.sweep``).
    """
    from mlflow.entities import Param

    client = _client(tracking_uri(cfg))
    exp_id = experiment_id(cfg)
    tags = {"prefect.flow_run_id": flow_run_id, "mars2.agents": cfg.agents.preset,
            "mars2.paradigm": cfg.agents.paradigm, "mars2.kind": kind, **source_tags(),
            "mlflow.note.content": describe(cfg, kind, label), CONFIG_TAG: config_fingerprint(config),
            "mars2.overrides": label or "(none)"} | (tags or {})
    tags |= {f"mars2.{k}": str(v) for k, v in cfg.paths.tags.items()}
    parent_run_id = parent_run_id or cfg.paths.parent_run
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(exp_id, run_name=run_name, tags=tags | owner_tags())
    # debug.* (an injected fault) is not part of the command: a resumed run must not carry the failed attempt's
    params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(config).items()) if not k.startswith("debug.")]
    for i in range(0, len(params), 100):
        client.log_batch(run.info.run_id, params=params[i : i + 100])
    client.log_text(run.info.run_id, config_yaml, "config.yaml")
    return run.info.run_id


EXPERIMENT_KIND = "mlflow.experimentKind"
CONFIG_TAG = "mars2.config_hash"


def experiment_id(cfg: RunConfig) -> str:
    """The id of ``paths.experiment``, created on first use as a model-training experiment (MLflow's UI then opens it
    on runs and charts, not on its GenAI traces view)."""
    uri = tracking_uri(cfg)
    client = _client(uri)
    exp = client.get_experiment_by_name(cfg.paths.experiment)
    if exp is not None:
        return exp.experiment_id
    location = (Path(cfg.paths.root).resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite") else None
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(cfg.paths.experiment, artifact_location=location,
                                        tags={EXPERIMENT_KIND: "custom_model_development"})
    except MlflowException as e:  # another run of a sweep created it meanwhile
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(cfg.paths.experiment).experiment_id


def config_fingerprint(config: dict[str, Any]) -> str:
    """What makes two invocations "the same command": the resolved config without its ``debug`` section (a fault
    injected on purpose, then the same command without it, is one run). sha256, 16 hex digits."""
    import hashlib
    import json

    payload = json.dumps({k: v for k, v in config.items() if k != "debug"}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def latest_run_of(cfg: RunConfig, fingerprint: str, kind: str):
    """The most recent MLflow run of this config and kind in the experiment, or None."""
    client = _client(tracking_uri(cfg))
    runs = client.search_runs([experiment_id(cfg)], max_results=1, order_by=["attributes.start_time DESC"],
                              filter_string=f"tags.`{CONFIG_TAG}` = '{fingerprint}' and tags.`mars2.kind` = '{kind}'")
    return runs[0] if runs else None


@dataclass
class TrackedRun:
    """The flow run's MLflow run, so that re-running a command neither scatters nor duplicates runs:

    - the latest earlier run of the same config failed (or was killed), or still says RUNNING but its process on this
      host is gone (``kill -9``: :func:`abandoned`): that run is **resumed** — status RUNNING, its params kept, the new
      attempt's stages logged into it;
    - it finished: the new run is **created only when a stage actually runs** (:meth:`needed`); when every stage
      came from cache nothing is logged and :attr:`id` stays the earlier run's (:attr:`reused`);
    - otherwise (none, or one still running): a new run at once.

    Every logging call goes through :meth:`log`, which runs it now or, while the run is deferred, when it is created.
    """

    create: Callable[[], str]
    id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # the run's, at creation; the reused run's too (mars2.sweep)
    resumed: bool = False
    previous: str | None = None
    pending: list[Callable[[str], None]] = field(default_factory=list)

    @property
    def deferred(self) -> bool:
        return self.id is None

    @property
    def reused(self) -> str | None:
        """The earlier finished run a fully cached re-run stands for (None once this run logged anything)."""
        return self.previous if self.deferred else None

    def log(self, fn: Callable[[str], None]) -> None:
        if self.id is None:
            self.pending.append(fn)
        else:
            fn(self.id)

    def has_stage(self, cfg: RunConfig, prefix: str, step: int) -> bool:
        """A resumed run already holds this stage's metrics at this step (logged by the failed attempt, when the stage
        ran): a cached stage is then not logged twice."""
        if not self.resumed or self.id is None:
            return False
        history = _client(tracking_uri(cfg)).get_metric_history(self.id, f"{prefix}/seconds")
        return any(m.step == step for m in history)

    def log_params(self, cfg: RunConfig, params: dict[str, Any]) -> None:
        """Params of a new run (a resumed run keeps the ones it has: MLflow refuses to change a param)."""
        if not self.resumed:
            self.log(lambda run_id: log_params(cfg, run_id, params))

    def needed(self) -> str:
        """Create the deferred run now and log what was waiting; returns its id."""
        if self.id is None:
            self.id = self.create()
            pending, self.pending = self.pending, []
            for fn in pending:
                fn(self.id)
        return self.id


OWNER_TAGS = ("mars2.host", "mars2.pid", "mars2.pid_start")  # the process a RUNNING run belongs to


def owner_tags() -> dict[str, str]:
    """This process as the owner of a run: host, pid and the pid's start time (a later process may reuse the pid)."""
    import socket

    return dict(zip(OWNER_TAGS, (socket.gethostname(), str(os.getpid()), str(process_start(os.getpid()))),
                    strict=True))


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat``), None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def abandoned(run) -> bool:
    """A RUNNING run whose process is gone: it was started on this host by a process that no longer exists (killed
    with ``kill -9``, its machine restarted). A run of another host, or one without owner tags, is not judged."""
    import socket

    tags = run.data.tags
    if run.info.status != "RUNNING" or tags.get("mars2.host") != socket.gethostname() or "mars2.pid" not in tags:
        return False
    return str(process_start(int(tags["mars2.pid"]))) != tags.get("mars2.pid_start")


def open_run(cfg: RunConfig, config: dict[str, Any], config_yaml: str, *, flow_run_id: str, run_name: str,
             kind: str = "train", label: str = "", tags: dict[str, str] | None = None) -> TrackedRun:
    """The :class:`TrackedRun` of this flow run (see there for resume / defer / create); ``label`` and ``tags`` as
    :func:`start_run`'s, ``tags`` also set on a run this one resumes or reuses."""
    tags = dict(tags or {})

    def create() -> str:
        return start_run(cfg, config, config_yaml, flow_run_id=flow_run_id, run_name=run_name, kind=kind, label=label,
                         tags=tags)

    before = latest_run_of(cfg, config_fingerprint(config), kind)
    status = before.info.status if before is not None else None
    if status in ("FAILED", "KILLED") or (before is not None and abandoned(before)):
        run_id = before.info.run_id
        _client(tracking_uri(cfg)).update_run(run_id, status="RUNNING")
        set_tags(cfg, run_id, {"prefect.flow_run_id": flow_run_id, **owner_tags(), **tags,
                               "mars2.resumed": str(int(before.data.tags.get("mars2.resumed", "0")) + 1)})
        return TrackedRun(create, id=run_id, resumed=True, tags=tags)
    if status == "FINISHED":
        return TrackedRun(create, previous=before.info.run_id, tags=tags)
    return TrackedRun(create, id=create(), tags=tags)


def source_tags() -> dict[str, str]:
    """MLflow's source tags: the entry point (``sys.argv[0]``) and, in a git checkout, the commit it ran."""
    import subprocess
    import sys

    tags = {"mlflow.source.type": "LOCAL", "mlflow.source.name": Path(sys.argv[0]).name if sys.argv[0] else "python"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                                capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            tags["mlflow.source.git.commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return tags


def describe(cfg: RunConfig, kind: str, label: str = "") -> str:
    """The run's one-paragraph description (MLflow shows it on the run page and in its run list): what it varies
    first (``label``, the overrides of its preset), then what it is."""
    data = cfg.data.source + (f" → eval on {cfg.data.eval_source}" if cfg.data.split == "source" else "")
    return (f"{'overrides: ' + label if label else 'the preset as it is'}. "
            f"mars2 {kind}: agents={cfg.agents.preset} ({cfg.agents.paradigm}, "
            f"{', '.join(m.name for m in cfg.agents.members)}), search={cfg.search.strategy} "
            f"({cfg.search.max_nodes} nodes), data={data}, {cfg.train.cycles} cycle(s).")


def log_datasets(cfg: RunConfig, run_id: str, dataset: StageRecord) -> None:
    """The data stage's train and eval splits as MLflow dataset inputs (name, digest = the split's content hash,
    row counts, schema), so the run page lists what it trained and was evaluated on."""
    import warnings

    import mlflow.data
    import pandas as pd
    from mlflow.entities import DatasetInput, InputTag

    warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
    inputs = []
    for split, digest in (("train", dataset.meta.get("train_hash")), ("eval", dataset.meta.get("eval_hash"))):
        frame = pd.read_parquet(dataset.path(f"{split}.parquet"), columns=["id", "platform", "difficulty",
                                                                             "contest_date"])
        ds = mlflow.data.from_pandas(frame, source=str(dataset.path(f"{split}.parquet")),
                                     name=f"{cfg.data.source if split == 'train' else cfg.data.eval_source or cfg.data.source}-{split}",
                                     digest=(digest or dataset.key)[:36])
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", split)]))
    _client(tracking_uri(cfg)).log_inputs(run_id, datasets=inputs)


def log_params(cfg: RunConfig, run_id: str, params: dict[str, Any]) -> None:
    """Extra run facts as params (e.g. the sandbox isolation level detected at start-up)."""
    from mlflow.entities import Param

    _client(tracking_uri(cfg)).log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())])


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'l': [{'x': 2}]} → {'a.b': 1, 'l.0.x': 2}: stable, dotted param names."""
    out: dict[str, Any] = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, (dict, list)) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def log_stage(cfg: RunConfig, run_id: str, record: StageRecord, *, step: int, prefix: str | None = None,
              facts: bool = False) -> None:
    """Metrics as ``<prefix>/<name>`` at ``step`` (= cycle) — with ``facts`` (a stage whose numbers, such as dataset
    counts or parameter counts, describe the run and never move) params of those names instead, so that the metrics
    are the numbers that move — and ``<prefix>/seconds`` (``prefix``: the stage's label, else its name); its tables
    as artefacts under ``cycle_<step>/<stage>/`` (``before/<stage>/`` for step -1: the evaluation of the starting
    weights), each Parquet table with a CSV preview beside it (:func:`preview_csv`)."""
    from mlflow.entities import Metric, Param

    client = _client(tracking_uri(cfg))
    now = int(time.time() * 1000)
    name = prefix or record.stage
    metrics = [] if facts else [Metric(f"{name}/{k}", float(v), now, step) for k, v in record.metrics.items()]
    metrics.append(Metric(f"{name}/seconds", record.seconds, now, step))
    params = [Param(f"{name}/{k}", f"{v:g}") for k, v in record.metrics.items()] if facts else []
    for i in range(0, max(len(metrics), len(params)), 100):
        client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100])
    folder = f"{cycle_folder(step)}/{record.stage}"
    for f in record.files:
        if Path(f).name in ARTEFACTS_TO_LOG:
            client.log_artifact(run_id, str(record.path(f)), artifact_path=folder)
            if f.endswith(".parquet"):
                log_preview(client, run_id, record.path(f), folder)


PREVIEW_ROWS, PREVIEW_CHARS = 2000, 200


def preview_csv(table: Path, out: Path) -> Path:
    """``out/<name>.csv``: the first :data:`PREVIEW_ROWS` rows of a Parquet table as CSV, the MLflow UI's table preview
    (it shows none for Parquet); text longer than :data:`PREVIEW_CHARS` characters is cut (…), and columns of token
    ids or log-probs are left out. The Parquet file beside it is the data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(table)
    flat = [f.name for f in source.schema_arrow if not pa.types.is_nested(f.type) and not pa.types.is_binary(f.type)]
    batch = next(source.iter_batches(batch_size=PREVIEW_ROWS, columns=flat), None)
    frame = (batch.to_pandas() if batch is not None else source.schema_arrow.empty_table().select(flat).to_pandas())
    for c in frame.select_dtypes(include=["object", "string"]).columns:
        frame[c] = frame[c].map(lambda v: v[:PREVIEW_CHARS] + "…" if isinstance(v, str) and len(v) > PREVIEW_CHARS else v)
    path = out / f"{table.stem}.csv"
    frame.to_csv(path, index=False)
    return path


def log_preview(client, run_id: str, table: Path, artifact_path: str | None) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        client.log_artifact(run_id, str(preview_csv(table, Path(tmp))), artifact_path=artifact_path)


def cycle_folder(cycle: int) -> str:
    return f"cycle_{cycle}" if cycle >= 0 else "before"


def log_metrics(cfg: RunConfig, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """Run-level figures (``engine_starts``): one value each."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    if metrics:
        _client(tracking_uri(cfg)).log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def log_json(cfg: RunConfig, run_id: str, obj: Any, artifact_file: str) -> None:
    _client(tracking_uri(cfg)).log_dict(run_id, obj, artifact_file)


def log_table(cfg: RunConfig, run_id: str, path: Path, artifact_path: str = "") -> None:
    """A file as an artefact; a Parquet table with its CSV preview (:func:`preview_csv`)."""
    client = _client(tracking_uri(cfg))
    client.log_artifact(run_id, str(path), artifact_path=artifact_path or None)
    if path.suffix == ".parquet":
        log_preview(client, run_id, path, artifact_path or None)


def log_text(cfg: RunConfig, run_id: str, text: str, artifact_file: str) -> None:
    _client(tracking_uri(cfg)).log_text(run_id, text, artifact_file)


def set_tags(cfg: RunConfig, run_id: str, tags: dict[str, str]) -> None:
    client = _client(tracking_uri(cfg))
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


UI_URL_ENV = "MARS2_MLFLOW_UI_URL"  # where people open the MLflow UI, when the tracking URI is not it (docs/team.md)


def run_link(cfg: RunConfig, run_id: str | None) -> str:
    """The run's page in the MLflow UI: under ``$MARS2_MLFLOW_UI_URL``, else the tracking server, else
    ``http://127.0.0.1:5000`` (``mlflow ui`` on a SQLite store). MLflow 3's UI opens in its GenAI view unless the URL
    asks for the model-training one."""
    uri = tracking_uri(cfg)
    base = os.environ.get(UI_URL_ENV) or (uri if uri.startswith("http") else "http://127.0.0.1:5000")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id(cfg)}/runs/{run_id}?workflowType=machine_learning"


def end_run(cfg: RunConfig, run_id: str, status: str) -> None:
    _client(tracking_uri(cfg)).set_terminated(run_id, status=status)


FINAL_WEIGHTS = "final_weights.json"


TREE_VIEWS = 4  # trees drawn per cycle, one image each


def log_tree_views(cfg: RunConfig, run_id: str, trees: StageRecord, verdicts: StageRecord, routed: StageRecord,
                   cycle: int) -> None:
    """``cycle_<c>/trees/<problem>.png`` for the cycle's first :data:`TREE_VIEWS` trees: each node's agent, hidden
    verdict, reward and advantage (:func:`mars2.search.tree_stats.plot_tree`)."""
    import tempfile

    import pandas as pd

    from mars2.search.tree_stats import plot_tree

    nodes = pd.read_parquet(trees.path("trees.parquet"), columns=["problem_id", "node_id", "parent", "agent"])
    first = list(dict.fromkeys(nodes["problem_id"]))[:TREE_VIEWS]
    nodes = nodes[nodes["problem_id"].isin(first)]
    hidden = pd.read_parquet(verdicts.path("verdicts.parquet"), columns=["problem_id", "node_id", "status", "reward"])
    parts = [pd.read_parquet(routed.path(f), columns=["problem_id", "node_id", "advantage"])
             for f in routed.files if f.startswith("routed/")]
    advantage = pd.concat(parts) if parts else pd.DataFrame(columns=["problem_id", "node_id", "advantage"])
    table = nodes.merge(hidden, on=["problem_id", "node_id"], how="left").merge(
        advantage, on=["problem_id", "node_id"], how="left")
    client = _client(tracking_uri(cfg))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (pid, tree) in enumerate(table.groupby("problem_id", sort=False)):
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(pid))
            image = plot_tree(tree, Path(tmp) / f"{i}_{safe}.png", f"cycle {cycle} · problem {pid}")
            client.log_artifact(run_id, str(image), artifact_path=f"{cycle_folder(cycle)}/trees")


def log_final_model_dirs(cfg: RunConfig, run_id: str, model_dirs: dict[str, str]) -> None:
    """The run's last weights per owner (absolute folders): what ``flows/evaluate.py eval.from_run=<id>`` loads."""
    log_json(cfg, run_id, model_dirs, FINAL_WEIGHTS)


def final_model_dirs(cfg: RunConfig, run_id: str) -> dict[str, str]:
    """``{owner: model folder}`` logged by a finished train-cycle run; a clear error for any other run."""
    import json
    import tempfile

    from mlflow.exceptions import MlflowException

    from stagekit.checkpoint_checks import CheckpointError

    client = _client(tracking_uri(cfg))
    try:
        client.get_run(run_id)
    except MlflowException:
        raise CheckpointError(f"eval.from_run={run_id}: no such MLflow run at {tracking_uri(cfg)}") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, FINAL_WEIGHTS, tmp)
        except (MlflowException, OSError):
            raise CheckpointError(f"eval.from_run={run_id}: the run has no {FINAL_WEIGHTS} (only a train-cycle run "
                                  "that finished logs its final weights)") from None
        return json.loads(Path(path).read_text())


def metric_history(cfg: RunConfig, run_id: str, name: str) -> list[tuple[int, float]]:
    """``[(step, value), ...]`` of one metric of a run, by step (the cycle for stage metrics)."""
    history = _client(tracking_uri(cfg)).get_metric_history(run_id, name)
    return sorted((int(m.step), float(m.value)) for m in history)

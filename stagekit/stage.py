"""What every stage task shares: its cache key, its content-addressed folder, its small result record.

A stage's cache key is sha256 of (stage name, code version, its parameters except ``ctx``), where
config subtrees enter as plain dicts (without the fields marked ``metadata={"cache_key": False}``) and upstream
stages enter as their records' keys and file fingerprints (:func:`mars2.io.file_fingerprint`). The
artefact folder is ``<root>/artifacts/<stage>/<key[:16]>``, and that folder is the stage's one cache: its
``MANIFEST.json`` holds the record (paths + hashes + metrics + the weights it hands on), so the cache survives a
process restart, and Prefect keeps no result of its own (:func:`stage_task`). A finished folder is reused only as it
was written: one whose artefacts no longer match the fingerprints in its ``MANIFEST.json`` (edited, truncated,
deleted) is moved aside under a name that says so, a warning names the files, and the stage runs again.

Weights travel between stages as :class:`AgentWeights` per weight owner in :attr:`StageRecord.weights`
(agents, bootstrap, checkpoints and update records), read through :meth:`StageRecord.weights_of`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from mars2.config import GradingConfig
from mars2.cpu import CpuShares, cpu_budget, split_cpus
from mars2.io import atomic_dir, atomic_write_json, file_fingerprint, folder_fingerprints, sha256_json
from mars2.train.checkpoints import PRUNED

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
CODE_VERSION_SALT = "1"  # bump to invalidate every cache after a change the module hashes cannot see


class StageFault(RuntimeError):
    """Raised by ``debug.fail_at`` fault injection (tests of the re-run path)."""


@dataclass(frozen=True)
class StageContext:
    """Run-specific facts a stage needs but that must not enter its cache key."""

    root: str
    flow_run_id: str = ""
    fail_at: str | None = None
    progress_every_s: float = 30.0  # not on a terminal: a plain progress line per stage this often (0: none)
    cpus: int = 0  # the run's CPU budget (mars2.cpu.cpu_budget: 0 is the usable cores of the machine running a stage)
    # weight owner -> the work pool of the node its engines and update run on (orchestration.node_pools); empty: the
    # run's engines all run on the node of the stage that generates
    engine_pools: dict[str, str] = field(default_factory=dict)
    # weight owner -> the ranks of every update that runs at the same time on its node, its own included (pools mode:
    # a cycle's updates run at once); empty: an update has its node's cores to itself (local mode: one at a time)
    node_update_ranks: dict[str, int] = field(default_factory=dict)
    # the plan's GPU memory (plan.gpu_memory_gb, GiB): each GPU stage's worker checks its GPUs hold it (pools mode: the
    # flow's machine could not); None: no check
    gpu_memory_gb: float | None = None
    # the run's generation engines on this machine (a stagekit.engines.EnginePool, opened by the flow or the stage flow
    # run; it never leaves the process); None: every backend is loaded fresh
    engines: Any = field(default=None, compare=False, repr=False)

    def cpu_shares(self, *, engines: int = 1, update_ranks: int = 1) -> CpuShares:
        """The run's CPU budget on the machine running this stage, split among its processes (mars2/cpu.py)."""
        return split_cpus(cpu_budget(self.cpus), engines=engines, update_ranks=update_ranks)

    def grading(self, grading: GradingConfig) -> GradingConfig:
        """``grading`` with its sandbox slots ``workers`` = 0 (one per core) bounded by the run's CPU budget."""
        return grading if grading.workers else dataclasses.replace(grading, workers=self.cpu_shares().sandbox)


@dataclass(frozen=True)
class AgentWeights:
    """One weight owner's state as a stage hands it on.

    ``model_dir``: a complete HF model folder (config, generation config, tokenizer files, safetensors) that
    ``from_pretrained`` and vLLM load alone; ``tokenizer_dir``: the agent's tokenizer folder (its files are the ones
    copied into every model folder); ``optimizer_dir``: the DeepSpeed checkpoint (optimizer, scheduler, RNG) the next
    update resumes from, None before the first update; ``buffer``: Parquet of samples carried to the next update.
    Paths are absolute, or relative to the folder of the record that holds them (:meth:`StageRecord.weights_of`).
    """

    model_dir: str
    tokenizer_dir: str
    optimizer_dir: str | None = None
    buffer: str | None = None

    def resolved(self, base: str | Path) -> AgentWeights:
        """The same weights with every relative path made absolute against ``base``."""
        def at(path: str | None) -> str | None:
            return path if path is None or Path(path).is_absolute() else str(Path(base) / path)

        return AgentWeights(model_dir=at(self.model_dir), tokenizer_dir=at(self.tokenizer_dir),
                            optimizer_dir=at(self.optimizer_dir), buffer=at(self.buffer))


@dataclass(frozen=True)
class StageRecord:
    """The small thing a stage hands on, kept in its folder's ``MANIFEST.json``: where its artefacts are, their
    fingerprints, its metrics, and the weights it hands on per owner (``weights``; empty for stages that produce
    none)."""

    stage: str
    key: str
    dir: str
    files: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    flow_run_id: str = ""
    seconds: float = 0.0
    weights: dict[str, AgentWeights] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # MANIFEST.json and the pools-mode dispatch files hold plain dicts
        object.__setattr__(self, "weights", {o: w if isinstance(w, AgentWeights) else AgentWeights(**w)
                                             for o, w in self.weights.items()})

    def path(self, name: str) -> Path:
        if name not in self.files:
            raise KeyError(f"stage {self.stage} has no artefact {name!r}; it has {sorted(self.files)}")
        return Path(self.dir) / name

    def resolve(self, path: str) -> str:
        """A path from ``meta``: absolute as is, relative to this stage's folder otherwise."""
        return path if Path(path).is_absolute() else str(Path(self.dir) / path)

    def weights_of(self, owner: str) -> AgentWeights:
        """``owner``'s weights with absolute paths."""
        if owner not in self.weights:
            raise KeyError(f"stage {self.stage} hands on no weights of {owner!r}; it has {sorted(self.weights)}")
        return self.weights[owner].resolved(self.dir)


@functools.cache
def code_version(modules: tuple[str, ...]) -> str:
    """Digest of the source of ``modules`` (packages: every .py file under them)."""
    h = hashlib.sha256(CODE_VERSION_SALT.encode())
    for name in modules:
        origin = _source_file(name)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for f in files:
            h.update(str(f.relative_to(origin.parents[1] if origin.name == "__init__.py" else origin.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _source_file(name: str) -> Path:
    """``name``'s source file (``__init__.py`` for a package) found without importing it: ``find_spec`` of a dotted
    name imports its parent packages, and a cached stage's key must not cost a torch import."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise ImportError(f"cannot hash code of {name}")
    if not rest:
        return Path(spec.origin)
    base = Path(spec.origin).parent.joinpath(*rest)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    raise ImportError(f"cannot hash code of {name}: no {base}.py or {base}/__init__.py")


def _keyable(value: Any) -> Any:
    if isinstance(value, StageRecord):
        # key and files: a record that only points at other weights (a skipped update) differs by its key
        return {"stage": value.stage, "key": value.key, "files": value.files}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # fields that only say how to run (e.g. train.keep_optimizer_states) do not change what a stage makes
        return {f.name: _keyable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.metadata.get("cache_key", True)}
    if isinstance(value, dict):
        return {str(k): _keyable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_keyable(v) for v in value]
    return value


def narrowed(value: Any, reads: tuple[str, ...]) -> Any:
    """``value`` (a config dataclass, or a list of them) with every field not in ``reads`` at its default.

    A stage keys on the narrowed configs of what it declares it reads (``reads`` of :func:`run_stage`): a change to a
    field it does not read leaves its key, so its cache, as it was. A field without a default stays. It computes from
    :func:`declared` configs, where such a field cannot be used."""
    if isinstance(value, (list, tuple)):
        return type(value)(narrowed(v, reads) for v in value)
    unread = {}
    for f in dataclasses.fields(value):
        if f.name in reads or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            unread[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            unread[f.name] = f.default_factory()
    return dataclasses.replace(value, **unread)


class UndeclaredRead(RuntimeError):
    """A stage used a config field it does not declare in its declaration's ``reads``."""


class Undeclared:
    """The value a stage sees for a config field it does not declare (:func:`declared`): copied along with its
    config, but any use of it (a comparison, truth, arithmetic, formatting, an attribute, iteration, pickling)
    raises :class:`UndeclaredRead` naming the field."""

    __slots__ = ("where",)

    def __init__(self, where: str):
        object.__setattr__(self, "where", where)

    def _use(self, *args, **kwargs):
        raise UndeclaredRead(f"{object.__getattribute__(self, 'where')} is used by a stage that does not declare it "
                             "in its reads (its DECLARATION in tasks/<stage>.py): declare it, so that it enters the "
                             "stage's cache key and a change to it is not computed from its default")

    def __getattr__(self, name):
        self._use()

    def __repr__(self) -> str:  # for a traceback's or debugger's view of the config, not a use
        return f"<undeclared {object.__getattribute__(self, 'where')}>"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _use
    __int__ = __float__ = __index__ = __len__ = __iter__ = __contains__ = __getitem__ = __call__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _use
    __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = __neg__ = __pos__ = __abs__ = _use
    __str__ = __format__ = __fspath__ = __reduce__ = __reduce_ex__ = _use


def declared(value: Any, reads: tuple[str, ...]) -> Any:
    """What a stage computes from: ``value`` (a config dataclass, or a list of them) with every field not in
    ``reads`` replaced by :class:`Undeclared`, so that a stage using a field it did not declare fails at once (it
    would otherwise compute from a value that its cache key does not see); fields outside every key by design
    (``metadata={"cache_key": False}``: how to run, not what to make) stay as given. Keys use :func:`narrowed`."""
    if isinstance(value, (list, tuple)):
        return type(value)(declared(v, reads) for v in value)
    guarded = copy.copy(value)  # not dataclasses.replace: no __post_init__ runs on the guards
    name = type(value).__name__
    for f in dataclasses.fields(value):
        if f.name not in reads and f.init and f.metadata.get("cache_key", True):
            object.__setattr__(guarded, f.name, Undeclared(f"{name}.{f.name}"))
    return guarded


def stage_digest(stage: str, modules: tuple[str, ...], parameters: dict[str, Any],
                 reads: dict[str, tuple[str, ...]] | None = None) -> str:
    """sha256 of the stage, its code and its parameters but ``ctx``, those named in ``reads`` :func:`narrowed`."""
    reads = reads or {}
    params = {k: _keyable(narrowed(v, reads[k]) if k in reads else v) for k, v in parameters.items() if k != "ctx"}
    return sha256_json({"stage": stage, "code": code_version(modules), "params": params})


def stage_dir(root: str | Path, stage: str, digest: str) -> Path:
    return Path(root) / "artifacts" / stage / digest[:16]


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def count(value: float | None) -> str:
    return str(int(value or 0))


def three_decimals(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class Column:
    """One column of a run's per-cycle table (``pipeline.report.cycle_table``): ``header`` over ``show(metric)``,
    the stage's metric ``metric`` (None where the stage did not report it in that cycle; ``metric`` None: the
    stage's whole metrics dict, empty where it did not run), ``legend`` under the table. A stage of one weight owner
    (``per_owner``) has its columns once per owner, ``{owner}`` in ``header`` and ``legend`` naming it."""

    header: str
    metric: str | None
    show: Callable[[Any], str]
    legend: str = ""


@dataclass(frozen=True)
class StageDeclaration:
    """Everything the pipeline knows of a stage, declared once in its ``tasks/<stage>.py``:

    - ``name``: its folder ``artifacts/<name>/``, its Prefect task, its key in ``orchestration.pools`` (where it runs
      with ``orchestration=pools``: ``conf/orchestration/pools.yaml``) and ``debug.fail_at``;
    - ``label``: what users see: its line in the run's output, its MLflow metrics ``<label>/<metric>`` (with a weight
      owner's stage, ``<label>/<owner>/<metric>``), its rows in ``cycle_<c>/summary.json``;
    - ``modules`` and ``reads``: its cache key's code and config fields (:func:`run_stage`);
    - ``columns``: its metrics in the per-cycle table; ``facts``: its metrics describe the run and never move (MLflow
      params, not metrics); ``generates``: it generates with every agent's engine; ``per_owner``: one weight
      owner's stage (on that owner's node when a run spans nodes).
    """

    name: str
    label: str
    modules: tuple[str, ...]
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)
    columns: tuple[Column, ...] = ()
    facts: bool = False
    generates: bool = False
    per_owner: bool = False


def run_declared(declaration: StageDeclaration, ctx: StageContext, parameters: dict[str, Any],
                 produce: Callable[..., dict[str, Any] | None], *, journaled: bool = False) -> StageRecord:
    """:func:`run_stage` of the stage ``declaration`` declares: its name, modules and reads."""
    return run_stage(declaration.name, declaration.modules, ctx, parameters, produce, declaration.reads or None,
                     journaled=journaled)


def stage_task(declaration: StageDeclaration, **options: Any) -> Callable[[Callable[..., StageRecord]], Any]:
    """The Prefect task of a stage function (first parameter ``ctx``; it returns :func:`run_stage`'s record), named
    after the stage ``declaration`` declares.

    The stage's folder is its only cache: Prefect computes no cache key and stores no result (``NO_CACHE``,
    ``persist_result=False``), so there is no second record to fall out of step with the files. A call whose folder
    was reused (:func:`came_from_cache`) ends in a Completed state named ``Cached``, as Prefect names its own cache
    hits, so the UI shows which stages ran; such a call returns that state, whose ``result()`` is the record
    (``pipeline.dispatch.LocalStage`` hands on the record). ``options``: further :func:`prefect.task` options
    (``task_run_name``).
    """

    def decorate(fn: Callable[..., StageRecord]):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any):
            record = fn(*args, **kwargs)
            if came_from_cache(record, signature.bind(*args, **kwargs).arguments["ctx"]):
                return Completed(name="Cached", data=record, message=f"reused {record.dir}")
            return record

        return task(name=declaration.name, cache_policy=NO_CACHE, persist_result=False, **options)(call)

    return decorate


def came_from_cache(record: StageRecord, ctx: StageContext) -> bool:
    """Whether a flow run other than this one (``ctx.flow_run_id``) made ``record``: its folder was reused."""
    return record.flow_run_id != ctx.flow_run_id


def run_stage(stage: str, modules: tuple[str, ...], ctx: StageContext, parameters: dict[str, Any],
              produce: Callable[..., dict[str, Any] | None],
              reads: dict[str, tuple[str, ...]] | None = None, *, journaled: bool = False) -> StageRecord:
    """Run ``produce(tmp_dir)`` into the stage's content-addressed folder and return its record.

    ``produce`` writes its files into the folder it is given and returns ``{"metrics": {...}, "meta": {...},
    "weights": {owner: AgentWeights}}`` (or None). If the folder already exists complete, it is reused as is:
    finished artefacts are never rewritten. ``files`` holds :func:`mars2.io.file_fingerprint` of every file (a full
    sha256 below 64 MiB, size and both ends above: a weight shard is not read end to end). With ``journaled``,
    ``produce(tmp_dir, journal)`` also gets the stage key's :class:`mars2.journal.Journal`, which outlives a
    killed run and is removed once the folder is complete.
    """
    digest = stage_digest(stage, modules, parameters, reads)
    final = stage_dir(ctx.root, stage, digest)
    from mars2.journal import Journal, journal_dir  # pyarrow: only when a stage runs

    if reusable(final, stage):
        if journaled:  # a run killed between its folder's rename and the journal's removal
            shutil.rmtree(journal_dir(final), ignore_errors=True)
        return StageRecord(**json.loads((final / MANIFEST).read_text()))
    if ctx.fail_at == stage:
        raise StageFault(f"fault injected in stage {stage!r} (debug.fail_at={stage})")
    start = time.perf_counter()
    journal = Journal(journal_dir(final), digest) if journaled else None
    with atomic_dir(final) as tmp, _unfinished(stage):
        out = (produce(tmp, journal) if journal is not None else produce(tmp)) or {}
        record = StageRecord(stage=stage, key=digest, dir=str(final), files=folder_fingerprints(tmp),
                             metrics={k: float(v) for k, v in out.get("metrics", {}).items()},
                             meta=out.get("meta", {}), weights=out.get("weights", {}), flow_run_id=ctx.flow_run_id,
                             seconds=round(time.perf_counter() - start, 3))
        atomic_write_json(tmp / MANIFEST, dataclasses.asdict(record))
    if journal is not None:
        journal.close()
    # another run may have finished the same folder first; then its files, not ours, are the artefact
    return StageRecord(**json.loads((final / MANIFEST).read_text()))


_UNFINISHED: dict[str, int] = {}  # stages started in this process and not finished (updates run side by side)
_UNFINISHED_LOCK = threading.Lock()


@contextlib.contextmanager
def _unfinished(stage: str):
    """``stage`` counts as unfinished from here until its block ends normally: a stage an error or a signal stopped
    stays unfinished (Prefect unwinds a flow run on SIGTERM before the process's own handler runs)."""
    with _UNFINISHED_LOCK:
        _UNFINISHED[stage] = _UNFINISHED.get(stage, 0) + 1
    yield
    with _UNFINISHED_LOCK:
        _UNFINISHED[stage] -= 1
        if not _UNFINISHED[stage]:
            del _UNFINISHED[stage]


def unfinished_stages() -> list[str]:
    """The stages this process started and did not finish (running, or stopped by an error or a signal)."""
    with _UNFINISHED_LOCK:
        return list(_UNFINISHED)


def altered_artefacts(folder: Path) -> list[str]:
    """The artefacts of a finished stage folder that differ from what its ``MANIFEST.json`` recorded, each as
    ``"<name> (modified|missing)"``; files the pipeline pruned on purpose (a :data:`PRUNED` note names their folder)
    and files added beside the recorded ones do not count."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MANIFEST} (unreadable)"]
    try:
        pruned = json.loads((folder / PRUNED).read_text())["optimizer_dir"] + "/"
    except (OSError, ValueError, KeyError, TypeError):
        pruned = None
    altered = []
    for name, fingerprint in files.items():
        path = folder / name
        if not path.is_file():
            if pruned is None or not name.startswith(pruned):
                altered.append(f"{name} (missing)")
        elif file_fingerprint(path) != fingerprint:
            altered.append(f"{name} (modified)")
    return altered


def reusable(folder: Path, stage: str) -> bool:
    """Whether a stage's folder is finished (``MANIFEST.json``) and every artefact in it is as the stage wrote it.
    A folder whose artefacts changed is moved to ``<folder>.altered-<unix time>`` with a warning naming them, so the
    stage runs again instead of handing them on."""
    if not (folder / MANIFEST).exists():
        return False
    altered = altered_artefacts(folder)
    if not altered:
        return True
    aside = folder.with_name(f"{folder.name}.altered-{int(time.time())}")
    try:
        folder.rename(aside)
    except FileNotFoundError:  # another run moved it first
        return False
    shown = ", ".join(altered[:5]) + (f" and {len(altered) - 5} more" if len(altered) > 5 else "")
    log.warning("stage %s: %s in %s no longer match the fingerprints its MANIFEST.json recorded; the folder is "
                "moved to %s and the stage runs again", stage, shown, folder, aside)
    return False


def current_parameters() -> dict[str, Any]:
    """The bound parameters of the running Prefect task (the dict its stage digest is computed from)."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is None:
        raise RuntimeError("run_stage must be called inside a Prefect task")
    return dict(ctx.parameters)


__all__ = ["AgentWeights", "Column", "StageContext", "StageDeclaration", "StageFault", "StageRecord",
           "altered_artefacts", "came_from_cache", "code_version", "count", "current_parameters", "declared",
           "narrowed", "percent", "reusable", "run_declared", "run_stage", "unfinished_stages", "sha256_json",
           "stage_digest", "stage_dir", "stage_task", "three_decimals"]

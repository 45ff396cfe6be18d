"""Hydra side of the configuration: schema registration, composition, one-time validation.

One code path: every entry point turns a list of Hydra command-line overrides into a validated
:class:`mars2.config.RunConfig` with :func:`compose_run` (= :func:`load_cfg`, Hydra's compose API, then
:func:`resolve`). The CLI's ``@hydra.main`` passes the overrides of its current job
(``HydraConfig.get().overrides.task``), a deployment passes its ``overrides`` parameter.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mars2.config import ConfigError, RunConfig, StudyConfig, check_gpus, validate

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

ConfigStore.instance().store(name="run_schema", node=RunConfig)
ConfigStore.instance().store(group="study", name="study_schema", node=StudyConfig)  # conf/study/*.yaml extend it


def register_roster_presets(path: Path = CONF_DIR / "roster" / "tiny_warm.yaml") -> list[str]:
    """Register each preset of a roster file as ``agents=<name>``, its members copied from the roster's agent blocks.

    A roster defines every agent block once for the presets that share it (Hydra cannot interpolate a block into a
    typed list element); a preset registered here is a whole experiment like the real-model ones: it also selects
    ``data=<roster data>`` and sets the roster's ``settings`` (sampling temperature, lengths); command-line overrides
    (``data=toy``, ``search.temperature=1.0``, ``agents.members.0.optimizer.lr=...``) still win.
    """
    roster = OmegaConf.load(path)
    for name, preset in roster.presets.items():
        node = {"defaults": [{"override /data": roster.data}, "_self_"], **roster.get("settings", {}),
                "agents": {"preset": name, "paradigm": preset.paradigm,
                           "members": [roster.agents[member] for member in preset.members]}}
        ConfigStore.instance().store(group="agents", name=name, node=node, package="_global_")
    return list(roster.presets)


ROSTER_PRESETS = [name for path in sorted((CONF_DIR / "roster").glob("*.yaml"))
                  for name in register_roster_presets(path)]


def deepspeed_profiles(conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """Every DeepSpeed profile in ``conf/deepspeed/``, by file stem."""
    return {p.stem: OmegaConf.to_container(OmegaConf.load(p)) for p in sorted((conf_dir / "deepspeed").glob("*.yaml"))}


def resolve(cfg: DictConfig, *, cuda_available: bool | None = None, planning: bool = False) -> RunConfig:
    """Typed, interpolation-free, validated config (raises :class:`ConfigError` with a readable message).

    ``planning=True`` (flows/plan.py) does not require the model folders or a GPU on this machine."""
    unknown = sorted(set(cfg.keys()) - set(RunConfig.__dataclass_fields__) - {"hydra"})
    if unknown:
        import difflib

        known = list(RunConfig.__dataclass_fields__)
        close = {k: m[0] for k in unknown if (m := difflib.get_close_matches(k, known, n=1))}
        hint = "".join(f" Did you mean {m!r} for {k!r}?" for k, m in close.items())
        raise ConfigError(f"unknown config key(s) {unknown}.{hint} Known top-level keys: {', '.join(known)}.")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
        merged.deepspeed_profiles = deepspeed_profiles()
        run: RunConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config value: {_first_line(e)}") from None
    run = validate(run, cuda_available=cuda_available, planning=planning)
    o = run.orchestration
    if o.pools or o.node_pools or run.debug.fail_at is not None:  # only then: the declarations import every stage
        from pipeline.stages import check_stage_names

        check_stage_names(o, run.debug.fail_at)
    return run


def compose_run(overrides: list[str] | tuple[str, ...] = (), *, config_name: str = "config",
                updates: bool = True, dispatch: bool = True, **resolve_kwargs: Any) -> RunConfig:
    """The run config of a list of Hydra overrides: what the CLI, a deployment and a sweep all run
    (``config_name``: ``config`` for training, ``evaluate`` for flows/evaluate.py).

    A run with agents on GPUs is placed by the plan (:func:`place_run`): each member's ``node`` and ``gpu_ids`` are
    where its engines and update run. It must fit the cluster ``plan`` describes (:func:`mars2.plan.require_fit`, the
    layout the trainer and engines really build): a preset the planner refuses stops here, before anything starts.
    ``updates=False`` (evaluation, the gate: no update) fits the engines alone, so such a run may take a smaller
    layout than its training would.
    ``dispatch=False`` (the evaluate and gate flows, whose stages all run in the flow's process): the agents must
    share a node, whatever ``orchestration.node_pools`` says."""
    run = resolve(load_cfg(overrides, config_name=config_name), **resolve_kwargs)
    if not dispatch and (run.orchestration.node_pools or any(m.node for m in run.agents.members)):
        raise ConfigError(f"{config_name}: this flow runs every stage in its own process, on one node, but the "
                          f"overrides place agents on several (orchestration.node_pools="
                          f"{list(run.orchestration.node_pools)}, agents' node). Drop orchestration.node_pools and "
                          "agents.members.N.node for it (the train flow is the one that runs on several nodes).")
    if not resolve_kwargs.get("planning") and any(m.device.startswith("cuda") for m in run.agents.members):
        run = place_run(run, updates=updates)
        if run.orchestration.mode != "pools":
            check_gpus(run.agents.members, gpu_memory_gb=run.plan.gpu_memory_gb)  # this machine runs every stage
    return run


VARY_TAG = "vary:"  # a flow run's Prefect tag vary:<key>: its sweep (or multirun) varies <key> across its points


def override_key(override: str) -> str:
    """The key an override sets (``train.kl_coef`` of ``+train.kl_coef=0.002``)."""
    return override.split("=", 1)[0].lstrip("+~")


def run_name(preset: str, overrides: list[str] | tuple[str, ...], varied: list[str] | tuple[str, ...] = ()) -> str:
    """A run's name: its preset, then what sets it apart: the overrides of the keys its sweep varies (``varied``,
    from the flow run's ``vary:<key>`` tags), else all of its :func:`override_label`; empty when the preset is run as
    it is (the caller names the run otherwise)."""
    label = override_label([o for o in overrides if override_key(o) in varied] if varied else overrides)
    return f"{preset} {label}" if label else ""


def override_label(overrides: list[str] | tuple[str, ...]) -> str:
    """What makes a run differ from its preset, in a stable short form: its Hydra overrides but the preset's own
    (``agents=...``, which the run's name says first), Hydra's settings (``hydra.*``) and injected faults
    (``debug.*``, not part of the command: the run that resumes a failed one carries the same label), in the order
    given, joined by spaces: ``train.kl_coef=0.002 train.seed=1``; empty for the preset as it is."""
    return " ".join(o for o in overrides if override_key(o) != "agents"
                    and not override_key(o).startswith(("hydra.", "debug.")))


def place_run(run: RunConfig, *, updates: bool = True) -> RunConfig:
    """``run`` placed by its plan (``mars2.plan.plan(run, updates=updates)``, :func:`mars2.plan.placement.place`),
    after :func:`mars2.plan.require_fit`. A model whose config.json only the GPU workers have (a custom model in ``orchestration=pools``)
    cannot be planned here: that run goes on unplaced (its engines and update take the worker's first GPUs), with a
    warning, unless it names node pools (a run on several nodes is placed by its plan or not at all). The plan's
    own warnings (e.g. ZeRO-3 on one GPU where ZeRO-2 fits) are logged too."""
    from mars2.plan import ModelConfigNotFound, plan, require_fit
    from mars2.plan.placement import place

    try:
        cp = plan(run, updates=updates)
    except ModelConfigNotFound as e:
        if run.orchestration.mode != "pools" or run.orchestration.node_pools:
            raise ConfigError(f"cannot plan the run: {e}") from None
        warn_in_flow_run(f"no resource plan at the flow's entry ({e}); the GPU workers check their own machines")
        return run
    if cp.fits and cp.chosen:
        warn_in_flow_run(f"plan: {cp.chosen}", level=logging.INFO)
    for agent in cp.agents:
        for w in agent.warnings:
            warn_in_flow_run(f"plan of {agent.name}: {w}")
    return place(run, require_fit(cp))


def warn_in_flow_run(message: str, level: int = logging.WARNING) -> None:
    """Log a message about the config (a warning unless ``level`` says otherwise) once per run: inside the flow run
    (which forwards it to the Prefect run's logs), not in the command line's check of the same config before the flow
    starts."""
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is not None:
        log.log(level, message)


def load_cfg(overrides: list[str] | tuple[str, ...] = (), *, config_name: str = "config") -> DictConfig:
    """Compose ``conf/`` with Hydra command-line style overrides (Hydra's compose API).

    Works inside a ``@hydra.main`` job too: the job's Hydra instance is set aside while composing and put back.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    outer = GlobalHydra.instance().hydra  # set inside a @hydra.main job
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        hint = next(filter(None, (override_hint(o) for o in overrides)), None)
        if hint is not None:
            raise ConfigError(hint) from None
        cause = f" ({_first_line(e.__cause__)})" if e.__cause__ is not None else ""
        raise ConfigError(f"bad override: {' '.join(str(e).split())}{cause}") from None
    finally:
        if outer is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(outer)


def group_options(group: str) -> list[str]:
    """The options of config group ``group``: ``conf/<group>/*.yaml`` and what the code registers there."""
    from hydra.core.config_store import ConfigStore

    files = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    try:
        stored = {name.removesuffix(".yaml") for name in ConfigStore.instance().list(group)}
    except OSError:
        stored = set()
    return sorted(files | stored)


def override_hint(override: str) -> str | None:
    """One paragraph for an override naming a key or group option that does not exist, with the closest valid
    names (``search.max_node=4`` → ``search.max_nodes``; ``agents=heterogenous_32b`` → ``heterogeneous_32b``);
    None when its key and option exist (or it adds keys: ``+a.b=...``)."""
    import difflib

    if "=" not in override or override.startswith(("+", "~")):
        return None
    key, value = override.split("=", 1)
    parts = key.split(".")
    if len(parts) == 1 and (CONF_DIR / key).is_dir() and "," not in value:
        options = group_options(key)
        if value in options:
            return None
        close = difflib.get_close_matches(value, options, n=1)
        return (f"{key}={value}: no such option in config group {key!r}"
                + (f"; did you mean {key}={close[0]}?" if close else ".") + f" Options: {', '.join(options)}.")
    node: Any = OmegaConf.structured(RunConfig)
    for depth, part in enumerate(parts):
        if OmegaConf.is_list(node) and part.isdigit() and dataclasses.is_dataclass(node._metadata.element_type):
            node = OmegaConf.structured(node._metadata.element_type)  # agents.members.<i>: any element's schema
            continue
        fields = list(node.keys()) if OmegaConf.is_dict(node) else []
        if part in fields:
            node = node[part]
            continue
        if not fields or _open_dict(node):
            return None  # a free-form mapping (deepspeed profiles, chat_template_kwargs) or a list's element
        where = ".".join(parts[:depth]) or "the run config"
        close = difflib.get_close_matches(part, fields, n=1)
        prefix = ".".join(parts[:depth] + [close[0]]) if close else None
        return (f"{key}: no key {part!r} in {where}" + (f"; did you mean {prefix}?" if prefix else ".")
                + f" Keys of {where}: {', '.join(fields)}.")
    return None


def _open_dict(node: Any) -> bool:
    """A mapping whose keys are free (``dict[str, Any]`` in the schema), not a structured config's fields."""
    return OmegaConf.is_dict(node) and OmegaConf.get_type(node) is dict


def to_container(cfg: RunConfig | DictConfig) -> dict[str, Any]:
    """Plain dict of a config (for hashing, MLflow params and YAML artefacts)."""
    node = OmegaConf.structured(cfg) if isinstance(cfg, RunConfig) else cfg
    return OmegaConf.to_container(node, resolve=True)


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    key = next((ln for ln in lines if ln.startswith("full_key:")), "")
    return f"{lines[0]} ({key})" if key else lines[0]

"""The schema is the one home of every default: each config field is documented where it is declared, and no file
under conf/ repeats a value the dataclass already gives."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import yaml

import mars2.config as schema
from mars2.config import AgentConfig, RunConfig, StudyConfig
from pipeline.config import CONF_DIR

GROUPS = ("agents", "backend", "data", "eval", "orchestration", "plan", "search", "train")  # RunConfig fields


def undocumented_fields(source: str) -> list[str]:
    """``Class.field`` of every dataclass field in ``source`` not followed by a docstring (PEP 257 attribute docstring)."""
    tree = ast.parse(source)
    missing = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        if not any(getattr(d, "id", None) == "dataclass" for d in cls.decorator_list):
            continue
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                following = body[i + 1] if i + 1 < len(body) else None
                documented = (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                              and isinstance(following.value.value, str) and following.value.value.strip())
                if not documented:
                    missing.append(f"{cls.name}.{node.target.id}")
    return missing


def repeated_defaults(values: dict, cls: type, where: str, base: dict | None = None) -> list[str]:
    """The keys of ``values`` (a YAML mapping for dataclass ``cls``) whose value equals what they would be without
    them: the dataclass default, or ``base``'s value where a group file the preset selects sets one. Nested
    dataclasses, lists of them (agents.members) and dicts of them (study.controls) are checked element by element."""
    base = base or {}
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    found = []
    for key, value in values.items():
        if key == "defaults" or key not in by_name:
            continue
        path, f, hint = f"{where}.{key}", by_name[key], hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            found += repeated_defaults(value, hint, path, base.get(key))
            continue
        inner = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        if inner and isinstance(value, (list, dict)):
            items = enumerate(value) if isinstance(value, list) else value.items()
            found += [r for k, v in items if isinstance(v, dict) for r in repeated_defaults(v, inner[0], f"{path}.{k}")]
            continue
        if isinstance(value, str) and "${" in value:
            continue
        before = base.get(key, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if value == before and isinstance(value, bool) == isinstance(before, bool):
            found.append(f"{path}={value!r}")
    return found


def selected_groups(values: dict) -> dict:
    """What the group files a preset selects (``override /search: paper``) set, by group."""
    picked = [d for d in values.get("defaults", []) if isinstance(d, dict)]
    return {key.split("/")[-1]: yaml.safe_load((CONF_DIR / key.split("/")[-1] / f"{option}.yaml").read_text()) or {}
            for d in picked for key, option in d.items() if key.startswith("override /")}


def group_files() -> list[Path]:
    return sorted(p for group in (*GROUPS, "study") for p in (CONF_DIR / group).glob("*.yaml"))


def repeats_in(path: Path) -> list[str]:
    text = path.read_text()
    values = yaml.safe_load(text) or {}
    group = path.parent.name
    if group == "study":
        return repeated_defaults(values, StudyConfig, "study")
    if text.lstrip().startswith("# @package _global_"):
        return repeated_defaults(values, RunConfig, "", selected_groups(values))
    return repeated_defaults({group: values}, RunConfig, "")


def test_every_config_field_has_a_docstring():
    assert undocumented_fields(inspect.getsource(schema)) == []


def test_the_docstring_check_sees_a_missing_docstring():
    source = "@dataclass\nclass A:\n    x: int = 1\n    \"\"\"doc\"\"\"\n    y: int = 2\n    z: int = 3\n    \"\"\" \"\"\"\n"
    assert undocumented_fields(source) == ["A.y", "A.z"]


@pytest.mark.parametrize("path", group_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_conf_group_file_repeats_a_dataclass_default(path):
    """A group file holds what differs from the schema; a repeated default would hide a change of the default."""
    assert repeats_in(path) == [], f"{path.relative_to(CONF_DIR)} repeats dataclass defaults; delete those lines"


@pytest.mark.parametrize("path", sorted((CONF_DIR / "roster").glob("*.yaml")), ids=lambda p: p.name)
def test_no_roster_repeats_a_default(path):
    roster = yaml.safe_load(path.read_text())
    found = [r for name, block in roster["agents"].items() for r in repeated_defaults(block, AgentConfig, name)]
    found += repeated_defaults(roster["settings"], RunConfig, "settings")
    assert found == []


def test_the_conf_check_sees_a_repeated_default(tmp_path):
    probe = {"train": {"cycles": 2, "clip_eps": 0.3}, "agents": {"members": [{"name": "a", "device": "cpu"}]},
             "search": {"prior": {"dist": "gaussian", "m": 0.5}}, "eval": {"tree": True}}
    assert sorted(repeated_defaults(probe, RunConfig, "")) == [
        ".agents.members.0.device='cpu'", ".eval.tree=True", ".search.prior.dist='gaussian'", ".train.cycles=2"]
    preset = {"defaults": [{"override /search": "paper"}], "search": {"max_nodes": 8, "max_new_tokens": 32768}}
    assert repeated_defaults(preset, RunConfig, "", selected_groups(preset)) == [".search.max_new_tokens=32768"]


# TrainConfig fields the update does not read, and the stage that does: a new field must be added here or to
# UpdateHParams (which takes every field of the same name), so it cannot silently miss the update
READ_OUTSIDE_THE_UPDATE = {
    "train_batch": "tasks/update.py (buffers samples until an update has this many)",
    "advantage": "advantage", "shaping_gamma": "advantage", "shaping_lambda": "advantage",
    "overlong_buffer": "advantage", "filter_flat_trees": "advantage",
    "keep_optimizer_states": "the train flow (prunes ds/ folders)",
}


def test_every_train_and_optimizer_field_reaches_the_update_or_is_named_as_read_elsewhere():
    from mars2.config import OptimizerConfig, TrainConfig
    from mars2.train.update import UpdateHParams, update_hparams

    own = {f.name for f in dataclasses.fields(UpdateHParams)}
    for cls in (TrainConfig, OptimizerConfig):
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in own and f.name not in READ_OUTSIDE_THE_UPDATE]
        assert missing == [], f"{cls.__name__} fields that reach no update: add them to UpdateHParams or name the reader"
    train = TrainConfig(clip_eps=0.3, tis_threshold=3.0, tis_veto=1e-3, kl_coef=0.5, micro_batch=3, step_batch=5,
                        micro_batch_tokens=77, logprob_chunk_tokens=11, loss="grpo", seed=7, cycles=9)
    optimizer = OptimizerConfig(lr=0.1, min_lr=0.01, betas=[0.8, 0.9], weight_decay=0.2, warmup_ratio=0.5,
                                grad_clip=4.0)
    hp = update_hparams(train, optimizer, cycle=2, dtype="bfloat16", temperature=0.7)
    for cls, values in ((TrainConfig, train), (OptimizerConfig, optimizer)):
        for f in dataclasses.fields(cls):
            if f.name in own and f.name not in ("seed", "betas"):
                assert getattr(hp, f.name) == getattr(values, f.name), f.name
    assert (hp.seed, hp.betas, hp.cycle, hp.dtype, hp.temperature) == (9, (0.8, 0.9), 2, "bfloat16", 0.7)

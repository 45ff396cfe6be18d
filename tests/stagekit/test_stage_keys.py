"""Each stage's cache key holds the config fields it reads, no more: a change to a field a stage does not read is a
cache hit for it (same key), a change to one it reads is a miss. Keys are each stage's digest of the parameters, as its
task passes them to ``run_stage``."""

import sys
from dataclasses import replace

import pytest

from tasks import advantage, agents, bootstrap, evaluation, grading, rollout, update
from pipeline.config import load_cfg, resolve
from stagekit.stage import StageContext, StageRecord, narrowed, stage_digest


@pytest.fixture(scope="module")
def cfg():
    return resolve(load_cfg(["agents=tiny_cpu"]), cuda_available=False)


def _record(stage: str) -> StageRecord:
    return StageRecord(stage=stage, key=f"{stage}-key", dir="/nowhere", files={"f": "0"})


def _key(task, tmp_path, **params) -> str:
    stage = sys.modules[task.fn.__module__]
    return stage_digest(stage.DECLARATION.name, stage.DECLARATION.modules,
                        {"ctx": StageContext(root=str(tmp_path)), **params}, stage.DECLARATION.reads or None)


def _member(cfg, i: int = 0, **changes):
    members = list(cfg.agents.members)
    members[i] = replace(members[i], **changes)
    return members


def _optimizer(cfg, **changes):
    return _member(cfg, optimizer=replace(cfg.agents.members[0].optimizer, **changes))


def test_evaluation_keys_on_its_own_tree_settings_not_the_training_search(cfg, tmp_path):
    """Evaluation trees take eval.max_nodes, eval.max_new_tokens, eval.seed and eval.tree_temperature: an ablation
    of the training search (search.max_nodes=4) or of the agents' lr reuses the held-out evaluation."""
    def key(search=cfg.search, members=cfg.agents.members):
        return _key(evaluation.evaluate, tmp_path, evaluation=cfg.eval, search=search, grading=cfg.grading,
                    backend=cfg.backend, members=members, weight_records={}, agents=_record("agents"),
                    dataset=_record("data"), cycle=-1, max_problems=3)

    base = key()
    for unread in (dict(max_nodes=4), dict(temperature=0.3), dict(max_new_tokens=7), dict(seed=5),
                   dict(n_samples=9), dict(strategy="independent"), dict(detailed_feedback=True)):
        assert key(search=replace(cfg.search, **unread)) == base, unread
    assert key(members=_optimizer(cfg, lr=0.5)) == base
    assert key(members=_member(cfg, update_procs=2)) == base
    for read in (dict(top_p=0.5), dict(expansions_per_wave=2), dict(batch_size=3), dict(depth_gamma0=0.5)):
        assert key(search=replace(cfg.search, **read)) != base, read
    assert key(members=_member(cfg, role_prompt="be brief")) != base


def test_evaluation_keys_on_its_tree_strategy(cfg, tmp_path):
    def key(setting):
        return _key(evaluation.evaluate, tmp_path, evaluation=setting, search=cfg.search, grading=cfg.grading,
                    backend=cfg.backend, members=cfg.agents.members, weight_records={}, agents=_record("agents"),
                    dataset=_record("data"), cycle=-1, max_problems=3)

    assert key(replace(cfg.eval, tree_strategy="sequential")) != key(cfg.eval)


def test_advantage_keys_on_shaping_and_routing_not_the_optimizer(cfg, tmp_path):
    def key(train=cfg.train, search=cfg.search, members=cfg.agents.members):
        return _key(advantage.compute_advantages, tmp_path, train=train, search=search, members=members,
                    trees=_record("rollout"), verdicts=_record("grading"), cycle=0)

    base = key()
    for unread in (dict(kl_coef=0.5), dict(clip_eps=0.3), dict(micro_batch=1), dict(cycles=9), dict(loss="grpo")):
        assert key(train=replace(cfg.train, **unread)) == base, unread
    assert key(search=replace(cfg.search, max_nodes=4)) == base
    assert key(members=_optimizer(cfg, lr=0.5)) == base and key(members=_member(cfg, role_prompt="x")) == base
    for read in (dict(shaping_gamma=0.9), dict(advantage="group"), dict(overlong_buffer=0), dict(filter_flat_trees=True)):
        assert key(train=replace(cfg.train, **read)) != base, read
    assert key(search=replace(cfg.search, max_new_tokens=7)) != base  # L_max of the overlong penalty
    assert key(members=_member(cfg, 1, shares_weights_with=cfg.agents.members[0].name)) != base


def test_rollout_keys_on_the_whole_search_and_how_agents_generate(cfg, tmp_path):
    def key(search=cfg.search, members=cfg.agents.members):
        return _key(rollout.rollout, tmp_path, search=search, grading=cfg.grading, backend=cfg.backend,
                    members=members, weight_records={}, agents=_record("agents"), dataset=_record("data"), cycle=0,
                    max_problems=3, rotate=True)

    base = key()
    assert key(members=_optimizer(cfg, lr=0.5)) == base
    assert key(members=_member(cfg, deepspeed="zero2_bf16")) == base
    assert key(search=replace(cfg.search, max_nodes=4)) != base
    assert key(members=_member(cfg, chat_template_kwargs={"enable_thinking": True})) != base


def test_agents_and_warm_start_key_on_what_builds_the_weights(cfg, tmp_path):
    def keys(members, grading=cfg.grading):
        return (_key(agents.init_agents, tmp_path, members=members, dataset=_record("data")),
                _key(bootstrap.bootstrap_agents, tmp_path, members=members, agents=_record("agents"),
                     dataset=_record("data"), grading=grading))

    base = keys(cfg.agents.members)
    assert keys(_optimizer(cfg, lr=0.5)) == base  # an lr sweep of the RL update reuses both
    assert keys(_member(cfg, gpus=2)) == base
    assert keys(cfg.agents.members, replace(cfg.grading, workers=7)) == base
    assert keys(cfg.agents.members, replace(cfg.grading, time_limit_s=1.0))[1] != base[1]  # decides refine examples
    boot = _member(cfg, bootstrap=replace(cfg.agents.members[0].bootstrap, steps=3))
    assert keys(boot)[0] == base[0] and keys(boot)[1] != base[1]
    tiny = _member(cfg, tiny=replace(cfg.agents.members[0].tiny, seed=9))
    assert keys(tiny)[0] != base[0] and keys(tiny)[1] != base[1]


def test_grading_keys_on_what_decides_a_verdict_not_how_many_slots_run(cfg, tmp_path):
    def key(g):
        return _key(grading.grade, tmp_path, grading=g, samples=_record("rollout"), dataset=_record("data"), cycle=0)

    assert key(replace(cfg.grading, workers=7)) == key(cfg.grading)
    assert key(replace(cfg.grading, time_limit_s=1.0)) != key(cfg.grading)


def test_update_keys_ignore_how_many_optimizer_states_are_kept_and_how_long_collectives_wait(cfg, tmp_path):
    member = cfg.agents.members[0]

    def key(train):
        return _key(update.update_policy, tmp_path, member=member, train=train, profile={},
                    weight_record=_record("agents"), agents=_record("agents"), routed=_record("advantage"), cycle=0,
                    temperature=1.0)

    assert key(replace(cfg.train, keep_optimizer_states=3)) == key(cfg.train)
    assert key(replace(cfg.train, collective_timeout_s=14400.0)) == key(cfg.train)  # raised after a timeout
    assert key(replace(cfg.train, kl_coef=0.5)) != key(cfg.train)


def test_a_narrowed_config_keeps_what_is_read_and_defaults_the_rest(cfg):
    search = replace(cfg.search, max_nodes=4, top_p=0.5)
    kept = narrowed(search, ("top_p",))
    assert kept.top_p == 0.5 and kept.max_nodes == type(search)().max_nodes
    assert [m.name for m in narrowed(cfg.agents.members, ("name",))] == [m.name for m in cfg.agents.members]


# What a stage may import without hashing it: how it runs, not what it makes. Config values enter keys as values;
# the rest is the stage layer itself, progress lines, engine lifetimes, the CPU split and which GPUs an update uses.
RUN_ONLY = {"mars2.config": None, "mars2.cpu": None, "stagekit.stage": None, "stagekit.progress": None,
            "stagekit.engines": None, "mars2.backends.base": {"visible_devices"}}
PROJECT = ("mars2", "stagekit", "tasks", "pipeline")


def _project_imports(module) -> dict[str, set[str]]:
    """Project modules ``module``'s source imports, at its top or inside its functions → the names it takes from
    each (``from m import x`` of a submodule ``m.x`` counts as importing ``m.x``)."""
    import ast
    import importlib.util
    import inspect

    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, set())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if node.module.split(".")[0] in PROJECT and _is_package(node.module) and importlib.util.find_spec(sub):
                    found.setdefault(sub, set())
                else:
                    found.setdefault(node.module, set()).add(alias.name)
    return {m: names for m, names in found.items() if m.split(".")[0] in PROJECT}


def _is_package(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name).submodule_search_locations is not None


@pytest.mark.parametrize("name", ["advantage", "agents", "bootstrap", "checkpoints", "data", "evaluation", "gate",
                                  "grading", "rollout", "update"])
def test_every_stage_hashes_the_project_code_it_imports(name):
    """A stage's code version (its declaration's ``modules``) covers every project module the stage imports, unless
    what it takes from it only says how the stage runs (``RUN_ONLY``): editing code a stage runs re-runs the stage."""
    import importlib

    stage = importlib.import_module(f"tasks.{name}")

    def hashed(module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in stage.DECLARATION.modules)

    def run_only(module: str, names: set[str]) -> bool:
        allowed = RUN_ONLY.get(module, set())
        return module in RUN_ONLY and (allowed is None or bool(names) and names <= allowed)

    unhashed = {m: sorted(n) for m, n in _project_imports(stage).items() if not hashed(m) and not run_only(m, n)}
    assert not unhashed, f"tasks.{name} imports {unhashed} but its declaration's modules do not hash it"
    assert hashed(stage.__name__)


def test_the_import_check_sees_imports_inside_functions():
    """The check above reads imports inside function bodies, where the stages import their heavy code."""
    assert "mars2.search.run" in _project_imports(rollout)
    assert _project_imports(update)["mars2.backends.base"] == {"visible_devices"}


def test_a_stage_that_uses_a_field_it_did_not_declare_fails_naming_it(cfg):
    """A stage computes from its ``declared`` configs: the fields its declaration reads as given, every other one a
    guard that fails at its first use (before: reset to its default, so a user's override of a field the stage used
    without declaring it was ignored, silently). The advantage stage's own computation, with its reads and with one read
    left out of them."""
    import copy
    import dataclasses
    import pickle

    import pandas as pd

    from mars2.rl.tables import tree_advantages
    from stagekit.stage import UndeclaredRead, declared

    nodes = pd.DataFrame({"problem_id": ["p"] * 3, "node_id": [0, 1, 2], "parent": [-1, 0, -1],
                          "response_len": [10, 40, 10]})
    verdicts = pd.DataFrame({"problem_id": ["p"] * 3, "node_id": [0, 1, 2], "reward": [1.0, 0.0, 0.0]})
    train = replace(cfg.train, overlong_buffer=8)
    guarded = declared(train, advantage.DECLARATION.reads["train"])
    pd.testing.assert_frame_equal(tree_advantages(nodes, verdicts, guarded, max_len=40),
                                  tree_advantages(nodes, verdicts, train, max_len=40))
    forgetful = tuple(r for r in advantage.DECLARATION.reads["train"] if r != "overlong_buffer")
    with pytest.raises(UndeclaredRead, match=r"TrainConfig\.overlong_buffer is used by a stage that does not "
                                             r"declare it in its reads"):
        tree_advantages(nodes, verdicts, declared(train, forgetful), max_len=40)

    unread = guarded.kl_coef  # handed on, copied and shown, it is not used; every use fails
    assert copy.deepcopy(guarded).kl_coef is unread and dataclasses.asdict(guarded)["kl_coef"] is unread
    assert "undeclared TrainConfig.kl_coef" in repr(guarded)
    for use in (bool, float, str, hash, lambda v: v + 1, lambda v: v == 0.001, lambda v: f"{v:.3f}", pickle.dumps,
                lambda v: v.real):
        with pytest.raises(UndeclaredRead, match="TrainConfig.kl_coef"):
            use(unread)
    members = declared(list(cfg.agents.members), ("name",))
    assert [m.name for m in members] == [m.name for m in cfg.agents.members]
    assert members[0].gpu_ids == cfg.agents.members[0].gpu_ids  # outside every key by design: as given
    with pytest.raises(UndeclaredRead, match=r"AgentConfig\.optimizer"):
        members[0].optimizer.lr

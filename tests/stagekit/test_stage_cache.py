"""Cache keys and content-addressed artefact folders of the stage layer, the stages' one cache."""

import os
import shutil
from dataclasses import replace

import pytest

from mars2.config import DataConfig
from mars2.io import atomic_dir, atomic_write_text
from stagekit.stage import (
    AgentWeights,
    MANIFEST,
    StageContext,
    StageDeclaration,
    StageFault,
    StageRecord,
    current_parameters,
    run_declared,
    run_stage,
    stage_digest,
    stage_task,
)

MODS = ("mars2.rl",)


def test_digest_depends_on_config_and_inputs_but_not_on_context():
    rec = StageRecord(stage="data", key="k", dir="/x", files={"a": "1"})
    base = {"ctx": StageContext(root="/a", flow_run_id="1"), "data": DataConfig(), "up": rec}
    d0 = stage_digest("s", MODS, base)
    assert d0 == stage_digest("s", MODS, {**base, "ctx": StageContext(root="/b", flow_run_id="2", fail_at="s")})
    assert d0 != stage_digest("s", MODS, {**base, "data": replace(DataConfig(), seed=1)})
    assert d0 != stage_digest("s", MODS, {**base, "up": replace(rec, files={"a": "2"})})
    assert d0 == stage_digest("s", MODS, {**base, "up": replace(rec, dir="/elsewhere", seconds=9.0, flow_run_id="x")})
    assert d0 != stage_digest("other", MODS, base)
    assert d0 != stage_digest("s", ("mars2.eval",), base)


def test_atomic_dir_leaves_nothing_on_failure_and_never_rewrites(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        atomic_write_text(tmp / "f", "partial")
        raise RuntimeError("crash")
    assert not final.exists() and os.listdir(tmp_path) == []
    with atomic_dir(final) as tmp:
        atomic_write_text(tmp / "f", "first")
    with atomic_dir(final) as tmp:
        atomic_write_text(tmp / "f", "second")
    assert (final / "f").read_text() == "first" and os.listdir(tmp_path) == ["out"]


def test_run_stage_writes_manifest_reuses_folder_and_injects_faults(tmp_path):
    ctx = StageContext(root=str(tmp_path), flow_run_id="run1")
    params = {"ctx": ctx, "x": 1}
    calls = []

    def produce(out):
        calls.append(1)
        atomic_write_text(out / "a.txt", "hello")
        return {"metrics": {"m": 2}, "meta": {"p": "a.txt"}}

    rec = run_stage("s", MODS, ctx, params, produce)
    assert rec.metrics == {"m": 2.0} and rec.path("a.txt").read_text() == "hello" and rec.flow_run_id == "run1"
    assert (tmp_path / "artifacts" / "s" / rec.key[:16] / MANIFEST).exists()
    again = run_stage("s", MODS, StageContext(root=str(tmp_path), flow_run_id="run2", fail_at="s"), params, produce)
    assert again == rec and calls == [1]  # reused, not rewritten, even with a fault armed
    with pytest.raises(StageFault):
        run_stage("s", MODS, StageContext(root=str(tmp_path), fail_at="s"), {"ctx": ctx, "x": 2}, produce)
    assert len(calls) == 1


def test_the_stage_folder_is_the_only_cache_and_prefect_names_its_reuse_cached(tmp_path):
    """A stage task reuses its folder in a later flow run (Prefect shows the task run as ``Cached``), keeps nothing
    outside the run folder's stage folders, and runs again once its folder is gone."""
    from prefect import flow

    calls = []

    declaration = StageDeclaration(name="s", label="s", modules=MODS)

    @stage_task(declaration, task_run_name="s-{x}")
    def s(ctx: StageContext, x: int) -> StageRecord:
        def produce(out):
            calls.append(x)
            atomic_write_text(out / "a.txt", str(x))

        return run_declared(declaration, ctx, current_parameters(), produce)

    @flow
    def cycle(flow_run_id: str) -> tuple[str, StageRecord]:
        state = s(StageContext(root=str(tmp_path), flow_run_id=flow_run_id), 1, return_state=True)
        return state.name, state.result()

    (first, made), (second, reused) = cycle("run1"), cycle("run2")
    assert (first, second) == ("Completed", "Cached") and reused == made and calls == [1]
    assert made.flow_run_id == "run1" and [p.name for p in tmp_path.iterdir()] == ["artifacts"]
    shutil.rmtree(made.dir)
    third, remade = cycle("run3")
    assert third == "Completed" and calls == [1, 1] and remade.flow_run_id == "run3"


def test_upstream_records_enter_keys_by_key_and_file_hashes():
    base = StageRecord(stage="update", key="k1", dir="/a", files={"buffer.parquet": "h"})
    params = {"ctx": StageContext(root="/r"), "weights": base}
    other = {"ctx": StageContext(root="/r"), "weights": replace(base, key="k2")}
    assert stage_digest("rollout", MODS, params) != stage_digest("rollout", MODS, other)


def test_weights_survive_manifest_pickle_and_pools_dispatch(tmp_path):
    """The hand-off (``StageRecord.weights``) comes back typed from MANIFEST.json, Prefect's pickled result and
    the JSON a dispatched stage's arguments and record travel as."""
    import json
    import pickle

    from pydantic import TypeAdapter

    from pipeline.dispatch import encode_args, read_dispatched

    ctx = StageContext(root=str(tmp_path))
    weights = {"a": AgentWeights(model_dir="model", tokenizer_dir="/tok/a", optimizer_dir="ds"),
               "b": AgentWeights(model_dir="/prev/model", tokenizer_dir="/tok/b", optimizer_dir="/prev/ds",
                                 buffer="buffer.parquet")}
    rec = run_stage("s", MODS, ctx, {"ctx": ctx, "x": 1},
                    lambda out: atomic_write_text(out / "buffer.parquet", "x") and {"weights": weights})
    assert rec.weights == weights and all(type(w) is AgentWeights for w in rec.weights.values())
    assert run_stage("s", MODS, ctx, {"ctx": ctx, "x": 1}, lambda out: None) == rec  # rebuilt from MANIFEST.json
    assert pickle.loads(pickle.dumps(rec)) == rec
    sent = json.loads(json.dumps(encode_args({"weights": rec})))["weights"]
    received = TypeAdapter(StageRecord).validate_python(sent)
    assert received == rec and type(received.weights["b"]) is AgentWeights
    (tmp_path / "dispatch").mkdir()
    (tmp_path / "dispatch" / "run-1.json").write_text(json.dumps(sent))
    assert read_dispatched(str(tmp_path), "run-1") == rec
    a, b = rec.weights_of("a"), rec.weights_of("b")
    assert (a.model_dir, a.tokenizer_dir, a.optimizer_dir, a.buffer) == (f"{rec.dir}/model", "/tok/a", f"{rec.dir}/ds", None)
    assert (b.model_dir, b.optimizer_dir, b.buffer) == ("/prev/model", "/prev/ds", f"{rec.dir}/buffer.parquet")
    with pytest.raises(KeyError, match="no weights of 'c'"):
        rec.weights_of("c")


def test_fields_marked_out_of_the_cache_key_do_not_change_it():
    from mars2.config import TrainConfig

    base = {"ctx": StageContext(root="/r"), "train": TrainConfig()}
    digest = stage_digest("update", MODS, base)
    assert digest == stage_digest("update", MODS, {**base, "train": replace(TrainConfig(), keep_optimizer_states=3)})
    assert digest != stage_digest("update", MODS, {**base, "train": replace(TrainConfig(), kl_coef=0.5)})


def test_large_files_are_fingerprinted_from_their_ends_small_ones_by_sha256(tmp_path, monkeypatch):
    import builtins

    import mars2.io as mio

    small = tmp_path / "small.json"
    small.write_bytes(b"{}" * 1000)
    assert mio.file_fingerprint(small) == mio.sha256_file(small)
    big = tmp_path / "model-00001.safetensors"
    with open(big, "wb") as f:  # sparse: 3 GiB that take no disk
        f.truncate(3 << 30)
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def seek(self, *a):
            return self.f.seek(*a)

    monkeypatch.setattr(mio, "open", lambda *a, **k: Counting(builtins.open(*a, **k)), raising=False)
    fp = mio.file_fingerprint(big)
    assert sum(read) == 2 * mio.EDGE_BYTES and fp.startswith(f"fp:{3 << 30}:")
    monkeypatch.undo()
    with open(big, "r+b") as f:  # a change at the end is seen, one in the middle is the documented blind spot
        f.seek((3 << 30) - 10)
        f.write(b"x")
    assert mio.file_fingerprint(big) != fp
    assert mio.file_fingerprint(big, with_mtime=True).startswith(mio.file_fingerprint(big) + ":")
    assert mio.folder_fingerprints(tmp_path) == {"model-00001.safetensors": mio.file_fingerprint(big),
                                                 "small.json": mio.sha256_file(small)}


def test_an_altered_artefact_is_named_moved_aside_and_its_stage_runs_again(tmp_path, caplog):
    ctx = StageContext(root=str(tmp_path))
    params = {"ctx": ctx, "x": 1}
    calls = []

    def produce(out):
        calls.append(1)
        atomic_write_text(out / "verdicts.parquet", "the verdicts the stage computed")
        atomic_write_text(out / "other.txt", "untouched")

    rec = run_stage("grading", MODS, ctx, params, produce)
    assert run_stage("grading", MODS, ctx, params, produce) == rec and calls == [1]  # intact: reused
    rec.path("verdicts.parquet").write_text("rewards someone edited")
    with caplog.at_level("WARNING"):
        again = run_stage("grading", MODS, ctx, params, produce)
    assert "verdicts.parquet (modified)" in caplog.text and "other.txt" not in caplog.text
    (aside,) = [p for p in (tmp_path / "artifacts" / "grading").iterdir() if ".altered-" in p.name]
    assert (aside / "verdicts.parquet").read_text() == "rewards someone edited"  # kept for a look, out of the way
    assert calls == [1, 1] and again.path("verdicts.parquet").read_text() == "the verdicts the stage computed"


def test_a_missing_artefact_counts_unless_the_pipeline_pruned_it(tmp_path):
    from mars2.train.checkpoints import PRUNED
    from stagekit.stage import altered_artefacts

    ctx = StageContext(root=str(tmp_path))

    def produce(out):
        (out / "ds").mkdir()
        atomic_write_text(out / "ds" / "optim.pt", "state")
        atomic_write_text(out / "model.safetensors", "weights")

    rec = run_stage("update", MODS, ctx, {"ctx": ctx}, produce)
    folder = rec.path("model.safetensors").parent
    shutil.rmtree(folder / "ds")
    assert altered_artefacts(folder) == ["ds/optim.pt (missing)"]
    atomic_write_text(folder / PRUNED, '{"optimizer_dir": "ds", "keep_optimizer_states": 1}')
    assert altered_artefacts(folder) == []  # prune_optimizer_states removed it on purpose
    (folder / "model.safetensors").unlink()
    assert altered_artefacts(folder) == ["model.safetensors (missing)"]

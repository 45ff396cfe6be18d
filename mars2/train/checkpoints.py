"""The model folders an update hands on, and the DeepSpeed optimizer states it leaves behind.

A model folder is *complete* when ``AutoModelForCausalLM.from_pretrained(d)``, ``AutoTokenizer.from_pretrained(d)``
and a vLLM engine load it with nothing else: ``config.json``, ``generation_config.json``, safetensors weights and
the agent's tokenizer files (with its chat template), copied verbatim from its tokenizer folder.

An update's DeepSpeed checkpoint (``ds/``: optimizer moments, scheduler, RNG) is several times the size of its
weights and only the next update reads it. :func:`prune_optimizer_states` keeps the last ``keep`` per agent and
deletes the rest, leaving a :data:`PRUNED` note in the update's folder, so that an update that needs a deleted
state fails saying so (:func:`require_optimizer_state`) instead of inside DeepSpeed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from pathlib import Path

from mars2.io import atomic_write_json

# what ``PreTrainedTokenizer.save_pretrained`` writes, for the tokenizer kinds our agents use
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                   "chat_template.json")
GENERATION_CONFIG = "generation_config.json"
IN_USE = ".optimizer_state.lock"  # beside ds/: shared-locked while an update resumes from it
PRUNED = "PRUNED.json"  # in an update folder whose ds/ was deleted: which folder, and the keep setting


class OptimizerStateMissing(RuntimeError):
    """The DeepSpeed state an update resumes from is gone (pruned, or deleted by hand)."""


def missing_model_files(model_dir: str | Path) -> list[str]:
    """What ``model_dir`` lacks to be loaded alone (empty when complete)."""
    d = Path(model_dir)
    missing = [f for f in ("config.json", GENERATION_CONFIG, "tokenizer_config.json") if not (d / f).is_file()]
    if not any(d.glob("*.safetensors")):
        missing.append("*.safetensors")
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")):
        missing.append("tokenizer.json (or a vocabulary file)")
    return missing


def complete_model_folder(model_dir: str | Path, tokenizer_dir: str | Path, source_model_dir: str | Path | None = None
                          ) -> Path:
    """Make ``model_dir`` (config + safetensors, as ``save_pretrained`` writes it) loadable alone.

    Copies the tokenizer files of ``tokenizer_dir`` verbatim (never its weights). ``generation_config.json`` is
    ``source_model_dir``'s (the weights this folder was trained from) whenever that has one, over the one
    ``save_pretrained`` writes (transformers' own, which loses the source's end tokens and sampling defaults); else
    the folder's own, or one derived from ``config.json`` (its bos/eos/pad ids) when it has none. Raises
    ``ValueError`` naming what is still missing.
    """
    d, tok = Path(model_dir), Path(tokenizer_dir)
    if d.resolve() != tok.resolve():
        copied = [f for f in TOKENIZER_FILES if (tok / f).is_file()]
        if not copied:
            raise ValueError(f"{tok} holds no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})")
        for f in copied:
            shutil.copyfile(tok / f, d / f)
    source = Path(source_model_dir) / GENERATION_CONFIG if source_model_dir else None
    if source is not None and source.is_file() and source.resolve() != (d / GENERATION_CONFIG).resolve():
        shutil.copyfile(source, d / GENERATION_CONFIG)
    elif not (d / GENERATION_CONFIG).is_file():
        from transformers import AutoConfig, GenerationConfig

        GenerationConfig.from_model_config(AutoConfig.from_pretrained(d, local_files_only=True)).save_pretrained(d)
    missing = missing_model_files(d)
    if missing:
        raise ValueError(f"model folder {d} is not complete: it lacks {', '.join(missing)}")
    return d


def prune_optimizer_states(optimizer_dirs: list[str | None], keep: int) -> list[str]:
    """Delete all but the last ``max(keep, 1)`` distinct DeepSpeed state folders of one agent.

    ``optimizer_dirs``: the agent's optimizer folder after each of its updates, oldest first (a skipped update
    repeats the previous one; None = before the first update). The newest always stays: the next update resumes
    from it. Each deleted folder's parent gets a :data:`PRUNED` note first. Returns the deleted folders.
    """
    distinct = list(dict.fromkeys(str(d) for d in optimizer_dirs if d))
    removed = []
    for d in distinct[:-max(keep, 1)]:
        path = Path(d)
        if not path.exists():
            continue
        with _lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
            if not held:  # another run sharing this cache resumes from it right now: the next prune takes it
                continue
            atomic_write_json(path.parent / PRUNED, {"optimizer_dir": path.name, "keep_optimizer_states": keep})
            shutil.rmtree(path)
        removed.append(d)
    return removed


@contextlib.contextmanager
def optimizer_state_in_use(optimizer_dir: str | None):
    """Hold a shared lock on an optimizer state while an update resumes from it, so that a concurrent run sharing the
    cache (a sweep) does not prune it mid-read (:func:`prune_optimizer_states` skips locked states). An advisory
    ``flock``: it holds between processes on one host and on file systems that honour it."""
    if optimizer_dir is None:
        yield
        return
    with _lock(Path(optimizer_dir), fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def _lock(optimizer_dir: Path, mode: int):
    """``flock(mode)`` on the lock file beside ``optimizer_dir``; yields whether it was taken (LOCK_NB may fail)."""
    with open(optimizer_dir.parent / IN_USE, "a") as f:
        try:
            fcntl.flock(f, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def require_optimizer_state(optimizer_dir: str | None) -> None:
    """Raise :class:`OptimizerStateMissing` with what to do when the state an update resumes from is gone."""
    if optimizer_dir is None:
        return
    path = Path(optimizer_dir)
    note = path.parent / PRUNED
    if note.is_file():
        keep = json.loads(note.read_text()).get("keep_optimizer_states")
        raise OptimizerStateMissing(
            f"the optimizer state this update resumes from, {path}, was pruned after later updates "
            f"(train.keep_optimizer_states={keep} keeps each agent's last {keep}). To redo this update, delete this "
            "agent's update folders written after the last one that still holds ds/ (all of them if none does) and "
            "run again: they re-run from the kept state; raise train.keep_optimizer_states to keep more.")
    if not path.is_dir():
        raise OptimizerStateMissing(
            f"the optimizer state this update resumes from, {path}, is missing (deleted by hand?). Delete the update "
            f"folder that wrote it ({path.parent}) so that update runs again, and run again.")

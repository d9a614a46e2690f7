"""Task sources named in configs: ``builtin:<split>``, ``bfcl:<category>[:<split>]``,
``tau2:<domain>[:<split>]``, or a task file.

Each environment registers the prefix of its own task sets here (``register_task_source``);
``tasks`` itself only knows task files, so the dependency runs envs -> tasks and never back.
Loaders of optional benchmark packages (bfcl-eval, tau2) check the spec before importing them, so a
typo is reported as such, not as a missing package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentrl.common.registry import Registry, where
from agentrl.envs.builtin.generator import SPLIT_SIZES, SUITES, builtin_split, generate_tasks
from agentrl.envs.tau2.tasks import tau2_tasks
from agentrl.tasks.io import load_tasks
from agentrl.tasks.schema import Task

# prefix -> (loader of the spec's remainder, usage shown in errors)
TASK_SOURCES: Registry[tuple[Callable[[str], list[Task]], str]] = Registry("task source")


def register_task_source(prefix: str, loader: Callable[[str], list[Task]], usage: str) -> None:
    """``prefix:<rest>`` in a config resolves to ``loader(spec)``; ``usage`` names its forms. A
    prefix another loader holds is an error (a plugin cannot silently take ``builtin:``)."""
    TASK_SOURCES.add(prefix, (loader, usage), owner=where(loader))


# name -> generator(n, seed, id_prefix, exclude) of fresh tasks (``tasks.fresh_suite``)
TaskGenerator = Callable[[int, int, str, "set[tuple[str, ...]]"], list[Task]]
TASK_GENERATORS: Registry[TaskGenerator] = Registry("task generator")


def register_task_generator(name: str, generator: TaskGenerator) -> None:
    """``tasks.fresh_train`` with ``tasks.fresh_suite: name`` draws each step's tasks from
    ``generator(n, seed, id_prefix, exclude)``: ``n`` distinct tasks, the same for the same
    arguments, ids starting with ``id_prefix``, none whose tuple of user turns is in ``exclude``
    (the held-out tasks')."""
    TASK_GENERATORS.add(name, generator, owner=where(generator))


def generate_fresh_tasks(name: str, n: int, seed: int, id_prefix: str, exclude: set[tuple[str, ...]]) -> list[Task]:
    """``n`` fresh tasks from the generator registered as ``name``."""
    generator = TASK_GENERATORS.get(name)
    if generator is None:
        raise ValueError(TASK_GENERATORS.unknown(name))
    return generator(n, seed, id_prefix, exclude)


def resolve_task_source(spec: str) -> list[Task]:
    """Tasks named by a config string: a registered ``prefix:...`` source or a .jsonl/.parquet file."""
    prefix = spec.split(":", 1)[0] if ":" in spec else None
    source = TASK_SOURCES.get(prefix) if prefix is not None else None
    if source is not None:
        return source[0](spec)
    path = Path(spec)
    if path.suffix.lower() not in (".jsonl", ".parquet") or not path.is_file():
        forms = ", ".join(usage for _, (_, usage) in TASK_SOURCES.items())
        raise ValueError(f"unknown task source {spec!r}: expected {forms} or an existing .jsonl/.parquet file")
    return load_tasks(path)


def resolve_task_sources(spec: str | list[str]) -> list[Task]:
    """One source or a list of them (``tasks.train`` may mix suites), concatenated in order."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise ValueError("empty list of task sources")
    return [task for one in specs for task in resolve_task_source(one)]


def _builtin_source(spec: str) -> list[Task]:
    """``builtin:<split>``: the generated suites (``envs/builtin/generator.py``)."""

    name = spec.split(":", 1)[1]
    if name not in SPLIT_SIZES:
        raise ValueError(f"unknown task source {spec!r}: builtin splits are {sorted(SPLIT_SIZES)}")
    return builtin_split(name)


def _tau2_source(spec: str) -> list[Task]:
    """``tau2:<domain>`` (the test split) or ``tau2:<domain>:<split>``: τ²-bench airline/retail
    tasks whose tools the LLM simulator answers (backend "sgls")."""
    parts = spec.split(":")
    domain, split = parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "test"
    if len(parts) > 3 or domain not in ("airline", "retail") or split not in ("train", "test", "full"):
        raise ValueError(f"unknown task source {spec!r}: "
                         "expected tau2:<airline|retail> or tau2:<airline|retail>:<train|test|full>")

    return [t.model_copy(deep=True) for t in tau2_tasks(domain, split)]



_BFCL_CATEGORIES = ("base", "miss_func", "miss_param", "long_context", "all")
_BFCL_SPLITS = ("train", "eval", "full")


def _bfcl_source(spec: str) -> list[Task]:
    """``bfcl:<category>[:<split>]``; checked before importing the optional BFCL package."""
    parts = spec.split(":")[1:]
    if not 1 <= len(parts) <= 2 or parts[0] not in _BFCL_CATEGORIES or (len(parts) == 2 and parts[1] not in _BFCL_SPLITS):
        raise ValueError(
            f"unknown task source {spec!r}: expected bfcl:<category> (eval split) or bfcl:<category>:<split> "
            f"with category in {list(_BFCL_CATEGORIES)} and split in {list(_BFCL_SPLITS)}"
        )
    from agentrl.envs.bfcl.tasks import bfcl_tasks

    return bfcl_tasks(parts[0], parts[1] if len(parts) == 2 else "eval")



register_task_source("builtin", _builtin_source, "builtin:<split> (e.g. builtin:train, builtin:bank-heldout)")
register_task_source("bfcl", _bfcl_source, "bfcl:<category> or bfcl:<category>:<split>")
register_task_source("tau2", _tau2_source, "tau2:<airline|retail>[:<train|test|full>]")


def _builtin_suite(suite: str) -> TaskGenerator:
    def generate(n: int, seed: int, id_prefix: str, exclude: set[tuple[str, ...]]) -> list[Task]:
        return generate_tasks(n, seed=seed, id_prefix=id_prefix, exclude=exclude, suite=suite)
    generate.__qualname__ = f"builtin_suite_{suite}"  # one owner per suite in the registry
    return generate


for _suite in SUITES:  # "all" (every builtin domain), "bank" (the quickstart's), the method settings
    register_task_generator(_suite, _builtin_suite(_suite))

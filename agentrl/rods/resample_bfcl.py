"""The ``resample`` synthesizer for BFCL tasks (docs/design.md §5): consistent literal substitution.

BFCL has no generator of user language, so a variant keeps the seed's wording and plan and
changes the values the user states; deterministic given (seed, rng_seed).

1. Literals: gold-call argument values (strings, ints, floats, also inside lists/dicts) that a user
   turn states verbatim as a whole token (not: strings under 2 characters or with "/" or a
   newline, "..", ints in -1..1, zero).
2. A fresh value each: a string the BFCL corpus passes to the same (function, argument), same
   coarse form first ("USR002" ~ "USR005"), with the original's file extension (or none); a digit
   id, as many random digits; a number, same type in [x/2, 2x], same decimals. Never one that
   occurs in the seed's text, state or gold arguments, nor one shared by two literals. After a
   failed attempt each literal may keep its value (likelier with each failure).
3. Applied at once to user turns and answer facts (whole tokens), gold arguments and
   ``initial_config`` (keys and values: strings token-wise, numbers and digit ids by equality),
   after writing the class defaults the seed leaves implicit (``DEFAULT_STATE``) into it.
4. Run on fresh backends of seed and candidate side by side: an unstated argument the seed
   copied from an earlier result takes the candidate's value at the same place (a booking id, a
   zipcode); every call must succeed with a result of the same shape (sizes, empty strings,
   booleans: a search that found 2 files finds 2). Then ``accept_variant`` and an equal
   ``skill_signature``.

Limits: wording, plan, tools and unstated values stay the seed's; a value written differently
from the argument (other case, "$1,500") is not recognised; a substituted sentence (a tweet) need
not fit the words around it; lookup tables in BFCL's code (zipcodes, distances, flight routes)
are not state, so draws outside them fail and are retried.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from agentrl.envs.base import is_error
from agentrl.envs.checker import canonical
from agentrl.envs.registry import make_backend
from agentrl.rods.signature import skill_signature
from agentrl.rods.synthesizer import SynthesisResult, accept_variant
from agentrl.tasks.schema import Task, ToolCall, Turn, text_key

_EXT = re.compile(r"^(.+?)(\.[A-Za-z][A-Za-z0-9]{0,4})$")
_INT, _FLOAT = re.compile(r"-?\d+"), re.compile(r"-?\d+\.(\d+)")


def _token(render: str) -> str:
    """Regex of ``render`` as a whole token: "report" matches neither "reports" nor "report.pdf"."""
    return rf"(?<![\w.-]){re.escape(render)}(?![\w-]|[.,]\w)"


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, scalar) of every string/number leaf (bools and None are not values to vary)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
    if items is not None:
        for k, v in items:
            yield from _leaves(v, (*path, k))
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield path, value


def _at(value: Any, path: tuple) -> Any:
    try:
        return functools.reduce(lambda v, k: v[k], path, value)
    except (KeyError, IndexError, TypeError):
        return None


def _renders(value: Any) -> list[str]:
    """How a user may write ``value`` (the first one found counts); [] if it is never varied."""
    if isinstance(value, str):
        ok = 2 <= len(value) <= 200 and value == value.strip() and not {"/", "\n"} & set(value) and value != ".."
        return [value] if ok else []
    if isinstance(value, int):
        return [str(value)] if abs(value) >= 2 else []
    return [repr(value)] + [str(int(value))] * value.is_integer() if math.isfinite(value) and value else []


def _form(s: str) -> str:
    """Coarse form of a string: runs of digits -> 9, runs of letters -> a ("Q4_summary.doc" -> "a9_a.a")."""
    return re.sub(r"[^\W\d_]+", "a", re.sub(r"\d+", "9", s))


def _deep(value: Any, fix_str: Callable[[str], str], fix_num: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return {fix_str(k): _deep(v, fix_str, fix_num) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v, fix_str, fix_num) for v in value]
    if isinstance(value, str):
        return fix_str(value)
    return fix_num(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _shape(value: Any) -> str:
    """Structure of a result that a same-skill variant keeps (values and dict keys may change)."""
    if isinstance(value, dict):
        return "{" + ",".join(sorted(_shape(v) for v in value.values())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_shape(v) for v in value) + "]"
    return repr(value) if value is None or isinstance(value, bool) else "''" if value == "" else type(value).__name__


@functools.lru_cache(maxsize=1)
def _restore_message() -> str:
    from agentrl.envs.bfcl.tasks import RESTORE_MESSAGE  # needs bfcl-eval: imported only on use

    return RESTORE_MESSAGE


def with_explicit_defaults(task: Task) -> Task:
    """``task`` with each class's JSON ``DEFAULT_STATE`` entries it leaves implicit written into
    ``initial_config``, if the fresh backend state stays the same; else ``task`` itself."""
    from agentrl.envs.bfcl.backend import bfcl_class

    config = copy.deepcopy(task.initial_state.get("initial_config") or {})
    for cname in task.initial_state.get("involved_classes") or []:
        for key, value in getattr(sys.modules[bfcl_class(cname).__module__], "DEFAULT_STATE", {}).items():
            try:
                if key not in config.get(cname, {}) and json.loads(json.dumps(value)) == value:
                    config.setdefault(cname, {})[key] = copy.deepcopy(value)
            except (TypeError, ValueError):  # a set or an object: left to the class
                continue
    full = task.model_copy(update={"initial_state": {**task.initial_state, "initial_config": config}})
    return full if canonical(make_backend(full).state()) == canonical(make_backend(task).state()) else task


class BFCLResampler:
    """Same-signature BFCL variants by consistent substitution of the literals the user states."""

    name = "resample"

    def __init__(self, corpus: list[Task] | None = None, max_attempts_per_variant: int = 8):
        if corpus is None:
            from agentrl.envs.bfcl.tasks import bfcl_tasks

            corpus = bfcl_tasks("all", "full")
        pools: dict[tuple[str, str], set[str]] = {}
        for task in corpus:
            for call in (c for u in range(len(task.turns)) for c in task.gold_calls(u)):
                for arg, v in call.arguments.items():
                    pools.setdefault((call.name, arg), set()).update(
                        s for _, s in _leaves(v) if isinstance(s, str) and _renders(s))
        self.pools = {k: sorted(v) for k, v in pools.items()}
        self.max_attempts = max(1, int(max_attempts_per_variant))

    @staticmethod
    def literals(task: Task) -> dict[str, dict[str, Any]]:
        """render -> {"values": {(type, original)}, "pools": {(function, argument)}}, sorted."""
        said = "\n".join(t.user for t in task.turns if t.user != _restore_message())
        out: dict[str, dict[str, Any]] = {}
        for call in (c for u in range(len(task.turns)) for c in task.gold_calls(u)):
            for arg, v in call.arguments.items():
                for _, s in _leaves(v):
                    render = next((r for r in _renders(s) if re.search(_token(r), said)), None)
                    if render is not None:
                        lit = out.setdefault(render, {"values": set(), "pools": set()})
                        lit["values"].add((type(s), s))
                        lit["pools"].add((call.name, arg))
        return dict(sorted(out.items()))

    def _draw(self, render: str, lit: dict[str, Any], rng: random.Random, fresh: Callable[[str], bool]) -> str | None:
        numeric = any(t is not str for t, _ in lit["values"])
        if numeric and _FLOAT.fullmatch(render):
            x, d = float(render), len(_FLOAT.fullmatch(render).group(1))
            draws = [f"{math.copysign(rng.uniform(abs(x) / 2, 2 * abs(x)), x):.{d}f}" for _ in range(20)]
        elif numeric and _INT.fullmatch(render):
            x = int(render)
            draws = [str(int(math.copysign(rng.randint(max(2, (abs(x) + 1) // 2), 2 * abs(x)), x))) for _ in range(20)]
        elif render.isdigit():  # an id written as digits: as many random digits
            lo = 10 ** (len(render) - 1) if render[0] != "0" else 0
            draws = [str(rng.randint(lo, 10 ** len(render) - 1)).zfill(len(render)) for _ in range(20)]
        else:  # a corpus value for the same argument, with the original's extension (or none)
            cands = sorted({c for p in lit["pools"] for c in self.pools.get(p, [])} - {render})
            rng.shuffle(cands)
            ext = _EXT.match(render)
            draws = [(_EXT.match(c).group(1) if _EXT.match(c) else c) + (ext.group(2) if ext else "") for c in cands]
            draws.sort(key=lambda c: _form(c) != _form(render))  # same form first ("USR002" ~ "USR005")
        return next((d for d in draws if d != render and fresh(d)), None)

    def _mapping(self, task: Task, lits: dict[str, dict[str, Any]], rng: random.Random, keep: float) -> dict[str, str]:
        blob = "\n".join([t.user for t in task.turns] + [f for t in task.turns for f in t.answer_facts]
                         + [json.dumps(task.initial_state, ensure_ascii=False)]
                         + [json.dumps(c.arguments, ensure_ascii=False)
                            for u in range(len(task.turns)) for c in task.gold_calls(u)])
        drawn: dict[str, str] = {}
        for render, lit in lits.items():
            new = self._draw(render, lit, rng, lambda d: d not in drawn.values() and not re.search(_token(d), blob))
            if new is not None:
                drawn[render] = new
        kept = [r for r in drawn if rng.random() < keep]
        if drawn and len(kept) == len(drawn):  # change at least one value
            kept.remove(rng.choice(kept))
        return {r: v for r, v in drawn.items() if r not in kept}

    @staticmethod
    def apply(task: Task, lits: dict[str, dict[str, Any]], mapping: dict[str, str]) -> Task:
        """``task`` with every mapped literal replaced in user turns, gold arguments and state."""
        by_len = sorted(mapping, key=len, reverse=True)
        words = [r for r in by_len if all(t is str for t, _ in lits[r]["values"]) and not r.isdigit()]
        word_re = re.compile("|".join(map(_token, words))) if words else None
        text_re = re.compile("|".join(map(_token, by_len)))
        numbers = {v: (float if t is float else int)(mapping[r]) for r in mapping for t, v in lits[r]["values"] if t is not str}

        def fix_text(s: str) -> str:
            return text_re.sub(lambda m: mapping[m.group(0)], s)

        def fix_str(s: str) -> str:  # a whole value (digit ids too), else whole tokens inside it
            return mapping[s] if s in mapping else word_re.sub(lambda m: mapping[m.group(0)], s) if word_re else s

        def fix_num(x: Any) -> Any:  # keeps the state's number type where the value allows
            new = numbers.get(x, x)
            return x if new is x else float(new) if isinstance(x, float) else int(new) if float(new).is_integer() else new

        restore = _restore_message()
        turns = [Turn(user=t.user if t.user == restore else fix_text(t.user), withheld_tools=list(t.withheld_tools),
                      gold=[[ToolCall(name=c.name, arguments=_deep(c.arguments, fix_str, fix_num)) for c in step]
                            for step in t.gold],
                      answer_facts=[fix_text(f) for f in t.answer_facts]) for t in task.turns]
        state = {**task.initial_state, "initial_config": _deep(task.initial_state.get("initial_config") or {}, fix_str, fix_num)}
        return Task(id="pending", domain=task.domain, category=task.category, tools=[t.model_copy(deep=True) for t in task.tools],
                    backend=task.backend, initial_state=state, turns=turns)

    @staticmethod
    def execute(seed: Task, cand: Task) -> tuple[Task | None, str | None]:
        """Runs both gold plans side by side (module docstring, step 4): (candidate, None) with
        result-derived arguments updated, or (None, failure reason)."""
        backends, done, said, turns = (make_backend(seed), make_backend(cand)), [], "", []
        for st, ct in zip(seed.turns, cand.turns):
            said += "\n" + st.user
            gold = []
            for s_step, c_step in zip(st.gold, ct.gold):
                step, outs = [], []
                for s_call, c_call in zip(s_step, c_step):
                    args = copy.deepcopy(c_call.arguments)
                    for (_, sv), (path, cv) in zip(_leaves(s_call.arguments), _leaves(c_call.arguments)):
                        if sv == cv and not re.search(_token(str(sv)), said):
                            src = next(((cr, p) for sr, cr in reversed(done) for p, v in _leaves(sr) if v == sv), None)
                            new = _at(*src) if src else None
                            if new is not None and type(new) is type(sv) and path:
                                _at(args, path[:-1])[path[-1]] = new
                    call = ToolCall(name=c_call.name, arguments=args)
                    s_out, c_out = backends[0].execute(s_call), backends[1].execute(call)
                    if is_error(c_out):
                        return None, "reexecution_failed"
                    if _shape(s_out) != _shape(c_out):
                        return None, "result_shape_changed"
                    step.append(call)
                    outs.append((s_out, c_out))
                gold.append(step)
                done.extend(outs)  # calls of one step cannot see each other's results
            turns.append(ct.model_copy(update={"gold": gold}))
        return cand.model_copy(update={"turns": turns}), None

    def synthesize(self, seed: Task, n: int, rng_seed: int) -> SynthesisResult:
        result = SynthesisResult()
        if seed.backend != "bfcl":
            result.failures["unsupported_backend"] += 1
            return result
        lits = self.literals(seed) if n > 0 else {}
        if n > 0 and not lits:
            result.failures["no_substitutable_values"] += 1
        try:
            target, base = (skill_signature(seed), with_explicit_defaults(seed)) if lits else (None, seed)
        except Exception:  # noqa: BLE001 - a seed whose gold plan fails cannot be varied
            result.failures["seed_not_replayable"] += 1
            return result
        rng = random.Random(f"resample-bfcl:{seed.id}:{rng_seed}")
        known, streak = {text_key(seed)}, 0  # streak: failed attempts since the last success
        while lits and len(result.tasks) < n and streak < self.max_attempts:
            result.attempts += 1
            mapping = self._mapping(base, lits, rng, keep=min(0.75, 0.125 * streak))
            try:
                cand, reason = (None, "no_fresh_values") if not mapping else self.execute(base, self.apply(base, lits, mapping))
                reason = (reason or accept_variant(cand, known)
                          or (None if skill_signature(cand) == target else "signature_mismatch"))
            except Exception:  # noqa: BLE001 - e.g. a class that rejects the renamed scenario
                reason = "reexecution_failed"
            if reason is not None:
                result.failures[reason] += 1
                streak += 1
            else:
                result.tasks.append(cand)
                known.add(text_key(cand))
                streak = 0
        return result

"""The ``llm`` synthesizer of RODS (docs/design.md §5): five LLM-driven stages per variant of a seed.

1. **Plan** — the LLM proposes 2-5 user turns of 1-3 calls each (the calls of a turn go to tools
   of one backend class), restricted to the seed's visible tools minus the blocklist, with their
   arguments, as JSON constrained by a schema (``llm_prompts.plan_schema``: names are an enum per
   class, each call's arguments follow its tool's closed parameter schema). An argument
   ``"$K.key"`` takes a value returned by the earlier call ``K``.
2. **Execute** — the plan runs on a fresh backend built from the seed's ``initial_state``; every
   call is its own gold step, in plan order. When a call fails, the LLM may propose a JSON patch
   of the initial state (at most 3 add/replace operations under the state's own top-level keys);
   the patched state is accepted only if the backend builds from it and the *whole* plan then
   runs without error. Otherwise the failing function is blocklisted and the LLM re-plans, with
   the error as feedback, up to ``max_attempts`` plans.
3. **Rewrite** — the LLM writes one user message per turn from the executed plan (calls, results,
   and which arguments come from earlier results).
4. **Critique** — deterministic gates first (``gate``): no empty message; no message names a
   function (identifier-like names — with ``_`` or camelCase — as words, any name as ``name(``;
   plain-word names like ``transfer`` or ``grep`` are ordinary language and pass); every gold
   tool visible in its turn; string arguments <= ``max_string_chars``, lists <= ``max_list_items``
   (recursively); ``accept_variant`` (re-execution on a fresh backend + dedup against the seed
   and the variants accepted so far); every scalar argument value stated by the user in that
   turn or earlier unless an earlier result produced it (``unstated_value``; values without a
   letter or digit, like ``..``, are exempt). Then an LLM judge answers accept/reject; on reject
   the user messages are repaired (given the judge's reason) and re-gated and re-judged, at most
   ``max_repairs`` times.
5. **Augment** (``cfg.augment``) — from each accepted task: ``miss_func`` (a tool of turn k,
   unused before it, is withheld in turns <= k; turn k's gold is emptied and the request is
   repeated verbatim in a new next turn with the tool visible: the builtin generator's
   convention); ``miss_param`` (the LLM rewrites turn k without one value the user stated there
   first; gold empty; the next turn is "The <param> is <value>." with turn k's calls);
   ``long_context`` (builtin: distractor records in every class; BFCL: ``long_context`` on; the
   gold calls must replay with every result unchanged except lists that only gained items; the
   messages are rewritten by the LLM against the new results, since equal text would be a
   duplicate, and judged like a base variant's). Augmented variants pass the deterministic gates;
   only ``long_context`` (new LLM text) also goes to the judge.

Never raises on LLM trouble: ``simulate`` raising -> ``llm_error`` (and the call stops trying:
the endpoint is down or the prompt does not fit); unparsable or schema-invalid answers ->
``invalid_json``; no plan that executes -> ``execution_failed``; a gate -> its name; a judge
rejection after the repairs -> ``judge_rejected``; nothing to augment -> ``augment_unavailable``.
An unexpected exception is logged and counted as ``internal_error``.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from agentrl.envs.base import is_error
from agentrl.envs.builtin import BUILTIN_CLASSES, DAYS
from agentrl.envs.checker import canonical, gold_replay
from agentrl.envs.registry import make_backend
from agentrl.rods import llm_prompts as P
from agentrl.rods.llm_checks import (
    RefError,
    apply_patch,
    calls_with_producers,
    extends,
    names_function,
    oversized,
    resolve_refs,
    said_in,
    scalars,
    signature_text,
    tool_classes_of,
    unstated_value,
    walk,
)
from agentrl.rods.synthesizer import SynthesisResult, accept_variant
from agentrl.tasks.schema import Provenance, Task, ToolCall, ToolSpec, Turn, text_key

log = logging.getLogger(__name__)

_PROTECTED_ROOTS = frozenset({"bfcl_id", "involved_classes", "long_context"})
_NAMES = ("Avery", "Blake", "Casey", "Devon", "Emery", "Finley", "Harper", "Jordan", "Kendall", "Logan", "Morgan", "Quinn")
_WORDS = ("archive", "budget", "draft", "ledger", "memo", "minutes", "outline", "receipt", "roster", "summary")


class _Fail(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Ctx:
    seed: Task
    tools: list[ToolSpec]  # the seed's visible tools
    tool_class: dict[str, str]
    signature: str


# -- the synthesizer ----------------------------------------------------------------------------
class LLMSynthesizer:
    """Five-stage LLM synthesizer (module docstring). ``llm`` and ``judge_llm`` (default: ``llm``;
    give a greedy one to decode the judge greedily) implement ``simulate(messages, json_schema,
    seed) -> str``. ``cfg`` is a ``RodsLLMConfig`` (max_attempts, max_repairs, max_string_chars,
    max_list_items, augment). ``synthesize`` accepts at most ``n`` base variants and tries at most
    ``generations_per_variant * n`` base generations; each accepted base task adds up to one
    variant per ``cfg.augment`` kind on top (each try counts as an attempt)."""

    name = "llm"

    def __init__(self, llm, cfg, judge_llm=None, *, generations_per_variant: int = 2, patch_state: bool = True,
                 require_stated_values: bool = True, max_state_chars: int = 3000, long_context_records: int = 8):
        self.llm = llm
        self.judge_llm = judge_llm if judge_llm is not None else llm
        self.cfg = cfg
        self.generations_per_variant = generations_per_variant
        self.patch_state = patch_state
        self.require_stated_values = require_stated_values
        self.max_state_chars = max_state_chars
        self.long_context_records = long_context_records

    # -- driver
    def synthesize(self, seed: Task, n: int, rng_seed: int) -> SynthesisResult:
        result = SynthesisResult()
        rng = random.Random(f"rods-llm:{rng_seed}:{seed.id}")
        try:
            visible = {t.name for u in range(len(seed.turns)) for t in seed.visible_tools(u)}
            tool_class = tool_classes_of(seed)
            ctx = _Ctx(seed, [t for t in seed.tools if t.name in visible], tool_class, signature_text(seed, tool_class))
        except Exception:  # noqa: BLE001
            log.exception("rods llm: cannot prepare seed %s", seed.id)
            result.failures["internal_error"] += 1
            return result
        known = {text_key(seed)}
        accepted = 0
        for _ in range(max(0, n) * self.generations_per_variant):
            if accepted >= n:
                break
            result.attempts += 1
            task, reason = self._guarded(self._generate, ctx, known, rng)
            if task is None:
                result.failures[reason] += 1
                if reason == "llm_error":
                    break
                continue
            accepted += 1
            known.add(text_key(task))
            result.tasks.append(task)
            for kind in self.cfg.augment:
                result.attempts += 1
                aug, reason = self._guarded(self._augment, kind, ctx, task, known, rng)
                if aug is None:
                    result.failures[reason] += 1
                else:
                    known.add(text_key(aug))
                    result.tasks.append(aug)
        return result

    def _guarded(self, fn, *args) -> tuple[Task | None, str]:
        try:
            return fn(*args), ""
        except _Fail as f:
            return None, f.reason
        except Exception:  # noqa: BLE001 - synthesis never raises into the caller
            log.exception("rods llm: unexpected failure")
            return None, "internal_error"

    def _ask(self, messages: list[dict[str, str]], schema: dict[str, Any], rng: random.Random,
             decode_schema: dict[str, Any] | None = None, llm=None) -> dict[str, Any]:
        try:
            text = (llm or self.llm).simulate(messages, decode_schema or schema, rng.randrange(2**31))
        except Exception as exc:  # noqa: BLE001 - unreachable endpoint, engine error, prompt too long...
            log.info("rods llm: %s request failed: %s: %s", schema.get("title"), type(exc).__name__, exc)
            raise _Fail("llm_error") from None
        try:
            value = json.loads(text, strict=False)
            jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
        except (TypeError, ValueError, RecursionError, jsonschema.ValidationError) as exc:
            log.debug("rods llm: invalid %s answer (%s): %.200s", schema.get("title"), type(exc).__name__, text)
            raise _Fail("invalid_json") from None
        return value

    # -- stages 1 + 2: plan and execute
    def _run(self, ctx: _Ctx, state: dict[str, Any], plan: dict[str, Any]):
        """Execute ``plan`` from ``state``: (calls per turn, None) or (calls so far, (call, error))."""
        backend = make_backend(ctx.seed.model_copy(update={"initial_state": state}))
        results: list[Any] = []
        turns: list[list[ToolCall]] = []
        for turn in plan["turns"]:
            turns.append([])
            for raw in turn["calls"]:
                try:
                    call = ToolCall(name=raw["name"], arguments=resolve_refs(raw["arguments"], results))
                except RefError as exc:
                    return turns, (ToolCall(name=raw["name"], arguments=raw["arguments"]), str(exc))
                try:
                    obs = backend.execute(call)
                except Exception as exc:  # noqa: BLE001 - backends should not raise; treat as a failed call
                    obs = {"error": f"{type(exc).__name__}: {exc}"}
                if is_error(obs):
                    return turns, (call, str(obs["error"]))
                results.append(obs)
                turns[-1].append(call)
        return turns, None

    def _roots(self, ctx: _Ctx, state: dict[str, Any]) -> set[str]:
        if ctx.seed.backend == "bfcl":
            return {"initial_config"}
        extra = set(ctx.tool_class.values()) if ctx.seed.backend == "builtin" else set()
        return (set(state) | extra) - _PROTECTED_ROOTS

    def _patch(self, ctx: _Ctx, state, plan, done: list[list[ToolCall]], failed: ToolCall, error: str, rng):
        """A patched state under which the whole plan runs, with its calls; or None."""
        roots = self._roots(ctx, state)
        done_text = "\n".join(P.render_call(c) for t in done for c in t)
        try:
            ops = self._ask(P.patch_messages(state, done_text, failed, error, sorted(f"/{r}" for r in roots),
                                             self.max_state_chars), P.patch_schema(), rng)["patch"]
        except _Fail:
            return None  # patching is best effort: the attempt falls back to blocklist + re-plan
        new = apply_patch(state, ops, roots) if ops else None
        if new is None:
            return None
        try:
            calls, failure = self._run(ctx, new, plan)
        except Exception:  # noqa: BLE001 - the backend rejected the patched state
            return None
        return None if failure else (new, calls)

    def _plan_and_execute(self, ctx: _Ctx, rng: random.Random) -> tuple[dict[str, Any], list[list[ToolCall]]]:
        cfg = self.cfg
        state = copy.deepcopy(ctx.seed.initial_state)
        blocked: list[str] = []
        feedback: list[str] = []
        limits = {"min_turns": 2, "max_turns": 5, "max_calls": 3, "max_chars": cfg.max_string_chars,
                  "max_items": cfg.max_list_items}
        for _ in range(cfg.max_attempts):
            tools = [t for t in ctx.tools if t.name not in blocked]
            if not tools:
                break
            schema = P.plan_schema(tools, ctx.tool_class)
            decode = P.plan_schema(tools, ctx.tool_class, bounds=(cfg.max_string_chars, cfg.max_list_items))
            plan = self._ask(P.plan_messages(ctx.seed, tools, ctx.tool_class, ctx.signature, blocked, feedback, limits,
                                             self.max_state_chars), schema, rng, decode)
            calls, failure = self._run(ctx, state, plan)
            if failure is None:
                return state, calls
            failed, error = failure
            if self.patch_state:
                patched = self._patch(ctx, state, plan, calls, failed, error, rng)
                if patched is not None:
                    return patched
            if failed.name not in blocked:
                blocked.append(failed.name)
            feedback.append(f"{P.render_call(failed)} failed: {error[:200]}")
        raise _Fail("execution_failed")

    # -- stages 3 + 4: rewrite and critique
    def _task(self, ctx: _Ctx, state, calls: list[list[ToolCall]], texts: list[str], category: str = "base") -> Task:
        seed = ctx.seed
        return Task(id="pending", domain=seed.domain, category=category, tools=copy.deepcopy(seed.tools),
                    backend=seed.backend, initial_state=state,
                    turns=[Turn(user=t, gold=[[c] for c in cs]) for t, cs in zip(texts, calls)],
                    provenance=Provenance(kind="synth", parent_id=seed.id, synthesizer=self.name))

    def _with_texts(self, task: Task, texts: list[str]) -> Task:
        return task.model_copy(update={"turns": [t.model_copy(update={"user": s}) for t, s in zip(task.turns, texts)]})

    def gate(self, task: Task, known: set[tuple[str, ...]]) -> str | None:
        """The first deterministic gate ``task`` fails (module docstring), or None."""
        names = [t.name for t in task.tools]
        for turn in task.turns:
            if not turn.user.strip():
                return "empty_user_turn"
            if names_function(turn.user, names):
                return "names_function"
        for u in range(len(task.turns)):
            visible = {t.name for t in task.visible_tools(u)}
            for call in task.gold_calls(u):
                if call.name not in visible:
                    return "gold_tool_hidden"
                reason = oversized(call.arguments, self.cfg.max_string_chars, self.cfg.max_list_items)
                if reason:
                    return reason
        reason = accept_variant(task, known)
        if reason:
            return reason
        if self.require_stated_values and unstated_value(task) is not None:
            return "unstated_value"
        return None

    def _rewrite(self, task: Task, rng: random.Random, known) -> Task:
        n = len(task.turns)
        texts = self._ask(P.rewrite_messages(P.render_executed(walk(task)), n), P.texts_schema(n, "rewrite"), rng)["turns"]
        task = self._with_texts(task, texts)
        reason = self.gate(task, known)
        if reason:
            raise _Fail(reason)
        return task

    def _generate(self, ctx: _Ctx, known: set[tuple[str, ...]], rng: random.Random) -> Task:
        state, calls = self._plan_and_execute(ctx, rng)
        task = self._rewrite(self._task(ctx, state, calls, [""] * len(calls)), rng, known)
        return self._critique(ctx, task, known, rng)

    def _critique(self, ctx: _Ctx, task: Task, known: set[tuple[str, ...]], rng: random.Random) -> Task:
        """The LLM judge on a gated task, with up to ``max_repairs`` repairs of its user turns."""
        steps = walk(task)
        used = [t for t in task.tools if any(c.name == t.name for u in range(len(task.turns)) for c in task.gold_calls(u))]
        tools_text = P.render_tools(used, ctx.tool_class)
        for repair in range(self.cfg.max_repairs + 1):
            texts = [t.user for t in task.turns]
            verdict = self._ask(P.judge_messages(tools_text, P.render_executed(steps, texts)), P.VERDICT_SCHEMA, rng,
                                llm=self.judge_llm)
            if verdict["verdict"] == "accept":
                return task
            if repair == self.cfg.max_repairs:
                break
            n = len(texts)
            texts = self._ask(P.repair_messages(P.render_executed(steps, texts), n, verdict["reason"]),
                              P.texts_schema(n, "repair"), rng)["turns"]
            task = self._with_texts(task, texts)
            reason = self.gate(task, known)
            if reason:
                raise _Fail(reason)
        raise _Fail("judge_rejected")

    # -- stage 5: augment
    def _augment(self, kind: str, ctx: _Ctx, task: Task, known: set[tuple[str, ...]], rng: random.Random) -> Task:
        if kind == "miss_func":
            aug = self._miss_func(task, rng)
        elif kind == "miss_param":
            aug = self._miss_param(task, rng)
        elif kind == "long_context":
            # New user text (equal text would be a duplicate of the base task), written against the
            # results with distractors, so it is judged like a base variant's.
            aug = self._long_context(ctx, task, rng)
            aug = self._critique(ctx, self._rewrite(aug, rng, known), known, rng)
        else:
            raise _Fail("augment_unavailable")
        reason = self.gate(aug, known)
        if reason:
            raise _Fail(reason)
        return aug

    def _miss_func(self, task: Task, rng: random.Random) -> Task:
        options = []
        for k in range(len(task.turns)):
            used_before = {c.name for u in range(k) for c in task.gold_calls(u)}
            options += [(k, name) for name in dict.fromkeys(c.name for c in task.gold_calls(k)) if name not in used_before]
        if not options:
            raise _Fail("augment_unavailable")
        k, name = rng.choice(options)
        turns = [t.model_copy(update={"withheld_tools": [name]}) for t in task.turns[:k]]
        turns += [Turn(user=task.turns[k].user, withheld_tools=[name]), task.turns[k].model_copy(deep=True)]
        turns += [t.model_copy(deep=True) for t in task.turns[k + 1:]]
        return task.model_copy(update={"category": "miss_func", "turns": turns})

    def _miss_param(self, task: Task, rng: random.Random) -> Task:
        options = []
        for u, _, call, _, produced in calls_with_producers(task):
            before = "\n".join(t.user for t in task.turns[:u])
            for path, v in scalars(call.arguments):
                if (isinstance(v, bool) or canonical(v) in produced or not re.search(r"[^\W_]", str(v))
                        or not said_in(v, task.turns[u].user) or said_in(v, before)):
                    continue
                param = next((p for p in reversed(path.split(".")) if not p.isdigit()), path)
                options.append((u, param, v))
        options = list(dict.fromkeys((u, p, canonical(v)) for u, p, v in options))
        if not options:
            raise _Fail("augment_unavailable")
        k, param, vkey = rng.choice(options)
        value = json.loads(vkey)
        label = param.replace("_", " ")
        message = self._ask(P.miss_param_messages(task.turns[k].user, label, value), P.MISS_PARAM_SCHEMA, rng)["message"]
        if said_in(value, message):
            raise _Fail("miss_param_value_kept")
        turns = [t.model_copy(deep=True) for t in task.turns]
        turns[k:k + 1] = [Turn(user=message), task.turns[k].model_copy(update={"user": f"The {label} is {value}."}, deep=True)]
        return task.model_copy(update={"category": "miss_param", "turns": turns})

    def _long_context(self, ctx: _Ctx, task: Task, rng: random.Random) -> Task:
        base = gold_replay(task)
        for _ in range(3):
            if task.backend == "bfcl" and task.initial_state.get("long_context") is False:
                state = {**copy.deepcopy(task.initial_state), "long_context": True}
            elif task.backend == "builtin":
                state = self._distractors(task, ctx, rng)
            else:
                raise _Fail("augment_unavailable")
            aug = task.model_copy(update={"category": "long_context", "initial_state": state})
            try:
                new = gold_replay(aug)
            except Exception:  # noqa: BLE001 - the distractors broke a gold call
                continue
            if all(extends(a, b) for t0, t1 in zip(base, new) for a, b in zip(t0.results, t1.results)):
                return aug
            if task.backend == "bfcl":
                break
        raise _Fail("augment_changed_results")

    def _distractors(self, task: Task, ctx: _Ctx, rng: random.Random) -> dict[str, Any]:
        """The builtin state plus ``long_context_records`` distractor records per class of the
        task's tools (fresh ids, titles/paths unlike any in the state or the gold calls)."""

        state = copy.deepcopy(task.initial_state)
        taken = canonical(state) + canonical([c.model_dump() for u in range(len(task.turns)) for c in task.gold_calls(u)])
        for cname in sorted(set(ctx.tool_class.values()) & set(BUILTIN_CLASSES)):
            cls = BUILTIN_CLASSES[cname]
            cstate = state.setdefault(cname, {})
            records = cstate.setdefault(cls.records_key, {})
            for i in range(self.long_context_records):
                rid = f"{cls.id_prefix}{rng.randrange(1000, 10000)}"
                if rid in records or rid in taken:
                    continue
                word = rng.choice(_WORDS)
                if cname == "Bank":
                    records[rid] = {"owner": rng.choice(_NAMES), "balance": rng.randrange(5, 1000, 5)}
                elif cname == "Calendar":
                    title = f"{word} check {i}"
                    if title.lower() in taken.lower():
                        continue
                    records[rid] = {"title": title, "day": rng.choice(DAYS)}
                else:
                    records[rid] = {"path": f"old/{word}-{rid.lower()}.txt", "text": f"Old {word} notes."}
        return state

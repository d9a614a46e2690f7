"""Each phase of a quickstart step against its bare library, as ratios measured in one run.

1. **quickstart**: ``agentrl train configs/quickstart.yaml`` for ``--steps`` steps (no
   evaluations; trajectories recorded), in its own process. From its metrics: the rollout path's
   policy tokens per second of generation (``train/policy_tokens`` / ``time/generate``), the
   learner's step time, the weight sync's share of a step, the step time. From its trajectory
   records: the step's episodes (prompt, total and policy token counts).
2. **bare vLLM** (a subprocess): ``vllm.LLM`` with the rollout engine's settings (fp32,
   ``max_model_len``, eager, prefix caching, the same KV cache size), one ``generate`` of as many
   sequences as a step has episodes (the rollout path's concurrency), each a random prompt of the
   episodes' mean prompt length (``ignore_eos``): once with each sequence as long as one recorded
   episode's policy tokens (the same stragglers as the step), once all of the mean length. The
   engine's own tokens/s for that work in one pass, without turns, tools or Ray.
3. **bare vLLM, multi-turn** (a subprocess): the same step's episodes replayed message by message
   through a bare ``AsyncLLM`` (all concurrent; each assistant message one request of its recorded
   length, the recorded environment text appended between): the engine's tokens/s on the
   multi-turn pattern itself, so the rollout path's gap to phase 2 splits into what the pattern
   costs any multi-turn rollout and what agentrl adds.
4. **learner vs plain torch** (a subprocess): ``DeepSpeedLearner.train_step`` (the run's
   learner settings) on a batch with the recorded episodes' lengths, against a plain-torch loop
   doing the same work: micro-batches of the same size, length-sorted as the learner's (so both
   pad the same), a reference forward, a policy forward and backward per
   micro-batch, gradient clipping, one AdamW step. Both with every core
   (``torch.set_num_threads``); the median of ``--repeats`` after one warm-up each.

    .venv/bin/python benchmarks/throughput_ratios.py              # ~6 min on 2 idle cores
    .venv/bin/python benchmarks/throughput_ratios.py --steps 3 --repeats 2

Writes ``results.json`` and ``table.md`` to ``--out`` (docs/benchmarks/throughput); the run
folder goes to .cache/benchmarks/throughput. A ratio is only meaningful within one run: these
machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_methods import ROOT, train_quickstart  # noqa: E402

RESULT = "RESULT "  # a phase subprocess's result line (vLLM and DeepSpeed print to stdout too)


def quickstart(steps: int, run_dir: Path | None = None, overrides: tuple[str, ...] = ()) -> dict:
    """Phase 1: a short quickstart run with ``overrides`` (or ``run_dir``, one made before by this
    script); per-step metrics, the last step's episodes and the run's config (whose engine and
    learner settings the other phases copy)."""
    import yaml

    from agentrl.telemetry.trajectories import read_trajectories

    minutes = None
    if run_dir is None:
        run_dir, minutes, err = train_quickstart(ROOT / ".cache" / "benchmarks" / "throughput", [
            f"train.steps={steps}", "train.eval_at_start=false", "train.eval_at_end=false", "run.name=throughput",
            "telemetry.trajectories_every=1", *overrides])
        if run_dir is None:
            raise SystemExit(f"error: the quickstart run failed:\n{err}")
    run_dir = run_dir.resolve()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r][1:]  # step 1 compiles and warms up: not a steady step
    episodes = read_trajectories(run_dir, step=steps)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
        "run_dir": str(run_dir.relative_to(ROOT)), "minutes": minutes and round(minutes, 1), "steady_steps": len(rows),
        "step_s": med("time/step"), "generate_s": med("time/generate"), "learn_s": med("time/learn"),
        "learner_step_s": med("learner/step_time_s"), "sync_s": med("time/sync"),
        "policy_tokens_per_step": med("train/policy_tokens"),
        "rollout_tokens_per_s": statistics.median(r["train/policy_tokens"] / r["time/generate"] for r in rows),
        "sync_share": statistics.median(r["time/sync"] / r["time/step"] for r in rows),
        "episodes": [{"tokens": e["tokens"], "policy_tokens": e["policy_tokens"], "prompt_tokens": e["prompt_tokens"]}
                     for e in episodes],
        # each episode's token stream in its recorded chunks (prompt, assistant, environment):
        # what the multi-turn replay (phase 3) sends to a bare engine
        "chunks": [[(m["role"], m["text"]) for m in e["messages"]] for e in episodes],
    }


def _subprocess(phase: str, spec: dict) -> dict:
    """Run ``phase`` of this script in a fresh process (its own vLLM / torch state); its JSON result."""
    proc = subprocess.run([sys.executable, __file__, "--phase", phase, "--spec", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True)
    results = [line[len(RESULT):] for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not results:
        raise SystemExit(f"error: phase {phase} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(results[-1])


def engine_kwargs(spec: dict) -> dict:
    """vLLM engine arguments with the run's rollout engine settings (``spec["engine"]``, from its
    saved config.yaml), for the bare phases; exports the CPU KV-cache size the way VLLMEngine does."""
    engine = spec["engine"]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine["kv_cache_gib"]))
    return dict(model=str(ROOT / spec["model"]), dtype="float32", seed=0, max_model_len=engine["max_model_len"],
                enforce_eager=engine["enforce_eager"], enable_prefix_caching=True, disable_log_stats=True,
                block_size=engine.get("block_size"))


def bare_vllm(spec: dict) -> dict:
    """Phase 2 (in its own process): plain ``vllm.LLM.generate`` with the rollout engine's settings."""
    import random

    kwargs = engine_kwargs(spec)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**kwargs)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)

    def prompts(n: int) -> list:
        return [TokensPrompt(prompt_token_ids=[rng.randrange(vocab) for _ in range(spec["prompt_len"])]) for _ in range(n)]

    def run(lengths: list[int]) -> dict:
        params = [SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True, logprobs=0) for n in lengths]
        t0 = time.perf_counter()
        outs = llm.generate(prompts(len(lengths)), params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}

    run([8] * 4)  # warm-up
    # every sequence the mean length (no stragglers), and the episodes' own lengths (the longest
    # one sets the wall time, as it sets the rollout phase's)
    return {"uniform": run([spec["new_tokens"]] * spec["sequences"]), "recorded": run(spec["lengths"])}


def bare_multiturn(spec: dict) -> dict:
    """Phase 3 (in its own process): the step's episodes replayed message by message through a bare
    ``AsyncLLM`` with the rollout engine's settings: no agentrl, no Ray, no tools, no parsing.

    Every recorded episode is one coroutine, all concurrent (the rollout path's concurrency): its
    prompt (the recorded text's ids), then for each assistant message a request of exactly that
    message's length (``ignore_eos``, the finished output only, no detokenization), then the
    recorded environment text's ids appended, and the next message. The engine's tokens/s on the
    multi-turn pattern itself (a prefill of the grown context and a new request per message)."""
    import asyncio

    kwargs = engine_kwargs(spec)
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    tok = AutoTokenizer.from_pretrained(kwargs["model"])

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    # (ids of the prompt, then per message: (new tokens, ids of the environment text after it))
    episodes = []
    for chunks in spec["chunks"]:
        prompt, messages = [], []
        for role, text in chunks:
            if role == "prompt":
                prompt += encode(text)
            elif role == "assistant":
                messages.append([len(encode(text)), []])
            elif messages:
                messages[-1][1] += encode(text)
        episodes.append((prompt, messages))

    async def replay() -> dict:
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs, logprobs_mode="processed_logprobs"))
        ids = iter(range(10**9))

        async def generate(prompt: list[int], n: int) -> list[int]:
            params = SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True, logprobs=0, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=f"r{next(ids)}"):
                final = out
            return list(final.outputs[0].token_ids)

        async def episode(prompt: list[int], messages: list) -> int:
            stream, n = list(prompt), 0
            for length, env in messages:
                if length:
                    new = await generate(stream, length)
                    stream += new
                    n += len(new)
                stream += env
            return n

        await generate([1, 2, 3, 4], 8)  # warm-up
        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(episode(p, m) for p, m in episodes)))
        seconds = time.perf_counter() - t0
        llm.shutdown()
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                "messages": sum(len(m) for _, m in episodes)}

    return asyncio.run(replay())


def learner_vs_torch(spec: dict) -> dict:
    """Phase 4 (in its own process): the DeepSpeed learner's step and a plain-torch step, same batch."""
    import random

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.config.algo_schema import AlgoConfig, LearnerConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner
    from agentrl.engines.hf_policy import pad_batch, token_logprobs

    torch.set_num_threads(os.cpu_count())
    cfg = spec["config"]  # the run's saved config
    lcfg = LearnerConfig(**{**cfg["learner"], "threads": os.cpu_count()})
    acfg = AlgoConfig(**cfg["algo"])
    model_path = str(ROOT / spec["model"])
    rng = random.Random(0)
    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    ids, mask = [], []
    for e in spec["episodes"]:  # the recorded lengths: the prompt first, then the policy tokens' share of the rest
        ids.append([rng.randrange(vocab) for _ in range(e["tokens"])])
        rest = e["tokens"] - e["prompt_tokens"]
        mask.append([0] * e["prompt_tokens"] + [1] * min(rest, e["policy_tokens"]) + [0] * max(0, rest - e["policy_tokens"]))
    adv = [[rng.choice((-1.0, 1.0)) * m for m in mk] for mk in mask]
    batch = {"input_ids": ids, "response_mask": mask, "advantages": adv,
             "rollout_logprobs": [[-1.0 * m for m in mk] for mk in mask]}
    n_tok = sum(map(sum, mask))

    learner = DeepSpeedLearner(model_path, lcfg, acfg, "float32", seed=0)
    learner.train_step(batch)  # warm-up
    ds_times = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        learner.train_step(batch)
        ds_times.append(time.perf_counter() - t0)
    learner.close()

    policy = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    opt = torch.optim.AdamW(policy.parameters(), lr=lcfg.lr, betas=tuple(lcfg.betas))
    # length-sorted micro-batches, as the learner makes them: both pad the same
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    micro = [order[i:i + lcfg.micro_batch_size] for i in range(0, len(ids), lcfg.micro_batch_size)]

    def torch_step() -> None:
        padded = [pad_batch([ids[i] for i in mb], 0, [mask[i] for i in mb], [adv[i] for i in mb]) for mb in micro]
        with torch.no_grad():
            refs = [token_logprobs(reference, p[0], p[1]) for p in padded]
        opt.zero_grad()
        for (x, attn, m, a), ref in zip(padded, refs):
            lp = token_logprobs(policy, x, attn)
            kl = torch.exp(ref - lp) - (ref - lp) - 1  # k3, as the learner's kl_estimator
            loss = ((-a * lp + acfg.kl_coef * kl) * m).sum() / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), lcfg.grad_clip)
        opt.step()

    torch_step()  # warm-up
    torch_times = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        torch_step()
        torch_times.append(time.perf_counter() - t0)
    tokens = sum(map(len, ids))
    return {"threads": torch.get_num_threads(), "sequences": len(ids), "tokens": tokens, "policy_tokens": n_tok,
            "deepspeed_s": statistics.median(ds_times), "torch_s": statistics.median(torch_times),
            "deepspeed_all": ds_times, "torch_all": torch_times}


def table(r: dict) -> str:
    q, v, lt = r["quickstart"], r["bare_vllm"], r["learner"]
    uniform, recorded = v["uniform"]["tokens_per_s"], v["recorded"]["tokens_per_s"]
    multiturn = r["bare_multiturn"]["tokens_per_s"]
    rows = [
        ("rollout path ÷ bare vLLM, the episodes' own lengths (policy tokens/s)",
         f"{q['rollout_tokens_per_s']:.0f} ÷ {recorded:.0f}", q["rollout_tokens_per_s"] / recorded, "≥ 0.9"),
        ("rollout path ÷ bare vLLM, every sequence the mean length", f"{q['rollout_tokens_per_s']:.0f} ÷ {uniform:.0f}",
         q["rollout_tokens_per_s"] / uniform, "-"),
        ("rollout path ÷ bare AsyncLLM replaying the same messages one request each",
         f"{q['rollout_tokens_per_s']:.0f} ÷ {multiturn:.0f}", q["rollout_tokens_per_s"] / multiturn, "-"),
        ("bare multi-turn replay ÷ bare one-pass generation, same lengths", f"{multiturn:.0f} ÷ {recorded:.0f}",
         multiturn / recorded, "-"),
        ("learner ÷ plain torch (step time⁻¹, all cores)", f"{lt['torch_s']:.2f} s ÷ {lt['deepspeed_s']:.2f} s",
         lt["torch_s"] / lt["deepspeed_s"], "≥ 0.9"),
        ("weight sync share of a step", f"{q['sync_s']:.3f} s of {q['step_s']:.1f} s", q["sync_share"], "≤ 0.05"),
    ]
    lines = ["| ratio | measured | value | target |", "|---|---|---|---|"]
    lines += [f"| {name} | {measured} | {value:.2f} | {target} |" for name, measured, value, target in rows]
    lines += ["", f"Quickstart step (median of steps 2-{q['steady_steps'] + 1}): {q['step_s']:.1f} s = generate "
              f"{q['generate_s']:.1f} s + learn {q['learn_s']:.1f} s + sync {q['sync_s']:.2f} s (+ the rest); "
              f"{q['policy_tokens_per_step']:.0f} policy tokens, {len(q['episodes'])} episodes (policy tokens: mean "
              f"{v['new_tokens']}, max {max(v['lengths'])}), {lt['tokens']} tokens in the learner's batch; learner "
              f"threads {lt['threads']}."]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "throughput")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quickstart-run", type=Path, help="reuse a run folder phase 1 made before (skips the run)")
    p.add_argument("--override", action="append", default=[],
                   help="KEY=VALUE for the quickstart run (repeatable); the bare phases copy the run's settings")
    p.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)  # internal: one subprocess
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        spec = json.loads(args.spec)
        print(RESULT + json.dumps(PHASES[args.phase](spec)), flush=True)
        return 0
    print(f"1/4 quickstart, {args.steps} steps (~{2 + args.steps * 0.4:.0f} min)", flush=True)
    q = quickstart(args.steps, args.quickstart_run, tuple(args.override))
    eps, chunks, config = q["episodes"], q.pop("chunks"), q.pop("config")
    model, engine = config["model"]["path"], config["rollout"]["engine"]
    q["engine"] = engine
    spec = {"model": model, "engine": engine, "sequences": len(eps),
            "prompt_len": round(statistics.mean(e["prompt_tokens"] for e in eps)),
            "new_tokens": round(statistics.mean(e["policy_tokens"] for e in eps)),
            "lengths": [e["policy_tokens"] for e in eps]}
    print(f"2/4 bare vLLM: {spec['sequences']} sequences x {spec['new_tokens']} new tokens, "
          f"{spec['prompt_len']}-token prompts", flush=True)
    v = _subprocess("bare_vllm", spec)
    print(f"3/4 bare vLLM, the same episodes replayed message by message ({len(chunks)} concurrent)", flush=True)
    mt = _subprocess("bare_multiturn", {**spec, "chunks": chunks})
    print(f"4/4 learner vs plain torch: {len(eps)} sequences, {args.repeats} repeats", flush=True)
    lt = _subprocess("learner", {"model": model, "config": config, "episodes": eps, "repeats": args.repeats})
    result = {"date": time.strftime("%Y-%m-%d"), "command": "benchmarks/throughput_ratios.py " + " ".join(sys.argv[1:]),
              "cpus": os.cpu_count(), "quickstart": q, "bare_vllm": {**v, **spec},
              "bare_multiturn": mt, "learner": lt}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "table.md").write_text(table(result) + "\n")
    print(table(result))
    return 0


PHASES = {"bare_vllm": bare_vllm, "bare_multiturn": bare_multiturn, "learner": learner_vs_torch}

if __name__ == "__main__":
    raise SystemExit(main())

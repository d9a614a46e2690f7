"""``agentrl`` command line: train, plan, eval, show, make-model, tasks export.

Everything heavy (torch, Ray, vLLM, DeepSpeed) is imported inside the subcommand that needs it, so
``agentrl --help`` and a config typo answer in well under a second, and a bad config exits 2
before any run folder, Ray cluster or model exists. The same entry point runs locally and under
``ray job submit -- agentrl train CONFIG``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from agentrl import __version__
from agentrl.checkpointing.preemption import EXIT_PREEMPTED, Preempted, ResumableFailure
from agentrl.cli._common import fail as _fail
from agentrl.cli.make_model import add_make_model_parser
from agentrl.common.plugins import find_plugin_error, load_plugins
from agentrl.config import InputError
from agentrl.config.process_env import set_default_env
from agentrl.telemetry.trajectories import TrajectoryError, read_trajectories
from agentrl.telemetry.transcript import print_episodes

EXAMPLES = """\
examples:
  agentrl make-model
  agentrl train configs/quickstart.yaml
  agentrl train configs/quickstart.yaml rollout.group_size=4 train.steps=5
  agentrl train --resume runs/quickstart-20250101-120000 train.steps=40
  agentrl plan configs/bfcl_qwen3_4b_8gpu.yaml --cluster nodes=1,gpus_per_node=8,cpus_per_node=64,gpu_gib=80
  agentrl eval --tasks builtin:heldout --model agentrl/assets/tiny-agent
  agentrl eval --tasks bfcl:all --policy gold
  agentrl show runs/quickstart-20250101-120000 --step 20 --failed
  agentrl show runs/eval --failed
  agentrl tasks export builtin:heldout heldout.parquet
"""


# `agentrl eval --help`: every task source (agentrl/envs/sources.py, agentrl/tasks/io.py);
# tests/test_eval_cli.py checks it names every registered prefix, builtin split, BFCL category
# and split, and τ²-bench domain.
EVAL_SOURCES = """\
task sources (--tasks):
  builtin:<split>                 generated tool-use tasks; split: train (400), heldout (200) of the
                                  full suite, bank-train, bank-heldout of the quickstart's bank suite;
                                  every split: {builtin_splits}
  bfcl:<category>[:<split>]       BFCL v4 multi-turn; category: base, miss_func, miss_param,
                                  long_context, all; split: eval (default), train, full
  tau2:<domain>[:<split>]         τ²-bench with LLM-simulated tools (needs tools.sgls);
                                  domain: airline, retail; split: test (default), train, full
  FILE.jsonl, FILE.parquet        a task file (`agentrl tasks export` writes one; schema:
                                  agentrl/tasks/schema.py)

examples:
  agentrl eval --tasks builtin:heldout --model runs/quickstart-20250101-120000/final
  agentrl eval --tasks builtin:heldout --model runs/quickstart-20250101-120000/checkpoint-10 rollout.max_new_tokens=128
  agentrl eval --tasks builtin:heldout --model agentrl/assets/tiny-agent --samples 8 --temperature 1.0
  agentrl eval --tasks bfcl:all --policy gold
  agentrl eval --tasks tau2:airline --model Qwen/Qwen2.5-0.5B-Instruct tools.sgls.model_path=/models/simulator
"""


def _eval_sources() -> str:
    """``EVAL_SOURCES`` with every builtin split the generator defines (the method settings add some)."""
    from agentrl.envs.builtin.generator import SPLIT_SIZES

    return EVAL_SOURCES.replace("{builtin_splits}", ", ".join(SPLIT_SIZES))


def _run(fn, *args, **kwargs) -> int:
    """``fn`` (a run); 2 when the runtime stops on bad input.

    The driver and driver/cluster.py check the model path, the task files and the RODS state
    before a run folder or Ray exists, and stop with ``InputError("<key>: <reason>")``. So is a
    plugin's ``PluginError`` (a reward's bad value, a tool exception under
    rollout.on_tool_error=fail), wherever it was raised: its message alone is printed."""
    try:
        fn(*args, **kwargs)
    except InputError as err:
        return _fail(err)
    except (Preempted, ResumableFailure):
        return EXIT_PREEMPTED  # the driver printed what was saved and how to continue
    except Exception as err:
        # a plugin's bad value or exception, raised here or in an actor: one message, no traceback
        if (bad := find_plugin_error(err)) is None:
            raise
        return _fail(bad)
    return 0


def _train(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError, load_config
    from agentrl.config.resume import load_resume_config

    if args.resume is None and args.config is None:
        return _fail("train: give CONFIG (a YAML run config) or --resume RUN (a run folder)")
    if args.resume == "auto":
        return _train_auto(args)
    overrides = list(args.overrides)
    if args.resume is not None and args.config is not None:
        if "=" not in args.config:  # argparse took the first KEY=VALUE for CONFIG; anything else is a config
            return _fail(f"--resume {args.resume}: a resumed run uses its own config.yaml; give no CONFIG "
                         f"({args.config}), only KEY=VALUE overrides")
        overrides.insert(0, args.config)
    try:
        config = load_config(args.config, overrides) if args.resume is None else load_resume_config(args.resume, overrides)
    except ConfigError as err:
        return _fail(err)
    if (failed := _preflight(config, args)) is not None:
        return failed
    from agentrl.driver.run import train  # torch/Ray only from here on

    if args.resume is not None:
        return _run(train, config, config_path=str(Path(args.resume) / "config.yaml"), resume=args.resume)
    return _run(train, config, config_path=args.config)


def _train_auto(args: argparse.Namespace) -> int:
    """``train CONFIG --resume auto``: the run folder is ``run.output_dir/<run.name>`` (no
    timestamp), so restarting the same command finds it: it continues from the folder's newest
    complete checkpoint, or starts there when it has none (a folder left by an attempt that died
    before its first checkpoint is moved aside, not mixed in). With ``run.storage`` the run's
    folder there, ``<storage>/<run.name>``, decides: its newest complete checkpoint (and config)
    is downloaded into the local folder, which may be empty or absent (another node, a new pod)."""
    import time

    from agentrl.checkpointing.checkpoint import find_checkpoint
    from agentrl.config import ConfigError, load_config
    from agentrl.config.resume import load_resume_config

    if args.config is None or "=" in args.config:
        return _fail("--resume auto needs CONFIG: the run folder is its run.output_dir/<run.name>")
    try:
        config = load_config(args.config, args.overrides)
        run_dir = Path(config.run.output_dir) / config.run.name
        if config.run.storage:
            resumable = _fetch_stored_config(config, run_dir)
        else:
            resumable = find_checkpoint(run_dir) is not None if run_dir.is_dir() else False
        if resumable:  # the folder's own config, as for --resume RUN (overrides that change no math only)
            config = load_resume_config(run_dir, args.overrides)
    except ConfigError as err:
        return _fail(err)
    if (failed := _preflight(config, args)) is not None:
        return failed
    from agentrl.driver.run import train

    if resumable:
        return _run(train, config, config_path=str(run_dir / "config.yaml"), resume=run_dir)
    if run_dir.exists():
        aside = run_dir.with_name(f"{run_dir.name}.attempt-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(aside)
        print(f"agentrl: {run_dir} holds no complete checkpoint: moved to {aside}; starting the run afresh", flush=True)
    return _run(train, config, config_path=args.config, run_dir=run_dir)


def _fetch_stored_config(config, run_dir: Path) -> bool:
    """``--resume auto`` with ``run.storage``: whether the run's folder there holds a complete
    checkpoint; if so its ``config.yaml`` is downloaded into ``run_dir`` (the run's own config, as
    ``--resume RUN`` reads it)."""
    from agentrl.checkpointing.checkpoint import PREFIX, run_storage
    from agentrl.config import ConfigError

    try:
        store = run_storage(config, run_dir)
        if not store.complete_numbered(PREFIX):
            return False
        data = store.read_bytes("config.yaml")
    except (OSError, ValueError) as err:  # pyarrow.fs: a bad URI, unreachable, no such bucket, no access
        raise ConfigError(f"run.storage: cannot read the run's folder there: {err}", key="run.storage") from None
    if data is None:
        raise ConfigError(f"run.storage: {store} holds checkpoints but no config.yaml", key="run.storage")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_bytes(data)
    return True


def _preflight(config, args: argparse.Namespace) -> int | None:
    """``agentrl train``'s pre-flight: the run's plan checked against the cluster it will use (the
    connected one, or the embedded cluster on this machine; planning/plan.py), before any run
    folder or actor exists. 2 with the plan and its reasons when the job cannot be placed or does
    not fit, else None (one summary line printed)."""
    if args.no_plan:
        return None
    from agentrl.planning.plan import preflight

    if config.runtime.ray_address or os.environ.get("RAY_ADDRESS"):
        # torch before ray.init, as the driver loads it (driver.train: oneMKL under `ray job submit`)
        import torch  # noqa: F401
    try:
        report = preflight(config, allow_cpu=args.allow_cpu, log=lambda line: print(line, flush=True))
    except Exception as err:  # noqa: BLE001 - the cluster cannot be reached: the run could not either
        return _fail(f"plan: cannot read the Ray cluster: {type(err).__name__}: {err}")
    if not report.ok:
        print(report.render(), file=sys.stderr)
        return _fail("the run cannot start as configured (the plan above; `agentrl plan CONFIG` prints it, "
                     "docs/operating.md); --no-plan skips this check")
    print(report.summary(), flush=True)
    for line in [f"plan: note: {n}" for n in report.notes] + [f"plan: warning: {w}" for w in report.warnings]:
        print(line, flush=True)
    return None


def _plan(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError, load_config

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as err:
        return _fail(err)
    if args.cluster and args.address:
        return _fail("--cluster declares a cluster and --address reads a running one: give one of them")
    if args.reserve and args.cluster:
        return _fail("--reserve places the plan on a running cluster: use it with --address (or RAY_ADDRESS), not --cluster")
    from agentrl.planning.cluster_shape import connected_cluster, parse_shape, this_machine
    from agentrl.planning.plan import check_plan, reserve

    address = None if args.cluster else args.address or config.runtime.ray_address or os.environ.get("RAY_ADDRESS")
    try:
        if args.cluster:
            cluster = parse_shape(args.cluster)
        elif address:
            cluster = connected_cluster(address, gpu_gib=args.gpu_gib)
        else:
            cluster = this_machine(config)
    except ValueError as err:
        return _fail(f"--cluster {args.cluster}: {err}" if args.cluster else err)
    except Exception as err:  # noqa: BLE001 - ConnectionError and Ray's own
        return _fail(f"cannot read the Ray cluster at {address}: {type(err).__name__}: {err}")
    if args.gpu_gib:
        for node in cluster.nodes:
            if node.gpus and node.gpu_gib is None:
                node.gpu_gib = args.gpu_gib
        cluster.notes = [n for n in cluster.notes if not n.startswith("GPU memory of")]
    report = check_plan(config, cluster, allow_cpu=args.allow_cpu, model_config=args.model_config)
    shown = " ".join([args.config or "(defaults)", *args.overrides])
    print(f"agentrl plan: {shown}")
    print(report.render(), flush=True)
    if not report.ok:
        return _fail(f"the run cannot start as configured: {len(report.reasons)} reason(s) above")
    if args.reserve:
        if not address:
            return _fail("--reserve places the plan on a running cluster: give --address (or set RAY_ADDRESS)")
        missing = reserve(report, address, timeout_s=args.reserve_timeout)
        if missing:
            return _fail(f"--reserve: Ray did not place {', '.join(missing)} within {args.reserve_timeout:g}s "
                         "(resources held by other jobs, or nodes the plan's count cannot see)")
        print(f"reserve: Ray placed every placement group of the plan on {address} (released again)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError
    from agentrl.tasks.io import TaskFileError

    try:
        config, used = _eval_config(args)
    except ConfigError as err:
        return _fail(err)
    print(f"agentrl eval: config {used}" + (f", overrides {' '.join(args.overrides)}" if args.overrides else ""),
          flush=True)
    from agentrl.driver.evaluate import evaluate

    try:
        return _run(evaluate, config, args.tasks, gold=args.policy == "gold", out_path=args.out, limit=args.limit,
                    samples=args.samples, temperature=args.temperature)
    except (TaskFileError, ValueError, RuntimeError) as err:
        return _fail(err)


def _eval_config(args: argparse.Namespace):
    """The config ``agentrl eval`` runs with, and where it came from (printed). A model of a training
    run (``RUN/final``, ``RUN/checkpoint-N``, or ``RUN`` itself for its ``final``) is evaluated with
    the run's resolved config (``RUN/config.yaml``): the rollout sizes, dtype, chat format and
    tools it was trained with, not the defaults. ``--config`` replaces it; KEY=VALUE overrides
    apply on top of either; ``model.path`` is always the model given."""
    from agentrl.config import load_config
    from agentrl.config.resume import CONFIG_FILE

    model, run = args.model, None
    if model is not None:
        path = Path(model)
        if (path / CONFIG_FILE).is_file() and (path / "final" / "config.json").is_file():
            model, run = str(path / "final"), path
        elif (path / "config.json").is_file() and (path.parent / CONFIG_FILE).is_file() and (
                path.name == "final" or (path.name.startswith("checkpoint-") and path.name[11:].isdigit())):
            run = path.parent
    overrides = list(args.overrides) + ([f"model.path={model}"] if model else [])
    if args.config is not None or run is None:
        return load_config(args.config, overrides), args.config or "defaults (no --config, and the model is not a run's)"
    return load_config(str(run / CONFIG_FILE), overrides), f"{run / CONFIG_FILE} (the run's resolved config)"


def _show(args: argparse.Namespace) -> int:
    if args.limit < 0:
        return _fail(f"--limit: a count >= 0, got {args.limit}")
    try:
        rows = read_trajectories(args.run, step=args.step, task_id=args.task, failed=args.failed,
                                 limit=args.limit or None, category=args.category)
    except TrajectoryError as err:
        return _fail(err)
    if not rows and args.task is not None and not read_trajectories(args.run, step=args.step, task_id=args.task, limit=1):
        where = f" at step {args.step}" if args.step is not None else ""
        return _fail(f"{args.run}: no episodes of task {args.task!r}{where}")
    try:
        print_episodes(rows, raw=args.raw)
        if not rows:
            print("no failed episodes" if args.failed else "no episodes")
        elif len(rows) == args.limit:
            print(f"\n(first {args.limit} episodes; --limit N shows more, 0 all)", flush=True)
    except BrokenPipeError:  # `agentrl show RUN | head`: the reader has gone, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


def _tasks_export(args: argparse.Namespace) -> int:
    from agentrl.envs.sources import resolve_task_source
    from agentrl.tasks.io import TaskFileError, save_tasks

    try:
        load_plugins(args.plugin)  # the backends and rewards the tasks name (a config's envs/rewards.plugins)
        tasks = list(resolve_task_source(args.source))
        save_tasks(tasks, args.out)
    except (TaskFileError, ValueError, OSError) as err:
        return _fail(err)
    print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reinforcement learning for multi-turn tool-using LLM agents on Ray.")

    parser.add_argument("--version", action="version", version=f"agentrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="train a policy from a YAML config, or resume a run",
                       description="Train from CONFIG; KEY=VALUE arguments override its values "
                                   "(dotted keys, YAML values), e.g. train.steps=5. --resume RUN continues "
                                   "the run in folder RUN from its newest complete checkpoint "
                                   "(train.checkpoint_every), with RUN/config.yaml; its overrides may only "
                                   "change what leaves the run's math alone (train.steps to extend it, "
                                   "evaluation and checkpoint intervals, telemetry, resources).")
    p.add_argument("config", nargs="?", metavar="CONFIG", help="YAML run config, e.g. configs/quickstart.yaml")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--resume", metavar="RUN|auto",
                   help="continue the run in folder RUN; with CONFIG, 'auto': continue run.output_dir/<run.name> from "
                        "its newest checkpoint, or start it there (what a restarted job runs; docs/operating.md)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="let the learner or the engines run on CPU although the cluster has GPUs (the plan check)")
    p.add_argument("--no-plan", action="store_true",
                   help="skip the pre-flight plan check (agentrl plan) against the cluster the run will use")
    p.set_defaults(func=_train)

    p = sub.add_parser("plan", help="check that a run can be placed and fits, before starting it",
                       description="Print the run's resource plan (every actor's CPUs/GPUs, placement groups, the "
                                   "node each bundle lands on), the learner's memory per rank against the device "
                                   "and host memory, and the engines' KV-cache budget, checked against a cluster: "
                                   "--cluster SHAPE (declared), --address / RAY_ADDRESS / runtime.ray_address (a "
                                   "running Ray cluster), else this machine (the embedded cluster `agentrl train` "
                                   "starts). Exit 0 when the run can start, 2 with the reasons when not. "
                                   "`agentrl train` runs the same check first.")
    p.add_argument("config", nargs="?", metavar="CONFIG", help="YAML run config")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--cluster", metavar="SHAPE",
                   help="a declared cluster: nodes=2,gpus_per_node=8,cpus_per_node=64,gpu_gib=80[,host_gib=H]"
                        "[,resource.NAME=X]; node groups joined by '+' (e.g. a CPU head: nodes=1,cpus_per_node=2+...)")
    p.add_argument("--address", metavar="ADDR", help="a running Ray cluster (default: runtime.ray_address, RAY_ADDRESS)")
    p.add_argument("--gpu-gib", type=float, metavar="GIB",
                   help="memory of one GPU, for nodes that do not say (a running cluster's nodes say it with a "
                        "gpu_gib resource)")
    p.add_argument("--model-config", metavar="PATH",
                   help="model folder or config.json to read the model's dimensions from when model.path is not "
                        "on this machine (the memory checks need them)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="let the learner or the engines run on CPU although the cluster has GPUs")
    p.add_argument("--reserve", action="store_true",
                   help="also create the plan's placement groups on the running cluster, wait until Ray has placed "
                        "them, and release them")
    p.add_argument("--reserve-timeout", type=float, default=30.0, metavar="S",
                   help="seconds --reserve waits for Ray (default 30)")
    p.set_defaults(func=_plan)

    add_make_model_parser(sub)

    p = sub.add_parser("eval", help="score a model (or the gold replay) on a task set",
                       description="Run every task (once, greedy, by default) through the Ray rollout workers and\n"
                                   "the per-turn checker; print accuracy per category and overall, and write\n"
                                   "per-entry results as JSONL. --samples N --temperature T: N sampled episodes per\n"
                                   "task (one JSONL line each); accuracy is then the mean over episodes, and pass@N\n"
                                   "(the share of tasks with at least one success) is printed too.\n\n"
                                   "A model of a training run (RUN/final, RUN/checkpoint-N, or RUN for its final)\n"
                                   "is evaluated with the run's resolved config, RUN/config.yaml: the rollout\n"
                                   "sizes, dtype, chat format and tools it was trained with. --config replaces it;\n"
                                   "KEY=VALUE overrides apply on top of either. The config used is printed first.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_eval_sources())
    p.add_argument("--tasks", required=True, metavar="SOURCE", help="the task set (sources below)")
    p.add_argument("--model", metavar="PATH",
                   help="model folder (RUN/final, RUN/checkpoint-N, a run folder RUN, any HF folder) or hub id "
                        "ORG/NAME[@REVISION] from the HF cache (default: model.path of the config)")
    p.add_argument("--policy", choices=["model", "gold"], default="model",
                   help="gold replays the ground truth instead of a model (must score 1.0000)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N tasks of each category")
    p.add_argument("--samples", type=int, default=1, metavar="N",
                   help="episodes per task (default 1); N > 1 needs --temperature > 0")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature (default 0 = greedy), over the full distribution (top_p 1.0)")
    p.add_argument("--config", metavar="CONFIG",
                   help="YAML config for rollout/runtime settings (default: the run's config.yaml when --model is a "
                        "run's model, else the defaults)")
    p.add_argument("--out", metavar="FILE",
                   help="per-entry results (default <run.output_dir>/eval/results.jsonl, runs/eval/ by default); "
                        "the episodes go to trajectories/ next to it, for `agentrl show FOLDER`")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.set_defaults(func=_eval)

    p = sub.add_parser("show", help="print the episodes a training run or an evaluation recorded",
                       description="Print the episodes recorded in RUN/trajectories/: a training run's "
                                   "(telemetry.trajectories_every) or an evaluation's (agentrl eval writes them next "
                                   "to its results file). Per episode a header (step or eval, task, policy version, "
                                   "outcome, progress, termination, tool errors), its rewards, the conversation, the "
                                   "calls with their observations and the exceptions tools raised. In step order.")
    p.add_argument("run", metavar="RUN",
                   help="run folder (runs/quickstart-20250101-120000) or an evaluation's folder (runs/eval)")
    p.add_argument("--step", type=int, metavar="K", help="only training step K")
    p.add_argument("--task", metavar="ID", help="only episodes of task ID")
    p.add_argument("--failed", action="store_true", help="only episodes with outcome < 1")
    p.add_argument("--category", metavar="C", help="only episodes of tasks of category C")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="at most N episodes (default 20; 0 = all)")
    p.add_argument("--raw", action="store_true", help="the recorded text verbatim: template tokens, nothing cut")
    p.set_defaults(func=_show)

    p = sub.add_parser("tasks", help="task set utilities")
    tasks = p.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    p = tasks.add_parser("export", help="write a task set to JSONL or Parquet",
                         description="Validate a task set and write it; the format follows OUT's "
                                     "suffix (.jsonl or .parquet).")
    p.add_argument("source", metavar="SOURCE", help="builtin:train, builtin:heldout or a file")
    p.add_argument("out", metavar="OUT", help="output file, .jsonl or .parquet")
    p.add_argument("--plugin", action="append", default=[], metavar="P",
                   help="a plugin module or .py file that registers the tasks' backends or rewards (repeatable)")
    p.set_defaults(func=_tasks_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    set_default_env()  # before any command imports transformers/vLLM: offline hubs, caches under ./.cache, CPU DeepSpeed
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""``agentrl make-model``: build the tiny agent model (models/tiny_model.py), or warm-start a
pretrained one with stage 2 alone (models/pretrained.py). Every bad flag exits 2 before torch loads."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentrl.cli._common import fail as _fail


def add_make_model_parser(sub) -> None:
    """The ``make-model`` subcommand, on the CLI's subparsers."""
    p = sub.add_parser("make-model", help="build the tiny local agent model, or warm-start a pretrained one",
                       description="Build the tiny policy model. The output folder is --out, else model.path of\n"
                                   "--config (or the defaults) after KEY=VALUE overrides.\n\n"
                                   "--pretrained DIR: run stage 2 alone (the imperfect teacher) on a pretrained\n"
                                   "HF model, with its own tokenizer and chat template; --out is required and the\n"
                                   "config (and overrides) supply only agent.* (tool format, chat template,\n"
                                   "system prompt). Defaults marked 'pretrained' are for a ~100M model on a CPU.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR", help="output folder (default: config model.path; required with --pretrained)")
    p.add_argument("--config", metavar="CONFIG", help="take model.path (with --pretrained: agent.*) from this config")
    p.add_argument("--seed", type=int, default=0, help="seed of the build (default 0)")
    p.add_argument("--force", action="store_true", help="rebuild even if the folder has a model")
    p.add_argument("--pretrained", metavar="DIR",
                   help="run stage 2 alone on this pretrained HF model folder, with its own tokenizer")
    p.add_argument("--sft-steps", type=int, help="stage 1: gold SFT steps on the full builtin suite (default 2500)")
    p.add_argument("--sft-batch", type=int,
                   help="sequences per SFT step, both stages (default 16; pretrained 4); with --base, the base's own")
    p.add_argument("--habit-suite", help="stage 2: suite of the imperfect teacher's demonstrations (default bank)")
    p.add_argument("--habit-tasks", type=int, help="stage 2: demonstrations generated (default 4000; pretrained 400)")
    p.add_argument("--habit-steps", type=int,
                   help="stage 2: SFT steps on them; 0 skips stage 2 (default 400; pretrained 40)")
    p.add_argument("--habit-lr", type=float, help="stage 2: peak learning rate (default 5e-4; pretrained 2e-5)")
    p.add_argument("--guess-missing", type=float,
                   help="share of miss_param demonstrations that guess the missing value instead of asking (default 0.85)")
    p.add_argument("--skip-lookup", type=float,
                   help="share of look-up-then-spend plans demonstrated without the balance lookup, on a guessed "
                        "amount (default 0.85)")
    p.add_argument("--swap-transfer", type=float,
                   help="share of transfer calls demonstrated with payer and payee swapped (default 0)")
    p.add_argument("--base", metavar="DIR",
                   help="start stage 2 from this stage-1 model (built with the same stage-1 recipe) instead of building it")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.set_defaults(func=_make_model)


RECIPE_OPTIONS = ("sft_steps", "sft_batch", "habit_suite", "habit_tasks", "habit_steps", "habit_lr", "guess_missing",
                  "skip_lookup", "swap_transfer")


def _recipe_options(args: argparse.Namespace) -> dict:
    """The recipe fields set on the command line."""
    return {k: v for k, v in vars(args).items() if k in RECIPE_OPTIONS and v is not None}


def _recipe_error(recipe) -> str | None:
    """The make-model recipe's first bad value, as an error message naming its flag."""
    if recipe.habit_suite not in ("all", "bank"):
        return f"--habit-suite: unknown suite {recipe.habit_suite!r} (all, bank)"
    for key in ("guess_missing", "skip_lookup", "swap_transfer"):
        if not 0.0 <= getattr(recipe, key) <= 1.0:
            return f"--{key.replace('_', '-')}: a rate in [0, 1], got {getattr(recipe, key)}"
    for key in ("sft_batch", "habit_tasks"):
        if getattr(recipe, key) < 1:
            return f"--{key.replace('_', '-')}: at least 1, got {getattr(recipe, key)}"
    return None


def _shipped_refusal(out) -> str | None:
    """Why ``out`` may not be built into: it is the model shipped inside the package (both build
    paths would otherwise overwrite it, and every fresh quickstart reads it)."""
    from agentrl.models.tiny_model import SHIPPED

    if Path(out).resolve() == SHIPPED.resolve():
        return f"{out} is the model shipped with agentrl; build into another folder with --out DIR"
    return None


def _make_model(args: argparse.Namespace) -> int:
    from agentrl.config import ConfigError, load_config

    if args.pretrained is not None:
        return _make_pretrained(args)
    out = args.out
    if out is None:  # default: where the config (with overrides) expects the model
        try:
            out = load_config(args.config, args.overrides).model.path
        except ConfigError as err:
            return _fail(err)
    elif args.overrides or args.config:
        return _fail("--out and a config/overrides both set the output folder; give one")
    from agentrl.models.tiny_model import TinyModelRecipe, make_model

    if err := _shipped_refusal(out):  # e.g. --config configs/quickstart.yaml
        return _fail(err)

    recipe = TinyModelRecipe(seed=args.seed, **_recipe_options(args))
    if err := _recipe_error(recipe):
        return _fail(err)
    if args.base is not None and not (Path(args.base) / "config.json").exists():
        return _fail(f"--base: no model at {args.base}")
    try:
        result = make_model(out, args.seed, args.force, recipe=recipe, base=args.base)
    except ValueError as err:
        return _fail(err)
    print(f"model: {result if result is not None else out}")
    return 0


def _make_pretrained(args: argparse.Namespace) -> int:
    """``make-model --pretrained DIR``: stage 2 alone on a pretrained model (models/pretrained.py).
    Every mistake exits 2 here, before torch loads."""
    from agentrl.config import ConfigError, load_config

    source = Path(args.pretrained)
    if not (source / "config.json").is_file():
        return _fail(f"--pretrained: no HF model folder at {source} (it has no config.json)")
    if args.base is not None:
        return _fail("--pretrained and --base both name the model stage 2 starts from; give one")
    if args.sft_steps is not None:
        return _fail("--sft-steps: stage 1 does not run with --pretrained (the model brings its own tokenizer "
                     "and training)")
    if args.out is None:
        # Not model.path: a config's model.path is the model a run trains (often this pretrained
        # folder itself), and the defaults' is the tiny model's folder.
        return _fail("--pretrained needs --out DIR, the folder to write the warm-started model to")
    from agentrl.models.pretrained import PRETRAINED_DEFAULTS, make_pretrained
    from agentrl.models.tiny_model import TinyModelRecipe

    if err := _shipped_refusal(args.out):
        return _fail(err)
    if Path(args.out).resolve() == source.resolve():
        return _fail(f"--out {args.out} is the --pretrained folder; build into another folder")
    agent_cfg = None
    if args.config or args.overrides:  # only its agent: section applies (how episodes are rendered)
        try:
            agent_cfg = load_config(args.config, args.overrides).agent
        except ConfigError as err:
            return _fail(err)
    recipe = TinyModelRecipe(seed=args.seed, **{**PRETRAINED_DEFAULTS, **_recipe_options(args)})
    if err := _recipe_error(recipe):
        return _fail(err)
    if recipe.habit_steps < 1:
        return _fail("--habit-steps: at least 1 with --pretrained (stage 2 is all it runs)")
    try:
        result = make_pretrained(source, args.out, recipe, agent_cfg=agent_cfg, force=args.force)
    except ValueError as err:
        return _fail(err)
    print(f"model: {result}")
    return 0

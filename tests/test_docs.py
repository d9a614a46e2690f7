"""The docs cannot drift from the code.

* docs/configuration.md is exactly what ``python -m agentrl.config.reference`` renders from the
  schema (types, defaults, the comment above each field);
* README.md stays a front page (at most ``README_MAX_LINES`` lines), keeps its quickstart
  (`make demo`, `make test`), names every config section and cites every method's paper, as
  docs/methods.md does;
* every dotted config key, `agentrl train` command and `make` target that README.md or a page of
  docs/ mentions exists, and the README's relative links point at files in the repository;
* the documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a link to a
  page or a heading that does not exist, or a page left out of the navigation, fails;
* every config key the docs write as an override (``section.key=value``) or in a YAML config (a
  ```yaml block, a configs/*.yaml file) exists, in README.md, docs/*.md, configs/ and the
  deploy/, cluster/ and docker/ files.

Static checks only: no Ray, torch or network (the site build takes a few seconds).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from agentrl.config import ConfigError, load_config
from agentrl.config.loader import RENAMED
from agentrl.config.reference import describe_type, field_comments, format_value, render, section_model, section_names
from agentrl.config.schema import Config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 260  # a front page: what it is, the two commands, results, links; the rest is docs/
REFERENCE = ROOT / "docs" / "configuration.md"
REGENERATE = "python -m agentrl.config.reference --out docs/configuration.md"

# Linked from the README but written by someone else (the lead fills in measured times); the
# link check skips these until they exist, rather than failing every other session's tests.
PENDING_LINKS: set[str] = set()


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def pages() -> str:
    """README.md and every page of docs/ (the generated reference included), as one text."""
    return "\n".join(p.read_text(encoding="utf-8") for p in [README, *sorted((ROOT / "docs").glob("*.md"))])


# ------------------------------------------------------------------ configuration reference

def test_configuration_reference_is_current():
    assert REFERENCE.exists(), f"docs/configuration.md is missing; run `{REGENERATE}`"
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is stale (the schema changed); run `{REGENERATE}`")


def test_reference_module_runs_and_imports_neither_torch_nor_ray():
    code = ("import sys; from agentrl.config.reference import main; main([]); "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    assert out == render()


def test_reference_documents_every_key_with_a_meaning():
    text = render()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented = {line.split("`")[1] for line in rows}
    assert documented == set(_leaf_keys(Config)) | {n for n in section_names() if "." in n}  # nested sections get a row
    for line in rows:
        meaning = line.rstrip("|").rsplit("|", 1)[-1].strip()
        assert meaning, f"no meaning for {line.split('`')[1]}"


def test_field_comments_join_multiline_blocks():
    source = "class A:\n    x = 1\n    # first line\n    # second line\n    y: int = 2\n    z: int = 3\n"
    assert field_comments(source) == {("A", "y"): "first line second line"}


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "true"), (1e-5, "1e-5"), (1e-6, "1e-6"), (2.5e10, "25000000000.0"),
    (0.001, "0.001"), ((0.9, 0.999), "[0.9, 0.999]"), ("runs", "runs"), (8, "8"),
])
def test_format_value(value, text):
    assert format_value(value) == text


def test_describe_type_reads_constraints():
    fields = {name: f for section in (Config.model_fields["learner"].annotation,
                                      Config.model_fields["rollout"].annotation,
                                      Config.model_fields["train"].annotation)
              for name, f in section.model_fields.items()}

    def kind(name: str) -> str:
        return describe_type(fields[name].annotation, list(fields[name].metadata))

    assert kind("zero_stage") == "int, 0–3"
    assert kind("group_size") == "int ≥ 2"
    assert kind("top_p") == "float in (0, 1]"
    assert kind("temperature") == "float > 0"
    assert kind("betas") == "list of 2, each float in [0, 1)"
    assert kind("max_minutes") == "float > 0 or null"


# ------------------------------------------------------------------ README

def test_readme_quickstart_commands(readme):
    assert "make demo" in readme
    assert "make test" in readme
    assert "held-out success: START -> END" in readme


def test_readme_is_a_front_page(readme):
    lines = readme.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail to a page of docs/"


def test_make_targets_exist(readme, pages):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, flags=re.M))
    command = r"(?:`|^)make ([a-z][\w-]*)"  # in inline code or a command line; not the English verb
    assert {"demo", "test"} <= set(re.findall(command, readme, flags=re.M))
    mentioned = set(re.findall(command, pages, flags=re.M))
    assert mentioned <= targets, f"the docs mention make targets the Makefile lacks: {sorted(mentioned - targets)}"


def test_readme_names_every_config_section(readme):
    missing = [name for name in section_names() if not re.search(rf"`{re.escape(name)}[`.=]", readme)]
    assert not missing, f"README does not mention config sections {missing}"


def test_dotted_config_keys_exist(pages):
    """Inline code naming a key (`algo.tis_cap`, `tasks.fresh_train=true`) in the README or a page of
    docs/ must name a real one.

    Fenced blocks are left to the command test below (their error example is wrong on purpose)."""
    prose = re.sub(r"```.*?```", "", pages, flags=re.S)
    sections = "|".join(re.escape(name) for name in Config.model_fields)
    key = re.compile(rf"(?:{sections})\.[a-z_][a-z0-9_.]*")
    keys = {token.split("=", 1)[0] for span in re.findall(r"`([^`\n]+)`", prose)
            for token in span.split() if key.fullmatch(token.split("=", 1)[0])}
    assert keys, "found no dotted config keys in the docs"
    valid = set(_leaf_keys(Config)) | set(section_names())
    unknown = sorted(k for k in keys if k not in valid and not _file_or_module(k))
    assert not unknown, f"the docs name config keys the schema does not have: {unknown}"


def test_train_commands_are_valid_configs(readme, pages):
    pattern = r"agentrl train (configs/[^\s`]+\.yaml(?: [\w.]+=[^\s`]+)*)"
    assert re.findall(pattern, readme), "found no `agentrl train configs/...` command in the README"
    commands = re.findall(pattern, pages)
    for command in commands:
        path, *overrides = shlex.split(command)
        try:
            load_config(ROOT / path, overrides)
        except ConfigError as err:  # pragma: no cover - the failure message is the point
            pytest.fail(f"the docs' command `agentrl train {command}` is not a valid config: {err}")


def test_readme_local_links_exist(readme):
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = {link.split("#", 1)[0] for link in links if not re.match(r"[a-z]+:", link)} - {""}
    assert local, "found no relative links in the README"
    broken = sorted(link for link in local - PENDING_LINKS if not (ROOT / link).exists())
    assert not broken, f"README links to missing files: {broken}"


# the papers the methods come from, cited by title in the README and on docs/methods.md
PAPERS = {
    "GiGPO": "Group-in-Group Policy Optimization for LLM Agent Training",
    "SLCA-GRPO": "SLCA-GRPO: Resolving Cross-Segment Credit Misattribution in Tool-Calling RL",
    "RODS": "RODS: Reward-Driven Online Data Synthesis for Multi-Turn Tool-Use Agents",
    "RSPO": "RSPO: Reward-Swap Policy Optimization for Multi-Turn LLM Agents",
}


@pytest.mark.parametrize("method", sorted(PAPERS))
def test_every_method_cites_its_paper(readme, method):
    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for where, text in (("README.md", readme), ("docs/methods.md", methods)):
        flat = " ".join(text.split())  # titles may wrap
        assert PAPERS[method] in flat, f"{where} does not cite {method}'s paper by its title"


def test_docs_site_builds_strict(tmp_path):
    """mkdocs.yml's validation turns missing pages, missing headings and pages left out of the nav
    into warnings, and --strict makes any warning fail the build."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), "mkdocs is not installed: it is in the test extra (pip install -e '.[test]')"
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + done.stderr[-4000:]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = set(re.findall(r"[\w/]+\.md", str(nav)))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}, "every page of docs/ belongs in mkdocs.yml's nav"


# ------------------------------------------------------------------ config keys in every doc

def _doc_files() -> list[Path]:
    """README.md, docs/*.md, configs/*.yaml and every file under deploy/, cluster/ and docker/."""
    files = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml"))]
    for folder in ("deploy", "cluster", "docker"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    return files


# the config's sections, and the old names of renamed ones (`simulators`), which are stale keys too
_SECTIONS = "|".join(re.escape(name) for name in
                     [*Config.model_fields, *(old for (model, old) in RENAMED if model == "Config")])
# `rollout.group_size=8`, `"runtime.learner_cpus=2"`: a section, at least one more name, '='; not
# the tail of a longer dotted name (`cfg.train.steps=`) or of a path or shell variable
_OVERRIDE = re.compile(rf"(?<![\w./$-])((?:{_SECTIONS})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)=")
_YAML_BLOCK = re.compile(r"^[ \t]*```ya?ml[ \t]*\n(.*?)^[ \t]*```", flags=re.S | re.M)


def _key_problem(parts: list[str], *, dict_subkeys: bool) -> str | None:
    """Why the dotted key ``parts`` is not in the schema, or None when it is. Sections (optional
    ones too) nest; a dict-valued field (``runtime.rollout_worker_resources``) takes any sub-key in
    a YAML mapping (``dict_subkeys``), while the loader refuses ``a.dict_field.sub=...`` overrides."""
    model: type[BaseModel] = Config
    for i, part in enumerate(parts):
        if part not in model.model_fields:
            return f"'{part}' is not a key of {'.'.join(parts[:i]) or 'the config'}"
        field = model.model_fields[part]
        sub = section_model(field.annotation)
        if sub is None:
            if i == len(parts) - 1 or (dict_subkeys and _is_dict(field.annotation)):
                return None
            return f"'{'.'.join(parts[: i + 1])}' is a value, not a section"
        model = sub
    return None


def _is_dict(annotation) -> bool:
    return any(typing.get_origin(a) is dict or a is dict for a in (annotation, *typing.get_args(annotation)))


def _override_problems(text: str, where: str) -> list[str]:
    out = []
    for match in _OVERRIDE.finditer(text):
        key = match.group(1)
        problem = _key_problem(key.split("."), dict_subkeys=False)
        if problem:
            line = text.count("\n", 0, match.start()) + 1
            out.append(f"{where}:{line}: {key}=: {problem}")
    return out


def _yaml_problems(text: str, where: str) -> list[str]:
    """Unknown keys in a YAML config; documents whose top level names no config section (Kubernetes
    and Ray cluster manifests) are not configs and are skipped."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        return [f"{where}: not valid YAML: {err}"]
    out = []
    for doc in documents:
        if not isinstance(doc, dict) or not set(doc) & set(Config.model_fields):
            continue
        for key in _mapping_keys(doc):
            problem = _key_problem(key, dict_subkeys=True)
            if problem:
                out.append(f"{where}: {'.'.join(key)}: {problem}")
    return out


def _mapping_keys(tree: dict, prefix: tuple[str, ...] = ()):
    """Every dotted path of keys in nested mappings (a path stops at a non-mapping value)."""
    for key, value in tree.items():
        path = (*prefix, str(key))
        yield list(path)
        if isinstance(value, dict):
            yield from _mapping_keys(value, path)


def _doc_key_problems(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = str(path.relative_to(ROOT))
    problems = _override_problems(text, where)
    if path.suffix in (".yaml", ".yml"):
        problems += _yaml_problems(text, where)
    for block in _YAML_BLOCK.finditer(text):
        line = text.count("\n", 0, block.start()) + 1
        problems += _yaml_problems(textwrap.dedent(block.group(1)), f"{where}:{line} (yaml block)")
    return problems


def test_doc_files_exist():
    names = {str(p.relative_to(ROOT)) for p in _doc_files()}
    assert {"README.md", "docs/configuration.md", "configs/quickstart.yaml", "deploy/rayjob.yaml",
            "cluster/local-2node.sh", "docker/Dockerfile.cpu"} <= names, sorted(names)


def test_docs_name_only_real_config_keys():
    """Overrides (``section.key=value``) and YAML configs in every doc name keys the schema has."""
    files = _doc_files()
    seen = sum(len(_OVERRIDE.findall(p.read_text(encoding="utf-8"))) for p in files)
    assert seen > 50, f"found only {seen} overrides in the docs: is the pattern broken?"
    problems = [problem for path in files for problem in _doc_key_problems(path)]
    assert not problems, "the docs name config keys the schema does not have:\n" + "\n".join(problems)


def test_doc_key_check_catches_stale_keys():
    """The checker itself: a misspelt or removed key is found, real ones are not."""
    text = ("agentrl train c.yaml rollout.temprature=1 learner.lr=1e-4 'runtime.learner_cpus=2'\n"
            "x = cfg.train.steps=3  # python, not an override\n"
            "learner.lr.peak=1 runtime.rollout_worker_resources.rollout=1 simulators.num_actors=2\n")
    found = _override_problems(text, "t.md")
    assert [p.split(": ")[0] + ": " + p.split(": ")[1] for p in found] == [
        "t.md:1: rollout.temprature=", "t.md:3: learner.lr.peak=", "t.md:3: runtime.rollout_worker_resources.rollout=",
        "t.md:3: simulators.num_actors="]  # a renamed section
    assert _override_problems("nothing.like=1 a.rollout.group_size=2 $train.steps=3 tasks.fresh_train=true", "t") == []
    block = "tasks:\n  train: [a]\ntools:\n  sgls:\n    model_pth: /m\nruntime:\n  rollout_worker_resources: {rollout: 1}\n"
    assert _yaml_problems(block, "b") == ["b: tools.sgls.model_pth: 'model_pth' is not a key of tools.sgls"]
    assert _yaml_problems("rollout:\n  group_size: 4\nsimulators: {}\n", "b") == [
        "b: simulators: 'simulators' is not a key of the config"]
    assert _yaml_problems("apiVersion: v1\nkind: Pod\n", "b") == []  # a manifest, not a config
    doc = "Set it:\n\n```yaml\nlearner:\n  lrr: 1\n```\n\n* in a list:\n\n  ```yaml\n  rollout: {group_sise: 2}\n  ```\n"
    assert _YAML_BLOCK.findall(doc) == ["learner:\n  lrr: 1\n", "  rollout: {group_sise: 2}\n"]
    found = [p for b in _YAML_BLOCK.findall(doc) for p in _yaml_problems(textwrap.dedent(b), "d")]
    assert found == ["d: learner.lrr: 'lrr' is not a key of learner",
                     "d: rollout.group_sise: 'group_sise' is not a key of rollout"]


# ------------------------------------------------------------------ helpers

def _file_or_module(token: str) -> bool:
    """`tasks.jsonl`, `model.safetensors` (file names) and `telemetry.metrics.prometheus_name` (a
    function of agentrl/telemetry/metrics.py) look like config keys but are none."""
    if re.search(r"\.(jsonl|json|parquet|safetensors|py|yaml|md|png)$", token):
        return True
    *module, name = token.split(".")
    source = (ROOT / "agentrl" / Path(*module)).with_suffix(".py")
    return len(module) > 1 and source.is_file() and re.search(
        rf"^(?:def |class )?{re.escape(name)}\b", source.read_text(encoding="utf-8"), flags=re.M) is not None


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every documented key: values, optional sections (a row of their own: they may be null)
    and the keys inside every section."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        sub = section_model(field.annotation)
        if sub is not None:
            if field.default is None:
                keys.append(f"{prefix}{name}")
            keys += _leaf_keys(sub, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys

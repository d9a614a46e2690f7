"""``model.path`` as a Hugging Face hub id (``Qwen/Qwen2.5-0.5B-Instruct``, ``org/name@revision``),
found in the Hugging Face cache.

The hub is not reachable where agentrl usually runs, so a hub id is looked up in the cache only
(``HF_HUB_OFFLINE=1``, agentrl's default: ``config/process_env.py``); a model gets there with
``hf download ORG/NAME`` (or ``huggingface-cli download``) beforehand. Only when the user exports
``HF_HUB_OFFLINE=0`` may the lookup download what is missing. What the lookup returns is the
snapshot folder, an ordinary model folder: the driver hands that absolute path to every actor
(engines and learner ranks, possibly on other nodes), so the cache must be at the same path on
every node (a shared mount, or the same pre-download on each; docs/gpu.md shows it on KubeRay).

Which cache: the one huggingface_hub itself would use, read from the environment at call time
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` or
``~/.cache/huggingface/hub``). agentrl fills in ``HF_HOME=$AGENTRL_CACHE/hf`` when the user set
none; a model the user downloaded with the hub's own default would then be invisible, so in that
case (and only then) the user's default cache is searched too, after agentrl's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agentrl.config.process_env import is_agentrl_default

# org/name with the hub's characters, optionally @revision (a branch, tag or commit hash)
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")
FALSE = ("0", "false", "no", "off")


class HubModelError(Exception):
    """No model for a hub id: the message says where it looked and how to get the model there."""


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` when ``text`` reads as a hub id, else None."""
    m = HUB_ID.match(text.strip())
    if m is None or ".." in text or "--" in m["repo"]:  # "--" is the cache's separator, never in an id
        return None
    return m["repo"], m["rev"]


def downloads_allowed() -> bool:
    """Only an explicit ``HF_HUB_OFFLINE=0`` (or false/no/off) lets a lookup use the network."""
    return os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in FALSE


def user_default_cache() -> Path:
    """huggingface_hub's own default hub cache, as when no HF_* variable is set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "huggingface" / "hub"


def hub_caches() -> list[tuple[Path, str]]:
    """The hub caches to search, in order, each with the reason it is searched (for the error).
    The first is where a download goes."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second: the hub's legacy name
        if env.get(var):
            return [(Path(os.path.expanduser(env[var])), f"{var}={env[var]}")]
    if not env.get("HF_HOME"):
        return [(user_default_cache(), "the hub's default cache")]
    caches = [(Path(os.path.expanduser(env["HF_HOME"])) / "hub", f"HF_HOME={env['HF_HOME']}")]
    if is_agentrl_default("HF_HOME"):  # agentrl's HF_HOME, not the user's: their default cache may hold it
        caches.append((user_default_cache(), "the hub's default cache, where `hf download` puts models "
                                             "when HF_HOME is not set"))
    return caches


def cache_folder_name(repo_id: str) -> str:
    """The folder of ``repo_id`` in a hub cache: ``models--org--name``."""
    return "models--" + repo_id.replace("/", "--")


def resolve_hub_model(spec: str) -> Path:
    """The snapshot folder of hub id ``spec`` (``org/name[@revision]``) in the Hugging Face cache;
    with downloads allowed (``HF_HUB_OFFLINE=0``) what is missing is downloaded into the first cache
    of ``hub_caches()``. ``HubModelError`` says where it looked and how to pre-download."""
    parsed = parse_hub_id(spec)
    if parsed is None:
        raise HubModelError(f"{spec!r} is not a hub id (ORG/NAME or ORG/NAME@REVISION)")
    repo_id, revision = parsed
    caches = hub_caches()
    online = downloads_allowed()
    found, problems = None, []
    for i, (cache, _) in enumerate(caches):
        if online and i > 0:
            break  # online, the first cache is the one that downloads; the others are for offline lookups
        try:
            found = _snapshot(repo_id, revision, cache, online)
        except (OSError, ValueError) as err:  # hub errors are OSErrors; a bad revision name a ValueError
            problems.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            continue
        if (found / "config.json").exists():
            return found
        problems.append(f"{found} has no config.json (not a transformers model, or a partial download)")
    rev = f" at revision {revision}" if revision else ""
    looked = "; ".join(f"{cache / cache_folder_name(repo_id)} ({why})" for cache, why in caches)
    how = (f"pre-download it with `hf download {repo_id}` (or `huggingface-cli download {repo_id}`"
           f"{f' --revision {revision}' if revision else ''}) with the same HF_HOME, on every node or into a "
           f"shared mount (docs/gpu.md), or export HF_HUB_OFFLINE=0 to let agentrl download it")
    if online:
        how = "the download failed (HF_HUB_OFFLINE=0); check the id, the network and HF_TOKEN for gated models"
    detail = f" [{'; '.join(problems)}]" if problems else ""
    raise HubModelError(f"no hub model {repo_id}{rev} in the Hugging Face cache (looked in {looked}){detail}: {how}")


def _snapshot(repo_id: str, revision: str | None, cache: Path, online: bool) -> Path:
    """huggingface_hub's own lookup (refs/<revision> -> snapshots/<commit>), a download when online."""
    from huggingface_hub import snapshot_download

    # the endpoint read now, not at huggingface_hub's import: the CLI may have imported it already
    endpoint = os.environ.get("HF_ENDPOINT") or None
    return Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache), local_files_only=not online,
                                  endpoint=endpoint))

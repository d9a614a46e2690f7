"""Hermes tool-call parser: examples, never-raises fuzzing, format -> parse round trip."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.agent.parser import ParsedMessage, format_tool_calls, parse_assistant
from agentrl.tasks.schema import ToolCall


def test_format_layout():
    calls = [ToolCall(name="f", arguments={"a": 1, "b": "ø"}), ToolCall(name="g")]
    assert format_tool_calls(calls) == (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "ø"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    assert format_tool_calls([]) == ""


def test_parse_valid_with_content():
    text = 'Let me check.\n<tool_call>\n{"name": "get", "arguments": {"id": 3}}\n</tool_call>\n'
    p = parse_assistant(text, {"get"})
    assert p.calls == [ToolCall(name="get", arguments={"id": 3})]
    assert (p.n_blocks, p.n_valid, p.errors) == (1, 1, [])
    assert p.content == "Let me check."
    assert p.has_call_attempt and p.format_valid_fraction == 1.0


def test_parse_no_calls():
    p = parse_assistant("  The answer is 42.  ")
    assert p == ParsedMessage(content="The answer is 42.")
    assert p.format_valid_fraction == 1.0 and not p.has_call_attempt


def test_missing_arguments_means_empty():
    assert parse_assistant('<tool_call>{"name": "f"}</tool_call>').calls == [ToolCall(name="f")]


def test_each_error_kind_counts_one_block():
    bad = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    ]
    for b in bad:
        p = parse_assistant(b, {"f"})
        assert (p.n_blocks, p.n_valid, len(p.errors), p.calls) == (1, 0, 1, []), b
        assert p.format_valid_fraction == 0.0


def test_mixed_blocks_and_unclosed():
    text = (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call> mid '
        "<tool_call>{bad}</tool_call>"
        '<tool_call>{"name": "f", "arguments": {"x": [1, 2]}}</tool_call> tail '
        '<tool_call>{"name": "f"'
    )
    p = parse_assistant(text, {"f"})
    assert p.n_blocks == 4 and p.n_valid == 2 and len(p.errors) == 2
    assert "unclosed" in p.errors[-1]
    assert p.content == "mid  tail"
    assert p.format_valid_fraction == 0.5


def test_stray_close_tag_is_content():
    p = parse_assistant("done </tool_call>")
    assert p.n_blocks == 0 and not p.has_call_attempt and p.content == "done </tool_call>"


def test_deep_nesting_does_not_raise():
    for body in ("[" * 200_000, "{\"a\":" * 100_000, "[" * 100_000 + "]" * 100_000):
        p = parse_assistant(f"<tool_call>{body}</tool_call>")
        assert p.n_blocks == 1 and p.n_valid == 0 and len(p.errors) == 1


def test_close_tag_inside_string_round_trips():
    calls = [ToolCall(name="echo", arguments={"s": "a</tool_call>b<tool_call>c"})]
    p = parse_assistant(format_tool_calls(calls))
    assert p.calls == calls and p.content == ""


_ATOMS = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", "\\", "name", "arguments",
          '"name"', '"arguments"', "null", "1e999", "-", "\n", " ", "ø", "😀", "\x00", "NaN", "9" * 50]
_fuzz = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(_ATOMS), st.text(max_size=5)), max_size=60).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(_fuzz, st.one_of(st.none(), st.sets(st.sampled_from(["f", "name", "g"]))))
def test_fuzz_never_raises(text, known):
    p = parse_assistant(text, known)
    assert p.n_blocks == p.n_valid + len(p.errors)
    assert 0 < p.n_blocks <= text.count("<tool_call>") or p.n_blocks == text.count("<tool_call>") == 0
    assert p.n_valid == len(p.calls)
    assert 0.0 <= p.format_valid_fraction <= 1.0
    assert p.has_call_attempt == ("<tool_call>" in text)
    if known is not None:
        assert all(c.name in known for c in p.calls)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=10,
)
_call = st.builds(
    ToolCall,
    name=st.text(min_size=1, max_size=20).filter(lambda s: s.strip()),
    arguments=st.dictionaries(st.text(max_size=10), _json, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_call, max_size=4), st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20))
def test_round_trip(calls, prefix):
    text = (prefix + "\n" if prefix else "") + format_tool_calls(calls)
    p = parse_assistant(text, {c.name for c in calls})
    assert p.calls == calls
    assert p.errors == [] and p.n_blocks == len(calls)
    assert p.content == prefix.strip()
    # the JSON body is exactly json.dumps (ensure_ascii=False) unless it needed the </ escape
    for c in calls:
        body = json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
        if "</tool_call>" not in body:
            assert body in text

"""Tool-call formats (agent.tool_format) and the rest of ``agent:`` (chat_template, system_prompt).

Round trips and never-raises fuzzing per format, malformed calls counted one by one, vLLM's own
parsers agreeing on well-formed calls, the hermes default unchanged, and the config reaching the
episode loop, the rollout worker and (slow) a SmolLM2 episode rendered with its own template.
"""

from __future__ import annotations

import asyncio
import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.agent.chat import ChatFormatter, formatter_for, load_chat_template, with_template_text
from agentrl.agent.chat_template import CHAT_TEMPLATE
from agentrl.agent.episode import EpisodeLimits, run_episode
from agentrl.agent.gold import GoldPolicy, gold_assistant_texts, gold_messages
from agentrl.agent.parser import format_tool_calls, parse_assistant
from agentrl.agent.tool_formats import FORMATS, get_format, render_pythonic
from agentrl.api import Generation
from agentrl.config import load_config
from agentrl.config.schema import AgentConfig
from agentrl.envs.builtin.generator import builtin_split
from agentrl.envs.session import LocalEnvSession
from agentrl.tasks.schema import ToolCall

NAMES = list(FORMATS)
LIMITS = EpisodeLimits(max_new_tokens=10_000, max_assistant_messages_per_turn=16, max_episode_tokens=100_000)

_name = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalar = (st.none() | st.booleans() | st.integers(-(10**15), 10**15)
           | st.floats(allow_nan=False, allow_infinity=False) | _text)
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                      max_leaves=8)
_call = st.builds(ToolCall, name=_name, arguments=st.dictionaries(_name, _value, max_size=3))
# content that no format reads as a call (no "{", "[", "<")
_content = st.text(st.sampled_from(list("abc xyz.,:!?-'\"\n")), max_size=20)


def _ok(p):
    """The ParsedMessage invariants every format keeps (the HierR format score relies on them)."""
    assert p.n_blocks == p.n_valid + len(p.errors) and len(p.calls) == p.n_valid
    assert p.has_call_attempt == (p.n_blocks > 0)
    assert all(isinstance(e, str) and e for e in p.errors) and isinstance(p.content, str)


# --- registry and the hermes default ---------------------------------------------------------
def test_registry():
    assert set(NAMES) == {"hermes", "llama3_json", "pythonic"}
    assert get_format("hermes").render is format_tool_calls and get_format("hermes").parse is parse_assistant
    assert get_format(get_format("pythonic")).name == "pythonic"
    with pytest.raises(ValueError, match="unknown tool format 'xml'"):
        get_format("xml")


def test_hermes_default_is_unchanged(formatter, tiny_model_dir):
    """Default config = the hermes scanner and layout, byte for byte (the layout literal is the one
    tests/test_parser.py pins), and the run's formatter equals a plain ChatFormatter's."""
    calls = [ToolCall(name="f", arguments={"a": 1, "b": "ø"}), ToolCall(name="g")]
    assert get_format(AgentConfig().tool_format).render(calls) == (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "ø"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    assert formatter.tool_format.name == "hermes" and formatter.system_prompt is None
    task = builtin_split("heldout")[0]
    from transformers import AutoTokenizer

    configured = formatter_for(AutoTokenizer.from_pretrained(tiny_model_dir), load_config(None, []).agent)
    a, b = (asyncio.run(run_episode(task, GoldPolicy(task, f), LocalEnvSession(task), f, LIMITS))
            for f in (formatter, configured))
    assert (a.token_ids, a.response_mask, a.segments) == (b.token_ids, b.response_mask, b.segments)
    assert gold_assistant_texts(task) == gold_assistant_texts(task, "hermes")


# --- round trips --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(calls=st.lists(_call, min_size=1, max_size=3), content=_content)
def test_render_parse_round_trip(name, calls, content):
    fmt = get_format(name)
    p = fmt.parse(fmt.render_message(content, calls), {c.name for c in calls})
    _ok(p)
    assert p.calls == calls and p.errors == [] and p.content == content.strip()
    assert fmt.parse(content).calls == [] and not fmt.parse(content).has_call_attempt


def test_layouts():
    calls = [ToolCall(name="get_weather", arguments={"city": "Oslo", "days": [1, -2.5], "exact": True, "note": None}),
             ToolCall(name="now")]
    assert get_format("llama3_json").render(calls) == (
        '{"name": "get_weather", "parameters": {"city": "Oslo", "days": [1, -2.5], "exact": true, "note": null}}; '
        '{"name": "now", "parameters": {}}')
    assert render_pythonic(calls) == "[get_weather(city='Oslo', days=[1, -2.5], exact=True, note=None), now()]"
    assert all(get_format(n).render([]) == "" for n in NAMES)


@pytest.mark.parametrize(("text", "calls", "content"), [
    ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})], ""),
    ('{"name": "f", "arguments": {"a": 1}}\n{"name": "g", "parameters": {}}', [("f", {"a": 1}), ("g", {})], ""),
    ('Checking.\n{"name": "f", "parameters": {"s": "}{;"}} ; {"name": "g", "parameters": {}}', [("f", {"s": "}{;"}), ("g", {})],
     "Checking."),
    # braces in an answer are content (vLLM reads calls only from a message that starts with one):
    # the final answer must still close its turn
    ("The balance is 42 (in {EUR}).", [], "The balance is 42 (in {EUR})."),
    ('The file now contains {"a": 1}.', [], 'The file now contains {"a": 1}.'),
    ('Done. {"name": "f", "parameters": {}} was my plan.', [], 'Done. {"name": "f", "parameters": {}} was my plan.'),
])
def test_llama3_json_examples(text, calls, content):
    p = get_format("llama3_json").parse(text)
    assert [(c.name, c.arguments) for c in p.calls] == calls and p.content == content and p.errors == []


@pytest.mark.parametrize(("text", "calls", "content"), [
    ("[f(a=1, b='x')]", [("f", {"a": 1, "b": "x"})], ""),
    ('<|python_start|>[f(t=(1, 2), s={3}, n=-4, j=null, x=true, fs=f"y")]<|python_end|>',
     [("f", {"t": [1, 2], "s": [3], "n": -4, "j": None, "x": True, "fs": "y"})], ""),
    ("<|python_tag|>[ns.tool(q='a]b'), g()]", [("ns.tool", {"q": "a]b"}), ("g", {})], ""),
    ("Let me look.\n[f(q='''multi\nline''')] done", [("f", {"q": "multi\nline"})], "Let me look.\n done"),
    ("The list [1, 2] and f(x) are prose.", [], "The list [1, 2] and f(x) are prose."),
])
def test_pythonic_examples(text, calls, content):
    p = get_format("pythonic").parse(text)
    assert [(c.name, c.arguments) for c in p.calls] == calls and p.content == content and p.errors == []


# --- malformed output: one error per malformed call, never a crash ------------------------------
MALFORMED = {
    "llama3_json": [
        ('{"name": "f", "parameters": {"a": 1}', 1, 0),  # truncated: swallows the rest
        ('{"name": "f", "parameters": [1]}', 1, 0),  # parameters not an object
        ('{"name": 3, "parameters": {}}', 1, 0),  # name not a string
        ('{"name": "f"}', 1, 0),  # no parameters (vLLM requires them too)
        ('{"name": "nope", "parameters": {}}', 1, 0),  # unknown tool
        ("{'name': 'f'}\n" + '{"name": "f", "parameters": {}}', 2, 1),  # balanced but not JSON; next one runs
        ("<|python_tag|>", 1, 0),  # the call marker, then nothing
        ('{"name": ' + "{" * 5000, 1, 0),  # deep and unbalanced
    ],
    "pythonic": [
        ("[f(a=1", 1, 0),  # truncated
        ("[f(a=1)", 1, 0),  # unbalanced
        ("[f(a='x)]", 1, 0),  # unterminated string
        ("[f(a=x)]", 1, 0),  # a name, not a literal
        ("[f(a=g())]", 1, 0),  # a call as a value
        ("[f(a=1+2)]", 1, 0),  # an expression
        ("[f(1)]", 1, 0),  # positional: vLLM drops it silently
        ("[f(**kw)]", 1, 0),
        ("[f(a=1, a=2)]", 1, 0),  # repeated keyword
        ("[f(a={1: 2})]", 1, 0),  # non-string dict key
        ("[f(a=1) for f in x]", 1, 0),  # a comprehension
        ("[f(a=1), 3, nope(), f(b=2)]", 4, 2),  # each element on its own
        ("[f(a=)]", 1, 0),  # syntax error
        ("[f(a=" + "[" * 300 + "]" * 300 + ")]", 1, 0),  # nested past the parser's limit
        ("<|python_tag|>not a list", 1, 0),
    ],
    "hermes": [
        ('<tool_call>{"name": "f", "arguments": {"a": 1}', 1, 0),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', 1, 0),
    ],
}


@pytest.mark.parametrize(("name", "text", "blocks", "valid"),
                         [(n, *case) for n, cases in MALFORMED.items() for case in cases])
def test_malformed_counted_per_call(name, text, blocks, valid):
    p = get_format(name).parse(text, {"f"})
    _ok(p)
    assert (p.n_blocks, p.n_valid) == (blocks, valid), p.errors
    assert p.has_call_attempt


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_non_text(name):
    for text, content in (("", ""), ("   ", ""), (None, ""), (7, "7")):
        p = get_format(name).parse(text)
        assert (p.calls, p.errors, p.n_blocks, p.content, p.has_call_attempt) == ([], [], 0, content, False)


_ATOMS = ["{", "}", "[", "]", "(", ")", '"', "'", "\\", ":", ";", ",", "=", " ", "\n", "name", '"name"', "f", "g(",
          '"parameters"', "a=", "1", "-", "null", "True", "<|python_tag|>", "<|python_start|>", "<tool_call>", "</tool_call>",
          '{"name": "f", "parameters": {}}', "[f(a=1)]", "'''", "**", "lambda", "\x00"]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(_ATOMS), max_size=25).map("".join) | st.text(max_size=60))
def test_never_raises(name, text):
    for known in (None, {"f"}):
        _ok(get_format(name).parse(text, known))


def test_pythonic_render_refuses_what_it_cannot_write():
    for call in (ToolCall(name="get-weather"), ToolCall(name="f", arguments={"from": 1}),
                 ToolCall(name="f", arguments={"x": float("nan")}), ToolCall(name="f", arguments={"x": {1: 2}})):
        with pytest.raises(ValueError):
            render_pythonic([call])


# --- vLLM's parsers agree on well-formed calls (the grammar is theirs) -------------------------
@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.builds(ToolCall, name=_name, arguments=st.dictionaries(_name, _value, max_size=3)),
                      min_size=1, max_size=3))
def test_vllm_parsers_read_our_renders_alike(vllm_parsers, calls):
    for name, parser in vllm_parsers.items():
        got = parser.extract_tool_calls(get_format(name).render(calls), None)
        assert got.tools_called, name
        assert [(c.function.name, json.loads(c.function.arguments)) for c in got.tool_calls] == \
               [(c.name, c.arguments) for c in calls], name


@pytest.fixture(scope="module")
def vllm_parsers(tiny_model_dir):
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
    from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})  # Llama3JsonToolParser requires it
    return {"hermes": Hermes2ProToolParser(tok), "llama3_json": Llama3JsonToolParser(tok), "pythonic": PythonicToolParser(tok)}


# --- the formatter: tool_calls, chat_template, system_prompt -------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_tool_calls_field_renders_in_the_format(tiny_model_dir, name):
    from transformers import AutoTokenizer

    f = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir), tool_format=name)
    calls = [ToolCall(name="get_weather", arguments={"city": "Tromsø"}), ToolCall(name="convert")]
    for content in ("", "Checking."):
        field = [{"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in calls]
        as_field = f.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": content, "tool_calls": field}])
        text = f.tool_format.render_message(content, calls)
        assert as_field == f.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": text}])
        assert f.parse(text).calls == calls


def test_llama_end_of_message_ends_a_message(tiny_model_dir):
    """A Llama 3 tokenizer's <|eom_id|> (a message that awaits a tool result) stops generation too;
    tokenizers without it keep their stop ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = ChatFormatter(tok).eos_token_ids
    tok.add_special_tokens({"additional_special_tokens": ["<|eom_id|>"]})
    f = ChatFormatter(tok, tool_format="llama3_json")
    assert f.eos_token_ids == [*before, tok.convert_tokens_to_ids("<|eom_id|>")] and f.end_token_id == before[0]


MARKED = CHAT_TEMPLATE.replace("You can call these tools:", "TOOLS YOU HAVE:")


def test_chat_template_as_file_and_as_text(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    path = tmp_path / "t.jinja"
    path.write_text(MARKED)
    task = builtin_split("heldout")[0]
    for value in (str(path), MARKED):
        f = formatter_for(AutoTokenizer.from_pretrained(tiny_model_dir), AgentConfig(chat_template=value))
        prompt = f.tokenizer.decode(f.prompt_ids(None, task.visible_tools(0), task.turns[0].user))
        assert prompt.startswith("<|im_start|>system\nTOOLS YOU HAVE:\n<tools>\n")
    assert with_template_text(AgentConfig(chat_template=str(path))).chat_template == MARKED
    assert with_template_text(AgentConfig()) == AgentConfig()
    with pytest.raises(ValueError, match="no template file"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_system_prompt_in_the_rendered_prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    cfg = load_config(None, ["agent.system_prompt=Answer in one line."])
    f = formatter_for(AutoTokenizer.from_pretrained(tiny_model_dir), cfg.agent)
    task = builtin_split("heldout")[0]
    ep = asyncio.run(run_episode(task, GoldPolicy(task, f), LocalEnvSession(task), f, LIMITS))
    prompt = f.tokenizer.decode(ep.token_ids[: ep.prompt_len])
    assert prompt.startswith("<|im_start|>system\nAnswer in one line.\n\nYou can call these tools:\n")
    assert all(ep.turn_passed)
    explicit = asyncio.run(run_episode(task, GoldPolicy(task, f), LocalEnvSession(task), f, LIMITS, system_prompt="Other."))
    assert f.tokenizer.decode(explicit.token_ids[: explicit.prompt_len]).startswith("<|im_start|>system\nOther.\n\n")


# --- the episode loop ---------------------------------------------------------------------------
class Script:
    """Replays fixed assistant texts in order (the last one repeats)."""

    def __init__(self, formatter: ChatFormatter, texts: list[str]):
        self.formatter, self.texts, self.i = formatter, texts, 0

    async def generate(self, prompt_ids, max_tokens):
        text = self.texts[min(self.i, len(self.texts) - 1)]
        self.i += 1
        ids = self.formatter.render_assistant_ids(text)
        return Generation(ids, [-0.5] * len(ids), "stop")


@pytest.mark.parametrize("name", ["pythonic", "llama3_json"])
def test_tool_format_config_flows_into_the_episode_loop(tiny_model_dir, name):
    from transformers import AutoTokenizer

    cfg = load_config(None, [f"agent.tool_format={name}"])
    f = formatter_for(AutoTokenizer.from_pretrained(tiny_model_dir), cfg.agent)
    task = next(t for t in builtin_split("heldout") if t.turns[0].gold)
    gold = gold_assistant_texts(task, name)
    assert gold == gold_assistant_texts(task, f.tool_format) and not any("<tool_call>" in t for t in gold)
    bad = {"pythonic": "[get_balance(account_id=x)]", "llama3_json": '{"name": "get_balance", "parameters": [1]}'}[name]
    hermes = format_tool_calls(task.turns[0].gold[0])
    n_gold = sum(len(step) for turn in task.turns for step in turn.gold)
    # a malformed call in this format, then the gold conversation: one error, every turn passes
    ep = asyncio.run(run_episode(task, Script(f, [bad, *gold]), LocalEnvSession(task), f, LIMITS))
    assert all(ep.turn_passed) and ep.termination == "done"
    assert (ep.n_call_blocks, ep.n_valid_calls) == (n_gold + 1, n_gold)
    assert '{"error": ' in f.tokenizer.decode(ep.token_ids[ep.step_spans[0][1]: ep.step_spans[1][0]])
    assert [len(c) for c in ep.calls] == [sum(len(s) for s in t.gold) for t in task.turns]
    if name == "pythonic":  # a hermes block is no call here: it is the turn's final answer (and fails it)
        ep = asyncio.run(run_episode(task, Script(f, [hermes]), LocalEnvSession(task), f, LIMITS))
        assert ep.n_call_blocks == 0 and not ep.turn_passed[0] and ep.answers[0] == hermes
    # the stream is the template's rendering of the gold conversation, token for token in text
    ep = asyncio.run(run_episode(task, GoldPolicy(task, f), LocalEnvSession(task), f, LIMITS))
    want = f.render(gold_messages(task, name), tools=task.visible_tools(0))
    assert f.tokenizer.decode(ep.token_ids) == want.removesuffix("\n") and all(ep.turn_passed)


# --- the runtime: config -> RolloutSide.create -> RolloutWorker -> its formatter -----------------
@pytest.mark.integration
def test_agent_config_reaches_the_rollout_workers(tiny_model_dir, ray_cluster, tmp_path):
    """The `agentrl eval --policy gold` path (no engine): the workers' formatter carries agent.*,
    and the gold replay, written and parsed in pythonic, scores 1.0."""
    import ray

    from agentrl.driver.cluster import RolloutSide
    from agentrl.driver.evaluate import GOLD_LIMITS

    path = tmp_path / "t.jinja"
    path.write_text(MARKED)
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "agent.tool_format=pythonic",
                             f"agent.chat_template={path}", "agent.system_prompt=Be brief."])
    side = RolloutSide.create(cfg, str(tiny_model_dir), rollout_cfg=cfg.rollout.model_copy(update=GOLD_LIMITS),
                              engine=False)
    try:
        side.start()
        seen = ray.get(side.workers[0].__ray_call__.remote(
            lambda w: (w.formatter.tool_format.name, w.formatter.system_prompt, w.formatter.tokenizer.chat_template)))
        assert seen == ("pythonic", "Be brief.", MARKED)
        tasks = [t for t in builtin_split("heldout") if t.turns[0].gold][:3]
        results = side.evaluate(tasks, gold=True)
        assert len(results) == 3 and all(r["outcome"] == 1.0 and r["valid_calls"] == r["calls"] > 0 for r in results)
    finally:
        side.shutdown_workers()


# --- slow: a real pretrained model with its own chat template -----------------------------------
@pytest.mark.slow
def test_smollm2_episode_renders_with_its_own_chat_template(tmp_path):
    """SmolLM2-135M-Instruct's own template (ChatML with a default system prompt, no tool support),
    set through agent.chat_template over the folder agentrl materializes with its own template:
    the gold replay passes and its stream is that template's rendering; the real model then plays
    an episode (greedy, HF generate) through the same loop."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.smollm2 import GGUF_FILE, gguf_dir, materialize_smollm2

    own = AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE).chat_template
    assert "SmolLM" in own and own != CHAT_TEMPLATE
    (tmp_path / "smollm2.jinja").write_text(own)
    folder = materialize_smollm2(Path(__file__).resolve().parents[1] / ".cache" / "models" / "smollm2-135m-instruct")
    f = formatter_for(AutoTokenizer.from_pretrained(folder), AgentConfig(chat_template=str(tmp_path / "smollm2.jinja")))
    assert f.tokenizer.chat_template == own and f.end_token == "<|im_end|>"
    task = next(t for t in builtin_split("heldout") if t.turns[0].gold and len(t.turns) >= 2)
    ep = asyncio.run(run_episode(task, GoldPolicy(task, f), LocalEnvSession(task), f, LIMITS))
    text = f.tokenizer.decode(ep.token_ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text == f.render(gold_messages(task), tools=task.visible_tools(0)).removesuffix("\n") and all(ep.turn_passed)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    class Greedy:
        async def generate(self, prompt_ids, max_tokens):
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=min(max_tokens, 48), do_sample=False,
                                     eos_token_id=f.eos_token_ids, pad_token_id=f.end_token_id)
            ids = out[0, len(prompt_ids):].tolist()
            return Generation(ids, [0.0] * len(ids), "stop" if ids and ids[-1] in f.eos_token_ids else "length")

    ep = asyncio.run(run_episode(task, Greedy(), LocalEnvSession(task), f, EpisodeLimits(max_episode_tokens=2048)))
    assert sum(ep.response_mask) > 0 and ep.termination in ("done", "length", "max_messages", "max_tokens")
    assert f.tokenizer.decode(ep.token_ids[: ep.prompt_len]).startswith("<|im_start|>system\nYou are a helpful AI")

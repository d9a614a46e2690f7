"""ChatFormatter: token-in-token-out pieces must concatenate to the template's full rendering."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentrl.agent.chat import ChatFormatter
from agentrl.agent.chat_template import CHAT_TEMPLATE
from agentrl.agent.parser import format_tool_calls, parse_assistant
from agentrl.tasks.schema import FunctionSpec, ToolCall, ToolSpec

# Qwen2.5-Instruct's template (abridged to the parts exercised here: tools, tool_calls, tool role).
QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}"
    "{%- endif %}{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    ToolSpec(function=FunctionSpec(name="convert", description="Unit conversion.")),
]


def _make_tokenizer(template: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
              "What is the weather in Oslo today? It is sunny.", "<tool_response>\n{\"temp\": 21}\n</tool_response>"]
    tok.train_from_iterator(corpus * 5, trainer)
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                additional_special_tokens=specials[1:])
    t.chat_template = template
    return t


@pytest.fixture(scope="module", params=["ours", "qwen25", "smollm2"])
def fmt(request):
    template = {"ours": CHAT_TEMPLATE, "qwen25": QWEN25_TEMPLATE, "smollm2": SMOLLM2_TEMPLATE}[request.param]
    return ChatFormatter(_make_tokenizer(template))


def _episode(fmt, system, user, turns):
    """Build ids the way the episode loop does; turns = [(assistant_text, new_messages)]."""
    ids = fmt.prompt_ids(system, TOOLS, user)
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
    for text, new in turns:
        ids += fmt.render_assistant_ids(text)
        ids += fmt.delta_ids(new)
        msgs += [{"role": "assistant", "content": text}] + new
    return ids, msgs


def test_special_ids(fmt):
    tk = fmt.tokenizer
    im_end = tk.convert_tokens_to_ids("<|im_end|>")
    assert fmt.end_token_id == im_end
    assert fmt.eos_token_ids == [im_end, tk.eos_token_id]
    assert fmt.render_assistant_ids("hi")[-1] == im_end


def test_delta_starts_after_end_token(fmt):
    d = fmt.delta_text([{"role": "tool", "content": "42"}])
    assert d.startswith("\n<|im_start|>") and d.endswith("<|im_start|>assistant\n")


def test_ours_layout():
    f = ChatFormatter(_make_tokenizer(CHAT_TEMPLATE))
    assert f.delta_text([{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"},
                         {"role": "user", "content": "next"}]) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")
    prompt = f.tokenizer.decode(f.prompt_ids(None, TOOLS, "hi"))
    assert prompt.startswith("<|im_start|>system\nYou can call these tools:\n"
                             "<tools>\nget_weather(city)\nconvert()\n</tools><|im_end|>\n")
    assert "returns" not in prompt and prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_ours_tool_calls_field_matches_parser_format():
    """An OpenAI-style assistant message with tool_calls renders exactly like format_tool_calls."""
    f = ChatFormatter(_make_tokenizer(CHAT_TEMPLATE))
    calls = [ToolCall(name="get_weather", arguments={"city": "Tromsø"}), ToolCall(name="convert")]
    for content in ("", "Checking."):
        as_field = f.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": content,
                             "tool_calls": [{"type": "function", "function": c.model_dump()} for c in calls]}])
        text = (content + "\n" if content else "") + format_tool_calls(calls)
        as_text = f.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": text}])
        assert as_field == as_text
        assert parse_assistant(text, {"get_weather", "convert"}).calls == calls


def test_pieces_concatenate_to_full_render(fmt):
    call = format_tool_calls([ToolCall(name="get_weather", arguments={"city": "Oslo"})])
    turns = [
        (call, [{"role": "tool", "content": '{"temp": 21}'}]),
        (call + "\n" + call, [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]),
        ("It is sunny.", [{"role": "user", "content": "And tomorrow?"}]),
    ]
    for system in (None, "Be brief."):
        ids, msgs = _episode(fmt, system, "Weather in Oslo?", turns)
        full = fmt.render(msgs, tools=TOOLS, add_generation_prompt=True)
        assert fmt.tokenizer.decode(ids) == full
        # assistant texts here start with a non-space char, so even the ids match exactly
        assert ids == fmt.encode(full)


_txt = st.text(st.characters(blacklist_categories=("Cs",)), max_size=15)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=_txt, turns=st.lists(st.tuples(_txt, st.lists(st.tuples(st.sampled_from(["tool", "user"]), _txt),
                                                          min_size=1, max_size=3)), max_size=3))
def test_pieces_concatenate_fuzz(fmt, user, turns):
    turns = [(a, [{"role": r, "content": c} for r, c in new]) for a, new in turns]
    ids, msgs = _episode(fmt, None, user, turns)
    assert fmt.tokenizer.decode(ids) == fmt.render(msgs, tools=TOOLS, add_generation_prompt=True)


def test_requires_template():
    t = _make_tokenizer(CHAT_TEMPLATE)
    t.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        ChatFormatter(t)

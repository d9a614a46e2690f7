"""Token-in-token-out chat helpers for the episode loop.

Why token-level: RL needs the logprobs of exactly the tokens the policy sampled. If the loop kept a
text transcript and re-tokenized it each turn, BPE could merge across message boundaries and the
learner would score tokens the policy never produced. So the episode is one growing list of ids:

    ids = prompt_ids(system, tools, user)                  # ends with the generation prompt
    ids += <sampled assistant tokens, ending with an end-of-message id>   (response_mask = 1)
    ids += delta_ids([tool messages..., next user message])  # ends with the generation prompt
    ...                                                      (response_mask = 0 for deltas)

Earlier text is never re-tokenized. ``delta_ids`` is computed from the chat template itself
(rendered with and without the new messages after a fixed dummy conversation), so the helpers work
for any HF tokenizer whose template is prefix-stable: ours (``chat_template.CHAT_TEMPLATE``),
SmolLM2's and Qwen2.5's ChatML.

Convention: the model stops AT its end-of-message token (``<|im_end|>`` for ChatML). Whatever the
template writes after that token (ChatML writes ``\\n``) is part of the next delta.

The formatter also carries the rest of ``agent:`` (``formatter_for``): the tool-call format the
episode loop parses and the gold replay writes (``agent.tool_format``), a system prompt for every
episode (``agent.system_prompt``) and a replacement chat template (``agent.chat_template``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.agent.parser import ParsedMessage
from agentrl.agent.tool_formats import ToolFormat, get_format
from agentrl.tasks.schema import ToolCall

END_OF_MESSAGE_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def _tool_dict(tool: Any) -> dict:
    """Accept OpenAI tool dicts or pydantic ToolSpec; drop ``None`` fields (e.g. ``returns``)."""
    if hasattr(tool, "model_dump"):
        return tool.model_dump(exclude_none=True)
    return tool


def load_chat_template(value: str) -> str:
    """``agent.chat_template``: the text of a template file, or the value itself when it is
    template text. Template text is told apart by its Jinja tags (``{{`` / ``{%``): a template
    without any would render the same text for every conversation, so such a value is a path, and
    one that does not exist is a ValueError (not silently used as a constant template)."""
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"agent.chat_template: no template file at {value!r} (and the value has no Jinja tags)")
    return path.read_text()


def _call_from_message(tc: Any) -> ToolCall:
    """An OpenAI ``tool_calls`` entry (``{"function": {"name", "arguments"}}``, arguments a dict or
    a JSON string) or a bare ``{"name", "arguments"}`` as a ToolCall."""
    fn = tc.get("function", tc) if isinstance(tc, dict) else tc
    args = fn.get("arguments") or {}
    return ToolCall(name=fn["name"], arguments=json.loads(args) if isinstance(args, str) else args)


class ChatFormatter:
    """Wraps a HF tokenizer that has a chat template."""

    # Fixed dummy history that delta_ids renders after. Short, role-complete, template-agnostic.
    _DUMMY = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "x"},
    ]

    def __init__(self, tokenizer: Any, tool_format: str | ToolFormat = "hermes", system_prompt: str | None = None):
        """``tool_format``: how calls are written and parsed (``agentrl.agent.tool_formats``);
        ``system_prompt``: the system message of every prompt that is given none."""
        self.tool_format: ToolFormat = get_format(tool_format)
        self.system_prompt = system_prompt
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; set one (e.g. agentrl.agent.chat_template.CHAT_TEMPLATE)")
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        # End-of-message token: the template's per-message terminator when it has one (ChatML
        # <|im_end|>), else EOS. This is the id render_assistant_ids appends.
        eom = next((t for t in END_OF_MESSAGE_CANDIDATES if t in vocab), None)
        if eom is None:
            if tokenizer.eos_token is None:
                raise ValueError("tokenizer has neither an end-of-message token nor eos_token")
            eom = tokenizer.eos_token
        self.end_token: str = eom
        self.end_token_id: int = vocab[eom] if eom in vocab else tokenizer.convert_tokens_to_ids(eom)
        ids = [self.end_token_id]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(int(tokenizer.eos_token_id))
        # Llama 3.x ends a message that awaits a tool result with <|eom_id|> (after a
        # <|python_tag|> call, agent.tool_format=llama3_json) rather than <|eot_id|>
        if "<|eom_id|>" in vocab and vocab["<|eom_id|>"] not in ids:
            ids.append(vocab["<|eom_id|>"])
        self.eos_token_ids: list[int] = ids
        """Ids that end an assistant message (stop ids for generation), end_token_id first."""
        self._dummy = self._pick_dummy()
        # The dummy conversation's text up to its last end-of-message token: the prefix every
        # delta is cut from. Rendered once here, not once per delta (a rollout makes hundreds).
        base = self.render(self._dummy)
        cut = base.rfind(self.end_token)
        self._delta_prefix = base[: cut + len(self.end_token)] if cut >= 0 else None

    # --- rendering -------------------------------------------------------------------------
    def render(self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = False) -> str:
        """The template's text for a conversation (no tokenization).

        With a tool format other than hermes, an assistant message's ``tool_calls`` are written
        into its content by that format before the template sees it: templates render
        ``tool_calls`` in their own family's layout (ours: hermes blocks) or not at all, and the
        text must be what the episode loop parses. Hermes messages go to the template untouched."""
        if self.tool_format.name != "hermes":
            messages = [self._calls_as_text(m) for m in messages]
        return self.tokenizer.apply_chat_template(
            messages,
            tools=[_tool_dict(t) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def _calls_as_text(self, message: dict) -> dict:
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return message
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = [_call_from_message(tc) for tc in message["tool_calls"]]
        rest = {k: v for k, v in message.items() if k != "tool_calls"}
        return {**rest, "content": self.tool_format.render_message(content, calls)}

    def parse(self, text: str, known_tools: set[str] | None = None) -> ParsedMessage:
        """An assistant message's calls in this formatter's tool format."""
        return self.tool_format.parse(text, known_tools)

    def encode(self, text: str) -> list[int]:
        """Tokenize text as a chat template would (special-token strings map to their ids, no
        BOS/EOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # --- the three pieces of an episode ----------------------------------------------------
    def prompt_ids(self, system_or_none: str | None, tools: list, first_user: str) -> list[int]:
        """Ids of [system?, user] with tools, ending with the generation prompt. No system text
        given: the formatter's ``system_prompt`` (``agent.system_prompt``), if any."""
        if system_or_none is None:
            system_or_none = self.system_prompt
        msgs = [] if system_or_none is None else [{"role": "system", "content": system_or_none}]
        msgs.append({"role": "user", "content": first_user})
        return self.encode(self.render(msgs, tools=tools, add_generation_prompt=True))

    def render_assistant_ids(self, text: str) -> list[int]:
        """Ids of an assistant message body as generation produces it: text + end-of-message id.

        Used to build SFT sequences that look like sampled ones. Note: tokenizing ``text`` alone
        can differ from how the full rendered conversation would tokenize it (BPE merges across
        ``assistant\\n`` when text starts with whitespace); this is deliberate, it matches what
        the loop feeds the learner."""
        return self.encode(text) + [self.end_token_id]

    def delta_text(self, new_messages: list[dict]) -> str:
        """Text to append after an assistant message's end token, for ``new_messages`` (tool
        results and/or a user turn), ending with the generation prompt."""
        prefix = self._delta_prefix
        if prefix is None:
            raise ValueError(f"chat template does not end assistant messages with {self.end_token!r}")
        full = self.render(self._dummy + list(new_messages), add_generation_prompt=True)
        if not full.startswith(prefix):
            raise ValueError("chat template is not prefix-stable: appending messages changed earlier text")
        return full[len(prefix):]

    def delta_ids(self, new_messages: list[dict]) -> list[int]:
        """Ids of ``delta_text(new_messages)``. Because the delta starts right after a special
        token, its tokenization is independent of everything before it."""
        return self.encode(self.delta_text(new_messages))

    def _pick_dummy(self) -> list[dict]:
        # Some templates reject a system role; fall back to [user, assistant].
        try:
            self.render(self._DUMMY)
            return list(self._DUMMY)
        except Exception:
            return list(self._DUMMY[1:])


def formatter_for(tokenizer: Any, agent_cfg: Any = None) -> ChatFormatter:
    """The formatter of a run: ``tokenizer`` with the ``agent:`` section applied (``AgentConfig``;
    None = its defaults). ``agent.chat_template`` replaces the tokenizer's template (in place)."""
    if agent_cfg is None:  # the defaults (agent imports no config: the layer order)
        return ChatFormatter(tokenizer)
    if agent_cfg.chat_template is not None:
        tokenizer.chat_template = load_chat_template(agent_cfg.chat_template)
    return ChatFormatter(tokenizer, tool_format=agent_cfg.tool_format, system_prompt=agent_cfg.system_prompt)


def with_template_text(agent_cfg: Any) -> Any:
    """``agent_cfg`` with ``chat_template`` read into text, so that a relative path is resolved
    where the config was loaded (the driver), not in a Ray worker's working directory, and a
    missing file fails before any worker starts."""
    if agent_cfg is None or agent_cfg.chat_template is None:
        return agent_cfg
    return agent_cfg.model_copy(update={"chat_template": load_chat_template(agent_cfg.chat_template)})

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
"""

from __future__ import annotations

from typing import Any

END_OF_MESSAGE_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def _tool_dict(tool: Any) -> dict:
    """Accept OpenAI tool dicts or pydantic ToolSpec; drop ``None`` fields (e.g. ``returns``)."""
    if hasattr(tool, "model_dump"):
        return tool.model_dump(exclude_none=True)
    return tool


class ChatFormatter:
    """Wraps a HF tokenizer that has a chat template."""

    # Fixed dummy history that delta_ids renders after. Short, role-complete, template-agnostic.
    _DUMMY = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "x"},
    ]

    def __init__(self, tokenizer: Any):
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
        """The template's text for a conversation (no tokenization)."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=[_tool_dict(t) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        """Tokenize text as a chat template would (special-token strings map to their ids, no
        BOS/EOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # --- the three pieces of an episode ----------------------------------------------------
    def prompt_ids(self, system_or_none: str | None, tools: list, first_user: str) -> list[int]:
        """Ids of [system?, user] with tools, ending with the generation prompt."""
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

"""The chat template of our tiny locally-trained tokenizer (ChatML, Qwen2.5-compatible layout).

Why our own and not Qwen2.5's verbatim: a ~2M-parameter model trained on 2 CPU cores pays for
every prompt token in every SFT and RL step, and Qwen's JSON tool schemas made the system prompt
~700 tokens (70 % of a median episode). So tools are listed as one compact signature each,
``name(arg1, arg2)``; the tiny model learns argument types and meanings from the data. Real
models (SmolLM2, Qwen) keep their own templates. Everything else follows Qwen2.5 so that text,
the hermes parser (``agentrl.agent.parser``) and vLLM's ``hermes`` tool parser agree:

* ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message;
* tools go into the system message::

      <|im_start|>system
      {system text}\\n\\n            (only when a system message is given)
      You can call these tools:
      <tools>
      open_account(owner)
      deposit(account_id, amount)
      </tools><|im_end|>

* assistant ``tool_calls`` (OpenAI message format) render exactly like
  ``parser.format_tool_calls``: content, then ``\\n`` + one Hermes block per call (no leading
  newline when content is empty). With another ``agent.tool_format`` the template never sees
  ``tool_calls``: ``ChatFormatter.render`` writes them into the content in that format first;
* consecutive ``tool`` messages are grouped into ONE user block, each wrapped in
  ``\\n<tool_response>\\n{content}\\n</tool_response>``;
* ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``.

Convention for the episode loop: the model ends a message by emitting ``<|im_end|>``; the
``\\n`` after it belongs to whatever is appended next (see ``ChatFormatter.delta_ids``).
"""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- 'You can call these tools:\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool %}"
    "{{- '\\n' + f['name'] + '(' }}"
    "{%- set props = (f['parameters'] | default({})).get('properties', {}) %}"
    "{%- for k in props %}{{- k }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- ')' }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{{- content }}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set call = tc['function'] if tc['function'] is defined else tc %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + call['name'] | tojson + ', \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}"
    "{%- else %}{{- call['arguments'] | default({}) | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Jinja source; set it as ``tokenizer.chat_template``. Special tokens: ``<|im_start|>``,
``<|im_end|>`` (end of message, the token generation stops at) and ``<|endoftext|>``."""

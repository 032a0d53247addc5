"""Chat templates for tests, on the SmolLM2 tokenizer (no model hub here): written for these
tests, in the two shapes that matter for token trajectories and native tool calls.

* :data:`STABLE`: ChatML blocks, every message rendered as written, tools listed in the system
  block, ``tool`` messages in their own block: appending messages only appends text.
* :data:`THINK_STRIPPING`: the same, but like Qwen3 it renders an assistant message that comes
  before the last real user message without its ``<think>`` block, and wraps tool results in
  ``<tool_response>`` inside a user block: once a conversation moves on, earlier turns re-render
  differently.
"""

from __future__ import annotations

import copy
from typing import Any

_TOOLS = """{%- if tools %}{{ '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}
{{- 'Tools you can call, one JSON object per <tool_call></tool_call> block:\\n' }}
{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}{{ '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"""

STABLE = (
    _TOOLS
    + """
{%- for m in messages %}{%- if m.role != 'system' %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"""
)

THINK_STRIPPING = (
    _TOOLS
    + """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- set content = m.content %}
{%- if loop.index0 < ns.last_user and '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- elif m.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}
{%- elif m.role != 'system' %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"""
)


def with_template(tokenizer: Any, template: str) -> Any:
    """A copy of ``tokenizer`` whose chat template is ``template`` (the original is untouched)."""
    out = copy.deepcopy(tokenizer)
    out.chat_template = template
    return out

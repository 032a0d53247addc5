"""``MATH-Tools-v0``: ``MATH-ReAct-v0`` with native tool calls (docs/protocol.md#native-tool-calls)."""

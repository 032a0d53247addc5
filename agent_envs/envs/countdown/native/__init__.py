"""``Countdown-Tools-v0``: ``Countdown-ReAct-v0`` with native tool calls (docs/protocol.md#native-tool-calls)."""

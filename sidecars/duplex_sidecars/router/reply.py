"""Decode's reply as the router sees it: the generated turn, assembled from SSE chunks or read from a JSON body, as
far as the next turn's prompt is concerned."""

from __future__ import annotations

from typing import Any

from duplex_sidecars.router.history import CHAT_ROUTE, Reply

# A token delta with nothing but these keys carries only content.
_PLAIN_DELTA_KEYS = frozenset({"role", "content"})


class ReplyCollector:
    """Accumulates a streamed reply chunk by chunk."""

    def __init__(self, route: str):
        self._chat = route == CHAT_ROUTE
        self._indexes: set[int] = set()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._finish_reason: str | None = None
        self._stop_reason: Any = None
        self._malformed = False

    def add(self, chunk: dict[str, Any], exact: bool = True) -> None:
        """Take one chunk; `exact` False (read by the lenient parser, may hold NaN) makes the reply unstorable."""
        if not exact:
            self._malformed = True
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                self._malformed = True
                continue
            index = choice.get("index", 0)
            self._indexes.add(index if isinstance(index, int) else -1)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
                self._stop_reason = choice.get("stop_reason")
            if not self._chat:
                text = choice.get("text")
                if isinstance(text, str):
                    self._content.append(text)
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if isinstance(content, str):
                self._content.append(content)
            if not delta.keys() <= _PLAIN_DELTA_KEYS:
                self._add_rest_of_delta(delta)  # not the usual token delta: reasoning, tool calls, ...

    def _add_rest_of_delta(self, delta: dict[str, Any]) -> None:
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self._reasoning.append(delta[key])
        calls = delta.get("tool_calls")
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict):
                self._malformed = True
                continue
            index = call.get("index", len(self._tool_calls))
            slot = self._tool_calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
            for key in ("id", "type"):
                if call.get(key) is not None:
                    slot[key] = call[key]
            function = call.get("function")
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        slot["function"][key] += function[key]

    def reply(self) -> Reply:
        calls = []
        for index in sorted(self._tool_calls, key=lambda i: (not isinstance(i, int), i if isinstance(i, int) else 0)):
            call = dict(self._tool_calls[index])
            function = {k: v for k, v in call["function"].items() if v}
            call["function"] = function
            calls.append(call)
        content = "".join(self._content) if self._content else None
        if self._malformed:
            return Reply(choices=0)
        return Reply(
            content=content,
            tool_calls=tuple(calls),
            reasoning="".join(self._reasoning) or None,
            finish_reason=self._finish_reason,
            stop_reason=self._stop_reason,
            choices=max(len(self._indexes), 1),
        )


def reply_of_body(route: str, body: dict[str, Any]) -> Reply:
    """The reply of a non-streaming response body."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return Reply(choices=len(choices) if isinstance(choices, list) else 0)
    choice = choices[0]
    finish = choice.get("finish_reason")
    stop = choice.get("stop_reason")
    if route != CHAT_ROUTE:
        text = choice.get("text")
        return Reply(content=text if isinstance(text, str) else None, finish_reason=finish, stop_reason=stop)
    message = choice.get("message")
    if not isinstance(message, dict):
        return Reply(choices=0)
    calls = message.get("tool_calls")
    content = message.get("content")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return Reply(
        content=content if isinstance(content, str) else None,
        tool_calls=tuple(calls) if isinstance(calls, list) else (),
        reasoning=reasoning if isinstance(reasoning, str) else None,
        finish_reason=finish,
        stop_reason=stop,
    )

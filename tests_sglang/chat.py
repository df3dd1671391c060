"""Small HTTP helpers for the tier's tests: one chat request, plain or streamed, to a real SGLang server."""

from __future__ import annotations

import json

import requests

from draftgen.client.sse import iter_events

TIMEOUT_S = 300  # STANDALONE on two shared cores decodes a couple of tokens per second


def chat(url: str, model: str, text: str, *, thinking: bool, max_tokens: int = 32, **extra) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": thinking},
        **extra,
    }
    reply = requests.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    return reply.json()


def chat_stream(url: str, model: str, text: str, *, thinking: bool, max_tokens: int = 32) -> list[dict]:
    """Every event's data of a streamed chat (draftgen's own decoder), in order (``[DONE]`` checked and dropped)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": thinking},
    }
    with requests.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT_S, stream=True) as reply:
        assert reply.status_code == 200, reply.text
        events = [event.data for event in iter_events(reply.iter_content(chunk_size=None))]
    assert events and events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]

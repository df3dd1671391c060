"""A stand-in worker that answers chat with SGLang 0.5.23's token-id ``sglext`` fields, for the gateway tests.

The simulator does not return ``sglext.input_ids`` / ``output_ids`` (yet), and what a gateway does to them is the
question, not the ids themselves. So this worker relays every other request to a simulated server (health, model
and server info, /metrics: what SMG asks when it registers a worker) and answers ``POST /v1/chat/completions``
itself: the content is the request body it received (an echo), and the ``sglext`` carries the ids the request
asked for, in SGLang 0.5.23's shape (``input_ids``: one list; ``output_ids``: one list per choice; in a stream,
one chunk with ``choices: []`` before the usage chunk). Every answer it sent is kept, to compare with what came
out of the gateway.
"""

from __future__ import annotations

import json
import time

from aiohttp import web
from recording_proxy import Exchange, RecordingProxy

INPUT_IDS = [151644, 872, 198, 3838, 374, 220, 16, 22, 151645]
OUTPUT_IDS = [151667, 198, 32313, 151668, 271, 16, 22, 151645]


def _sglext(body: dict) -> dict:
    ext: dict = {}
    if body.get("return_input_ids_in_sglext"):
        ext["input_ids"] = INPUT_IDS
    if body.get("return_output_ids_in_sglext"):
        ext["output_ids"] = [OUTPUT_IDS]
    return ext


def _usage() -> dict:
    return {"prompt_tokens": len(INPUT_IDS), "completion_tokens": len(OUTPUT_IDS), "total_tokens": 17}


class IdsWorker(RecordingProxy):
    """``IdsWorker(sim_url).start()`` → its URL; chat answers carry the requested ids in ``sglext``."""

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":
            return await super()._relay(request)
        raw = await request.read()
        body = json.loads(raw)
        started = time.time()
        head = {"id": "ids-1", "created": int(started), "model": body.get("model")}
        ext = _sglext(body)
        if body.get("stream"):
            events = [
                {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}
                for d in ({"role": "assistant", "content": ""}, {"content": raw.decode()})
            ]
            events.append(
                {
                    **head,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                }
            )
            if ext:
                events.append({**head, "object": "chat.completion.chunk", "choices": [], "sglext": ext})
            events.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage()})
            answer = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
            reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await reply.prepare(request)
            await reply.write(answer)
            await reply.write_eof()
        else:
            message = {"role": "assistant", "content": raw.decode(), "reasoning_content": None}
            answer_json = {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": _usage(),
            }
            if ext:
                answer_json["sglext"] = ext
            answer = json.dumps(answer_json).encode()
            reply = web.Response(body=answer, content_type="application/json")
        exchange = Exchange("POST", request.path, raw, 200, answer, started, time.time())
        with self._lock:
            self._exchanges.append(exchange)
        return reply

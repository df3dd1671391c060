"""Send a request SGLang refuses (empty ``messages``) with draftgen's own client; print how it classified it.

Run by the project's own interpreter (``.venv/bin/python``), not the SGLang venv: it imports draftgen. Every path
of the client is tried: ``chat`` plain (through the openai SDK) and streamed, and ``stream_chat`` (streams are read
by the client's own SSE decoder), since generate and the benchmark use them all.

    python refused_request.py URL MODEL  ->  [{"path": ..., "kind": ..., "status": ..., "message": ...,
                                             "retryable": ...}, ...]
"""

from __future__ import annotations

import asyncio
import json
import sys

from draftgen.client.errors import RequestError
from draftgen.client.server import ServerClient
from draftgen.params import SamplingParams

SAMPLING = SamplingParams(max_tokens=4, temperature=0.0, top_p=1.0)


async def classify(url: str, model: str) -> list[dict]:
    out = []
    async with ServerClient(url, timeout_s=120) as client:
        calls = {
            "chat": lambda: client.chat([], SAMPLING, model),
            "chat stream": lambda: client.chat([], SAMPLING, model, stream=True),
            "stream_chat": lambda: client.stream_chat([], SAMPLING, model),
        }
        for path, call in calls.items():
            try:
                await call()
            except RequestError as exc:
                out.append(
                    {
                        "path": path,
                        "kind": exc.kind,
                        "status": exc.status,
                        "message": exc.message,
                        "retryable": exc.retryable,
                    }
                )
            else:
                out.append({"path": path, "kind": "answered"})
    return out


if __name__ == "__main__":
    json.dump(asyncio.run(classify(sys.argv[1], sys.argv[2])), sys.stdout)

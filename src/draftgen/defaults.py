"""draftgen's own defaults that several commands, notebooks and params files share, each written once.

The production node is seven B200s, one SGLang server per GPU on consecutive ports (``draftgen serve --gpus 0-6``);
the simulated fleet stands in for it on the same ports (``draftgen sim``), so the notebooks' parameters cells and
``params/*.yaml`` name one fleet. SGLang's own rules (batch caps, speculative numbers) are ``draftgen.sglang_rules``;
each notebook parameter's default is its declaration in the step's config (``draftgen.params``). Plain values only:
``draftgen status`` and the simulated servers import this module too.
"""

from __future__ import annotations

# The target model's served name: what the simulator serves unless told another. The notebooks' `model` is "" by
# default: the one name every server reports in /v1/models (SGLang's --model-path unless --served-model-name).
MODEL = "Qwen/Qwen3.6-27B"
HOST = "127.0.0.1"
BASE_PORT = 30000  # the first server's port: serve, tune's candidates, the simulated fleet
FLEET_SIZE = 7  # servers of the production node, one per GPU
# The production concurrency: requests generate keeps in flight per server (and the estimate prices), and so the batch
# cap `draftgen serve` starts SGLang with when MTP is on (SGLang's own default there is 48: 16 of 64 would only queue).
CONCURRENCY_PER_SERVER = 64
# SGLang's Python when it lives in an environment of its own (docs/serve.md, "Two environments"): `draftgen serve`'s
# default for --python with --engine sglang.
SGLANG_PYTHON_ENV = "DRAFTGEN_SGLANG_PYTHON"


def fleet_urls(servers: int = FLEET_SIZE, base_port: int = BASE_PORT, host: str = HOST) -> list[str]:
    """The base URLs of ``servers`` servers on consecutive ports from ``base_port``."""
    return [f"http://{host}:{base_port + i}" for i in range(servers)]

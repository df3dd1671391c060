"""What a fleet serves: the one model name every server lists, and the model folder behind it on this machine.

A notebook's ``model`` left "" means "the model these servers serve": it is read from each server's
``GET /v1/models`` before anything is sent, so the name ``draftgen serve`` (or anyone) launched SGLang with and
the name the notebooks ask for cannot disagree. SGLang 0.5.23 lists one card whose ``id`` and ``root`` are both
its served name (``--served-model-name``, else ``--model-path``); the simulator lists the same. A server that lists
nothing (``transformers serve`` answers 500) cannot be resolved: ``model`` must then be given.

The folder the model was loaded from (SGLang's ``/server_info`` ``tokenizer_path`` and ``model_path``; vLLM's
card ``root``) is where generate finds the target's tokenizer when none is named and the folder is on this machine
(several folders only when their tokenizer files are the same).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftgen.client import introspect
from draftgen.client.server import ServerClient


@dataclass(frozen=True)
class ServedFacts:
    """What one server says it serves: its model list, the folders it loaded from, and whether it is simulated."""

    url: str
    models: introspect.ModelList
    folders: tuple[str, ...] = ()  # where it loaded its tokenizer / model: local paths or Hugging Face ids
    simulated: bool = False  # a draftgen sim server (GET /sim/info answers)

    @property
    def answered(self) -> bool:
        return self.models.status is not None


async def read_served(client: ServerClient) -> ServedFacts:
    """One server's facts, from GET /v1/models, /server_info and /sim/info (a few milliseconds each)."""
    models, info, sim = await asyncio.gather(
        introspect.served_models(client), introspect.server_info(client), client.sim_info()
    )
    folders = tuple(dict.fromkeys((*info.model_folders, *models.roots)))
    return ServedFacts(client.url, models, folders, sim is not None)


async def read_fleet(urls: Sequence[str], api_key: str = "EMPTY") -> list[ServedFacts]:
    """``read_served`` of every server at once."""

    async def one(url: str) -> ServedFacts:
        async with ServerClient(url, api_key=api_key) as client:
            return await read_served(client)

    return list(await asyncio.gather(*(one(url) for url in urls)))


class ModelNotResolved(ValueError):
    """The servers do not name one model: the message lists what each server lists and the fix."""


def _listing(facts: ServedFacts) -> str:
    if not facts.answered:
        return f"{facts.url} did not answer"
    if not facts.models.ids:
        return f"{facts.url} lists none (GET /v1/models answered {facts.models.status})"
    return f"{facts.url} lists {', '.join(repr(i) for i in facts.models.ids)}"


def one_model(servers: Sequence[ServedFacts]) -> str:
    """The one model name every server that answered lists, and nothing else; ``ModelNotResolved`` naming each
    server's list when they disagree, when one lists several or none, or when no server answered."""
    answered = [s for s in servers if s.answered]
    if not answered:
        raise ModelNotResolved(
            "no server answered GET /v1/models, so model cannot be read from them: start the servers "
            "(draftgen serve), or check servers"
        )
    names = {s.models.ids for s in answered}
    if len(names) == 1 and len(next(iter(names))) == 1:
        return next(iter(names))[0]
    listings = "; ".join(_listing(s) for s in answered)
    raise ModelNotResolved(
        f'model is "" but the servers do not list one model: {listings}; set model to the name to use '
        "(-p model NAME), or list only servers of one model"
    )


def local_model_folder(servers: Sequence[ServedFacts]) -> tuple[str | None, tuple[str, ...]]:
    """(the folder on this machine the servers loaded their model from, or None; every such folder found).

    Each server's first folder that exists here counts (its tokenizer's before its model's); relative paths are
    the server's own business and never taken. Several distinct folders are one tokenizer when their tokenizer
    files are the same bytes (copies of one model, or models built on one tokenizer): the first is taken, as any
    would count each prompt alike. Otherwise they are ambiguous: None, with them all."""
    found: list[str] = []
    for server in servers:
        for folder in server.folders:
            path = Path(folder).expanduser()
            if path.is_absolute() and path.is_dir():
                found.append(str(path))
                break
    distinct = tuple(dict.fromkeys(found))
    if len(distinct) == 1 or (distinct and same_tokenizer(distinct)):
        return distinct[0], distinct
    return None, distinct


# What transformers builds a tokenizer and its chat template from (tokenizer.json, the fast tokenizer, first; the
# vocabulary files of slow ones; the chat template in any of its places). Nothing else in a model folder changes
# how a prompt is counted.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
CHAT_TEMPLATES_DIR = "additional_chat_templates"


def tokenizer_digest(folder: str | Path) -> tuple[tuple[str, str], ...] | None:
    """(name, SHA-256) of each tokenizer file ``folder`` holds; None without tokenizer.json (no tokenizer to load)."""
    root = Path(folder)
    if not (root / "tokenizer.json").is_file():
        return None
    files = [root / name for name in TOKENIZER_FILES] + sorted(root.joinpath(CHAT_TEMPLATES_DIR).glob("*"))
    try:
        return tuple(
            (str(path.relative_to(root)), hashlib.sha256(path.read_bytes()).hexdigest())
            for path in files
            if path.is_file()
        )
    except OSError:  # unreadable here: not a tokenizer this machine can load either
        return None


def same_tokenizer(folders: Sequence[str]) -> bool:
    """Whether every folder holds the same tokenizer files, byte for byte (and one to load)."""
    digests = {tokenizer_digest(folder) for folder in folders}
    return len(digests) == 1 and None not in digests

"""What preflight fills in from the servers before it checks anything else: the model name and the tokenizer.

- ``model: ""``: the one model every server lists in GET /v1/models (``draftgen.client.served``), so the name the
  servers were launched with and the name requests carry cannot disagree; refused, naming each server's list, when
  they do not list one model.
- ``tokenizer: ""`` with ``train_max_length`` > 0: nothing would cap a turn at the trainer's max_length, and a run
  made without the cap resumes without it. So the model folder the servers loaded (SGLang's /server_info) is taken
  when it is on this machine (of several, the first when their tokenizer files are the same); otherwise a fleet of
  real engines is refused, naming the fix. Simulated servers without a model folder are let through (rehearsals;
  preflight's max_length row still warns).
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgen.client.served import ModelNotResolved, ServedFacts, local_model_folder, one_model
from draftgen.generate.check import Check
from draftgen.generate.config import GenerateConfig


def fill_in(config: GenerateConfig, fleet: Sequence[ServedFacts]) -> tuple[GenerateConfig, list[Check]]:
    """``config`` with the model and tokenizer the servers name where it left them unset, and a row for each
    (a "fail" row when they cannot be filled in). ``fleet``: the facts of the servers that are up."""
    answered = [server for server in fleet if server.answered]
    changes: dict[str, str] = {}
    checks: list[Check] = []
    if config.model is None and answered:
        try:
            changes["model"] = one_model(answered)
            checks.append(
                Check(
                    "model",
                    f"{len(answered)} servers",
                    "ok",
                    f'"" → {changes["model"]!r}: the one model every server lists in GET /v1/models',
                )
            )
        except ModelNotResolved as exc:
            checks.append(Check("model", f"{len(answered)} servers", "fail", str(exc)))
    folder, check = tokenizer_of(config, answered)
    if folder is not None:
        changes["tokenizer"] = folder
    if check is not None:
        checks.append(check)
    return (config.model_copy(update=changes) if changes else config), checks


def tokenizer_of(config: GenerateConfig, answered: Sequence[ServedFacts]) -> tuple[str | None, Check | None]:
    """(the tokenizer folder to use, the row saying so) when none is given and the trainer's cap needs one."""
    limit = config.train_max_length
    if config.tokenizer or not limit or not answered:
        return None, None
    folder, found = local_model_folder(answered)
    if folder is not None:
        where = (
            f"the servers loaded {', '.join(found)}, whose tokenizer files are the same (the first is taken)"
            if len(found) > 1
            else "the model folder the servers loaded is on this machine"
        )
        return folder, Check(
            "tokenizer",
            folder,
            "ok",
            f"none given: {where}; it counts each turn's prompt, so no turn is generated past the trainer's "
            f"max_length (train_max_length {limit})",
        )
    if not found and all(server.simulated for server in answered):
        return None, None
    named = sorted({f for server in answered for f in server.folders})
    where = (
        f"the servers loaded {', '.join(found)}: more than one, and their tokenizer files differ"
        if found
        else f"the servers loaded {', '.join(named)}, not a folder on this machine"
        if named
        else "the servers name no model folder"
    )
    return None, Check(
        "tokenizer",
        "(none)",
        "fail",
        f"no tokenizer for the trainer's max_length (train_max_length {limit}): nothing would cap a turn there, "
        f"and a run made without the cap resumes without it; {where}. Give the served model's folder "
        "(-p tokenizer /path/to/model-folder), or -p train_max_length 0 to generate without the cap",
    )

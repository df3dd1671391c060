"""The SpecForge run config validate writes with the export, read by SpecForge 0.2.0 itself.

validate runs as a user preparing DFlash data runs it (the DFlash trainer, on the real servers' output), and
SpecForge's own config loader (``specforge.config.load_config``, what ``specforge train -c`` calls first) reads
``export/specforge.yaml`` as written: its data source is the export's pre-tokenized rows, which SpecForge's own
prompt builder, given the config's path and max_length, keeps unchanged; ``specforge train --plan`` plans the run
once the training cluster's addresses are added as the header says; the held-out prompts it names are the
export's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import GenerateRun
from specforge_oracle import dflash_prompts
from test_trainer_oracle_real import RANDOM_MODEL_FLAGS

from draftgen.params import build_config
from draftgen.rundir.layout import EXPORT_TRAINER_CONFIG
from draftgen.training.masks import load_tokenizer
from draftgen.validate.config import ValidateConfig
from draftgen.validate.pipeline import finalize_export, validate_generation

MAX_LENGTH = 96  # the tiny servers' answers are short: every row fits
# what the config's header says the training cluster adds: its capture servers and Mooncake
CLUSTER = [
    "deployment.disaggregated.server_urls=[http://127.0.0.1:30000]",
    "deployment.disaggregated.mooncake_metadata_server=http://127.0.0.1:35880/metadata",
    "deployment.disaggregated.mooncake_master_server_addr=127.0.0.1:35551",
]


def test_specforge_reads_the_exported_config_and_its_paths_are_the_exports_files(
    generate_run: GenerateRun, tmp_path
):
    from specforge.config import Config, load_config

    folder = generate_run.params["model"]
    config = build_config(
        ValidateConfig,
        {
            "generation_dir": str(generate_run.run_dir),
            "tokenizer": folder,
            "out_dir": str(tmp_path / "validated"),
            "trainer": "specforge-dflash-qwen3.5",
            "train_max_length": MAX_LENGTH,
            "max_degenerate_share": 1.0,
            "max_truncated_share": 1.0,
            "keep_flagged": RANDOM_MODEL_FLAGS,
            "holdout_share": 0.2,  # of 24 prompts: some held out, so the config names them
        },
    )
    tokenizer = load_tokenizer(folder)
    export = finalize_export(validate_generation(config, tokenizer=tokenizer, progress=False))
    path = export / EXPORT_TRAINER_CONFIG

    loaded = load_config(str(path))  # as `specforge train -c` reads it: SpecForge's schema, unchanged
    assert isinstance(loaded, Config)
    assert loaded.mode == "online" and loaded.training.strategy == "dflash"
    assert Path(loaded.data.prompts_path) == (export / "prompts.jsonl").resolve()
    assert not loaded.data.train_data_path and not loaded.data.hidden_states_path  # exactly one source
    assert loaded.data.max_length == MAX_LENGTH and loaded.data.chat_template == "qwen3.5"
    # rows per turn (validate's default): each supervises its last turn
    assert loaded.data.train_only_last_turn
    assert Path(loaded.model.target_model_path) == Path(folder).resolve()

    # SpecForge's own prompt builder, given the config's path and max_length, keeps every exported row as written
    ours = [json.loads(line) for line in Path(loaded.data.prompts_path).read_text().splitlines()]
    assert ours, "the export holds rows"
    kept = dflash_prompts(Path(loaded.data.prompts_path), tokenizer, loaded.data.max_length)
    assert kept == [(r["input_ids"], r["loss_mask"]) for r in ours]

    # `specforge train --plan` resolves the run (the DFlash algorithm, its launch plan) without starting it: as
    # written it stops at what the header says to add, the training cluster's Mooncake; with that added as dotted
    # overrides, the plan is made
    train = [sys.executable, "-m", "specforge.cli", "train", "-c", str(path), "--plan"]
    bare = subprocess.run(train, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bare.returncode != 0 and "Mooncake endpoints must be provided" in bare.stderr, bare.stderr[-2000:]
    planned = subprocess.run([*train, *CLUSTER], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    plan = json.loads(planned.stdout[planned.stdout.index("{") :])
    assert plan["kind"] == "supervisor" and {c["label"] for c in plan["commands"]} == {"producer", "consumer"}
    served = load_config(str(path), CLUSTER)
    assert served.deployment.disaggregated.server_urls == ["http://127.0.0.1:30000"]

    # the comments name the other files, which are there
    comments = [line for line in path.read_text().splitlines() if line.startswith("# draftgen ")]
    named = {line.split(": ", 1)[0]: line.split(": ", 1)[1].split(" (")[0] for line in comments}
    assert named["# draftgen trainer"] == "specforge-dflash-qwen3.5"
    assert Path(named["# draftgen held-out prompts"]) == (export / "holdout" / "prompts.jsonl").resolve()
    assert Path(named["# draftgen held-out prompts"]).is_file()
    assert Path(named["# draftgen conversations"]) == (export / "train.jsonl").resolve()
    assert yaml.safe_load(path.read_text())["data"]["prompts_path"] == loaded.data.prompts_path

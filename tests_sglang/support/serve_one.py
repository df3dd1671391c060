"""One real SGLang 0.5.23 server on this CPU, as the tier starts them, for a benchmark to measure.

Run with the tier's interpreter: ``.venv-sglang/bin/python tests_sglang/support/serve_one.py OUT_DIR [--spec
ngram|standalone|none]``. Holds the machine's real-server lock (tests_real/machine_lock.py) for its whole life,
builds the tier's tiny Qwen3 models (the random one answers to max_tokens: every request is as long as asked),
starts ``draftgen serve --engine sglang`` on it (``--kind designed``: the designed model, whose known answer
stops; NGRAM 4 draft tokens by default, float32 as the tier's speculative servers run), prints one JSON line ``{"url", "model"}`` once ``/health`` answers 200, and stops
serve, leaving no SGLang process, when its standard input closes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
sys.path.insert(0, str(SUPPORT))
sys.path.append(str(REPO / "tests_real"))

from machine_lock import hold_machine_lock  # noqa: E402
from serve_runs import start_serve  # noqa: E402
from tiny_qwen3 import build_model, build_tokenizer  # noqa: E402

SERVED_MODEL = "tiny-qwen3"
SPEC_ARGS = {
    "ngram": ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"),
    "standalone": (),  # filled in with the draft model's path below
    "none": (),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the models and serve's run folder go")
    parser.add_argument("--spec", choices=sorted(SPEC_ARGS), default="ngram")
    parser.add_argument(
        "--kind", choices=("random", "designed"), default="random", help="designed: a known answer that stops"
    )
    args = parser.parse_args()
    draftgen = os.environ.get("DRAFTGEN_BIN", str(REPO / ".venv" / "bin" / "draftgen"))
    lock = hold_machine_lock(say=lambda text: print(text, file=sys.stderr))
    try:
        tokenizer = build_tokenizer(draftgen, args.out / "tokenizer")
        model = build_model(tokenizer, args.out / args.kind, args.kind)
        spec = SPEC_ARGS[args.spec]
        if args.spec == "standalone":
            draft = build_model(tokenizer, args.out / "draft", "draft")
            spec = (
                *("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft)),
                *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
                *("--speculative-num-draft-tokens", "4"),
            )
        run = start_serve(
            draftgen,
            args.spec,
            model,
            args.out / "serve",
            server_args=(*spec, "--served-model-name", SERVED_MODEL),
            dtype="float32",
        )
        try:
            run.wait_ready(600)
            print(json.dumps({"url": run.url, "model": SERVED_MODEL}), flush=True)
            sys.stdin.read()  # until the benchmark closes our standard input (or ends)
        finally:
            left = run.stop()
            if left:
                print(f"killed {len(left)} SGLang processes left after serve stopped", file=sys.stderr)
    finally:
        os.close(lock)


if __name__ == "__main__":
    main()

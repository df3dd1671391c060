"""How fast are loss masks built, against plainly batch-tokenizing the same rendered text in the same run?

Builds samples of about --tokens tokens each (prompt, reasoning, answer in the chat format), then times, in
interleaved rounds on the same texts:

  baseline  the fast tokenizer's parallel batch encoder on the full rendered conversations (ids collected)
  masks     draftgen.training.masks.build_masks for --trainer (default specforge-qwen3.5: render the conversation, batch-encode
            it, find every assistant span, place its boundaries as the trainer does, cut at max_length; the
            draftgen-* conventions: render prompt + full conversation, batch-encode both, check the prompt is a
            token prefix, place the span) — everything validate needs per sample

  ids       (span trainers) the same rows built from the server's own token ids, as validate builds them where a
            server sent ids (training.id_rows: prompt ids + output ids + the template's tail, the trainer's mask
            rule on ids, the check that the ids decode to the stored answer); the ids are made once, outside the
            timing, as a faithful server would return them — without the comparison with re-tokenizing

and prints samples/s, tokens/s, masks ÷ baseline throughput (goal >= 0.7), ids ÷ masks (goal >= 1.0), and the
projected time for
--project-samples samples of --tokens tokens on --project-cores cores. Scaling assumption, stated in the output:
the Rust batch encodes spread over all cores (rayon), so their time scales with 1/cores; template rendering and the
per-sample Python bookkeeping run on one core, so they do not. Tokens per second per core are taken from this
machine as measured.

    .venv/bin/python benchmarks/mask_speed.py [--vocab qwen3|tiny] [--trainer NAME] [--samples 1000] [--tokens 1800]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from draftgen.training.id_rows import ids_layout, ids_problem, join_turn, span_mask
from draftgen.training.local_tokenizer import build_qwen3_tokenizer, build_tiny_tokenizer
from draftgen.training.masks import MaskSpec, build_masks, load_tokenizer, render_batch, render_conversations
from draftgen.training.trainers import GeneratedTurnTrainer, Trainer, generated_turn_conversation

WORDS = (
    "so we need the sum of each term then check the value again because the list is sorted and the loop runs "
    "over every index until the result equals the target number which gives two cases wait let me verify "
    "actually consider edge case function returns string half twice step"
).split()
CODE = (
    "def f(x):",
    "    return x + 1",
    "for i in range(n):",
    "if a[i] > best:",
    "best = a[i]",
    "print(best)",
)


def _prose(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        out.append(rng.choice(WORDS))
        if i % 13 == 12:
            out.append(f"{rng.randint(0, 999)}.")
        if i % 61 == 60:
            out.append("\n\n" + "\n".join(rng.sample(CODE, 3)) + "\n\n")
    return " ".join(out)


def make_samples(count: int, tokens: int, seed: int = 0) -> tuple[list, list, list]:
    """Prompt ~10%, reasoning ~75%, answer ~15% of ``tokens`` (about 1.65 Qwen3 tokens per word on this text)."""
    rng = random.Random(seed)
    words = max(20, int(tokens / 1.65))
    messages, reasoning, content = [], [], []
    for i in range(count):
        jitter = rng.uniform(0.8, 1.2)
        messages.append(
            [{"role": "user", "content": f"Problem {i}: " + _prose(rng, int(words * 0.10 * jitter))}]
        )
        reasoning.append(_prose(rng, int(words * 0.75 * jitter)))
        content.append(_prose(rng, int(words * 0.15 * jitter)))
    return messages, reasoning, content


def _server_ids(tokenizer, messages, reasoning, content) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    """(prompt ids, output ids) per sample as a faithful server returns them: the template's rendering of the
    request with its generation prompt, and the canonical tokens of what follows it up to <|im_end|>."""
    encode = tokenizer.backend_tokenizer.encode
    out = []
    for turns, thought, answer in zip(messages, reasoning, content, strict=True):
        prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*turns, {"role": "assistant", "content": answer, "reasoning_content": thought}], tokenize=False
        )
        generated = full[len(prompt) :]
        generated = generated[: generated.rindex("<|im_end|>") + len("<|im_end|>")]
        out.append(
            (encode(prompt, add_special_tokens=False).ids, encode(generated, add_special_tokens=False).ids)
        )
    return out


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", choices=("qwen3", "tiny"), default="qwen3")
    parser.add_argument(
        "--trainer", choices=[t.value for t in Trainer], default=Trainer.SPECFORGE_QWEN35.value
    )
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=1800, help="target tokens per sample")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--project-samples", type=int, default=914_000)
    parser.add_argument("--project-cores", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        build = build_qwen3_tokenizer if args.vocab == "qwen3" else build_tiny_tokenizer
        tokenizer = load_tokenizer(build(Path(tmp) / "tok"))
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    spec = MaskSpec(trainer=args.trainer, max_length=1 << 30)
    generated_turn = isinstance(spec.rules, GeneratedTurnTrainer)
    messages, reasoning, content = make_samples(args.samples, args.tokens)
    n = args.samples

    def render(part: slice):
        """(full texts, texts of the second encode or []) exactly as build_masks renders them."""
        if generated_turn:
            rendered = render_batch(tokenizer, messages[part], reasoning[part], content[part], spec)
            return rendered.full_texts, rendered.prompt_texts
        conversations = [
            generated_turn_conversation(m, r, c)
            for m, r, c in zip(messages[part], reasoning[part], content[part], strict=True)
        ]
        return render_conversations(tokenizer, conversations, spec.rules)[0], []

    full_texts, second_texts = render(slice(0, n))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    def clock() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()  # wall, and CPU of every thread of this process

    def baseline() -> tuple[int, float, float]:
        """(tokens, wall s, CPU s) of batch-encoding the rendered conversations."""
        (w0, c0), total = clock(), 0
        for part in _chunks(n, args.batch_size):
            total += sum(len(e.ids) for e in encode(full_texts[part], add_special_tokens=False))
        (w1, c1) = clock()
        return total, w1 - w0, c1 - c0

    def masks() -> tuple[float, float]:
        """(wall s, CPU s) of the whole mask build."""
        (w0, c0) = clock()
        for part in _chunks(n, args.batch_size):
            batch = build_masks(tokenizer, messages[part], reasoning[part], content[part], spec)
            assert all(m is None for m in batch.mismatch), "benchmark samples must be clean"
        (w1, c1) = clock()
        return w1 - w0, c1 - c0

    def render_only() -> float:
        c0 = time.process_time()
        for part in _chunks(n, args.batch_size):
            render(part)
        return time.process_time() - c0

    def second_encode() -> float:
        """CPU s of batch-encoding the prompts alone (the second encode the draftgen-* conventions need)."""
        c0 = time.process_time()
        for part in _chunks(n, args.batch_size):
            if second_texts:
                encode(second_texts[part], add_special_tokens=False)
        return time.process_time() - c0

    server = None if generated_turn else _server_ids(tokenizer, messages, reasoning, content)
    layout = None if generated_turn else ids_layout(tokenizer, spec.rules)

    def from_ids() -> tuple[float, float]:
        """(wall s, CPU s) of building every row from the server's ids, as validate does."""
        assert server is not None and layout is not None
        (w0, c0) = clock()
        for part in _chunks(n, args.batch_size):
            decoded = backend.decode_batch([o for _, o in server[part]], skip_special_tokens=False)
            for (prompt, output), text, r, c in zip(
                server[part], decoded, reasoning[part], content[part], strict=True
            ):
                assert ids_problem(prompt, output, layout, text, r, c) is None
                span_mask(join_turn(prompt, output, "stop", layout), layout, last_only=True, max_length=None)
        (w1, c1) = clock()
        return w1 - w0, c1 - c0

    rounds: list[tuple] = []
    for _ in range(args.rounds):  # interleaved, so load from other processes hits all alike
        tokens, base_wall, base_cpu = baseline()
        mask_wall, mask_cpu = masks()
        ids_wall, ids_cpu = from_ids() if server is not None else (float("nan"), float("nan"))
        rounds.append(
            (base_wall, base_cpu, mask_wall, mask_cpu, render_only(), second_encode(), ids_wall, ids_cpu)
        )
    base_wall, base_cpu, mask_wall, mask_cpu, render_cpu, prompt_cpu, ids_wall, ids_cpu = (
        statistics.median(r[i] for r in rounds) for i in range(8)
    )
    per_sample_tokens = tokens / n

    # Projection from CPU seconds (robust to other processes sharing this machine): the encodes are spread over
    # all cores; rendering and the rest of the per-sample work are serial.
    parallel_cpu = base_cpu + prompt_cpu
    serial_cpu = max(0.0, mask_cpu - parallel_cpu)
    scale = (args.project_samples / n) * (args.tokens / per_sample_tokens)
    projected = scale * (parallel_cpu / args.project_cores + serial_cpu)

    print(
        f"trainer {args.trainer}, tokenizer {args.vocab} ({len(tokenizer)} tokens), {n} samples, {per_sample_tokens:.0f} tokens/sample "
        f"({tokens:,} tokens), batch {args.batch_size}, {cores} cores here, median of {args.rounds} rounds"
    )
    print(
        f"baseline (batch encode of the rendered text): {n / base_wall:7.0f} samples/s "
        f"{tokens / base_wall:11,.0f} tokens/s   ({base_cpu / base_wall:.1f} cores busy)"
    )
    print(
        f"masks ({args.trainer}):{' ' * max(1, 36 - len(args.trainer))}{n / mask_wall:7.0f} samples/s "
        f"{tokens / mask_wall:11,.0f} tokens/s   ({mask_cpu / mask_wall:.1f} cores busy)"
    )
    print(
        f"ratio masks / baseline throughput: {base_wall / mask_wall:.2f} wall, {base_cpu / mask_cpu:.2f} CPU "
        "(goal >= 0.70)"
    )
    if server is not None:
        print(
            f"rows from the server's ids:{' ' * 12}{n / ids_wall:7.0f} samples/s {tokens / ids_wall:11,.0f} tokens/s   "
            f"ratio ids / masks: {mask_wall / ids_wall:.2f} wall, {mask_cpu / ids_cpu:.2f} CPU (goal >= 1.0)"
        )
    print(
        f"  CPU seconds: baseline encode {base_cpu:.2f}; masks {mask_cpu:.2f} = render {render_cpu:.2f} + "
        f"prompt encode {prompt_cpu:.2f} + full encode, spans and bookkeeping "
        f"{mask_cpu - render_cpu - prompt_cpu:.2f}"
    )
    print(
        f"projection: {args.project_samples:,} samples x {args.tokens} tokens on {args.project_cores} cores: "
        f"{projected / 60:.1f} min  (one core: {scale * mask_cpu / 3600:.1f} h)"
    )
    print(
        f"  assumption: the batch encodes ({parallel_cpu:.2f} CPU s here) spread perfectly over "
        f"{args.project_cores} cores (rayon over the batch); rendering and per-sample bookkeeping "
        f"({serial_cpu:.2f} CPU s here) stay on one core; cost linear in samples x tokens; per-core speed as "
        "measured on this machine"
    )


if __name__ == "__main__":
    main()

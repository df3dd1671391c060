"""Figure: prefix affinity — GPU-seconds per trained token with affinity ÷ without, on the simulator's prefix cache.

generate() runs each prompt set twice, each time on a fresh fleet of seven ``b200-mtp`` servers (their prefix caches
empty: docs/simulator.md, "Prefix cache"; ``--enable-cache-report``), once with prefix affinity (``affinity_hold_s``
at its default) and once without (0), in alternating order over ``--repeats`` rounds. The sets:

  * ``conversations``: three-question conversations, each user turn pasting a document of about
    ``--context-tokens`` tokens (``turns: all``: each turn's request carries the earlier ones);
  * ``plan``: a two-answer sampling plan (``[{name: two, answers: 2}]``) on prompts behind a pasted document of
    about ``--long-tokens`` tokens (figure 30's long set);
  * ``demo``: the bundled 2,000 prompts (``make demo``'s set);
  * ``slow``: figure 4's set-up, server 3 three times slower (4,000 synthetic prompts, ``max_tokens`` 1024, speed
    4, not streamed): fleet utilization, the simulators' produced tokens ÷ their summed capacity in the steady
    window, must stay >= 0.97.

Printed per set and arm: GPU-seconds per million trained tokens on a fleet kept full (each answered request's
completion tokens at the profile's full-batch rate plus its prefill of the prompt tokens the cache did not hold:
what the work costs, whatever this two-core machine's client could keep in flight), as generate's report states it
(the session's length × servers × the simulated clock it kept ÷ trained tokens, ``report.summary``: it counts the
batches a lagging client left short) and from the servers' own step ledger (busy time); the prompt tokens prefilled (not found in the
cache) and the share of prompt tokens served from cache (ground truth, and generate's stored ``turn_cached_tokens``);
the turns that found a cached prefix; each ratio on ÷ off measured in the same round. Requests are streamed (the
default: a later sample goes to its home once its first has streamed a token there); trained tokens are every
completion token (``train_max_length`` 0) on the long sets, each turn's up to 4096 − its prompt on the others.

``--scatter`` adds a control arm to each set: a prefix-blind placement (a conversation's next turn, and a prompt's
later sample, go to a server drawn at random, as a router that ignores prefixes sends them; draftgen's own
pull-based dispatcher keeps a next turn at home even without affinity, so "off" is not that). on ÷ scatter is what
keeping work where its prefix is saves.

``--smg`` runs the sets through SMG instead (one gateway URL, 448 in flight): ``cache_aware`` as shipped, against
``cache_aware`` with ``--routing-key-override``, where generate's requests carry a routing key per conversation.

    .venv/bin/python benchmarks/generate_affinity.py [--sets conversations,plan,demo,slow] [--speed 2]
        [--repeats 1] [--conversations 900] [--plan-prompts 2000] [--smg]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl
from generate_fleet_utilization import OTHER_SHAPES, fresh_prompts_taken, synthetic, utilization
from generate_tail_hedge import sim_clocks
from plan_n_vs_separate import document
from sim_generate import run_generate, sim_generate_config

from draftgen.generate import dispatch
from draftgen.generate.report import summary
from draftgen.generate.work import Home, Work
from draftgen.prompts.synthetic import BUNDLED_PROMPTS, synthetic_rows
from draftgen.serve.router import RouterProcess
from draftgen.sim import SimFleet
from draftgen.sim.profiles import get_profile
from draftgen.sim.tokenizer import SimTokenizer, default_tokenizer

PROFILE = "b200-mtp"
SERVERS = 7
CONCURRENCY = 64
SLOW_SERVER = 3
ARMS = {"on": 10.0, "off": 0.0}  # affinity_hold_s
# The generator's rows of other shapes (OTHER_SHAPES: tools, the long chats' ShareGPT fields) are left out of the long
# sets: each of those is one question (or three) behind its own pasted document.
SMG_ARMS = {"keyed": ("--routing-key-override",), "cache_aware": ()}
SCATTER = "scatter"  # the control arm's name (--scatter)


class ScatteredHomes:
    """The control arm's placement: work under way that has a prefix somewhere (a next turn, a later sample) is
    given a home drawn at random among all servers, as a prefix-blind router would place it (at home one time in
    seven). It waits in that lane as affinity's work does, so only the place differs from the "on" arm."""

    def __init__(self, urls: list[str], hold_s: float) -> None:
        self.hold_s = hold_s
        self._urls = urls
        self._draw = random.Random(0)
        self._sampled: set[str] = set()

    def home(self, work: Work) -> Home | None:
        prompt = work.conversation.prompt
        if work.prefer is not None:
            return Home(self._draw.choice(self._urls))
        if work.conversation.turn or work.attempts or prompt.prompt_id is None:
            return None
        if prompt.prompt_id not in self._sampled:  # its first sample: wherever a worker is free
            return None
        return Home(self._draw.choice(self._urls))

    def taken(self, work: Work, url: str) -> None:
        if work.conversation.prompt.prompt_id is not None:
            self._sampled.add(work.conversation.prompt.prompt_id)

    def can_host(self, url: str) -> bool:
        return True


@contextlib.contextmanager
def scattered(hold_s: float):
    """Generate runs in this process with ``ScatteredHomes`` as their placement policy."""
    original = dispatch.prefix_affinity
    dispatch.prefix_affinity = lambda config, servers, rates: ScatteredHomes([s.url for s in servers], hold_s)
    try:
        yield
    finally:
        dispatch.prefix_affinity = original


def conversations(path: Path, tokenizer: SimTokenizer, count: int, context_tokens: int) -> Path:
    """Three questions per conversation, each behind a pasted document of its own."""
    firsts = [r for r in synthetic_rows(count * 4, seed=48) if r["category"] not in OTHER_SHAPES][: count * 3]
    with open(path, "w") as out:
        for i in range(count):
            messages: list[dict[str, str]] = []
            for k in range(3):
                question = next(m["content"] for m in firsts[3 * i + k]["messages"] if m["role"] == "user")
                if k:
                    messages.append({"role": "assistant", "content": "a source answer, regenerated"})
                pasted = document(3 * i + k, tokenizer, context_tokens)
                messages.append({"role": "user", "content": f"{pasted}\n\n{question}"})
            out.write(json.dumps({"id": f"c{i:04d}", "messages": messages}) + "\n")
    return path


def long_prompts(path: Path, tokenizer: SimTokenizer, count: int, long_tokens: int) -> Path:
    """The bundled prompts (cycled), each last user turn behind a pasted document of its own."""
    rows = (json.loads(line) for line in BUNDLED_PROMPTS.read_text().splitlines())
    bundled = [row for row in rows if row["category"] not in OTHER_SHAPES]
    with open(path, "w") as out:
        for i in range(count):
            messages = [dict(m) for m in bundled[i % len(bundled)]["messages"]]
            last = max(k for k, m in enumerate(messages) if m["role"] == "user")
            messages[last]["content"] = (
                f"{document(i, tokenizer, long_tokens)}\n\n{messages[last]['content']}"
            )
            out.write(json.dumps({"id": f"l{i:05d}", "messages": messages}) + "\n")
    return path


def full_fleet_gpu_s(records: list[dict]) -> float:
    """GPU-seconds the answered requests cost on servers kept at their batch cap (as a production client keeps
    them): each request's completion tokens at the profile's full-batch decode rate, plus its prefill of the prompt
    tokens the cache did not hold (a prefill stalls its server's whole batch). Client lag on this two-core machine
    leaves batches short, which the step ledger counts and this does not."""
    profile = get_profile(PROFILE)
    rate = profile.tokens_per_second(min(CONCURRENCY, profile.max_running_requests))
    return sum(
        r["completion_tokens"] / rate + profile.prefill_seconds(r["prompt_tokens"] - r["cached_tokens"])
        for r in records
    )


def steady(records: list[dict], slots: int) -> list[dict]:
    """The requests past the first and before the last ``slots`` sent (the fleet's in-flight capacity): neither the
    first wave, sent while every worker was idle at once, nor the tail, where idle workers take whatever is left.
    A run of a million prompts is almost all of this."""
    ordered = sorted(records, key=lambda r: r["arrival"])
    return ordered[slots:-slots] if len(ordered) > 2 * slots else []


def stored_cache_share(out_dir: Path) -> float | None:
    """Prompt tokens the servers reported cached ÷ prompt tokens, over the stored turns that reported both."""
    turns = (
        pl.read_parquet(
            out_dir / "shards" / "*.parquet", columns=["turn_prompt_tokens", "turn_cached_tokens"]
        )
        .explode("turn_prompt_tokens", "turn_cached_tokens")
        .drop_nulls()
    )
    prompt = turns["turn_prompt_tokens"].sum()
    return turns["turn_cached_tokens"].sum() / prompt if prompt else None


def placement(out_dir: Path) -> dict[str, float | None]:
    """From the stored ``turn_server``: the share of later turns answered where the turn before was, and of
    prompts (with a sampling plan) whose samples' first turns were all answered on one server."""
    rows = pl.read_parquet(out_dir / "shards" / "*.parquet", columns=["prompt_id", "turn_server"])
    pairs = [
        (servers[k] == servers[k - 1]) for servers in rows["turn_server"] for k in range(1, len(servers))
    ]
    plans = rows.filter(pl.col("prompt_id").is_not_null())
    together = (
        plans.group_by("prompt_id").agg(pl.col("turn_server").list.first().n_unique() == 1)["turn_server"]
        if plans.height
        else None
    )
    return {
        "next_turns_at_home": sum(pairs) / len(pairs) if pairs else None,
        "samples_together": together.mean() if together is not None else None,
    }


def run_arm(
    args: argparse.Namespace,
    work: Path,
    set_name: str,
    prompts: Path,
    hold_s: float,
    smg_args: tuple[str, ...] | None = None,
    **changes: object,
) -> dict:
    """One generate run on a fresh fleet (through a fresh SMG with ``smg_args`` when given); its figures from the
    report, the step ledger and the ground truth."""
    slow = {SLOW_SERVER: ["slow=3"]} if set_name == "slow" else {}
    speed = float(changes.pop("speed", args.speed))  # type: ignore[arg-type]
    fleet = SimFleet(
        servers=SERVERS,
        profile=PROFILE,
        speed=speed,
        per_server_faults=slow,
        server_args=("--enable-cache-report",),
        tokenizer=args.tokenizer,
        work_dir=work / "sim",
    )
    with fleet, contextlib.ExitStack() as stack:
        servers, concurrency = fleet.urls, CONCURRENCY
        if smg_args is not None:
            router = RouterProcess(fleet.urls, policy="cache_aware", log_dir=work, extra_args=smg_args)
            servers, concurrency = [stack.enter_context(router).url], CONCURRENCY * SERVERS
        before = sim_clocks(fleet)
        config = sim_generate_config(
            fleet,
            prompts,
            work / "run",
            servers=servers,
            affinity_hold_s=hold_s,
            concurrency_per_server=concurrency,
            **changes,
        )
        with fresh_prompts_taken() as fresh:
            run_generate(config, progress=False)
        time.sleep(0.5)  # the last truth lines
        after = sim_clocks(fleet)
        records = [r for r in fleet.truth() if r.get("kind") == "chat" and r.get("outcome") == "ok"]
        chats = [r for r in fleet.truth() if r.get("kind") == "chat"]
        util = (
            utilization(fleet, records, CONCURRENCY, args.ramp, occupancy=chats, last_fresh=max(fresh))
            if set_name == "slow"
            else None
        )
    report = summary(work / "run").row(0, named=True)
    busy_s = sum(a["planned_s"] - b["planned_s"] for b, a in zip(before, after, strict=True)) * speed
    prompt_tokens = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    trained = report["trained_tokens"]
    gpu_s = report["gpu_s_per_m_trained"]
    if smg_args is not None:  # the report counts one server (the gateway): the GPUs are the workers behind it
        gpu_s *= SERVERS
    middle = steady(records, CONCURRENCY * SERVERS)
    middle_tokens = sum(r["completion_tokens"] for r in middle)
    return {
        "full_fleet_gpu_s_per_m_trained": round(full_fleet_gpu_s(records) / trained * 1e6, 1),
        # the same per completion token, over the steady requests only (what a long run is made of)
        "steady_gpu_s_per_m_completion": round(full_fleet_gpu_s(middle) / middle_tokens * 1e6, 1)
        if middle_tokens
        else None,
        "steady_cache_share": round(
            sum(r["cached_tokens"] for r in middle) / max(1, sum(r["prompt_tokens"] for r in middle)), 4
        ),
        "gpu_s_per_m_trained": gpu_s,
        "busy_s_per_m_trained": round(busy_s / trained * 1e6, 1),
        "trained_tokens": trained,
        "requests": len(records),
        "prefilled_tokens": prompt_tokens - cached,
        "cache_share": round(cached / prompt_tokens, 4),
        "stored_cache_share": stored_cache_share(work / "run"),
        "requests_cached": sum(r["cached_tokens"] > 0 for r in records),
        **placement(work / "run"),
        "clock_kept": report.get("clock_kept"),
        "utilization_steady": util["steady"] if util else None,
        "utilization_whole_run": util["whole_run"] if util else None,
        "prefill_share": round(util["prefill_share"], 4) if util else None,
        "slots_filled": round(util["slots_filled"], 4) if util else None,
        "utilization_accounted": round(util["steady_accounted"], 4) if util else None,
    }


def set_files(
    args: argparse.Namespace, tmp: Path, tokenizer: SimTokenizer
) -> dict[str, tuple[Path | str, dict]]:
    """Each set's prompts and the settings it changes (``speed``: the fleet's, else ``--speed``)."""
    return {
        "conversations": (
            conversations(tmp / "conversations.jsonl", tokenizer, args.conversations, args.context_tokens),
            {"turns": "all", "train_max_length": 0},
        ),
        "plan": (
            long_prompts(tmp / "long.jsonl", tokenizer, args.plan_prompts, args.long_tokens),
            {"sampling_plan": [{"name": "two", "answers": 2}], "train_max_length": 0},
        ),
        "demo": ("synthetic", {}),
        # figure 4's set-up: 4,000 synthetic prompts, max_tokens 1024, speed 4, not streamed (the client's two
        # cores would otherwise be measured at that rate)
        "slow": (
            synthetic(tmp / "fig4.jsonl", args.slow_prompts, args.slow_shapes),
            {"max_tokens": 1024, "stream": False, "speed": 4.0},
        ),
    }


def ratios(row: dict, against: dict) -> dict[str, float]:
    """``row`` ÷ ``against`` for each figure both have."""
    return {
        key: round(row[key] / against[key], 4)
        for key in (
            "full_fleet_gpu_s_per_m_trained",
            "steady_gpu_s_per_m_completion",
            "gpu_s_per_m_trained",
            "busy_s_per_m_trained",
            "prefilled_tokens",
        )
        if row[key] and against[key]
    }


def print_row(set_name: str, arm: str, row: dict) -> None:
    util = (
        f"; utilization {row['utilization_steady']:.3f} steady (prefill {row['prefill_share']:.1%} of the time; "
        f"slots filled {row['slots_filled']:.3f}; {row['utilization_accounted']:.3f} with the prefill and the mix's "
        "acceptance allowed for)"
        if row["utilization_steady"]
        else ""
    )
    if row["steady_gpu_s_per_m_completion"] is not None:
        util += (
            f"; steady requests {row['steady_gpu_s_per_m_completion']:,.0f} GPU-s/M completion tokens, cache "
            f"share {row['steady_cache_share']:.3f}"
        )
    for key, label in (
        ("next_turns_at_home", "next turns at home"),
        ("samples_together", "samples together"),
    ):
        if row[key] is not None:
            util += f"; {label} {row[key]:.3f}"
    print(
        f"  {set_name:13} {arm:11} {row['full_fleet_gpu_s_per_m_trained']:8,.0f} GPU-s/M trained (full fleet), "
        f"{row['gpu_s_per_m_trained']:8,.0f} (report), "
        f"{row['busy_s_per_m_trained']:8,.0f} busy; prefilled {row['prefilled_tokens']:11,} tokens, "
        f"cache share {row['cache_share']:.3f} (stored {row['stored_cache_share'] or 0:.3f}), "
        f"{row['requests_cached']:,}/{row['requests']:,} requests cached; clock kept {row['clock_kept']}{util}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="conversations,plan,demo,slow")
    parser.add_argument("--speed", type=float, default=2.0, help="simulated clock speed-up")
    parser.add_argument("--repeats", type=int, default=1, help="rounds, the arms' order alternating")
    parser.add_argument("--conversations", type=int, default=900)
    parser.add_argument("--context-tokens", type=int, default=2500, help="pasted document per user turn")
    parser.add_argument("--plan-prompts", type=int, default=2000)
    parser.add_argument("--long-tokens", type=int, default=7750, help="pasted document per plan prompt")
    parser.add_argument(
        "--ramp", type=float, default=10.0, help="slow: seconds left out of the steady window"
    )
    parser.add_argument("--slow-prompts", type=int, default=4000, help="the slow set's (figure 4's) prompts")
    parser.add_argument(
        "--slow-shapes",
        choices=("all", "plain"),
        default="all",
        help="the slow set: the generator's every shape, or without its long chats and agentic rows",
    )
    parser.add_argument("--smg", action="store_true", help="through SMG: cache_aware with and without keys")
    parser.add_argument(
        "--scatter", action="store_true", help="a control arm: next turns and later samples placed at random"
    )
    args = parser.parse_args()
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="draftgen-bench-") as tmp_name:
        tmp = Path(tmp_name)
        args.tokenizer = default_tokenizer(tmp / "tokenizer")
        tokenizer = SimTokenizer(args.tokenizer)
        files = set_files(args, tmp, tokenizer)
        arms = list(SMG_ARMS if args.smg else ARMS) + ([SCATTER] if args.scatter and not args.smg else [])
        print(
            f"{SERVERS} x {PROFILE} at speed {args.speed:g}, {CONCURRENCY} in flight per server, a fresh fleet per "
            f"run; {'through SMG' if args.smg else 'affinity_hold_s ' + ' vs '.join(f'{v:g}' for v in ARMS.values())}",
            flush=True,
        )
        for round_ in range(args.repeats):
            for set_name in args.sets.split(","):
                prompts, changes = files[set_name]
                order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
                rows = {}
                for arm in order:
                    work = tmp / f"{set_name}-{round_}-{arm}"
                    if args.smg:
                        hold, smg_args = ARMS["on"], SMG_ARMS[arm]
                    else:
                        hold, smg_args = ARMS.get(arm, ARMS["on"]), None
                    with scattered(hold) if arm == SCATTER else contextlib.nullcontext():
                        rows[arm] = run_arm(
                            args, work, set_name, Path(prompts), hold, smg_args, **dict(changes)
                        )
                    print_row(set_name, arm, rows[arm])
                first, second = arms[:2]
                ratio = ratios(rows[first], rows[second])
                print(f"  {set_name:13} {first} / {second}: {ratio}", flush=True)
                result = {"set": set_name, "round": round_, **{a: rows[a] for a in arms}, "ratio": ratio}
                if SCATTER in rows:
                    result["ratio_scatter"] = ratios(rows[first], rows[SCATTER])
                    print(f"  {set_name:13} {first} / {SCATTER}: {result['ratio_scatter']}", flush=True)
                results.append(result)
    for set_name in args.sets.split(","):
        spans = []
        for key, label in (
            ("full_fleet_gpu_s_per_m_trained", "full fleet"),
            ("steady_gpu_s_per_m_completion", "steady requests, full fleet"),
            ("gpu_s_per_m_trained", "report"),
            ("busy_s_per_m_trained", "busy"),
        ):
            for ratio_key, against in (("ratio", arms[1]), ("ratio_scatter", SCATTER)):
                values = [
                    r[ratio_key][key] for r in results if r["set"] == set_name and key in r.get(ratio_key, {})
                ]
                if values:
                    spans.append(
                        f"{label} ÷ {against} {min(values):.3f}–{max(values):.3f} "
                        f"(median {statistics.median(values):.3f})"
                    )
        print(f"{set_name}: GPU-s per trained token, {arms[0]}: " + "; ".join(spans))
    print(json.dumps(results))


if __name__ == "__main__":
    main()

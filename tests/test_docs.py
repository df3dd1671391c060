"""The docs as a reference (issue 48): every link resolves, lines stay readable, the whole stays under its size, no
lab-notebook conditions outside docs/figures.md, and docs/troubleshooting.md covers what draftgen prints.

What "covers" means here, precisely (each a test below):
- every exit code of ``draftgen.exit_codes.ExitCode`` has a row in the page's exit-code table;
- every exception class defined in ``src/draftgen`` is named on the page, or is listed in ``NOT_PRINTED`` with why;
- every check of generate's preflight that can fail (a ``Check("name", ...)`` whose status is not a literal ok, info
  or warn) has a heading holding its name in backticks;
- every defect of the garbage guard has a heading holding the words its halt message prints (``are empty answer``);
- every flag validate can raise (``draftgen.validate.config.FLAGS``) is named in the page;
- every ``match=`` string a test under tests*/ asserts on an error is found on the page (as the regex pytest reads it,
  in the page's text with backticks dropped), or is mapped in ``SAID_AS`` to the words the page holds for it, or is
  listed in ``NOT_PRINTED`` with why. A new ``match=`` in a test fails here until it is placed.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import pytest

from draftgen.exit_codes import ExitCode
from draftgen.generate.guard import DEFECTS
from draftgen.validate.config import FLAGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
TROUBLESHOOTING = DOCS / "troubleshooting.md"
FIGURES = DOCS / "figures.md"
MAX_LINE = 120
MAX_DOCS_CHARS = 200_000
LAB_NOTES = re.compile(r"load [0-9]|retired")
FENCE = re.compile(r"^\s*(```|~~~)")
GENERATED = re.compile(r"^<!-- (end )?([a-z ]+)(:[^>]*)? -->$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


# ----- reading a page ------------------------------------------------------------------------------------------------
def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside code fences and generated blocks."""
    lines, fenced, generated = [], False, None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        marker = GENERATED.match(line.strip())
        if marker and not fenced:
            generated = None if marker.group(1) else marker.group(2)
            continue
        if not fenced and generated is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, _, - and spaces kept), each
    space a hyphen."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: dict[str, int] = {}
    names = set()
    for _, line in prose_lines(path.read_text()):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(2))
        count = found.get(base, 0)
        found[base] = count + 1
        names.add(base if count == 0 else f"{base}-{count}")
    return names


def headings(path: Path) -> list[str]:
    return [
        line.lstrip("#").strip() for _, line in prose_lines(path.read_text()) if re.match(r"^#{1,6}\s", line)
    ]


def flat(text: str) -> str:
    """A page's text as one line, backticks and escapes dropped: what a message search reads."""
    return re.sub(r"\s+", " ", text.replace("`", "").replace("\\|", "|"))


# ----- links, lines, size, conditions -----------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for number, line in prose_lines(page.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}:{number}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}:{number}: {target}: no heading with that anchor in {file.name}")
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_line_over_120_characters_outside_tables_and_code(page):
    long = [
        f"{page.name}:{number}: {len(line)} characters"
        for number, line in prose_lines(page.read_text())
        if len(line) > MAX_LINE and not line.lstrip().startswith("|")
    ]
    assert long == [], "\n".join(long)


def test_the_docs_stay_under_200k_characters():
    sizes = {p.name: len(p.read_text()) for p in sorted(DOCS.glob("*.md"))}
    total = sum(sizes.values())
    listed = ", ".join(f"{name} {size:,}" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]))
    assert total < MAX_DOCS_CHARS, f"docs/*.md holds {total:,} characters: {listed}"


@pytest.mark.parametrize("page", [p for p in PAGES if p != FIGURES], ids=lambda p: p.name)
def test_no_machine_loads_or_retired_components_outside_figures(page):
    found = [
        f"{page.name}:{number}: {line.strip()[:100]}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if LAB_NOTES.search(line)
    ]
    assert found == [], "\n".join(found)


# ----- troubleshooting.md covers what draftgen prints ------------------------------------------------------------
# A test's match= string → the words troubleshooting.md holds for it, where the string itself holds a number or a
# name of the test's own making.
SAID_AS = {
    "4 of 47 samples degenerate": "samples degenerate",
    r"FAIL: 15 of 21 samples degenerate \(71\.4%": "samples degenerate",
    "foreign_assistant_turn 4": "foreign_assistant_turn",
    r"no-tokenizer does not exist": "does not exist",
    r"nowhere does not exist.*out_dir": "does not exist",
    r"nowhere.*does not exist.*draftgen tokenizer": "draftgen tokenizer --out",
    r"noshards has no shards/ folder": "has no shards/ folder",
    r"part-000002\.parquet is unreadable": "is unreadable",
    r"part-00000\.parquet: messages is String": "shard NAME: COLUMN is TYPE",
    r"part-00001\.parquet lacks column\(s\) reasoning_content, finish_reason": "lacks column(s)",
    r"part-00002\.parquet cannot be read.*resume generate": "cannot be read",
    r"row 'broken' \(.*part-00000.parquet, row 4\)": "names the row, folder, shard and row number",
    r"unknown trainer 'eagle'.*specforge-qwen3\.5": "unknown trainer",
    r"does not fit the trainer specforge-qwen3\.5: a different": "does not fit the trainer",
    r"entropy_top_k \(5\) needs stream: true": "parameter problems:",
    r"EAGLE3 3/1/6.*SGLang changes num_draft_tokens": "candidates SGLang would not run as given",
    r"--speculative-num-steps=2 is not in the adaptive config candidate_steps": "not in the adaptive config",
    "this process: a plan from an earlier preflight": "a plan from an earlier preflight",
    r"no space left .* while writing export": "no space left",
    r"while writing train\.jsonl": "no space left",
    r"while writing run\.ipynb": "no space left",
    "DFLASH takes block_sizes": "candidates SGLang would not run as given",
    "is a dflash drafter": "candidates SGLang would not run as given",
    "unknown drafter field": "candidates SGLang would not run as given",
    "requires setting --speculative-draft-model-path": "candidates SGLang would not run as given",
    r"no sim_drafter\.json there": "candidates SGLang would not run as given",
    "every request failed": "every request failed",
    "backoff_max_s": "parameter problems:",
    "entropy_top_k": "parameter problems:",
    "rounds": "parameter problems:",
    "export_prompts": "export_prompts",
    "each seed once": "parameter problems:",
    "length_factor, accept_length or both": "parameter problems:",
    "not in sampling_plan: typo": "parameter problems:",
    "is not one of verdict_levels": "parameter problems:",
    "without drafters": "parameter problems:",
    "spec_candidates": "parameter problems:",
    "ngram_draft_tokens": "parameter problems:",
    "settings": "parameter problems:",
    "guard_min_results": "parameter problems:",
    "give only trainer": "parameter problems:",
}
# A test's match= string, or an exception class, that draftgen never prints to its user as such → why.
NOT_PRINTED = {
    # exception classes
    "BadRequest": "the simulator's HTTP 400 body to its client (docs/simulator.md), never raised to a user",
    "StartupError": "the simulator refusing its own flags at start (docs/simulator.md), as SGLang does",
    "DrafterError": "the simulator's drafter profile; tune refuses it first (candidates SGLang would not run)",
    "TokenizerFolderError": "the simulator's --tokenizer folder (docs/simulator.md)",
    "MetricsParseError": "a /metrics body that is not Prometheus text: the benchmark reports the source as missing",
    "RequestError": "one request's failure: retried, then a failed.parquet row (generate) or a failed request",
    "StopRun": "the base of GuardTripped and AllServersDown",
    "RunFolderError": "the base of the run-folder messages, each listed by its words",
    "FleetError": "draftgen.sim.SimFleet in Python and the tests; draftgen serve --engine sim reports a start failure",
    "TokenIdsError": "stored token ids that do not fit their turns: validate flags the row ids_unusable",
    "ToolFormatError": "a prompt row's tools: the row goes to rejected.parquet with this reason",
    "Problems": "the params module's internal list, raised as ParameterError",
    "TokenizerBuildError": "draftgen tokenizer's own one-line errors (--force, an empty folder), said in --help",
    "out of step": "the loop's volume-matched arm pairing rows the loop itself paired: an invariant, not an input",
    "Refused": "the base of every refusal: exit code 3, listed by each subclass",
    # match= strings of unit tests on internals, a display helper or the simulator
    "KDA": "the SGLang tier's stand-in kernels",
    "bit-packed": "the SGLang tier's stand-in kernels",
    "decode_attention_cpu: scaled": "the SGLang tier's stand-in kernels",
    "extra_buffer requires platform support for Mamba cache state": "SGLang's own message on the CPU tier",
    "extra_buffer requires platform support": "SGLang's own message on the CPU tier",
    "head_first": "the SGLang tier's stand-in kernels",
    "unexpected": "the SGLang tier's stand-in kernels",
    r"sgl_kernel\.rotate_input_ids_cpu is not provided": "the SGLang tier's stand-in kernels",
    r"sgl_kernel\.speculative\.segment_packbits": "the SGLang tier's stand-in kernels",
    "b200-mtp": "the simulator's profile names (docs/simulator.md)",
    "need --speculative-algorithm": "the simulator's flags (docs/simulator.md)",
    "no speculative cost model": "the simulator's flags (docs/simulator.md)",
    "out of range": "the simulator's flags (docs/simulator.md)",
    "maximum context length": "the simulator's HTTP 400, which generate stores in failed.parquet",
    "positive": "a clock factor in a unit test",
    "cannot hold '='": "notebook_params' rendering of a parameters cell (a developer's tool)",
    "help": "notebook_params' rendering of a parameters cell (a developer's tool)",
    "notebook=": "notebook_params' rendering of a parameters cell (a developer's tool)",
    "required": "notebook_params' rendering of a parameters cell (a developer's tool)",
    r"repeated \['a'\], missing \['b'\]": "notebook_params' rendering of a parameters cell (a developer's tool)",
    "has no cell section 'nope'": "param_tables, a developer's tool",
    "column 'x': kind 'money'": "a display helper's argument check",
    "no column 'nope'": "a display helper's argument check",
    "verdict 'OK'": "a display helper's argument check",
    "no-such-token": "a unit test's tokenizer helper",
    "not Prometheus text": "MetricsParseError (above)",
    "error in stream": "one request's failure (RequestError, above)",
    "min_repeats": "LoopRule's own check, a constant of the code",
    "kinds must be some of": "draftgen prompts' generator, argparse lists the choices",
    "state must be one of": "progress_file.set_state's argument check, for code that stops a run",
    "disk gone": "a unit test's simulated OSError on a shard's rename",
    "finished twice": "the store's internal exactly-once assertion",
    "lacks wall_time_s": "a unit test of estimate.json's reader with a hand-made file",
    "another config than preflight checked": "an internal assertion: a plan run with another config",
    r"manifest\.json": "a unit test of the run folder's publishing order",
    r"notes\.txt": "a unit test of the run folder's publishing order",
    r"results\.parquet": "a unit test of the run folder's publishing order",
    "save_to": "a report function's argument check",
    "conversation 0 does not end with the generated assistant turn": "a unit test of the mask builder's input",
    "mask_convention value: trainer draftgen-think-in-prompt": "a unit test of the old name's mapping",
    "after its last turn": "a unit test of turn assembly with hand-made turns",
    "before its last turn": "a unit test of turn assembly with hand-made turns",
    "turns": "a unit test of turn assembly with hand-made turns",
    "too small": "draftgen tokenizer --vocab-size below 300",
    "not a folder": "the tokenizer path is a file (does not exist, above)",
    "no chat template": "the tokenizer folder has no chat template (above)",
    "the steps are": "no step named (above)",
    "no step named": "no step named (above)",
    "no step named 'genrate'; the steps are generate, benchmark": "no step named (above)",
    "disagree on turns": "the folders disagree (above)",
}
MATCH = re.compile(r"""match=(r?)("([^"\n]{3,})"|'([^'\n]{3,})')""")


def asserted_messages() -> dict[str, list[str]]:
    """Every literal ``match=`` string of the test tiers → the files asserting it."""
    found: dict[str, list[str]] = {}
    for folder in ("tests", "tests_real", "tests_sglang", "tests_browser", "tests_model"):
        for path in sorted((ROOT / folder).glob("**/*.py")):
            if path.name == Path(__file__).name:
                continue
            for match in MATCH.finditer(path.read_text()):
                text = match.group(3) if match.group(3) is not None else match.group(4)
                found.setdefault(text, []).append(path.relative_to(ROOT).as_posix())
    return found


def exception_classes() -> dict[str, str]:
    """Every exception class defined in src/draftgen → its module file."""
    bases: dict[str, tuple[list[str], str]] = {}
    for path in (ROOT / "src" / "draftgen").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = ([ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases], str(path))
    known = {"Exception", "ValueError", "RuntimeError", "OSError", "KeyboardInterrupt"}
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for name, (parents, path) in bases.items():
            if name not in found and any(p in known or p in found for p in parents):
                found[name] = path
                grew = True
    return found


def failing_checks() -> set[str]:
    """The names of generate's preflight checks that can fail: ``Check("name", target, status, ...)`` whose status
    is not a literal ok, info or warn."""
    names = set()
    for path in (ROOT / "src" / "draftgen" / "generate").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "Check" and len(node.args) >= 3):
                continue
            name, status = node.args[0], node.args[2]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue  # an f-string name (the audit's rows): never fails
            if isinstance(status, ast.Constant) and status.value in ("ok", "info", "warn"):
                continue
            names.add(name.value)
    return names


@pytest.fixture(scope="module")
def page() -> str:
    return TROUBLESHOOTING.read_text()


def test_every_exit_code_has_a_row(page):
    rows = {m.group(1) for m in re.finditer(r"^\| (\d+) \|", page, re.M)}
    missing = [code.value for code in ExitCode if str(code.value) not in rows]
    assert missing == [], f"troubleshooting.md's exit-code table lacks {missing}"


def test_every_exception_class_is_named_or_said_not_printed(page):
    classes = exception_classes()
    assert {"PreflightError", "GuardTripped", "ValidationGateError", "ServeRefused"} <= set(classes)
    missing = sorted(c for c in classes if f"`{c}`" not in page and c not in NOT_PRINTED)
    assert missing == [], (
        f"name these in troubleshooting.md, or say in NOT_PRINTED why they are not: {missing}"
    )


def test_every_preflight_check_that_can_fail_has_a_heading(page):
    names = failing_checks()
    assert {"batch cap", "canary", "tool canary", "model", "out_dir", "disk space"} <= names
    titles = headings(TROUBLESHOOTING)
    missing = sorted(n for n in names if not any(f"`{n}`" in t for t in titles))
    assert missing == [], f"troubleshooting.md has no heading for the preflight checks {missing}"


def test_every_guard_halt_has_a_heading(page):
    titles = " ".join(headings(TROUBLESHOOTING))
    said = {d: "cut by max_tokens" if d == "truncated" else d.replace("_", " ") for d in DEFECTS}
    missing = sorted(d for d, words in said.items() if f"are {words}" not in titles)
    assert missing == [], f"troubleshooting.md has no heading for the guard's halts on {missing}"


def test_every_validate_flag_is_named(page):
    missing = sorted(flag for flag in FLAGS if f"`{flag}`" not in page)
    assert missing == [], f"troubleshooting.md does not name validate's flags {missing}"


def test_every_message_a_test_asserts_is_on_the_page_or_placed(page):
    text = flat(page)
    unplaced = []
    for message, where in sorted(asserted_messages().items()):
        if message in NOT_PRINTED:
            continue
        if message in SAID_AS:
            if flat(SAID_AS[message]) not in text:
                unplaced.append(f"{message!r} ({where[0]}): the page lacks {SAID_AS[message]!r}")
        elif not re.search(message, text):
            unplaced.append(f"{message!r} ({where[0]})")
    assert unplaced == [], "on troubleshooting.md, or in SAID_AS / NOT_PRINTED:\n" + "\n".join(unplaced)


def test_the_placements_are_not_stale():
    messages, classes = asserted_messages(), exception_classes()
    stale = sorted(k for k in [*SAID_AS, *NOT_PRINTED] if k not in messages and k not in classes)
    assert stale == [], f"no test asserts these and no class is named so any more: {stale}"


def test_the_link_checker_reads_anchors_as_github_does():
    assert slug("`progress.json` and `progress-history.jsonl`") == "progressjson-and-progress-historyjsonl"
    assert slug("Multi-turn prompts (`turns`)") == "multi-turn-prompts-turns"
    assert slug("### `serves X, not 'Y'`".lstrip("# ")) == "serves-x-not-y"
    assert slug("Generation output: the run folder") == "generation-output-the-run-folder"

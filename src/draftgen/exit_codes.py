"""draftgen's exit codes: one table, by cause, for every command (``draftgen --help``, docs/design.md).

A script can tell what to do next from the code alone: 0 go on; 1 look at the data or the run (the work ran and
came out wrong); 2 fix the command line; 3 fix the servers, the environment or the inputs and run the same command
again (nothing was started); 4 wait (the run is still going); 5 look at the process (alive but silent).
Standard library only: ``draftgen status`` imports it and answers in a fraction of a second.
"""

from __future__ import annotations

import enum
import textwrap


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    REFUSED = 3
    RUNNING = 4
    NOT_RESPONDING = 5
    INTERRUPTED = 130


MEANINGS = {
    ExitCode.OK: "done: the command did its work (status: the run finished)",
    ExitCode.FAILED: "the work ran and came out wrong: a gate failed, the guard halted, a step raised, every "
    "server died, the audit found something to fix (status: the run stopped early, or its process is gone)",
    ExitCode.USAGE: "the command line or a parameter is wrong (argparse's own code too), or the run name is taken; "
    "nothing was started",
    ExitCode.REFUSED: "a check before any work refused: servers unreachable or not serving the model, a port busy, "
    "an engine not installed, malformed prompt rows, the run folder in use; nothing was sent, and the run "
    "name stays free",
    ExitCode.RUNNING: "status: the run is still going (its heartbeat is fresh)",
    ExitCode.NOT_RESPONDING: "status: the run's process is alive but its heartbeat is stale (hung or stopped)",
    ExitCode.INTERRUPTED: "stopped by Ctrl-C",
}


class Refused(Exception):
    """A check made before any work found the servers, the environment, the inputs or the run folder unfit: nothing
    was started or sent (exit code REFUSED). Each such check raises a subclass of this."""


def refusal_names() -> frozenset[str]:
    """The class names of every refusal loaded in this process: how a refusal raised in a notebook's kernel, which
    reaches ``draftgen run`` as a class name only, is told from a failure."""
    found, todo = set(), [Refused]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(found)


def help_table() -> str:
    """The table for ``draftgen --help``'s epilog."""
    lines = ["exit codes:"]
    for code in ExitCode:
        lines += textwrap.wrap(
            MEANINGS[code], 100, initial_indent=f"  {code.value:>3}  ", subsequent_indent=" " * 7
        )
    return (
        "\n".join(lines) + "\n\n--debug (or DRAFTGEN_DEBUG=1) shows the traceback behind an error's one line."
    )


def markdown_table(spec: str = "") -> str:
    """The same table for docs/design.md (rendered by ``python -m draftgen.param_tables --write``)."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {code.value} | {MEANINGS[code].replace('|', '/')} |" for code in ExitCode]
    return "\n".join(rows) + "\n"

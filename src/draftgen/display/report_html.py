"""An executed notebook → the report a person reads (report.html): the headline first, no progress streams.

``draftgen run`` executes the notebook as it is (JupyterLab shows the same cells the same way), then, for the
HTML only:

- the outputs of the cell tagged ``headline`` go first, above the notebook's title: the answer before the method;
- a stream's carriage returns are applied as a terminal applies them (a progress bar redrawn 70 times keeps its
  final line);
- a stream longer than ``LOG_KEEP`` lines shows its last lines and how many came before, the rest folded.

The executed notebook keeps every output as it was; only report.html is shaped.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from draftgen.display.headline import HEADLINE_TAG
from draftgen.display.notes import folded_log_html

LOG_KEEP = 12  # a stream's last lines shown in the report; earlier ones are folded
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def final_text(stream: str) -> str:
    """What a terminal shows after ``stream``: each line keeps what followed its last carriage return
    (``"a 10%\\ra 50%\\ra 100%\\n"`` → ``"a 100%\\n"``), ANSI cursor codes removed."""
    stream = ANSI.sub("", stream.replace("\r\n", "\n"))
    lines = []
    for line in stream.split("\n"):
        kept = next((part for part in reversed(line.split("\r")) if part.strip()), "")
        lines.append(kept)
    return "\n".join(lines)


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def headline_outputs(nb: dict) -> list[dict]:
    """The outputs of the cells tagged ``headline`` (in order), the block the report opens with."""
    return [
        output
        for cell in nb.get("cells", [])
        if cell.get("cell_type") == "code" and HEADLINE_TAG in _tags(cell)
        for output in cell.get("outputs", [])
        if output.get("output_type") in ("display_data", "execute_result")
    ]


def headline_text(nb: dict) -> str | None:
    """The headline block as text (its ``text/plain``), for ``draftgen run`` to print; None: no headline ran."""
    texts = []
    for output in headline_outputs(nb):
        text = output.get("data", {}).get("text/plain")
        if text:
            texts.append("".join(text) if isinstance(text, list) else str(text))
    return "\n".join(texts) if texts else None


def _merge_streams(outputs: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == output.get("name")
        ):
            last["text"] = _joined(last["text"]) + _joined(output["text"])
        else:
            merged.append(copy.deepcopy(output))
    return merged


def _joined(text: Any) -> str:
    return "".join(text) if isinstance(text, list) else str(text)


def shape_outputs(outputs: list[dict], keep: int = LOG_KEEP) -> list[dict]:
    """A cell's outputs for the report: streams merged, carriage returns applied, long ones folded."""
    shaped = []
    for output in _merge_streams(outputs):
        if output.get("output_type") != "stream":
            shaped.append(output)
            continue
        text = final_text(_joined(output["text"]))
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            continue
        if len(lines) <= keep:
            shaped.append({**output, "text": "\n".join(lines) + "\n"})
            continue
        shaped.append(
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {
                    "text/html": folded_log_html(lines, keep, "output"),
                    "text/plain": "\n".join(lines[-keep:]),
                },
            }
        )
    return shaped


def shape_notebook(nb: dict, keep: int = LOG_KEEP) -> dict:
    """The notebook report.html is rendered from: the headline's outputs in a cell of their own at the top
    (and not again where the cell stood), every cell's streams shaped."""
    shaped = copy.deepcopy(nb)
    cells = shaped.get("cells", [])
    headline = headline_outputs(shaped)
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        if HEADLINE_TAG in _tags(cell):
            cell["outputs"] = [o for o in cell.get("outputs", []) if o not in headline]
        cell["outputs"] = shape_outputs(cell.get("outputs", []), keep)
    if headline:
        top = {
            "cell_type": "code",
            "execution_count": None,
            "id": "draftgen-headline",
            "metadata": {"tags": [HEADLINE_TAG]},
            "outputs": copy.deepcopy(headline),
            "source": "",
        }
        shaped["cells"] = [top, *cells]
    return shaped


def write_report(executed: Path, html_path: Path) -> None:
    """report.html from the executed notebook: shaped (above), code hidden, prompts hidden."""
    import nbformat
    from nbconvert import HTMLExporter

    from draftgen.rundir import write_text

    nb = nbformat.read(str(executed), as_version=4)
    shaped = nbformat.from_dict(shape_notebook(nb))
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(shaped)
    write_text(html_path, body)

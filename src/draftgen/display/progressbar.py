"""tqdm.auto without its warning: a widget bar where ipywidgets exists, a text bar (notebook or terminal) otherwise.

Text bars are the default on purpose: papermill stores a widget as an opaque view in the executed notebook and
the HTML report, where a text bar stays readable. Inside a Jupyter kernel the text bar goes to stdout: JupyterLab
paints stderr output red, and a progress bar is not an error.
"""

import sys
import warnings
from typing import TextIO

with warnings.catch_warnings():  # without ipywidgets tqdm.auto falls back to text and warns once
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm


def bar_stream() -> TextIO:
    """stdout in a Jupyter kernel (its own output stream), stderr in a terminal."""
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is not None and isinstance(sys.stdout, iostream.OutStream):
        return sys.stdout
    return sys.stderr


__all__ = ["bar_stream", "tqdm"]

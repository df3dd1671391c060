"""tqdm.auto without its warning: a widget bar where ipywidgets exists, a text bar (notebook or terminal) otherwise.

Text bars are the default on purpose: papermill stores a widget as an opaque view in the executed notebook and
the HTML report, where a text bar stays readable.
"""

import warnings

with warnings.catch_warnings():  # without ipywidgets tqdm.auto falls back to text and warns once
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

__all__ = ["tqdm"]

"""Watching a generate run from outside it: the progress file format (``progress_file``), the verdict and table
``draftgen status`` prints (``status``), and monitor.ipynb's reads and plots (``monitor``).

``progress_file`` and ``status`` use the standard library only, so ``draftgen status`` starts in well under a
second; ``monitor`` reads shards with polars.
"""

"""The run folder's one owner: its layout, the one atomic write, the lease, and a full disk as one error.

- ``layout``: every file and folder name draftgen writes in a run folder, and the globs readers find them by;
- ``write``: ``replace_file`` and its helpers, the only way a whole file is written (temporary name, fsync,
  rename, fsync of the folder), the in-place fallback for a full disk, and the clean-up of leftovers;
- ``publish``: ``publish_folder``, the only way a whole folder is published (staged, fsynced, swapped in so that
  the old or the new one is always whole);
- ``notebook_io``: papermill's notebook writes through ``replace_file`` (the executed notebook ``draftgen run`` keeps);
- ``lease``: ``RunFolderLease``, the exclusive hold on a folder that generate's preflight takes and its run keeps,
  and that every step takes to clear its folder of interrupted writes when it opens it;
- ``run_folder``: ``open_run`` and ``finish_run``, how every step's ``run(config)`` opens its folder (a finished
  run refused, leftovers cleared, parameters.yaml) and marks it finished (``.complete``);
- ``disk``: ``DiskFull`` (what the write raises on ENOSPC/EDQUOT), ``is_disk_full``, ``free_bytes``.

docs/design.md, "Data contracts", describes the files.
"""

from draftgen.rundir.disk import DiskFull, free_bytes, is_disk_full
from draftgen.rundir.lease import RunFolderBusy, RunFolderError, RunFolderLease, clear_leftovers
from draftgen.rundir.publish import publish_folder
from draftgen.rundir.run_folder import finish_run, is_finished, open_run
from draftgen.rundir.write import (
    overwrite_in_place,
    remove_leftovers,
    replace_file,
    temporary_path,
    write_bytes,
    write_json,
    write_parquet,
    write_text,
)

__all__ = [
    "DiskFull",
    "RunFolderBusy",
    "RunFolderError",
    "RunFolderLease",
    "clear_leftovers",
    "finish_run",
    "free_bytes",
    "is_disk_full",
    "is_finished",
    "open_run",
    "overwrite_in_place",
    "publish_folder",
    "remove_leftovers",
    "replace_file",
    "temporary_path",
    "write_bytes",
    "write_json",
    "write_parquet",
    "write_text",
]

"""draftgen: regenerate drafter training data with the target model on a fleet of SGLang servers."""

import sys

__version__ = "0.1.0"

# jsonschema (under nbformat, so papermill and nbconvert) checks the "iri" string format with rfc3987-syntax when
# that is installed (jupyter-events pulls it in), and importing it builds some forty grammars: 2-3 s of CPU in every
# process that reads or writes a notebook (`draftgen run` twice: running it, then its report), for a format no
# notebook schema uses. Marked absent, jsonschema skips that one format check (docs/design.md).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

"""Compare two runs' traces: which proof phases, layer kinds or spans got slower.

``proofscope diff BASE CANDIDATE`` (:mod:`otel_proofscope.cli.diff_cmd`) is the front;
the work is split by job, pure modules first:

- :mod:`.traces`: OTLP/JSON lines → :class:`~.traces.SpanRecord` (counts bad lines);
- :mod:`.samples`: spans → one duration per proof and group (phase, layer kind,
  sumcheck rounds by layer kind, span name);
- :mod:`.stats`: Mann–Whitney U (exact for small samples), a bootstrap interval of the
  median change, and the verdict;
- :mod:`.report`: both files → rows, worst first; :mod:`.render`: markdown / text / JSON;
- :mod:`.files` (reads the inputs) and :mod:`.rerun_view` (draws both runs) do the I/O.
"""

from otel_proofscope.diff.files import InputError, read
from otel_proofscope.diff.render import Format
from otel_proofscope.diff.report import Report, Settings, build
from otel_proofscope.diff.samples import By
from otel_proofscope.diff.stats import Verdict, compare

# Module names (render, report, …) stay importable as modules: no function shadows one.
__all__ = ["By", "Format", "InputError", "Report", "Settings", "Verdict", "build",
           "compare", "read"]

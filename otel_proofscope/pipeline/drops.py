"""Old home of the drop and rejection ledgers; they live in :mod:`otel_proofscope.ledger`.

Kept so that ``from otel_proofscope.pipeline.drops import DROPS`` goes on working: the
names are the same objects, not copies.
"""

from otel_proofscope.ledger import DROPS, REJECTIONS, DropKey, DropLedger, RejectionLedger

__all__ = ["DROPS", "REJECTIONS", "DropKey", "DropLedger", "RejectionLedger"]

"""``proofscope import``: existing profiles (Chrome trace-event JSON) into spans and metrics."""

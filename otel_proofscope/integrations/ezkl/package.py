"""The instrumented dependency, for ``BaseInstrumentor.instrumentation_dependencies``."""

_instruments = ("ezkl >= 23",)

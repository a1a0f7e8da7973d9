"""The OTLP wire, with no I/O: the encoder, the decoder and the SDK field readers."""

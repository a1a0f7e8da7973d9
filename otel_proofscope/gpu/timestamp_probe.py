"""Read one pair of device timestamps, so the census says "measured" only after a read.

An adapter advertising the ``timestamp-query`` feature is not proof that timestamps can
be read: the device may refuse the feature, the query may fail, or the values may come
back zero. The census opens the device once, writes the two timestamps of an empty
compute pass, resolves and maps them, and reports kernel timestamps as measured only if
that read gave two non-zero, ordered ticks. Measured on Mesa lavapipe (Vulkan and GL):
about 0.1 s per adapter.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

#: The wgpu feature that allows timestamp queries.
TIMESTAMP_FEATURE = "timestamp-query"


def read_pass_timestamps(adapter: Any, wgpu: Any) -> tuple[int, int] | str:
    """(begin, end) ticks of an empty compute pass, or why they could not be read."""
    device = None
    try:
        device = adapter.request_device_sync(required_features=[TIMESTAMP_FEATURE])
        if TIMESTAMP_FEATURE not in device.features:
            return f"the device was opened without '{TIMESTAMP_FEATURE}'"
        usage = wgpu.BufferUsage
        query = device.create_query_set(type="timestamp", count=2)
        resolve = device.create_buffer(size=16, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
        staging = device.create_buffer(size=16, usage=usage.MAP_READ | usage.COPY_DST)
        encoder = device.create_command_encoder()
        cpass = encoder.begin_compute_pass(timestamp_writes={
            "query_set": query, "beginning_of_pass_write_index": 0,
            "end_of_pass_write_index": 1})
        cpass.end()
        encoder.resolve_query_set(query, 0, 2, resolve, 0)
        encoder.copy_buffer_to_buffer(resolve, 0, staging, 0, 16)
        device.queue.submit([encoder.finish()])
        staging.map_sync(wgpu.MapMode.READ)
        begin, end = struct.unpack("<QQ", bytes(staging.read_mapped()))
        staging.unmap()
    except Exception as exc:  # any driver failure is the answer, not a crash
        return f"timestamp read failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        if device is not None:
            with contextlib.suppress(Exception):  # best-effort release
                device.destroy()
    if begin == 0 and end == 0:
        return "timestamps read back as zero"
    if end < begin:
        return f"timestamps read back reversed ({begin} > {end})"
    return begin, end

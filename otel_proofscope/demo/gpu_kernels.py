"""A WGSL kernel for the reference prover: matrix multiply over M31 (p = 2^31 − 1).

WGSL has no 64-bit integers, so each product of two residues (< 2^62) is formed from
16-bit limbs as a (hi, lo) pair of u32 and reduced with 2^31 ≡ 1 (mod p):
x = (x >> 31)·2^31 + (x & p) ≡ (x >> 31) + (x & p). Every dispatch goes through the
dispatch-accounting API: allocations, timed uploads and readbacks (sizes exact),
submit-to-complete, and kernel time from real timestamp queries where the adapter has
them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from opentelemetry import metrics

from otel_proofscope.fields import M31
from otel_proofscope.gpu.backend import HwState
from otel_proofscope.gpu.dispatch import Dispatch
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.gpu.wgpu_backend import WgpuDevice

_log = logging.getLogger("otel_proofscope.gpu")

P = M31
WORKGROUP = 8

WGSL_MATMUL_M31 = """
struct Dims { n: u32, k: u32, m: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> c: array<u32>;
@group(0) @binding(3) var<uniform> dims: Dims;

const P: u32 = 0x7fffffffu;

// x mod p for any u32 x: (x & p) + (x >> 31) <= 2^31, one conditional subtraction.
fn reduce32(x: u32) -> u32 {
    var r = (x & P) + (x >> 31u);
    if (r >= P) { r = r - P; }
    return r;
}

// (x * y) mod p for x, y < p, through the 64-bit product hi·2^32 + lo.
fn mul_mod(x: u32, y: u32) -> u32 {
    let xl = x & 0xffffu;
    let xh = x >> 16u;          // < 2^15 because x < 2^31
    let yl = y & 0xffffu;
    let yh = y >> 16u;
    let ll = xl * yl;           // < 2^32
    let lh = xl * yh;           // < 2^31
    let hl = xh * yl;           // < 2^31
    let hh = xh * yh;           // < 2^30
    let cross1 = lh + (ll >> 16u);
    let cross2 = hl + (cross1 & 0xffffu);
    let hi = hh + (cross1 >> 16u) + (cross2 >> 16u);   // < 2^30 (product < 2^62)
    let lo = (cross2 << 16u) | (ll & 0xffffu);
    // x >> 31 of the 64-bit product = (hi << 1) | (lo >> 31) < 2^31; the sum fits u32.
    return reduce32((lo & P) + ((hi << 1u) | (lo >> 31u)));
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if (row >= dims.n || col >= dims.m) { return; }
    var acc: u32 = 0u;
    for (var i: u32 = 0u; i < dims.k; i = i + 1u) {
        acc = acc + mul_mod(a[row * dims.k + i], b[i * dims.m + col]);
        if (acc >= P) { acc = acc - P; }
    }
    c[row * dims.m + col] = acc;
}
"""


def matmul_m31_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a @ b) mod p on the CPU, exact: each product (< 2^62) is reduced before it is
    added, so uint64 never overflows. The CPU fallback and the tests' reference."""
    a64 = np.asarray(a, dtype=np.uint64)
    b64 = np.asarray(b, dtype=np.uint64)
    n, k = a64.shape
    m = b64.shape[1]
    out = np.zeros((n, m), dtype=np.uint64)
    # Each product < 2^62; reducing every product keeps the running sum < 2^63.
    for i in range(k):
        out = (out + (a64[:, i:i + 1] * b64[i:i + 1, :]) % P) % P
    return out


class WgpuMatmul:
    """M31 matrix multiply on a wgpu device, with every dispatch accounted for.

    ``fallback_to_cpu``: when a dispatch faults (device lost, out of memory …) after
    ``max_retries`` retries, finish the batch on the CPU and record a recovery and a
    residual batch instead of raising.
    """

    def __init__(self, device: WgpuDevice | None = None, *,
                 meter_provider: metrics.MeterProvider | None = None,
                 fallback_to_cpu: bool = True, max_retries: int = 0,
                 claims: EvidenceDedup | None = None) -> None:
        import wgpu

        self._wgpu = wgpu
        self.device = device if device is not None else WgpuDevice(
            meter_provider=meter_provider, claims=claims)
        self.runtime = self.device.runtime
        self.fallback_to_cpu = fallback_to_cpu
        self.max_retries = max(0, int(max_retries))
        dev = self.device.device
        module = dev.create_shader_module(code=WGSL_MATMUL_M31)
        self._pipeline = dev.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"})
        self._max_binding = int(dev.limits["max-storage-buffer-binding-size"])
        self._max_groups = int(dev.limits["max-compute-workgroups-per-dimension"])

    # ── public ───────────────────────────────────────────────────────────────────────

    def matmul_m31(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(a @ b) mod (2^31 − 1) as an (n, m) uint64 array; a is (n, k), b is (k, m)."""
        a32, b32 = self._check(a, b)
        n, k = a32.shape
        m = b32.shape[1]
        if n == 0 or m == 0 or k == 0:
            return np.zeros((n, m), dtype=np.uint64)
        attempt = 0
        while True:
            try:
                return self._dispatch(a32, b32)
            except Exception as exc:
                if attempt < self.max_retries and self.runtime.state is not HwState.FAILED:
                    attempt += 1
                    self.runtime.retry(attempt)
                    continue
                if not self.fallback_to_cpu:
                    raise
                _log.warning("GPU matmul failed (%s); finishing this batch on the CPU", exc)
                result = matmul_m31_reference(a32, b32)
                self.runtime.recovery("cpu")
                self.runtime.residual_batch()
                return result

    # ── internals ────────────────────────────────────────────────────────────────────

    def _check(self, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
        arrs = []
        for name, x in (("a", a), ("b", b)):
            arr = np.asarray(x)
            if arr.ndim != 2:
                raise ValueError(f"{name} must be a 2-D array, got shape {arr.shape}")
            if arr.dtype.kind not in "iu":
                raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= P):
                raise ValueError(f"{name} values must lie in [0, 2^31 - 1)")
            arrs.append(np.ascontiguousarray(arr, dtype=np.uint32))
        a32, b32 = arrs
        if a32.shape[1] != b32.shape[0]:
            raise ValueError(f"inner dimensions differ: a is {a32.shape}, b is {b32.shape}")
        n, m = a32.shape[0], b32.shape[1]
        for name, nbytes in (("a", a32.nbytes), ("b", b32.nbytes), ("result", n * m * 4)):
            if nbytes > self._max_binding:
                raise ValueError(f"{name} needs {nbytes} bytes, over this device's storage "
                                 f"binding limit of {self._max_binding}; split the matmul")
        if -(-max(n, m) // WORKGROUP) > self._max_groups:
            raise ValueError(f"matrix side {max(n, m)} exceeds the dispatch limit of "
                             f"{self._max_groups * WORKGROUP}")
        return a32, b32

    def _dispatch(self, a32: np.ndarray, b32: np.ndarray) -> np.ndarray:
        wgpu, dev, rt = self._wgpu, self.device, self.runtime
        n, k = a32.shape
        m = b32.shape[1]
        c_bytes = n * m * 4
        ts_bytes = 16 if dev.timestamps else 0
        ts_offset = (c_bytes + 7) // 8 * 8
        dims = np.array([n, k, m, 0], dtype=np.uint32)
        usage = wgpu.BufferUsage
        owned: list[tuple[Any, int]] = []

        def buffer(size: int, flags: Any) -> Any:
            buf = dev.device.create_buffer(size=size, usage=flags)
            rt.alloc(size)
            owned.append((buf, size))
            return buf

        with rt.dispatch() as d:
            try:
                a_buf = buffer(a32.nbytes, usage.STORAGE | usage.COPY_DST)
                b_buf = buffer(b32.nbytes, usage.STORAGE | usage.COPY_DST)
                c_buf = buffer(c_bytes, usage.STORAGE | usage.COPY_SRC)
                d_buf = buffer(dims.nbytes, usage.UNIFORM | usage.COPY_DST)
                staging = buffer(ts_offset + ts_bytes, usage.MAP_READ | usage.COPY_DST)
                with d.upload(a32.nbytes + b32.nbytes + dims.nbytes):
                    dev.queue.write_buffer(a_buf, 0, a32)
                    dev.queue.write_buffer(b_buf, 0, b32)
                    dev.queue.write_buffer(d_buf, 0, dims)
                    dev.queue.submit([])  # flush the staged writes, then wait for them
                    dev.wait_idle()
                copy_cb = self._run_kernel(d, a_buf, b_buf, c_buf, d_buf, staging, n, m,
                                           c_bytes, ts_offset, buffer)
                with d.readback(c_bytes + ts_bytes):
                    dev.queue.submit([copy_cb])
                    staging.map_sync(wgpu.MapMode.READ)
                    raw = bytes(staging.read_mapped())
                    staging.unmap()
                if dev.timestamps:
                    t0, t1 = np.frombuffer(raw, dtype=np.uint64, count=2, offset=ts_offset)
                    d.record_kernel_timestamps(int(t0), int(t1), dev.timestamp_period_ns())
            finally:
                for buf, size in owned:
                    buf.destroy()
                    rt.free(size)
        out = np.frombuffer(raw, dtype=np.uint32, count=n * m).reshape(n, m)
        return out.astype(np.uint64)

    def _run_kernel(self, d: Dispatch, a_buf: Any, b_buf: Any, c_buf: Any, d_buf: Any,
                    staging: Any, n: int, m: int, c_bytes: int, ts_offset: int,
                    buffer: Any) -> Any:
        """Encode and run the kernel (timed submit → complete); returns the encoded
        device→host copy, which the caller submits as part of the readback."""
        wgpu, dev = self._wgpu, self.device
        bind = dev.device.create_bind_group(
            layout=self._pipeline.get_bind_group_layout(0),
            entries=[{"binding": i, "resource": {"buffer": buf}}
                     for i, buf in enumerate((a_buf, b_buf, c_buf, d_buf))])
        encoder = dev.device.create_command_encoder()
        pass_args: dict[str, Any] = {}
        if dev.timestamps:
            query = dev.device.create_query_set(type="timestamp", count=2)
            resolve = buffer(16, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            pass_args["timestamp_writes"] = {"query_set": query,
                                             "beginning_of_pass_write_index": 0,
                                             "end_of_pass_write_index": 1}
        cpass = encoder.begin_compute_pass(**pass_args)
        cpass.set_pipeline(self._pipeline)
        cpass.set_bind_group(0, bind)
        cpass.dispatch_workgroups(-(-m // WORKGROUP), -(-n // WORKGROUP), 1)
        cpass.end()
        if dev.timestamps:
            encoder.resolve_query_set(query, 0, 2, resolve, 0)
        kernel_cb = encoder.finish()
        # The device→host copy belongs to the readback, so it is a separate submission.
        copy = dev.device.create_command_encoder()
        copy.copy_buffer_to_buffer(c_buf, 0, staging, 0, c_bytes)
        if dev.timestamps:
            copy.copy_buffer_to_buffer(resolve, 0, staging, ts_offset, 16)
        copy_cb = copy.finish()
        with d.submit():
            dev.queue.submit([kernel_cb])
            dev.wait_idle()
        return copy_cb

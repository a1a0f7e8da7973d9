"""`proofscope gpu`: census of GPU backends, devices, measured metrics and capability gaps"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "census of GPU backends, devices, measured metrics and capability gaps"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "gpu", help=HELP,
        description=HELP + ". Each NVIDIA device is read once through NVML; wgpu adapters "
                           "(Vulkan, Metal, D3D12, GL) are enumerated without opening a device.")
    p.add_argument("--json", action="store_true", help="print the census as JSON")
    p.add_argument("--no-nvml", action="store_true", help="skip the NVML backend")
    p.add_argument("--no-wgpu", action="store_true", help="skip the wgpu backend")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.gpu.census import census_json, render_table, take_census

    census = take_census(include_nvml=not args.no_nvml, include_wgpu=not args.no_wgpu)
    print(census_json(census) if args.json else render_table(census))
    return 0

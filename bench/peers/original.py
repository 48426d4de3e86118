"""The original TinyStore (PyPI tinyshed-tinystore, Rust core, Python 3.12) as a peer, in its own venv.

    bench/.venv-orig/bin/python bench/peers/original.py {sql|channels|locks|jobs} --mode {embedded|sidecar}
        [--seconds S] [--warmup W] [--quick]

Prints one JSON object: the workload's metrics (the same names as ours), or {"error": ...}.
Written against the package's documented API only (its PyPI description and help()):
open(dir, embedded=True) runs the core in this process; open(dir) finds or starts the directory's sidecar,
which this script stops at the end (`tinystore stop DIR`, then by pid).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # bench/, after site-packages

from common import Sizes, error_text, log, open_store, use_uvloop
from workloads import LOADS, OriginalFlavor

import tinystore


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes(args.quick)
    sizes.seconds = args.seconds if args.seconds is not None else sizes.seconds
    sizes.warmup = args.warmup if args.warmup is not None else sizes.warmup
    log(f"original {args.bench} ({args.mode})")
    try:
        async with open_store(tinystore, args.mode, prefix="tsb-orig-") as store:
            result = await LOADS[args.bench](store, sizes, OriginalFlavor())
    except Exception as exc:
        return {"error": error_text(exc)}
    result["version"] = metadata.version("tinyshed-tinystore")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", choices=sorted(LOADS))
    parser.add_argument("--mode", choices=("embedded", "sidecar"), required=True)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--warmup", type=float, default=None)
    parser.add_argument("--quick", action="store_true")
    arguments = parser.parse_args()
    loop = use_uvloop()
    report = asyncio.run(main(arguments))
    report["loop"] = loop
    report["python"] = sys.version.split()[0]
    print(json.dumps(report), flush=True)

#!/usr/bin/env python3
"""Where kvdrain's instructions go per notification: callgrind over `kvdrain bench ingest`.

Runs ``valgrind --tool=callgrind`` on the release ``kvdrain`` binary with collection
switched on only inside the timed loop (``kvdrain_cli::bench::ingest::drive``), then
splits the loop's self cost (instructions, inlined code included) into the steps of the
hot path by the source file and function each instruction comes from:

  parse       consumer_notice / wire::parse (prefixes, last ':', TP digits)
  hash        Fingerprint::of_checked (128-bit keyed fingerprint of the id)
  probe       shared.rs / index.rs inside handle_notification (index probe, seqlock read)
  cas         state_word.rs / atomics inside handle_notification (state load, CAS)
  ingest      the rest of handle_notification (fast-path dispatch, counters, ready push)
  decide      poll + retire (ready pop, decision, tombstone, index removal, timer cancel)
  register    register (fingerprint, duplicate probe, slot write, index insert, timer)
  harness     the benchmark loop itself (message iteration, agent counter, poll closure)

"hash" counts every fingerprint, the registration's too (1 + 1/E per notification).
Helpers compiled out of line (`Shared::find`, `StateWord::*`) are counted as probe / cas
whoever called them, so for builds that do not inline them the registration's
duplicate probe lands in "probe".

Usage: python3 bench/profile.py [--binary PATH] [--inflight 4096] [--edges 2]
       [--notifications 200000] [--mode counting]
Prints a table and one JSON line. Needs valgrind (callgrind_annotate) on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ORDER = ["parse", "hash", "probe", "cas", "ingest", "decide", "register", "harness"]


def category(path: str, function: str) -> str:
    if any(k in function for k in ("consumer_notice", "wire::parse", "parse_slow",
                                    "from_utf8", "memrchr")):
        return "parse"
    if "Fingerprint::of" in function or "memcpy" in function:
        return "hash"
    # Helpers the compiler left out of line (older builds): by their own name.
    if "Shared<_,_>::find" in function or "Index<_>" in function:
        return "probe"
    if "StateWord" in function or "resolve_edge" in function:
        return "cas"
    if "Engine<_,_>::register" in function or "push_back" in function or "sift_up" in function:
        return "register"
    if any(k in function for k in ("Engine<_,_>::poll", "retire", "Tombstones", "cancel",
                                    "sift_down", "decide_drained")):
        return "decide"
    # `handle_notification` is `#[inline]`: in the timed loop (`drive`) its code is the
    # loop's own, told apart by the core source file it comes from. Standard-library code
    # inlined there (iterators, `Option`) counts as harness; atomics as cas.
    inlined = "bench::ingest::drive" in function and "/core/src/" in f"/{path}"
    if "handle_notification" in function or inlined:
        if path.endswith(("shared.rs", "index.rs")):
            return "probe"
        if path.endswith(("state_word.rs", "atomic.rs", "slot.rs")):
            return "cas"
        if path.endswith("fingerprint.rs"):
            return "hash"
        if inlined and path.endswith(("ledger.rs", "engine.rs")):
            return "harness"
        return "ingest"
    if "bench::ingest::drive" in function and path.endswith("atomic.rs"):
        return "cas"
    return "harness"


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "target"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--binary", default=os.path.join(target, "release", "kvdrain"))
    ap.add_argument("--inflight", default="4096")
    ap.add_argument("--edges", default="2")
    ap.add_argument("--notifications", default="200000")
    ap.add_argument("--mode", default="counting")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--toggle-collect=*bench*ingest*drive*",
             args.binary, "bench", "ingest", "--inflight", args.inflight,
             "--edges", args.edges, "--notifications", args.notifications,
             "--mode", args.mode, "--reps", "1"],
            capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        annotate = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--threshold=100", out],
            capture_output=True, text=True, check=True).stdout

    totals = dict.fromkeys(ORDER, 0)
    line_re = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+?):(.+?)(?: \[.*\])?$")
    for line in annotate.splitlines():
        m = line_re.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        ir = int(m.group(1).replace(",", ""))
        totals[category(m.group(2), m.group(3))] += ir
    n = int(args.notifications.replace("_", ""))
    total = sum(totals.values())
    print(f"instructions per notification (R={args.inflight}, E={args.edges}, "
          f"{args.mode}): {total / n:.0f}")
    for k in ORDER:
        print(f"  {k:<9} {totals[k] / n:7.1f}  {100 * totals[k] / total:5.1f} %")
    record = {"profile": "callgrind", "inflight": int(args.inflight),
              "edges": int(args.edges), "mode": args.mode, "notifications": n,
              "instructions_per_notification": round(total / n, 1)}
    record.update({k: round(totals[k] / n, 1) for k in ORDER})
    print(json.dumps(record, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

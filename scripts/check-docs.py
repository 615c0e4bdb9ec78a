#!/usr/bin/env python3
"""Checks that the repository's references lead somewhere and carry no history.

Run from anywhere: `python3 scripts/check-docs.py` checks the tracked files of the repository
this script lives in and exits 1, listing `file:line: [rule] ...`, when

  catalogue  a failure-catalogue id (C1, L1, S2, F7, ...) is cited in code or docs but
             docs/protocol.md has no `<a id="...">` anchor for it;
  anchor     a link `protocol.md#x` or `nixl.md#x` names an anchor the document lacks;
  history    a file names an issue of this project ("issue 13", "issue #13", a bare "#13")
             or a pass of work ("fifth pass", "pass of issue"): comments and docs state
             facts, the history is in git;
  outside    a file links into ../shared or cites a section of a document that is not in
             the repository ("push-protocol.md §9", "nixl.md §2.7", "protocol reference §3").

External references are fine: "vLLM #46283", "NIXL PR #2067", "UCX #11929",
"tokio-rs/loom#392". vendor/ and CHANGELOG.md are not checked for history; vendor/ not at
all. `--self-test` runs the checker on a temporary tree with one violation of each rule (and
a clean file) and fails unless it reports exactly those.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Files whose catalogue ids are checked (code, docs, traces).
CITING_SUFFIXES = {".rs", ".py", ".pyi", ".c", ".h", ".cpp", ".md", ".sh", ".toml", ".trace"}
PROTOCOL_DOC = "docs/protocol.md"
ANCHORED_DOCS = {"protocol.md": "docs/protocol.md", "nixl.md": "docs/nixl.md"}
THIS_FILE = "scripts/check-docs.py"

CATALOGUE_ID = re.compile(r"\b([CLSF])([0-9]{1,2})\b")
# Lines about CPU caches say "L1d 32 KiB", "L2 misses": not catalogue ids.
CACHE_CONTEXT = re.compile(r"(?i)\b(cache|caches|misses|miss|KiB|MiB|per core|L1d|LLC)\b")
ANCHOR_DEF = re.compile(r'<a id="([A-Za-z0-9_-]+)"></a>')
ANCHOR_LINK = re.compile(r"\b(protocol|nixl)\.md#([A-Za-z0-9_-]+)")

# Names of other projects: an issue number right after one of them is theirs, not ours.
EXTERNAL = re.compile(
    r"(?i)(vllm|nixl|ucx|openucx|sglang|lmcache|tensorrt|trt-llm|dynamo|loom|tokio|pyo3|"
    r"maturin|rust-lang|github\.com|upstream|\bPRs?\b|pull request)"
)
ISSUE = re.compile(r"(?i)\bissues?\s*#?\s*[0-9]+\b")
BARE_NUMBER = re.compile(r"(?<![\w&/])#[0-9]+\b")
ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|previous|"
    r"earlier|later|next|latest|final|hot[- ]path|review|clean-?up|optimi[sz]ation"
)
PASS = re.compile(
    rf"(?i)\b(({ORDINAL})\s+pass(es)?\b|pass(es)?\s+of\s+(issue|work|the\s+hot\s+path)\b|"
    r"pass(es)?\s+since\b)"
)
OUTSIDE = re.compile(
    r"(?i)(\.\./shared\b|/work/shared\b|push-protocol(\.md)?|protocol\s+reference|"
    r"vllm-connector\.md|[\w-]+\.md\s*§|§\s*[0-9])"
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def tracked_files(root: Path) -> list[str]:
    """The repository's tracked files, or every file under root outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"],
            check=True,
            capture_output=True,
        ).stdout
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "target", ".venv", ".nixl", "vendor", "node_modules"}
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in skip]
            for name in filenames:
                found.append(str(Path(dirpath, name).relative_to(root)))
        return sorted(found)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def anchors(root: Path, doc: str) -> set[str]:
    text = read_text(root / doc)
    return set(ANCHOR_DEF.findall(text)) if text is not None else set()


def history_matches(line: str, previous: str) -> list[str]:
    """History words in `line`; `previous` is the line before, for wrapped text."""
    hits = []
    for pattern in (ISSUE, BARE_NUMBER):
        for m in pattern.finditer(line):
            before = (previous + " " + line[: m.start()])[-48:]
            if not EXTERNAL.search(before):
                hits.append(m.group(0))
    hits.extend(m.group(0) for m in PASS.finditer(line))
    return hits


def check(root: Path, files: list[str]) -> list[Finding]:
    """Every finding in `files` (paths relative to `root`)."""
    doc_anchors = {name: anchors(root, doc) for name, doc in ANCHORED_DOCS.items()}
    catalogue = doc_anchors["protocol.md"]
    findings: list[Finding] = []
    for rel in files:
        if rel.startswith("vendor/") or rel == THIS_FILE:
            continue
        text = read_text(root / rel)
        if text is None:
            continue  # binary (fuzz corpora) or unreadable
        cites = Path(rel).suffix in CITING_SUFFIXES
        history = Path(rel).name != "CHANGELOG.md"
        previous = ""
        for n, line in enumerate(text.splitlines(), 1):
            if cites:
                cache_line = CACHE_CONTEXT.search(line) is not None
                for m in CATALOGUE_ID.finditer(line):
                    family, number = m.group(1), m.group(2)
                    if family == "L" and cache_line:
                        continue
                    if number.startswith("0"):
                        continue
                    if f"{family}{number}".lower() not in catalogue:
                        findings.append(
                            Finding(
                                rel,
                                n,
                                "catalogue",
                                f"{m.group(0)} has no anchor in {PROTOCOL_DOC}",
                            )
                        )
            for m in ANCHOR_LINK.finditer(line):
                doc, anchor = m.group(1) + ".md", m.group(2)
                if anchor not in doc_anchors[doc]:
                    findings.append(
                        Finding(
                            rel, n, "anchor", f"{m.group(0)}: no such anchor in {ANCHORED_DOCS[doc]}"
                        )
                    )
            if history:
                for hit in history_matches(line, previous):
                    findings.append(
                        Finding(rel, n, "history", f"{hit!r}: state the fact, git keeps the history")
                    )
            for m in OUTSIDE.finditer(line):
                findings.append(
                    Finding(
                        rel,
                        n,
                        "outside",
                        f"{m.group(0)!r}: cite docs/protocol.md, docs/nixl.md or "
                        "docs/replay-trace.md by anchor instead",
                    )
                )
            previous = line
    return findings


def self_test() -> int:
    """The checker finds one violation of each rule and nothing in a clean file."""
    cases = {
        "src/catalogue.rs": ("// A hang (catalogue F99).\n", "catalogue"),
        "src/anchor.rs": ("// See docs/protocol.md#nowhere.\n", "anchor"),
        "src/issue.rs": ("// Measured for issue 13.\n", "history"),
        "src/bare.py": ("# the latency goal (#10)\n", "history"),
        "src/pass.md": ("The fifth pass of the hot path.\n", "history"),
        "src/outside.c": ("/* as push-protocol.md §9 says */\n", "outside"),
        "src/shared.md": ("[spec](../shared/spec/replay-trace.md)\n", "outside"),
    }
    clean = (
        "// Catalogue C1 and F7 (docs/protocol.md#f7); vLLM #46283, NIXL PR #2067,\n"
        "// tokio-rs/loom#392 and #166; one pass over all M messages; L2 1 MiB per core.\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "docs/protocol.md").write_text('<a id="c1"></a>\n<a id="f7"></a>\n')
        (root / "docs/nixl.md").write_text('<a id="errors"></a>\n')
        (root / "src").mkdir()
        for rel, (text, _) in cases.items():
            (root / rel).write_text(text)
        (root / "src/clean.rs").write_text(clean)
        (root / "CHANGELOG.md").write_text("Fixed in the second pass of issue 4.\n")
        files = [*cases, "src/clean.rs", "CHANGELOG.md", "docs/protocol.md", "docs/nixl.md"]
        found = check(root, files)
    got = {(f.path, f.rule) for f in found}
    want = {(rel, rule) for rel, (_, rule) in cases.items()}
    if got != want:
        print("check-docs self-test FAILED", file=sys.stderr)
        print(f"  wanted: {sorted(want)}", file=sys.stderr)
        for f in found:
            print(f"  found:  {f}", file=sys.stderr)
        return 1
    print(f"check-docs self-test: {len(want)} violations found, the clean file passed")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    findings = check(root, tracked_files(root))
    for f in findings:
        print(f)
    if findings:
        print(f"check-docs: {len(findings)} problem(s)", file=sys.stderr)
        return 1
    print("check-docs: every catalogue id resolves in docs/protocol.md; no history, no outside links")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

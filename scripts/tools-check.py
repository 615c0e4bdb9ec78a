#!/usr/bin/env python3
"""Fails when the Makefile, .ci/run or a script under scripts/ calls a tool that neither
the base image (scripts/base-image.txt) has nor a setup script (scripts/setup-*.sh)
installs.

What counts as a use:
  * every command word of a recipe line or script line (after `nice`, `env`, `sudo`,
    `timeout`, `time`, variable assignments and shell keywords);
  * `cargo [+TOOLCHAIN] SUBCOMMAND`: the toolchain, the subcommand's binary
    (`cargo-deny`) or component (`clippy`, `rustfmt` for `fmt`, `miri`), and every
    `--target TRIPLE` on that toolchain;
  * `python -m MODULE` and tools run from the virtualenv (`.../bin/maturin`).
What counts as an install, in a setup script:
  * `rustup toolchain install`, `rustup [+TC] component add`, `rustup target add`;
  * `cargo install CRATE`, and calls of a shell function whose body runs `cargo install`
    (its first argument is the binary);
  * `apt-get install PKG...` (literal or from a `NAME+=(PKG)` array), with the commands of
    each package from base-image.txt;
  * `pip install -r FILE` (its requirement names, as commands and modules) and
    `pip install NAME`.
Variables come from scripts/toolchains, the Makefile's `NAME ?= value` / `NAME := value`,
`NAME="${NAME:-default}"` and `for NAME in WORDS` in the scripts.

Usage: tools-check.py [--root DIR]   (default: the repository this script is in)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KEYWORDS = {
    "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
    "case", "esac", "in", "function", "select",
}
# Words that run the command after them (their own options skipped).
WRAPPERS = {"nice": {"-n"}, "timeout": set(), "time": set(), "exec": set(), "env": set(),
            "sudo": set(), "as_root": set(), "xargs": set()}
COMPONENT_OF_SUBCOMMAND = {"clippy": "clippy", "fmt": "rustfmt", "miri": "miri"}


@dataclass
class Base:
    commands: set[str] = field(default_factory=set)
    toolchains: set[str] = field(default_factory=set)
    components: set[tuple[str, str]] = field(default_factory=set)
    targets: set[tuple[str, str]] = field(default_factory=set)
    subcommands: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    guarded: set[str] = field(default_factory=set)
    apt: dict[str, list[str]] = field(default_factory=dict)


def read_base(path: Path) -> Base:
    base = Base()
    for raw in path.read_text().splitlines():
        words = raw.split("#", 1)[0].split() if not raw.lstrip().startswith("#") else []
        if not words:
            continue
        kind, rest = words[0], words[1:]
        if kind == "command":
            base.commands.update(rest)
        elif kind == "toolchain":
            base.toolchains.update(rest)
        elif kind == "component":
            base.components.update((rest[0], c) for c in rest[1:])
        elif kind == "target":
            base.targets.update((rest[0], t) for t in rest[1:])
        elif kind == "cargo-subcommand":
            base.subcommands.update(rest)
        elif kind == "python-module":
            base.modules.update(rest)
        elif kind == "guarded":
            base.guarded.update(rest)
        elif kind == "apt":
            base.apt[rest[0]] = rest[1:]
        else:
            sys.exit(f"{path}: unknown kind {kind!r}")
    return base


# ---- a small shell tokenizer: simple commands as lists of words ---------------------------


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the `close` that matches the `open_` at text[i]."""
    depth, j, quote = 0, i, ""
    while j < len(text):
        c = text[j]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                j += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            j += 1
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell text, each as its words (quotes removed; `$(...)`
    bodies parsed as commands of their own; redirection targets dropped)."""
    out: list[list[str]] = []
    cmd: list[str] = []
    word: list[str] = []
    in_word = False
    redirect = False
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal word, in_word, redirect
        if in_word:
            if redirect:
                redirect = False
            else:
                cmd.append("".join(word))
        word, in_word = [], False

    def end_cmd() -> None:
        nonlocal cmd, redirect
        end_word()
        redirect = False
        if cmd:
            out.append(cmd)
        cmd = []

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2
                continue
            word.append(text[i + 1])
            in_word = True
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            word.append(text[i + 1:j])
            in_word = True
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\":
                    j += 2
                    continue
                if text.startswith("$((", j):  # arithmetic
                    j = _matching(text, j + 1, "(", ")")
                    continue
                if text.startswith("$(", j):
                    k = _matching(text, j + 1, "(", ")")
                    out.extend(commands(text[j + 2:k - 1]))
                    j = k
                    continue
                j += 1
            word.append(text[i + 1:j])
            in_word = True
            i = j + 1
        elif text.startswith("$((", i):
            k = _matching(text, i + 1, "(", ")")  # arithmetic: no command
            word.append("0")
            in_word = True
            i = k
        elif text.startswith("$(", i):
            k = _matching(text, i + 1, "(", ")")
            out.extend(commands(text[i + 2:k - 1]))
            word.append(text[i:k])
            in_word = True
            i = k
        elif text.startswith("${", i):
            k = _matching(text, i + 1, "{", "}")
            word.append(text[i:k])
            in_word = True
            i = k
        elif c == "(" and in_word and "".join(word).endswith("="):
            k = _matching(text, i, "(", ")")  # array literal: NAME=(a b) / NAME+=(a)
            word.append(text[i:k])
            i = k
        elif c == "#" and not in_word:
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in " \t":
            end_word()
            i += 1
        elif c in "\n;&|()":
            end_cmd()
            i += 1
        elif c in "<>":
            end_word()
            j = i
            while j < n and text[j] in "<>":
                j += 1
            dup = re.match(r"&[0-9-]+", text[j:])  # >&2, 2>&1: no file named
            if dup:
                i = j + dup.end()
                continue
            i = j
            if text.startswith("(", i):  # process substitution <(...)
                continue
            redirect = True
        else:
            if c.isdigit() and not in_word and text[i + 1:i + 2] == ">":
                i += 1  # the fd of 2>...
                continue
            word.append(c)
            in_word = True
            i += 1
    end_cmd()
    return out


# ---- the files ------------------------------------------------------------------------------


def read_toolchains(path: Path) -> dict[str, str]:
    vars_: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Z_]+)=(\S+)$", line)
        if m:
            vars_[m.group(1)] = m.group(2)
    return vars_


def makefile_shell(path: Path, vars_: dict[str, str]) -> str:
    """The Makefile's recipes as shell text, Make variables substituted."""
    text = path.read_text().replace("\\\n", " ")
    for m in re.finditer(r"^([A-Za-z_]+)\s*(?:\?=|:=|=)\s*(.*)$", text, re.M):
        vars_.setdefault(m.group(1), m.group(2).strip())
    vars_.setdefault("MAKE", "make")
    recipes = []
    for line in text.splitlines():
        if line.startswith("\t"):
            line = line[1:].lstrip("@-")
            for _ in range(4):  # a variable's value may name another (`.venv-$(V)`)
                line = re.sub(r"\$\(([A-Za-z_]+)\)", lambda m: vars_.get(m.group(1), ""), line)
            recipes.append(line.replace("$$", "$"))
    return "\n".join(recipes)


@dataclass
class Script:
    name: str
    cmds: list[list[str]]
    functions: set[str]
    scalars: dict[str, str]
    lists: dict[str, list[str]]
    guarded: set[str]


def parse_script(name: str, text: str, toolchains: dict[str, str]) -> Script:
    cmds = commands(text)
    functions = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\)\s*\{", text, re.M))
    scalars = dict(toolchains)
    lists: dict[str, list[str]] = {}
    for m in re.finditer(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=\"([^\"$]*\$[a-z_]+/[^\"]*|[^\"$]+)\"$", text, re.M):
        scalars.setdefault(m.group(1), m.group(2))
    for m in re.finditer(r"\b([A-Za-z_]+)=\"?\$\{\1:-([^}\"]+)\}\"?", text):
        scalars[m.group(1)] = m.group(2)
    for m in re.finditer(r"\b([A-Za-z_]+)\+?=\(([^)]*)\)", text):
        lists.setdefault(m.group(1), []).extend(w.strip('"') for w in m.group(2).split())
    guarded = set(re.findall(r"command -v ([A-Za-z0-9_.+-]+)", text))
    return Script(name, cmds, functions, scalars, lists, guarded)


def expand(word: str, s: Script) -> list[str]:
    """The values a word may take: `$c` of a for loop gives each item."""
    m = re.fullmatch(r"\$\{?([A-Za-z_]+)(?:\[@\])?\}?", word)
    if m and m.group(1) in s.lists:
        return s.lists[m.group(1)]
    m = re.fullmatch(r"\$\{([A-Za-z_]+):-([^}]+)\}", word)
    if m:
        return [s.scalars.get(m.group(1), m.group(2))]

    def sub(m: re.Match[str]) -> str:
        return s.scalars.get(m.group(1) or m.group(2), m.group(0))

    return [re.sub(r"\$\{([A-Za-z_]+)\}|\$([A-Za-z_]+)", sub, word)]


def bind_loop(cmd: list[str], s: Script) -> bool:
    """`for NAME in WORDS`: binds NAME to WORDS for the commands after it."""
    if len(cmd) >= 3 and cmd[0] == "for" and cmd[2] == "in":
        s.lists[cmd[1]] = cmd[3:]
        return True
    return False


def toolchain_name(tc: str) -> str:
    return tc[1:] if tc.startswith("+") else tc


# ---- installs ---------------------------------------------------------------------------------


@dataclass
class Installed:
    commands: set[str] = field(default_factory=set)
    toolchains: set[str] = field(default_factory=set)
    components: set[tuple[str, str]] = field(default_factory=set)
    targets: set[tuple[str, str]] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)


def collect_installs(setup: list[Script], root: Path, base: Base) -> Installed:
    got = Installed()
    for s in setup:
        installers = {
            f for f in s.functions
            if re.search(rf"{f}\s*\(\)\s*\{{[^}}]*cargo install", (root / "scripts" / s.name).read_text())
        }
        for cmd in s.cmds:
            if bind_loop(cmd, s):
                continue
            words = [w for w in cmd if not re.fullmatch(r"[A-Za-z_]+=.*", w, re.S)]
            while words and (words[0] in WRAPPERS or words[0] in KEYWORDS):
                words = words[1:]
            if not words:
                continue
            head, args = words[0], words[1:]
            if head in installers and args:
                got.commands.update(expand(args[0], s))
            elif head == "rustup":
                tc = "stable"
                if args and args[0].startswith("+"):
                    tc, args = toolchain_name(expand(args[0], s)[0]), args[1:]
                if args[:2] == ["toolchain", "install"]:
                    got.toolchains.update(x for a in args[2:] if not a.startswith("-")
                                          for x in expand(a, s))
                elif args[:2] == ["component", "add"]:
                    got.components.update((tc, x) for a in args[2:] if not a.startswith("-")
                                          for x in expand(a, s))
                elif args[:2] == ["target", "add"]:
                    got.targets.update((tc, x) for a in args[2:] if not a.startswith("-")
                                       for x in expand(a, s))
            elif head == "cargo" and args[:1] == ["install"]:
                rest, skip = args[1:], False
                for a in rest:
                    if skip:
                        skip = False
                    elif a in ("--version", "--root", "--git", "--path", "--features"):
                        skip = True
                    elif not a.startswith("-"):
                        got.commands.update(expand(a, s))
            elif head == "apt-get" and "install" in args:
                for a in args[args.index("install") + 1:]:
                    if a.startswith("-"):
                        continue
                    for pkg in expand(a, s):
                        got.commands.update(base.apt.get(pkg, [pkg]))
            elif "pip" in words and "install" in words:
                after = words[words.index("install") + 1:]
                skip = False
                for k, a in enumerate(after):
                    if skip:
                        skip = False
                    elif a == "-r" and k + 1 < len(after):
                        req = root / re.sub(r"^\$\{?[A-Za-z_]+\}?/", "", expand(after[k + 1], s)[0])
                        for line in req.read_text().splitlines():
                            req_name = re.match(r"^\s*([A-Za-z0-9_.-]+)", line.split("#")[0])
                            if req_name:
                                got.commands.add(req_name.group(1))
                                got.modules.add(req_name.group(1))
                        skip = True
                    elif a in ("--target", "--platform", "--python-version", "-d"):
                        skip = True
                    elif not a.startswith("-") and not a.startswith("$") and "/" not in a:
                        name = re.split(r"[=<>!\[]", a)[0]
                        got.modules.add(name)
                        got.commands.add(name)  # a package's script is often its name
    return got


# ---- uses ---------------------------------------------------------------------------------------


def check(root: Path, seen: set[str] | None = None) -> list[str]:
    base = read_base(root / "scripts" / "base-image.txt")
    toolchains = read_toolchains(root / "scripts" / "toolchains")
    scripts = sorted((root / "scripts").glob("*.sh"))
    setup = [parse_script(p.name, p.read_text(), toolchains)
             for p in scripts if p.name.startswith("setup-")]
    installed = collect_installs(setup, root, base)

    have_cmd = base.commands | installed.commands
    have_tc = base.toolchains | installed.toolchains
    have_comp = base.components | installed.components
    have_target = base.targets | installed.targets
    have_mod = base.modules | installed.modules

    users: list[Script] = []
    make_vars = dict(toolchains)
    users.append(parse_script("Makefile", makefile_shell(root / "Makefile", make_vars), make_vars))
    ci = root / ".ci" / "run"
    if ci.is_file():
        users.append(parse_script(".ci/run", ci.read_text(), toolchains))
    for p in scripts:
        users.append(parse_script(f"scripts/{p.name}", p.read_text(), toolchains))

    problems: list[str] = []

    def need(ok: bool, where: str, what: str) -> None:
        if seen is not None:
            seen.add(re.sub(r" \(.*\)$", "", what))
        if not ok:
            problems.append(f"{where}: {what} is neither on the base image "
                            f"(scripts/base-image.txt) nor installed by a scripts/setup-*.sh")

    for s in users:
        for cmd in s.cmds:
            if bind_loop(cmd, s):
                continue
            words = list(cmd)
            line = " ".join(cmd)
            # assignments, keywords and wrappers before the command word
            while words:
                w = words[0]
                if w == "case":  # `case WORD in`: the patterns are no commands either
                    words = []
                elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=.*", w, re.S) or w in KEYWORDS:
                    words = words[1:]
                elif w in WRAPPERS:
                    opts = WRAPPERS[w]
                    if w in base.guarded:
                        need(w in s.guarded, s.name, f"`{w}` without a `command -v {w}` test")
                    elif w not in s.functions:
                        need(w in have_cmd, s.name, f"command `{w}`")
                    words = words[1:]
                    while words and (words[0].startswith("-") or words[0] in opts
                                     or re.fullmatch(r"[0-9.]+[smh]?", words[0])
                                     or re.fullmatch(r"[A-Za-z_]+=.*", words[0])):
                        words = words[1:]
                else:
                    break
            if not words:
                continue
            if words[0] in ("[", "[[", "test"):  # a test: no tool
                continue
            if words[0] == "command" and words[1:2] == ["-v"]:
                continue
            head = words[0]
            if "*" in head:
                continue  # a `case` pattern (`*-abi3-*)`), not a command
            if head in ('"$@"', "$@") or head in s.functions:
                continue
            array = re.fullmatch(r"\$\{([A-Za-z_]+)\[@\]\}", head)
            if array and array.group(1) in s.lists:  # "${pip[@]}" runs its first word
                head = s.lists[array.group(1)][0]
            values = expand(head, s)
            if any(v.startswith("$") and "/" not in v for v in values):
                problems.append(f"{s.name}: cannot tell which command `{head}` runs ({line})")
                continue
            for value in values:
                value = value.strip('"')
                if "/" in value:
                    m = re.search(r"/bin/([A-Za-z0-9_.-]+)$", value)
                    if not m:
                        continue  # a program of the repository or one a script built
                    value = m.group(1)
                check_command(value, words[1:], s, line, need, have_cmd, have_tc,
                              have_comp, have_target, have_mod, base)
    return problems


Need = Callable[[bool, str, str], None]


def check_command(name: str, args: list[str], s: Script, line: str, need: Need,
                  have_cmd: set[str], have_tc: set[str], have_comp: set[tuple[str, str]],
                  have_target: set[tuple[str, str]], have_mod: set[str], base: Base) -> None:
    where = s.name
    if name in base.guarded:
        need(name in s.guarded, where, f"`{name}` without a `command -v {name}` test")
        return
    if name.startswith("python") or name == "pip3":
        if "-m" in args:
            mod = args[args.index("-m") + 1].strip('"')
            need(mod in have_mod, where, f"python module `{mod}` ({line})")
        if name in ("python", "python3") or re.fullmatch(r"python3(\.\d+)?", name):
            return
    need(name in have_cmd, where, f"command `{name}`")
    if name != "cargo":
        return
    tc = "stable"
    rest = [a.strip('"') for a in args]
    if rest and rest[0].startswith("+"):
        tc = toolchain_name(expand(rest[0], s)[0])
        rest = rest[1:]
        need(tc in have_tc, where, f"toolchain `{tc}` ({line})")
    if not rest:
        return
    sub = rest[0]
    if sub in COMPONENT_OF_SUBCOMMAND:
        comp = COMPONENT_OF_SUBCOMMAND[sub]
        need((tc, comp) in have_comp, where, f"component `{comp}` of toolchain `{tc}` ({line})")
    elif sub not in base.subcommands:
        need(f"cargo-{sub}" in have_cmd, where, f"`cargo {sub}` (binary cargo-{sub}) ({line})")
    for k, a in enumerate(rest):
        if a == "--target" and k + 1 < len(rest):
            need((tc, rest[k + 1]) in have_target, where,
                 f"target `{rest[k + 1]}` of toolchain `{tc}` ({line})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--list", action="store_true", help="print every tool found in use")
    args = parser.parse_args()
    seen: set[str] = set()
    problems = sorted(set(check(args.root, seen)))
    if args.list:
        for s in sorted(seen):
            print(f"uses {s}")
    for p in problems:
        print(f"tools-check: {p}", file=sys.stderr)
    if problems:
        print(f"tools-check: {len(problems)} tool(s) a fresh machine would not have",
              file=sys.stderr)
        return 1
    print("tools-check: every tool the Makefile, .ci/run and scripts/ call is on the base "
          "image or installed by a setup script")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks the user guide (docs/) and the repository's Markdown files.

Run by scripts/check-docs.sh after `mdbook build`; see that script for usage.
Checks, each of which fails the run with a message naming the file and line:

1. every relative link in README.md, the root *.md files and docs/**/*.md
   resolves to a file or directory, and every `#anchor` to a heading of its
   target. A book page's anchors are read from the HTML mdBook built (so they
   are exactly mdBook's); any other file's are computed from its headings
   with the same rule, which is checked against mdBook's output on every
   book page (so the rule cannot drift from the pinned mdBook unnoticed);
2. code blocks: `sh`/`bash` blocks parse with `bash -n`, `python` blocks
   compile, `yaml`, `toml` and `json` blocks parse;
3. the torchrun migration page: every long flag it names (and every short
   flag in its tables' first column) exists in `accel-agent --help`, except
   on a row marked "(added in this release)"; and every flag of
   `accel-agent --help` and of the given `torchrun --help` has a row of its
   own in one of its flag tables;
4. in sh/bash blocks everywhere, the long flags given to `accel-agent`,
   `rdzv-server [status]` and `accel SUBCOMMAND` exist in that binary's
   `--help` (the binaries are taken from accel-agent's directory);
5. README.md has at most 300 lines, and its section "The two commands" the
   run command and the test command exactly as tests and CI use them; a
   command that is a repository path is executable in git (mode 100755).

Only the standard library, plus PyYAML for yaml blocks (the test venv has it).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
from pathlib import Path

PENDING_MARK = "(added in this release)"
TORCHRUN_PAGE = "docs/src/migrating-from-torchrun.md"

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target); the target may be <...> and may carry a title.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ID = re.compile(r'<h[1-6] id="([^"]+)"')
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def error(self, path: Path, line: int, msg: str) -> None:
        self.errors.append(f"{path}:{line}: {msg}")

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def split_blocks(text: str):
    """Yields ("text", lineno, line) for prose lines and ("code", lineno, lang, body)
    for each fenced code block (lineno: the opening fence's line, 1-based)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            yield ("text", i + 1, lines[i])
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 1
        body = []
        i += 1
        while i < len(lines):
            close = re.match(r"^ {0,3}(" + re.escape(fence[0]) + r"{" + str(len(fence)) + r",})\s*$", lines[i])
            if close:
                break
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence (or the end of the file)
        yield ("code", start, lang, "\n".join(body) + "\n")


def expand_includes(path: Path, text: str, depth: int = 0) -> str:
    """mdBook's {{#include FILE}}: the file's text in place (relative to `path`)."""
    if depth > 5:
        return text

    def sub(m: re.Match) -> str:
        target = (path.parent / m.group(1)).resolve()
        return expand_includes(target, target.read_text(encoding="utf-8"), depth + 1)

    return INCLUDE.sub(sub, text)


def heading_text(raw: str) -> str:
    """The visible text of a heading's Markdown, as mdBook renders it."""
    s = INLINE_CODE.sub(lambda m: m.group(2).strip(), raw)
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)  # links: their text
    s = re.sub(r"<[^>]+>", "", s)  # inline HTML tags
    s = s.replace("**", "").replace("*", "")
    return html.unescape(s)


def slug(text: str) -> str:
    """mdBook's (and GitHub's) heading id: lower case; letters, digits, `-` and `_`
    kept; whitespace becomes `-`; everything else dropped."""
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def computed_anchors(path: Path) -> list[str]:
    text = expand_includes(path, path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    ids = []
    for kind, _, *rest in split_blocks(text):
        if kind != "text":
            continue
        m = HEADING.match(rest[0])
        if not m:
            continue
        base = slug(heading_text(m.group(2)))
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.append(base if n == 0 else f"{base}-{n}")
    return ids


def book_pages(root: Path) -> set[Path]:
    summary = root / "docs/src/SUMMARY.md"
    pages = set()
    for m in LINK.finditer(summary.read_text(encoding="utf-8")):
        if m.group(1):
            pages.add((summary.parent / m.group(1)).resolve())
    return pages


def check_anchor_rule(root: Path, book: Path, pages: set[Path], rep: Report) -> dict[Path, set[str]]:
    """Reads each book page's heading ids from the built HTML and checks that the
    computed rule gives the same list."""
    anchors = {}
    src = (root / "docs/src").resolve()
    for page in sorted(pages):
        html_file = book / page.relative_to(src).with_suffix(".html")
        if not html_file.exists():
            rep.error(page.relative_to(root), 1, f"mdBook wrote no {html_file.name} for this page")
            continue
        built = HTML_ID.findall(html_file.read_text(encoding="utf-8"))
        ours = computed_anchors(page)
        if built != ours:
            rep.error(page.relative_to(root), 1,
                      f"heading ids differ from mdBook's: computed {ours}, mdBook {built}; "
                      "fix slug() in scripts/check_docs.py")
        anchors[page] = set(built)
        rep.count("book pages")
    return anchors


def check_links(root: Path, files: list[Path], book_anchors: dict[Path, set[str]], rep: Report) -> None:
    cache: dict[Path, set[str]] = dict(book_anchors)

    def anchors_of(target: Path) -> set[str]:
        if target not in cache:
            cache[target] = set(computed_anchors(target))
        return cache[target]

    for path in files:
        rel = path.relative_to(root)
        for kind, lineno, *rest in split_blocks(path.read_text(encoding="utf-8")):
            if kind != "text":
                continue
            line = INLINE_CODE.sub("", rest[0])
            targets = [m.group(1) for m in LINK.finditer(line)]
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
            for t in targets:
                if not t or re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I):
                    continue  # absolute URLs (http:, mailto:) are not checked here
                rep.count("links")
                file_part, _, anchor = t.partition("#")
                target = (path.parent / file_part).resolve() if file_part else path.resolve()
                if not target.exists():
                    rep.error(rel, lineno, f"broken link: {t} ({file_part} does not exist)")
                    continue
                if not anchor:
                    continue
                if target.suffix != ".md":
                    rep.error(rel, lineno, f"anchor on a file that is not Markdown: {t}")
                    continue
                if anchor not in anchors_of(target):
                    known = ", ".join(sorted(anchors_of(target)))
                    rep.error(rel, lineno, f"broken anchor: {t} (no heading #{anchor} in "
                              f"{target.relative_to(root)}; its anchors: {known})")


def check_code(root: Path, files: list[Path], rep: Report) -> None:
    try:
        import yaml  # noqa: PLC0415 (only needed for yaml blocks)
    except ImportError:
        yaml = None
    for path in files:
        rel = path.relative_to(root)
        for kind, lineno, *rest in split_blocks(path.read_text(encoding="utf-8")):
            if kind != "code":
                continue
            lang, body = rest
            try:
                if lang in ("sh", "bash", "shell"):
                    r = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True)
                    if r.returncode != 0:
                        raise ValueError(r.stderr.strip().replace("bash: ", ""))
                elif lang in ("yaml", "yml"):
                    if yaml is None:
                        raise ValueError("a yaml block, and PyYAML is not importable: run with the "
                                         "test venv's python3 (scripts/setup.sh)")
                    list(yaml.safe_load_all(body))
                elif lang == "toml":
                    import tomllib  # noqa: PLC0415 (Python 3.11+; only for toml blocks)

                    tomllib.loads(body)
                elif lang == "json":
                    json.loads(body)
                elif lang == "python":
                    compile(body, f"{rel}:{lineno}", "exec")
                else:
                    continue
            except Exception as e:  # noqa: BLE001 (any parse error is the finding)
                rep.error(rel, lineno, f"{lang} block does not parse: " + " ".join(str(e).split()))
                continue
            rep.count(f"{lang} blocks")


def option_flags(help_text_line: str) -> list[str]:
    return re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9_-]*|-[a-zA-Z0-9])(?![\w-])", help_text_line)


def parse_help(cmd: list[str]) -> set[str]:
    """The flags an argparse or clap `--help` lists: only the option column of
    each option line, so flags named in descriptions do not count."""
    out = subprocess.run(cmd + ["--help"], text=True, capture_output=True, check=True).stdout
    flags = set()
    for line in out.splitlines():
        stripped = line.lstrip()
        if not stripped.startswith("-") or len(line) - len(stripped) > 8:
            continue
        column = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
        for f in option_flags(column):
            flags.add(f.replace("_", "-") if f.startswith("--") else f)
    return flags


COMMANDS = {"accel-agent", "rdzv-server", "accel"}


def check_command_lines(root: Path, files: list[Path], bin_dir: Path, rep: Report) -> None:
    """In sh/bash blocks, the long flags given to accel-agent, rdzv-server [status]
    and accel SUBCOMMAND must be flags of that binary (its `--help`). A command's
    flags end at its script (`*.py`) or module (`-m`); what follows is the script's."""
    helps: dict[tuple[str, ...], set[str]] = {}

    def flags_of(cmd: tuple[str, ...]) -> set[str]:
        if cmd not in helps:
            helps[cmd] = parse_help([str(bin_dir / cmd[0]), *cmd[1:]])
        return helps[cmd]

    for path in files:
        rel = path.relative_to(root)
        for kind, lineno, *rest in split_blocks(path.read_text(encoding="utf-8")):
            if kind != "code" or rest[0] not in ("sh", "bash", "shell"):
                continue
            logical = rest[1].replace("\\\n", " ").split("\n")
            for line in logical:
                line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
                tokens = line.split()
                for i, tok in enumerate(tokens):
                    if tok.rsplit("/", 1)[-1] not in COMMANDS:
                        continue
                    cmd: tuple[str, ...] = (tok.rsplit("/", 1)[-1],)
                    args = tokens[i + 1:]
                    if cmd[0] == "accel" or (args[:1] == ["status"] and cmd[0] == "rdzv-server"):
                        if not args or args[0].startswith("-"):
                            continue
                        cmd, args = (*cmd, args[0]), args[1:]
                    for arg in args:
                        if arg == "--":
                            continue  # cargo run ... -- FLAGS: the end of cargo's own
                        if arg in ("|", "&&", ";", ">", "||") or arg.endswith(".py"):
                            break
                        if not arg.startswith("--"):
                            if arg in ("-m",):
                                break
                            continue
                        flag = arg.split("=", 1)[0].replace("_", "-")
                        rep.count("command-line flags in code blocks")
                        if flag not in flags_of(cmd):
                            rep.error(rel, lineno, f"`{' '.join(cmd)}` has no flag {flag} "
                                      f"(not in `{' '.join(cmd)} --help`)")


def check_torchrun_page(root: Path, agent: str, torchrun: str | None, rep: Report) -> None:
    page = root / TORCHRUN_PAGE
    agent_flags = parse_help([agent])
    if "--nproc-per-node" not in agent_flags:
        rep.error(Path(agent), 1, "accel-agent --help lists no --nproc-per-node: not the agent?")
        return
    # flags in the first cell of a row of a flag table (its header's first cell
    # is "flag" or "torchrun flag"), not of other tables that name flags
    rows: set[str] = set()
    header: str | None = None  # the current table's first header cell
    for kind, lineno, *rest in split_blocks(page.read_text(encoding="utf-8")):
        texts = rest[1].split("\n") if kind == "code" else [rest[0]]
        for k, line in enumerate(texts):
            n = lineno + k + (1 if kind == "code" else 0)
            if line.lstrip().startswith("<!--"):
                continue
            if kind == "code":
                # a command line's flags end at its script: what follows is the script's
                line = re.split(r"\s\S+\.py(?=\s|$)", line, maxsplit=1)[0]
            pending = PENDING_MARK in line
            long_flags = [f.replace("_", "-") for f in re.findall(r"(?<![\w/#-])(--[a-z][a-z0-9_-]*[a-z0-9])", line)]
            cells = line.split("|")
            first = cells[1] if kind == "text" and line.lstrip().startswith("|") and len(cells) > 2 else ""
            if not first:
                header = None
            elif header is None:
                header = first.strip()
            short = re.findall(r"`(-[a-zA-Z])`", first)
            if header in ("flag", "torchrun flag"):
                for f in re.findall(r"`(--[a-z][a-z0-9_-]*)`", first) + short:
                    rows.add(f.replace("_", "-") if f.startswith("--") else f)
            for f in long_flags + short:
                rep.count("torchrun page flag mentions")
                if f not in agent_flags and not pending:
                    rep.error(page.relative_to(root), n,
                              f"{f} is not a flag of accel-agent (not in `accel-agent --help`); "
                              f"mark its row {PENDING_MARK!r} if another change adds it")
    for f in sorted(agent_flags - {"--help", "-h", "--version", "-V"}):
        rep.count("agent flags with a row")
        if f not in rows:
            rep.error(page.relative_to(root), 1,
                      f"accel-agent's {f} (from `accel-agent --help`) has no row in a flag table")
    if torchrun:
        tr_flags = parse_help([torchrun]) - {"--help", "-h"}
        if "--nproc-per-node" not in tr_flags:
            rep.error(Path(torchrun), 1, "torchrun --help lists no --nproc-per-node: not torchrun?")
            return
        for f in sorted(tr_flags):
            rep.count("torchrun flags with a row")
            if f not in rows:
                rep.error(page.relative_to(root), 1,
                          f"torchrun's {f} (from `torchrun --help`) has no row in the flag table")


README_MAX_LINES = 300
# The README's two commands: tests, CI and other changes run them as written.
RUN_COMMAND = "cargo run --release --bin accel-agent -- --nproc-per-node 4 examples/hello.py"
TEST_COMMAND = "scripts/test.sh"


def check_readme(root: Path, rep: Report) -> None:
    text = (root / "README.md").read_text(encoding="utf-8")
    n = len(text.splitlines())
    if n > README_MAX_LINES:
        rep.error(Path("README.md"), n, f"{n} lines: the front page stays within {README_MAX_LINES}; "
                  "move the detail into docs/")
    section = text.split("\n## The two commands\n", 1)
    blocks = [b for k, _, *b in split_blocks(section[1].split("\n## ", 1)[0]) if k == "code"] if len(section) == 2 else []
    bodies = [body.strip() for _, body in blocks]
    if bodies[:2] != [RUN_COMMAND, TEST_COMMAND]:
        rep.error(Path("README.md"), 1, "section '## The two commands' must hold exactly the run "
                  f"command ({RUN_COMMAND}) and the test command ({TEST_COMMAND}), each in its own block")
    # Typed as written, a command that is a path in the repository runs only
    # with its run bit, and the bit that counts is git's (a fresh clone's).
    for body in bodies[:2]:
        word = body.split()[0]
        if "/" not in word or word.startswith(("/", "-")):
            continue
        staged = subprocess.run(["git", "-C", str(root), "ls-files", "-s", "--", word],
                                capture_output=True, text=True).stdout.split()
        if not staged:
            rep.error(Path("README.md"), 1, f"'{word}', a command of section '## The two commands', "
                      "is not a file in git: add it, or fix the command")
        elif staged[0] != "100755":
            rep.error(Path("README.md"), 1, f"'{word}', a command of section '## The two commands', "
                      f"has mode {staged[0]} in git, so typing it fails with 'Permission denied': "
                      f"git update-index --chmod=+x {word}")
    rep.count("README checks", 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--book", type=Path, required=True, help="the directory mdbook built into")
    ap.add_argument("--agent", required=True, help="the accel-agent binary")
    ap.add_argument("--torchrun", help="the pinned torchrun (its flags must all have a row)")
    a = ap.parse_args()
    root = a.root.resolve()
    rep = Report()

    files = sorted(p for p in root.glob("*.md"))
    files += sorted(p for p in (root / "docs").rglob("*.md") if "book" not in p.relative_to(root / "docs").parts[:1])
    pages = book_pages(root)
    for p in sorted((root / "docs/src").rglob("*.md")):
        if p.name != "SUMMARY.md" and p.resolve() not in pages:
            rep.error(p.relative_to(root), 1, "not in docs/src/SUMMARY.md, so not in the book")

    book_anchors = check_anchor_rule(root, a.book, pages, rep)
    check_links(root, files, book_anchors, rep)
    check_code(root, files, rep)
    check_readme(root, rep)
    check_command_lines(root, files, Path(a.agent).parent, rep)
    check_torchrun_page(root, a.agent, a.torchrun, rep)

    for e in rep.errors:
        print(f"check-docs: {e}", file=sys.stderr)
    summary = ", ".join(f"{n} {what}" for what, n in sorted(rep.counts.items()))
    print(f"check-docs: {len(files)} files; checked {summary}", flush=True)
    if rep.errors:
        print(f"check-docs: FAILED: {len(rep.errors)} problem(s)", file=sys.stderr)
        return 1
    print("check-docs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

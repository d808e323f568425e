"""``search``: lines matching a text or regex in the workspace's text files.

The pattern is literal text unless ``regex`` is true: models often search for
code like ``foo(`` and a regex default would turn that into an error. Binary
files and files over the read cap are skipped (and counted in a note), so a
search through a checkout with build artefacts stays useful.

A regex runs on RE2 (``google-re2``), which guarantees time linear in the
line's length, not on ``re``: ``re`` backtracks, so ``(a+)+$`` on 30 ``a``s
and a ``!`` ran for a minute, and because ``re`` holds the GIL while it
matches, that worker thread froze the event loop, every other session and the
tool timeout with it. Measured here: that line takes 0.16 ms in
RE2 (a 1 MB line 0.8 ms); an ordinary line costs ~4.5 µs per search against
~0.5 µs in ``re``. The alternative, matching in a child process killed at the
timeout, keeps ``re``'s syntax but costs ~30 ms to start a Python per call
(a pool instead must be rebuilt after every kill) and ships every line across
a pipe. What RE2 gives up is backreferences and lookaround; the model is told
so when it uses them. Literal patterns stay on ``re`` (an escaped literal
cannot backtrack).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
import re2

from tools.base import Limits, Tool, ToolContext, ToolFailure
from tools.globs import compile_glob
from tools.sandbox import display, is_binary, open_regular, resolve, walk, workspace_root

from ._fs import Stop, in_thread

__all__ = ["SearchArgs", "SearchTool"]


class SearchArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pattern: Annotated[str, msgspec.Meta(min_length=1, description="text to look for")]
    path: Annotated[
        str, msgspec.Meta(description="file or directory to search, relative to the workspace root")
    ] = "."
    glob: Annotated[
        str | None,
        msgspec.Meta(
            description="only search files matching this glob: '*.py' matches file names at "
            "any depth; a pattern with '/' matches paths relative to path"
        ),
    ] = None
    regex: Annotated[
        bool,
        msgspec.Meta(
            description="treat pattern as a regular expression (RE2 syntax: no backreferences "
            "or lookaround)"
        ),
    ] = False
    ignore_case: bool = False


class SearchTool(Tool[SearchArgs]):
    name = "search"
    description = (
        "Search text files for lines containing a pattern (literal text, or a regex "
        "with regex=true). Returns matches as 'path:line:text', paths relative to the "
        "workspace root."
    )
    args_type = SearchArgs

    async def run(self, args: SearchArgs, ctx: ToolContext) -> Any:
        return await in_thread(_search, ctx.workspace, args, ctx.limits)


def _search(stop: Stop, workspace: Path, args: SearchArgs, limits: Limits) -> dict[str, Any]:
    root = workspace_root(workspace)
    top = resolve(root, args.path)
    if not top.exists():
        raise ToolFailure(
            f"cannot search {args.path!r}: no such file or directory; use list to see what exists"
        )
    needle = _compile(args.pattern, regex=args.regex, ignore_case=args.ignore_case)
    wanted = _file_filter(args.glob)

    matches: list[str] = []
    skipped = 0
    truncated = False
    for path in walk(root, top):
        if stop.is_set() or truncated:
            break
        rel_to_top = path.name if path == top else path.relative_to(top).as_posix()
        if wanted is not None and not wanted(rel_to_top):
            continue
        try:
            # Through the link's resolved target (checked inside by walk), opened
            # component by component, so a link swapped meanwhile is not followed.
            real = path.resolve() if path.is_symlink() else path
            fd, st = open_regular(root, real, os.O_RDONLY)
        except (OSError, ValueError, ToolFailure):
            continue  # unreadable, vanished, not a regular file or raced outside: skip it
        try:
            with os.fdopen(fd, encoding="utf-8", errors="replace", newline="") as f:
                if st.st_size > limits.max_read_bytes:
                    skipped += 1
                    continue
                if is_binary(fd):
                    continue
                shown = display(root, path)
                for number, line in enumerate(f, start=1):
                    if stop.is_set():  # the call ended (timeout, cancel): a line at a time
                        break
                    # Without its line ending, so "$" means end of line in RE2 as in grep.
                    line = line.rstrip("\r\n")
                    if needle(line):
                        if len(matches) == limits.max_matches:
                            truncated = True
                            break
                        text = line[: limits.max_line_chars]
                        matches.append(f"{shown}:{number}:{text}")
        except OSError:
            continue  # unreadable or vanished: skip it, as grep -s does

    result: dict[str, Any] = {"matches": matches}
    notes = []
    if truncated:
        notes.append(
            f"stopped after {limits.max_matches:,} matches; narrow the pattern, path or glob"
        )
    if skipped:
        notes.append(
            f"skipped {skipped:,} file(s) over {limits.max_read_bytes:,} bytes; "
            "read them in ranges with read offset/limit"
        )
    if notes:
        result["note"] = "; ".join(notes)
    return result


def _compile(pattern: str, *, regex: bool, ignore_case: bool) -> Callable[[str], object]:
    """A "does this line match" function: RE2 for a regex, ``re`` for literal text."""
    if not regex:
        literal = re.compile(re.escape(pattern), re.IGNORECASE if ignore_case else 0)
        return literal.search
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False  # the model gets the error; stderr does not need it
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ToolFailure(
            f"invalid regex {pattern!r}: {reason}; fix it (RE2 syntax: no backreferences or "
            "lookaround), or pass regex=false to search for the text as written"
        ) from None
    if compiled.programsize > MAX_PROGRAM:
        raise ToolFailure(
            f"regex {pattern[:200]!r} is too complex ({compiled.programsize:,} steps in RE2's "
            f"program, at most {MAX_PROGRAM:,}): simplify it, e.g. fewer or smaller repeats"
        )
    search: Callable[[str], object] = compiled.search
    return search


MAX_PROGRAM = 1_000
"""RE2 program size a regex may have. Linear time is linear in the line times the
program: ``(.*a){1000}`` (11,005) outgrew RE2's DFA memory and took 2.2 s per 64 KB
line in its NFA (25 s a MB), and eight such searches held every tool thread for
minutes. An ordinary pattern is under 100; at 1,000 a MB line is ~1 s at worst."""


def _file_filter(glob: str | None) -> Callable[[str], bool] | None:
    """A predicate on paths relative to the search root, or None for "every file"."""
    if glob is None or not glob.strip():
        return None
    try:
        matcher = compile_glob(glob)
    except re.error as exc:
        raise ToolFailure(f"invalid glob {glob!r}: {exc}; fix the pattern") from None
    if "/" in glob.strip("/"):
        return matcher.matches
    return lambda rel: matcher.matches(rel.rsplit("/", 1)[-1])

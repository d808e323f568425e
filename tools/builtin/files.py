"""``read``, ``write`` and ``edit``: the tools that open one file by path.

``edit`` is an exact string replacement rather than a line-number patch:
line numbers go stale as soon as a file changes, while "replace this exact
text" either applies to the text the model just read or fails saying why.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any, Final, TextIO

import msgspec

from tools.base import Limits, Tool, ToolContext, ToolFailure
from tools.quota import reserve
from tools.sandbox import display, is_binary, open_regular, resolve, workspace_root

from ._fs import Stop, decode_text, in_thread, os_errors, read_whole, write_whole

__all__ = ["EditArgs", "EditTool", "ReadArgs", "ReadTool", "WriteArgs", "WriteTool"]

_SKIP_CHUNK: Final = 65_536
"""Characters read at a time while skipping the unshown rest of a long line."""

_Path = Annotated[str, msgspec.Meta(description="file path relative to the workspace root")]


class ReadArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: _Path
    offset: Annotated[int, msgspec.Meta(ge=1, description="first line to return (1-based)")] = 1
    limit: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="how many lines to return (default: all)"),
    ] = None


class ReadTool(Tool[ReadArgs]):
    name = "read"
    description = (
        "Read a UTF-8 text file. Returns its text; pass offset/limit to read a range "
        "of lines (needed for files over the size limit)."
    )
    args_type = ReadArgs

    async def run(self, args: ReadArgs, ctx: ToolContext) -> Any:
        return await in_thread(_read, ctx.workspace, args, ctx.limits)


def _read(stop: Stop, workspace: Path, args: ReadArgs, limits: Limits) -> str:
    root = workspace_root(workspace)
    path = resolve(root, args.path)
    with os_errors("read", args.path):
        fd, st = open_regular(root, path, os.O_RDONLY)
        # newline="" keeps "\r\n" as written, so text copied into edit's "old" matches.
        with os.fdopen(fd, encoding="utf-8", errors="replace", newline="") as f:
            size = st.st_size
            if is_binary(fd):
                raise ToolFailure(
                    f"cannot read {args.path!r}: it is a binary file ({size:,} bytes); "
                    "read only returns text files"
                )
            if size > limits.max_read_bytes and args.limit is None:
                raise ToolFailure(
                    f"cannot read {args.path!r} whole: it is {size:,} bytes, over the "
                    f"{limits.max_read_bytes:,}-byte limit; pass offset and limit to read a "
                    "range of lines, or use search to find the lines you need"
                )
            start = args.offset - 1
            cut_line: int | None = None
            if size <= limits.max_read_bytes:
                lines = f.readlines()
                total: int | None = len(lines)
                chosen = lines[start : None if args.limit is None else start + args.limit]
            else:  # a range of a big file: stream to it, never holding more than the cap
                assert args.limit is not None
                chosen, cut_line, at_end = _read_range(f, start, args.limit, limits.max_read_bytes)
                total = start + len(chosen) if at_end else None
    if total == 0:
        return ""
    if not chosen:
        has = f", which has {total} lines" if total is not None else ""
        raise ToolFailure(
            f"offset {args.offset} is past the end of {args.path!r}{has}; use a smaller offset"
        )
    text = "".join(chosen)
    last = args.offset + len(chosen) - 1
    if cut_line is not None:
        text += (
            f"\n[line {cut_line} is cut after {len(chosen[-1]):,} characters: read returns at "
            f"most {limits.max_read_bytes:,} characters per call and cannot show the rest of "
            "this line; use search to find text in it]"
        )
    if args.offset == 1 and last == total:
        return text
    sep = "" if text.endswith(("\n", "\r")) else "\n"
    if total is None or last < total:
        of = f" of {total}" if total is not None else ""
        return f"{text}{sep}[lines {args.offset}-{last}{of}; pass offset={last + 1} to read on]"
    return f"{text}{sep}[lines {args.offset}-{last} of {total}]"


def _read_range(
    f: TextIO, start: int, limit: int, budget: int
) -> tuple[list[str], int | None, bool]:
    """Lines ``start``.. (0-based, at most ``limit``, at most ``budget`` characters in all).

    Returns the lines, the 1-based number of a line cut short (its first
    characters are kept; the rest is skipped in chunks, never held whole: a
    50 MB single-line file once took 2.3 GB of RSS), and whether the file ended.
    """
    for _ in range(start):
        if _next_line(f, 1) is None:
            return [], None, True
    chosen: list[str] = []
    used = 0
    while len(chosen) < limit and used < budget:
        got = _next_line(f, budget - used)
        if got is None:
            return chosen, None, True
        line, was_cut = got
        chosen.append(line)
        used += len(line)
        if was_cut:
            return chosen, start + len(chosen), not f.read(1)
    return chosen, None, not f.read(1)


def _next_line(f: TextIO, keep: int) -> tuple[str, bool] | None:
    """The next line's first ``keep`` characters and whether it had more; None at the end."""
    head = f.readline(keep)
    if not head:
        return None
    if head.endswith(("\n", "\r")) or len(head) < keep:
        return head, False
    was_cut = False
    while rest := f.readline(_SKIP_CHUNK):
        was_cut = True
        if rest.endswith(("\n", "\r")):
            break
    return head, was_cut


class WriteArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: _Path
    content: Annotated[str, msgspec.Meta(description="the complete new file content")]


class WriteTool(Tool[WriteArgs]):
    name = "write"
    description = (
        "Create or overwrite a file with the given content (UTF-8); missing parent "
        "directories are created. Returns the number of bytes written."
    )
    args_type = WriteArgs
    journaled = True

    async def run(self, args: WriteArgs, ctx: ToolContext) -> Any:
        return await in_thread(_write, ctx.workspace, args, ctx.limits)


def _write(stop: Stop, workspace: Path, args: WriteArgs, limits: Limits) -> dict[str, Any]:
    root = workspace_root(workspace)
    path = resolve(root, args.path)
    if path == root or path.is_dir():
        raise ToolFailure(
            f"cannot write {args.path!r}: it is a directory; give the path of a file in it"
        )
    # A character is at least one byte: a too-long string is refused before encoding it.
    if len(args.content) > limits.max_write_bytes or (
        len(data := args.content.encode("utf-8")) > limits.max_write_bytes
    ):
        raise ToolFailure(
            f"cannot write {args.path!r}: the content is over the {limits.max_write_bytes:,}-byte "
            "limit for one file; split it into several smaller files"
        )
    with (
        os_errors("write", args.path),
        reserve(
            root,
            limits,
            old_size=_size_if_file(path),
            new_size=len(data),
            what=f"write {args.path!r}",
            new_dirs=_missing_dirs(root, path),
        ),
    ):
        fd, _ = open_regular(
            root, path, os.O_WRONLY | os.O_CREAT, make_parents=True, for_writing=True
        )
        try:
            write_whole(fd, data)
        finally:
            os.close(fd)
    return {"path": display(root, path), "bytes_written": len(data)}


def _size_if_file(path: Path) -> int | None:
    """The size of what is at ``path`` (not followed if a symlink: 0), None if nothing."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _missing_dirs(root: Path, path: Path) -> int:
    """The directories ``write`` makes for ``path`` (its parents not there yet)."""
    missing, parent = 0, path.parent
    while parent != root and root in parent.parents and not os.path.lexists(parent):
        missing, parent = missing + 1, parent.parent
    return missing


class EditArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: _Path
    old: Annotated[str, msgspec.Meta(description="exact text to replace, including whitespace")]
    new: Annotated[str, msgspec.Meta(description="text to put in its place")]
    replace_all: Annotated[
        bool, msgspec.Meta(description="replace every occurrence instead of exactly one")
    ] = False


class EditTool(Tool[EditArgs]):
    name = "edit"
    description = (
        "Replace exact text in a UTF-8 file. 'old' must occur exactly once unless "
        "replace_all is true. Returns how many replacements were made."
    )
    args_type = EditArgs
    journaled = True

    async def run(self, args: EditArgs, ctx: ToolContext) -> Any:
        return await in_thread(_edit, ctx.workspace, args, ctx.limits)


def _edit(stop: Stop, workspace: Path, args: EditArgs, limits: Limits) -> dict[str, Any]:
    if not args.old:
        raise ToolFailure(
            "'old' is empty; give the exact text to replace (to create a file, use write)"
        )
    if args.old == args.new:
        raise ToolFailure("'old' and 'new' are the same, so there is nothing to change")
    root = workspace_root(workspace)
    path = resolve(root, args.path)
    with os_errors("edit", args.path):
        fd, st = open_regular(root, path, os.O_RDWR, for_writing=True)
        try:
            return _edit_open_file(fd, st.st_size, root, path, args, limits)
        finally:
            os.close(fd)


def _edit_open_file(
    fd: int, size: int, root: Path, path: Path, args: EditArgs, limits: Limits
) -> dict[str, Any]:
    if size > limits.max_read_bytes:
        raise ToolFailure(
            f"cannot edit {args.path!r}: it is {size:,} bytes, over the "
            f"{limits.max_read_bytes:,}-byte limit for this tool"
        )
    data = read_whole(fd, size)
    text = decode_text(data, args.path, "edit")
    count = text.count(args.old)
    if count == 0:
        raise ToolFailure(
            f"'old' was not found in {args.path!r}; read the file and copy the text exactly, "
            "including whitespace and indentation"
        )
    if count > 1 and not args.replace_all:
        raise ToolFailure(
            f"'old' occurs {count} times in {args.path!r}; include more surrounding text so it "
            "occurs once, or pass replace_all=true to replace every occurrence"
        )
    # The result's size from the counts, before building it: one replace_all once
    # turned 110 kB of model output into a 1 GB file and 1.95 GB of RSS.
    growth = len(args.new.encode("utf-8")) - len(args.old.encode("utf-8"))
    new_size = len(data) + count * growth
    if new_size > limits.max_write_bytes:
        raise ToolFailure(
            f"cannot edit {args.path!r}: replacing {count:,} occurrence(s) would make it "
            f"{new_size:,} bytes, over the {limits.max_write_bytes:,}-byte limit for one file; "
            "replace fewer occurrences or with shorter text"
        )
    with reserve(root, limits, old_size=len(data), new_size=new_size, what=f"edit {args.path!r}"):
        write_whole(fd, text.replace(args.old, args.new).encode("utf-8"))
    return {"path": display(root, path), "replacements": count}

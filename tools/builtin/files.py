"""``read``, ``write`` and ``edit``: the tools that open one file by path.

``edit`` is an exact string replacement rather than a line-number patch:
line numbers go stale as soon as a file changes, while "replace this exact
text" either applies to the text the model just read or fails saying why.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any

import msgspec

from tools.base import Limits, Tool, ToolContext, ToolFailure
from tools.sandbox import display, is_binary, resolve, workspace_root

from ._fs import Stop, in_thread, os_errors, read_text_file, require_file

__all__ = ["EditArgs", "EditTool", "ReadArgs", "ReadTool", "WriteArgs", "WriteTool"]

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
    size = require_file(path, args.path, "read")
    with os_errors("read", args.path):
        if is_binary(path):
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
        # newline="" keeps "\r\n" as written, so text copied into edit's "old" matches.
        with path.open(encoding="utf-8", errors="replace", newline="") as f:
            start = args.offset - 1
            stop_at = None if args.limit is None else start + args.limit
            if size <= limits.max_read_bytes:
                lines = f.readlines()
                total: int | None = len(lines)
                chosen = lines[start:stop_at]
            else:  # a range of a big file: stream to it instead of loading it all
                chosen = list(itertools.islice(f, start, stop_at))
                more = not chosen or bool(f.readline())
                total = None if more else start + len(chosen)
    if total == 0:
        return ""
    if not chosen:
        has = f", which has {total} lines" if total is not None else ""
        raise ToolFailure(
            f"offset {args.offset} is past the end of {args.path!r}{has}; use a smaller offset"
        )
    text = "".join(chosen)
    last = args.offset + len(chosen) - 1
    if args.offset == 1 and last == total:
        return text
    sep = "" if text.endswith(("\n", "\r")) else "\n"
    if total is None or last < total:
        of = f" of {total}" if total is not None else ""
        return f"{text}{sep}[lines {args.offset}-{last}{of}; pass offset={last + 1} to read on]"
    return f"{text}{sep}[lines {args.offset}-{last} of {total}]"


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

    async def run(self, args: WriteArgs, ctx: ToolContext) -> Any:
        return await in_thread(_write, ctx.workspace, args)


def _write(stop: Stop, workspace: Path, args: WriteArgs) -> dict[str, Any]:
    root = workspace_root(workspace)
    path = resolve(root, args.path)
    if path == root or path.is_dir():
        raise ToolFailure(
            f"cannot write {args.path!r}: it is a directory; give the path of a file in it"
        )
    data = args.content.encode("utf-8")
    with os_errors("write", args.path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return {"path": display(root, path), "bytes_written": len(data)}


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
    text = read_text_file(path, args.path, "edit", limits)
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
    updated = (
        text.replace(args.old, args.new)
        if args.replace_all
        else text.replace(args.old, args.new, 1)
    )
    with os_errors("edit", args.path):
        path.write_bytes(updated.encode("utf-8"))
    return {"path": display(root, path), "replacements": count}

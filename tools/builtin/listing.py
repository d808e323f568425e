"""``list`` and ``find``: what is in the workspace, without reading file contents.

Both return paths relative to the workspace root, so any path they report can
be passed to ``read`` or ``edit`` as is, and both stop at a cap and say so,
because a ``node_modules`` listing would otherwise fill the model's context.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import msgspec

from tools.base import Limits, Tool, ToolContext, ToolFailure
from tools.globs import compile_glob
from tools.sandbox import display, entry_inside, resolve, walk, workspace_root

from ._fs import Stop, in_thread, os_errors

__all__ = ["FindArgs", "FindTool", "ListArgs", "ListTool"]


class ListArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(description="directory relative to the workspace root")] = "."


class ListTool(Tool[ListArgs]):
    name = "list"
    description = (
        "List a directory: each entry's name, type (file or dir) and size in bytes, "
        "sorted by name. Not recursive; use find for that."
    )
    args_type = ListArgs

    async def run(self, args: ListArgs, ctx: ToolContext) -> Any:
        return await in_thread(_list, ctx.workspace, args, ctx.limits)


def _list(stop: Stop, workspace: Path, args: ListArgs, limits: Limits) -> dict[str, Any]:
    root = workspace_root(workspace)
    path = resolve(root, args.path)
    if path.is_file():
        raise ToolFailure(f"{args.path!r} is a file, not a directory; use read to see its contents")
    with os_errors("list", args.path), os.scandir(path) as it:
        entries = sorted((e for e in it if entry_inside(root, e)), key=lambda e: e.name)
    listed: list[dict[str, Any]] = []
    for entry in entries[: limits.max_entries]:
        try:
            if entry.is_dir():
                listed.append({"name": entry.name, "type": "dir"})
            elif entry.is_file():
                listed.append({"name": entry.name, "type": "file", "size": entry.stat().st_size})
            else:
                listed.append({"name": entry.name, "type": "other"})
        except OSError:
            continue  # vanished (or a dangling link) between scandir and stat
    result: dict[str, Any] = {"path": display(root, path), "entries": listed}
    if len(entries) > limits.max_entries:
        result["note"] = (
            f"showing the first {limits.max_entries:,} of {len(entries):,} entries; "
            "list a subdirectory or use find with a pattern to narrow it"
        )
    return result


class FindArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pattern: Annotated[
        str,
        msgspec.Meta(
            description="glob relative to path, e.g. '**/*.py' (any depth) or '*.md' (top level)"
        ),
    ]
    path: Annotated[
        str, msgspec.Meta(description="directory to search in, relative to the workspace root")
    ] = "."


class FindTool(Tool[FindArgs]):
    name = "find"
    description = (
        "Find files whose path (relative to 'path') matches a glob pattern; '**' "
        "matches any number of directories. Returns workspace-relative file paths."
    )
    args_type = FindArgs

    async def run(self, args: FindArgs, ctx: ToolContext) -> Any:
        return await in_thread(_find, ctx.workspace, args, ctx.limits)


def _find(stop: Stop, workspace: Path, args: FindArgs, limits: Limits) -> dict[str, Any]:
    root = workspace_root(workspace)
    top = resolve(root, args.path)
    if not top.is_dir():
        raise ToolFailure(
            f"{args.path!r} is not a directory in the workspace; give a directory to search in"
        )
    try:
        matcher = compile_glob(args.pattern)
    except re.error as exc:
        raise ToolFailure(
            f"invalid glob pattern {args.pattern!r}: {exc}; fix the pattern"
        ) from None
    files: list[str] = []
    truncated = False
    for path in walk(root, top):
        if stop.is_set():
            break
        if matcher.matches(path.relative_to(top).as_posix()):
            if len(files) == limits.max_entries:
                truncated = True
                break
            files.append(display(root, path))
    result: dict[str, Any] = {"files": files}
    if truncated:
        result["note"] = (
            f"stopped after {limits.max_entries:,} files; use a narrower pattern or path"
        )
    return result

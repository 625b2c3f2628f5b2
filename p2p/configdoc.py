"""The documentation of a config dataclass, read from its own source.

Every config class (`AgentConfig`, `SwarmConfig`, `TrackerConfig`) documents
its fields where they are declared: a comment at the end of the field's line
(continued on lines whose text is indented after the `#`), or a block of
comment lines just above the field. This module reads those comments with
`tokenize` and the defaults from the class itself, so the configuration
reference (`docs/configuration.md`) and the sample TOML files in
`docs/examples/` are generated from the code and cannot drift from it
(`python docs/generate.py`; a test checks that the committed files match).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldDoc:
    name: str
    type: str
    default: Any  # the default value (a nested config's is its own FieldDocs)
    doc: str


def field_docs(cls: type) -> list[FieldDoc]:
    """One FieldDoc per field of the dataclass `cls`, in declaration order."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = _comments_by_line(source)
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    lines = {node.target.id: node.lineno for node in body.body
             if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    defaults = cls()
    docs = []
    previous_line = body.lineno
    for f in dataclasses.fields(cls):
        line = lines[f.name]
        docs.append(FieldDoc(f.name, str(f.type), getattr(defaults, f.name),
                             _doc_of(line, previous_line, comments)))
        previous_line = line
    return docs


def _comments_by_line(source: str) -> dict[int, tuple[bool, str]]:
    """Line number -> (whether the line holds only the comment, the comment's text)."""
    found: dict[int, tuple[bool, str]] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = (False, tok.string[1:])
        elif tok.type not in {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER}:
            code_lines.add(tok.start[0])
    return {line: (line not in code_lines, text) for line, (_, text) in found.items()}


def _doc_of(line: int, previous_line: int, comments: dict[int, tuple[bool, str]]) -> str:
    parts: list[str] = []
    # A block of whole-line comments just above the field, not continuing the field before.
    above = line - 1
    while above > previous_line and above in comments and comments[above][0] \
            and not _continues(comments[above][1]):
        parts.insert(0, comments[above][1].strip())
        above -= 1
    if line in comments:
        parts.append(comments[line][1].strip())
        below = line + 1
        while below in comments and comments[below][0] and _continues(comments[below][1]):
            parts.append(comments[below][1].strip())
            below += 1
    return " ".join(parts)


def _continues(text: str) -> bool:
    """A comment line aligned under the previous line's comment (`#      more`)."""
    return text.startswith("  ")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def markdown_table(cls: type, table: str = "") -> str:
    """The fields of `cls` as a Markdown table: key, default, what it means."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for doc in field_docs(cls):
        if dataclasses.is_dataclass(doc.default):
            continue
        key = f"{table}.{doc.name}" if table else doc.name
        default = "unset" if doc.default is None else f"`{_toml_value(doc.default)}`"
        rows.append(f"| `{key}` | {default} | {doc.doc.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def sample_toml(cls: type, table: str = "") -> str:
    """A TOML file setting every key of `cls` to its default, each with its comment.

    Keys whose default is "unset" are written commented out: TOML has no null.
    """
    out: list[str] = []
    nested: list[tuple[str, type]] = []
    for doc in field_docs(cls):
        if dataclasses.is_dataclass(doc.default):
            nested.append((doc.name, type(doc.default)))
            continue
        for line in textwrap.wrap(doc.doc, 88) if doc.doc else []:
            out.append(f"# {line}")
        if doc.default is None:
            out.append(f"# {doc.name} = ...  (unset by default)")
        else:
            out.append(f"{doc.name} = {_toml_value(doc.default)}")
        out.append("")
    for name, sub in nested:
        out.append(f"[{table + '.' if table else ''}{name}]")
        out.append(sample_toml(sub, name).rstrip("\n"))
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"

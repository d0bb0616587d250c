#!/usr/bin/env python3
"""Lists the workspace's non-test Rust functions longer than N lines.

Issue 41 asks for functions a reader can hold at once: none over 100 lines
outside tests (STYLE.md aims at about 70). This prints every function over
the limit, longest first, as `lines  path:line  name`, so a change can be
checked against it.

Usage: python3 scripts/long-functions.py [N]   (N defaults to 100)
Exits 1 when any function is over N, so a script can gate on it.

What counts as a test, and is skipped: files under a `tests/` folder,
`fuzz/` and `loom-tests/`, and any item marked `#[cfg(test)]` (a test
module or function) or `#[test]`. A function's length runs from its `fn`
line to its closing brace, blank and comment lines included; a function
nested in another is listed on its own and also counts in its parent.

This is a scanner, not a parser: it blanks out comments, strings and char
literals, then matches braces. That is enough for rustfmt'd code.
"""

import os
import re
import subprocess
import sys

SKIP_DIRS = ("fuzz/", "loom-tests/")


def rust_files(root):
    """The tracked .rs files outside test-only places."""
    out = subprocess.run(
        ["git", "ls-files", "*.rs"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    for path in out:
        if path.startswith(SKIP_DIRS) or "/tests/" in "/" + path:
            continue
        yield path


def blank_literals(src):
    """Returns src with comments, strings and char literals replaced by
    spaces (newlines kept), so braces and keywords inside them vanish and
    line numbers stay the same."""
    out = []
    i, n = 0, len(src)

    def blank(text):
        return "".join("\n" if c == "\n" else " " for c in text)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif re.match(r'b?r#*"', src[i:i + 8]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'(b?r)(#*)"', src[i:])
            hashes = m.group(2)
            end = src.find('"' + hashes, i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(blank(src[i:j]))
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(blank(src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append(blank(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    """Index of the `}` that closes the `{` at open_at."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def item_body(code, start):
    """The (open, close) of the block of the item starting at start, or
    None when the item ends at a `;` first (a declaration, a `mod x;`)."""
    parens = 0
    for j in range(start, len(code)):
        ch = code[j]
        if ch in "([":
            parens += 1
        elif ch in ")]":
            parens -= 1
        elif ch == ";" and parens == 0:
            return None
        elif ch == "{" and parens == 0:
            return j, matching_brace(code, j)
    return None


TEST_ATTR = re.compile(r"#\[\s*(cfg\s*\((\s*test\s*|all\s*\(\s*test\b[^\]]*)\)|test)\s*\]")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def test_spans(code):
    """The character spans of items marked as tests."""
    spans = []
    for m in TEST_ATTR.finditer(code):
        body = item_body(code, m.end())
        if body:
            spans.append((m.start(), body[1]))
    return spans


def long_functions(root, path, lines_max):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        code = blank_literals(f.read())
    skipped = test_spans(code)
    for m in FN.finditer(code):
        if any(a <= m.start() <= b for a, b in skipped):
            continue
        body = item_body(code, m.end())
        if not body:
            continue
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, body[1]) + 1
        length = last - first + 1
        if length > lines_max:
            yield length, f"{path}:{first}", m.group(1)


def main():
    lines_max = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
    ).stdout.strip()
    found = []
    for path in rust_files(root):
        found.extend(long_functions(root, path, lines_max))
    found.sort(key=lambda f: (-f[0], f[1]))
    for length, where, name in found:
        print(f"{length:5}  {where}  {name}")
    print(f"{len(found)} non-test functions over {lines_max} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

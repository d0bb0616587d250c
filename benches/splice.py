"""Puts a section (a file whose first line is its "## " heading) into
BENCHMARKS.md: in place of the section with that heading if there is one,
else before the notes ("## What limits each figure"), else at the end.
The scripts that measure one scenario of their own (priority.sh, rls.sh)
write their section with it; report.py includes those files when
compare.sh rewrites the whole document.

Usage: python3 benches/splice.py BENCHMARKS.md SECTION.md
"""
import sys

path, section = sys.argv[1], open(sys.argv[2]).read()
head = section.splitlines()[0]
assert head.startswith("## "), f"{sys.argv[2]} must start with its ## heading"
doc = open(path).read()
if head in doc:
    start = doc.index(head)
    end = doc.find("\n## ", start + len(head))
    end = len(doc) if end < 0 else end + 1
    doc = doc[:start] + section + "\n" + doc[end:]
else:
    notes = doc.find("## What limits each figure")
    at = len(doc) if notes < 0 else notes
    doc = doc[:at] + section + "\n" + doc[at:]
open(path, "w").write(doc)

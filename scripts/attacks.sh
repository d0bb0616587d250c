#!/usr/bin/env bash
# Runs the attacks of tests/tests/hardening.rs and tests/tests/security.rs
# against real sluiced
# processes and rewrites the table between the markers in docs/SECURITY.md
# with what each found: the test (its name says the attack and the
# guarantee), passed or failed, and the figures it printed ("attack: ...").
# Usage: bash scripts/attacks.sh   (from anywhere in the repo; a minute or two)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p sluice-server --bins --features sluice-server/etcd,sluice-server/rls
export SLUICE_BIN_DIR="$PWD/target/debug"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# --no-capture: the tests run one at a time, each one's lines after its START.
cargo nextest run -p sluice-tests --test hardening --test security --no-capture --no-fail-fast >"$log" 2>&1 || true
python3 - "$log" docs/SECURITY.md <<'PY'
import re, sys
log, doc = sys.argv[1], sys.argv[2]
rows, current, figures, outcome = [], None, {}, {}
for line in open(log, errors="replace"):
    m = re.search(r"\b(START|PASS|FAIL)\b.*(?:hardening|security) (\w+)", line)
    if m:
        kind, name = m.groups()
        if kind == "START":
            current = name
            figures.setdefault(name, [])
        else:
            outcome[name] = "passed" if kind == "PASS" else "**FAILED**"
        continue
    if current and line.startswith("attack: "):
        figures[current].append(line[len("attack: "):].strip())
if not outcome:
    sys.exit("no test ran: see the output of cargo nextest")
table = ["| attack (the test's name) | result | measured |", "|---|---|---|"]
for name in sorted(outcome):
    table.append("| `%s` | %s | %s |" % (name, outcome[name], "; ".join(figures.get(name, [])) or "-"))
text = open(doc).read()
begin, end = "<!-- attacks:begin -->", "<!-- attacks:end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(doc, "w").write(head + begin + "\n" + "\n".join(table) + "\n" + end + tail)
print("\n".join(table))
if any(o != "passed" for o in outcome.values()):
    sys.exit(1)
PY

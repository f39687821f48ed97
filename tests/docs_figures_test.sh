#!/bin/bash
# Every measured figure the docs quote is checked against the raw output it came from, so the
# docs cannot drift from what the programs printed (docs/benchmarks.md, "Figures and their raw
# outputs", states the rule for authors).
#
# A figure is any of, in README.md and docs/*.md (prose, tables and code blocks alike):
#   * a ratio: a number or range followed by "x" (1.16x, 1.6-2.8x, 0.69..1.48x; not 16x16, 2.x);
#   * a percentage (76%, 15-27%);
#   * a rate: a number with a unit per second (12.0 MB/s, 2.15M rows/s, 1189 tokens/s, 4.8 TB/s).
# Bare durations and sizes (5 s, 8 µs, 83 MB) are not detected: most are defaults, limits or sizes
# of inputs; a measured one belongs beside a detected figure or in a quoted raw block.
#
# Each figure must be covered by one of:
#   * a fenced code block right after a line `<!-- raw: docs/FILE -->`: every non-empty line of
#     the block must be a line of that raw output, verbatim;
#   * a row of docs/figures.tsv (doc, text, source, evidence; tab-separated; '#' comments):
#     - source a raw output (docs/*.txt, docs/*.json, docs/parity*/...): the text occurs in the
#       doc, the evidence occurs verbatim in the raw output, and every figure in the text equals a
#       number of the evidence as rounded to the figure's digits (a percentage may be a fraction;
#       k, M and G scale). Evidence `=A/B` is a ratio: A and B occur in the raw output and the
#       figure equals A/B (or 100 A/B for a percentage); several parts join with " && ";
#     - source `cite:WHO` (another system's published figure, not ours): the evidence (the
#       citation) occurs in the same paragraph of the doc;
#     - source `exempt:input|config|target|definition` (a workload's size, a default or limit, an
#       aim a benchmark is held to, a term such as "95% CI"): not a measurement; the evidence says
#       why.
# And:
#   * a figure in no block and no row fails (new unchecked figures cannot creep in);
#   * a row whose text is not in its doc, or whose evidence is not in its raw output, fails;
#   * a measured quantity (a raw source and evidence, or a quoted raw line) is quoted by one doc
#     only; README.md may repeat a few, on a line that links to where they live.
# docs/config.md is generated and holds none.
#
# Mutations tried, each fails the test: "async/sync throughput: 1.16x" changed to 1.17x in
# README.md; the line "async/sync throughput: 1.29x" deleted from docs/pipeline_bench.txt; a new
# "about 3.5x faster" added to docs/design.md; "88%" of the rollout table changed to 89%;
# benchmarks.md's recovery table row quoted again in docs/pipeline.md; "1.72x" of the verl regime
# changed to 1.74x in docs/simulator.md.
# Usage: docs_figures_test.sh   (from any directory; needs bash and python3 only)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
exec python3 - "$root" <<'PY'
import os, re, sys

root = sys.argv[1]
NUM = r"\d+(?:\.\d+)?"
FIG = re.compile(
    r"(?<![\w.])(" + NUM + r")(?:\s?(?:-|–|\.\.)\s?(" + NUM + r"))?"
    r"(?:(x)(?![\w])|(%)|([kMG])?\s?(?:[GMT]i?B/s|tokens/s|samples/s|rows/s|requests/s)\b)")
RAW_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?([kMG](?![a-zA-Z]))?")
SCALE = {None: 1.0, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
EXEMPT = {"input", "config", "target", "definition"}
failures = []


def fail(msg):
    failures.append(msg)


def read(rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def digits(s):
    return len(s.split(".")[1]) if "." in s else 0


def raw_numbers(text):
    out = []
    for m in RAW_NUM.finditer(text):
        try:
            v = float(m.group(0).rstrip("kMG"))
        except ValueError:
            continue
        out.append(v * SCALE[m.group(1)])
    return out


def agrees(fig, scale, is_pct, values):
    f = float(fig) * scale
    tol = 0.5 * 10 ** -digits(fig) * scale + 1e-9 * max(1.0, abs(f))
    for v in values:
        for c in (v, v * 100) if is_pct else (v,):
            if abs(abs(c) - f) <= tol:
                return True
    return False


docs = ["README.md"] + sorted("docs/" + n for n in os.listdir(os.path.join(root, "docs"))
                              if n.endswith(".md"))
text = {d: read(d) for d in docs}

# Fenced blocks quoted from raw outputs.
quoted = {}  # (source, line) -> docs quoting it
covered = {d: [] for d in docs}  # spans of each doc that are checked
for d in docs:
    lines = text[d].split("\n")
    offs, pos = [], 0
    for ln in lines:
        offs.append(pos)
        pos += len(ln) + 1
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"<!-- raw: (\S+) -->", lines[i].strip())
        if not m:
            i += 1
            continue
        src = m.group(1)
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            fail(f"{d}:{i + 1}: '<!-- raw: {src} -->' is not followed by a fenced block")
            i += 1
            continue
        try:
            raw_lines = set(l.rstrip() for l in read(src).split("\n"))
        except OSError:
            fail(f"{d}:{i + 1}: raw output {src} does not exist")
            raw_lines = set()
        j = i + 2
        while j < len(lines) and not lines[j].startswith("```"):
            if lines[j].strip():
                if raw_lines and lines[j].rstrip() not in raw_lines:
                    fail(f"{d}:{j + 1}: block quoted from {src} has a line that is not in it: "
                         f"{lines[j].strip()[:100]}")
                quoted.setdefault((src, lines[j].rstrip()), set()).add(d)
            j += 1
        covered[d].append((offs[i + 1], offs[min(j, len(lines) - 1)]))
        i = j + 1

# The manifest.
rows = []
for n, line in enumerate(read("docs/figures.tsv").split("\n"), 1):
    if not line.strip() or line.startswith("#"):
        continue
    cols = line.split("\t")
    if len(cols) != 4 or not all(c.strip() for c in cols):
        fail(f"docs/figures.tsv:{n}: want 4 tab-separated fields (doc, text, source, evidence)")
        continue
    rows.append((n, *cols))

cited = {}  # (source, evidence) -> docs
for n, d, fig_text, src, ev in rows:
    where = f"docs/figures.tsv:{n}"
    if d not in text:
        fail(f"{where}: {d} is not a scanned doc")
        continue
    doc = text[d]
    starts = [m.start() for m in re.finditer(re.escape(fig_text), doc)]
    if not starts:
        fail(f"{where}: '{fig_text}' is no longer in {d}")
        continue
    figs = list(FIG.finditer(fig_text))
    if not figs:
        fail(f"{where}: '{fig_text}' holds no figure")
        continue
    for s in starts:
        covered[d].append((s, s + len(fig_text)))
    if src.startswith("exempt:"):
        if src[7:] not in EXEMPT:
            fail(f"{where}: exempt reason '{src[7:]}' is not one of {sorted(EXEMPT)}")
        continue
    if src.startswith("cite:"):
        for s in starts:
            a = doc.rfind("\n\n", 0, s)
            b = doc.find("\n\n", s)
            if ev not in doc[a + 1:b if b >= 0 else len(doc)]:
                fail(f"{where}: '{fig_text}' in {d} is another system's figure; its paragraph "
                     f"must cite '{ev}'")
        continue
    try:
        raw = read(src)
    except OSError:
        fail(f"{where}: raw output {src} does not exist")
        continue
    values, bad = [], None
    for part in ev.split(" && "):
        if part.startswith("="):
            a, _, b = part[1:].partition("/")
            if a not in raw or b not in raw or float(b) == 0:
                bad = f"ratio {part}: {a if a not in raw else b} is not in {src}"
                break
            values.append(float(a) / float(b))
        elif part not in raw:
            bad = f"'{part}' is not in {src} (the figure '{fig_text}' of {d} cites it)"
            break
        else:
            values += raw_numbers(part)
    if bad:
        fail(f"{where}: {bad}")
        continue
    for m in figs:
        scale, is_pct = SCALE[m.group(5)], bool(m.group(4))
        for num in (m.group(1), m.group(2)):
            if num is not None and not agrees(num, scale, is_pct, values):
                fail(f"{where}: {d} quotes {m.group(0)} in '{fig_text}', but {src} says "
                     f"'{ev}'")
    cited.setdefault((src, ev), set()).add(d)

# Every figure is covered.
for d in docs:
    doc = text[d]
    for m in FIG.finditer(doc):
        if not any(a <= m.start() and m.end() <= b for a, b in covered[d]):
            line_no = doc.count("\n", 0, m.start()) + 1
            line = doc.split("\n")[line_no - 1].strip()
            fail(f"{d}:{line_no}: figure '{m.group(0)}' is in no docs/figures.tsv row and no "
                 f"quoted raw block: {line[:120]}")

# Each measured quantity lives in one doc; the README repeats a few, linked.
for key, ds in list(cited.items()) + list(quoted.items()):
    owners = ds - {"README.md"}
    extra = {d for (s, line), qd in quoted.items() if s == key[0] and key[1] in line
             for d in qd} - {"README.md"}
    if len(owners | extra) > 1:
        fail(f"{key[0]}: '{key[1][:80]}' is quoted by {sorted(owners | extra)}: quote it in one, "
             f"link from the others")
for n, d, fig_text, src, ev in rows:
    if d == "README.md" and not src.startswith("exempt:"):
        for line in text[d].split("\n"):
            if fig_text in line and not re.search(r"\]\(docs/[^)]+\.md[^)]*\)", line):
                fail(f"docs/figures.tsv:{n}: README.md quotes '{fig_text}' without a link to "
                     f"the doc that holds it")

for f in failures:
    print("FAIL", f)
n_figs = sum(len(list(FIG.finditer(text[d]))) for d in docs)
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print(f"ok   {n_figs} figures in {len(docs)} docs, {len(rows)} manifest rows, "
      f"{len(quoted)} quoted raw lines")
PY

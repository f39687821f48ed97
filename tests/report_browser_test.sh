#!/bin/bash
# The run report as a browser draws it: a short real run (async, with held-out
# evaluations), `sluice report`, then headless Chromium loads the page with a
# checking script added and the test reads what it found:
#   * every chart draws something (a line, a bar or a point; no "no data"),
#   * no text of a chart overlaps another text of it or leaves the chart,
#   * the held-out accuracy chart starts at step 0 (the model before RL).
# Skipped (exit 77) where no Chromium is installed. Usage: report_browser_test.sh SLUICE
set -u
SLUICE=$1
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "skipped: no Chromium installed (apt-get install chromium to run this test)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run=(model.preset=tiny sft.steps=4 sft.batch_size=4 rl.steps=6 rl.prompts_per_step=2 rl.group_size=2
     rl.max_new_tokens=8 eval.size=8 eval.max_new_tokens=8 eval.interval=2 run.threads=1 run.progress=lines
     pipeline.mode=async pipeline.max_staleness=2 pipeline.rollout_threads=1 pipeline.trainer_threads=1)
if ! "$SLUICE" train "${run[@]}" run.dir="$tmp/run" > "$tmp/train.log" 2>&1; then
  echo "FAIL the run for the report failed"; tail -5 "$tmp/train.log"; exit 1
fi
"$SLUICE" report "$tmp/run" > /dev/null || { echo "FAIL sluice report"; exit 1; }

# The checker, appended to a copy of the page (the report itself has no script).
cat > "$tmp/check.js" <<'EOF'
function intersect(a, b) {
  const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
  const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
  return w > 0.5 && h > 0.5;
}
const lines = [];
let charts = 0, problems = 0;
for (const svg of document.querySelectorAll('svg')) {
  charts++;
  const title = svg.querySelector('text').textContent;
  const marks = [...svg.querySelectorAll('polyline, circle, rect')].filter(
      e => e.tagName !== 'rect' || e.getAttribute('fill') !== 'none');
  if (marks.length === 0 || svg.textContent.includes('no data')) {
    problems++; lines.push('EMPTY ' + title);
  }
  const frame = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll('text')].map(t => [t.textContent, t.getBoundingClientRect()]);
  for (const [s, r] of texts) {
    if (r.width === 0) { problems++; lines.push('UNDRAWN ' + title + ': ' + s); }
    if (r.left < frame.left - 0.5 || r.right > frame.right + 0.5 || r.top < frame.top - 0.5 ||
        r.bottom > frame.bottom + 0.5) {
      problems++; lines.push('OUTSIDE ' + title + ': ' + s);
    }
  }
  for (let i = 0; i < texts.length; i++) {
    for (let j = i + 1; j < texts.length; j++) {
      if (intersect(texts[i][1], texts[j][1])) {
        problems++; lines.push('OVERLAP ' + title + ': "' + texts[i][0] + '" / "' + texts[j][0] + '"');
      }
    }
  }
  if (title === 'Held-out accuracy') {
    const line = svg.querySelector('polyline[stroke="#d62728"]');
    const plot = svg.querySelector('rect[fill="none"]');
    const first = line ? Number(line.getAttribute('points').trim().split(/[ ,]/)[0]) : -1;
    if (!plot || Math.abs(first - Number(plot.getAttribute('x'))) > 0.5) {
      problems++; lines.push('NO-START held-out accuracy does not start at step 0 (first x ' + first + ')');
    }
    if (!svg.textContent.includes('before RL')) { problems++; lines.push('NO-BASELINE held-out accuracy'); }
  }
}
const out = document.createElement('pre');
out.id = 'check';
out.textContent = 'CHECK charts=' + charts + ' problems=' + problems + '\n' + lines.join('\n') + '\nEND';
document.body.appendChild(out);
EOF
sed 's|</body>|<script src="check.js"></script></body>|' "$tmp/run/report.html" > "$tmp/page.html"
# Headless, no sandbox (tests may run as root in containers), no network needed.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --allow-file-access-from-files \
  --user-data-dir="$tmp/profile" --window-size=1200,3000 --dump-dom "file://$tmp/page.html" \
  > "$tmp/dom.html" 2> "$tmp/browser.log"
result=$(sed -n '/CHECK charts=/,/^END/p' "$tmp/dom.html" | sed 's/.*\(CHECK charts=\)/\1/; /^END/d')
if [ -z "$result" ]; then
  echo "FAIL the browser ran no check (rc of chromium above; its log:)"; tail -5 "$tmp/browser.log"; exit 1
fi
echo "$result"
charts=$(echo "$result" | head -1 | sed 's/.*charts=\([0-9]*\).*/\1/')
problems=$(echo "$result" | head -1 | sed 's/.*problems=\([0-9]*\).*/\1/')
[ "$charts" -ge 11 ] || { echo "FAIL expected at least 11 charts, the browser found $charts"; exit 1; }
[ "$problems" -eq 0 ] || { echo "FAIL $problems problems in the report as drawn"; exit 1; }
echo "ok   report drawn in Chromium: $charts charts, every one drawn, no text overlapping"

#!/bin/bash
# The thread-safety annotations of the torch-side code (model, rollout,
# trainer, pipeline, the Python extension), checked by clang: the core's
# annotations are checked by its clang builds (core-tsan, core-asan build
# with -Wthread-safety -Werror), but the libtorch 1.13 headers do not parse
# under clang in C++20, so the torch-side builds are gcc's, which ignores the
# annotations. Every file of the release build that is compiled against
# libtorch and holds an annotation (SLUICE_GUARDED_BY, SLUICE_REQUIRES, ...)
# must be torch-free (it keeps the locking in its own translation unit:
# rollout/standby_slots.cc, rollout/share_weight_swap_hook.cc) and pass
# `clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety` with its own
# compile flags; a file that includes libtorch fails with a message saying so.
# Mutations tried, each fails: a read of StandbySlots::stats_ without its lock
# (standby_slots.cc); SLUICE_GUARDED_BY added to a member of a file that
# includes <torch/torch.h> (stream_train.cc): "includes libtorch".
# Usage: thread_safety_check.sh BUILD_DIR (its compile_commands.json)
set -u
build=${1:?usage: thread_safety_check.sh BUILD_DIR}
command -v clang++ > /dev/null || { echo "FAIL no clang++ (Debian's clang; ./setup.sh deps)"; exit 1; }
exec python3 - "$build/compile_commands.json" <<'PY'
import json, os, re, shlex, subprocess, sys

ANNOTATION = re.compile(r"\bSLUICE_(GUARDED_BY|PT_GUARDED_BY|REQUIRES|EXCLUDES|ACQUIRE|RELEASE|CAPABILITY|SCOPED_CAPABILITY)\b")
entries = json.load(open(sys.argv[1]))
checked, failures = [], []
for e in entries:
    if "torch/csrc/api/include" not in e["command"]:
        continue  # the core: checked by its clang builds
    path = e["file"]
    if not ANNOTATION.search(open(path, encoding="utf-8").read()):
        continue
    args = shlex.split(e["command"])[1:]
    keep, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MT", "-MF", "-include"):
            skip = 1
        elif a in ("-c", "-MD", "-Winvalid-pch", path) or (a.startswith("-W") and not a.startswith("-Wl")):
            pass
        else:
            keep.append(a)
    cmd = ["clang++", *keep, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", path]
    run = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
    rel = os.path.relpath(path)
    checked.append(rel)
    if run.returncode != 0:
        if re.search(r"/(torch|ATen|c10)/", run.stderr):
            failures.append(f"{rel} includes libtorch, whose headers clang cannot parse in C++20: keep its "
                            f"annotated state in a torch-free file\n{run.stderr[-1500:]}")
        else:
            failures.append(f"{rel}:\n{run.stderr[-3000:]}")
if not checked:
    failures.append("no annotated torch-side file found: the check would check nothing")
for f in failures:
    print("FAIL " + f)
if failures:
    sys.exit(1)
print(f"ok   thread-safety annotations of {len(checked)} torch-side files checked by clang: {' '.join(checked)}")
PY

// The program a reward.python worker runs (`python3 -c kWorkerProgram SPEC`).
// It is compiled into sluice so that `sluice train` needs no file of its own
// on PYTHONPATH; the protocol is described in python_worker.h.
#include "python_worker.h"

namespace sluice::reward::internal {

const char* const kWorkerProgram = R"py(
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import os
import signal
import sys
import threading
import time
import traceback

PROTOCOL_FD = 3
MAX_TEXT = 2000
IMPORTLIB_DIR = os.path.dirname(importlib.__file__)
ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


class LoadError(Exception):
    pass


def send(message):
    data = (json.dumps(message) + "\n").encode("ascii")
    while data:
        data = data[os.write(PROTOCOL_FD, data):]


def short_repr(value):
    try:
        text = repr(value)
    except BaseException as e:
        text = "<repr raised %s>" % type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def describe(exc):
    text = type(exc).__name__
    message = str(exc)
    if message:
        text += ": " + message
    # The innermost frame of the user's code: not this program's (<string>),
    # not the import machinery's (<frozen importlib._bootstrap>, importlib/).
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and not f.filename.startswith(IMPORTLIB_DIR)]
    if frames:
        text += " (at %s:%d in %s)" % (frames[-1].filename, frames[-1].lineno, frames[-1].name)
    return text[:MAX_TEXT]


def load(spec, arguments=ARGUMENTS):
    module_name, _, attribute = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise FileNotFoundError("no such file: " + path)
            sys.path.insert(0, os.path.dirname(path))
            name = "sluice_reward_" + "".join(c if c.isalnum() else "_" for c in os.path.basename(path)[:-3])
            file_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except BaseException as e:
        raise LoadError("cannot import module '%s': %s" % (module_name, describe(e)))
    target = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise LoadError("module '%s' has no attribute '%s'" % (module_name, attribute))
        except BaseException as e:
            raise LoadError("module '%s': getting '%s' raised %s" % (module_name, attribute, describe(e)))
    if not callable(target):
        raise LoadError("'%s' in module '%s' is %s %s, not callable"
                        % (attribute, module_name, type(target).__name__, short_repr(target)))
    if arguments is None:  # an environment class: it must have reset and step
        for method in ("reset", "step"):
            if not callable(getattr(target, method, None)):
                raise LoadError("'%s' in module '%s' has no method %s() (an environment needs reset and step)"
                                % (attribute, module_name, method))
        return target
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return target  # no signature to check (some builtins): the calls will tell
    try:
        signature.bind(**{name: None for name in arguments})
    except TypeError as e:
        raise LoadError("'%s' in module '%s' cannot be called as %s(%s) (its signature is %s: %s)"
                        % (attribute, module_name, attribute, ", ".join(n + "=..." for n in arguments),
                           signature, e))
    return target


def number(value):
    if not isinstance(value, numbers.Real):
        return None, "%s (%s), not a number" % (short_repr(value), type(value).__name__)
    try:
        score = float(value)
    except BaseException as e:
        return None, "%s (%s), which is not a float: %s" % (short_repr(value), type(value).__name__, describe(e))
    if not math.isfinite(score):
        return None, "%s (%s), not a finite number" % (short_repr(value), type(value).__name__)
    return score, None


def classify(result):
    if isinstance(result, dict):
        if "score" not in result:
            return None, "returned a dict without a 'score' key (keys: %s)" % short_repr(list(result.keys())[:20])
        score, error = number(result["score"])
        return score, (None if error is None else "returned a dict whose 'score' is " + error)
    score, error = number(result)
    return score, (None if error is None else "returned " + error)


def requests():
    pending = b""
    while True:
        chunk = os.read(PROTOCOL_FD, 1 << 16)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield json.loads(line)


def become_subreaper():
    # A helper the function starts may leave the worker's process group
    # (setsid: start_new_session=True, a daemon's double fork), out of reach
    # of the group kill. As the subreaper of its descendants, the worker
    # adopts such a helper when its parent dies, so end_descendants finds it.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def descendants():
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def end_descendants():
    # Each death may hand its own orphans to the worker: again until none
    # is left (bounded).
    for _ in range(50):
        found = descendants()
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.01)


def on_terminate(signum, frame):
    # sluice's kill: SIGTERM first, then SIGKILL for the group.
    end_descendants()
    os._exit(1)


def watch_parent():
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    end_descendants()
    os._exit(1)


MAX_REPLY = (1 << 20) - 4096


def send_text(text):
    data = (text + "\n").encode("utf-8")
    while data:
        data = data[os.write(PROTOCOL_FD, data):]


def env_main(spec, config_text):
    # An agent's environment (agent.env): one instance per trajectory, made
    # with the run's agent.env_config, kept until its trajectory closes it.
    try:
        config = json.loads(config_text)
        env_class = load(spec, None)
    except LoadError as e:
        send({"ready": False, "error": str(e)[:MAX_TEXT]})
        return 1
    send({"ready": True, "pid": os.getpid()})
    envs = {}
    for request in requests():
        key, op, rid = request["trajectory"], request["op"], request["id"]
        try:
            if op == "reset":
                envs.pop(key, None)
                env = env_class(config)
                envs[key] = env
                result = env.reset(request["row"])
            elif op == "step":
                if key not in envs:
                    raise LookupError("no environment for this trajectory in this worker (it was replaced)")
                result = envs[key].step(request["action"])
            else:
                close = getattr(envs.pop(key, None), "close", None)
                if callable(close):
                    close()
                result = None
        except BaseException as e:
            send_text(json.dumps({"id": rid, "error": (op + "() raised " + describe(e))[:MAX_TEXT]}))
            continue
        try:
            data = json.dumps({"id": rid, "result": result}, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except BaseException as e:
            send_text(json.dumps({"id": rid, "error": (op + "() answered what JSON cannot hold: "
                                                       + describe(e))[:MAX_TEXT]}))
            continue
        if len(data) > MAX_REPLY:
            send_text(json.dumps({"id": rid, "error": "%s() answered %d bytes, over the limit of %d"
                                  % (op, len(data), MAX_REPLY)}))
            continue
        while data:
            data = data[os.write(PROTOCOL_FD, data):]
        os.write(PROTOCOL_FD, b"\n")
    return 0


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_terminate)
    become_subreaper()
    sys.stdout = sys.stderr
    threading.Thread(target=watch_parent, daemon=True).start()
    if sys.argv[1] == "env":
        return env_main(sys.argv[2], sys.argv[3])
    try:
        function = load(sys.argv[2])
    except LoadError as e:
        send({"ready": False, "error": str(e)[:MAX_TEXT]})
        return 1
    send({"ready": True, "pid": os.getpid()})
    for request in requests():
        try:
            result = function(data_source=request["data_source"], solution_str=request["solution_str"],
                              ground_truth=request["ground_truth"], extra_info=request["extra_info"])
            score, error = classify(result)
        except BaseException as e:
            score, error = None, "raised " + describe(e)
        if error is None:
            send({"id": request["id"], "score": score})
        else:
            send({"id": request["id"], "error": error[:MAX_TEXT]})
    return 0


sys.exit(main())
)py";

}  // namespace sluice::reward::internal

"""Records what a worker's interpreter looks like from inside the script:
  introspect.py OUT_DIR [ARGS...]   (or run as a module: -m introspect)
Writes OUT_DIR/intro_<rank>.json: sys.argv, sys.path[0], __name__, __file__,
__spec__, __builtins__, whether stdout is unbuffered and line
buffered, stdin, the signal dispositions, whether `pickle` finds a class
defined here through __main__, how an atexit handler runs (it appends
to the file), and whether a file left open in a global is flushed at exit
(OUT_DIR/kept_<rank>.txt). The launcher-independent facts of a run, to compare a hot
(--preload) start with a cold one.
"""
import atexit
import json
import os
import pickle
import signal
import sys


class Here:
    pass


class Annotated:
    x: int


out = sys.argv[1]
rank = os.environ.get("RANK", "0")
path = os.path.join(out, f"intro_{rank}.json")
mod = sys.modules["__main__"]
facts = {
    "argv": sys.argv[1:],
    "argv0_is_file": os.path.samefile(sys.argv[0], __file__) if os.path.exists(sys.argv[0]) else sys.argv[0],
    "path0": sys.path[0],
    "name": __name__,
    "file": __file__,
    "annotation": repr(Annotated.__annotations__["x"]),
    "spec": None if __spec__ is None else __spec__.name,
    "main_is_this": mod.__dict__ is globals(),
    "builtins": type(__builtins__).__name__,
    "stdout_write_through": sys.stdout.write_through,
    "stdout_line_buffering": sys.stdout.line_buffering,
    "stdout_fileno": sys.stdout.fileno(),
    "streams": [(s.encoding, s.errors, s.line_buffering, s.write_through) for s in (sys.stdin, sys.stdout, sys.stderr)],
    "stdin_isatty": sys.stdin.isatty(),
    "sigint": str(signal.getsignal(signal.SIGINT)),
    "sigterm": str(signal.getsignal(signal.SIGTERM)),
    "sigpipe": str(signal.getsignal(signal.SIGPIPE)),
    "sigchld": str(signal.getsignal(signal.SIGCHLD)),
    "pickles_main_class": type(pickle.loads(pickle.dumps(Here()))).__qualname__,
    "pgid_is_pid": os.getpgid(0) == os.getpid(),
    "cwd": os.getcwd(),
}
with open(path, "w") as f:
    json.dump(facts, f, sort_keys=True)


def bye():
    with open(path) as f:
        d = json.load(f)
    d["atexit_ran"] = True
    with open(path, "w") as f:
        json.dump(d, f, sort_keys=True)


atexit.register(bye)

# A file kept open in a global and never closed: the interpreter's teardown
# flushes it.
kept = open(os.path.join(out, f"kept_{rank}.txt"), "w")
kept.write("flushed at exit")

#!/usr/bin/env python3
"""Fuzz `pw-opt` with mutations of every lit input.

    python scripts/fuzz.py --count 10000 [--seed 0] [--jobs 2] [--timeout 30] [--keep DIR]

Each case takes one lit input (`lit_tests/**/*.mlir`), mutates it once
(truncation, byte flips, a dropped, duplicated or swapped line or token) and
runs `pw-opt` on it with the arguments of one of that file's `RUN` lines, or
with the whole `pw-lower` pipeline. A case passes when `pw-opt` exits 0 or 1
without a Python traceback or an internal error; a signal (abort, segfault),
another status, or a case running past `--timeout` seconds fails. Cases run
in-process in a pool of `--jobs` worker processes; a worker that dies is
replaced, and the case it was running is the one blamed. Failing inputs are
written to `--keep` (default: a temporary directory) to reproduce with
`pw-opt FILE ARGS`. Prints counts per outcome and mutation; exits 1 if any
case failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import re
import select
import shlex
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOWER = ["--split-input-file", "--pass-pipeline=builtin.module(pw-lower{topology=2x4})"]
TOKEN = re.compile(rb'"(?:[^"\\\n]|\\.)*"|[\w.$#%@!^-]+|\S')
INTERESTING = b'"{}()[]<>%@#!^:,=-01 \n\x00\xff'
MUTATIONS = ("truncate", "flip", "drop-line", "duplicate-line", "swap-lines",
             "drop-token", "duplicate-token", "swap-tokens")


def run_lines(text: str) -> list[list[str]]:
    """Returns the `--` options of each `pw-opt %s` command in a lit file's `RUN:` lines."""
    found = []
    for line in text.splitlines():
        if "RUN:" not in line:
            continue
        for command in re.split(r"\||&&", line.split("RUN:", 1)[1]):
            words = shlex.split(command)
            if "pw-opt" in words and "%s" in words:
                found.append([w for w in words[words.index("pw-opt") + 1:] if w.startswith("--") and "%" not in w])
    return found


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Returns (mutation name, mutated bytes)."""
    kind = rng.choice(MUTATIONS)
    if kind == "truncate":
        return kind, data[:rng.randrange(len(data))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(out))
            out[i] = rng.choice([rng.choice(INTERESTING), out[i] ^ (1 << rng.randrange(8))])
        return kind, bytes(out)
    by_line = "line" in kind
    # Lines; or separators (even indices) and tokens (odd indices).
    parts = data.split(b"\n") if by_line else _tokens(data)
    picks = range(len(parts)) if by_line else range(1, len(parts), 2)
    if len(picks) < 2:
        return "truncate", data[:rng.randrange(len(data))]
    i, j = rng.sample(picks, 2)
    if kind.startswith("drop"):
        parts[i] = b""
    elif kind.startswith("duplicate"):
        parts[i] = parts[i] + (b"\n" if by_line else b" ") + parts[i]
    else:
        parts[i], parts[j] = parts[j], parts[i]
    return kind, (b"\n" if by_line else b"").join(parts)


def _tokens(data: bytes) -> list[bytes]:
    """Splits `data` into [separator, token, separator, ..., token, separator]."""
    parts, last = [], 0
    for match in TOKEN.finditer(data):
        parts += [data[last:match.start()], match.group()]
        last = match.end()
    return parts + [data[last:]]


def cases(count: int, seed: int):
    """Yields (index, source, mutation, input bytes, arguments) for `count` cases."""
    sources = sorted(p for p in (ROOT / "lit_tests").rglob("*.mlir") if "Output" not in p.parts)
    inputs = [(p, p.read_bytes(), [*run_lines(p.read_text()), LOWER]) for p in sources]
    for index in range(count):
        rng = random.Random(seed * 1_000_003 + index)
        path, data, arg_sets = inputs[index % len(inputs)]
        kind, mutated = mutate(data, rng)
        yield index, path.relative_to(ROOT), kind, mutated, rng.choice(arg_sets)


# -- the worker: runs pw-opt in-process, one case per line of stdin ----------

def worker() -> None:
    """Reads `{"path", "args"}` lines; answers `{"status", "bad"}` lines."""
    import contextlib
    import io

    from pathways_mlir.cli import pw_opt

    for line in sys.stdin:
        case = json.loads(line)
        out = io.StringIO()
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(io.StringIO()):
            status = pw_opt.main([case["path"], *case["args"]])
        text = out.getvalue()
        bad = status not in (0, 1) or "Traceback" in text or "internal error" in text
        print(json.dumps({"status": status, "bad": bad, "stderr": text[-1500:] if bad else ""}), flush=True)


class _Pool:
    """Worker processes; a case that kills or hangs its worker fails and the worker is replaced."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.lock = threading.Lock()

    def start(self) -> subprocess.Popen:
        # stderr goes to a file: MLIR writes to it directly (--mlir-print-ir-after-all), and an
        # unread pipe would fill up and stall the worker. faulthandler says where a crash was.
        errors = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=errors, text=True, bufsize=1,
                                env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        proc.errors = errors
        return proc

    def run(self, proc: subprocess.Popen, path: pathlib.Path, args: list[str]) -> tuple[subprocess.Popen, dict]:
        """Runs one case on `proc`; returns the worker to use next and the outcome."""
        proc.stdin.write(json.dumps({"path": str(path), "args": args}) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        line = proc.stdout.readline() if ready else ""
        if line:
            return proc, json.loads(line)
        if not ready:
            proc.kill()
            outcome = {"status": "hang", "bad": True, "stderr": f"no answer in {self.timeout:g} s"}
        else:
            proc.wait(timeout=30)
            outcome = {"status": f"signal {-proc.returncode}" if proc.returncode < 0 else proc.returncode,
                       "bad": True, "stderr": _tail(proc.errors)}
        proc.wait(timeout=30)
        proc.errors.close()
        return self.start(), outcome


def _tail(errors, size: int = 1500) -> str:
    """Returns the end of what a worker wrote to its stderr file."""
    errors.seek(0, os.SEEK_END)
    errors.seek(max(0, errors.tell() - size))
    return errors.read().decode("utf-8", "replace")


def main(argv: list[str] | None = None) -> int:
    """Runs the fuzzer; returns 0 if every case passed, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="number of cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds one case may take")
    parser.add_argument("--keep", type=pathlib.Path, default=None, help="where failing inputs are written")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        worker()
        return 0
    keep = options.keep or pathlib.Path(tempfile.mkdtemp(prefix="pw-fuzz-failures-"))
    keep.mkdir(parents=True, exist_ok=True)
    outcomes: collections.Counter = collections.Counter()
    per_kind: collections.Counter = collections.Counter()
    failures: list[str] = []
    pending = iter(cases(options.count, options.seed))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pw-fuzz-") as scratch_dir:
        scratch = pathlib.Path(scratch_dir)
        pool = _Pool(options.timeout)

        def drive(slot: int) -> None:
            proc = pool.start()
            try:
                while True:
                    with pool.lock:
                        case = next(pending, None)
                    if case is None:
                        return
                    index, source, kind, data, args = case
                    path = scratch / f"{slot}.mlir"
                    path.write_bytes(data)
                    proc, outcome = pool.run(proc, path, args)
                    with pool.lock:
                        outcomes[str(outcome["status"]) if outcome["bad"] else f"exit {outcome['status']}"] += 1
                        per_kind[kind] += 1
                        done = sum(outcomes.values())
                        if done % 1000 == 0:
                            print(f"{done} cases, {len(failures)} failures, {time.monotonic() - start:.0f} s",
                                  file=sys.stderr, flush=True)
                        if outcome["bad"]:
                            saved = keep / f"case{index}-{source.stem}-{kind}.mlir"
                            saved.write_bytes(data)
                            failures.append(f"FAIL {saved} ({source}, {kind}) pw-opt {shlex.join(args)}: "
                                            f"{outcome['status']}\n{outcome['stderr'].strip()}")
            finally:
                proc.stdin.close()
                proc.wait(timeout=60)
                proc.errors.close()

        def guarded(slot: int) -> None:
            try:
                drive(slot)
            except Exception as e:  # noqa: BLE001  (a bug of the fuzzer itself fails the run)
                with pool.lock:
                    failures.append(f"FAIL fuzzer worker thread {slot}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=guarded, args=(slot,)) for slot in range(options.jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if sum(outcomes.values()) != options.count:
        failures.append(f"FAIL only {sum(outcomes.values())} of {options.count} cases ran")
    for failure in failures:
        print(failure)
    elapsed = time.monotonic() - start
    print(f"{options.count} cases in {elapsed:.1f} s ({options.jobs} workers, seed {options.seed}): "
          + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    print("mutations: " + ", ".join(f"{k}: {v}" for k, v in sorted(per_kind.items())))
    print(f"{len(failures)} failures" + (f" (inputs in {keep})" if failures else ""))
    if not failures and options.keep is None:
        keep.rmdir()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

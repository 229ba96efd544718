"""A job's log: capped while the job writes it, read from its end, followed across its cuts.

The runaway-log probe of issue 22: a stage that wrote 200 MB left a 200 MB log (nothing
capped it), and `inv logs -n 5` read all of it into the host's memory (609 MB), or, with
no newline in it, printed all 200 MB.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from remote.control_plane import jobs, logfile
from remote.control_plane.logfile import CappedLog
from benchmarks.harness.checkout import REPO, SCRIPTED, wait_for

MIB = 2**20


def last(data: bytes, count: int, line_limit: int = 10) -> bytes:
    out: list[bytes] = []
    logfile.write_last_lines(io.BytesIO(data), count, out.append, line_limit)
    return b"".join(out)


@pytest.mark.parametrize(("data", "count", "shown"), [
    (b"", 5, b""),
    (b"\n", 5, b"\n"),
    (b"a\nb\nc\n", 2, b"b\nc\n"),
    (b"a\nb\nc", 2, b"b\nc"),  # the last line without its newline yet
    (b"a\n\nc\n", 2, b"\nc\n"),  # an empty line is a line
    (b"a\nb\n", 9, b"a\nb\n"),
    (b"a\n" + b"y" * 50 + b"\nz\n", 2, b"[aerie: line cut, its first 41 bytes not shown] yyyyyyyyy\nz\n"),
    (b"x" * 100, 3, b"[aerie: line cut, its first 90 bytes not shown] xxxxxxxxxx"),
    (("é" * 20 + "a").encode(), 1, "[aerie: line cut, its first 32 bytes not shown] ééééa".encode()),  # no half a é
])
def test_the_last_lines_are_read_from_the_end_and_a_long_line_keeps_its_end(data: bytes, count: int, shown: bytes) -> None:
    assert last(data, count) == shown


def test_a_line_whose_start_is_beyond_the_search_says_so() -> None:
    handle = io.BytesIO(b"x" * 1000 + b"\nlast\n")
    assert logfile.line_starts(handle, 1006, 2, scan_limit=100) == ([906, 1001], False)


def _peak_of_logs_verb(root: Path, lines: int, out: Path) -> int:
    """Peak RSS in bytes of `python -m remote logs` as the workstation runs it, its output to `out`."""
    argv = [sys.executable, "-S", "-m", "remote", "logs", json.dumps({"root": str(root), "dataset": "A", "lines": lines})]
    probe = ("import resource, subprocess, sys; "
             "code = subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], 'wb')).returncode; "
             "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
    done = subprocess.run([sys.executable, "-c", probe, str(out), *argv], cwd=REPO, capture_output=True, text=True,
                          check=True)
    code, peak = map(int, done.stdout.split())
    assert code == 0, done.stderr
    return peak


def _job_with_log(root: Path) -> Path:
    directory = root / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps({"dataset": "A", "stage": "prep", "state": "succeeded",
                                                      "executor": "process", "started_at": 1.0}))
    return directory / "log"


#: A process of a job, printing as a stage does under the supervisor's PYTHONUNBUFFERED.
PRINTER = """
import sys
from remote.control_plane import logfile
logfile.whole_lines()
for i in range(2000):
    print(f"{sys.argv[1]} says line {i}", flush=True)
"""


def test_processes_sharing_a_jobs_log_write_it_whole_lines_at_a_time() -> None:
    # two writers of one pipe, as a launcher and its ranks are: a line and its newline written apart glue
    read_end, write_end = os.pipe()
    printers = [subprocess.Popen([sys.executable, "-c", PRINTER, name], cwd=REPO, stdout=write_end,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}) for name in ("rank0", "rank1")]
    os.close(write_end)
    with open(read_end, "rb") as pipe:
        out = pipe.read()
    for printer in printers:
        printer.wait()
    lines = out.decode().split("\n")

    assert lines[-1] == "" and all(re.fullmatch(r"rank[01] says line \d+", line) for line in lines[:-1])


@pytest.mark.parametrize("ending", ["", "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\n"])
def test_logs_n_5_of_a_200_mb_log_holds_a_few_blocks_with_or_without_newlines(tmp_path: Path, ending: str) -> None:
    log = _job_with_log(tmp_path)
    with open(log, "wb") as handle:
        handle.truncate(200_000_000)  # 200 MB without a newline (sparse: nothing is written to disk)
        handle.seek(200_000_000)
        handle.write(ending.encode())
    out = tmp_path / "out"
    peak = _peak_of_logs_verb(tmp_path, 5, out)
    assert peak < 50 * MIB, f"inv logs -n 5 took {peak / MIB:.0f} MiB on the host"
    shown = out.read_bytes()
    if ending:
        assert shown == b"line 2\nline 3\nline 4\nline 5\nline 6\n"
    else:
        assert shown.startswith(f"[aerie: line cut, its first {200_000_000 - logfile.LINE_LIMIT} bytes not shown] ".encode())
        assert len(shown) < logfile.LINE_LIMIT + 100


def test_the_log_keeps_its_newest_part_under_its_limit_behind_a_marker(tmp_path: Path) -> None:
    log, written = CappedLog(tmp_path / "log", 64 * 1024), []
    for index in range(20_000):
        line = f"line {index} {'x' * (index % 37)}\n".encode()
        log.write(line)
        written.append(line)
    whole, kept = b"".join(written), (tmp_path / "log").read_bytes()
    header, body = kept.split(b"\n", 1)
    cut = int(re.search(rb"its first (\d+) bytes were cut", header).group(1))
    assert len(kept) <= 64 * 1024 and header.startswith(b"[aerie] this log is capped at 65536 bytes")
    assert whole[cut:] == body  # exactly the newest part, from the start of a line
    assert body.startswith(b"line ") and whole[cut - 1:cut] == b"\n"
    again = CappedLog(tmp_path / "log", 64 * 1024)  # a supervisor taking over the file goes on counting
    assert (again.cut, again.header, again.size) == (cut, len(header) + 1, len(kept))


def test_follow_goes_on_across_the_writers_cuts_in_order_and_says_what_it_missed(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = CappedLog(path, 64 * 1024)
    log.write(b"line 0\n")
    done = threading.Event()

    def write() -> None:
        for index in range(1, 30_000):
            log.write(f"line {index}\n".encode())
        log.write(b"the end\n")
        done.set()

    out: list[bytes] = []
    writer = threading.Thread(target=write)
    with open(path, "rb") as handle:
        end = logfile.write_last_lines(handle, 10, out.append)
        writer.start()
        logfile.follow(path, handle, end, done.is_set, out.append, pause=0.01)
    writer.join()
    text = b"".join(out).decode()
    assert text.endswith("line 29999\nthe end\n")
    numbers = [int(n) for n in re.findall(r"^line (\d+)$", text, re.MULTILINE)]
    assert numbers == sorted(set(numbers)), "a line shown twice or out of order"
    gaps = sum(1 for a, b in zip(numbers, numbers[1:]) if b != a + 1)
    assert text.count("bytes were cut from the log before they could be shown") >= gaps
    assert log.cut > 64 * 1024  # it was cut while followed, more than once


@pytest.mark.e2e
def test_a_stage_writing_200_mb_leaves_a_capped_log_whose_end_logs_shows(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "current").symlink_to(REPO)
    spec: dict[str, Any] = {
        "dataset": "A", "stage": "prep", "command": f"yes 0123456789 | head -c 200000000; {{python}} {SCRIPTED}",
        "source": "records=1", "kind": "native", "stall_after": 600, "executor": "process", "config": {},
        "log_limit": 4 * MIB}
    jobs.launch(root, spec)
    wait_for(lambda: jobs.status(root)["jobs"][0]["state"] == "succeeded", 120, "A to succeed")
    log = root / "jobs" / "A" / "prep" / "log"
    kept = log.read_bytes()
    assert len(kept) <= 4 * MIB
    cut = int(re.match(rb"\[aerie\] this log is capped at 4194304 bytes [^\n]*its first (\d+) bytes were cut\n",
                       kept).group(1))
    assert cut + len(kept) > 200_000_000  # everything the stage wrote went through, the oldest of it cut
    assert kept.endswith(b"[aerie] succeeded: exit 0, 1 records\n")
    shown = subprocess.run([sys.executable, "-S", "-m", "remote", "logs",
                            json.dumps({"root": str(root), "dataset": "A", "lines": 3})],
                           cwd=REPO, capture_output=True, check=True).stdout
    assert shown.split(b"\n")[-2:] == [b"[aerie] succeeded: exit 0, 1 records", b""]
    assert b"record 1\n" in shown


@pytest.mark.e2e
@pytest.mark.backends("local", "ssh")
def test_the_inventorys_log_limit_caps_a_jobs_log_and_inv_logs_shows_its_end(bench: Any) -> None:
    command = f"yes 0123456789 | head -c 20000000; {{python}} {SCRIPTED}"
    bench.inventory({"A": {"source": "records=1", "kind": "native"}}, {"prep": {"command": command, "log_limit": "1M"}})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("A/prep", {"succeeded"}, timeout=60)
    kept = (bench.job_dir("A") / "log").read_bytes()
    assert len(kept) <= MIB and kept.startswith(b"[aerie] this log is capped at 1048576 bytes")
    shown = bench.inv("logs", "A", "-n", "2").stdout
    assert shown == "record 1\n[aerie] succeeded: exit 0, 1 records\n"

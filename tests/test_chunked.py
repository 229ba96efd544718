"""The chunked route: states for a chunk at a time within the disk budget, one draft trained over all, resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from remote.orchestration import chunk_plan, chunked
from remote.eagle3 import StageInputError
from benchmarks.harness.stage_settings import complete
from tests.helpers.events import read_events
from tests.pipeline_fixtures import REPO, TINY_LAYERS, make_records, stage_env, tiny_target, vocab_size, write_prep

__all__ = ["tiny_target"]  # fixtures used below

EXTRACT = {"layers": TINY_LAYERS, "dtype": "float32", "batch_size": 4, "shard_size": 4}
TRAIN = {"draft_vocab_size": 200, "epochs": 2, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 2, "checkpoint_every": 1}


def test_chunks_are_cut_in_order_within_the_budget_and_a_record_too_big_is_refused() -> None:
    assert chunked.cut([4, 4, 3, 5, 1], 8) == [(0, 2), (2, 4), (4, 5)]
    with pytest.raises(StageInputError, match="record 1 alone needs 9 B on disk, more than the 8 B of stages.extract.disk_budget left"):
        chunked.cut([4, 9], 8)


def disk_usage(path: Path) -> int:
    """Bytes allocated under `path` (what `du` counts), files and directories."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in [".", *files]:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:  # deleted while we looked
                pass
    return total


class DiskWatch:
    """The most disk `path` ever used while the watch ran, sampled every 20 ms."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak, self._stop = path, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, disk_usage(self.path))
            time.sleep(0.02)

    def __enter__(self) -> "DiskWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def launch(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "remote.orchestration.chunked"], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def chunked_env(root: Path, target: Path, budget: int, extract: dict, train: dict, datasets: list[str]) -> dict[str, str]:
    settings = {"disk_budget": budget, "extract": complete("extract", extract), "train": complete("train", train)}
    env = stage_env(root, "chunked", settings,
                    {"target": {"model": str(target)}}, dataset="draft")
    prep = {name: str(root / "data" / name / "prep") for name in datasets}
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "prep_inputs": prep})
    return env


@pytest.mark.e2e
def test_any_extract_and_train_command_runs_chunk_by_chunk_for_every_epoch_within_the_budget_and_resumes(
    tmp_path: Path
) -> None:
    # Stand-in commands (tests/stages/chunk_standin.py) write states of the real size, fast.
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 785}))
    root = tmp_path / "root"
    records = {"A1": make_records(9, 785, seed=1), "B2": make_records(6, 785, seed=2)}
    for name, rows in records.items():
        write_prep(root / "data" / name, rows)
    per_token = (len(TINY_LAYERS) + 1) * 64 * 4
    sizes = [chunked.record_size(len(r["input_ids"]), per_token) for rows in records.values() for r in rows]
    budget = chunked.reserved(1) + sum(sizes) // 3 + max(sizes)  # three chunks (a train command: nothing held out)
    standin = f"{{python}} {REPO / 'tests' / 'stages' / 'chunk_standin.py'}"
    log = tmp_path / "trained.jsonl"
    # Two passes over two epochs: every chunk extracted again for the second epoch (re-extraction).
    env = chunked_env(root, target, budget, {**EXTRACT, "passes": 2, "command": f"{standin} extract {per_token}"},
                      {**TRAIN, "command": f"{standin} train {log}"}, list(records))
    out = Path(env["AERIE_OUTPUT"])

    with DiskWatch(out) as watch:
        first = launch({**env, "STANDIN_SLEEP": "0.3"})
        wait_for_state(out, {"pass": 1, "chunk": 1, "phase": "extract"}, first)
        os.killpg(first.pid, signal.SIGTERM)  # what `inv stop` sends the job's process group
        first.wait()
        second = launch(env)
        log_text, _ = second.communicate(timeout=120)

    assert second.returncode == 0, log_text
    plan = json.loads((out / "chunks.json").read_text())
    chunks = plan["chunks"]
    trained = [json.loads(line) for line in log.read_text().splitlines()]
    # 3 chunks x 2 passes, each chunk trained once per pass (the run stopped between two of them),
    # the second pass in another order
    second = chunked.pass_order(3, 1)
    assert len(chunks) == 3 and second != [0, 1, 2]
    assert [t["pass"] for t in trained] == [f"pass 1, chunk {k}" for k in (1, 2, 3)] + [f"pass 2, chunk {k + 1}" for k in second]
    counts = [sum(t["inputs"].values()) for t in trained]
    assert counts[:3] == plan["records"] and counts[3:] == [plan["records"][k] for k in second] and sum(counts[:3]) == 15
    assert {t["epochs"] for t in trained} == {1}
    # every chunk draws from both datasets' records: shuffled across datasets, not cut in prep's order
    assert sorted((name, i) for c in chunks for name, rows in c.items() for i in rows) == \
        sorted((name, i) for name, rows in records.items() for i in range(len(rows)))
    assert len({t["schedule_steps"] for t in trained}) == 1  # one schedule over the whole run
    assert 0 < watch.peak <= budget, f"peak {watch.peak} over budget {budget}"
    assert not list(out.glob("chunk-*"))
    progress = json.loads(Path(env["AERIE_PROGRESS"]).read_text())
    assert progress["metrics"] == {"pass": 2, "chunk": 3, "chunks": 3, "step": progress["total"]}
    manifest = json.loads((out / "manifest.json").read_text())
    # a command is a process of its own: one load per chunk and pass (the run's own 6, and none twice)
    assert manifest["passes"] == 2 and manifest["target_loads"] >= 6 and manifest["heldout_records"] == 0


def wait_for_state(out: Path, state: dict, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while json.loads((out / "state.json").read_text() if (out / "state.json").exists() else "{}") != state:
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read() if process.stdout else ""
        time.sleep(0.02)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_budget_smaller_than_the_states_trains_by_chunks_on_two_ranks_never_exceeds_it_and_resumes_after_a_kill(
    tmp_path: Path, tiny_target: Path
) -> None:
    root = tmp_path / "root"
    vocab = vocab_size(tiny_target)
    a1, b2 = make_records(7, vocab, seed=1), make_records(5, vocab, seed=2)
    write_prep(root / "data" / "A1", a1)
    write_prep(root / "data" / "B2", b2)
    per_token = (len(TINY_LAYERS) + 1) * 64 * 4
    sizes = [chunked.record_size(len(r["input_ids"]), per_token) for r in a1 + b2]
    budget = chunked.reserved(2) + sum(sizes) // 2 + max(sizes)  # two chunks: about half the states at a time
    assert budget < sum(sizes) + chunked.reserved(2)  # the states of all records would not fit
    # One epoch keeps it to five runs of the real stages (extract and train per chunk, and the resumed train),
    # trained by a resident group of two ranks (gloo), each its share of every global batch of 2 x 2 records.
    train = {**TRAIN, "epochs": 1, "report_to": "tensorboard", "nproc": 2}
    env = chunked_env(root, tiny_target, budget, EXTRACT, train, ["A1", "B2"])
    out = Path(env["AERIE_OUTPUT"])

    with DiskWatch(out) as watch:
        first = launch(env)
        # Killed (SIGKILL, as the OOM killer or a reboot would) while training on the first chunk.
        wait_for_state(out, {"pass": 0, "chunk": 0, "phase": "train"}, first, timeout=600)
        while not (root / "data" / "draft" / "train" / "resume" / "state.pt").exists():  # a step or more taken
            assert first.poll() is None
            time.sleep(0.02)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = launch(env)
        log, _ = second.communicate(timeout=600)

    assert second.returncode == 0, log
    # one group of ranks for the whole job, every chunk and the held-out measurement: never one per chunk
    assert log.count("resident trainer: 2 ranks joined") == 1, log
    plan = json.loads((out / "chunks.json").read_text())
    chunks = plan["chunks"]
    # the held-out record (the train stage's hashing rule, by its offline path) is kept out of every chunk
    held = [(name, i) for name, rows in plan["heldout"].items() for i in rows]
    assert len(held) == 1 and len(chunks) == 2 and sum(plan["records"]) == 11
    assert held[0] not in [(name, i) for c in chunks for name, rows in c.items() for i in rows]
    assert 0 < watch.peak <= budget, f"peak {watch.peak} over budget {budget}"
    assert not list(out.glob("chunk-*"))  # every chunk deleted; the held-out states stay, for `inv eval`
    progress = json.loads(Path(env["AERIE_PROGRESS"]).read_text())
    assert progress["records"] == 11
    assert {k: progress["metrics"][k] for k in ("pass", "chunk", "chunks")} == {"pass": 1, "chunk": 2, "chunks": 2}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["route"] == "chunked" and manifest["chunks"] == 2 and manifest["epochs"] == 1
    assert manifest["target_loads"] == 2  # one per process: the killed run's and the second's, never one per chunk
    # One draft over every chunk and epoch: every step of the run is in its history, in order, none twice.
    train = root / "data" / "draft" / "train"
    history = json.loads((train / "history.json").read_text())
    assert [h["step"] for h in history] == list(range(1, sum(-(-n // 4) for n in plan["records"]) + 1))
    assert (train / "draft" / "config.json").is_file() and (train / "draft" / "model.safetensors").is_file()
    # measured like the offline draft: after the epoch, on the held-out record kept on disk
    listed = json.loads((train / "heldout.json").read_text())
    assert len(listed) == 1 and Path(listed[0]).is_file() and Path(listed[0]).is_relative_to(out / "heldout")
    trained = json.loads((train / "manifest.json").read_text())
    assert trained["route"] == "chunked" and trained["accept_length"] >= 1.0 and len(trained["eval_accuracies"]) == 3
    assert [e["epoch"] for e in trained["epoch_history"]] == [0, 1] and (train / "training.png").is_file()
    # draft/ keeps the best epoch (the later of equals), last/ the latest, as the train stage does
    best = max(trained["epoch_history"], key=lambda e: (e["accept_length"], e["epoch"]))
    assert trained["kept_epoch"] == best["epoch"] == json.loads((train / "draft" / "aerie.json").read_text())["epoch"]
    assert (train / "last" / "model.safetensors").is_file()
    assert manifest["accept_length"] == trained["accept_length"] and progress["metrics"]["accept_length"] > 0
    # the curves in TensorBoard (report_to) are the history's, the killed run's steps taken again shown once
    scalars = read_events(train / "tensorboard")
    assert scalars["train/loss"] == [(h["step"], pytest.approx(h["loss"], rel=1e-6)) for h in history]
    epochs = trained["epoch_history"]  # epoch 0 (before any step) at step 0, epoch 1 at its last step
    assert scalars["eval/accept_length"] == [(0, pytest.approx(epochs[0]["accept_length"], abs=1e-4)),
                                             (history[-1]["step"], pytest.approx(trained["accept_length"], abs=1e-4))]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_inv_run_takes_the_chunked_route_shows_chunk_k_of_n_and_resumes_after_inv_stop(tmp_path: Path) -> None:
    from remote.demo.tiny_tokenizer import build_tokenizer
    from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout, wait_for

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    tokenizer = tmp_path / "tokenizer"
    build_tokenizer(tokenizer)
    target = tmp_path / "target"  # the stand-ins never load weights; plan and chunks read the config
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 785}))
    per_token = (len(TINY_LAYERS) + 1) * 64 * 4
    standin = f"{REPO / 'tests' / 'stages' / 'chunk_standin.py'}"
    budget = 350 * 1024  # 3 short chats' states (~430 KiB with framing) do not fit; one 256-token record does
    stages = {"prep": {"max_length": 256},
              "extract": {**EXTRACT, "disk_budget": budget, "command": f"STANDIN_SLEEP=0.5 {{python}} {standin} extract {per_token}"},
              "train": {**TRAIN, "command": f"STANDIN_SLEEP=0.5 {{python}} {standin} train {tmp_path / 'trained.jsonl'}"}}
    bench.inventory({"chat": {"source": str(SAMPLES["native"]), "kind": "native"}}, stages,
                    target={"tokenizer": str(tokenizer), "model": str(target)})
    bench.inv("deploy")
    assert json.loads(bench.inv("plan", "--json").stdout)["route"] == "chunked"
    out = bench.root / "data" / "draft" / "chunked"
    seen: set[str] = set()
    etas: list[float] = []

    def at(state: dict) -> bool:
        job = bench.poll().get("draft/chunked", {})
        if "chunk" in job.get("message", ""):
            seen.add(job["message"])
        if job.get("state") == "running" and job.get("eta_s") is not None:
            etas.append(job["eta_s"])
        return json.loads((out / "state.json").read_text() if (out / "state.json").exists() else "{}") == state

    with DiskWatch(out) as watch:
        bench.inv("run")
        wait_for(lambda: at({"pass": 0, "chunk": 1, "phase": "train"}), 240, "chunk 2's training", every=0.05)
        bench.inv("stop", "-d", "draft")
        bench.wait_state("pipeline/run", {"succeeded", "failed", "stopped"}, timeout=60)
        bench.inv("run")  # a fresh run: prep is up to date, the stopped chunked job goes on where it stopped
        wait_for(lambda: at({"pass": -1}) or bench.poll()["pipeline/run"]["state"] != "running",
                 240, "the run to end")
        final = bench.wait_state("pipeline/run", {"succeeded", "failed"}, timeout=60)

    assert final["state"] == "succeeded", bench.inv("logs", "draft", "--stage", "chunked", check=False).stdout
    assert 0 < watch.peak <= budget
    plan = json.loads((out / "chunks.json").read_text())
    chunks = plan["chunks"]
    assert any(f"pass 1/2, chunk 2 of {len(chunks)}" in message for message in seen), seen
    assert etas and all(0 <= eta < 3600 for eta in etas), etas  # a finite time left once a chunk was done
    trained = [json.loads(line) for line in (tmp_path / "trained.jsonl").read_text().splitlines()]
    # A pass per epoch (the default): every chunk extracted and trained once per epoch, the second
    # pass in another order. The stop came during chunk 2's training -- before its trainer ended,
    # or after it and before the driver recorded it -- and the second run went on from there.
    assert len(chunks) >= 2
    second = chunked.pass_order(len(chunks), 1)
    assert [t["pass"] for t in trained] == [f"pass 1, chunk {k + 1}" for k in range(len(chunks))] + \
        [f"pass 2, chunk {k + 1}" for k in second]
    assert [t["epochs"] for t in trained] == [1] * 2 * len(chunks)
    assert [sum(t["inputs"].values()) for t in trained] == plan["records"] + [plan["records"][k] for k in second]


def test_a_stage_s_own_estimate_is_its_time_left_counted_down_since_it_was_said() -> None:
    from remote.control_plane import eta
    from remote.control_plane.progress import Progress

    progress = Progress()
    progress.expect(100, by="step")
    assert "eta_s" not in progress.snapshot()  # nothing measured yet: no estimate, not a guess
    progress.estimate(120.0)
    snapshot = progress.snapshot()
    assert eta.job_eta(snapshot, "running") == pytest.approx(120.0, abs=1.0)
    assert eta.job_eta({**snapshot, "eta_at": snapshot["eta_at"] - 30}, "running") == pytest.approx(90.0, abs=1.0)
    assert eta.job_eta({**snapshot, "eta_at": snapshot["eta_at"] - 300}, "running") == 0.0  # late: never negative
    assert eta.job_eta(snapshot, "succeeded") is None


def test_epochs_spread_over_the_passes_and_each_pass_after_the_first_orders_the_chunks_anew() -> None:
    assert chunked.epochs_per_pass(10, 1) == [10]
    assert chunked.epochs_per_pass(10, 10) == [1] * 10
    assert chunked.epochs_per_pass(10, 3) == [4, 3, 3]
    assert chunked.pass_order(5, 0) == [0, 1, 2, 3, 4]
    orders = [chunked.pass_order(5, p) for p in range(1, 4)]
    assert all(sorted(o) == [0, 1, 2, 3, 4] for o in orders) and len({tuple(o) for o in orders}) > 1
    assert chunked.pass_order(5, 2) == chunked.pass_order(5, 2)  # the same on a resumed run


def test_a_pass_count_outside_one_to_the_epochs_is_one_line(tmp_path: Path) -> None:
    from remote.control_plane.progress import Progress
    from remote.stages import StageContext

    ctx = StageContext(root=tmp_path, release="r", dataset="draft", stage="chunked", source="", kind="native",
                       output=tmp_path / "out", data=tmp_path, config={
                           "prep_inputs": {"A1": str(tmp_path)}, "inventory": {},
                           "stage": {"disk_budget": "1G", "extract": {"passes": 11}, "train": complete("train", {"epochs": 10})}})
    with pytest.raises(StageInputError, match=r"stages.extract.passes 11: expected 1 to stages.train.epochs \(10\)"):
        chunked.Chunked(ctx, Progress())


def test_the_held_out_records_are_the_offline_route_s_and_keep_to_a_quarter_of_the_budget(tmp_path: Path) -> None:
    from remote.eagle3 import heldout
    from remote.control_plane.progress import Progress
    from remote.stages import StageContext

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 785}))
    records = make_records(40, 785, seed=3)
    write_prep(tmp_path / "data" / "A1", records)
    per_token = (len(TINY_LAYERS) + 1) * 64 * 4
    sizes = [chunked.record_size(len(r["input_ids"]), per_token) for r in records]

    def plan(budget: int, fraction: float) -> dict:
        ctx = StageContext(root=tmp_path, release="r", dataset="draft", stage="chunked", source="", kind="native",
                           output=tmp_path / f"out-{budget}-{fraction}", data=tmp_path, config={
                               "prep_inputs": {"A1": str(tmp_path / "data" / "A1" / "prep")},
                               "inventory": {"target": {"model": str(target)}},
                               "stage": {"disk_budget": budget, "extract": complete("extract", EXTRACT),
                                         "train": complete("train", {**TRAIN, "eval_fraction": fraction})}})
        ctx.output.mkdir()
        return chunked.Chunked(ctx, Progress()).plan()

    roomy = plan(sum(sizes), 0.1)
    offline = [chunk_plan.offline_path("A1", i, EXTRACT["shard_size"]) for i in range(40)]
    expected = sorted(int(p.name[5:14]) for p in heldout.split(offline, None, 0.1)[1])
    assert roomy["heldout"] == {"A1": expected} and expected
    tight = plan(sum(sizes) // 3, 0.5)  # half the records asked for; a quarter of the budget holds fewer
    held = tight["heldout"]["A1"]
    assert 0 < len(held) < 20 and sum(sizes[i] for i in held) <= sum(sizes) // 3 * chunk_plan.HELDOUT_SHARE
    room = sum(sizes) // 3 - chunked.reserved(2) - sum(sizes[i] for i in held)
    trained = [i for c in tight["chunks"] for i in c["A1"]]
    assert sorted(trained + held) == list(range(40))  # every record trained on or held out, none twice
    assert all(sum(sizes[i] for i in c["A1"]) <= room for c in tight["chunks"])


def test_a_long_load_keeps_the_job_alive_and_its_error_reaches_the_caller() -> None:
    from remote.orchestration.resident import while_beating

    beats: list[float] = []
    assert while_beating(lambda: time.sleep(0.25) or "model", lambda: beats.append(time.monotonic()), every=0.05) == "model"
    assert len(beats) >= 3  # the job said it was alive while the target loaded
    with pytest.raises(StageInputError, match="no weights"):
        while_beating(lambda: (_ for _ in ()).throw(StageInputError("no weights")), lambda: None, every=0.01)

"""aerie's engine on several processes (`remote.eagle3.distributed`): torchrun's ranks, DDP over gloo on the CPU.

On the demo's data (the reciting target's own answers, tests/test_init_draft.py), through the train stage's
command line as the supervisor runs it: two ranks of one record each train to a held-out accept length within
noise of one process of two records (the same global batch); a run trained by two ranks resumes only with two.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from remote.control_plane.progress import Progress
from remote.eagle3 import distributed
from remote.eagle3.epochs import EpochRecord
from remote.stages import train
from tests.pipeline_fixtures import context, crash_after, demo_target, run_stage
from tests.sglang_real import sglang
from tests.helpers.recital import demo_states, train_env

__all__ = ["demo_states", "demo_target", "sglang"]  # fixtures

pytestmark = pytest.mark.e2e  # the stage's command line, two ranks under torchrun


def trained(states: dict, name: str, nproc: int, batch_size: int, **settings) -> tuple[dict, float, object]:
    env = train_env(states, name, nproc=nproc, batch_size=batch_size, **settings)
    started = time.monotonic()
    result = run_stage("train", env)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    return json.loads((Path(env["AERIE_OUTPUT"]) / "manifest.json").read_text()), seconds, result


@pytest.fixture(scope="module")
def one_and_two(demo_states: dict) -> dict:
    one, one_s, _ = trained(demo_states, "one-rank", 1, 2)
    two, two_s, result = trained(demo_states, "two-ranks", 2, 1)
    print(f"nproc 1 x batch 2: {one_s:.1f} s, accept length {one['accept_length']} {one['accept_interval']}; "
          f"nproc 2 x batch 1: {two_s:.1f} s, accept length {two['accept_length']} {two['accept_interval']}")
    return {"one": one, "two": two, "log": result.stdout + result.stderr}


def test_two_gloo_ranks_train_the_demo_s_data_to_an_accept_length_within_noise_of_one_process(one_and_two: dict) -> None:
    one, two = one_and_two["one"], one_and_two["two"]

    assert (one["nproc"], one["global_batch"]) == (1, 2) and (two["nproc"], two["global_batch"]) == (2, 2)
    assert one["steps"] == two["steps"] and one["records"] == two["records"]  # the same optimizer steps over the same records
    kept_one, kept_two = (EpochRecord(0, None, m["accept_length"], interval=m["accept_interval"]) for m in (one, two))
    assert kept_one.within_noise(kept_two), (one["accept_length"], one["accept_interval"], two["accept_length"], two["accept_interval"])
    assert two["accept_length"] >= 3.0  # it learnt the recital, not merely matched a bad one


def test_only_rank_0_writes_the_draft_the_progress_and_the_measurement(one_and_two: dict) -> None:
    log = one_and_two["log"]
    assert log.count("epoch 0 (before training)") == 1  # measured once, not once per rank
    assert Path(one_and_two["two"]["draft"]).is_dir() and (Path(one_and_two["two"]["draft"]).parent / "last").is_dir()
    assert "Traceback" not in log


def test_the_draft_two_ranks_wrote_loads_in_sglang_s_eagle3_loader(sglang, one_and_two: dict) -> None:
    loaded = sglang.call("load_draft", one_and_two["two"]["draft"])

    assert loaded["nan"] == ["model.embed_tokens.weight"] and loaded["differ"] == []
    assert loaded["hot_token_id_is_d2t_plus_arange"]


def test_a_run_trained_by_one_process_is_not_resumed_by_two_and_says_so_in_one_line(
        demo_states: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    env = train_env(demo_states, "other-nproc", nproc=1, batch_size=2, checkpoint_every=2, epochs=2)
    crash_after(monkeypatch, 3)  # after the checkpoint at step 2
    with pytest.raises(KeyboardInterrupt):
        train.run(context(env), Progress())
    monkeypatch.undo()
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]),
                                      "stage": {**json.loads(env["AERIE_CONFIG"])["stage"], "nproc": 2}})

    result = run_stage("train", env)

    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("train:")]
    assert lines == ["train: stages.train.nproc is 2, but the run to resume was trained by 1 process (its batches count "
                     "1 ranks' records): set nproc: 1 to resume it, or delete its resume/ folder to start over"], result.stderr
    assert result.stderr.strip().splitlines()[-1] == lines[0]  # the job's error is its log's last line


def test_the_rank_named_is_the_one_killed_even_when_another_failed_earlier_on_the_broken_collective(
        tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    def failure(rank: int, exitcode: int, at: float) -> ProcessFailure:
        made = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(tmp_path / "none"))
        made.timestamp = at  # torch's: the rank's error file's time, else when the agent noticed the death
        return made

    killed_later = {0: failure(0, 1, 100.0), 1: failure(1, -9, 100.4)}
    assert distributed.first_cause(killed_later)[0] == 1
    assert distributed.first_cause({0: failure(0, 1, 100.4), 1: failure(1, 3, 100.0)})[0] == 1  # no signal: the first
    # rank 1 refused; rank 0, slower to refuse, was stopped by the agent's SIGTERM
    assert distributed.first_cause({0: failure(0, -15, 100.0), 1: failure(1, 1, 100.2)})[0] == 1


def test_each_rank_takes_its_own_records_of_a_global_batch_and_a_short_last_batch_still_feeds_every_rank() -> None:
    batch = ["a", "b", "c", "d"]
    shares = [distributed.share(batch, distributed.World(rank, 2)) for rank in range(2)]
    assert shares == [["a", "c"], ["b", "d"]]
    assert [distributed.share(["e"], distributed.World(rank, 2)) for rank in range(2)] == [["e"], ["e"]]
    assert distributed.share(batch, distributed.World()) == batch


def test_unset_nproc_is_every_gpu_cuda_visible_devices_leaves_and_one_without_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.eight_h200 import STAND_IN

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert distributed.resolve_nproc(None) == 1 and distributed.resolve_nproc(3) == 3
    (tmp_path / "nvidia-smi").write_text(STAND_IN)
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/bin:/usr/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert distributed.resolve_nproc(None) == 8
    assert distributed.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,3"}) == 2
    assert distributed.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5"}) == 1
    assert distributed.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0


def rank_pids(output: Path, rank: int) -> list[int]:
    """The processes of the train job writing `output` that torchrun started as `rank`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if env.get("AERIE_OUTPUT") == str(output) and env.get("RANK") == str(rank):
            found.append(int(proc.name))
    return found


def test_a_rank_killed_mid_epoch_fails_the_job_and_inv_rerun_failed_resumes_it_to_the_end(
        demo_states: dict, tmp_path: Path) -> None:
    import os
    import shutil
    import signal

    from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
    from tests.helpers.recital import SETTINGS

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    data = bench.root / "data" / "A1"
    shutil.copytree(demo_states["root"] / "data" / "A1" / "prep", data / "prep")
    shutil.copytree(demo_states["extract"], data / "extract")
    settings = {**SETTINGS, "nproc": 2, "batch_size": 1, "epochs": 30, "checkpoint_every": 2}
    bench.host_settings["env"] = {"OMP_NUM_THREADS": "1"}
    bench.inventory({"A1": {"source": "unused", "kind": "native"}},
                    {"extract": {"layers": [0, 1, 2], "dtype": "float32"}, "train": settings},
                    target={"model": str(demo_states["target"]), "tokenizer": str(demo_states["target"])})
    bench.inv("deploy", timeout=300)
    bench.inv("launch", "--stage", "train", "--dataset", "A1")
    output = data / "train"
    wait_for(lambda: (output / "resume" / "state.pt").is_file() and bool(rank_pids(output, 1)), 120, "a checkpoint")

    for pid in rank_pids(output, 1):
        os.kill(pid, signal.SIGKILL)
    failed = bench.wait_state("A1/train", {"failed", "died", "succeeded"}, timeout=120)

    assert failed["state"] == "failed", failed
    log = bench.inv("logs", "A1", "--stage", "train", "-n", "20", check=False).stdout
    assert "rank 1 of 2 was killed by SIGKILL" in log, log
    bench.inv("rerun", "--failed")
    # the relaunched run's end, not the failure it replaces (the state reads `failed` until the relaunch starts)
    wait_for(lambda: bench.poll()["A1/train"].get("started_at") != failed.get("started_at"), 60, "the relaunch")
    done = bench.wait_state("A1/train", {"succeeded", "failed", "died"}, timeout=300)
    manifest = json.loads((output / "manifest.json").read_text())
    assert done["state"] == "succeeded", bench.inv("logs", "A1", "--stage", "train", "-n", "40", check=False).stdout
    assert manifest["resumed_from_step"] > 0 and manifest["nproc"] == 2
    assert manifest["steps"] == 30 * 5  # every step once: 10 records trained, 2 a step
    history = json.loads((output / "history.json").read_text())
    assert [h["step"] for h in history] == list(range(1, 151))

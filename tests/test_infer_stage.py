"""The infer stage against a loopback server that answers by script: retries, skips, resume, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.infer_fixtures import ScriptedServer, completion, last_user, make_prompts, read_jsonl, stage_env, write_prep

from remote.control_plane.progress import Progress
from remote.stages import StageContext
from remote.stages import infer

FAST = {"backoff": 0.01, "retries": 3, "concurrency": 4, "model": "tiny"}


def run_infer(data: Path, settings: dict[str, Any]) -> Progress:
    progress = Progress()
    infer.run_stage(StageContext.from_env(stage_env(data, settings)), progress)
    return progress


def prompt_text(i: int) -> str:
    return make_prompts(i + 1)[i]["conversations"][-1]["content"]


def test_chat_template_kwargs_and_sampling_settings_reach_the_server_and_reasoning_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(3))
    answer = lambda body, attempt: (200, completion("the answer", reasoning="thinking it over"))  # noqa: E731
    settings = {**FAST, "chat_template_kwargs": {"thinking": False}, "max_tokens": 77, "temperature": 0.3, "top_p": 0.9}
    with ScriptedServer(answer) as server:
        run_infer(data, {**settings, "server_url": server.url})

    assert len(server.bodies) == 3
    for body in server.bodies:
        assert body["chat_template_kwargs"] == {"thinking": False}
        assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"]) == ("tiny", 77, 0.3, 0.9)
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
    records = read_jsonl(data / "infer" / "conversations.jsonl")
    assert records[0]["conversations"][-1] == {
        "role": "assistant",
        "content": "the answer",
        "reasoning_content": "thinking it over",
    }


def test_no_chat_template_kwargs_are_sent_when_none_are_set(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(1))
    with ScriptedServer() as server:
        run_infer(data, {**FAST, "server_url": server.url})
    assert "chat_template_kwargs" not in server.bodies[0]


def test_server_errors_and_rate_limits_are_retried_until_answered(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(6))

    def flaky(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        if attempt == 1:
            return 500, {"error": "boom"}
        if attempt == 2 and last_user(body).endswith(("1", "3")):
            return 429, {"error": "slow down"}
        return 200, completion("ok")

    with ScriptedServer(flaky) as server:
        progress = run_infer(data, {**FAST, "server_url": server.url})

    ids = [r["id"] for r in read_jsonl(data / "infer" / "conversations.jsonl")]
    assert sorted(ids) == [f"p{i:03d}" for i in range(6)]
    assert progress.records == 6
    assert progress.skip_reasons == {}
    assert progress.values["retries"] == 6 + 2
    assert len(server.bodies) == 6 * 2 + 2


def test_a_client_error_skips_the_record_for_good_with_its_reason(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(4))
    too_long = prompt_text(2)

    def script(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        return (400, {"error": "too long"}) if last_user(body) == too_long else (200, completion("ok"))

    with ScriptedServer(script) as server:
        progress = run_infer(data, {**FAST, "server_url": server.url})
        again = run_infer(data, {**FAST, "server_url": server.url})

    ids = {r["id"] for r in read_jsonl(data / "infer" / "conversations.jsonl")}
    assert ids == {"p000", "p001", "p003"}
    assert progress.skip_reasons == {"http 400: too long": 1}
    assert server.asked_for().count(too_long) == 1, "a 400 is not retried, not even by the next run with the same settings"
    assert (again.records, again.skip_reasons) == (3, {"http 400: too long": 1})
    manifest = json.loads((data / "infer" / "manifest.json").read_text())
    assert (manifest["records"], manifest["skip_reasons"]) == (3, {"http 400: too long": 1})


def test_a_refusal_is_asked_again_once_the_settings_it_was_refused_under_change(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(4))
    too_long = prompt_text(2)

    def strict(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        return (400, {"error": {"message": "too long"}}) if last_user(body) == too_long else (200, completion("ok"))

    with ScriptedServer(strict) as first, ScriptedServer() as roomier:
        run_infer(data, {**FAST, "server_url": first.url})
        progress = run_infer(data, {**FAST, "server_url": roomier.url})  # stages.infer.server_url edited

    assert roomier.asked_for() == [too_long], "only the refused prompt is asked again, of the new server"
    assert (progress.records, progress.skip_reasons) == (4, {})
    assert {r["id"] for r in read_jsonl(data / "infer" / "conversations.jsonl")} == {f"p00{i}" for i in range(4)}


def test_a_server_that_refuses_every_request_fails_the_run_with_its_words_and_the_fix_is_asked_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(40))

    def pinned(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        if body["model"] != "served":
            return 400, {"detail": f"Server is pinned to 'served'; requested {body['model']!r}."}
        return 200, completion("ok")

    with ScriptedServer(pinned) as server:
        with pytest.raises(infer.InferError, match=r"refused every request and answered none: http 400: Server is "
                                                   r"pinned to 'served'; requested 'tiny'\. \(×\d+\); fix stages.infer"):
            run_infer(data, {**FAST, "server_url": server.url})
        refused = len(server.bodies)
        assert "infer: the server refused prompt" in capsys.readouterr().out
        progress = run_infer(data, {**FAST, "model": "served", "server_url": server.url})

    assert refused < 40, "once every request is refused, the rest are not sent to be refused too"
    assert (progress.records, progress.skip_reasons) == (40, {})
    assert len(read_jsonl(data / "infer" / "conversations.jsonl")) == 40


def test_an_error_body_is_read_for_its_message_on_one_bounded_line() -> None:
    from remote.infer.client import DETAIL_LIMIT, error_detail

    assert error_detail(b'{"error": {"message": "model  not\\nfound", "type": "x"}}') == "model not found"
    assert error_detail(b'{"detail": "pinned"}') == "pinned"
    assert error_detail(b'{"detail": [{"loc": ["body"], "msg": "bad"}]}') == '[{"loc": ["body"], "msg": "bad"}]'
    assert error_detail(b"<html>Bad Request</html>") == "<html>Bad Request</html>"
    assert error_detail(b"") == ""
    long = error_detail(b"x" * 100_000)
    assert len(long) == DETAIL_LIMIT and long.endswith("…")


def test_a_record_that_keeps_failing_fails_the_job_and_is_counted_by_reason(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(5))
    broken = prompt_text(4)

    def script(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        return (503, {}) if last_user(body) == broken else (200, completion("ok"))

    with ScriptedServer(script) as server:
        with pytest.raises(infer.InferError, match=r"1 of 5 prompts not answered \(http 503: 1\)"):
            run_infer(data, {**FAST, "retries": 2, "server_url": server.url})

    assert server.asked_for().count(broken) == 3
    assert not (data / "infer" / "conversations.jsonl").exists()
    assert not (data / "infer" / "manifest.json").exists()
    ids = {r["id"] for r in read_jsonl(data / "infer" / infer.PART)}
    assert ids == {"p000", "p001", "p002", "p003"}


def test_a_torn_last_line_is_discarded_and_only_its_record_is_asked_again(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    output = data / "infer"
    write_prep(data, make_prompts(5))
    with ScriptedServer() as server:
        run_infer(data, {**FAST, "server_url": server.url})
        # A crash in the middle of the last append: half a line on disk.
        lines = (output / "conversations.jsonl").read_bytes().splitlines(keepends=True)
        torn_id = json.loads(lines[-1])["id"]
        (output / "conversations.jsonl").unlink()
        (output / infer.PART).write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
        server.bodies.clear()
        progress = run_infer(data, {**FAST, "server_url": server.url})

    assert [m["messages"][-1]["content"] for m in server.bodies] == [prompt_text(int(torn_id[1:]))]
    ids = [r["id"] for r in read_jsonl(output / "conversations.jsonl")]
    assert sorted(ids) == [f"p{i:03d}" for i in range(5)]
    assert progress.records == 5


def test_a_finished_dataset_run_again_asks_for_nothing_and_keeps_its_records(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(3))
    with ScriptedServer() as server:
        run_infer(data, {**FAST, "server_url": server.url})
        server.bodies.clear()
        progress = run_infer(data, {**FAST, "server_url": server.url})
    assert server.bodies == []
    assert progress.records == 3
    assert len(read_jsonl(data / "infer" / "conversations.jsonl")) == 3


def test_new_prompts_from_prep_start_the_answers_over(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(3))
    with ScriptedServer() as server:
        run_infer(data, {**FAST, "server_url": server.url})
        write_prep(data, make_prompts(2), release="r2")
        progress = run_infer(data, {**FAST, "server_url": server.url})
    assert progress.records == 2
    assert [r["id"] for r in read_jsonl(data / "infer" / "conversations.jsonl")] in (["p000", "p001"], ["p001", "p000"])
    assert json.loads((data / "infer" / "manifest.json").read_text())["upstream"]["release"] == "r2"


def test_changed_sampling_settings_are_refused_instead_of_mixed_into_one_dataset(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(2))
    with ScriptedServer() as server:
        run_infer(data, {**FAST, "server_url": server.url})
        with pytest.raises(infer.InferError, match=r"settings changed .*temperature 0.7 -> 0.2.*delete .*infer"):
            run_infer(data, {**FAST, "temperature": 0.2, "server_url": server.url})


def run_main(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> str:
    for key in [k for k in os.environ if k.startswith("AERIE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exit_info:
        infer.main()
    return str(exit_info.value.code)


def test_input_from_a_prep_job_that_never_finished_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data" / "B5"
    (data / "prep").mkdir(parents=True)
    (data / "prep" / "prompts.jsonl").write_text("")  # half-written: no manifest yet
    message = run_main(monkeypatch, stage_env(data, FAST))
    assert message.startswith("infer: no prep manifest at ")
    assert "inv launch --stage prep --dataset B5" in message and "\n" not in message


def test_a_prep_manifest_without_prompts_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data" / "A1"
    write_prep(data, [])
    (data / "prep" / "prompts.jsonl").unlink()
    message = run_main(monkeypatch, stage_env(data, FAST))
    assert message.startswith("infer: no prompts.jsonl in ") and "kind: prompts" in message


def test_a_bad_setting_is_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(1))
    message = run_main(monkeypatch, stage_env(data, {**FAST, "concurrency": 0}))
    assert message == "infer: stages.infer.concurrency: expected auto or an integer >= 1 (got 0)"


def test_no_server_at_the_address_fails_at_once_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.harness.sshd import free_port

    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(3))
    url = f"http://127.0.0.1:{free_port()}/v1"
    message = run_main(monkeypatch, stage_env(data, {**FAST, "server_url": url}))
    assert message.startswith(f"infer: no inference server answers at {url} (") and "stages.infer.server_url" in message
    assert not (data / "infer" / infer.PART).exists()


@pytest.mark.e2e
def test_auto_concurrency_settles_near_the_knee_of_a_saturating_server_and_reports_it(tmp_path: Path) -> None:
    from benchmarks.harness.saturating_server import SaturatingServer

    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(240))
    with SaturatingServer(knee=8, per_request=200, tokens=50) as server:
        progress = run_infer(data, {"server_url": server.url, "model": "stand-in", "concurrency": "auto",
                                    "max_concurrency": 128})
    assert progress.records == 240
    assert progress.total == 240
    # Pinned 64 is eight times the knee; auto must have come back to it (it starts at 8, may probe 6 or 12).
    assert 4 <= progress.values["concurrency"] <= 16
    assert progress.values["tokens_per_s"] > 0
    assert progress.values["completion_tokens"] == 240 * 50


def test_a_pinned_concurrency_never_moves(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    write_prep(data, make_prompts(20))
    with ScriptedServer() as server:
        progress = run_infer(data, {**FAST, "server_url": server.url, "concurrency": 3})
    assert progress.values["concurrency"] == 3


def test_a_rerun_that_fails_leaves_the_finished_answers_and_manifest_in_place(tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    output = data / "infer"
    write_prep(data, make_prompts(4))
    too_long = prompt_text(1)

    def strict(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        return (400, {"detail": "too long"}) if last_user(body) == too_long else (200, completion("ok"))

    with ScriptedServer(strict) as first, ScriptedServer(lambda body, attempt: (503, {})) as down, \
            ScriptedServer() as good:
        run_infer(data, {**FAST, "server_url": first.url})
        finished = (output / "conversations.jsonl").read_bytes(), (output / "manifest.json").read_bytes()
        with pytest.raises(infer.InferError, match="1 of 4 prompts not answered"):
            run_infer(data, {**FAST, "retries": 0, "server_url": down.url})  # the refused one, asked again
        assert ((output / "conversations.jsonl").read_bytes(), (output / "manifest.json").read_bytes()) == finished
        progress = run_infer(data, {**FAST, "server_url": good.url})

    assert good.asked_for() == [too_long]
    ids = [r["id"] for r in read_jsonl(output / "conversations.jsonl")]
    assert sorted(ids) == [f"p00{i}" for i in range(4)] and progress.records == 4
    assert json.loads((output / "manifest.json").read_text())["records"] == 4
    assert not (output / infer.PART).exists()

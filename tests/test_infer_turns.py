"""Regeneration as the target is used: every turn in order, tools and their calls, truncations, counts.

The infer stage against a loopback server that answers deterministically from what it is asked
(`tests.infer_fixtures.echo_target`) and logs every request; the prompts are what prep makes of real
dataset rows (`tests.regeneration_rows`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.infer_fixtures import ScriptedServer, echo_target, read_jsonl, stage_env, write_prep
from tests.regeneration_rows import WEATHER, agent, five_turns, long_second_turn, prompts

from remote.control_plane.progress import Progress
from remote.infer.conversation import regenerate
from remote.infer.client import Answer, Result
from remote.stages import StageContext, infer

FAST = {"backoff": 0.01, "retries": 2, "concurrency": 4, "model": "tiny"}


def run_infer(data: Path, settings: dict[str, Any]) -> Progress:
    progress = Progress()
    infer.run_stage(StageContext.from_env(stage_env(data, settings)), progress)
    return progress


def answered(data: Path, server: ScriptedServer, rows: list[dict[str, Any]], **settings: Any) -> dict[str, Any]:
    write_prep(data, prompts(rows))
    run_infer(data, {**FAST, **settings, "server_url": server.url})
    return {r["id"]: r for r in read_jsonl(data / "infer" / "conversations.jsonl")}


def manifest(data: Path) -> dict[str, Any]:
    return json.loads((data / "infer" / "manifest.json").read_text())


def requests_of(server: ScriptedServer, first_user: str) -> list[list[dict[str, Any]]]:
    return [b["messages"] for b in server.bodies if [m for m in b["messages"] if m["role"] == "user"][0]["content"]
            == first_user]


def test_each_user_turn_of_a_five_turn_row_is_answered_in_order_after_the_targets_own_answers(tmp_path: Path) -> None:
    with ScriptedServer(echo_target) as server:
        [record] = answered(tmp_path / "data" / "U", server, [five_turns()]).values()

    asked = requests_of(server, "question 1")
    assert len(asked) == 5
    for k, messages in enumerate(asked, start=1):
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * (k - 1) + ["user"]
        assert [m["content"] for m in messages if m["role"] == "assistant"] == [
            f"answer {j} to question {j}" for j in range(1, k)], "the target's own answers, never the originals"
        assert all(m["reasoning_content"] == f"thinking {j}" for j, m in enumerate(
            (m for m in messages if m["role"] == "assistant"), start=1)), "reasoning goes back for the template"
    assert [t["content"] for t in record["conversations"] if t["role"] == "assistant"] == [
        f"answer {k} to question {k}" for k in range(1, 6)]
    assert [t["reasoning_content"] for t in record["conversations"] if t["role"] == "assistant"] == [
        f"thinking {k}" for k in range(1, 6)]
    assert record["regenerated"] == {"turns": 5, "finish_reasons": ["stop"] * 5, "ended": None, "dropped": 0}
    assert "ORIGINAL" not in json.dumps(record)


def test_turns_first_asks_the_system_prompt_and_first_user_turn_alone_as_before_and_counts_the_rest(
        tmp_path: Path) -> None:
    data = tmp_path / "data" / "U"
    with ScriptedServer(echo_target) as server:
        records = answered(data, server, [five_turns(), agent("matching", "Lima")], turns="first")

    assert sorted((b["messages"] for b in server.bodies), key=len) == [
        [{"role": "user", "content": 'call get_weather {"city": "Lima"}'}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "question 1"}]]
    assert not any("tools" in body for body in server.bodies), "as infer asked before it sent tools"
    assert records["chat5"]["conversations"] == [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "question 1"},
        {"role": "assistant", "content": "answer 1 to question 1", "reasoning_content": "thinking 1"}]
    assert "tools" not in records["matching"]
    assert manifest(data)["turns"]["not_regenerated"] == {"beyond turns: first": 4 + 2}


def test_a_matching_call_gets_the_original_tool_result_and_the_conversation_goes_on(tmp_path: Path) -> None:
    data = tmp_path / "data" / "T"
    with ScriptedServer(echo_target) as server:
        [record] = answered(data, server, [agent("matching", "Lima")]).values()

    assert all(body["tools"] == WEATHER for body in server.bodies)
    second = server.bodies[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "srv_1"
    assert second[-1] == {"role": "tool", "tool_call_id": "srv_1", "content": "22 C"}, \
        "the original result, answering the target's own call"
    roles = [t["role"] for t in record["conversations"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    call = record["conversations"][1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    assert record["conversations"][3]["content"] == "answer 2: the tool said 22 C"
    assert record["conversations"][5]["content"] == "answer 3 to thanks"
    assert record["tools"] == WEATHER
    assert record["regenerated"]["finish_reasons"] == ["tool_calls", "stop", "stop"]


def test_a_diverging_call_ends_the_conversation_after_it_and_is_counted(tmp_path: Path) -> None:
    data = tmp_path / "data" / "T"
    with ScriptedServer(echo_target) as server:
        progress = Progress()
        write_prep(data, prompts([agent("diverging", "Quito")]))
        infer.run_stage(StageContext.from_env(stage_env(data, {**FAST, "server_url": server.url})), progress)
    [record] = read_jsonl(data / "infer" / "conversations.jsonl")

    assert len(server.bodies) == 1, "nothing is asked after a call the row never made"
    assert [t["role"] for t in record["conversations"]] == ["user", "assistant"]
    assert json.loads(record["conversations"][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Quito"}
    assert record["regenerated"]["ended"] == "tool call diverged"
    turns = manifest(data)["turns"]
    assert turns["not_regenerated"] == {"tool call diverged": 2}
    assert turns["conversations_ended"] == {"tool call diverged": 1}
    assert (progress.values["tool_calls_diverged"], progress.values["turns_not_regenerated"]) == (1, 2)


def test_a_truncated_turn_is_counted_and_kept_under_keep_ending_its_conversation(tmp_path: Path) -> None:
    data = tmp_path / "data" / "L"
    with ScriptedServer(echo_target) as server:
        [record] = answered(data, server, [long_second_turn()]).values()

    assert [t["content"] for t in record["conversations"] if t["role"] == "assistant"] == [
        "answer 1 to first", "answer 2 to second [long]"]
    assert record["regenerated"]["finish_reasons"] == ["stop", "length"]
    turns = manifest(data)["turns"]
    assert (turns["truncated"], turns["truncated_dropped"], turns["not_regenerated"]) == (1, 0, {"truncated": 1})


def test_a_truncated_turn_is_dropped_under_drop_and_a_row_left_with_none_is_skipped_with_the_reason(
        tmp_path: Path) -> None:
    data = tmp_path / "data" / "L"
    only_long = {"id": "only", "conversations": [{"from": "human", "value": "[long] one"}]}
    with ScriptedServer(echo_target) as server:
        records = answered(data, server, [long_second_turn(), only_long], truncated="drop")

    assert list(records) == ["long"]
    assert [t["content"] for t in records["long"]["conversations"] if t["role"] == "assistant"] == ["answer 1 to first"]
    found = manifest(data)
    assert found["skip_reasons"] == {"truncated": 1}
    assert (found["turns"]["truncated"], found["turns"]["truncated_dropped"]) == (1, 1)
    assert found["turns"]["not_regenerated"] == {"truncated": 2}


def test_a_refusal_after_the_first_turn_keeps_the_answers_before_it_and_counts_the_turns_left(tmp_path: Path) -> None:
    data = tmp_path / "data" / "U"

    def refuses_question_3(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        if body["messages"][-1]["content"] == "question 3":
            return 400, {"error": {"message": "prompt too long"}}
        return echo_target(body)

    with ScriptedServer(refuses_question_3) as server:
        [record] = answered(data, server, [five_turns()]).values()
    assert len([t for t in record["conversations"] if t["role"] == "assistant"]) == 2
    assert manifest(data)["turns"]["not_regenerated"] == {"http 400: prompt too long": 3}


def test_a_record_the_server_fails_half_way_is_asked_again_whole_and_ends_as_an_uninterrupted_run(
        tmp_path: Path) -> None:
    rows = [five_turns(), agent("matching", "Lima"), long_second_turn()]
    with ScriptedServer(echo_target) as server:
        whole = answered(tmp_path / "once" / "U", server, rows)

    data = tmp_path / "twice" / "U"
    down = {"after": 6}  # the five-turn row, then the first turn of the agent row

    def dies(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        down["after"] -= 1
        return (503, {}) if down["after"] < 0 else echo_target(body)

    write_prep(data, prompts(rows))
    with ScriptedServer(dies) as failing, ScriptedServer(echo_target) as back:
        try:
            run_infer(data, {**FAST, "retries": 0, "concurrency": 1, "server_url": failing.url})
            raise AssertionError("a run whose server died must fail")
        except infer.InferError as error:
            assert "prompts not answered" in str(error)
        half = read_jsonl(data / "infer" / infer.PART)
        assert any(b["messages"][0]["content"].startswith("call get_weather") for b in failing.bodies[5:])
        run_infer(data, {**FAST, "concurrency": 1, "server_url": back.url})

    assert [r["id"] for r in half] == ["chat5"], "the half-answered agent row is not kept"
    again = {r["id"]: r for r in read_jsonl(data / "infer" / "conversations.jsonl")}
    assert again == whole
    assert manifest(tmp_path / "twice" / "U")["turns"] == manifest(tmp_path / "once" / "U")["turns"]


def test_calls_match_by_name_and_arguments_as_json_in_any_order() -> None:
    def call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    original = [call("a", '{"x": 1, "y": [1, 2]}', "o1"), call("b", "{}", "o2")]
    record = {"id": "r", "tools": WEATHER, "conversations": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": original},
        {"role": "tool", "tool_call_id": "o1", "content": "A"}, {"role": "tool", "tool_call_id": "o2", "content": "B"}]}
    asked = []

    def ask(calls: list[dict[str, Any]]) -> Any:
        def reply(request: dict[str, Any]) -> Result:
            asked.append(request["conversations"])
            made = calls if len(asked) == 1 else None
            return Result(request, Answer("" if made else "done", None, "stop", 1, made))
        return reply

    same = regenerate(record, ask([call("b", " {} ", "m2"), call("a", '{"y":[1,2],"x":1}', "m1")]))
    assert same.ended is None and same.answered == 2
    assert [t["tool_call_id"] for t in asked[1] if t["role"] == "tool"] == ["m1", "m2"]
    asked.clear()
    other = regenerate(record, ask([call("a", '{"x": 2, "y": [1, 2]}', "m1"), call("b", "{}", "m2")]))
    assert other.ended == "tool call diverged" and len(asked) == 1


def test_with_return_token_ids_each_answer_keeps_the_ids_the_server_generated(tmp_path: Path) -> None:
    def with_ids(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        status, payload = echo_target(body)
        n = sum(m["role"] == "assistant" for m in body["messages"]) + 1
        payload["choices"][0]["response_token_ids"] = [n, n, n]
        return status, payload

    with ScriptedServer(with_ids) as server:
        [record] = answered(tmp_path / "data" / "U", server, [five_turns()], return_token_ids=True).values()
    assert all(body["return_token_ids"] is True for body in server.bodies)
    assert all("output_ids" not in m for body in server.bodies for m in body["messages"]), "ids are not sent back"
    assert [t["output_ids"] for t in record["conversations"] if t["role"] == "assistant"] == [[k] * 3 for k in range(1, 6)]


def test_return_token_ids_is_not_sent_unless_set(tmp_path: Path) -> None:
    with ScriptedServer(echo_target) as server:
        answered(tmp_path / "data" / "U", server, [five_turns()])
    assert not any("return_token_ids" in body for body in server.bodies)

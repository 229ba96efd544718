"""Rows come from JSONL, JSON arrays, Parquet and directories; a broken line never stops a file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from remote.prep.errors import PrepError
from remote.prep.load import Malformed, Source, iter_rows
from remote.prep.preparer import run_prep
from remote.prep.prep_settings import Target
from tests.settings import prep_settings
from tests.prep_fixtures import FIXTURES, read_rows, tiny_tokenizer, tiny_tokenizer_dir  # noqa: F401


def test_jsonl_with_a_broken_line_yields_a_malformed_row_and_reads_on():
    rows = list(iter_rows(Source(str(FIXTURES / "mixed.jsonl"))))
    assert len(rows) == 11
    assert rows[2] == Malformed("malformed JSON line")
    assert rows[3]["id"] == "m-4"


def test_a_json_array_file_gives_its_items_as_rows():
    rows = list(iter_rows(Source(str(FIXTURES / "array.json"))))
    assert [r["id"] for r in rows] == ["arr-1", "arr-2"]


def test_jsonl_under_a_json_name_is_still_read():
    rows = list(iter_rows(Source(str(FIXTURES / "sharegpt.jsonl")), base=FIXTURES))
    assert len(rows) == 3


def test_parquet_rows_with_a_unified_schema_are_read(tmp_path):
    rows = read_rows("ultrachat.jsonl")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "part-0.parquet")
    assert list(iter_rows(Source(str(tmp_path / "part-0.parquet")))) == rows


def test_a_directory_source_reads_every_data_file_in_name_order(tmp_path):
    (tmp_path / "b.jsonl").write_text((FIXTURES / "sharegpt.jsonl").read_text())
    (tmp_path / "a.json").write_text((FIXTURES / "array.json").read_text())
    (tmp_path / "notes.txt").write_text("not data")
    rows = list(iter_rows(Source(str(tmp_path))))
    assert [r.get("id") or r.get("uuid") for r in rows] == ["arr-1", "arr-2", "sg-1", "sg-2", "magpie-7c1d"]


def test_limit_stops_after_that_many_rows():
    assert len(list(iter_rows(Source(str(FIXTURES / "mixed.jsonl"), limit=4)))) == 4


def test_a_relative_source_is_taken_from_the_base_directory():
    rows = list(iter_rows(Source("array.json"), base=FIXTURES))
    assert len(rows) == 2


def test_a_missing_file_is_a_clear_error_not_a_hub_lookup(tmp_path):
    with pytest.raises(PrepError, match=r"dataset file .*missing\.jsonl does not exist: fix datasets.<name>.source"):
        iter_rows(Source("missing.jsonl"), base=tmp_path)


def test_an_uncached_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PrepError, match=r"cannot load dataset 'aerie-test/not-cached' .*HF_DATASETS_OFFLINE"):
        iter_rows(Source("aerie-test/not-cached"))


def test_a_hub_datasets_revision_is_asked_for_and_named_when_it_cannot_be_loaded(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = Source.from_config("aerie-test/not-cached", {"revision": "0123abc", "split": "test"})
    assert source.revision == "0123abc"
    with pytest.raises(PrepError, match=r"cannot load dataset 'aerie-test/not-cached' \(config None, split test, "
                                        r"revision 0123abc\): "):
        iter_rows(source)


def test_a_revision_that_names_nothing_is_refused_in_one_line():
    with pytest.raises(PrepError, match=r"^revision must be a commit, tag or branch of the hub dataset \(got ''\)$"):
        Source.from_config("org/data", {"revision": ""})


def test_mixed_formats_in_one_file_are_each_detected_and_every_row_is_accounted_for(tiny_tokenizer):
    settings = prep_settings()
    rows = iter_rows(Source(str(FIXTURES / "mixed.jsonl")))
    summary = run_prep(rows, ("native", "T", Target(), settings, tiny_tokenizer), settings)
    assert summary.rows == 11
    assert summary.kept + summary.skipped == summary.rows
    assert summary.formats == {"sharegpt": 1, "openai": 1, "agent_trajectory": 1, "swe_agent": 1}
    assert summary.skip_reasons == {
        "malformed JSON line": 1,
        "unknown role 'narrator'": 1,
        "no conversations field (keys: id, text)": 1,
        "no assistant turn": 1,
        "image in the row (content part 'image_url')": 1,
        "row is not an object (list)": 1,
        "field 'messages' is text but not JSON": 1,
    }


def test_parquet_rows_of_two_families_unified_by_arrow_go_through_prep(tmp_path, tiny_tokenizer):
    # Arrow gives each row every column, absent ones as None: both rows must still map.
    tools_row = {**read_rows("openai_tools.jsonl")[1], "conversations": None}  # from_pylist reads keys off row 0
    table = pa.Table.from_pylist([tools_row, read_rows("sharegpt.jsonl")[0]])
    assert table.column("tools").to_pylist()[1] is None
    pq.write_table(table, tmp_path / "mixed.parquet")
    settings = prep_settings()
    rows = iter_rows(Source(str(tmp_path / "mixed.parquet")))
    summary = run_prep(rows, ("native", "T", Target(), settings, tiny_tokenizer), settings)
    assert (summary.rows, summary.kept) == (2, 2), summary.skip_reasons
    assert summary.formats == {"openai_tools": 1, "sharegpt": 1}


# -- hostile bytes -----------------------------------------------------------------


def test_a_row_with_bad_utf8_is_skipped_with_a_reason_and_its_neighbours_kept(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b\xff\xfe"}\n{"id": "c"}\n')
    assert list(iter_rows(Source(str(path)))) == [{"id": "a"}, Malformed("invalid UTF-8"), {"id": "c"}]


def test_lines_split_on_newline_only_so_a_stray_carriage_return_stays_in_its_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": "a", "text": "one\rtwo"}\r\n{"id": "b"}\n')
    assert list(iter_rows(Source(str(path)))) == [{"id": "a", "text": "one\rtwo"}, {"id": "b"}]


def test_a_truncated_json_array_keeps_its_complete_rows(tmp_path):
    import json

    rows = [{"id": f"r{i}", "text": 'quotes " and ] and , inside', "nested": [{"a": [1, 2]}]} for i in range(3)]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows)[:-25])
    assert list(iter_rows(Source(str(path)))) == rows[:2] + [Malformed("the file ends inside a row (truncated?)")]


def test_an_overlong_row_is_skipped_without_being_held_in_memory(tmp_path, monkeypatch):
    import tracemalloc

    from remote.prep import load

    monkeypatch.setattr(load, "MAX_ROW_BYTES", 1 << 20)
    row = b'{"id": "big", "text": "' + b"x" * (8 << 20) + b'"}'
    (tmp_path / "rows.jsonl").write_bytes(b'{"id": "a"}\n' + row + b'\n{"id": "b"}\n')
    (tmp_path / "rows.json").write_bytes(b'[{"id": "a"}, ' + row + b', {"id": "b"}]')
    for name in ("rows.jsonl", "rows.json"):
        tracemalloc.start()
        rows = list(iter_rows(Source(str(tmp_path / name))))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert rows == [{"id": "a"}, Malformed("row longer than 1,048,576 bytes"), {"id": "b"}], name
        assert peak < 6 << 20, f"{name}: peak {peak:,} bytes for an 8 MiB row"

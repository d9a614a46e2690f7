"""Task files: exact round trips (JSONL, Parquet) and errors that name file, line/row and field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.builtin.generator import generate_tasks
from agentrl.envs.sources import resolve_task_source
from agentrl.tasks.io import TaskFileError, load_tasks, save_tasks


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(30, seed=3, id_prefix="io")


def _dump(tasks):
    return [t.model_dump() for t in tasks]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_round_trip(tmp_path, tasks, suffix):
    path = tmp_path / "sub" / f"tasks.{suffix}"
    save_tasks(tasks, path)
    assert _dump(load_tasks(path)) == _dump(tasks)
    assert _dump(load_tasks(str(path))) == _dump(tasks)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left behind
    save_tasks([], path)
    assert load_tasks(path) == []


def test_parquet_has_index_columns(tmp_path, tasks):
    path = tmp_path / "t.parquet"
    save_tasks(tasks, path)
    table = pq.read_table(path)
    assert table.column_names == ["id", "domain", "category", "backend", "task"]
    assert table.column("id").to_pylist() == [t.id for t in tasks]


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6))
def test_round_trip_any_seed(tmp_path_factory, seed):
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    ts = generate_tasks(2, seed=seed)
    save_tasks(ts, path)
    assert _dump(load_tasks(path)) == _dump(ts)


def _write_lines(path, tasks, broken_line: int, mutate):
    lines = [t.model_dump(mode="json") for t in tasks]
    texts = [json.dumps(d) for d in lines]
    texts[broken_line - 1] = mutate(lines[broken_line - 1])
    path.write_text("\n".join(texts) + "\n")


def test_jsonl_error_names_file_line_and_field(tmp_path, tasks):
    path = tmp_path / "tasks.jsonl"

    def drop_name(d):
        d["turns"][0]["gold"] = [[{"arguments": {}}]]
        return json.dumps(d)

    _write_lines(path, tasks[:4], 3, drop_name)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert str(err.value) == f"{path}:3: turns.0.gold.0.0.name: Field required"
    assert isinstance(err.value, ValueError)


def test_jsonl_invalid_json_and_blank_lines(tmp_path, tasks):
    path = tmp_path / "tasks.jsonl"
    _write_lines(path, tasks[:3], 2, lambda d: json.dumps(d)[:-5])
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:2: invalid JSON"):
        load_tasks(path)
    path.write_text("\n" + tasks[0].model_dump_json() + "\n\n[1, 2]\n")
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:4: expected a JSON object"):
        load_tasks(path)


def test_jsonl_type_errors_reference_errors_and_duplicates(tmp_path, tasks):
    path = tmp_path / "tasks.jsonl"

    def bad_type(d):
        d["turns"][1 if len(d["turns"]) > 1 else 0]["user"] = 5
        d["category"] = "weird"
        return json.dumps(d)

    _write_lines(path, tasks[:2], 1, bad_type)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:1: ") and "category: Input should be" in msg and ".user: Input should be a valid string" in msg

    def unknown_tool(d):
        d["tools"] = d["tools"][:1]
        return json.dumps(d)

    _write_lines(path, [t for t in tasks if len(t.tools) > 1 and t.turns[0].gold][:1], 1, unknown_tool)
    with pytest.raises(TaskFileError, match=r":1: <task>: Value error, .*unknown tool"):
        load_tasks(path)

    path.write_text(tasks[0].model_dump_json() + "\n" + tasks[0].model_dump_json() + "\n")
    with pytest.raises(TaskFileError, match=rf"{path.name}:2: id: duplicate task id 'io-00000' \(first at .*:1\)"):
        load_tasks(path)


def test_parquet_errors_name_row_and_field(tmp_path, tasks):
    path = tmp_path / "tasks.parquet"
    rows = [t.model_dump(mode="json") for t in tasks[:3]]
    del rows[1]["turns"][0]["user"]
    pq.write_table(pa.table({"task": [json.dumps(r) for r in rows]}), path)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert str(err.value) == f"{path}:row 1: turns.0.user: Field required"

    pq.write_table(pa.table({"other": ["x"]}), path)
    with pytest.raises(TaskFileError, match="missing column 'task'"):
        load_tasks(path)
    pq.write_table(pa.table({"task": ["{not json"]}), path)
    with pytest.raises(TaskFileError, match=r":row 0: invalid JSON"):
        load_tasks(path)
    path.write_text("not parquet at all")
    with pytest.raises(TaskFileError, match="not a readable Parquet file"):
        load_tasks(path)


def test_unsupported_and_missing_files(tmp_path):
    with pytest.raises(TaskFileError, match=r"tasks\.csv.*\.jsonl or \.parquet"):
        load_tasks(tmp_path / "tasks.csv")
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "absent.jsonl")


def test_resolve_task_source(tmp_path, tasks):
    train = resolve_task_source("builtin:train")
    assert len(train) == 400 and train[0].id == "builtin-train-00000"
    assert len(resolve_task_source("builtin:heldout")) == 200
    path = tmp_path / "mine.jsonl"
    save_tasks(tasks[:5], path)
    assert _dump(resolve_task_source(str(path))) == _dump(tasks[:5])
    for bad in ("builtin:valid", "nowhere.jsonl", "gsm8k"):
        with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
            resolve_task_source(bad)

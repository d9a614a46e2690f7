"""``agentrl.common.files.atomic_write``: the file holds the new data or the old, never a part,
and no temporary file is left behind."""

from __future__ import annotations

import os

import pytest

from agentrl.common import files
from agentrl.common.files import atomic_write, fsync_path


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_writes_bytes_and_text_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    atomic_write(path, b"\x00\xffbytes")
    assert path.read_bytes() == b"\x00\xffbytes"
    atomic_write(path, "tëxt\n")  # replaces; text is UTF-8 unless told
    assert path.read_bytes() == "tëxt\n".encode()
    atomic_write(path, "tëxt", encoding="latin-1")
    assert path.read_bytes() == "tëxt".encode("latin-1")
    assert _names(tmp_path) == ["state.json"]


def test_a_new_file_gets_the_permissions_open_gives(tmp_path):
    atomic_write(tmp_path / "a", b"x")
    (tmp_path / "b").write_bytes(b"x")
    assert (tmp_path / "a").stat().st_mode == (tmp_path / "b").stat().st_mode


def test_text_that_cannot_be_encoded_leaves_the_old_content(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(path, "caf\udce9")  # a lone surrogate: not UTF-8
    assert path.read_text() == "old\n" and _names(tmp_path) == ["tasks.jsonl"]


@pytest.mark.parametrize("old", [b"checkpoint-2\n", None])
@pytest.mark.parametrize("fails", ["write", "fsync", "replace"])
def test_a_failure_mid_write_leaves_the_old_content_and_no_temp_file(tmp_path, monkeypatch, fails, old):
    path = tmp_path / "latest"
    if old is not None:
        path.write_bytes(old)

    def boom(*args):
        raise OSError(f"{fails} failed")

    if fails == "write":  # the data is a bytes-like object whose buffer cannot be read
        data = memoryview(b"checkpoint-4\n")
        data.release()
    else:
        data = b"checkpoint-4\n"
        monkeypatch.setattr(files.os, fails, boom)
    with pytest.raises((OSError, ValueError)):
        atomic_write(path, data)
    monkeypatch.undo()
    assert _names(tmp_path) == ([] if old is None else ["latest"])
    assert old is None or path.read_bytes() == old


def test_fsync_path_takes_files_and_folders(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    fsync_path(tmp_path / "f")
    fsync_path(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_path(tmp_path / "nope")
    assert os.path.exists(tmp_path / "f")

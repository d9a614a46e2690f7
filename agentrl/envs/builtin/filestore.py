"""FileStore: short text files addressed by id, found by path. Copies get fresh ids, which gives
plans long id chains (find -> copy -> copy -> read) without any arithmetic."""

from __future__ import annotations

from typing import TypedDict

from agentrl.envs.builtin.base import Domain, ToolError, check_text


class FileId(TypedDict):
    file_id: str


class FileContent(TypedDict):
    path: str
    text: str


class Deleted(TypedDict):
    deleted: str


class FileStore(Domain):
    """State: ``{"seq": int, "files": {id: {"path": str, "text": str}}}``; paths are unique."""

    id_prefix = "F"
    records_key = "files"

    def _check_free(self, path: str) -> None:
        check_text(path, "path", 64)
        if any(f["path"] == path for f in self.records.values()):
            raise ToolError(f"a file already exists at {path}")

    def write_file(self, path: str, text: str) -> FileId:
        """Create a new file with the given text and return its id.

        Args:
            path: Path of the new file, e.g. notes.txt.
            text: Content of the file.
        """
        self._check_free(path)
        check_text(text, "text")
        file_id = self._new_id()
        self.records[file_id] = {"path": path, "text": text}
        return {"file_id": file_id}

    def read_file(self, file_id: str) -> FileContent:
        """Return the path and text of a file.

        Args:
            file_id: Id of the file, e.g. F1234.
        """
        f = self._get(file_id, "file")
        return {"path": f["path"], "text": f["text"]}

    def copy_file(self, file_id: str, path: str) -> FileId:
        """Copy a file to a new path and return the id of the copy.

        Args:
            file_id: Id of the file to copy.
            path: Path of the copy.
        """
        source = self._get(file_id, "file")
        self._check_free(path)
        new_id = self._new_id()
        self.records[new_id] = {"path": path, "text": source["text"]}
        return {"file_id": new_id}

    def delete_file(self, file_id: str) -> Deleted:
        """Delete a file.

        Args:
            file_id: Id of the file, e.g. F1234.
        """
        self._get(file_id, "file")
        del self.records[file_id]
        return {"deleted": file_id}

    def find_file(self, path: str) -> FileId:
        """Return the id of the file at a path.

        Args:
            path: Path of the file, e.g. notes.txt.
        """
        for file_id, f in self.records.items():
            if f["path"] == path:
                return {"file_id": file_id}
        raise ToolError(f"no file at {path}")

"""A real `pyarrow.fs` filesystem that serves another one and counts what is read from it: the bytes
`compile_tuned` transfers from an export at a URI, measured where they cross."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs


class CountingHandler(pafs.FileSystemHandler):
    """Every call goes to `inner`; each file opened for reading is read whole from it, and its
    bytes and path are counted (`bytes_read`, `opened`)."""

    def __init__(self, inner: pafs.FileSystem):
        self.inner = inner
        self.bytes_read = 0
        self.opened: list[str] = []

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path):
        return self.inner.normalize_path(path)

    def get_file_info(self, paths):
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.inner.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.inner.delete_file(path)

    def move(self, src, dest):
        self.inner.move(src, dest)

    def copy_file(self, src, dest):
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path):
        return self._counted(path)

    def open_input_file(self, path):
        return self._counted(path)

    def open_output_stream(self, path, metadata):
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.inner.open_append_stream(path, metadata=metadata)

    def _counted(self, path: str) -> pa.NativeFile:
        with self.inner.open_input_stream(path) as f:
            data = f.read()
        self.bytes_read += len(data)
        self.opened.append(path)
        return pa.BufferReader(data)


def counting(inner: pafs.FileSystem) -> tuple[pafs.PyFileSystem, CountingHandler]:
    handler = CountingHandler(inner)
    return pafs.PyFileSystem(handler), handler

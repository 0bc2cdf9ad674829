"""A full disk, for the tests: with this folder on PYTHONPATH, every file opened for writing below
$FULL_DISK fails at its first write with ENOSPC, as on a full disk (the file itself is made, as
there). open() is what fairseq's PathManager, gzip and the package use; torch.save of a path,
which torch writes itself, is sent through open() here."""
import builtins
import errno
import os

FULL = os.path.realpath(os.environ["FULL_DISK"]) + os.sep
_open = builtins.open


class _Full:
    def __init__(self, file):
        self._file = file

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def _opening_a_full_disk(file, mode="r", *args, **kwargs):
    opened = _open(file, mode, *args, **kwargs)
    full = isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(file)).startswith(FULL)
    return _Full(opened) if full and set(mode) & set("wax+") else opened


builtins.open = _opening_a_full_disk
import torch  # noqa: E402

_save = torch.save


def _saving_through_open(obj, f, *args, **kwargs):
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as opened:
            return _save(obj, opened, *args, **kwargs)
    return _save(obj, f, *args, **kwargs)


torch.save = _saving_through_open

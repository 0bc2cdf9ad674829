"""Writing a directory atomically (:class:`StagedOutput`), the Python twin of common.sh's
fsx_begin_output / fsx_finish_output: everything into a temporary directory beside the output,
renamed into place only when complete, after the replaceability check of :mod:`outputs`."""
import os
import shutil
import sys
import tempfile
from typing import Iterable, Sequence

if __package__:
    from .locks import OutputLock, stale_staging_warning
    from .outputs import OutputError, check_replaceable, mark_output
else:  # run as a file by the recipes (no package import: it would load fairseq and torch)
    from locks import OutputLock, stale_staging_warning
    from outputs import OutputError, check_replaceable, mark_output


class StagedOutput:
    """Write a directory atomically, the Python twin of common.sh's fsx_begin_output /
    fsx_finish_output::

        with StagedOutput(out, prog="evaluate.sh", inputs=[data, ckpt]) as staged:
            staged.discard_old()             # optional: the old output goes at once
            ... write into staged.stage (the future ``out``), scratch in staged.work ...
            staged.finish()                  # the marker, then ``out`` replaced by renames

    ``out`` must be absent, or replaceable by ``prog`` (check_replaceable; without ``force`` an
    existing one is an error). Everything is written under a temporary directory beside
    ``out``; leaving the block without finish() (an error, an interrupt) removes it, and moves
    the ``keep_on_failure`` files of the stage into ``out`` when no ``out`` is there. From the
    start of the block to its end the lock of ``out`` is held (:mod:`locks`): a second writer
    is refused with one line naming this one."""

    def __init__(self, out: str, *, prog: str, inputs: Iterable[str] = (), force: bool = True,
                 keep_on_failure: Sequence[str] = (), keep_tmp: bool = False, log=None):
        self.out = os.path.realpath(out)
        self.prog = prog
        self.inputs = [str(p) for p in inputs if p]
        self.force = force
        self.keep_on_failure = list(keep_on_failure)
        self.keep_tmp = keep_tmp
        self.log = log or (lambda message: print(f"[{prog}] {message}", file=sys.stderr, flush=True))
        self.tmp = self.work = self.stage = None
        self.done = False
        self.lock = OutputLock(self.out)

    def _check(self):
        check_replaceable(self.out, self.inputs, prog=self.prog, replaces=self.prog)

    def __enter__(self) -> "StagedOutput":
        self.lock.acquire()
        try:
            self._begin()
        except BaseException:
            self.lock.release()
            raise
        return self

    def _begin(self) -> None:
        if os.path.lexists(self.out) and not self.force:
            raise OutputError(f"output directory {self.out} already exists (use --force to replace it)")
        self._check()
        parent, base = os.path.split(self.out)
        os.makedirs(parent, exist_ok=True)
        stale = stale_staging_warning(self.out)
        if stale:
            self.log(f"WARNING: {stale}")
        self.tmp = tempfile.mkdtemp(prefix=f".{base}.tmp.", dir=parent)
        self.work = os.path.join(self.tmp, "work")
        self.stage = os.path.join(self.tmp, "out")
        os.makedirs(self.work)
        os.makedirs(self.stage)
        self.log(f"working in {self.tmp}")

    def discard_old(self) -> None:
        """Remove the previous output now rather than at the end (evaluation: from its start
        until it succeeds, ``out`` holds no result, so no stale result passes for the new one)."""
        if os.path.lexists(self.out):
            os.rename(self.out, os.path.join(self.tmp, "old"))
            shutil.rmtree(os.path.join(self.tmp, "old"))

    def finish(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        mark_output(self.stage, prog=self.prog)  # the exact manifest of what it wrote
        if os.path.lexists(self.out):
            self._check()  # again: the user may have put something into it meanwhile
            os.rename(self.out, os.path.join(self.tmp, "old"))
        os.rename(self.stage, self.out)
        self.done = True
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.log(f"done: {self.out}")

    def __exit__(self, *exc) -> bool:
        try:
            self._clean_up()
        finally:
            self.lock.release()
        return False

    def _clean_up(self) -> None:
        if self.done or not self.tmp or not os.path.isdir(self.tmp):
            return
        if self.keep_tmp:
            self.log(f"failed; intermediate files kept in {self.tmp}")
            return
        # the logs of a failed run, where no output is (never mixed into an old one): gathered
        # and marked beside it, then renamed into place
        kept = [name for name in self.keep_on_failure if os.path.isfile(os.path.join(self.stage, name))]
        if kept and not os.path.lexists(self.out):
            failed = os.path.join(self.tmp, "failed")
            os.makedirs(failed)
            for name in kept:
                os.rename(os.path.join(self.stage, name), os.path.join(failed, name))
            mark_output(failed, prog=self.prog)
            try:
                os.rename(failed, self.out)
            except OSError:  # an output appeared meanwhile: it stays as it is
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

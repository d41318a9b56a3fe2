"""Every file orbitask reads or writes under a model, output or prediction directory, through
TensorFlow's `tf.io.gfile`: a path with a scheme (`gs://bucket/runs/x`, `ram://...`) works as a
local one does, and nothing with a scheme reaches a call that only knows the local disk. A folder
is made (`makedirs`) before anything is written in it: `ram://` lists only folders made so.

    files.write_json(path, value); files.read_json(path, default)
    files.exists / isdir / listdir / glob / makedirs / remove / rmtree / rename
    files.Appender(path): a file written a piece at a time (`metrics.jsonl`, `metrics.csv`)

Appends. Object storage has no append: `GFile(path, "a")` there rewrites the whole object, so a
file appended after every device loop would cost O(n^2). On the local disk (no scheme, or
`file://`) an `Appender` appends. Elsewhere it keeps what it is given and writes it as one new
object, a segment (`metrics.part-000001.jsonl` beside `metrics.jsonl`), when flushed: at each
checkpoint save of a training run (`flush_appends`, before the checkpoint is written, so a resume
from it finds every line up to it), and at once for an appender made with `buffered=False`. A
rewind rewrites `<path>` whole and removes the segments. `read_appended(path)` reads `<path>` and
its segments back as one text; `pieces(path)` lists them in order (for pandas:
`pandas.concat(pandas.read_json(p, lines=True) for p in pieces(path))`).

Only the schemes TensorFlow has registered work (`file`, `ram`, `gs` with TensorFlow 2.20):
`check_scheme` refuses any other before any work.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import tensorflow as tf

from orbitask.common.errors import ConfigError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_PART = ".part-"  # metrics.jsonl -> metrics.part-000001.jsonl
_appenders: dict[str, Appender] = {}  # the buffered appenders by path: flushed at checkpoints


def scheme(path: str) -> str:
    """The scheme of `path` (`"gs"` for `gs://b/x`), lower case; "" for a plain local path."""
    found = _SCHEME.match(str(path))
    return found.group(1).lower() if found else ""


def is_local(path: str) -> bool:
    """Whether `path` is on the local disk (no scheme, or `file://`), where files append."""
    return scheme(path) in ("", "file")


def registered_schemes() -> list[str]:
    """The schemes TensorFlow's file systems take here (`file`, `ram`, `gs`, ...)."""
    return sorted(s for s in tf.io.gfile.get_registered_schemes() if s)


def check_scheme(path: str | None, flag: str = "--model_dir") -> None:
    """Refuses a path whose scheme TensorFlow has no file system for. Eager, before any work.

    Raises:
      ConfigError: naming the flag, the path and what works instead.
    """
    if not path or is_local(path) or scheme(path) in registered_schemes():
        return
    raise ConfigError(
        f"{flag} {path!r}: TensorFlow has no file system for {scheme(path)}:// here (it has "
        f"{', '.join(s + '://' for s in registered_schemes())}); use a local directory, a mount "
        "of the bucket (mountpoint-s3, gcsfuse), or your platform's sync folder (SageMaker's "
        "/opt/ml/checkpoints). See docs/several_machines.md, Storage."
    )


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path)


def isdir(path: str) -> bool:
    return tf.io.gfile.isdir(path)


def listdir(path: str) -> list[str]:
    """The names in folder `path`, sorted (none when it does not exist)."""
    if not tf.io.gfile.isdir(path):
        return []
    return sorted({name.rstrip("/") for name in tf.io.gfile.listdir(path)})


def glob(pattern: str) -> list[str]:
    """The paths matching `pattern`, sorted."""
    return sorted(tf.io.gfile.glob(pattern))


def is_folder(path: str) -> bool:
    """Whether `path` is a folder and not a checkpoint prefix (`ram://` calls `.../ckpt-3` a
    folder since `ckpt-3.index` begins with it)."""
    return tf.io.gfile.isdir(path) and not tf.io.gfile.exists(path + ".index")


def checkpoint_reader(prefix: str) -> Any:
    """A `CheckpointReader` of the checkpoint at `prefix`. Eager.

    Raises:
      tf.errors.OpError: when it cannot be read.
    """
    # Not tf.train.load_checkpoint: it asks gfile whether `prefix` is a folder (to read the
    # folder's latest checkpoint), and ram:// says yes for `.../ckpt-3` since `ckpt-3.index`
    # begins with it; the reader of the prefix itself is the same on every file system.
    return tf.compat.v1.train.NewCheckpointReader(prefix)


def makedirs(path: str) -> None:
    tf.io.gfile.makedirs(path)


def remove(path: str) -> None:
    """Removes file `path`; nothing when it is gone already."""
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def rmtree(path: str) -> None:
    """Removes folder `path` and all it holds; nothing when it is gone already."""
    try:
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
    except tf.errors.NotFoundError:
        pass


def rename(source: str, target: str) -> None:
    """Moves file `source` to `target`, replacing it (on object storage: a copy and a delete)."""
    tf.io.gfile.rename(source, target, overwrite=True)


def rename_tree(source: str, target: str) -> None:
    """Moves folder `source` to `target` (which must not exist). Locally one rename; elsewhere a
    copy of each file and the removal of `source` (what a folder's rename costs on GCS)."""
    if is_local(source):
        tf.io.gfile.rename(source, target)
        return
    for folder, _, names in tf.io.gfile.walk(source):
        there = target + folder[len(source) :]
        tf.io.gfile.makedirs(there)
        for name in names:
            tf.io.gfile.copy(f"{folder}/{name}", f"{there}/{name}", overwrite=True)
    rmtree(source)


def size(path: str) -> int:
    return tf.io.gfile.stat(path).length


def open(path: str, mode: str = "r") -> tf.io.gfile.GFile:  # noqa: A001 (the module's open)
    """`path` opened through gfile (`"r"`, `"w"`, `"rb"`, `"wb"`; append with `Appender`)."""
    return tf.io.gfile.GFile(path, mode)


def read_bytes(path: str) -> bytes:
    """The bytes of `path`.

    Raises:
      tf.errors.NotFoundError: when it is missing.
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def read_text(path: str, default: str | None = None) -> str | None:
    """The text of `path` (bytes that are not UTF-8 replaced), or `default` when it is missing."""
    try:
        return read_bytes(path).decode("utf-8", errors="replace")
    except tf.errors.NotFoundError:
        return default


def write_text(path: str, text: str | bytes) -> None:
    """Writes `path` whole (`text` as UTF-8, or bytes). Locally under a temporary name renamed
    into place, so a reader never sees half a file; on object storage in one upload (an object
    appears only when complete). Its folder is made first."""
    folder = path.rpartition("/")[0]
    if folder and not tf.io.gfile.isdir(folder):
        tf.io.gfile.makedirs(folder)
    mode = "wb" if isinstance(text, bytes) else "w"
    if not is_local(path):
        before_rewrite(path)
        with tf.io.gfile.GFile(path, mode) as f:
            f.write(text)
        return
    temporary = f"{path}.tmp{uuid.uuid4().hex}"
    try:
        with tf.io.gfile.GFile(temporary, mode) as f:
            f.write(text)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)


def before_rewrite(path: str) -> None:
    """Removes `path` on `ram://`, whose files opened for writing keep their old bytes (TensorFlow
    2.20's in-memory file system appends there, where `gs://` and the local disk start anew)."""
    if scheme(path) == "ram":
        remove(path)


def read_json(path: str, default: Any = None) -> Any:
    """The JSON value in `path`, or `default` when it is missing or not JSON."""
    text = read_text(path)
    try:
        return default if text is None else json.loads(text)
    except ValueError:
        return default


def write_json(path: str, value: Any) -> None:
    write_text(path, json.dumps(value, indent=1) + "\n")


def _segment(path: str, number: int | str) -> str:
    """Segment `number` of `path` (`metrics.part-000001.jsonl`; "*" for a pattern). Its name does
    not begin with `path`'s: file systems that see folders in prefixes (`ram://`) would take
    `path` for a folder."""
    stem, dot, extension = path.rpartition(".")
    if not dot or "/" in extension:
        stem, extension = path, ""
    number = number if isinstance(number, str) else f"{number:06d}"
    return f"{stem}{_PART}{number}" + (f".{extension}" if extension else "")


def _number(path: str, segment: str) -> int | None:
    found = re.fullmatch(re.escape(_segment(path, "@")).replace("@", r"(\d+)"), segment)
    return int(found.group(1)) if found else None


def pieces(path: str) -> list[str]:
    """`path` (if it exists) and its segments, in the order their text follows."""
    numbered = [(_number(path, p), p) for p in glob(_segment(path, "*"))]
    parts = [p for n, p in sorted(x for x in numbered if x[0] is not None)]
    whole = tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)
    return ([path] if whole else []) + parts


def read_appended(path: str) -> str | None:
    """The text of an appended file: `path` and its segments as one; None when there is none."""
    found = pieces(path)
    return "".join(read_text(p, "") for p in found) if found else None


class Appender:
    """A file written a piece at a time (module docstring): appended on the local disk; on
    object storage kept until `flush` and written as one segment. Eager; one writer a file.

    Args:
      path: the file.
      buffered: on object storage, whether pieces wait for `flush_appends` (a training run's
        checkpoints); False writes a segment per `append`.
    """

    def __init__(self, path: str, buffered: bool = True):
        self.path, self.buffered = path, buffered
        self._held: list[str] = []
        self._next: int | None = None
        if not is_local(path) and buffered:
            _appenders[path] = self  # replaces an earlier writer's, whose pieces are dropped

    def exists(self) -> bool:
        """Whether the file has any text (written, or held for the next flush)."""
        return bool(self._held) or bool(pieces(self.path))

    def append(self, text: str) -> None:
        if is_local(self.path):
            with tf.io.gfile.GFile(self.path, "a") as f:
                f.write(text)
            return
        self._held.append(text)
        if not self.buffered:
            self.flush()

    def flush(self) -> None:
        """Writes the held pieces as one new segment (none held: nothing). Eager."""
        if not self._held:
            return
        if self._next is None:
            numbers = [_number(self.path, p) or 0 for p in pieces(self.path)]
            self._next = max(numbers, default=0) + 1
        text, self._held = "".join(self._held), []
        write_text(_segment(self.path, self._next), text)
        self._next += 1

    def read(self) -> str | None:
        """The whole file's text (held pieces included); None when there is none."""
        found = read_appended(self.path)
        if found is None and not self._held:
            return None
        return (found or "") + "".join(self._held)

    def rewrite(self, text: str) -> None:
        """Replaces the whole file by `text` (its segments removed)."""
        self._held = []
        write_text(self.path, text)
        for part in pieces(self.path)[1:]:
            remove(part)
        self._next = None


def flush_appends() -> None:
    """Writes what every buffered appender holds (before a checkpoint save). Eager."""
    for appender in list(_appenders.values()):
        appender.flush()

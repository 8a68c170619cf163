"""Spark settings that hold secrets reach a JVM through a file only its owner can read, never as
`--conf key=value` arguments: every local user reads a process's command line (`ps`,
`/proc/<pid>/cmdline`), and both pyspark's launcher and `spark-submit` put `--conf` there.

`split` tells the secret keys from the rest (by name: `spark.hadoop.fs.s3a.secret.key`,
`spark.ssl.keyStorePassword`, `spark.authenticate.secret`, ...); `properties_file` writes the
secret ones, 0600 in a 0700 folder of its own, for `spark-submit --properties-file`, and removes
it when the JVM has read it (spark-submit loads it at the driver's start). No Spark here."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

_SECRET_KEY = re.compile(r"password|secret|token|credential|keytab|jaas|\.key$", re.I)


def is_secret_conf(key: str) -> bool:
    """Whether Spark setting `key` holds a secret (by its name)."""
    return bool(_SECRET_KEY.search(key))


def split(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the settings that may go on a command line, the secret ones)."""
    plain = {k: v for k, v in conf.items() if not is_secret_conf(k)}
    return plain, {k: v for k, v in conf.items() if is_secret_conf(k)}


def _escaped(text: str, key: bool) -> str:
    """`text` as a Java properties file writes it (java.util.Properties.store's escapes)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch in "=:#!" or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def write_properties(secret: Mapping[str, str], path: Path) -> Path:
    """`secret` as a Java properties file at `path`, created readable by its owner only."""
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text("".join(f"{_escaped(k, True)}={_escaped(v, False)}\n"
                            for k, v in secret.items()), encoding="utf-8")
    return path


@contextmanager
def properties_file(secret: Mapping[str, str]) -> Iterator[Path | None]:
    """A Java properties file holding `secret`, readable by its owner only, for the block (None
    when there is nothing secret); removed with its folder afterwards."""
    if not secret:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="spark-secrets-"))  # 0700
    try:
        yield write_properties(secret, folder / "secret.properties")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

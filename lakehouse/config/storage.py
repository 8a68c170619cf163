"""Where an instance keeps everything: LAKEHOUSE_ROOT as a URI (`/path`, `file:///path`,
`s3a://bucket/prefix`, `abfss://...`, `gs://...`), never a `pathlib.Path` (which turns
`s3a://b` into `s3a:/b`). Spark reaches it through Hadoop's FileSystem; delta-rs (sensors,
summaries, the demo) through the URI and storage options derived here. Credentials are never
part of these: both sides read them from the environment (AWS_ACCESS_KEY_ID, ...)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def scheme(uri: str) -> str | None:
    m = _SCHEME.match(uri)
    return m.group(1).lower() if m else None


def normalize_root(root: str) -> str:
    """An absolute local path for a local root (relative paths resolve against the working
    directory), else the URI without a trailing slash."""
    kind = scheme(root)
    if kind is None:
        return os.path.abspath(os.path.expanduser(root))
    if kind == "file":
        return os.path.abspath(root[len("file://"):])
    return root.rstrip("/")


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *[p.strip("/") for p in parts]])


def local_path(uri: str) -> Path | None:
    """The local path of a local URI, None for an object store."""
    kind = scheme(uri)
    if kind is None:
        return Path(uri)
    if kind == "file":
        return Path(uri[len("file://"):])
    return None


def delta_rs_uri(uri: str) -> str:
    """delta-rs spells Hadoop's s3a:// as s3://."""
    return "s3://" + uri[len("s3a://"):] if scheme(uri) == "s3a" else uri


def delta_rs_options(uri: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Non-secret storage options for delta-rs (endpoint, region, http, path-style); keys and
    secrets stay in the environment, where delta-rs reads them too."""
    env = os.environ if env is None else env
    if scheme(uri) not in ("s3", "s3a"):
        return {}
    options: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
        options["AWS_REGION"] = env.get("AWS_REGION") or env["AWS_DEFAULT_REGION"]
    elif endpoint:
        options["AWS_REGION"] = "us-east-1"
    if endpoint and path_style(env):
        options["AWS_S3_ADDRESSING_STYLE"] = "path"
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    # Delta on S3 without a commit coordinator: one writing driver per table (README).
    options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
    return options


_BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def path_style(env: Mapping[str, str]) -> bool:
    """AWS_S3_PATH_STYLE (default true: a local endpoint such as S3Proxy): an unknown value is an
    error, never a silent false."""
    raw = env.get("AWS_S3_PATH_STYLE", "true")
    if raw.strip().lower() not in _BOOLEANS:
        raise ValueError(f"AWS_S3_PATH_STYLE={raw!r} must be true or false")
    return _BOOLEANS[raw.strip().lower()]


def s3a_spark_conf(uri: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Hadoop s3a settings for an s3a:// root (endpoint, path style, SSL, region); credentials
    come from the environment through the default AWS credentials chain."""
    env = os.environ if env is None else env
    if scheme(uri) != "s3a":
        return {}
    conf = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https://")).lower()
        conf["spark.hadoop.fs.s3a.path.style.access"] = str(path_style(env)).lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or (
        "us-east-1" if endpoint else None)
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def write_text(uri: str, text: str, env: Mapping[str, str] | None = None) -> str:
    """Write a small text file (a report) at a local path or object-store URI; returns the URI.
    Object stores go through pyarrow's filesystem with the same non-secret options as delta-rs
    (keys from the environment)."""
    local = local_path(uri)
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
        return str(local)

    filesystem, path = arrow_fs(uri, env)
    with filesystem.open_output_stream(path) as out:
        out.write(text.encode())
    return uri


def read_text(uri: str, env: Mapping[str, str] | None = None) -> str | None:
    local = local_path(uri)
    if local is not None:
        return local.read_text() if local.exists() else None
    from pyarrow import fs

    filesystem, path = arrow_fs(uri, env)
    if filesystem.get_file_info(path).type == fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as stream:
        return stream.read().decode()


def arrow_fs(uri: str, env: Mapping[str, str] | None = None):
    """A pyarrow filesystem and the path in it for a URI (object stores with the same
    non-secret options as delta-rs, keys from the environment)."""
    from pyarrow import fs

    env = os.environ if env is None else env
    kind = scheme(uri)
    if kind in ("s3", "s3a"):
        endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
        options = delta_rs_options(uri, env)
        filesystem = fs.S3FileSystem(
            endpoint_override=endpoint.split("://", 1)[1] if endpoint else None,
            scheme=endpoint.split("://", 1)[0] if endpoint else "https",
            region=options.get("AWS_REGION"),
            force_virtual_addressing=False,
        )
        return filesystem, uri.split("://", 1)[1]
    return fs.FileSystem.from_uri(uri)


def modified_at(uri: str, env: Mapping[str, str] | None = None) -> float | None:
    """Modification time (epoch seconds) of a file, None when absent."""
    local = local_path(uri)
    if local is not None:
        return local.stat().st_mtime if local.exists() else None
    from pyarrow import fs

    filesystem, path = arrow_fs(uri, env)
    info = filesystem.get_file_info(path)
    return None if info.type == fs.FileType.NotFound else info.mtime.timestamp()


def list_names(uri: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Names directly under a local directory or object-store prefix ([] when absent)."""
    local = local_path(uri)
    if local is not None:
        return sorted(p.name for p in local.iterdir()) if local.is_dir() else []
    from pyarrow import fs

    filesystem, path = arrow_fs(uri, env)
    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in infos)


def delete_tree(uri: str, env: Mapping[str, str] | None = None) -> bool:
    """Delete a directory (local) or every object under a prefix (object store); False when
    there was nothing."""
    local = local_path(uri)
    if local is not None:
        if not local.exists():
            return False
        import shutil

        shutil.rmtree(local)
        return True
    from pyarrow import fs

    filesystem, path = arrow_fs(uri, env)
    if filesystem.get_file_info(path).type == fs.FileType.NotFound:
        return False
    filesystem.delete_dir(path)
    return True

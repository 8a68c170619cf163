"""`all_null` answers from the add actions' statistics alone, and says False whenever they
cannot prove the column null (tables written with delta-rs here: no JVM)."""

import pyarrow as pa
from deltalake import write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.tables.stats import all_null

SCHEMA = pa.schema([("id", pa.int64()), ("redriven_at", pa.timestamp("us", tz="UTC"))])


def test_null_in_every_file_until_one_row_is_set(tmp_path):
    settings = Settings(lakehouse_root=str(tmp_path))
    assert all_null(settings, "q", "redriven_at")  # no table yet
    path = settings.table_path("q")
    write_deltalake(path, pa.table({"id": [1, 2], "redriven_at": [None, None]}, schema=SCHEMA))
    write_deltalake(path, pa.table({"id": [3], "redriven_at": [None]}, schema=SCHEMA),
                    mode="append")
    assert all_null(settings, "q", "redriven_at")
    assert not all_null(settings, "q", "id")
    write_deltalake(path, pa.table({"id": [4], "redriven_at": [pa.scalar(0, pa.timestamp(
        "us", tz="UTC")).as_py()]}, schema=SCHEMA), mode="append")
    assert not all_null(settings, "q", "redriven_at")


def test_a_column_without_statistics_is_not_taken_for_null(tmp_path):
    settings = Settings(lakehouse_root=str(tmp_path))
    write_deltalake(settings.table_path("q"),
                    pa.table({"id": [1], "redriven_at": [None]}, schema=SCHEMA),
                    configuration={"delta.dataSkippingNumIndexedCols": "1"})
    assert not all_null(settings, "q", "redriven_at")

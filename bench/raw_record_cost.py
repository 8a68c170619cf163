"""What keeping each event's raw record in bronze would cost (so any date could be re-derived
under a new spec after the topic's retention): the order pipeline's bronze after a catch-up of
BENCH_EVENTS (default 300,000) generated events, against the same valid records' value bytes as
one more Parquet column, written as Delta writes its files (snappy). Parquet stores each column
apart, so that column's compressed size is what bronze would grow by. Results to
bench/results/raw-record-cost-<date>.json.

    python -m bench.raw_record_cost      (a broker at KAFKA_BOOTSTRAP_SERVERS; `make kafka-up`)
"""

from __future__ import annotations

import os
import platform
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import write_result
from bench.ratios import records, settings_for
from lakehouse.specs.pipeline import load_spec


def main() -> int:
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.tables.stats import add_actions
    from spark_jobs import stream
    from spark_jobs.session import get_spark
    from testkit.generator import produce
    from testkit.reference import VALID_KINDS

    n = int(os.environ.get("BENCH_EVENTS", "300000"))
    spec = load_spec("examples/orders.yaml")
    settings = settings_for(f"raw-cost-{uuid.uuid4().hex[:6]}", "raw-cost", spec)
    ensure_topic(settings)
    recs = records(n, 11, spec)
    produce(settings, recs)
    spark = get_spark(settings)
    stream.catch_up(spark, settings)
    files = add_actions(settings, "bronze_events")
    bronze_bytes = pc.sum(files["size_bytes"]).as_py()
    rows = pc.sum(files["num_records"]).as_py()
    values = [r.value for r in recs if r.kind in VALID_KINDS]
    assert len(values) == rows, (len(values), rows)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for codec in ("snappy", "zstd"):
            out = Path(tmp) / f"raw-{codec}.parquet"
            pq.write_table(pa.table({"raw_value": pa.array(values, pa.binary())}), out,
                           compression=codec)
            sizes[codec] = out.stat().st_size
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "events": n, "bronze_rows": rows, "bronze_files": files.num_rows,
        "bronze_bytes": bronze_bytes,
        "raw_value_bytes_uncompressed": sum(len(v) for v in values),
        "raw_column_bytes_snappy": sizes["snappy"], "raw_column_bytes_zstd": sizes["zstd"],
        "bronze_growth_snappy": round(sizes["snappy"] / bronze_bytes, 3),
        "bytes_per_event_bronze": round(bronze_bytes / rows, 1),
        "bytes_per_event_raw_snappy": round(sizes["snappy"] / rows, 1),
    }
    print(result)
    write_result("raw-record-cost", result)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

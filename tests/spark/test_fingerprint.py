"""The windows' fingerprint, summed as two long sums (`fingerprint_sum`), equals the exact decimal
sum of the ids' 64-bit hashes, whatever their signs and however many share a group."""

from decimal import Decimal

from pyspark.sql import functions as F

from spark_jobs.transforms.windows import fingerprint, fingerprint_sum


def test_the_long_pair_sum_equals_the_decimal_sum_of_the_hashes(spark):
    ids = [f"e-{i}" for i in range(5000)] + ["", "x" * 300, "é"]
    df = spark.createDataFrame([(i % 7, e) for i, e in enumerate(ids)], "g int, event_id string")
    got = {r.g: r.f for r in df.groupBy("g").agg(fingerprint_sum(F.col("event_id")).alias("f"))
           .collect()}
    expected = {r.g: r.f for r in df.groupBy("g").agg(
        F.sum(fingerprint(F.col("event_id"))).cast("decimal(38,0)").alias("f")).collect()}
    hashes = {r.event_id: r.h for r in df.select("event_id", F.xxhash64("event_id").alias("h"))
              .collect()}
    assert any(h < 0 for h in hashes.values()) and any(h > 0 for h in hashes.values())
    assert got == expected
    # And against Python's own exact sum of the hashes.
    assert got[0] == Decimal(sum(hashes[e] for i, e in enumerate(ids) if i % 7 == 0))
    assert spark.createDataFrame([(1, "a")], "g int, event_id string").groupBy("g").agg(
        fingerprint_sum(F.col("event_id")).alias("f")).schema["f"].dataType.simpleString() \
        == "decimal(38,0)"

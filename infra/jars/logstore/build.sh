#!/usr/bin/env bash
# Compile the Delta log store of s3a:// roots (src/lakehouse/delta/PgLogStore.java) into
# .jars/logstore/lakehouse-logstore.jar (make setup): against pyspark's Hadoop client and SLF4J
# (the venv's pyspark/jars), Delta's storage jar (.jars/spark) and the PostgreSQL JDBC driver
# (.jars/logstore, fetched by this folder's pom.xml). Usage: build.sh <python of the venv>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
pyspark_jars=$("$1" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
first() { compgen -G "$1" | head -n 1; }
cp=""
for pattern in "$pyspark_jars/hadoop-client-api-*.jar" "$pyspark_jars/slf4j-api-*.jar" \
               "$repo/.jars/spark/delta-storage-*.jar" "$repo/.jars/logstore/postgresql-*.jar"; do
  jar=$(first "$pattern") || true
  [ -n "$jar" ] || { echo "error: no $pattern: run make setup" >&2; exit 1; }
  cp="$cp${cp:+:}$jar"
done
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac -nowarn --release 17 -encoding UTF-8 -d "$classes" -cp "$cp" \
  "$here"/src/lakehouse/delta/*.java
jar cf "$repo/.jars/logstore/lakehouse-logstore.jar.tmp" -C "$classes" .
mv "$repo/.jars/logstore/lakehouse-logstore.jar.tmp" "$repo/.jars/logstore/lakehouse-logstore.jar"

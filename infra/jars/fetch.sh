#!/usr/bin/env bash
# Fetch the dependencies a pom under infra/jars lists (make setup): Maven in batch, quiet mode,
# its output with Maven 3.8's ANSI colour resets removed (it prints them even with -q and -B).
set -euo pipefail
mvn -q -B -s infra/jars/settings.xml -f "$1" dependency:copy-dependencies 2>&1 \
  | sed -u 's/\x1b\[[0-9;]*m//g'

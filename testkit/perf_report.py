"""The performance page's measured figures, written from bench/results/ (`make report`).

docs/performance.md keeps its prose; each region between `<!-- generated: <name> -->` and
`<!-- end: <name> -->` is rendered here from the newest result file(s) of its kind (the latest
timestamp in the name; files are never overwritten, testkit/results.py), each row naming its
date, commit and result file, and the plots under docs/images/ are drawn from the same files.
`page()` returns the page without writing (tests/unit/test_performance_page.py compares it with
the page); `python -m bench.report` writes the page and the plots.

A row's commit is the one the file records (`commit`: testkit.results.write_result records the
checkout's), else, for files written before it did, the commit that added the file (so a file
without one must be committed before `make report`, or its rows say `uncommitted`).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGE = REPO / "docs" / "performance.md"
CLUSTER_PAGE = REPO / "docs" / "cluster.md"
IMAGES = REPO / "docs" / "images"
STAMP = r"(\d{4}-\d{2}-\d{2}(?:T\d{6})?)"
REGION = re.compile(r"(<!-- generated: ([\w-]+) -->\n).*?(<!-- end: \2 -->)", re.S)


# --- result files -------------------------------------------------------------------------

def stamp(path: Path) -> str:
    """The file's timestamp from its name, comparable across `2026-11-24` and `...T142618`."""
    found = re.search(STAMP, path.name).group(1)
    return found if "T" in found else found + "T000000"


def files(kind: str) -> list[Path]:
    """The files `<kind>-<timestamp>.json` (kind a regular expression), oldest first."""
    pattern = re.compile(kind + "-" + STAMP + r"\.json")
    return sorted((p for p in RESULTS.glob("*.json") if pattern.fullmatch(p.name)), key=stamp)


def newest(kind: str, holds=lambda data: True) -> Path:
    """The newest file of a kind (whose data `holds`, when a kind's files differ)."""
    return [p for p in files(kind) if holds(load(p))][-1]


@cache
def load(path: Path):
    return json.loads(path.read_text())


@cache
def commit(path: Path) -> str:
    data = load(path)
    if isinstance(data, dict) and data.get("commit"):
        return data["commit"]
    out = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", str(path.relative_to(REPO))],
        cwd=REPO, capture_output=True, text=True, check=False).stdout.split()
    return out[-1][:7] if out else "uncommitted"


def date(path: Path) -> str:
    """`2026-11-29 14:26` from the name's timestamp (a date alone when the name has no time)."""
    day, _, time = stamp(path).partition("T")
    return day if time == "000000" else f"{day} {time[:2]}:{time[2:4]}"


def cite(*paths: Path) -> str:
    return ", ".join(f"`bench/results/{p.name}`" for p in paths)


def bold(value: float, unit: str = "", decimals: int | None = None) -> str:
    """A figure as the citation test reads it: the file's value, shown with its decimals."""
    if decimals is not None:
        text = f"{value:,.{decimals}f}"
    else:
        text = f"{int(value) if float(value).is_integer() else value:,}"
    return f"**{text}{(' ' if unit in ('s', 'MB') else '') + unit}**"


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# --- Against the targets ------------------------------------------------------------------

def row(what: str, target: str, result: str, trigger: str, *paths: Path) -> list[str]:
    return [what, target, result, ", ".join(dict.fromkeys(date(p) for p in paths)),
            ", ".join(dict.fromkeys(commit(p) for p in paths)), trigger, cite(*paths)]


def catch_up_rows() -> list[list[str]]:
    path = newest("bench")
    d = load(path)
    median, replay = d["catch_up_median_s"], d["replay_median_s"]
    ratio, replay_ratio = d["catch_up_ratio_vs_naive_peer"], d["replay_ratio_vs_batch_peer"]
    rows = [
        row(f"catch-up of {d['events']:,} events vs the naive peer", ">= 0.8x",
            f"{bold(ratio, 'x', 2)} ({bold(median['product'], 's')} against "
            f"{bold(median['naive_peer'], 's')}): {verdict(ratio >= 0.8)}", "`availableNow`", path),
        row(f"replay of a {d['replay_date_events']:,}-event date vs the batch peer", ">= 0.8x",
            f"{bold(replay_ratio, 'x', 2)} ({bold(replay['product'], 's')} against "
            f"{bold(replay['batch_peer'], 's')}): {verdict(replay_ratio >= 0.8)}", "batch", path),
    ]
    formats = []
    for name, label in (("orders", "JSON"), ("orders_avro", "Avro")):
        p = d["pipelines"].get(name)
        if p:
            r, m = p["catch_up_ratio_vs_naive_peer"], p["catch_up_median_s"]
            formats.append(f"{label} {bold(r, 'x', 2)} ({bold(m['product'], 's')} against "
                           f"{bold(m['naive_peer'], 's')}; {p['catch_up_ratio_vs_fair_peer']:.2f}x "
                           f"the fair peer): {verdict(r >= 0.8)}")
    if formats:
        rows.append(row(f"the order pipeline's catch-up ({d['events']:,} events), JSON / Avro, "
                        "vs its naive peer", ">= 0.8x", "; ".join(formats), "`availableNow`", path))
    return rows


def format_pair_row() -> list[str]:
    path = newest("format-pair")
    d = load(path)
    parts = []
    for name, label in (("orders", "JSON"), ("orders_avro", "Avro")):
        r, m = d["ratio_vs_naive_peer"][name], d["catch_up_median_s"][name]
        parts.append(f"{label} {bold(r, 'x', 2)} ({bold(m['product'], 's')} against "
                     f"{bold(m['naive_peer'], 's')}): {verdict(r >= 0.8)}")
    parts.append(f"the Avro product {bold(d['avro_over_json_product'], 'x', 2)} the JSON "
                 "product's time")
    return row(f"the same at {d['events']:,} events, JSON and Avro interleaved "
               "(`python -m bench.format_pair`)", ">= 0.8x", "; ".join(parts), "`availableNow`",
               path)


def bad_input_row() -> list[str]:
    def drill(data):
        return next((x for x in data if x["drill"] == "bad_input"), None)

    path = newest("drills", lambda data: drill(data) and drill(data).get("scale") == 1.0)
    details = drill(load(path))["details"]
    ratio = details["throughput_ratio"]
    return row(f"bronze catch-up with {details['bad'] / details['records']:.0%} bad records vs a "
               f"clean run (`bad_input` drill, {details['records']:,} records)", ">= 0.8x",
               f"{bold(ratio, 'x', 2)}: {verdict(ratio >= 0.8)}", "`availableNow`", path)


def service_row(rate: int, target_s: float) -> list[str]:
    path = newest(f"service-{rate}")
    d = load(path)
    p95 = d["freshness_s"]["p95"]
    return row(f"the service at {rate:,} events/s ({d['seconds']} s): freshness p95",
               f"<= {target_s:g} s", f"{bold(p95, 's')}: {verdict(p95 <= target_s)}", "1 s", path)


def peers_row() -> list[str]:
    path = newest("service-peers")
    medians = load(path)["freshness"]["medians"]
    parts, met = [], True
    for rate in sorted(medians, key=int, reverse=True):
        m = medians[rate]
        better, ratio = m["ratio"]["better_peer"], m["ratio"]["service_p95_over_better_peer_p95"]
        others = [s for s in m if s not in ("service", "ratio", better)]
        parts.append(f"at {int(rate):,}/s {bold(m['service']['p95'], 's')} against the {better} "
                     f"peer's {bold(m[better]['p95'], 's')} ({bold(ratio, decimals=2)}x; "
                     + ", ".join(f"{s} {bold(m[s]['p95'], 's')}" for s in others) + ")")
        met &= ratio <= 1
    return row("the service against the better of the hand-written live window queries, "
               "interleaved: freshness p95", "<= 1x the better peer's (medians of the rounds)",
               "; ".join(parts) + f": {verdict(met)}", "1 s", path)


def knees() -> dict[str, tuple[dict, Path]]:
    """Each system's knee from the newest knee file that measured it."""
    out = {}
    for path in files("service-knee"):
        for system, knee in load(path)["knee"]["knees"].items():
            out[system] = (knee, path)
    return out


def knee_row() -> list[str]:
    found = knees()
    service, service_path = found["service"]
    peers = {s: v for s, v in found.items() if s != "service"}
    better = max(peers, key=lambda s: peers[s][0]["knee"] or 0)
    peer, peer_path = peers[better]
    growing = next((r["lag_slope_per_s"] for r in load(service_path)["knee"]["runs"]["service"]
                    if r["rate"] == service["first_not_flat"]), None)
    result = f"the service {bold(service['knee'])}/s"
    if growing is not None:
        result += (f" (its lag growing {bold(growing, decimals=0)} a second at "
                   f"{service['first_not_flat']:,}/s)")
    result += f"; the {better} peer {bold(peer['knee'])}/s"
    ratio = service["knee"] / peer["knee"]
    result += f": {ratio:.2f}x the {better} peer's: {verdict(ratio >= 1.5)}"
    return row("the knee: the highest rate whose consumer lag stays flat over the run after the "
               "warm-up (`BENCH_KNEE=only`)", ">= 1.5x the better peer's", result, "1 s",
               service_path, peer_path)


def replay_row() -> list[str]:
    path = newest(r"service-20000-replay-\d+(?:-niceness-\d+)?")
    d = load(path)
    p95 = d["freshness_s"]["p95"]
    return row(f"the service at 20,000 events/s during a replay of "
               f"{d['replay']['events_preloaded']:,} events: freshness p95", "<= 10 s",
               f"{bold(p95, 's')}: {verdict(p95 <= 10)}", "1 s", path)


def three_pipelines_rows() -> list[list[str]]:
    path = newest("service-10000-orders-5000-app_events-5000")
    d = load(path)
    p95s = [d["freshness_s"]["p95"]] + [p["freshness_s"]["p95"]
                                        for p in d["other_pipelines"].values()]
    alone = [p for p in files("service-20000") if stamp(p) > stamp(path)]
    rows = [row(f"three pipelines in one service (10,000 + 5,000 + 5,000 events/s, "
                f"{d['seconds']} s): freshness p95 each", "<= 10 s",
                ", ".join(bold(v, "s") for v in p95s) + f": {verdict(max(p95s) <= 10)}", "1 s",
                path)]
    if alone:
        single = load(alone[0])
        p95, rss = single["freshness_s"]["p95"], single["driver_rss_mb"]["last_minute"]
        ratios = [v / p95 for v in p95s]
        rows.append(row("the same against the default pipeline alone at 20,000 events/s "
                        "(the next such run): freshness p95 each", "<= 1.5x the single pipeline's",
                        ", ".join(bold(v, "s") for v in p95s) + f" against {bold(p95, 's')}: "
                        + ", ".join(f"{r:.2f}x" for r in ratios)
                        + f": {verdict(max(ratios) <= 1.5)}", "1 s", path, alone[0]))
        mine = d["driver_rss_mb"]["last_minute"]
        rows.append(row("the same: driver RSS in the last minute", "<= 1.5x",
                        f"{bold(mine, 'MB')} vs {bold(rss, 'MB')} ({mine / rss:.2f}x): "
                        f"{verdict(mine / rss <= 1.5)}", "1 s", path, alone[0]))
    return rows


def run_path_rows() -> list[list[str]]:
    path = newest("run-path")
    d = load(path)
    m, targets = d["median_s"], d["targets"]
    empty, again = m["empty_catch_up"], m["reconcile_again"]
    result = (f"{bold(empty, 's')}: {verdict(empty <= targets['empty_catch_up_s'])}; "
              f"{bold(again, 's')} classic: {verdict(again <= targets['reconcile_s'])}")
    if "reconcile_again_connect" in m:
        connect = m["reconcile_again_connect"]
        result += (f"; over a warm Spark Connect server {bold(connect, 's')}: "
                   f"{verdict(connect <= targets['reconcile_s'])}")
    catch_up, replay = d["catch_up_ratio_vs_naive_peer"], d["replay_ratio_vs_batch_peer"]
    ratios = (f"catch-up {bold(catch_up, decimals=2)}x ({bold(m['catch_up'], 's')} against "
              f"{bold(m['naive_peer'], 's')}): {verdict(catch_up >= targets['ratios'])}; "
              f"replay {bold(replay, decimals=2)}x ({bold(m['replay'], 's')} against "
              f"{bold(m['batch_peer'], 's')}): {verdict(replay >= targets['ratios'])}")
    if "catch_up_ratio_vs_naive_peer_archived" in d:
        ratios += (f"; the peers given the same class archive: "
                   f"{bold(d['catch_up_ratio_vs_naive_peer_archived'], decimals=2)}x and "
                   f"{bold(d['replay_ratio_vs_batch_peer_archived'], decimals=2)}x")
    return [
        row(f"a Dagster run in a fresh process (`dagster asset materialize`, medians of "
            f"{d['rounds']}, a {d['events']:,}-event topic): an empty catch-up; "
            "`reconcile_dates` again on a reconciled date",
            f"<= {targets['empty_catch_up_s']} s; <= {targets['reconcile_s']} s", result,
            "`availableNow`, batch", path),
        row("the same runs against the hand-written jobs, each in a fresh process: catch-up; "
            "replay of the date", f">= {targets['ratios']}x", ratios, "`availableNow`, batch",
            path),
    ]


def targets() -> str:
    rows = [*catch_up_rows(), format_pair_row(), bad_input_row(), service_row(20000, 5),
            service_row(5000, 3), peers_row(), knee_row(), replay_row(),
            *three_pipelines_rows(), *run_path_rows()]
    return table(["what", "target", "result", "date", "commit", "trigger", "result file"], rows)


# --- the guard on the engine's price ------------------------------------------------------

def guard() -> str:
    """The guard's recorded ratio (bench/guard.json) and the run it was recorded from. Not the
    newest run: `make test` runs the guard before the suite, so its file would change the page
    under the test that compares it."""
    from testkit.step_prices import RECORDED

    recorded = json.loads(RECORDED.read_text())
    base = REPO / recorded["result"]
    run = load(base)
    return (f"Recorded: {bold(recorded['service_to_peer'])} on {date(base)}, commit "
            f"{recorded['commit']}, over {run['rounds']} rounds of {recorded['events']:,} events "
            f"({run['seconds']:.0f} s, {cite(base)}); the guard fails {run['tolerance']:.0%} "
            "above it. Every run writes `bench/results/guard-<time>.json`." + guard_failure())


def guard_failure() -> str:
    """The newest guard run that failed (a slower step made on purpose, on a throwaway commit)."""
    failed = [p for p in files("guard") if load(p).get("passed") is False]
    if not failed:
        return ""
    run = load(failed[-1])
    return (f" The newest run that failed: {bold(run['service_to_peer'])} against the limit "
            f"{bold(run['limit'])}, commit {commit(failed[-1])} ({date(failed[-1])}, "
            f"{run['rounds']} rounds, {cite(failed[-1])}).")


# --- the service's freshness against the rate ---------------------------------------------

def freshness_runs(path: Path) -> dict[str, dict[int, list[float]]]:
    """Each system's freshness p95 at each rate, one value a round."""
    out: dict[str, dict[int, list[float]]] = {}
    for run in load(path)["freshness"]["runs"]:
        out.setdefault(run["system"], {}).setdefault(run["rate"], []).append(
            run["freshness_s"]["p95"])
    return out


def freshness() -> str:
    path = newest("service-peers")
    runs = freshness_runs(path)
    rates = sorted({r for by_rate in runs.values() for r in by_rate})
    found = knees()
    rows = []
    for system, by_rate in runs.items():
        cells = [f"{bold(statistics.median(by_rate[r]), 's')} ("
                 + ", ".join(f"{v:g}" for v in by_rate[r]) + ")" if r in by_rate else "-"
                 for r in rates]
        knee, knee_path = found.get(system, (None, None))
        knee_cell = (f"{bold(knee['knee'])}/s (`bench/results/{knee_path.name}`, "
                     f"{date(knee_path)}, {commit(knee_path)})"
                     if knee and knee["knee"] else "-")
        rows.append([system, *cells, knee_cell, date(path), commit(path), cite(path)])
    header = ["system", *(f"p95 at {r:,}/s: median (rounds)" for r in rates), "knee",
              "date", "commit", "result file"]
    return table(header, rows)


# --- make test's and CI's wall times ------------------------------------------------------

def cluster_time(ci: dict) -> str:
    seconds = ci.get("make_test_cluster_s")
    return bold(seconds, "s") if seconds is not None else "not run"


def suite_times() -> str:
    rows = []
    for path in files("suite-test"):
        d = load(path)
        passed = d.get("counts", {}).get("passed", 0)
        rows.append((stamp(path), ["`make test` (local)", date(path), commit(path),
                                   bold(d["wall_s"], "s"), f"{passed} passed, exit "
                                   f"{d['exitstatus']}", "-", cite(path)]))
    for path in files("ci"):
        d = load(path)
        rows.append((stamp(path), ["`.ci/run`", date(path), commit(path),
                                   bold(d["make_test_s"], "s"), "-",
                                   cluster_time(d), cite(path)]))
    return table(["run", "date", "commit", "`make test`", "tests", "`make test-cluster`",
                  "result file"], [r for _, r in sorted(rows, key=lambda r: r[0])])


def same_commit_runs() -> str:
    """The suite of one commit run on different days (`suite-test` and `suite-unit` files of a
    clean commit, two dates or more): what the machine's speed did, the code's cost held still."""
    rows = []
    for kind, label in (("suite-test", "`make test`'s pytest"), ("suite-unit", "`make test-unit`")):
        by_commit: dict[str, list[Path]] = {}
        for path in files(kind):
            if not commit(path).endswith("-dirty"):
                by_commit.setdefault(commit(path), []).append(path)
        for sha, paths in by_commit.items():
            if len({date(p)[:10] for p in paths}) < 2:
                continue
            rows += [[label, sha, date(p), bold(load(p)["wall_s"], "s"),
                      f"{load(p).get('counts', {}).get('passed', 0)} passed", cite(p)]
                     for p in paths]
    return table(["tier", "commit", "date", "wall", "tests", "result file"], rows)


def cluster_runs() -> str:
    """Every run of the cluster scenario (`tests/cluster`, a file each), oldest first."""
    rows = []
    for path in files("cluster"):
        d = load(path)
        operations = d.get("connect_operations")
        rows.append([date(path), commit(path), f"{d['events']:,}", bold(d["seconds"], "s"),
                     "-" if operations is None else f"{operations:,}",
                     f"{d['reconciled_windows']:,}", cite(path)])
    return table(["date", "commit", "events", "scenario", "Spark Connect operations",
                  "reconciled windows (== replay)", "result file"], rows)


# --- plots --------------------------------------------------------------------------------

def plot_suite_times(out: Path) -> None:
    from datetime import datetime

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for kind, key, label in (("suite-test", "wall_s", "make test (local)"),
                             ("ci", "make_test_s", "make test (.ci/run)")):
        points = [(datetime.strptime(stamp(p), "%Y-%m-%dT%H%M%S"), load(p)[key])
                  for p in files(kind)]
        ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set_ylabel("wall time (s)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    save(fig, out)


def plot_freshness(out: Path) -> None:
    plt = pyplot()
    runs = freshness_runs(newest("service-peers"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, by_rate in runs.items():
        rates = sorted(by_rate)
        line, = ax.plot(rates, [statistics.median(by_rate[r]) for r in rates], marker="o",
                        label=f"{system} (median)")
        for r in rates:
            ax.scatter([r] * len(by_rate[r]), by_rate[r], color=line.get_color(), alpha=0.3, s=12)
    ax.set_xlabel("events/s")
    ax.set_ylabel("freshness p95 (s)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, out)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "report"})
    return plt


def save(fig, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    fig.clear()


PLOTS = {"perf-suite-times.png": (plot_suite_times, ["suite-test", "ci"],
                                  "`make test`'s wall time per run"),
         "perf-freshness.png": (plot_freshness, ["service-peers"],
                                "freshness p95 against the event rate, the service and the "
                                "hand-written peers, every round and the medians")}


def figure(name: str) -> str:
    """The plot's image and its caption, naming the result files it was drawn from."""
    _, kinds, caption = PLOTS[name]
    if kinds == ["service-peers"]:
        sources = cite(newest("service-peers"))
    else:
        count = sum(len(files(kind)) for kind in kinds)
        sources = (f"every `bench/results/suite-test-<time>.json` and "
                   f"`bench/results/ci-<time>.json` ({count} files; the newest "
                   f"{cite(files('suite-test')[-1])} and {cite(files('ci')[-1])})")
    return (f"![{caption}](images/{name})\n\n*{caption[0].upper() + caption[1:]}; drawn by "
            f"`make report` from {sources}.*")


# --- the page -----------------------------------------------------------------------------

REGIONS = {
    "targets": targets,
    "freshness": freshness,
    "suite-times": suite_times,
    "same-commit": same_commit_runs,
    "guard": guard,
    "plot-freshness": lambda: figure("perf-freshness.png"),
    "plot-suite-times": lambda: figure("perf-suite-times.png"),
}


# Every page with generated regions, and the renderers of its regions.
PAGES = {PAGE: REGIONS, CLUSTER_PAGE: {"cluster-runs": cluster_runs}}


def render(text: str, regions: dict = REGIONS) -> str:
    """`text` with each generated region rendered again."""
    def region(match):
        return f"{match.group(1)}\n{regions[match.group(2)]()}\n\n{match.group(3)}"

    return REGION.sub(region, text)


def page(path: Path = PAGE) -> str:
    """A page with generated regions (docs/performance.md by default) as `make report` writes
    it (nothing written)."""
    return render(path.read_text(), PAGES[path])


def plots() -> list[Path]:
    return [IMAGES / name for name in PLOTS]


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    for name, (draw, _, _) in PLOTS.items():
        draw(IMAGES / name)
        print(f"written to {IMAGES / name}")
    for path in PAGES:
        path.write_text(page(path))
        print(f"written to {path}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes docs/performance.md's table for one CPU class from bench/compare.sh's raw results.

Run compare.sh once per model with OUT=DIR (it keeps each engine's JSON per pair, the
bandwidth probe and run.json there), then give this script the directories, each with the
label its row gets:

    MODEL=default.gguf OUT=/tmp/perf/default bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2
    MODEL=q4_0.gguf    OUT=/tmp/perf/q4_0    bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2
    bench/performance_page.py "/tmp/perf/default=default (Gemma 3 270M Q4_K_M)" \\
        "/tmp/perf/q4_0=Llama 1B shapes, Q4_0"

Every directory must come from the same CPU class (vendor, family and model range, e.g. AMD
Zen 2) and the same kernels. The page holds one section per class between
`<!-- performance-table KEY -->` and `<!-- /performance-table KEY -->`; this class's section is
replaced (or added before `<!-- performance-tables-end -->`) and every other one is kept as it
is. `--self-test` checks the table writing on a built sample and exits.

`--quota DIR` writes the "Under a CPU quota" section instead, from bench/quota.sh's raw results
(ours and llama.cpp inside a cgroup with a CPU quota, at forced threads and at our default):

    OUT=/tmp/perf/quota bench/quota.sh 3 -p 128 -n 32
    bench/performance_page.py --quota /tmp/perf/quota

`--streams DIR` writes the "Concurrent streams on `serve`" section, from bench/streams.sh's raw
results (aggregate tok/s of 1, 2 and 4 concurrent streams, one token per pass and drafting):

    OUT=/tmp/perf/streams bench/streams.sh 3
    bench/performance_page.py --streams /tmp/perf/streams
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import textwrap

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "performance.md")
END = "<!-- performance-tables-end -->"
QUOTA_START, QUOTA_END = "<!-- performance-quota -->", "<!-- /performance-quota -->"
# Where the quota and streams sections go on a page that has none yet.
QUOTA_BEFORE = "## Reading the tables"
STREAMS_START, STREAMS_END = "<!-- performance-streams -->", "<!-- /performance-streams -->"
# Issue 45's goal for `serve` at 2 threads, one token per pass: the aggregate of N concurrent
# streams at least this many times one stream's.
STREAMS_GOAL = {2: 1.6, 4: 2.2}


def start_marker(key):
    return f"<!-- performance-table {key} -->"


def end_marker(key):
    return f"<!-- /performance-table {key} -->"


def cpu_class(vendor, family, model):
    """A CPU's class by its microarchitecture, which decides how the kernels run."""
    if vendor == "AuthenticAMD":
        if family == 23:
            return "AMD Zen 2" if model >= 0x30 else "AMD Zen 1"
        if family == 25:
            zen4 = 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF
            return "AMD Zen 4" if zen4 else "AMD Zen 3"
        if family == 26:
            return "AMD Zen 5"
        return f"AMD family {family} model {model}"
    if vendor == "GenuineIntel":
        return f"Intel family {family} model {model}"
    return f"{vendor or 'unknown vendor'} family {family} model {model}"


KERNELS = {"avx2": "x86-64-v3 (AVX2) kernels", "vnni": "AVX512-VNNI kernels"}


def reader(directory, script):
    """read(name): the JSON document `name` of a run that `script` wrote into `directory`."""

    def read(name):
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            sys.exit(f"{path} is missing: run bench/{script} with OUT={directory}")
        except json.JSONDecodeError as e:
            sys.exit(f"{path} is not JSON ({e}): run bench/{script} with OUT={directory} again")

    return read


def load(directory):
    """One compare.sh run: its run.json, the probe, and the pairs' JSON documents."""
    read = reader(directory, "compare.sh")
    run = read("run.json")
    pairs = [(read(f"ours.{i}.json"), read(f"peer.{i}.json")) for i in range(1, run["pairs"] + 1)]
    return {"run": run, "probe": read("probe.json"), "pairs": pairs}


def fill(text):
    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)


def median_range(values, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def summarise(result):
    """Per (test, threads) the pairs' ratios and each engine's median tok/s, in our order."""
    key = lambda r: (r["test"], r["threads"])
    by_key = [({key(r): r for r in o["results"]}, {key(r): r for r in p["results"]})
              for o, p in result["pairs"]]
    tests = {}
    for r in result["pairs"][0][0]["results"]:
        k = key(r)
        if k not in by_key[0][1]:
            continue  # a test the peer does not run (tgNxS)
        tests[k] = {
            "ratios": [o[k]["median"] / p[k]["median"] for o, p in by_key],
            "ours": statistics.median(o[k]["median"] for o, _ in by_key),
            "peer": statistics.median(p[k]["median"] for _, p in by_key),
        }
    return tests


def probe_range(results, threads):
    """The model file's read bandwidth over the runs' probes at `threads`, GB/s."""
    seen = [b["best_gb_per_s"] for r in results for b in r["probe"]["read_bandwidth"]
            if b["source"] == "model_file" and b["threads"] == threads]
    if not seen:
        return None
    return f"{min(seen):.1f}" if min(seen) == max(seen) else f"{min(seen):.1f}–{max(seen):.1f}"


def section(results, labels):
    """This CPU class's section of the page, markers included."""
    first = results[0]
    ours0 = first["pairs"][0][0]
    run = first["run"]
    kernels = ours0["kernels"]
    cls = cpu_class(run["vendor"], run["family"], run["model"])
    for r in results[1:]:
        other = cpu_class(r["run"]["vendor"], r["run"]["family"], r["run"]["model"])
        if (other, r["pairs"][0][0]["kernels"]) != (cls, kernels):
            sys.exit(f"the runs are from different CPU classes or kernels: {cls} {kernels}, "
                     f"{other} {r['pairs'][0][0]['kernels']}; give one class at a time")
    key = re.sub(r"[^a-z0-9]+", "-", f"{cls} {kernels}".lower()).strip("-")
    summaries = [summarise(r) for r in results]
    columns = list(summaries[0])
    for s in summaries[1:]:
        columns += [c for c in s if c not in columns]
    commands = sorted({r["run"]["command"] for r in results})
    commits = sorted({r["run"]["commit"] for r in results})
    # 2026-12-05T21:42:10Z -> 2026-12-05 21:42
    when = lambda stamp: stamp.replace("T", " ")[:16]
    started = when(min(r["run"]["started"] for r in results))
    finished = when(max(r["run"]["finished"] for r in results))
    cpus = sorted({r["run"]["cpu"] for r in results})
    pairs = sorted({r["run"]["pairs"] for r in results})
    title = f"{cls}, {KERNELS.get(kernels, kernels + ' kernels')}"
    intro = (
        f"{', '.join(cpus)} (family {run['family']} model {run['model']}); ours with "
        f"`--kernels {kernels}`, llama.cpp built for x86-64-v3. Measured {started} to {finished} "
        f"UTC at commit {', '.join(commits)} with `{'`, `'.join(commands)}` per model. Ratio ours "
        f"/ llama.cpp in tokens per second, median (range) of {'/'.join(map(str, pairs))} "
        "alternating pairs; above 1 ours is faster.")
    lines = [
        start_marker(key),
        f"### {title}",
        "",
        fill(intro),
        "",
        "| model | " + " | ".join(f"{t} {n}T" for t, n in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for label, s in zip(labels, summaries):
        cells = [median_range(s[c]["ratios"]) if c in s else "" for c in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    decode = [c for c in columns if c[0].startswith("tg")]
    if decode:
        heading = " / ".join(f"{t} {n}T" for t, n in decode)
        rows = []
        for label, s in zip(labels, summaries):
            rows.append(f"{label} " + " / ".join(
                f"{s[c]['ours']:.1f} vs {s[c]['peer']:.1f}" if c in s else "-" for c in decode))
        lines.append(fill(f"Decode tokens per second, ours vs llama.cpp ({heading}): "
                          + "; ".join(rows) + "."))
    threads = sorted({n for _, n in columns})
    bandwidth = [f"{n} thread{'s' if n > 1 else ''} {probe_range(results, n)} GB/s"
                 for n in threads if probe_range(results, n)]
    if bandwidth:
        lines.append(fill("The model file's read bandwidth (`llm-server bench --read-bandwidth`, "
                          "before each model's pairs): " + ", ".join(bandwidth) + "."))
    peaks = [f"{label} {max(o['rss_anon_peak_kb'] for o, _ in r['pairs']) // 1024} / "
             f"{max(p['rss_anon_peak_kb'] for _, p in r['pairs']) // 1024}"
             for label, r in zip(labels, results)]
    lines.append(fill("Peak anonymous memory in MiB, ours / llama.cpp with its Python host: "
                      + "; ".join(peaks) + "."))
    lines.append(end_marker(key))
    return key, "\n".join(lines) + "\n"


def replace_section(page, start, end, text, before, what):
    """`page` with the section between the markers `start` and `end` replaced by `text`, or
    `text` added before the line `before` when the page has no such section."""
    if start in page:
        if page.count(start) != 1 or page.count(end) != 1 or page.index(end) < page.index(start):
            sys.exit(f"the page's {what} is not one well-formed pair of markers: fix it by hand")
        a = page.index(start)
        b = page.index(end) + len(end)
        if page[b:b + 1] == "\n":
            b += 1
        return page[:a] + text + page[b:]
    if before not in page:
        sys.exit(f"the page has no {before!r} line to put the {what} before")
    a = page.index(before)
    return page[:a] + text + "\n" + page[a:]


def update(page, key, text):
    """`page` with `key`'s section replaced by `text`, or `text` added before the end marker."""
    return replace_section(page, start_marker(key), end_marker(key), text, END, f"section {key}")


def write(labelled, page_path):
    results, labels = [], []
    for arg in labelled:
        directory, _, label = arg.partition("=")
        results.append(load(directory))
        labels.append(label or results[-1]["pairs"][0][0]["model"])
    key, text = section(results, labels)
    with open(page_path) as f:
        page = f.read()
    with open(page_path, "w") as f:
        f.write(update(page, key, text))
    print(f"{page_path}: section {key} written ({len(labels)} models)")


def load_quota(directory):
    """One quota.sh run: its run.json and, per pair, both engines at forced and default threads."""
    read = reader(directory, "quota.sh")
    run = read("run.json")
    runs = {mode: [(read(f"ours.{mode}.{i}.json"), read(f"peer.{mode}.{i}.json"))
                   for i in range(1, run["pairs"] + 1)] for mode in ("forced", "default")}
    return {"run": run, "runs": runs}


def quota_section(q):
    """The "Under a CPU quota" section, markers included."""
    run = q["run"]
    ours0 = q["runs"]["forced"][0][0]
    default = q["runs"]["default"][0][0]["default_threads"]
    share = run["quota"] / run["period"]
    when = lambda stamp: stamp.replace("T", " ")[:16]
    intro = (
        f"{run['cpu']} (family {run['family']} model {run['model']}), {ours0['model']}, inside a "
        f"cgroup granting {share:.0%} of one CPU (`{run['cgroup_file']}` {run['quota']} "
        f"{run['period']}); ours with `--kernels {run['kernels']}`, llama.cpp built for x86-64-v3. "
        f"Measured {when(run['started'])} to {when(run['finished'])} UTC at commit {run['commit']} "
        f"with `{run['command']}`. Medians (range) of {run['pairs']} alternating pairs: tokens per "
        "second of each engine, and ratios ours / llama.cpp of tokens per second (above 1 ours is "
        "faster) and of CPU time per token (user + system of the process, spinning threads "
        "included; below 1 ours spends less of the quota).")
    rows = [("forced", f"{run['forced_threads']} (forced)"),
            ("default", f"{default['threads']} (ours' default: {default['reason']})")]
    lines = [QUOTA_START, "## Under a CPU quota", "", fill(intro), "",
             "| threads | test | ours tok/s | llama.cpp tok/s | ratio | ours CPU ms/token "
             "| llama.cpp CPU ms/token | CPU ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, label in rows:
        pairs = q["runs"][mode]
        key = lambda r: r["test"]
        by = [({key(r): r for r in o["results"]}, {key(r): r for r in p["results"]}) for o, p in pairs]
        for r in pairs[0][0]["results"]:
            k = key(r)
            if k not in by[0][1]:
                continue
            med = lambda side, field: statistics.median(pair[side][k][field] for pair in by)
            ratios = [o[k]["median"] / p[k]["median"] for o, p in by]
            cpu = [o[k]["cpu_ms_per_token"] / p[k]["cpu_ms_per_token"] for o, p in by]
            lines.append(
                f"| {label} | {k} | {med(0, 'median'):.1f} | {med(1, 'median'):.1f} | "
                f"{median_range(ratios)} | {med(0, 'cpu_ms_per_token'):.2f} | "
                f"{med(1, 'cpu_ms_per_token'):.2f} | {median_range(cpu)} |")
    lines += ["", fill(
        "At the default llama.cpp is given the same count: llama-cpp-python's own default "
        "(half the CPUs) does not look at the quota. `run`, `serve` and `bench` default to the "
        "quota's whole CPUs, rounded down (`llm_server::threads::default_threads`). A burstable "
        "VM shows no quota inside the guest; its budget is the CPU time per token above."),
        QUOTA_END]
    return "\n".join(lines) + "\n"


def update_quota(page, text):
    """`page` with the quota section replaced by `text`, or added before QUOTA_BEFORE."""
    return replace_section(page, QUOTA_START, QUOTA_END, text, QUOTA_BEFORE, "quota section")


def write_quota(directory, page_path):
    text = quota_section(load_quota(directory))
    with open(page_path) as f:
        page = f.read()
    with open(page_path, "w") as f:
        f.write(update_quota(page, text))
    print(f"{page_path}: quota section written")


# serve_bench.py streams' two runs per rep: the file name's prefix and the table's heading.
STREAM_MODES = (("plain", "one token per pass"), ("spec", "drafting"))


def load_streams(directory):
    """One streams.sh run: its run.json and, per mode and rep, the aggregate tok/s by count of
    concurrent streams."""
    read = reader(directory, "streams.sh")
    run = read("run.json")
    reps = {}
    for mode, _ in STREAM_MODES:
        reps[mode] = []
        for k in range(1, run["reps"] + 1):
            name = f"{mode}-{k}.json"
            path = os.path.join(directory, name)
            doc = read(name)
            try:
                by = {s["streams"]: s["aggregate_tok_s"] for s in doc["streams"]}
            except (KeyError, TypeError):
                sys.exit(f"{path} is not bench/serve_bench.py streams' JSON: run bench/streams.sh "
                         f"with OUT={directory} again")
            missing = [n for n in (1, *STREAMS_GOAL) if n not in by]
            if missing:
                sys.exit(f"{path} has no run of {', '.join(map(str, missing))} streams: run "
                         f"bench/streams.sh with OUT={directory} again, with a serve_bench.py "
                         "that runs 1, 2 and 4")
            if by[1] <= 0:
                sys.exit(f"{path}: one stream made no tokens; see {directory}/server.log")
            reps[mode].append(by)
    return {"run": run, "reps": reps}


def goal_sentence(medians):
    """Issue 45's goal and whether `medians` ({streams: median ratio to one stream}, one token
    per pass) meet it, judged on the two decimals the table shows."""
    (n0, g0), *rest = STREAMS_GOAL.items()
    goal = " and ".join([f"at least {g0:g}x one stream's at {n0} streams",
                         *(f"{g:g}x at {n}" for n, g in rest)])
    shown = " and ".join(f"{medians[n]:.2f}x" for n in STREAMS_GOAL)
    met = [n for n, g in STREAMS_GOAL.items() if round(medians[n], 2) >= g]
    missed = [n for n in STREAMS_GOAL if n not in met]
    if not missed:
        verdict = "meet it"
    elif not met:
        verdict = "do not meet it"
    else:
        verdict = (f"meet it for {' and '.join(map(str, met))} streams, not for "
                   f"{' and '.join(map(str, missed))}")
    return (f"The goal (issue 45), decoding one token per pass, is an aggregate of {goal}: the "
            f"medians here, {shown}, {verdict}. With drafting one stream already "
            "decodes several tokens per pass, so its ratios are not held to it.")


def streams_section(st):
    """The "Concurrent streams on `serve`" section, markers included."""
    run = st["run"]
    when = lambda stamp: stamp.replace("T", " ")[:16]
    started, finished = when(run["started"]), when(run["finished"])
    if finished[:10] == started[:10]:
        finished = finished[11:]
    kernels = (f"`--kernels {run['kernels']}`" if run["kernels"]
               else "the best kernels the CPU has (no `--kernels`)")
    intro = (
        f"{run['cpu']} (family {run['family']} model {run['model']}), {run['model_file']}, on "
        f"`llm-server serve --threads {run['threads']} --parallel {run['parallel']}` with "
        f"{kernels}. Measured {started} to {finished} UTC at commit {run['commit']} with "
        f"`{run['command']}`: {run['reps']} rep{'s' if run['reps'] != 1 else ''}, each running "
        "`bench/serve_bench.py streams` (N concurrent greedy completions) once with one token per "
        "pass (`--no-speculative`) and once with prompt-lookup drafting (the default), "
        "alternating. Aggregate tokens per second (completion tokens / wall time), median of the "
        "reps, and its ratio to the same rep's one stream, median (range).")
    counts = sorted(set.intersection(*(set(by) for reps in st["reps"].values() for by in reps)))
    lines = [STREAMS_START, "## Concurrent streams on `serve`", "", fill(intro), "",
             "| streams | " + " | ".join(f"{label} tok/s | {label}, ratio to 1 stream"
                                         for _, label in STREAM_MODES) + " |",
             "|---|" + "---|---|" * len(STREAM_MODES)]
    ratio_medians = {}
    for n in counts:
        cells = []
        for mode, _ in STREAM_MODES:
            reps = st["reps"][mode]
            ratios = [by[n] / by[1] for by in reps]
            if mode == "plain":
                ratio_medians[n] = statistics.median(ratios)
            cells.append(f"{statistics.median(by[n] for by in reps):.1f}")
            cells.append("1" if n == 1 else median_range(ratios))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", fill(goal_sentence(ratio_medians)), STREAMS_END]
    return "\n".join(lines) + "\n"


def write_streams(directory, page_path):
    text = streams_section(load_streams(directory))
    with open(page_path) as f:
        page = f.read()
    with open(page_path, "w") as f:
        f.write(replace_section(page, STREAMS_START, STREAMS_END, text, QUOTA_BEFORE,
                                "streams section"))
    print(f"{page_path}: streams section written")


def self_test_quota(tmp):
    """A quota run of 3 pairs: the table's medians and ratios, and a second write's no-op."""
    d = os.path.join(tmp, "quota")
    os.mkdir(d)
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"command": "bench/quota.sh 3 -p 128 -n 32", "pairs": 3, "kernels": "avx2",
                   "started": "2026-12-06T10:00:00Z", "finished": "2026-12-06T10:10:00Z",
                   "commit": "abc1234", "quota": 25000, "period": 100000,
                   "cgroup_file": "cpu.max", "forced_threads": 2, "vendor": "AuthenticAMD",
                   "family": 23, "model": 1, "cpu": "AMD EPYC 7551"}, f)
    default = {"threads": 1, "reason": "cgroup cpu.max 25000 100000"}
    for i in (1, 2, 3):
        for mode, scale in (("forced", 1.0), ("default", 2.0)):
            ours = {"model": "m", "default_threads": default, "results": [
                {"test": "pp128", "threads": 1, "median": 10.0 * i * scale, "cpu_ms_per_token": 20.0 / i},
                {"test": "tg32x2", "threads": 1, "median": 1.0, "cpu_ms_per_token": 1.0}]}
            peer = {"results": [{"test": "pp128", "threads": 1, "median": 10.0, "cpu_ms_per_token": 40.0}]}
            json.dump(ours, open(os.path.join(d, f"ours.{mode}.{i}.json"), "w"))
            json.dump(peer, open(os.path.join(d, f"peer.{mode}.{i}.json"), "w"))
    page_path = os.path.join(tmp, "quota.md")
    before = "# Performance\n\n" + END + "\n\n" + QUOTA_BEFORE + "\n\ntext\n"
    with open(page_path, "w") as f:
        f.write(before)
    write_quota(d, page_path)
    page = open(page_path).read()
    unwrapped = page.replace("\n", " ")
    checks = [
        (page.index(END) < page.index(QUOTA_START) < page.index(QUOTA_BEFORE),
         "the quota section comes after the tables, before the reading notes"),
        ("| 2 (forced) | pp128 | 20.0 | 10.0 | 2.00 (1.00–3.00) | 10.00 | 40.00 | 0.25 (0.17–0.50) |"
         in page, "forced row: medians and ratios of tok/s and CPU time"),
        ("| 1 (ours' default: cgroup cpu.max 25000 100000) | pp128 | 40.0 | 10.0 | 4.00 (2.00–6.00) |"
         in page, "default row names the count and its reason"),
        ("tg32x2" not in page, "a test the peer does not run is left out"),
        ("AMD EPYC 7551 (family 23 model 1), m, inside a cgroup granting 25% of one CPU" in unwrapped,
         "the CPU model and the quota are named"),
    ]
    write_quota(d, page_path)
    checks.append((open(page_path).read() == page, "writing the quota run again changes nothing"))
    return checks


def self_test_streams(tmp):
    """A streams run of 3 reps: the table's medians and ratios, the goal sentence both ways, the
    section's place, a second write's no-op, and the errors for a missing or short result."""
    d = os.path.join(tmp, "streams")
    os.mkdir(d)
    run = {"command": "KERNELS=avx2 bench/streams.sh 3", "reps": 3, "kernels": "avx2",
           "threads": 2, "parallel": 4, "model_file": "gemma.gguf",
           "started": "2026-12-06T10:00:00Z", "finished": "2026-12-06T10:05:00Z",
           "commit": "abc1234", "vendor": "AuthenticAMD", "family": 23, "model": 1,
           "cpu": "AMD EPYC 7551"}
    json.dump(run, open(os.path.join(d, "run.json"), "w"))

    def reps(mode, rows):
        # rows: per rep the aggregate tok/s of 1, 2 and 4 streams.
        for k, row in enumerate(rows, 1):
            doc = {"streams": [{"streams": n, "tokens": 128 * n, "seconds": 128 * n / v,
                                "aggregate_tok_s": v} for n, v in zip((1, 2, 4), row)]}
            json.dump(doc, open(os.path.join(d, f"{mode}-{k}.json"), "w"))

    # Plain ratios 1.7/1.6/1.8 (2 streams) and 2.1/2.3/2.5 (4): both medians meet the goal.
    reps("plain", [(10.0, 17.0, 21.0), (10.0, 16.0, 23.0), (12.0, 21.6, 30.0)])
    reps("spec", [(40.0, 48.0, 60.0), (50.0, 55.0, 70.0), (45.0, 63.0, 81.0)])
    page_path = os.path.join(tmp, "streams.md")
    quota = QUOTA_START + "\n## Under a CPU quota\n" + QUOTA_END + "\n"
    with open(page_path, "w") as f:
        f.write("# Performance\n\n" + END + "\n\n" + quota + "\n" + QUOTA_BEFORE + "\n\ntext\n")
    write_streams(d, page_path)
    page = open(page_path).read()
    unwrapped = page.replace("\n", " ")
    checks = [
        (page.index(QUOTA_END) < page.index(STREAMS_START) < page.index(QUOTA_BEFORE),
         "the streams section comes after the quota section, before the reading notes"),
        ("| streams | one token per pass tok/s | one token per pass, ratio to 1 stream | "
         "drafting tok/s | drafting, ratio to 1 stream |" in page, "the table's columns"),
        ("| 1 | 10.0 | 1 | 45.0 | 1 |" in page, "one stream: the median aggregates"),
        ("| 2 | 17.0 | 1.70 (1.60–1.80) | 55.0 | 1.20 (1.10–1.40) |" in page,
         "2 streams: median aggregates and median (range) of the per-rep ratios"),
        ("| 4 | 23.0 | 2.30 (2.10–2.50) | 70.0 | 1.50 (1.40–1.80) |" in page,
         "4 streams: median aggregates and median (range) of the per-rep ratios"),
        ("AMD EPYC 7551 (family 23 model 1), gemma.gguf, on `llm-server serve --threads 2 "
         "--parallel 4` with `--kernels avx2`" in unwrapped, "the CPU, model and command"),
        ("`KERNELS=avx2 bench/streams.sh 3`: 3 reps" in unwrapped, "the script's command and reps"),
        ("Measured 2026-12-06 10:00 to 10:05 UTC at commit abc1234" in unwrapped,
         "the run's time and commit"),
        ("at least 1.6x one stream's at 2 streams and 2.2x at 4: the medians here, 1.70x and "
         "2.30x, meet it." in unwrapped, "medians over the goal are said to meet it"),
    ]
    write_streams(d, page_path)
    checks.append((open(page_path).read() == page, "writing the streams run again changes nothing"))
    # 4 streams' ratios 1.9/2.0/2.17: the median misses the goal, and the section is replaced.
    reps("plain", [(10.0, 17.0, 19.0), (10.0, 16.0, 20.0), (12.0, 21.6, 26.0)])
    write_streams(d, page_path)
    page = open(page_path).read()
    unwrapped = page.replace("\n", " ")
    checks += [
        (page.count(STREAMS_START) == 1 and "| 4 | 20.0 | 2.00 (1.90–2.17) |" in page,
         "a second run replaces the section"),
        ("the medians here, 1.70x and 2.00x, meet it for 2 streams, not for 4." in unwrapped,
         "a median under the goal is said to miss it"),
    ]
    for medians, verdict in (({2: 1.5, 4: 2.0}, "do not meet it."),
                             ({2: 1.55, 4: 2.3}, "meet it for 4 streams, not for 2."),
                             ({2: 1.5999, 4: 2.2}, "meet it.")):
        checks.append((f"{verdict} With drafting" in goal_sentence(medians),
                       f"{medians} {verdict!r} (judged as the table rounds)"))

    def refused(what):
        try:
            load_streams(d)
        except SystemExit as e:
            return what in str(e.code)
        return False

    json.dump({"streams": [{"streams": 1, "aggregate_tok_s": 1.0}]},
              open(os.path.join(d, "spec-2.json"), "w"))
    checks.append((refused("spec-2.json has no run of 2, 4 streams"), "a short result is refused"))
    os.remove(os.path.join(d, "spec-2.json"))
    checks.append((refused("spec-2.json is missing: run bench/streams.sh"),
                   "a missing result is refused, naming the script"))
    return checks


def self_test():
    """Builds compare.sh's output for two models on a Zen 2, writes it into a page that holds
    another class's section, and checks the numbers, the other section and a second write."""

    def doc(engine, tok_s, anon_kb):
        results = [{"test": t, "threads": n, "median": v} for (t, n), v in tok_s.items()]
        return {"engine": engine, "model": "m", "cpu": "AMD EPYC 7B12", "kernels": "avx2",
                "results": results, "rss_anon_peak_kb": anon_kb, "rss_file_peak_kb": 0}

    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for name, scale in (("a", 1.0), ("b", 2.0)):
            d = os.path.join(tmp, name)
            os.mkdir(d)
            with open(os.path.join(d, "run.json"), "w") as f:
                json.dump({"command": "bench/compare.sh 3 -p 128 -n 32 -t 1,2", "pairs": 3,
                           "started": f"2026-12-0{1 if name == 'a' else 2}T10:00:00Z",
                           "finished": "2026-12-02T11:00:00Z", "commit": "abc1234",
                           "vendor": "AuthenticAMD", "family": 23, "model": 49,
                           "cpu": "AMD EPYC 7B12"}, f)
            with open(os.path.join(d, "probe.json"), "w") as f:
                json.dump({"read_bandwidth": [
                    {"source": "model_file", "threads": 1, "best_gb_per_s": 12.5 * scale},
                    {"source": "model_file", "threads": 2, "best_gb_per_s": 20.0},
                    {"source": "anonymous", "threads": 1, "best_gb_per_s": 99.0}]}, f)
            # Pair i: ours 100·{1,2,4}·scale (pp128: a median apart from the mean) and 10·scale+i
            # (tg32 at 1 thread); peer 100 and 10.
            for i in (1, 2, 3):
                ours = doc("llm-server", {("pp128", 1): 100.0 * (1, 2, 4)[i - 1] * scale, ("tg32", 1): 10 * scale + i,
                                          ("tg32", 2): 20.0, ("tg32x2", 1): 5.0}, 2048 * i)
                peer = doc("llama.cpp", {("pp128", 1): 100.0, ("tg32", 1): 10.0,
                                         ("tg32", 2): 10.0}, 4096)
                json.dump(ours, open(os.path.join(d, f"ours.{i}.json"), "w"))
                json.dump(peer, open(os.path.join(d, f"peer.{i}.json"), "w"))
            dirs.append(d)
        other = ("<!-- performance-table amd-zen-4-vnni -->\n### AMD Zen 4\n| kept | as is |\n"
                 "<!-- /performance-table amd-zen-4-vnni -->\n")
        page_path = os.path.join(tmp, "performance.md")
        before = "# Performance\n\nintro\n\n" + other + "\n" + END + "\n\n## How to reproduce\n"
        with open(page_path, "w") as f:
            f.write(before)
        write([f"{dirs[0]}=first model", dirs[1]], page_path)
        page = open(page_path).read()
        unwrapped = page.replace("\n", " ")
        checks = [
            (other in page, "the other class's section is kept"),
            (page.index(other) < page.index("amd-zen-2-avx2") < page.index(END),
             "the new section comes after the existing one, before the end marker"),
            ("### AMD Zen 2, x86-64-v3 (AVX2) kernels" in page, "the heading names class and kernels"),
            ("| model | pp128 1T | tg32 1T | tg32 2T |" in page,
             "the columns are our tests the peer ran, tg32x2 left out"),
            ("| first model | 2.00 (1.00–4.00) | 1.20 (1.10–1.30) | 2.00 (2.00–2.00) |" in page,
             "ratios are the median (range) of the pairs"),
            ("| m | 4.00 (2.00–8.00) | 2.20 (2.10–2.30) | 2.00 (2.00–2.00) |" in page,
             "an unlabelled run is named by its model"),
            ("first model 12.0 vs 10.0 / 20.0 vs 10.0" in unwrapped, "decode tok/s are the medians"),
            ("1 thread 12.5–25.0 GB/s, 2 threads 20.0 GB/s" in unwrapped, "the probe's range"),
            ("first model 6 / 4; m 6 / 4" in unwrapped, "peak anonymous memory in MiB"),
            ("2026-12-01 10:00 to 2026-12-02 11:00 UTC" in unwrapped, "the dates span the runs"),
        ]
        write([f"{dirs[0]}=first model", dirs[1]], page_path)
        checks.append((open(page_path).read() == page, "writing the same runs again changes nothing"))
        checks += self_test_quota(tmp)
        checks += self_test_streams(tmp)
        failed = [what for ok, what in checks if not ok]
        if failed:
            print(page)
            sys.exit("self-test failed: " + "; ".join(failed))
    print(f"self-test passed ({len(checks)} checks)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", metavar="DIR[=LABEL]",
                    help="a compare.sh OUT directory, and the label of its row")
    ap.add_argument("--page", default=PAGE, help="the page to update (default: docs/performance.md)")
    ap.add_argument("--self-test", action="store_true", help="check the script on a built sample")
    ap.add_argument("--quota", metavar="DIR",
                    help="write the 'Under a CPU quota' section from a bench/quota.sh OUT directory")
    ap.add_argument("--streams", metavar="DIR",
                    help="write the 'Concurrent streams on `serve`' section from a "
                         "bench/streams.sh OUT directory")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.quota and a.streams:
        ap.error("--quota and --streams each write one section: give one per run")
    if a.quota or a.streams:
        if a.runs:
            ap.error("--quota and --streams take one directory each; write the tables in "
                     "another run")
        if a.quota:
            return write_quota(a.quota, a.page)
        return write_streams(a.streams, a.page)
    if not a.runs:
        ap.error("give at least one compare.sh OUT directory (or --self-test)")
    write(a.runs, a.page)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes docs/performance.md's sections for one CPU class from bench/compare.sh's raw results.

Run compare.sh once per model with OUT=DIR (it keeps each engine's JSON per pair, the
bandwidth probe and run.json there), then give this script the directories, each with the
label its row gets:

    MODEL=default.gguf OUT=/tmp/perf/default bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2
    MODEL=q4_0.gguf    OUT=/tmp/perf/q4_0    bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2
    bench/performance_page.py "/tmp/perf/default=default (Gemma 3 270M Q4_K_M)" \\
        "/tmp/perf/q4_0=Llama 1B shapes, Q4_0"

Every directory must come from the same CPU class (vendor, family and model range, e.g. AMD
Zen 2) and the same kernels. The page holds one table section per class between
`<!-- performance-table KEY -->` and `<!-- /performance-table KEY -->`; this class's section is
replaced (or added before `<!-- performance-tables-end -->`) and every other one is kept as it
is. `--self-test` checks the writing on built samples and exits.

`--quota DIR` writes this class's section under "Under a CPU quota" instead, from
bench/quota.sh's raw results (ours and llama.cpp inside a cgroup with a CPU quota, at forced
threads and at our default):

    OUT=/tmp/perf/quota bench/quota.sh 3 -p 128 -n 32
    bench/performance_page.py --quota /tmp/perf/quota

`--streams DIR` writes this class's section under "Concurrent streams on `serve`", from
bench/streams.sh's raw results (aggregate tok/s of 1, 2 and 4 concurrent streams, one token per
pass and drafting):

    OUT=/tmp/perf/streams bench/streams.sh 3
    bench/performance_page.py --streams /tmp/perf/streams

Both are kept per class as the tables are, keyed by run.json's CPU and kernels:
`<!-- performance-quota KEY -->` ... `<!-- /performance-quota KEY -->`, new classes added before
`<!-- performance-quota-end -->` (likewise `performance-streams`). On a page without the group
yet, its heading and end marker are added before "## Reading the tables", quota above streams.
"""
import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import textwrap

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "performance.md")
# Where the quota and streams groups go on a page that has neither yet.
READING = "## Reading the tables"
# Issue 45's goal for `serve` at 2 threads, one token per pass: the aggregate of N concurrent
# streams at least this many times one stream's.
STREAMS_GOAL = {2: 1.6, 4: 2.2}


@dataclasses.dataclass(frozen=True)
class Group:
    """One kind of section the page holds per CPU class, between `<!-- KIND KEY -->` and
    `<!-- /KIND KEY -->`; a new class's section goes before the group's `end` line. A group this
    script may add to a page that lacks it has a `heading` and `intro`, written once above its
    sections, and goes before the first of its `before` lines the page has."""
    kind: str
    end: str
    heading: str = ""
    intro: str = ""
    before: tuple = ()

    def start_marker(self, key):
        return f"<!-- {self.kind} {key} -->"

    def end_marker(self, key):
        return f"<!-- /{self.kind} {key} -->"


# The tables' heading and prose are the page's own: without the end line there is nowhere to go.
TABLES = Group("performance-table", "<!-- performance-tables-end -->")
STREAMS = Group(
    "performance-streams", "<!-- performance-streams-end -->", "## Concurrent streams on `serve`",
    "One section per CPU class, written by `bench/performance_page.py --streams` from "
    "`bench/streams.sh`'s raw results; running it again on a class replaces that class's section "
    "and keeps the others.", (READING,))
# Quota above streams, also when streams was written first.
QUOTA = Group(
    "performance-quota", "<!-- performance-quota-end -->", "## Under a CPU quota",
    "One section per CPU class, written by `bench/performance_page.py --quota` from "
    "`bench/quota.sh`'s raw results; running it again on a class replaces that class's section "
    "and keeps the others.", (STREAMS.heading, READING))


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


# By `--kernels`' value; "" is a run without it (streams.sh and quota.sh with KERNELS=).
KERNELS = {"avx2": "x86-64-v3 (AVX2) kernels", "vnni": "AVX512-VNNI kernels",
           "": "the best kernels the CPU has"}


def cpu_key(run, kernels):
    """A run's section key and ### heading, from run.json's CPU and the kernels: the one source of
    which sections are the same class, in every group."""
    cls = cpu_class(run["vendor"], run["family"], run["model"])
    key = re.sub(r"[^a-z0-9]+", "-", f"{cls} {kernels}".lower()).strip("-")
    return key, f"{cls}, {KERNELS.get(kernels, kernels + ' kernels')}"


def marked(group, key, title, body):
    """A class's section of `group`: its markers around a ### heading and `body`'s lines."""
    lines = [group.start_marker(key), f"### {title}", "", *body, group.end_marker(key)]
    return "\n".join(lines) + "\n"


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
    """This CPU class's key and table section, markers included."""
    first = results[0]
    ours0 = first["pairs"][0][0]
    run = first["run"]
    kernels = ours0["kernels"]
    key, title = cpu_key(run, kernels)
    for r in results[1:]:
        other, other_title = cpu_key(r["run"], r["pairs"][0][0]["kernels"])
        if other != key:
            sys.exit(f"the runs are from different CPU classes or kernels: {title}; "
                     f"{other_title}; give one class at a time")
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
    intro = (
        f"{', '.join(cpus)} (family {run['family']} model {run['model']}); ours with "
        f"`--kernels {kernels}`, llama.cpp built for x86-64-v3. Measured {started} to {finished} "
        f"UTC at commit {', '.join(commits)} with `{'`, `'.join(commands)}` per model. Ratio ours "
        f"/ llama.cpp in tokens per second, median (range) of {'/'.join(map(str, pairs))} "
        "alternating pairs; above 1 ours is faster.")
    lines = [
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
    return key, marked(TABLES, key, title, lines)


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


def check_markers(page, group, key):
    """Refuses a page whose `group` update() could not place right: markers without a class key
    (the page before sections were per class), sections without the end line, or `key`'s section
    after it."""
    for old in (f"<!-- {group.kind} -->", f"<!-- /{group.kind} -->"):
        if old in page:
            sys.exit(f"the page has {old}, a marker without a CPU class key: give the section "
                     f"the class's key (<!-- {group.kind} KEY --> ... <!-- /{group.kind} KEY -->, "
                     "KEY as this script makes it) and a ### heading by hand")
    if page.count(group.end) > 1:
        sys.exit(f"the page has {group.end} more than once: keep the one after the last section")
    if group.end not in page and f"<!-- {group.kind} " in page:
        sys.exit(f"the page has {group.kind} sections but no {group.end} line: add it after "
                 "the last one by hand")
    start = group.start_marker(key)
    if start in page and group.end in page and page.index(start) > page.index(group.end):
        sys.exit(f"the page's {start} is after {group.end}: move its section above that line "
                 "by hand")


def add_group(page, group):
    """`page` with `group`'s heading, intro and end line added before the first of its `before`
    lines, unless it has the group already."""
    if group.end in page:
        return page
    if not group.heading:
        sys.exit(f"the page has no {group.end!r} line to put the {group.kind} sections before")
    if group.heading in page:
        sys.exit(f"the page has {group.heading!r} but no {group.end!r} line: add that line after "
                 "the group's last section by hand")
    anchor = next((line for line in group.before if line in page), None)
    if anchor is None:
        sys.exit(f"the page has no {' or '.join(map(repr, group.before))} line to put "
                 f"{group.heading!r} before")
    a = page.index(anchor)
    return page[:a] + f"{group.heading}\n\n{fill(group.intro)}\n\n{group.end}\n\n" + page[a:]


def update(page, group, key, text):
    """`page` with `key`'s section of `group` replaced by `text`, or added before the group's end
    line (the group itself added first where the page has none)."""
    check_markers(page, group, key)
    page = add_group(page, group)
    return replace_section(page, group.start_marker(key), group.end_marker(key), text, group.end,
                           f"{group.kind} section {key}")


def write_section(page_path, group, key, text):
    with open(page_path) as f:
        page = f.read()
    # The new page before opening for writing: a refusal must leave the page as it was.
    page = update(page, group, key, text)
    with open(page_path, "w") as f:
        f.write(page)


def write(labelled, page_path):
    results, labels = [], []
    for arg in labelled:
        directory, _, label = arg.partition("=")
        results.append(load(directory))
        labels.append(label or results[-1]["pairs"][0][0]["model"])
    key, text = section(results, labels)
    write_section(page_path, TABLES, key, text)
    print(f"{page_path}: section {key} written ({len(labels)} models)")


def load_quota(directory):
    """One quota.sh run: its run.json and, per pair, both engines at forced and default threads."""
    read = reader(directory, "quota.sh")
    run = read("run.json")
    runs = {mode: [(read(f"ours.{mode}.{i}.json"), read(f"peer.{mode}.{i}.json"))
                   for i in range(1, run["pairs"] + 1)] for mode in ("forced", "default")}
    return {"run": run, "runs": runs}


def quota_section(q):
    """This CPU class's key and section under "Under a CPU quota", markers included."""
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
    lines = [fill(intro), "",
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
        "VM shows no quota inside the guest; its budget is the CPU time per token above.")]
    key, title = cpu_key(run, run["kernels"])
    return key, marked(QUOTA, key, title, lines)


def write_quota(directory, page_path):
    key, text = quota_section(load_quota(directory))
    write_section(page_path, QUOTA, key, text)
    print(f"{page_path}: quota section {key} written")


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
    """This CPU class's key and section under "Concurrent streams on `serve`", markers
    included; its goal sentence judges this class's medians."""
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
    lines = [fill(intro), "",
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
    lines += ["", fill(goal_sentence(ratio_medians))]
    key, title = cpu_key(run, run["kernels"])
    return key, marked(STREAMS, key, title, lines)


def write_streams(directory, page_path):
    key, text = streams_section(load_streams(directory))
    write_section(page_path, STREAMS, key, text)
    print(f"{page_path}: streams section {key} written")


# The self-tests' two CPU classes, as run.json names them.
ZEN_1 = {"vendor": "AuthenticAMD", "family": 23, "model": 1, "cpu": "AMD EPYC 7551"}
XEON = {"vendor": "GenuineIntel", "family": 6, "model": 207, "cpu": "Intel(R) Xeon(R) Processor"}


def section_of(page, group, key):
    """`key`'s section of `group` on `page`, markers included ("" where it has none)."""
    start, end = group.start_marker(key), group.end_marker(key)
    if start not in page or end not in page:
        return ""
    return page[page.index(start):page.index(end) + len(end)]


def in_order(page, *parts):
    """Whether every part is on `page`, each after the one before ("", a missing section, never
    is: it would be found anywhere)."""
    at = [page.find(part) if part else -1 for part in parts]
    return -1 not in at and at == sorted(at)


def quota_run(tmp, name, cpu, scale):
    """A quota.sh run of 3 pairs on `cpu` in tmp/name. Pair i: ours' pp128 at 10·i·scale tok/s at
    forced threads and twice that at the default, 20/i CPU ms per token; the peer's 10 and 40."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"command": "bench/quota.sh 3 -p 128 -n 32", "pairs": 3, "kernels": "avx2",
                   "started": "2026-12-06T10:00:00Z", "finished": "2026-12-06T10:10:00Z",
                   "commit": "abc1234", "quota": 25000, "period": 100000,
                   "cgroup_file": "cpu.max", "forced_threads": 2, **cpu}, f)
    default = {"threads": 1, "reason": "cgroup cpu.max 25000 100000"}
    for i in (1, 2, 3):
        for mode, factor in (("forced", 1.0), ("default", 2.0)):
            ours = {"model": "m", "default_threads": default, "results": [
                {"test": "pp128", "threads": 1, "median": 10.0 * i * factor * scale,
                 "cpu_ms_per_token": 20.0 / i},
                {"test": "tg32x2", "threads": 1, "median": 1.0, "cpu_ms_per_token": 1.0}]}
            peer = {"results": [{"test": "pp128", "threads": 1, "median": 10.0, "cpu_ms_per_token": 40.0}]}
            json.dump(ours, open(os.path.join(d, f"ours.{mode}.{i}.json"), "w"))
            json.dump(peer, open(os.path.join(d, f"peer.{mode}.{i}.json"), "w"))
    return d


def self_test_quota(tmp):
    """Quota runs on two classes: the table's medians and ratios, the group added to a page
    without one, a second class's section beside the first, a rewrite that touches only its own
    class, and second writes' no-op."""
    zen, zen_again, xeon = (quota_run(tmp, name, cpu, scale) for name, cpu, scale in (
        ("quota-zen", ZEN_1, 1.0), ("quota-zen-again", ZEN_1, 2.0), ("quota-xeon", XEON, 3.0)))
    zen_key, xeon_key = "amd-zen-1-avx2", "intel-family-6-model-207-avx2"
    page_path = os.path.join(tmp, "quota.md")
    with open(page_path, "w") as f:
        f.write("# Performance\n\n" + TABLES.end + "\n\n" + READING + "\n\ntext\n")
    write_quota(zen, page_path)
    page = open(page_path).read()
    unwrapped = page.replace("\n", " ")
    checks = [
        (in_order(page, TABLES.end, QUOTA.heading, QUOTA.start_marker(zen_key), QUOTA.end, READING),
         "the quota group (heading, section, end line) comes after the tables, before the "
         "reading notes"),
        (QUOTA.start_marker(zen_key) + "\n### AMD Zen 1, x86-64-v3 (AVX2) kernels\n" in page,
         "the quota section starts with a heading naming class and kernels"),
        ("| 2 (forced) | pp128 | 20.0 | 10.0 | 2.00 (1.00–3.00) | 10.00 | 40.00 | 0.25 (0.17–0.50) |"
         in page, "forced row: medians and ratios of tok/s and CPU time"),
        ("| 1 (ours' default: cgroup cpu.max 25000 100000) | pp128 | 40.0 | 10.0 | 4.00 (2.00–6.00) |"
         in page, "default row names the count and its reason"),
        ("tg32x2" not in page, "a test the peer does not run is left out"),
        ("AMD EPYC 7551 (family 23 model 1), m, inside a cgroup granting 25% of one CPU" in unwrapped,
         "the CPU model and the quota are named"),
    ]
    write_quota(zen, page_path)
    checks.append((open(page_path).read() == page, "writing the quota run again changes nothing"))
    zen_section = section_of(page, QUOTA, zen_key)
    write_quota(xeon, page_path)
    page = open(page_path).read()
    xeon_section = section_of(page, QUOTA, xeon_key)
    checks += [
        (in_order(page, zen_section, xeon_section, QUOTA.end, READING),
         "a second class's quota section goes after the first, which is kept as it was"),
        (page.count(QUOTA.heading) == 1 and page.count(QUOTA.end) == 1,
         "the quota heading and end line stay single"),
        ("### Intel family 6 model 207, x86-64-v3 (AVX2) kernels" in xeon_section
         and "| 2 (forced) | pp128 | 60.0 | 10.0 | 6.00 (3.00–9.00) |" in xeon_section,
         "the second class's section has its own heading and figures"),
    ]
    write_quota(xeon, page_path)
    checks.append((open(page_path).read() == page,
                   "writing the second class again changes nothing"))
    write_quota(zen_again, page_path)
    page = open(page_path).read()
    checks += [
        (page.count(QUOTA.start_marker(zen_key)) == 1
         and in_order(page, QUOTA.start_marker(zen_key), xeon_section, QUOTA.end),
         "rewriting the first class replaces its quota section in place, the second kept"),
        ("| 2 (forced) | pp128 | 40.0 | 10.0 | 4.00 (2.00–6.00) |"
         in section_of(page, QUOTA, zen_key),
         "the rewritten quota section has the new figures"),
    ]
    return checks


def streams_run(tmp, name, cpu, plain, spec):
    """A streams.sh run of 3 reps on `cpu` in tmp/name; `plain` and `spec` hold per rep the
    aggregate tok/s of 1, 2 and 4 streams."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    run = {"command": "KERNELS=avx2 bench/streams.sh 3", "reps": 3, "kernels": "avx2",
           "threads": 2, "parallel": 4, "model_file": "gemma.gguf",
           "started": "2026-12-06T10:00:00Z", "finished": "2026-12-06T10:05:00Z",
           "commit": "abc1234", **cpu}
    json.dump(run, open(os.path.join(d, "run.json"), "w"))
    for mode, rows in (("plain", plain), ("spec", spec)):
        for k, row in enumerate(rows, 1):
            doc = {"streams": [{"streams": n, "tokens": 128 * n, "seconds": 128 * n / v,
                                "aggregate_tok_s": v} for n, v in zip((1, 2, 4), row)]}
            json.dump(doc, open(os.path.join(d, f"{mode}-{k}.json"), "w"))
    return d


def self_test_streams(tmp):
    """Streams runs on two classes: the table's medians and ratios, each section's goal sentence
    judging its own medians, the group's place after the quota group, a second class beside the
    first, a rewrite that touches only its own class, second writes' no-op, and the errors for a
    missing or short result."""
    spec = [(40.0, 48.0, 60.0), (50.0, 55.0, 70.0), (45.0, 63.0, 81.0)]
    # Plain ratios 1.7/1.6/1.8 (2 streams) and 2.1/2.3/2.5 (4): both medians meet the goal.
    zen = streams_run(tmp, "streams-zen", ZEN_1,
                      [(10.0, 17.0, 21.0), (10.0, 16.0, 23.0), (12.0, 21.6, 30.0)], spec)
    # 4 streams' ratios 1.9/2.0/2.17: the median misses the goal.
    zen_again = streams_run(tmp, "streams-zen-again", ZEN_1,
                            [(10.0, 17.0, 19.0), (10.0, 16.0, 20.0), (12.0, 21.6, 26.0)], spec)
    # Ratios 1.5 and 2.0: neither meets it.
    xeon = streams_run(tmp, "streams-xeon", XEON, [(10.0, 15.0, 20.0)] * 3, spec)
    zen_key, xeon_key = "amd-zen-1-avx2", "intel-family-6-model-207-avx2"
    page_path = os.path.join(tmp, "streams.md")
    page = "# Performance\n\n" + TABLES.end + "\n\n" + READING + "\n\ntext\n"
    with open(page_path, "w") as f:
        f.write(update(page, QUOTA, zen_key, marked(QUOTA, zen_key, "AMD Zen 1", ["figures"])))
    write_streams(zen, page_path)
    page = open(page_path).read()
    unwrapped = page.replace("\n", " ")
    checks = [
        (in_order(page, QUOTA.end, STREAMS.heading, STREAMS.start_marker(zen_key), STREAMS.end,
                  READING),
         "the streams group (heading, section, end line) comes after the quota group, before the "
         "reading notes"),
        (STREAMS.start_marker(zen_key) + "\n### AMD Zen 1, x86-64-v3 (AVX2) kernels\n" in page,
         "the streams section starts with a heading naming class and kernels"),
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
    write_streams(zen, page_path)
    checks.append((open(page_path).read() == page, "writing the streams run again changes nothing"))
    zen_section = section_of(page, STREAMS, zen_key)
    write_streams(xeon, page_path)
    page = open(page_path).read()
    xeon_section = section_of(page, STREAMS, xeon_key)
    checks += [
        (in_order(page, zen_section, xeon_section, STREAMS.end, READING),
         "a second class's streams section goes after the first, which is kept as it was"),
        (page.count(STREAMS.heading) == 1 and page.count(STREAMS.end) == 1,
         "the streams heading and end line stay single"),
        ("### Intel family 6 model 207, x86-64-v3 (AVX2) kernels" in xeon_section
         and "| 4 | 20.0 | 2.00 (2.00–2.00) |" in xeon_section,
         "the second class's section has its own heading and figures"),
        ("the medians here, 1.50x and 2.00x, do not meet it." in xeon_section.replace("\n", " "),
         "each section's goal sentence judges its own class's medians"),
    ]
    write_streams(xeon, page_path)
    checks.append((open(page_path).read() == page,
                   "writing the second class again changes nothing"))
    write_streams(zen_again, page_path)
    page = open(page_path).read()
    zen_section = section_of(page, STREAMS, zen_key)
    checks += [
        (page.count(STREAMS.start_marker(zen_key)) == 1
         and "| 4 | 20.0 | 2.00 (1.90–2.17) |" in zen_section
         and in_order(page, zen_section, xeon_section, STREAMS.end),
         "rewriting the first class replaces its streams section in place, the second kept"),
        ("the medians here, 1.70x and 2.00x, meet it for 2 streams, not for 4."
         in zen_section.replace("\n", " "), "a median under the goal is said to miss it"),
    ]
    for medians, verdict in (({2: 1.5, 4: 2.0}, "do not meet it."),
                             ({2: 1.55, 4: 2.3}, "meet it for 4 streams, not for 2."),
                             ({2: 1.5999, 4: 2.2}, "meet it.")):
        checks.append((f"{verdict} With drafting" in goal_sentence(medians),
                       f"{medians} {verdict!r} (judged as the table rounds)"))

    def refused(what):
        try:
            load_streams(zen)
        except SystemExit as e:
            return what in str(e.code)
        return False

    json.dump({"streams": [{"streams": 1, "aggregate_tok_s": 1.0}]},
              open(os.path.join(zen, "spec-2.json"), "w"))
    checks.append((refused("spec-2.json has no run of 2, 4 streams"), "a short result is refused"))
    os.remove(os.path.join(zen, "spec-2.json"))
    checks.append((refused("spec-2.json is missing: run bench/streams.sh"),
                   "a missing result is refused, naming the script"))
    return checks


def self_test_groups():
    """The quota and streams groups' order on a page that has neither, and the refusal, naming
    the fix, of markers update() cannot place right."""
    base = "# Performance\n\n" + TABLES.end + "\n\n" + READING + "\n"
    text = lambda group: marked(group, "k", "K", ["figures"])
    page = update(update(base, STREAMS, "k", text(STREAMS)), QUOTA, "k", text(QUOTA))
    checks = [(in_order(page, TABLES.end, QUOTA.heading, QUOTA.end, STREAMS.heading, STREAMS.end,
                        READING),
               "the quota group goes above the streams group, also when written after it")]

    def refused(page, group, what):
        try:
            update(page, group, "k", text(group))
        except SystemExit as e:
            return what in str(e.code)
        return False

    unkeyed = "<!-- performance-quota -->\n## Under a CPU quota\n<!-- /performance-quota -->\n\n"
    start = QUOTA.start_marker("k")
    for bad, group, what, why in (
            (base.replace(READING, unkeyed + READING), QUOTA, "without a CPU class key: give the",
             "the single section's markers, without a key"),
            (base.replace(READING, QUOTA.heading + "\n\ntext\n\n" + READING), QUOTA,
             f"but no {QUOTA.end!r} line: add", "a group's heading without its end line"),
            (page.replace(STREAMS.end + "\n", ""), STREAMS, "sections but no",
             "a group's sections without its end line"),
            (page.replace(QUOTA.end, QUOTA.end + "\n" + QUOTA.end), QUOTA, "more than once: keep",
             "a doubled end line"),
            (page.replace(start, start + "\n" + start), QUOTA, "not one well-formed pair",
             "a doubled section marker"),
            (page.replace(QUOTA.end + "\n", "").replace(QUOTA.heading + "\n", QUOTA.heading + "\n"
                                                        + QUOTA.end + "\n"),
             QUOTA, "move its section above", "a section after its group's end line"),
            (base.replace(TABLES.end, ""), TABLES, f"no {TABLES.end!r} line",
             "a page without the tables' end line")):
        checks.append((refused(bad, group, what), f"refused: {why}"))
    return checks


def self_test_refused_write(tmp):
    """A write the page's markers refuse leaves the page as it was."""
    page_path = os.path.join(tmp, "unkeyed.md")
    page = ("# Performance\n\n" + TABLES.end + "\n\n<!-- performance-quota -->\n"
            + QUOTA.heading + "\n<!-- /performance-quota -->\n\n" + READING + "\n")
    with open(page_path, "w") as f:
        f.write(page)
    try:
        write_section(page_path, QUOTA, "k", marked(QUOTA, "k", "K", ["figures"]))
    except SystemExit:
        pass
    return [(open(page_path).read() == page, "a refused write leaves the page as it was")]


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
        before = "# Performance\n\nintro\n\n" + other + "\n" + TABLES.end + "\n\n## How to reproduce\n"
        with open(page_path, "w") as f:
            f.write(before)
        write([f"{dirs[0]}=first model", dirs[1]], page_path)
        page = open(page_path).read()
        unwrapped = page.replace("\n", " ")
        checks = [
            (other in page, "the other class's section is kept"),
            (page.index(other) < page.index("amd-zen-2-avx2") < page.index(TABLES.end),
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
        checks += self_test_groups()
        checks += self_test_refused_write(tmp)
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
                    help="write this CPU class's section under 'Under a CPU quota' from a "
                         "bench/quota.sh OUT directory")
    ap.add_argument("--streams", metavar="DIR",
                    help="write this CPU class's section under 'Concurrent streams on `serve`' "
                         "from a bench/streams.sh OUT directory")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.quota and a.streams:
        ap.error("--quota and --streams each write one class's section: give one per run")
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

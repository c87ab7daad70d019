"""The CPU's identity as bench/performance_page.py groups results by it: vendor, family, model
and name, from the first processor in /proc/cpuinfo. Imported by the run.json writers of
bench/compare.sh and bench/quota.sh."""


def cpu_identity():
    cpu = {}
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "cpu family", "model", "model name") and key not in cpu:
            cpu[key] = value.strip()
        if not line.strip():
            break
    return {"vendor": cpu.get("vendor_id", ""), "family": int(cpu.get("cpu family", "0")),
            "model": int(cpu.get("model", "0")), "cpu": cpu.get("model name", "unknown CPU")}

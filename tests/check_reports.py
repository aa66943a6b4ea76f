#!/usr/bin/python3
"""Reads back the four reports `lockstepctl report` wrote for one finished CPU job and checks them.

usage: check_reports.py DIR JOB RANKS STEPS SCHEMA
  DIR holds JOB.csv, JOB-gpus.csv, JOB.json, JOB.html and JOB.pdf; SCHEMA is docs/report.schema.json.

CSV: the documented columns, one row per rank per step, each (rank, step) once. JSON: valid against
its schema, the KPIs a CPU job can and cannot have. HTML: the charts as inline SVG and the KPI
values of the JSON. PDF: its pages and text (pdftotext, pdfinfo from poppler-utils) with the same
figures and the chart titles. Prints every problem found; exits 1 if there was any.
"""

import csv
import json
import subprocess
import sys

import jsonschema

STEP_COLUMNS = [
    "job_id", "node", "rank", "attempt", "step", "epoch", "world_size", "samples", "loss", "global_loss", "lr",
    "data_us", "compute_us", "exposed_comm_us", "allreduce_us", "bytes_reduced", "step_us", "time_unix_us",
    "tokens", "optimizer_us",
]
GPU_COLUMNS = [
    "job_id", "node", "gpu", "time_unix_us", "span_us", "utilization_pct", "memory_used_bytes", "power_mw",
    "energy_mj", "temperature_c", "sm_clock_mhz",
]
# The six KPIs of the brief, plus energy and load imbalance, by the names the reports give them.
KPI_LABELS = [
    "Training throughput", "Scaling efficiency", "GPU utilization", "Communication overhead",
    "Time to convergence", "Cost per training job", "Energy", "Load imbalance",
]
CHART_TITLES = ["Training throughput", "Global loss", "Communication overhead per rank"]

problems = []


def check(condition, message):
    if not condition:
        problems.append(message)


def percent(fraction):
    return f"{fraction * 100:.1f}%"


def main():
    directory, job, ranks, steps, schema_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    base = f"{directory}/{job}"

    with open(f"{base}.csv", newline="") as f:
        rows = list(csv.reader(f))
    check(rows and rows[0] == STEP_COLUMNS, f"CSV header is {rows[0] if rows else None}")
    body = [dict(zip(rows[0], r)) for r in rows[1:]]
    check(len(body) == ranks * steps, f"CSV has {len(body)} rows, expected {ranks} ranks x {steps} steps")
    keys = {(r["rank"], r["step"]) for r in body}
    check(len(keys) == len(body), "CSV repeats a (rank, step)")
    check(keys == {(str(r), str(s)) for r in range(ranks) for s in range(1, steps + 1)}, "CSV misses some (rank, step)")
    for r in body:
        check(r["job_id"] == job, f"CSV row of job {r['job_id']}")
        float(r["loss"]), int(r["step_us"]), int(r["time_unix_us"]), int(r["optimizer_us"])  # numbers, or ValueError
    with open(f"{base}-gpus.csv", newline="") as f:
        gpu_rows = list(csv.reader(f))
    check(gpu_rows and gpu_rows[0] == GPU_COLUMNS, f"GPU CSV header is {gpu_rows[0] if gpu_rows else None}")
    check(len(gpu_rows) == 1, "a CPU job has no GPU samples")

    with open(f"{base}.json") as f:
        report = json.load(f)
    with open(schema_path) as f:
        schema = json.load(f)
    try:
        jsonschema.Draft202012Validator(schema).validate(report)
    except jsonschema.ValidationError as e:
        problems.append(f"JSON does not match its schema: {e.message} at {list(e.absolute_path)}")
    kpis = report["kpis"]
    check(report["job"]["id"] == job, "JSON job id")
    check(kpis["step"] == steps, f"JSON step {kpis['step']}")
    check(kpis["mean_samples_per_second"] and kpis["mean_samples_per_second"] > 0, "JSON throughput")
    check(kpis["gpu_utilization_pct"] is None, "a CPU job's GPU utilization must be null, not a number")
    check(kpis["energy_kwh"] is None, "a CPU job's energy must be null")
    check(any("GPU utilization" in m for m in kpis["missing"]), "JSON says GPU utilization is missing")
    check(len(report["ranks"]) == ranks, f"JSON has {len(report['ranks'])} ranks")
    kinds = [e["kind"] for e in report["events"]]
    check(kinds[:1] == ["started"] and kinds[-1:] == ["finished"], f"JSON events are {kinds}: the job's whole life")
    check(len(report["series"]["loss"]) == steps, f"JSON loss series has {len(report['series']['loss'])} points")
    # Issue 46: MFU, its FLOP/s and peak, and what they came from: in the JSON always (null when not
    # known); where known, the HTML and PDF say it and which peak it was taken against.
    for key in ("model_flops_utilization", "model_flops_per_second", "peak_flops", "flops_basis", "peak_basis"):
        check(key in kpis, f"JSON kpis lack {key}")
    check(all("model_flops_utilization" in r for r in report["ranks"]), "JSON ranks lack model_flops_utilization")
    mfu = kpis.get("model_flops_utilization")
    # The job checked is the trainer's through a test agent: it counts FLOPs, the agent has a peak.
    check(mfu is not None and mfu > 0, f"JSON kpis have no MFU ({mfu}): the trainer counts FLOPs against the agent's peak")
    check(mfu is None or kpis.get("peak_flops"), "JSON has an MFU without the peak it was taken against")
    mfu_text = [percent(mfu) + " of peak"] if mfu is not None else []
    mfu_text += ["peak:"] if kpis.get("peak_basis") else []
    comm = percent(kpis["comm_overhead"])
    throughput = f"{kpis['mean_samples_per_second']:,.0f}"

    with open(f"{base}.html") as f:
        html = f.read()
    check(html.count("<svg") >= 5, f"HTML has {html.count('<svg')} charts")
    for chart in ("throughput", "loss", "step_time", "utilization", "communication"):
        check(f'id="chart-{chart}"' in html, f"HTML lacks the {chart} chart")
    for label in KPI_LABELS + ["MFU", job, comm, throughput] + mfu_text:
        check(label in html, f"HTML lacks {label!r}")
    check("http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "<script" not in html,
          "HTML must be self-contained")

    info = subprocess.run(["pdfinfo", f"{base}.pdf"], capture_output=True, text=True, check=True).stdout
    pages = int(next(line.split()[1] for line in info.splitlines() if line.startswith("Pages:")))
    check(3 <= pages <= 8, f"PDF has {pages} pages")
    text = subprocess.run(["pdftotext", "-layout", f"{base}.pdf", "-"], capture_output=True, text=True, check=True).stdout
    flat = " ".join(text.split()).replace("ﬁ", "fi").replace("ﬃ", "ffi")
    for label in KPI_LABELS + CHART_TITLES + ["MFU", f"Job {job}", comm, throughput, "Recommendations", f"page {pages}"] + mfu_text:
        check(label in flat, f"PDF lacks {label!r}")

    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""pw-sim: the simulator checked against measurement here, then the paper's scale results SIMULATED.
Validation (measured against simulated): the pw-sim validation programs run for real on this
machine (2 islands x 4 CPU devices, DCN emulated), the `cpu-here` profile is fitted to the
calibration programs only, and the same plans are simulated. `median_abs_error` and
`worst_abs_error` are the median and largest |simulated - measured| / measured over the validation
programs (fractions, lower is better; targets 0.08 and 0.20). Scale (SIMULATED on `tpu-v4`, never
measured; the paper's figure beside each in the rows): `crossover_2048_over_128`, the computation
size that reaches 95% of ideal throughput at 2,048 devices over that at 128 (Figure 6; paper about
15); `stages16_over_stages4`, tokens per second of a synchronous pipelined training step of a 3B
decoder on 128 devices, 16 stages over 4 (Table 2; paper 0.983); `islands4_over_one`, 16 stages on
4 islands of 32 over 1 of 128 (paper 1.0); `two_islands_over_one_sim`, the 64B and 136B decoders
data parallel over two islands, gradients over DCN overlapped with the backward pass, against one
island of twice the devices (worst of the two; paper about 0.97);
`parallel_over_sequential_dispatch`, sequential over parallel dispatch step time of a chain of
1,000 one-host stages (100 with --quick). `seconds_to_simulate_65536_devices` is the measured wall
time of simulating one step of a 16-island, 65,536-device pipeline (target under 10 s).
`schedule_pick_over_best_measured`: a real `pw.pipeline(..., schedule="auto")` training step picks
its schedule by simulation on the fitted profile, and every schedule it offers is also run here (the
plan it simulated); the fastest measured step time over the measured step time of the pick (1.0: it
picked the fastest; target at least 0.95).
"""

from __future__ import annotations

from . import harness

NAME = "sim"
HEADLINE = ("median_abs_error", "worst_abs_error", "crossover_2048_over_128", "stages16_over_stages4",
            "islands4_over_one", "two_islands_over_one_sim", "parallel_over_sequential_dispatch",
            "seconds_to_simulate_65536_devices", "schedule_pick_over_best_measured")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("median_abs_error", "worst_abs_error", "crossover_2048_over_128",
                   "seconds_to_simulate_65536_devices")
SCALE_PROFILE = "tpu-v4"


def run(quick: bool) -> dict:
    """Validates the simulator against real runs here, then simulates the paper's scale results."""
    from pathways_mlir.sim.profile import load_profile
    from pathways_mlir.sim.scale import run_scale
    from pathways_mlir.sim.schedules import check_here
    from pathways_mlir.sim.validate import run_validation

    rounds = 30 if quick else 120
    validation, fitted = run_validation(rounds)
    picked = check_here(15 if quick else 30, fitted)
    scale = run_scale(load_profile(SCALE_PROFILE), quick)
    stages = scale["experiments"]["dispatch_stages"]["stages"]
    source = f"measured here vs simulated ({fitted.name}, fitted)"
    rows = [{"name": name, "source": source, "measured_ms": r["measured_ms"], "simulated_ms": r["simulated_ms"],
             "error": r["error"]} for name, r in validation["validation"].items()]
    rows += [{"name": key, "source": source, "value": validation[key], "target": validation["targets"][key]}
             for key in ("median_abs_error", "worst_abs_error")]
    rows += [{"name": f"schedule_{name}", "source": source + "; a pw.pipeline training step",
              "measured_ms": r["measured_ms"], "simulated_ms": r["step_ms"], "picked": name == picked["pick"]}
             for name, r in picked["schedules"].items()]
    rows.append({"name": "schedule_pick_over_best_measured", "source": source, "value": picked["pick_over_best_measured"],
                 "target": 0.95})
    renamed = {f"parallel_over_sequential_{stages}_stages": "parallel_over_sequential_dispatch"}
    rows += [{"name": renamed.get(key, key), "source": f"{h['kind']} ({SCALE_PROFILE})", "value": h["value"],
              "paper": h.get("paper")} for key, h in scale["headline"].items()]
    rows += _scale_points(scale["experiments"], f"{scale['kind']} ({SCALE_PROFILE})")
    headline = {row["name"]: row["value"] for row in rows if row["name"] in HEADLINE}
    return harness.record(NAME, {"validation_rounds": rounds, "validation_cluster": validation["cluster"],
                                 "validation_targets_met": validation["met"], "scale_profile": SCALE_PROFILE,
                                 "dispatch_stages": stages},
                          rows, {key: headline[key] for key in HEADLINE})


def _scale_points(exps: dict, source: str) -> list[dict]:
    """Rows of the plotted points: Figure 6's crossover (ms) per device count, Table 2's tokens per
    second per configuration, and each large model's two-island over one-island throughput."""
    fig6, table2, dp = exps["figure6_crossover"], exps["table2"], exps["two_islands"]
    rows = [{"name": f"figure6_crossover_ms_{d}", "source": source, "value": fig6[d]["computation_ms"],
             "paper": fig6["paper_ms"][d]} for d in ("128", "2048")]
    paper = table2["paper_tokens_per_s"]
    rows += [{"name": f"table2_tokens_per_s_{config.replace(' ', '_')}", "source": source, "value": value,
              "paper": paper.get(config)} for config, value in table2["tokens_per_s"].items()]
    rows += [{"name": f"two_islands_over_one_{model}", "source": source, "value": m["two_over_one"],
              "paper": dp["paper"]} for model, m in dp["models"].items()]
    return rows


def plot(record: dict, ax) -> None:
    """Figure 6's crossover against devices, simulated, with the paper's points; Table 2's throughput
    against stages in an inset."""
    rows = {row["name"]: row for row in record["rows"]}
    devices = [128, 2048]
    points = [rows[f"figure6_crossover_ms_{d}"] for d in devices]
    ax.plot(devices, [p["value"] for p in points], marker="o", label=f"SIMULATED ({record['params']['scale_profile']})")
    ax.plot(devices, [p["paper"] for p in points], marker="s", linestyle="--", color="black", label="paper (Figure 6)")
    ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="computation for 95% of ideal throughput (ms)",
           title="pw-sim at scale (simulated)")
    ax.set_xticks(devices, [str(d) for d in devices])
    ax.set_xticks([], minor=True)
    ax.legend(fontsize="small", loc="lower right")
    inset = ax.inset_axes([0.1, 0.55, 0.35, 0.35])
    stages = [s for s in (4, 8, 16) if f"table2_tokens_per_s_{s}" in rows]
    base = rows["table2_tokens_per_s_4"]
    inset.plot(stages, [rows[f"table2_tokens_per_s_{s}"]["value"] / base["value"] for s in stages], marker="o",
               label="simulated")
    inset.plot([4, 16], [1.0, rows["table2_tokens_per_s_16"]["paper"] / base["paper"]], marker="s", linestyle="--",
               color="black", label="paper (Table 2)")
    inset.set_xticks(stages)
    inset.set_title("tokens/s over 4 stages", fontsize="x-small")
    inset.tick_params(labelsize="x-small")
    inset.legend(fontsize="xx-small")

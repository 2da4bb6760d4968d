"""pw-sim: a discrete-event simulator of the plans `pw-lower` emits.

Everything here is simulation: figures it produces are computed from plans,
the cost model and an accelerator profile, never measured, and are labelled
so. One concept per module:

    profile     accelerator, link and host descriptions (data files in dialect/profiles/)
    network     ICI and DCN links with per-link contention; the ring all-reduce inside a launch
    runs        what a simulation takes and gives: submissions, runs' times, spans, errors
    plan_view   what the simulator needs of a plan, worked out once per plan
    engine      the event loop: host dispatch, gang order, devices, admission
    conds       a run's host steps (pw.cond): the predicate read, the branch run, the held-back steps
    branches    which way each simulated cond goes: a probability or a recorded trace
    trace       the simulated timeline as a Chrome/Perfetto trace
    inputs      plans from plan JSON or .mlir lowered on the fly
    programs    small real programs (in-repo drivers) for calibration and validation
    measure     timing real runs on this machine (interleaved rounds, fastest of 3, medians)
    calibrate   fitting the `cpu-here` profile to measured calibration programs
    validate    measured against simulated on programs calibration never saw
    models      the paper's training setups as pw programs (pipelined step, two-island data parallel)
    scale       the paper-scale experiments, simulated on TPU-v4-like islands
    schedules   pipeline schedules simulated side by side, and the pick
"""

// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-plan-memory

// Each case is a module pw-plan-memory cannot plan.

// Plans come from a placed module.
// expected-error@below {{the module has no pw.topology, which the planned phase requires (pw-place adds it), before pw-plan-memory}}
module {
}

// -----

// Frees are planned once.
// expected-error@below {{pw-plan-memory has already run on this module}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.free"() {after = array<i64>, buffers = array<i64>, step = 0 : i64, subgraph = 0 : i64} : () -> ()
}
}

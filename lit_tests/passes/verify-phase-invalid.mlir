// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify-phase=phase=placed
// RUN: not pw-opt %s --split-input-file --pw-verify-phase=phase=placed 2>&1 | FileCheck %s --check-prefix=LOCATION
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-verify-phase{phase=done})' 2>&1 | FileCheck %s --check-prefix=OPTION

// Each case is a module that is not in the placed phase.

// LOCATION: verify-phase-invalid.mlir:14:1: error: the module has no pw.topology, which the placed phase requires (pw-place adds it)
// LOCATION: verify-phase-invalid.mlir:16:1: error: 'pw.virtual_slice' op has no pw.placement, which the placed phase requires (pw-place adds it)
// LOCATION: verify-phase-invalid.mlir:27:3: error: 'pw.buffer' op is not legal in the placed phase: it belongs to the planned phase (pw-emit-plans writes it)
// OPTION: invalid pass pipeline: option 'phase' of 'pw-verify-phase' takes input, placed, lowered, partitioned, scheduled or planned, not 'done'

// A slice without a placement, in a module without a topology.
// expected-error@below {{the module has no pw.topology, which the placed phase requires (pw-place adds it)}}
module {
// expected-error@below {{'pw.virtual_slice' op has no pw.placement, which the placed phase requires (pw-place adds it)}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// A plan op before the planned phase.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  // expected-error@below {{'pw.buffer' op is not legal in the placed phase: it belongs to the planned phase (pw-emit-plans writes it)}}
  "pw.buffer"() {bytes_per_device = 16 : i64, home = {sharding = [["x"]], slice = @a}, id = 0 : i64, type = tensor<8xf32>} : () -> ()
}
}

// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-insert-transfers

// Each case is a module pw-insert-transfers cannot lower.

// Slices must be placed first.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{'pw.virtual_slice' op has no pw.placement, which the placed phase requires (pw-place adds it), before pw-insert-transfers}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// The module's topology is needed for the links.
// expected-error@below {{the module has no pw.topology, which the placed phase requires (pw-place adds it), before pw-insert-transfers}}
module {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
}

// -----

// A malformed topology.
// expected-error@below {{pw.topology: 'islands' is empty}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = []}} {
}

// -----

// Islands that the DCN does not join cannot exchange data.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, dcn_pairs = [["island0", "island1"]], islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 2, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 2, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island2", device_kind = "cpu", hosts = 1, devices_per_host = 2, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island2", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{cannot move operand #0 from @a to @c: no DCN link joins island0 and island2}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}

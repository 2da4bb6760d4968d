// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-fuse-launches

// Each case is a module pw-fuse-launches cannot work on.

// Fusion stays inside static subgraphs, so they must be marked first.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
// expected-error@below {{program @main has no pw.subgraphs, which the partitioned phase requires (pw-mark-static-subgraphs adds it), before pw-fuse-launches}}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{'pw.compute' op has no pw.subgraph, which the partitioned phase requires (pw-mark-static-subgraphs adds it), before pw-fuse-launches}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

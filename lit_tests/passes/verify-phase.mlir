// RUN: pw-opt %s --pw-verify-phase=phase=scheduled | FileCheck %s
// RUN: pw-opt %s --pw-verify-phase | FileCheck %s

// A scheduled module passes, unchanged; so does any module in the input phase.

// CHECK: "pw.compute"(%arg0) {callee = @f, in_shardings = {{.*}}, pw.order = 0 : i64, pw.subgraph = 0 : i64
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// RUN: pw-opt %s --split-input-file --pw-verify-plans | FileCheck %s
// RUN: pw-opt %S/emit-plans.mlir --split-input-file --pw-emit-plans --pw-verify-plans | FileCheck %s --check-prefix=EMITTED

// pw-verify-plans accepts what pw-emit-plans writes and changes nothing.
// EMITTED-LABEL: module @main_island0
// EMITTED-LABEL: module @then_island0

// A valid two-island plan: island0 launches and sends, island1 receives.
// CHECK-LABEL: module @main_island0
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 16 : i64, {{.*}}id = 0 : i64
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 16 : i64, {{.*}}id = 1 : i64
// CHECK-NEXT: "pw.launch"() {{.*}}step = 0 : i64
// CHECK-NEXT: "pw.send"() {{.*}}step = 1 : i64
// CHECK-LABEL: module @main_island1
// CHECK-NEXT: "pw.buffer"() {{.*}}id = 2 : i64
// CHECK-NEXT: "pw.recv"() {{.*}}step = 2 : i64
// CHECK-LABEL: module @main_host
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A module without plans has nothing to check.
// CHECK-LABEL: module attributes {pw.topology
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
}

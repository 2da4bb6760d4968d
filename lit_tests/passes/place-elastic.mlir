// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-place)' | FileCheck %s
// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-lower)' | FileCheck %s --check-prefix=LOWER

// An elastic slice (constraint min_shape) gets the largest shape in its
// range that an island has the available devices for and that divides every
// value sharded over it; max_shape keeps the largest, so placing it again
// onto more devices grows it back.

// 5 of island0's 8 devices are available: 5 does not divide the batch of 16,
// so the slice gets 4 devices.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: constraints = {max_shape = array<i64: 8>, min_shape = array<i64: 2>}, pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, shape = array<i64: 4>, sym_name = "d"
// Lowered, the launch runs on those 4 devices, each holding a quarter of the batch (64 bytes).
// LOWER-LABEL: module @step_island0
// LOWER: "pw.launch"() {after = array<i64>, devices = array<i64: 0, 4>, executable = @double, inputs = array<i64: 0>, label = "double#0", output_bytes = array<i64: 64>
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 5, 6, 7>}]}} {
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 8>, axes = ["data"], constraints = {min_shape = array<i64: 2>}} : () -> ()
module @double attributes {pw.executable} {
  func.func public @main(%x: tensor<16x4xf32>) -> tensor<16x4xf32> {
    %0 = "stablehlo.add"(%x, %x) : (tensor<16x4xf32>, tensor<16x4xf32>) -> tensor<16x4xf32>
    return %0 : tensor<16x4xf32>
  }
}
func.func @step(%x: tensor<16x4xf32>) -> tensor<16x4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @double, slice = @d, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "double#0"} : (tensor<16x4xf32>) -> tensor<16x4xf32>
  return %0 : tensor<16x4xf32>
}
}

// -----

// Placed again with every device available, a slice placed smaller grows back
// to its max_shape; a 2-D slice keeps the sizes of its fixed axis.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: constraints = {max_shape = array<i64: 8>, min_shape = array<i64: 2>}, pw.placement = {devices = array<i64: 0, 8>, island = "island0"}, shape = array<i64: 8>, sym_name = "d"
// CHECK: constraints = {max_shape = array<i64: 4, 2>, min_shape = array<i64: 1, 2>}, pw.placement = {devices = array<i64: 0, 8>, island = "island0"}, shape = array<i64: 4, 2>, sym_name = "m"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 4>, axes = ["data"], constraints = {min_shape = array<i64: 2>, max_shape = array<i64: 8>}} : () -> ()
"pw.virtual_slice"() {sym_name = "m", shape = array<i64: 2, 2>, axes = ["data", "model"], constraints = {min_shape = array<i64: 1, 2>, max_shape = array<i64: 4, 2>}} : () -> ()
}


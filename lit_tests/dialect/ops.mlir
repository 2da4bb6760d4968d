// RUN: pw-opt %s | pw-opt | FileCheck %s
// RUN: pw-opt %s --pw-verify | FileCheck %s
// RUN: pw-opt %s --mlir-print-op-generic | pw-opt | FileCheck %s

// Round trip of every pw op and mark: parse, print, parse again.

// CHECK-LABEL: module attributes
// CHECK-SAME: pw.topology = {dcn = {bandwidth_gbps = 2.500000e+01 : f64, latency_us = 1.000000e+02 : f64}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0 : f64, latency_us = 100.0 : f64}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824 : i64, devices_per_host = 4 : i64, hosts = 1 : i64, ici = {bandwidth_gbps = 100.0 : f64, latency_us = 1.0 : f64}, name = "island0"}]}} {

// A virtual slice with constraints, before and after placement.
// CHECK: "pw.virtual_slice"() {axes = ["data", "model"], constraints = {device_kind = "cpu", min_memory_bytes = 1024 : i64}, pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, shape = array<i64: 2, 2>, sym_name = "v0"}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 2>, axes = ["data", "model"], constraints = {device_kind = "cpu", min_memory_bytes = 1024 : i64}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
// CHECK: "pw.virtual_slice"() {axes = ["x"], constraints = {island = "island0", same_island = true}, shape = array<i64: 4>, sym_name = "v1"}
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 4>, axes = ["x"], constraints = {island = "island0", same_island = true}} : () -> ()

// A compiled function: a nested module holding StableHLO, with its export.
// CHECK: module @double attributes {pw.cost = {bytes = 64 : i64, flops = 16 : i64}, pw.executable, pw.export = "AAAA"}
// CHECK: "stablehlo.add"
module @double attributes {pw.executable, pw.export = "AAAA", pw.cost = {flops = 16 : i64, bytes = 64 : i64}} {
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %0 = "stablehlo.add"(%arg0, %arg0) : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
}

module @is_positive attributes {pw.executable} {
  func.func public @main(%arg0: tensor<8x4xf32>) -> tensor<i1> {
    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
    return %0 : tensor<i1>
  }
}

// Programs: computations, data movement and a data-dependent step.
// CHECK-LABEL: func.func @main
// CHECK-SAME: pw.program
func.func @main(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {pw.program} {
  // CHECK: "pw.compute"(%{{.*}}) {callee = @double, in_shardings = {{\[\[\["data"\], \[\]\]\]}}, label = "double#0", out_shardings = {{\[\[\["data"\], \[\]\]\]}}, pw.order = 0 : i64, pw.subgraph = 0 : i64, slice = @v0}
  %0 = "pw.compute"(%arg0) {callee = @double, slice = @v0, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "double#0", pw.subgraph = 0 : i64, pw.order = 0 : i64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = "pw.compute"(%0) {callee = @double, slice = @v0, in_shardings = [[["data"], []]], out_shardings = [[["model"], []]], label = "double#1"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // CHECK: "pw.gather"(%{{.*}}) {dst = @v1, dst_sharding = {{\[\[\], \[\]\]}}, link = "ici", piece_shape = array<i64: 4, 4>, pieces = 2 : i64, src = @v0, src_sharding = {{\[\["model"\], \[\]\]}}}
  %2 = "pw.gather"(%1) {link = "ici", src = @v0, dst = @v1, src_sharding = [["model"], []], dst_sharding = [[], []], pieces = 2 : i64, piece_shape = array<i64: 4, 4>} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // CHECK: "pw.scatter"(%{{.*}}) {dst = @v1, dst_sharding = {{\[\["x"\], \[\]\]}}, link = "dcn", piece_shape = array<i64: 2, 4>, pieces = 4 : i64, src = @v1, src_sharding = {{\[\[\], \[\]\]}}}
  %3 = "pw.scatter"(%2) {link = "dcn", src = @v1, dst = @v1, src_sharding = [[], []], dst_sharding = [["x"], []], pieces = 4 : i64, piece_shape = array<i64: 2, 4>} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // CHECK: "pw.transfer"(%{{.*}}) {dst = @v1, link = "ici", sharding = {{\[\["x"\], \[\]\]}}, src = @v1}
  %4 = "pw.transfer"(%3) {link = "ici", src = @v1, dst = @v1, sharding = [["x"], []]} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %5 = "pw.compute"(%4) {callee = @is_positive, slice = @v1, in_shardings = [[["x"], []]], out_shardings = [[]], label = "is_positive#0"} : (tensor<8x4xf32>) -> tensor<i1>
  // CHECK: "pw.cond"(%{{.*}}, %{{.*}}) {else_program = @branch_b, label = "choose#0", then_program = @branch_a}
  %6 = "pw.cond"(%5, %arg0) {then_program = @branch_a, else_program = @branch_b, label = "choose#0"} : (tensor<i1>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %6 : tensor<8x4xf32>
}

func.func @branch_a(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%arg0) {callee = @double, slice = @v0, in_shardings = [[[], []]], out_shardings = [[[], []]], label = "double#2"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

func.func @branch_b(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {pw.program} {
  return %arg0 : tensor<8x4xf32>
}

// An island plan: buffers, launches, copies, sends and receives on buffers
// named by id.
// CHECK-LABEL: module @plan_island0 attributes {pw.island_plan = {island = "island0", program = @main}}
module @plan_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  // CHECK: "pw.buffer"() {bytes_per_device = 64 : i64, home = {sharding = {{\[\["data"\], \[\]\]}}, slice = @v0}, id = 0 : i64, type = tensor<8x4xf32>}
  "pw.buffer"() {id = 0 : i64, type = tensor<8x4xf32>, home = {slice = @v0, sharding = [["data"], []]}, bytes_per_device = 64 : i64} : () -> ()
  // CHECK: "pw.launch"() {after = array<i64>, devices = array<i64: 0, 4>, executable = @double, inputs = array<i64: 0>, label = "double#0", output_bytes = array<i64: 128>, outputs = array<i64: 1>, slice = @v0, step = 0 : i64, subgraph = 0 : i64}
  "pw.launch"() {step = 0 : i64, after = array<i64>, executable = @double, slice = @v0, devices = array<i64: 0, 4>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 128>, subgraph = 0 : i64, label = "double#0"} : () -> ()
  // CHECK: "pw.copy"() {after = array<i64: 0>, bytes = 128 : i64, dst_buffer = 5 : i64, link = "ici", src_buffer = 1 : i64, step = 1 : i64, subgraph = 0 : i64}
  "pw.copy"() {step = 1 : i64, after = array<i64: 0>, src_buffer = 1 : i64, dst_buffer = 5 : i64, bytes = 128 : i64, link = "ici", subgraph = 0 : i64} : () -> ()
  // CHECK: "pw.send"() {after = array<i64: 0>, buffer = 1 : i64, bytes = 128 : i64, devices = array<i64: 0, 4>, link = "dcn", peer = "island1", peer_buffer = 2 : i64, step = 2 : i64, subgraph = 0 : i64}
  "pw.send"() {step = 2 : i64, after = array<i64: 0>, buffer = 1 : i64, peer_buffer = 2 : i64, bytes = 128 : i64, link = "dcn", peer = "island1", devices = array<i64: 0, 4>, subgraph = 0 : i64} : () -> ()
  // CHECK: "pw.recv"() {after = array<i64>, buffer = 3 : i64, bytes = 128 : i64, devices = array<i64: 0, 4>, link = "dcn", peer = "island1", peer_buffer = 4 : i64, step = 3 : i64, subgraph = 1 : i64}
  "pw.recv"() {step = 3 : i64, after = array<i64>, buffer = 3 : i64, peer_buffer = 4 : i64, bytes = 128 : i64, link = "dcn", peer = "island1", devices = array<i64: 0, 4>, subgraph = 1 : i64} : () -> ()
}

// A host plan: the program's inputs and outputs, host buffers and a
// data-dependent step.
// CHECK-LABEL: module @plan_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 7>, program = @main, subgraphs = [{id = 0 : i64, static = true}, {id = 1 : i64, static = false}]}}
module @plan_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 7>, subgraphs = [{id = 0 : i64, static = true}, {id = 1 : i64, static = false}]}} {
  // CHECK: "pw.buffer"() {bytes_per_device = 128 : i64, home = {}, id = 7 : i64, type = tensor<8x4xf32>}
  "pw.buffer"() {id = 7 : i64, type = tensor<8x4xf32>, home = {}, bytes_per_device = 128 : i64} : () -> ()
  // CHECK: "pw.branch"() {after = array<i64: 3>, else_program = @branch_b, inputs = array<i64: 0>, label = "choose#0", outputs = array<i64: 7>, pred = 6 : i64, step = 4 : i64, subgraph = 0 : i64, then_program = @branch_a}
  "pw.branch"() {step = 4 : i64, after = array<i64: 3>, pred = 6 : i64, inputs = array<i64: 0>, outputs = array<i64: 7>, then_program = @branch_a, else_program = @branch_b, subgraph = 0 : i64, label = "choose#0"} : () -> ()
}

}

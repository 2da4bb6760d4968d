// RUN: pw-opt %s --split-input-file --pw-fuse-launches | FileCheck %s

// pw-fuse-launches makes one launch of consecutive computations on one slice
// in a static subgraph.

// f, g, f on @a become one compute of @fused_f_0, which calls them in order:
// %0 (f#0's result) is returned, so it stays a result; g#0's result is used
// only inside. The transfer ends the group: f#2 on @b stays on its own.
// CHECK-LABEL: func.func @step
// CHECK-NEXT: %0:2 = "pw.compute"(%arg0) {callee = @fused_f_0, in_shardings = {{\[\[\["x"\]\]\]}}, label = "f#0+g#0+f#1", out_shardings = {{\[\[\["x"\]\], \[\["x"\]\]\]}}, pw.subgraph = 0 : i64, slice = @a}
// CHECK-NEXT: "pw.transfer"(%0#1)
// CHECK-NEXT: "pw.compute"(%1) {callee = @f,{{.*}}label = "f#2"
// CHECK-NEXT: return %2, %0#0
// CHECK: module @fused_f_0 attributes {pw.executable, pw.fused = {calls = [{callee = @f, operands = array<i64: 0>, results = 1 : i64}, {callee = @g, operands = array<i64: 1, 0>, results = 1 : i64}, {callee = @f, operands = array<i64: 2>, results = 1 : i64}], results = array<i64: 1, 3>}}
// CHECK-NEXT: func.func private @main(tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @g attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @step(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0, %x) {callee = @g, slice = @a, in_shardings = [[["x"]], [["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.subgraph = 0} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.transfer"(%2) {link = "ici", src = @a, dst = @b, sharding = [["x"]], pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = "pw.compute"(%3) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#2", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %4, %0 : tensor<8xf32>, tensor<8xf32>
}
}

// -----

// Computations after a data-dependent decision (subgraph 1, not static) are
// not fused, nor are computations of different subgraphs.
// CHECK-LABEL: func.func @step
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @f, {{.*}}label = "f#0"
// CHECK-NEXT: "pw.compute"(%0) {callee = @f, {{.*}}label = "f#1"
// CHECK-NEXT: "pw.compute"(%1) {callee = @f, {{.*}}label = "f#2"
// CHECK-NOT: pw.fused
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @step(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}, {id = 1, static = false}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#2", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}

// -----

// A fused executable's name is new among all the module's symbols, not only
// its executables: a program named @fused_f_0 keeps its name.
// CHECK-LABEL: func.func @fused_f_0
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @fused_f_1, {{.*}}label = "f#0+f#1"
// CHECK: module @fused_f_1 attributes {pw.executable, pw.fused
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @fused_f_0(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}

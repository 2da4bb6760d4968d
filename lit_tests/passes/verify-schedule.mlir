// RUN: pw-opt %s --split-input-file --pw-verify-schedule | FileCheck %s

// pw-verify-schedule accepts orders that cannot deadlock, unchanged.

// Two programs sharing island0, ordered one after the other.
// CHECK-LABEL: func.func @first
// CHECK: pw.order = 0
// CHECK: pw.order = 1
// CHECK: pw.order = 2
// CHECK-LABEL: func.func @second
// CHECK: pw.order = 3
// CHECK: pw.order = 4
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 2, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
func.func @second(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.order = 3, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#1", pw.order = 4, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}

// -----

// Orders may repeat on disjoint islands: "other#0" on island1 has the order
// of "early#0" on island0.
// CHECK-LABEL: func.func @cross
// CHECK: label = "early#0"{{.*}}pw.order = 5
// CHECK: label = "late#0"{{.*}}pw.order = 7
// CHECK: label = "other#0"{{.*}}pw.order = 5
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @cross(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "early#0", pw.order = 5, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], pw.order = 6, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "late#0", pw.order = 7, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "other#0", pw.order = 5, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2, %3 : tensor<8xf32>, tensor<8xf32>
}
}

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
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], pw.order = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 2} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
func.func @second(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.order = 3} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#1", pw.order = 4} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}

// -----

// A consumer ordered before its producer is fine when no queue joins them:
// "late#0" on island1 waits for "early#0" on island0, which waits for nothing.
// Orders may repeat on disjoint islands.
// CHECK-LABEL: func.func @cross
// CHECK: label = "early#0"{{.*}}pw.order = 5
// CHECK: label = "late#0"{{.*}}pw.order = 0
// CHECK: label = "other#0"{{.*}}pw.order = 5
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @cross(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "early#0", pw.order = 5} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "late#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "other#0", pw.order = 5} : (tensor<8xf32>) -> tensor<8xf32>
  return %1, %2 : tensor<8xf32>, tensor<8xf32>
}
